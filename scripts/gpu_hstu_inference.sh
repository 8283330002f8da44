#!/usr/bin/env bash
# HSTU inference on the H200: GQA/MQA (sm90ws forward + sm90 backward) and the paged-KV
# forward vs the reference, the inference benchmark rows and compute-sanitizer memcheck of the
# paged / GQA garbage-metadata cases. Logs under $OUT, packed into $OUT/inference.tar.gz.
#   OUT=$OUT STEPS=gbs bash scripts/gpu_hstu_inference.sh
# STEPS: g = GPU tests (test_gpu_hstu.py -k "gqa_kernel or paged_kernel"), b = hstu_bench
# --inference all, s = sanitizer (sanitize_grid.py --only paged, then --only gqa).
# T_G / T_B / T_S: per-step timeouts (s); K_G: pytest -k of step g; B_ROWS: bench rows
# (default all); S_ONLY: sanitizer case groups (default "paged gqa").
set -u
OUT=${OUT:-/tmp/hstu_inference}
STEPS=${STEPS:-gbs}
mkdir -p "$OUT/logs"
export PYTHONPATH=$PWD:${PYTHONPATH:-}
nvidia-smi --query-gpu=name,memory.used --format=csv > "$OUT/logs/gpu.txt" 2>&1
if [[ $STEPS == *g* ]]; then
  timeout "${T_G:-150}" python3 -m pytest -q -m gpu -p no:cacheprovider -s \
    -k "${K_G:-gqa_kernel or paged_kernel}" tests/test_gpu_hstu.py > "$OUT/logs/gpu_tests.log" 2>&1
  echo "gpu tests rc=$?" >> "$OUT/logs/summary.txt"
  tail -3 "$OUT/logs/gpu_tests.log" >> "$OUT/logs/summary.txt"
fi
if [[ $STEPS == *b* ]]; then
  rows=""
  for r in ${B_ROWS:-all}; do rows="$rows --inference $r"; done
  timeout "${T_B:-90}" python3 benchmarks/hstu_bench.py $rows --iters 10 \
    --out "$OUT/logs/hstu_inference_bench.json" > "$OUT/logs/bench.log" 2>&1
  echo "bench rc=$?" >> "$OUT/logs/summary.txt"
fi
if [[ $STEPS == *s* ]]; then
  for only in ${S_ONLY:-paged gqa}; do
    timeout "${T_S:-60}" compute-sanitizer --tool memcheck --error-exitcode 9 \
      python3 tests/sanitize_grid.py --only "hstu $only" > "$OUT/logs/sanitize_$only.log" 2>&1
    echo "sanitize $only rc=$?" >> "$OUT/logs/summary.txt"
    grep -E "ERROR SUMMARY|cases ok" "$OUT/logs/sanitize_$only.log" >> "$OUT/logs/summary.txt"
  done
fi
tar czf "$OUT/inference.tar.gz" -C "$OUT" logs
cat "$OUT/logs/summary.txt"
