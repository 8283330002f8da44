#!/usr/bin/env bash
# pack_gqa with causal / with kv_splits on the kernels, and the deterministic backward whose
# first dQ contributions are stored (det_store): GPU tests, then the benchmark rows.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/sessions/gpu_s31_b.sh [seconds]
set -u
O=${OUT:-./gpu_out}/b; mkdir -p $O
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
export JAX_SPARSE_ATTN_GPU_TEST_TIMEOUT=120 JAX_SPARSE_ATTN_GPU_HANG_LOG=$O/hang.log
BUDGET=${1:-540}
start=$SECONDS
t() { echo "[$((SECONDS - start))s] $*" | tee -a $O/timeline.txt; }
left() { echo $((BUDGET - (SECONDS - start))); }
PYT="python3 -m pytest -m gpu -q -rA -p no:cacheprovider"
W=JAX_SPARSE_ATTN_BSA_BWD_WS
timeout 150 $PYT tests/test_gpu_bsa_causal.py -k "pack or square or sizes-gqa" > $O/t_causal.txt 2>&1
t "causal (pack) rc=$?: $(tail -1 $O/t_causal.txt)"
timeout 150 $PYT tests/test_gpu_bsa_pack_gqa.py -k "split" > $O/t_packsplit.txt 2>&1
t "pack_gqa splits rc=$?: $(tail -1 $O/t_packsplit.txt)"
timeout 220 $PYT tests/test_gpu_bsa.py -k "deterministic and (mha or k63 or slots4 or detzero or 32k or sortcsr)" > $O/t_det.txt 2>&1
t "deterministic rc=$?: $(tail -1 $O/t_det.txt)"
L=$(left); t "left $L"
if [ $L -gt 60 ]; then
  timeout $((L / 2)) python3 -m benchmarks.bsa_bench --timing both --table \
    "deterministic=1;deterministic=1,$W=detzero" \
    --table-pass bwd --rows 0,3 --out $O/bench_det.json > $O/bench_det.txt 2>&1
  t "bench det rc=$?"; grep -v "^wrote" $O/bench_det.txt
fi
L=$(left)
if [ $L -gt 30 ]; then
  timeout $((L - 10)) python3 -m benchmarks.bsa_bench --pack-gqa --out $O/bench_pack.json > $O/bench_pack.txt 2>&1
  t "bench pack rc=$?"; grep -v "^wrote" $O/bench_pack.txt
fi
grep -h "FAILED\|^E  \|passed\|failed" $O/t_*.txt 2>/dev/null | head -40 | tee -a $O/timeline.txt
