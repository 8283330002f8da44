#!/usr/bin/env bash
# The deterministic block-sparse backward with several fp32 dQ accumulators per query tile
# (bsa_bwd_ws dqslots=N): the deterministic GPU tests (bitwise equal over 5 runs, against
# the fp32 reference; the slots cases included), the order kernel against its numpy
# definition, benchmark rows default mode / deterministic / dqslots=2 / dqslots=4, and the
# per-kernel traces at blk 64. Few output files.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/sessions/gpu_det_slots.sh [seconds]
set -u
O=${OUT:-./gpu_out}/ds; mkdir -p $O
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
export JAX_SPARSE_ATTN_GPU_TEST_TIMEOUT=120 JAX_SPARSE_ATTN_GPU_HANG_LOG=$O/hang.log
BUDGET=${1:-540}
start=$SECONDS
t() { echo "[$((SECONDS - start))s] $*" | tee -a $O/timeline.txt; }
left() { echo $((BUDGET - (SECONDS - start))); }
PYT="python3 -m pytest -m gpu -q -rA -p no:cacheprovider"
W=JAX_SPARSE_ATTN_BSA_BWD_WS
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,clocks_event_reasons.active --format=csv -lms 200 > $O/smi.csv 2>&1 &
SMI=$!
timeout 240 $PYT tests/test_gpu_bsa.py -k "deterministic" > $O/tests.txt 2>&1; rc=$?
t "test_gpu_bsa deterministic rc=$rc: $(tail -1 $O/tests.txt)"
timeout 90 $PYT tests/test_gpu_det_order.py -k order_kernel >> $O/tests.txt 2>&1
t "order kernel vs reference rc=$?: $(tail -1 $O/tests.txt)"
if [ $rc -eq 0 ]; then
  for part in "0,3 a" "1,2,5,6 b"; do
    set -- $part
    L=$(left); t "left $L"
    [ $L -gt 60 ] || break
    timeout $((L - 10)) python3 -m benchmarks.bsa_bench --timing both --table \
      ";deterministic=1;deterministic=1,$W=dqslots=2;deterministic=1,$W=dqslots=4" \
      --table-pass bwd --rows $1 --out $O/bench_$2.json > $O/bench_$2.txt 2>&1
    t "bench rows $1 rc=$?"; grep -v "^wrote" $O/bench_$2.txt
  done
  for sl in 1 2; do
    L=$(left); [ $L -gt 40 ] || break
    echo "### dqslots=$sl" >> $O/trace.txt
    env $W=dqslots=$sl timeout 60 python3 scripts/gpu_trace.py --case bsa_bwd_det_blk64 \
      --iters 20 --out /tmp/trace_$sl.json 2>&1 | grep -v "^cutedsl" | head -7 >> $O/trace.txt
  done
  cat $O/trace.txt
fi
kill $SMI 2>/dev/null
grep -h "FAILED\|^E  \|PASSED\|passed\|failed" $O/tests.txt 2>/dev/null | head -30 | tee -a $O/timeline.txt
