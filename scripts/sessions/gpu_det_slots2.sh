#!/usr/bin/env bash
# Second call on the deterministic dQ accumulators: the GPU test of the default at blk 64
# with long rows (two accumulators chosen by default), benchmark rows default mode /
# deterministic (default) / dqslots=1 / detschedfull+dqslots=2, and Nsight Compute's
# warp-stall sampling of the deterministic blk 64 kernel (default) for where its time goes.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/sessions/gpu_det_slots2.sh [seconds]
set -u
O=${OUT:-./gpu_out}/ds2; mkdir -p $O
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
export JAX_SPARSE_ATTN_GPU_TEST_TIMEOUT=120 JAX_SPARSE_ATTN_GPU_HANG_LOG=$O/hang.log
BUDGET=${1:-540}
start=$SECONDS
t() { echo "[$((SECONDS - start))s] $*" | tee -a $O/timeline.txt; }
left() { echo $((BUDGET - (SECONDS - start))); }
PYT="python3 -m pytest -m gpu -q -rA -p no:cacheprovider"
W=JAX_SPARSE_ATTN_BSA_BWD_WS
timeout 120 $PYT tests/test_gpu_bsa.py -k "deterministic and (k63 or slots2)" > $O/tests.txt 2>&1; rc=$?
t "tests rc=$rc: $(tail -1 $O/tests.txt)"
if [ $rc -eq 0 ]; then
  L=$(left)
  timeout $((L - 150)) python3 -m benchmarks.bsa_bench --timing both --table \
    ";deterministic=1;deterministic=1,$W=dqslots=1;deterministic=1,$W=detschedfull+dqslots=2" \
    --table-pass bwd --rows 0,1,2,5,6 --out $O/bench.json > $O/bench.txt 2>&1
  t "bench rc=$?"; grep -v "^wrote" $O/bench.txt
  NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  L=$(left)
  if [ $L -gt 100 ]; then
    timeout $((L - 20)) $NCU --set full --import-source yes --clock-control none \
      --kernel-name regex:BsaBwdSm90Ws --launch-skip 2 --launch-count 1 -f -o /tmp/ncu_det64 \
      python3 -m benchmarks.bsa_bench --table "deterministic=1" --table-pass bwd --rows 0 \
      --out /tmp/b.json > /tmp/ncu.log 2>&1
    t "ncu rc=$?"; tail -3 /tmp/ncu.log
    $NCU --import /tmp/ncu_det64.ncu-rep --page details > $O/ncu_det64_details.txt 2>&1
    $NCU --import /tmp/ncu_det64.ncu-rep --page source --csv --print-source sass > /tmp/src.csv 2>&1
    python3 scripts/ncu_stalls.py /tmp/src.csv 70 > $O/ncu_det64_stalls.txt 2>&1
    t "ncu summary done"; head -5 $O/ncu_det64_stalls.txt
  fi
fi
grep -h "FAILED\|^E  \|PASSED\|passed\|failed" $O/tests.txt 2>/dev/null | head -30 | tee -a $O/timeline.txt
