#!/usr/bin/env bash
# HSTU paged-KV inference forward on ONE H200 (i17b). From the tree's root:
#   PHASE=tests T=240 OUT=$OUT/i17b bash scripts/sessions/gpu_i17b.sh
#   PHASE=bench TB=60 OUT=$OUT/i17b bash scripts/sessions/gpu_i17b.sh
# PHASE=tests (within T s, default 240): the paged GPU tests (tests/test_hstu_inference.py -m gpu:
#   schedule-kernel metadata vs jnp, paged forward with the schedule kernel / jnp metadata /
#   page-id prefetch bitwise equal and vs the reference), beside them compute-sanitizer
#   memcheck of the paged garbage-metadata cases of tests/sanitize_grid.py, one case per
#   process (SAN_P at once, the most garbled first; rc per case in summary.txt), then the
#   paged cases of tests/test_gpu_hstu.py if time is left.
# PHASE=bench (within TB s, default 60; alone on its GPU): hstu_bench --inference rows, the
#   target rows first: paged with the schedule kernel (paged), with jnp metadata (paged_xla),
#   with the page-id prefetch (paged[...pagepf]), with 3 K/V stages (paged[...qalias]) and
#   contiguous (default and [...qalias]). Each row prints when done.
# PHASE=all: bench then tests. Logs under $OUT/logs_$PHASE, packed into
# $OUT/i17b_logs_$PHASE.tgz; summary in logs_$PHASE/summary.txt (also printed).
set -u
PHASE=${PHASE:-tests}
OUT=${OUT:-/tmp/i17b_gpu}
case $PHASE in tests) BUDGET=${T:-240} ;; bench) BUDGET=${TB:-60} ;; all) BUDGET=$(( ${T:-240} + ${TB:-60} )) ;;
  *) echo "PHASE must be tests, bench or all, got '$PHASE'"; exit 2 ;; esac
L=$OUT/logs_$PHASE
mkdir -p "$L"
export PYTHONPATH=$PWD:${PYTHONPATH:-} XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
export JAX_SPARSE_ATTN_CACHE_DIR=${JAX_SPARSE_ATTN_CACHE_DIR:-/tmp/i17b_kernel_cache}
start=$(date +%s)
left() { echo $(( BUDGET - ($(date +%s) - start) - 6 )); }   # 6 s kept for packing
S=$L/summary.txt
echo "i17b PHASE=$PHASE budget=${BUDGET}s $(date -u +%H:%M:%S)" > "$S"
nvidia-smi --query-gpu=name,memory.used --format=csv > "$L/gpu.txt" 2>&1

if [[ $PHASE == bench || $PHASE == all ]]; then
  timeout "$(left)" python3 benchmarks/hstu_bench.py --schedule-ab --iters "${ITERS:-30}" \
    --paged-variant JAX_SPARSE_ATTN_HSTU_WS=pagepf --paged-variant JAX_SPARSE_ATTN_HSTU_WS=qalias \
    --contiguous-variant JAX_SPARSE_ATTN_HSTU_WS=qalias \
    --inference target64-64x8192 --inference target1-64x8192 --inference target64-8x8192 \
    --inference target1-8x8192 --inference paged-8x4096 \
    --out "$L/inference_bench.json" > "$L/bench.log" 2>&1
  echo "bench rc=$? ($(( $(date +%s) - start )) s)" >> "$S"
  grep -E "^target|^paged|failed" "$L/bench.log" >> "$S"
fi

if [[ $PHASE == tests || $PHASE == all ]]; then
  (
    timeout "$(left)" python3 -m pytest -v -m gpu -p no:cacheprovider -s -rfE \
      tests/test_hstu_inference.py > "$L/gpu_tests.log" 2>&1
    echo "gpu tests (test_hstu_inference.py -m gpu) rc=$? ($(( $(date +%s) - start )) s)" >> "$S"
    grep -E "(PASSED|FAILED|ERROR)( |$)|passed|failed|^paged|^gqa" "$L/gpu_tests.log" | tail -40 >> "$S"
    if (( $(left) > 45 )); then
      timeout "$(left)" python3 -m pytest -v -m gpu -p no:cacheprovider -s -rfE \
        -k "paged_kernel or (split_kv and paged)" tests/test_gpu_hstu.py \
        > "$L/gpu_tests_paged_grid.log" 2>&1
      echo "gpu tests (test_gpu_hstu.py -k paged) rc=$? ($(( $(date +%s) - start )) s)" >> "$S"
      grep -E "passed|failed" "$L/gpu_tests_paged_grid.log" | tail -2 >> "$S"
    fi
  ) &
  (
    timeout 60 python3 tests/sanitize_grid.py --list --only "hstu paged" > "$L/sanitize_cases.txt" 2>&1
    # warm the kernel cache (every paged case once, no sanitizer): the memcheck processes
    # then load the compiled kernels instead of compiling under the sanitizer
    timeout 100 python3 tests/sanitize_grid.py --only "hstu paged" > "$L/sanitize_warm.log" 2>&1
    echo "sanitize warm-up rc=$? $(tail -1 "$L/sanitize_warm.log") ($(( $(date +%s) - start )) s)" >> "$S"
    i=0
    # at most SAN_P (default 3) sanitizer processes at once, one case each: the default path's
    # cases (schedule kernel + kernel page-id clamp), most garbled metadata first, then the
    # page-id prefetch cases, then the jnp-metadata case
    while IFS= read -r name; do
      [[ $name == hstu\ paged* ]] || continue
      i=$((i + 1))
      ts=$(left)
      if (( ts < 25 )); then echo "sanitize case $i '$name' NOT RUN (time)" >> "$S"; continue; fi
      (
        timeout "$ts" compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 \
          python3 tests/sanitize_grid.py --only "$name" > "$L/sanitize_$i.log" 2>&1
        rc=$?
        echo "sanitize case $i rc=$rc '$name' $(grep -ohE 'ERROR SUMMARY: [0-9]+ errors?' "$L/sanitize_$i.log" | tail -1) $(grep -ohE '^ *(ok|NON-FINITE|ERROR)[^ ]*' "$L/sanitize_$i.log" | head -1)" >> "$S"
      ) &
      while (( $(jobs -rp | wc -l) >= ${SAN_P:-3} )); do sleep 1; done
    done < <(grep -v "schedule=" "$L/sanitize_cases.txt" | tac; grep "pagepf" "$L/sanitize_cases.txt";
             grep "schedule=xla" "$L/sanitize_cases.txt")
    wait
  ) &
  wait
fi
echo "total $(( $(date +%s) - start )) s" >> "$S"
tar czf "$OUT/i17b_logs_$PHASE.tgz" -C "$OUT" "logs_$PHASE"
cat "$S"
