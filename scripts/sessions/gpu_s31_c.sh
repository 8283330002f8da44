#!/usr/bin/env bash
# causal on the warp-specialized backward: the causal GPU grid (sm90ws backward by default,
# pack_gqa and the sm90 backward named), the deterministic causal cases, the causal benchmark
# rows, compute-sanitizer memcheck of two option cases with garbage metadata.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/sessions/gpu_s31_c.sh [seconds]
set -u
O=${OUT:-./gpu_out}/c; mkdir -p $O
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
export JAX_SPARSE_ATTN_GPU_TEST_TIMEOUT=120 JAX_SPARSE_ATTN_GPU_HANG_LOG=$O/hang.log
BUDGET=${1:-520}
start=$SECONDS
t() { echo "[$((SECONDS - start))s] $*" | tee -a $O/timeline.txt; }
left() { echo $((BUDGET - (SECONDS - start))); }
PYT="python3 -m pytest -m gpu -q -rA -p no:cacheprovider"
timeout 200 $PYT tests/test_gpu_bsa_causal.py > $O/t_causal.txt 2>&1
t "causal grid rc=$?: $(tail -1 $O/t_causal.txt)"
timeout 100 $PYT tests/test_gpu_bsa.py -k "deterministic and causal" > $O/t_det_causal.txt 2>&1
t "det causal rc=$?: $(tail -1 $O/t_det_causal.txt)"
timeout 100 python3 -m benchmarks.bsa_bench --causal --out $O/bench_causal.json > $O/bench_causal.txt 2>&1
t "bench causal rc=$?"; grep -v "^wrote" $O/bench_causal.txt
export JAX_COMPILATION_CACHE_DIR=/tmp/s31_jcc JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 \
       JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES=0 JAX_SPARSE_ATTN_CACHE_DIR=/tmp/s31_kc \
       XLA_FLAGS=--xla_gpu_autotune_level=0
timeout 90 python3 tests/sanitize_grid.py --only "bsa options" > $O/warm.txt 2>&1
t "options grid (plain) rc=$?: $(tail -1 $O/warm.txt)"
for only in "r=8 causal=True kv_splits=3" "r=1 causal=True kv_splits=2"; do
  L=$(left); [ $L -lt 40 ] && break
  timeout $((L < 100 ? L - 10 : 90)) compute-sanitizer --tool memcheck --report-api-errors no \
    --error-exitcode 9 python3 tests/sanitize_grid.py --only "$only" > "$O/san_${only// /_}.txt" 2>&1
  t "sanitize rc=$? $(grep -h 'ERROR SUMMARY' "$O/san_${only// /_}.txt" | tail -1) | $only"
done
grep -h "FAILED\|^E  \|passed\|failed" $O/t_*.txt 2>/dev/null | head -40 | tee -a $O/timeline.txt
