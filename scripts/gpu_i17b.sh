#!/usr/bin/env bash
# HSTU paged-KV inference forward on ONE H200 (i17b): benchmark rows (paged with the schedule
# kernel vs the jnp schedule, contiguous), the paged GPU tests, and compute-sanitizer memcheck
# of the paged garbage-metadata cases of tests/sanitize_grid.py, one case per process (rc per
# case in summary.txt). Everything within T seconds (default 240). From the tree's root:
#   T=240 OUT=$OUT/i17b bash scripts/gpu_i17b.sh
# Logs under $OUT/logs, packed into $OUT/i17b_logs.tgz. PHASES (default "b t s"): b = bench,
# t = GPU tests, s = sanitizer; t and s run side by side after b (timing alone on the GPU).
set -u
T=${T:-240}
OUT=${OUT:-/tmp/i17b_gpu}
PHASES=${PHASES:-"b t s"}
L=$OUT/logs
mkdir -p "$L"
export PYTHONPATH=$PWD:${PYTHONPATH:-} XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
export JAX_SPARSE_ATTN_CACHE_DIR=${JAX_SPARSE_ATTN_CACHE_DIR:-/tmp/i17b_kernel_cache}
start=$(date +%s)
left() { echo $(( T - ($(date +%s) - start) - 8 )); }   # seconds left, 8 s kept for packing
S=$L/summary.txt
echo "i17b $(git log -1 --format=%h 2>/dev/null || echo nogit) T=$T" > "$S"
nvidia-smi --query-gpu=name,memory.used --format=csv > "$L/gpu.txt" 2>&1

if [[ " $PHASES " == *" b "* ]]; then
  # 1) bench alone on the GPU: the paged rows with the schedule kernel (paged) and with the
  #    jnp schedule (paged_xla), the contiguous forward beside them
  tb=$(( $(left) < ${T_B:-100} ? $(left) : ${T_B:-100} ))
  timeout "$tb" python3 benchmarks/hstu_bench.py --schedule-ab --iters "${ITERS:-50}" \
    --paged-variant JAX_SPARSE_ATTN_HSTU_WS=pagepf \
    --inference target1-64x8192 --inference target64-64x8192 --inference target1-8x8192 \
    --inference target64-8x8192 --inference paged-8x4096 \
    --out "$L/inference_bench.json" > "$L/bench.log" 2>&1
  echo "bench rc=$? ($(( $(date +%s) - start )) s)" >> "$S"
  grep -E "^target|^paged" "$L/bench.log" >> "$S"
fi

# 2) GPU tests and 3) sanitizer side by side in what is left
if [[ " $PHASES " == *" t "* ]]; then
  (
    tt=$(left)
    timeout "$tt" python3 -m pytest -q -m gpu -p no:cacheprovider -s -rA \
      tests/test_hstu_inference.py > "$L/gpu_tests.log" 2>&1
    echo "gpu tests (test_hstu_inference.py -m gpu) rc=$? ($(( $(date +%s) - start )) s)" >> "$S"
    grep -E "passed|failed|error" "$L/gpu_tests.log" | tail -2 >> "$S"
    if [[ ${EXTRA_TESTS:-1} == 1 && $(left) -gt 40 ]]; then
      timeout "$(left)" python3 -m pytest -q -m gpu -p no:cacheprovider -s -rA \
        -k "paged_kernel or (split_kv and paged)" tests/test_gpu_hstu.py \
        > "$L/gpu_tests_paged_grid.log" 2>&1
      echo "gpu tests (test_gpu_hstu.py -k paged) rc=$? ($(( $(date +%s) - start )) s)" >> "$S"
      grep -E "passed|failed|error" "$L/gpu_tests_paged_grid.log" | tail -2 >> "$S"
    fi
  ) &
fi
if [[ " $PHASES " == *" s "* ]]; then
  (
    timeout 60 python3 tests/sanitize_grid.py --list --only "hstu paged" > "$L/sanitize_cases.txt" 2>&1
    i=0
    # at most SAN_P (default 4) sanitizer processes at once, one case each, the most garbled
    # metadata first (the list reversed)
    while IFS= read -r name; do
      [[ $name == hstu\ paged* ]] || continue
      i=$((i + 1))
      ts=$(( $(left) < ${T_S:-150} ? $(left) : ${T_S:-150} ))
      if (( ts < 20 )); then echo "sanitize case $i '$name' NOT RUN (time)" >> "$S"; continue; fi
      (
        timeout "$ts" compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 \
          python3 tests/sanitize_grid.py --only "$name" > "$L/sanitize_$i.log" 2>&1
        rc=$?
        echo "sanitize case $i rc=$rc '$name' $(grep -ohE 'ERROR SUMMARY: [0-9]+ errors?' "$L/sanitize_$i.log" | tail -1) $(grep -ohE '^ *(ok|NON-FINITE|ERROR)[^ ]*' "$L/sanitize_$i.log" | head -1)" >> "$S"
      ) &
      while (( $(jobs -rp | wc -l) >= ${SAN_P:-4} )); do sleep 1; done
    done < <(tac "$L/sanitize_cases.txt")
    wait
  ) &
fi
wait
echo "total $(( $(date +%s) - start )) s" >> "$S"
tar czf "$OUT/i17b_logs.tgz" -C "$OUT" logs
cat "$S"
