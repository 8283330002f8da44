#!/usr/bin/env bash
# One device call for the sm90 HSTU backward (from the project root, after
# `source .devcache/setup.sh`): a smoke case and the B8 L4096 D128 causal backward benchmark
# (sm90 vs sm80) in one process, then packed batches and grid cases in a second process
# that reuses the compiled kernels (JAX_SPARSE_ATTN_CACHE_DIR). Logs go to $OUT.
# T_A / T_B: time limits of the two processes (s).
set -u
OUT=${OUT:-/tmp/hstu_bwd_sm90}
mkdir -p "$OUT"
export JAX_SPARSE_ATTN_CACHE_DIR=${JAX_SPARSE_ATTN_CACHE_DIR:-/tmp/k14-cute-cache}
export HSTU_TEST_BWD=sm90
T_A=${T_A:-95}
T_B=${T_B:-105}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > "$OUT/gpu.txt" 2>&1
t0=$(date +%s)
timeout "$T_A" python scripts/sessions/gpu_hstu_bwd_sm90.py smoke bench --out "$OUT" --budget-s $((T_A - 5)) \
  > "$OUT/part_a.log" 2>&1
echo "part A rc=$? $(( $(date +%s) - t0 )) s" | tee -a "$OUT/part_a.log"
tail -30 "$OUT/part_a.log"
if grep -q "^PASS smoke" "$OUT/part_a.log" || grep -q "^FAIL smoke" "$OUT/part_a.log"; then
  t1=$(date +%s)
  timeout "$T_B" python scripts/sessions/gpu_hstu_bwd_sm90.py batches grid --out "$OUT" \
    --budget-s $((T_B - 5)) > "$OUT/part_b.log" 2>&1
  echo "part B rc=$? $(( $(date +%s) - t1 )) s" | tee -a "$OUT/part_b.log"
  tail -40 "$OUT/part_b.log"
else
  echo "smoke step did not finish (hang or crash): part B skipped"
fi
