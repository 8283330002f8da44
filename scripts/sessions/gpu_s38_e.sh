#!/usr/bin/env bash
# Session 38, call E: the large-tensor tests added after call D (deterministic, windowed,
# split-KV and paged HSTU; deterministic, packed-GQA and split-KV decode block-sparse), one
# per process, while the fuzz tests of both ops run with a new seed (3838) alongside.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/sessions/gpu_s38_e.sh [seconds]
. "$(dirname "$0")/../gpu_lib.sh" e38 "${1:-540}"
JSA_FUZZ_SEED=3838 timeout $((BUDGET - 30)) $PYT tests/test_gpu_fuzz.py -k hstu > $O/t_fuzz_hstu.txt 2>&1 &
JSA_FUZZ_SEED=3838 timeout $((BUDGET - 30)) $PYT tests/test_gpu_fuzz.py -k bsa > $O/t_fuzz_bsa.txt 2>&1 &
export JAX_SPARSE_ATTN_GPU_TEST_TIMEOUT=300
ids=$(python3 -m pytest -m gpu -q --collect-only tests/test_gpu_large_tensors.py -k "${K:-deterministic or window or split or paged or pack}" \
  2>/dev/null | grep ::)
i=0
for id in $ids; do
  i=$((i + 1))
  [ "$(left)" -lt 60 ] && { t "out of time before $id"; break; }
  XLA_PYTHON_CLIENT_PREALLOCATE=true timeout $(( $(left) - 40 )) python3 -m pytest -m gpu -q -rA -p no:cacheprovider "$id" > $O/l_$i.txt 2>&1
  t "$id rc=$?: $(tail -1 $O/l_$i.txt)"
  grep -h "^E  \|FAIL" $O/l_$i.txt | head -6
done
wait
for f in fuzz_hstu fuzz_bsa; do t "$f: $(tail -1 $O/t_$f.txt)"; done
grep -h "^FAILED" $O/t_fuzz_*.txt | head -10
