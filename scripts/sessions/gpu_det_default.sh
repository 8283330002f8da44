#!/usr/bin/env bash
# The deterministic block-sparse backward with its default dQ order (the schedule order
# with a window of one CTA per SM where the query heads are the KV heads): the order
# kernel against its numpy definition, the per-kernel traces (the order kernel's own time),
# the deterministic GPU tests, and the benchmark rows default mode / deterministic (new
# default) / deterministic with the launch-group order (detlaunch). Few output files.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/sessions/gpu_det_default.sh [seconds]
set -u
O=${OUT:-./gpu_out}/dd; mkdir -p $O
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
export JAX_SPARSE_ATTN_GPU_TEST_TIMEOUT=120 JAX_SPARSE_ATTN_GPU_HANG_LOG=$O/hang.log
BUDGET=${1:-400}
start=$SECONDS
t() { echo "[$((SECONDS - start))s] $*" | tee -a $O/timeline.txt; }
left() { echo $((BUDGET - (SECONDS - start))); }
PYT="python3 -m pytest -m gpu -q -rA -p no:cacheprovider"
W=JAX_SPARSE_ATTN_BSA_BWD_WS
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,clocks_event_reasons.active --format=csv -lms 200 > $O/smi.csv 2>&1 &
SMI=$!
timeout 150 $PYT tests/test_gpu_det_order.py -k order_kernel > $O/tests.txt 2>&1; rc=$?
t "order kernel vs reference rc=$rc: $(tail -1 $O/tests.txt)"
if [ $rc -eq 0 ]; then
  for c in bsa_bwd_det_blk64 bsa_bwd_det_blk128 bsa_bwd_det_gqa_blk64; do
    echo "### $c" >> $O/trace.txt
    timeout 60 python3 scripts/gpu_trace.py --case $c --iters 20 --out /tmp/trace_$c.json \
      2>&1 | grep -v "^cutedsl" | head -6 >> $O/trace.txt
  done
  t "traces done"; grep -h "###\|==\|det_order" $O/trace.txt
  timeout 200 $PYT tests/test_gpu_bsa.py -k "deterministic" >> $O/tests.txt 2>&1
  t "test_gpu_bsa deterministic (default order): $(tail -1 $O/tests.txt)"
  for part in "0,3,5 a" "1,2,4,6 b"; do
    set -- $part
    L=$(left); t "left $L"
    [ $L -gt 60 ] || break
    timeout $((L - 10)) python3 -m benchmarks.bsa_bench --timing both --table \
      ";deterministic=1;deterministic=1,$W=detlaunch" \
      --table-pass bwd --rows $1 --out $O/bench_$2.json > $O/bench_$2.txt 2>&1
    t "bench rows $1 rc=$?"; grep -v "^wrote" $O/bench_$2.txt
  done
fi
kill $SMI 2>/dev/null
grep -h "FAILED\|^E  " $O/tests.txt 2>/dev/null | head -20 | tee -a $O/timeline.txt
