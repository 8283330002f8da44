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
  timeout "${T_B:-90}" python3 benchmarks/hstu_bench.py $rows --iters ${B_ITERS:-20} \
    --out "$OUT/logs/hstu_inference_bench.json" > "$OUT/logs/bench.log" 2>&1
  echo "bench rc=$?" >> "$OUT/logs/summary.txt"
fi
if [[ $STEPS == *s* ]]; then
  # one sanitizer process per case (S_PAR at a time): a crash of the tool (seen once, rc 139
  # during a slow compile) then costs one case, and each case's rc is recorded
  san_case() {  # $1 = log tag, $2 = case name
    timeout "${T_S:-60}" compute-sanitizer --tool memcheck --report-api-errors no \
      --error-exitcode 9 python3 tests/sanitize_grid.py --only "$2" > "$OUT/logs/sanitize_$1.log" 2>&1
    echo "sanitize rc=$? $(grep -h 'ERROR SUMMARY' "$OUT/logs/sanitize_$1.log" | tail -1) | $2" \
      >> "$OUT/logs/summary.txt"
  }
  # a plain run first fills JAX's persistent compilation cache and the kernel cache, so the
  # sanitized processes compile nothing (XLA compiles under the sanitizer take minutes)
  export JAX_COMPILATION_CACHE_DIR=/tmp/inf_jcc JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 \
         JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES=0 JAX_SPARSE_ATTN_CACHE_DIR=/tmp/inf_kc \
         XLA_FLAGS=--xla_gpu_autotune_level=0
  for only in ${S_ONLY:-paged gqa}; do
    timeout "${T_S:-60}" python3 tests/sanitize_grid.py --only "hstu $only" \
      > "$OUT/logs/warm_$only.log" 2>&1
    echo "warm $only rc=$? $(tail -1 "$OUT/logs/warm_$only.log")" >> "$OUT/logs/summary.txt"
    python3 tests/sanitize_grid.py --list --only "hstu $only" > "$OUT/logs/cases_$only.txt"
    n=0
    while IFS= read -r name; do
      n=$((n + 1))
      san_case "${only}_$n" "$name" &
      (( n % ${S_PAR:-4} == 0 )) && wait
    done < "$OUT/logs/cases_$only.txt"
    wait
  done
fi
tar czf "$OUT/inference.tar.gz" -C "$OUT" logs
cat "$OUT/logs/summary.txt"
