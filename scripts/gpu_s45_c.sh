#!/usr/bin/env bash
# Session 45's test call: what gpu_s44_a.sh's time limit cut. In parallel: detfixed on rows
# listing 256 KV blocks against the float32 reference; the deterministic cases with detfixed
# and with ordfast that it did not reach; then, with the time left, compute-sanitizer
# memcheck of detfixed's garbage-metadata cases.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/gpu_s45_c.sh [seconds]
. "$(dirname "$0")/gpu_lib.sh" s45c "${1:-400}"
T=${TT:-260}
export JAX_SPARSE_ATTN_GPU_TEST_TIMEOUT=150
timeout $T $PYT -s tests/test_gpu_dq_fixed.py -k long_rows > $O/t_long.txt 2>&1 &
timeout $T $PYT tests/test_gpu_dq_fixed.py -k "bwd_detfixed and (detzero or stream or overlap)" \
  > $O/t_fixed_rest.txt 2>&1 &
timeout $T $PYT tests/test_gpu_det_order.py \
  -k "det_sched and ordfast and (detzero or stream or overlap)" > $O/t_ord_rest.txt 2>&1 &
wait
for f in long fixed_rest ord_rest; do t "$f: $(tail -1 $O/t_$f.txt)"; done
grep -h "RMS error" $O/t_long.txt | head -3
grep -h "^FAILED\|^ERROR\|Timeout\|timed out" $O/t_*.txt | head -20
if [ "$(left)" -gt 60 ]; then
  XLA_FLAGS=--xla_gpu_autotune_level=0 timeout $(( $(left) - 5 )) compute-sanitizer --tool memcheck \
    --report-api-errors no python3 tests/sanitize_grid.py --only "deterministic detfixed" \
    > $O/sanitize_fixed.txt 2>&1
  t "sanitizer detfixed rc=$?: $(grep -c 'ok ' $O/sanitize_fixed.txt) ok, $(grep 'ERROR SUMMARY' $O/sanitize_fixed.txt | tail -1)"
fi
