#!/usr/bin/env bash
# The deterministic backward with the preprocessing in the order kernel's call (bsa_bwd_ws
# detoverlap): the new GPU cases and the default-stream case, the per-kernel trace of the
# deterministic blk 64 backward with detoverlap, benchmark rows deterministic (default) /
# detoverlap. Few output files.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/sessions/gpu_det_overlap.sh [seconds]
set -u
O=${OUT:-./gpu_out}/ov; mkdir -p $O
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
export JAX_SPARSE_ATTN_GPU_TEST_TIMEOUT=120 JAX_SPARSE_ATTN_GPU_HANG_LOG=$O/hang.log
BUDGET=${1:-400}
start=$SECONDS
t() { echo "[$((SECONDS - start))s] $*" | tee -a $O/timeline.txt; }
left() { echo $((BUDGET - (SECONDS - start))); }
PYT="python3 -m pytest -m gpu -q -rA -p no:cacheprovider"
W=JAX_SPARSE_ATTN_BSA_BWD_WS
timeout 150 $PYT tests/test_gpu_bsa.py -k "deterministic and (overlap or k63-stream)" \
  > $O/tests.txt 2>&1; rc=$?
t "test_gpu_bsa deterministic rc=$rc: $(tail -1 $O/tests.txt)"
if [ $rc -eq 0 ]; then
  echo "### bsa_bwd_det_blk64 bsa_bwd_ws=detoverlap" >> $O/trace.txt
  env $W=detoverlap timeout 50 python3 scripts/gpu_trace.py --case bsa_bwd_det_blk64 \
    --iters 20 --out /tmp/trace.json 2>&1 | grep -v "^cutedsl" | head -6 >> $O/trace.txt
  cat $O/trace.txt
  L=$(left); t "left $L"
  if [ $L -gt 40 ]; then
    timeout $((L - 5)) python3 -m benchmarks.bsa_bench --timing both --table \
      "deterministic=1;deterministic=1,$W=detoverlap" \
      --table-pass bwd --rows 0,2,1,6 --out $O/bench.json > $O/bench.txt 2>&1
    t "bench rc=$?"; grep -v "^wrote" $O/bench.txt
  fi
fi
grep -h "FAILED\|^E  \|PASSED\|passed\|failed" $O/tests.txt 2>/dev/null | head -30 | tee -a $O/timeline.txt
