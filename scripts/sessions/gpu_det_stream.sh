#!/usr/bin/env bash
# The deterministic block-sparse backward with the schedule-order kernel streamed into it
# (bsa_bwd_ws detstream): the deterministic GPU tests (bitwise equal over 5 runs, against the
# fp32 reference; the stream cases and the default schedule-order cases), benchmark rows
# default mode / deterministic / deterministic + detstream, and per-kernel traces of the
# deterministic blk 64 backward with and without detstream. Few output files.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/sessions/gpu_det_stream.sh [seconds]
set -u
O=${OUT:-./gpu_out}/st; mkdir -p $O
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
export JAX_SPARSE_ATTN_GPU_TEST_TIMEOUT=120 JAX_SPARSE_ATTN_GPU_HANG_LOG=$O/hang.log
BUDGET=${1:-540}
start=$SECONDS
t() { echo "[$((SECONDS - start))s] $*" | tee -a $O/timeline.txt; }
left() { echo $((BUDGET - (SECONDS - start))); }
PYT="python3 -m pytest -m gpu -q -rA -p no:cacheprovider"
W=JAX_SPARSE_ATTN_BSA_BWD_WS
timeout 240 $PYT tests/test_gpu_bsa.py -k "deterministic and (stream or k63 or mha or hot)" \
  > $O/tests.txt 2>&1; rc=$?
t "test_gpu_bsa deterministic rc=$rc: $(tail -1 $O/tests.txt)"
if [ $rc -eq 0 ]; then
  for ws in "" detstream; do
    L=$(left); [ $L -gt 60 ] || break
    echo "### bsa_bwd_ws=$ws" >> $O/trace.txt
    env $W=$ws timeout 60 python3 scripts/gpu_trace.py --case bsa_bwd_det_blk64 \
      --iters 20 --out /tmp/trace_$ws.json 2>&1 | grep -v "^cutedsl" | head -9 >> $O/trace.txt
  done
  cat $O/trace.txt
  L=$(left); t "left $L"
  if [ $L -gt 60 ]; then
    timeout $((L - 10)) python3 -m benchmarks.bsa_bench --timing both --table \
      ";deterministic=1;deterministic=1,$W=detstream" \
      --table-pass bwd --rows 0,3,2,5,6,1 --out $O/bench.json > $O/bench.txt 2>&1
    t "bench rc=$?"; grep -v "^wrote" $O/bench.txt
  fi
fi
grep -h "FAILED\|^E  \|PASSED\|passed\|failed" $O/tests.txt 2>/dev/null | head -30 | tee -a $O/timeline.txt
