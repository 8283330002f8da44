#!/usr/bin/env bash
# The schedule order of the deterministic block-sparse backward (bsa_bwd_ws=detsched /
# detschedfull) on the GPU: the order kernel against its numpy definition, the deterministic
# cases with each switch, the per-kernel trace (the order kernel's own time), then the
# benchmark rows deterministic with each order against the default mode (budget permitting).
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/sessions/gpu_det_sched.sh [seconds]
set -u
O=${OUT:-./gpu_out}; mkdir -p $O/ds
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
export JAX_SPARSE_ATTN_GPU_TEST_TIMEOUT=120 JAX_SPARSE_ATTN_GPU_HANG_LOG=$O/ds/gpu_hang.log
BUDGET=${1:-400}
start=$SECONDS
t() { echo "[$((SECONDS - start))s] $*" >> $O/ds/timeline.txt; }
left() { echo $((BUDGET - (SECONDS - start))); }
PYT="python3 -m pytest -m gpu -q -rA -p no:cacheprovider"
W=JAX_SPARSE_ATTN_BSA_BWD_WS
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,clocks_event_reasons.active --format=csv -lms 200 > $O/ds/smi.csv 2>&1 &
SMI=$!
timeout 150 $PYT tests/test_gpu_det_order.py -k order_kernel > $O/ds/t_order.txt 2>&1; rc=$?
t "order kernel vs reference rc=$rc: $(tail -1 $O/ds/t_order.txt)"
if [ $rc -eq 0 ]; then
  timeout 200 $PYT tests/test_gpu_det_order.py -k det_sched > $O/ds/t_bwd.txt 2>&1
  t "deterministic cases with the order: $(tail -1 $O/ds/t_bwd.txt)"
  for blk in 64 128; do
    for ws in "" detsched detschedfull; do
      timeout 60 env $W=$ws python3 scripts/gpu_trace.py --case bsa_bwd_det_blk$blk --iters 20 \
        --out $O/ds/trace_det_blk${blk}_${ws:-default}.json \
        > $O/ds/trace_det_blk${blk}_${ws:-default}.txt 2>&1
      t "trace blk$blk ${ws:-default} rc=$?"
    done
  done
  # bsa_bench runs --rows in TABLE order and writes its JSON at the end: the two 12.5 %
  # rows (blk64, blk128) first, in a call of their own, then the rest
  for part in "0,3 a" "1,2,4,5,6 b"; do
    set -- $part
    L=$(left); t "left $L"
    [ $L -gt 60 ] || break
    timeout $((L - 10)) python3 -m benchmarks.bsa_bench --timing both --table \
      ";deterministic=1;deterministic=1,$W=detsched;deterministic=1,$W=detschedfull" \
      --table-pass bwd --rows $1 --out $O/ds/bsa_det_$2.json > $O/ds/bsa_det_$2.txt 2>&1
    t "bench rows $1 rc=$?"
  done
fi
kill $SMI 2>/dev/null
grep -h "FAILED\|^E  " $O/ds/t_*.txt 2>/dev/null | head -20 >> $O/ds/timeline.txt
