#!/usr/bin/env bash
# Session 44's first device call: the deterministic block-sparse backward's two opt-ins,
# `ordfast` / `ordscan=N` (the schedule order's path with fewer launches and serialized
# steps) and `detfixed` (int32 fixed-point dQ, no order). (1) In parallel: the order
# kernel's builds against their numpy definition, the deterministic cases with ordfast, the
# deterministic grid with detfixed and its comparison with the default mode / NaN row;
# (2) the sustained and burst blk64 12.5 % and blk128 rows: default mode, deterministic
# default / ordfast / detfixed (where their tests passed), default mode again; (3) with the
# time left, per-kernel traces of the deterministic blk64 / blk128 backward with those
# variants, then compute-sanitizer memcheck of detfixed's garbage-metadata cases.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/gpu_s44_a.sh [seconds]
. "$(dirname "$0")/gpu_lib.sh" s44a "${1:-560}"
T=${TT:-220}
export JAX_SPARSE_ATTN_GPU_TEST_TIMEOUT=120
timeout $T $PYT tests/test_gpu_det_order.py -k order_kernel > $O/t_order.txt 2>&1 &
timeout $T $PYT tests/test_gpu_det_order.py -k "det_sched and ordfast" > $O/t_det.txt 2>&1 &
timeout $T $PYT tests/test_gpu_dq_fixed.py -k "not detfixed_against and not nan_row" \
  > $O/t_fixed.txt 2>&1 &
timeout $T $PYT tests/test_gpu_dq_fixed.py -k "detfixed_against or nan_row" > $O/t_fixed2.txt 2>&1 &
wait
for f in order det fixed fixed2; do t "$f: $(tail -1 $O/t_$f.txt)"; done
grep -h "^FAILED\|^ERROR\|Timeout\|timed out" $O/t_*.txt | head -20
ok() { grep -q "passed" $O/t_$1.txt && ! grep -qi "failed\|error\|timeout\|timed out" $O/t_$1.txt; }
VARS="default"
# (ordfast with ordscan=8 or detstream: scripts/gpu_s44_b.sh)
if ok order && ok det; then VARS="$VARS ordfast"; fi
if ok fixed && ok fixed2; then VARS="$VARS detfixed"; fi
t "variants: $VARS"
W=JAX_SPARSE_ATTN_BSA_BWD_WS
# the rows first (the decision: the deterministic call against the default mode), then the
# per-kernel traces with the time left before the sanitizer's share
V=";deterministic=1;"
case "$VARS" in *ordfast*) V="${V}deterministic=1,$W=ordfast;";; esac
case "$VARS" in *detfixed*) V="${V}deterministic=1,$W=detfixed;";; esac
timeout $(( $(left) - 100 )) python3 -m benchmarks.bsa_bench --table-pass bwd --rows 0,3 \
  --timing both --table "$V" --out $O/bwd_det.json > $O/bwd_det.txt 2>&1
t "det rows rc=$?"; grep -v "^wrote" $O/bwd_det.txt | tail -14
for v in $VARS; do
  [ "$(left)" -gt 130 ] || break
  case $v in
    default) E="X=1";;
    ordfast) E="$W=ordfast";;
    detfixed) E="$W=detfixed";;
  esac
  trace_variant $v "$E" bsa_bwd_det_blk64 bsa_bwd_det_blk128
  grep "==\|Order\|BsaBwd\|DqFrom" $O/trace_$v.txt | cut -c1-150 | head -10
done
if ok fixed && [ "$(left)" -gt 60 ]; then
  # out-of-bounds check of the new per-row multipliers / row flags (garbage metadata)
  XLA_FLAGS=--xla_gpu_autotune_level=0 timeout $(( $(left) - 5 )) compute-sanitizer --tool memcheck \
    --report-api-errors no python3 tests/sanitize_grid.py --only "deterministic detfixed" \
    > $O/sanitize_fixed.txt 2>&1
  t "sanitizer detfixed rc=$?: $(grep -c 'ok ' $O/sanitize_fixed.txt) ok, $(grep 'ERROR SUMMARY' $O/sanitize_fixed.txt | tail -1)"
fi
