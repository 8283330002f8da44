#!/usr/bin/env bash
# detstream with the warp-0 publication: its GPU cases (incl. the bitwise check against
# nodetstream) and the deterministic backward with / without it.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/sessions/gpu_det_stream4.sh [seconds]
set -u
O=${OUT:-./gpu_out}/st4; mkdir -p $O
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
export JAX_SPARSE_ATTN_GPU_TEST_TIMEOUT=120 JAX_SPARSE_ATTN_GPU_HANG_LOG=$O/hang.log
BUDGET=${1:-420}
start=$SECONDS
t() { echo "[$((SECONDS - start))s] $*" | tee -a $O/timeline.txt; }
left() { echo $((BUDGET - (SECONDS - start))); }
PYT="python3 -m pytest -m gpu -q -rA -p no:cacheprovider"
W=JAX_SPARSE_ATTN_BSA_BWD_WS
timeout 200 $PYT tests/test_gpu_bsa.py -k "deterministic and (stream or k63 or mha)" > $O/tests.txt 2>&1; rc=$?
t "test_gpu_bsa deterministic stream rc=$rc: $(tail -1 $O/tests.txt)"
timeout 60 $PYT tests/test_gpu_det_order.py -k order_kernel > $O/order.txt 2>&1
t "test_gpu_det_order rc=$?: $(tail -1 $O/order.txt)"
if [ $rc -eq 0 ]; then
  L=$(left); t "left $L"
  timeout $((L - 10)) python3 -m benchmarks.bsa_bench --timing both --table \
    ";deterministic=1;deterministic=1,$W=detstream" \
    --table-pass bwd --rows 0,2,3 --out $O/bench.json > $O/bench.txt 2>&1
  t "bench rc=$?"; grep -v "^wrote" $O/bench.txt
fi
grep -h "FAILED\|^E  \|PASSED\|passed\|failed" $O/tests.txt $O/order.txt 2>/dev/null | head -30 | tee -a $O/timeline.txt
