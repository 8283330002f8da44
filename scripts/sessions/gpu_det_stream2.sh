#!/usr/bin/env bash
# Second call on detstream, after the order kernel skips idle rounds and publishes once per
# round: the order kernel against its numpy definition, the deterministic GPU cases (stream
# and default schedule order), per-kernel traces of the deterministic blk 64 / blk 128
# backward with and without detstream, benchmark rows default / deterministic / detstream.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/sessions/gpu_det_stream2.sh [seconds]
set -u
O=${OUT:-./gpu_out}/st2; mkdir -p $O
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
export JAX_SPARSE_ATTN_GPU_TEST_TIMEOUT=120 JAX_SPARSE_ATTN_GPU_HANG_LOG=$O/hang.log
BUDGET=${1:-540}
start=$SECONDS
t() { echo "[$((SECONDS - start))s] $*" | tee -a $O/timeline.txt; }
left() { echo $((BUDGET - (SECONDS - start))); }
PYT="python3 -m pytest -m gpu -q -rA -p no:cacheprovider"
W=JAX_SPARSE_ATTN_BSA_BWD_WS
timeout 90 $PYT tests/test_gpu_det_order.py -k order_kernel > $O/tests.txt 2>&1; rc1=$?
t "order kernel vs reference rc=$rc1: $(tail -1 $O/tests.txt)"
timeout 200 $PYT tests/test_gpu_bsa.py -k "deterministic and (stream or k63 or mha or hot)" \
  >> $O/tests.txt 2>&1; rc=$?
t "test_gpu_bsa deterministic rc=$rc: $(tail -1 $O/tests.txt)"
if [ $rc -eq 0 ] && [ $rc1 -eq 0 ]; then
  for c in bsa_bwd_det_blk64 bsa_bwd_det_blk128; do
    for ws in "" detstream; do
      L=$(left); [ $L -gt 60 ] || break
      echo "### $c bsa_bwd_ws=$ws" >> $O/trace.txt
      env $W=$ws timeout 60 python3 scripts/gpu_trace.py --case $c \
        --iters 20 --out /tmp/trace.json 2>&1 | grep -v "^cutedsl" | head -5 >> $O/trace.txt
    done
  done
  cat $O/trace.txt
  L=$(left); t "left $L"
  if [ $L -gt 60 ]; then
    timeout $((L - 10)) python3 -m benchmarks.bsa_bench --timing both --table \
      ";deterministic=1;deterministic=1,$W=detstream" \
      --table-pass bwd --rows 0,3,2 --out $O/bench.json > $O/bench.txt 2>&1
    t "bench rc=$?"; grep -v "^wrote" $O/bench.txt
  fi
fi
grep -h "FAILED\|^E  \|PASSED\|passed\|failed" $O/tests.txt 2>/dev/null | head -30 | tee -a $O/timeline.txt
