#!/usr/bin/env bash
# The order kernel's proposal scans checking four entries at once: the order kernel against
# its numpy definition, deterministic cases of the default paths (blk 64 streamed, blk 128),
# per-kernel traces of the deterministic blk 64 / blk 128 backward, benchmark rows
# deterministic at blk64 12.5 % and blk128.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/sessions/gpu_det_scan.sh [seconds]
set -u
O=${OUT:-./gpu_out}/sc; mkdir -p $O
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
export JAX_SPARSE_ATTN_GPU_TEST_TIMEOUT=100 JAX_SPARSE_ATTN_GPU_HANG_LOG=$O/hang.log
BUDGET=${1:-190}
start=$SECONDS
t() { echo "[$((SECONDS - start))s] $*" | tee -a $O/timeline.txt; }
left() { echo $((BUDGET - (SECONDS - start))); }
PYT="python3 -m pytest -m gpu -q -rA -p no:cacheprovider"
timeout 60 $PYT tests/test_gpu_det_order.py -k order_kernel > $O/tests.txt 2>&1; rc1=$?
t "order kernel vs reference rc=$rc1: $(tail -1 $O/tests.txt)"
timeout 90 $PYT tests/test_gpu_bsa.py -k "deterministic and (k63 or mha)" >> $O/tests.txt 2>&1; rc=$?
t "test_gpu_bsa deterministic rc=$rc: $(tail -1 $O/tests.txt)"
if [ $rc -eq 0 ] && [ $rc1 -eq 0 ]; then
  for c in bsa_bwd_det_blk64 bsa_bwd_det_blk128; do
    L=$(left); [ $L -gt 25 ] || break
    echo "### $c" >> $O/trace.txt
    timeout 30 python3 scripts/gpu_trace.py --case $c --iters 20 --out /tmp/trace.json 2>&1 \
      | grep -v "^cutedsl" | head -5 >> $O/trace.txt
  done
  cat $O/trace.txt
  L=$(left); t "left $L"
  if [ $L -gt 30 ]; then
    timeout $((L - 3)) python3 -m benchmarks.bsa_bench --timing both --table "deterministic=1" \
      --table-pass bwd --rows 0,3 --out $O/bench.json > $O/bench.txt 2>&1
    t "bench rc=$?"; grep -v "^wrote" $O/bench.txt
  fi
fi
grep -h "FAILED\|^E  \|PASSED\|passed\|failed" $O/tests.txt 2>/dev/null | head -20 | tee -a $O/timeline.txt
