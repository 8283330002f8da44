#!/usr/bin/env bash
# the causal cases call C's time limit cut off, the sm90ws backward cases (non-causal
# regression after the causal change), default-mode and deterministic backward rows.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/sessions/gpu_s31_d.sh [seconds]
set -u
O=${OUT:-./gpu_out}/d; mkdir -p $O
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
export JAX_SPARSE_ATTN_GPU_TEST_TIMEOUT=120 JAX_SPARSE_ATTN_GPU_HANG_LOG=$O/hang.log
BUDGET=${1:-300}
start=$SECONDS
t() { echo "[$((SECONDS - start))s] $*" | tee -a $O/timeline.txt; }
left() { echo $((BUDGET - (SECONDS - start))); }
PYT="python3 -m pytest -m gpu -q -rA -p no:cacheprovider"
timeout 100 $PYT tests/test_gpu_bsa_causal.py -k "pack2 or pack4-fp16-blk128 or sm90bwd" > $O/t_causal.txt 2>&1
t "causal rest rc=$?: $(tail -1 $O/t_causal.txt)"
timeout 100 $PYT tests/test_gpu_bsa.py -k "sm90ws_backward" > $O/t_ws.txt 2>&1
t "sm90ws backward rc=$?: $(tail -1 $O/t_ws.txt)"
L=$(left)
if [ $L -gt 40 ]; then
  timeout $((L - 10)) python3 -m benchmarks.bsa_bench --timing both --table ";deterministic=1" \
    --table-pass bwd --rows 0,3 --out $O/bench.json > $O/bench.txt 2>&1
  t "bench rc=$?"; grep -v "^wrote" $O/bench.txt
fi
grep -h "FAILED\|^E  \|passed\|failed" $O/t_*.txt 2>/dev/null | head -40 | tee -a $O/timeline.txt
