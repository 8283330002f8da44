#!/usr/bin/env bash
# Session 44's first device call: the deterministic backward's order path (`bsa_bwd_ws`
# `ordfast`, `ordscan=N`; opt-in). (1) In parallel: the order kernel's builds against their
# numpy definition (tests/test_gpu_det_order.py: 6 builds x 5 cases) and the deterministic
# cases in the schedule order with ordfast; (2) if they passed, per-kernel traces of the
# deterministic blk64 / blk128 backward (default, ordfast, ordfast with ordscan=8, ordscan=8
# alone, ordfast streamed into the backward with detstream); (3) the sustained and burst blk64 12.5 % and blk128 rows: default mode, then
# deterministic default / ordfast / ordfast,ordscan=8, default mode again.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/gpu_s44_a.sh [seconds]
. "$(dirname "$0")/gpu_lib.sh" s44a "${1:-540}"
T=${TT:-200}
export JAX_SPARSE_ATTN_GPU_TEST_TIMEOUT=100
timeout $T $PYT tests/test_gpu_det_order.py -k order_kernel > $O/t_order.txt 2>&1 &
timeout $T $PYT tests/test_gpu_det_order.py -k "det_sched and ordfast" > $O/t_det.txt 2>&1 &
wait
for f in order det; do t "$f: $(tail -1 $O/t_$f.txt)"; done
grep -h "^FAILED\|^ERROR\|Timeout\|timed out" $O/t_*.txt | head -20
VARS="default"
if grep -q "passed" $O/t_order.txt && ! grep -qi "failed\|error\|timeout\|timed out" $O/t_order.txt $O/t_det.txt; then
  VARS="default ordfast ordfast_scan8 scan8 ordfast_stream"
fi
t "trace variants: $VARS"
for v in $VARS; do
  case $v in
    default) E="X=1";;
    ordfast) E="JAX_SPARSE_ATTN_BSA_BWD_WS=ordfast";;
    ordfast_scan8) E="JAX_SPARSE_ATTN_BSA_BWD_WS=ordfast,ordscan=8";;
    scan8) E="JAX_SPARSE_ATTN_BSA_BWD_WS=ordscan=8";;
    ordfast_stream) E="JAX_SPARSE_ATTN_BSA_BWD_WS=ordfast,detstream";;
  esac
  env $E timeout 60 python3 scripts/gpu_trace.py --iters 10 --case bsa_bwd_det_blk64 \
    --case bsa_bwd_det_blk128 --out $O/trace_$v.json > $O/trace_$v.txt 2>&1
  t "trace $v rc=$?"; grep "==\|Order\|BsaBwd" $O/trace_$v.txt | cut -c1-150 | head -8
done
if [ "$VARS" != "default" ]; then
  W=JAX_SPARSE_ATTN_BSA_BWD_WS
  V=";deterministic=1;deterministic=1,$W=ordfast;deterministic=1,$W=ordfast+ordscan=8;"
  timeout $(( $(left) - 10 )) python3 -m benchmarks.bsa_bench --table-pass bwd --rows 0,2 \
    --timing both --table "$V" --out $O/bwd_det.json > $O/bwd_det.txt 2>&1
  t "det rows rc=$?"; grep -v "^wrote" $O/bwd_det.txt | tail -14
fi
