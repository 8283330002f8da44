#!/usr/bin/env bash
# Session 38, calls C and D: tensors of more than 2**31 elements
# (tests/test_gpu_large_tensors.py), one test per process (a wrapped 32-bit offset would
# fault and poison the process); K selects tests (pytest -k; call D: K=bsa, after the fix of
# the dQ workspace zeroing).
# Usage (device, after `source .devcache/setup.sh`): [K=expr] OUT=$OUT bash scripts/sessions/gpu_s38_c.sh [seconds]
. "$(dirname "$0")/../gpu_lib.sh" c38${K:+_$K} "${1:-540}"
export JAX_SPARSE_ATTN_GPU_TEST_TIMEOUT=300 XLA_PYTHON_CLIENT_PREALLOCATE=true
python3 -c "import cudnn; print('cudnn fe', cudnn.__version__)" 2>&1 | tail -1
ids=$(python3 -m pytest -m gpu -q --collect-only tests/test_gpu_large_tensors.py ${K:+-k "$K"} \
  2>/dev/null | grep ::)
i=0
for id in $ids; do
  i=$((i + 1))
  [ "$(left)" -lt 40 ] && { t "out of time before $id"; break; }
  timeout $(( $(left) - 20 )) python3 -m pytest -m gpu -q -rA -p no:cacheprovider "$id" > $O/t_$i.txt 2>&1
  t "$id rc=$?: $(tail -1 $O/t_$i.txt)"
  grep -h "^E  \|err=" $O/t_$i.txt | head -12
done
