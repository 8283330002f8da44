#!/usr/bin/env bash
# Session 39, call B: the fuzz tests of both ops with a new seed (3939, 32 cases per op, two
# processes at once), then alone on the GPU the whole block-sparse table, forward and
# backward, sustained and burst (`--timing both`), and the deterministic backward rows.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/sessions/gpu_s39_b.sh [seconds]
. "$(dirname "$0")/../gpu_lib.sh" s39b "${1:-560}"
JSA_FUZZ_SEED=3939 JSA_FUZZ_N=32 timeout 200 $PYT tests/test_gpu_fuzz.py -k hstu > $O/t_fuzz_hstu.txt 2>&1 &
JSA_FUZZ_SEED=3939 JSA_FUZZ_N=32 timeout 200 $PYT tests/test_gpu_fuzz.py -k bsa > $O/t_fuzz_bsa.txt 2>&1 &
wait
for f in fuzz_hstu fuzz_bsa; do t "$f: $(tail -1 $O/t_$f.txt)"; done
grep -h "^FAILED" $O/t_fuzz_*.txt | head -10
timeout 110 python3 -m benchmarks.bsa_bench --timing both --table "JAX_SPARSE_ATTN_PDL=1" \
  --table-pass fwd --out $O/fwd.json > $O/fwd.txt 2>&1
t "fwd table rc=$?"; grep -v "^wrote" $O/fwd.txt | tail -12
L=$(left)
timeout $((L - 70)) python3 -m benchmarks.bsa_bench --timing both --table "JAX_SPARSE_ATTN_PDL=1" \
  --table-pass bwd --out $O/bwd.json > $O/bwd.txt 2>&1
t "bwd table rc=$?"; grep -v "^wrote" $O/bwd.txt | tail -12
L=$(left)
if [ $L -gt 30 ]; then
  timeout $((L - 8)) python3 -m benchmarks.bsa_bench --timing both --table ";deterministic=1" \
    --table-pass bwd --rows 0,3 --out $O/det.json > $O/det.txt 2>&1
  t "det rc=$?"; grep -v "^wrote" $O/det.txt | tail -6
fi
