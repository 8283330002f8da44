#!/usr/bin/env bash
# Final GPU run of the integrated branch on one H200 host (16 CPU cores), in ONE device call
# of about 8-9 minutes (timeout_s=600). Run from the repo root (the script sources .devcache/setup.sh when it
# is there):
#
#     OUT=$OUT bash tests/gpu_final.sh
#
# carrying `.devcache` (CuTe DSL bundle) and `.data` (`.data/ml-1m-sequences.npz`, the
# MovieLens cache with timestamps; git-ignored, never committed).
#
# Phase A (GPU to itself, <= 200 s): benchmarks whose timings need a quiet GPU, on the
#   default compile layer (JAX_SPARSE_ATTN_CUTE_CALL=shared) and, for a few rows, on
#   per_shape (plain cutlass_call, the kernels' code as validated before the shared layer)
#   so that a regression of the shared layer shows:
#   A1 hstu_bench.py default cases (8x4096 and 32x1024 causal D128, fwd + bwd; sm90ws) + the
#      sm90ws/nooverlap ablation (fwd)                                      [shared]
#   A2 hstu_bench.py 8x4096 causal D128 fwd + bwd                           [per_shape]
#   A3 bsa_bench.py default (blk64 top32 fwd/bwd/csr, blk128 top16 fwd/bwd)   [shared]
#   A4 bsa_bench.py --table on blk64 top32 and blk128 top16: sm90 (default) vs sm90ws
#      (K13, opt-in) [shared], and sm90 [per_shape]
# Phase B (all at once, ~280 s, every process under `timeout`, test shards niced 5,
#   MovieLens runs niced 10 so that the compile-bound tests get the CPU first):
#   - HSTU GPU grid (default forward sm90ws + backward) in 3 shards; every forward impl
#     (HSTU_TEST_SM90=1, TestHSTUForwardImpls) in 2 shards
#   - BSA GPU grid (default sm90) in 3 shards
#   - K13's sm90ws BSA forward: its own cases + the BSA grid with the forward on sm90ws
#     (steps g and t of tests/gpu_bsa_ws.sh, in parallel; grid in 2 shards)
#   - H16's rab: scripts/gpu_rab.sh (rab GPU tests in 2 shards; MovieLens --full: rab kernel
#     seeds 42/43/44, --no-rab 42, rab reference 42; the --large preset only with
#     SKIP_LARGE=0); each MovieLens JSON is rewritten every epoch, so a timeout leaves the
#     epochs done so far
#   - H11's robustness GPU tests (test_robustness.py, test_transforms_vs_loop.py) and the
#     garbage-metadata grid under compute-sanitizer memcheck (tests/sanitize_grid.py, every
#     implementation + rab; SANITIZE_ARGS=--quick for fewer cases)
#   - H20's 1-GPU tests (test_gpu_transforms.py) and benchmarks/transforms_bench.py (its
#     compile / process-start seconds are measured under this phase's CPU load)
# Output ($OUT, 8 files at most): summary.txt, logs.tgz (every log and JSON),
# hstu_bench.json, hstu_bench_per_shape.json, bsa_bench.json, bsa_table.json,
# transforms_bench.json, ml_summary.txt.
# Env: OUT, LOGS, CACHE, T_A1..T_A4 (phase A timeouts), T_B (phase B per-process timeout),
#      T_SAN, SANITIZE_ARGS, SKIP_LARGE (default 1), ML_EPOCHS.
set -u
out=${OUT:-./gpu_out}
LOGS=${LOGS:-/tmp/gf_logs}
CACHE=${CACHE:-.data/ml-1m-sequences.npz}
T_A1=${T_A1:-70}
T_A2=${T_A2:-35}
T_A3=${T_A3:-45}
T_A4=${T_A4:-50}
T_B=${T_B:-280}
T_SAN=${T_SAN:-$T_B}
mkdir -p "$out" "$LOGS"
if [ -f .devcache/setup.sh ] && ! python3 -c "import cutlass" 2>/dev/null; then
  # shellcheck disable=SC1091
  source .devcache/setup.sh || { echo "setup.sh failed"; exit 3; }
fi
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
start=$(date +%s)
stamp() { echo "[$(( $(date +%s) - start ))s] $*" | tee -a "$LOGS/timeline.txt"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > "$LOGS/gpu.txt" 2>&1
git log --oneline -1 > "$LOGS/commit.txt" 2>/dev/null
PYT="python3 -m pytest -m gpu -q -rA -p no:cacheprovider"

# ---------------------------------------------------------------- phase A: benchmarks
stamp "phase A: benchmarks"
timeout -k 15 "$T_A1" python3 benchmarks/hstu_bench.py --tiles "impl=sm90ws;ws=nooverlap" \
  --out "$LOGS/hstu_bench.json" > "$LOGS/hstu_bench.log" 2>&1
stamp "A1 hstu_bench (shared) rc=$?"
JAX_SPARSE_ATTN_CUTE_CALL=per_shape timeout -k 15 "$T_A2" python3 benchmarks/hstu_bench.py \
  --case 8x4096-causal --out "$LOGS/hstu_bench_per_shape.json" > "$LOGS/hstu_bench_per_shape.log" 2>&1
stamp "A2 hstu_bench (per_shape) rc=$?"
timeout -k 15 "$T_A3" python3 -m benchmarks.bsa_bench --out "$LOGS/bsa_bench.json" \
  > "$LOGS/bsa_bench.log" 2>&1
stamp "A3 bsa_bench (shared) rc=$?"
I=JAX_SPARSE_ATTN_BSA_FWD_IMPL
timeout -k 15 "$T_A4" python3 -m benchmarks.bsa_bench --rows 0,3 \
  --table "$I=sm90;$I=sm90ws;$I=sm90,JAX_SPARSE_ATTN_CUTE_CALL=per_shape" \
  --out "$LOGS/bsa_table.json" > "$LOGS/bsa_table.log" 2>&1
stamp "A4 bsa table (sm90 / sm90ws / sm90 per_shape) rc=$?"

# ---------------------------------------------------------------- phase B: everything else
stamp "phase B: test grids, rab + MovieLens, robustness + sanitizer, transforms"
pids=()
run() {  # log name, then env assignments and the command (nice 5, timeout T_B)
  local name=$1; shift
  nice -n 5 timeout -k 15 "$T_B" env "$@" > "$LOGS/$name.log" 2>&1
  echo "rc=$?" >> "$LOGS/$name.log"
}
for i in 0 1 2; do
  run hstu_default_$i HSTU_TEST_SHARD=$i/3 $PYT -k "not sm90" tests/test_gpu_hstu.py &
  pids+=($!)
done
for i in 0 1; do
  run hstu_impls_$i HSTU_TEST_SM90=1 HSTU_TEST_SHARD=$i/2 $PYT -k "ForwardImpls or sm90ws" \
    tests/test_gpu_hstu.py &
  pids+=($!)
done
for i in 0 1 2; do
  run bsa_$i BSA_TEST_SHARD=$i/3 $PYT tests/test_gpu_bsa.py &
  pids+=($!)
done
# K13 (steps g and t of tests/gpu_bsa_ws.sh, here in parallel): the sm90ws BSA forward's own
# cases, and the BSA grid with the forward on sm90ws (the backward is the default one)
run bsa_ws_cases $PYT tests/test_gpu_bsa.py -k "test_bsa_sm90ws_forward" &
pids+=($!)
for i in 0 1; do
  run bsa_ws_grid_$i BSA_TEST_IMPLS=sm90ws BSA_TEST_SHARD=$i/2 $PYT tests/test_gpu_bsa.py \
    -k "TestBSAKernelGrid and sm90ws" &
  pids+=($!)
done
# H16: rab GPU tests + MovieLens (its own script; MovieLens niced below the tests)
(OUT=$LOGS/rab LOGS=$LOGS/rab CACHE=$CACHE T_TEST=$T_B T_ML=$T_B SHARDS=2 \
   SKIP_LARGE=${SKIP_LARGE:-1} nice -n 5 bash scripts/gpu_rab.sh > "$LOGS/rab.log" 2>&1;
 echo "rc=$?" >> "$LOGS/rab.log") &
rab_pid=$!
# H11: robustness GPU tests, then nothing else in that process; the sanitizer in its own
run robustness $PYT tests/test_robustness.py tests/test_transforms_vs_loop.py &
pids+=($!)
(nice -n 5 timeout -k 15 "$T_SAN" compute-sanitizer --tool memcheck --error-exitcode 9 \
   python3 tests/sanitize_grid.py ${SANITIZE_ARGS:-} > "$LOGS/sanitize.log" 2>&1;
 echo "rc=$? (0 clean, 9 memcheck errors, 1 a failed case, 124 timeout)" >> "$LOGS/sanitize.log") &
pids+=($!)
# H20: 1-GPU transformation tests and the new-length / process-start benchmark
run transforms_tests $PYT tests/test_gpu_transforms.py &
pids+=($!)
(timeout -k 15 "$T_B" python3 benchmarks/transforms_bench.py --out "$LOGS/transforms_bench.json" \
   > "$LOGS/transforms_bench.log" 2>&1; echo "rc=$?" >> "$LOGS/transforms_bench.log") &
pids+=($!)
wait "${pids[@]}"
stamp "test processes done"
wait "$rab_pid"
stamp "rab + MovieLens done"

# ---------------------------------------------------------------- summary
last() { for f in "$@"; do [ -f "$f" ] && echo "$(basename "$f"): $(grep -v '^rc=' "$f" | tail -n 1) $(grep '^rc=' "$f" | tail -n 1)"; done; }
fails() { grep -h "^FAILED\|^ERROR" "$@" 2>/dev/null | head -30; }
{
  cat "$LOGS/commit.txt" "$LOGS/gpu.txt" 2>/dev/null
  echo "== timeline"; cat "$LOGS/timeline.txt"
  echo "== hstu_bench (shared)"; grep -v "^WARNING\|^I0000\|^W0000" "$LOGS/hstu_bench.log" | tail -12
  echo "== hstu_bench (per_shape)"; grep -v "^WARNING\|^I0000\|^W0000" "$LOGS/hstu_bench_per_shape.log" | tail -4
  echo "== bsa_bench (shared)"; grep -v "^WARNING\|^I0000\|^W0000" "$LOGS/bsa_bench.log" | tail -14
  echo "== bsa table: sm90 / sm90ws / sm90 per_shape"; grep -v "^WARNING\|^I0000\|^W0000" "$LOGS/bsa_table.log" | tail -8
  for g in hstu_default hstu_impls bsa; do
    echo "== $g shards"; last "$LOGS"/${g}_[0-9].log; fails "$LOGS"/${g}_[0-9].log
  done
  echo "== bsa sm90ws (K13)"; last "$LOGS"/bsa_ws_*.log; fails "$LOGS"/bsa_ws_*.log
  echo "== rab (H16)"; cat "$LOGS/rab/summary.txt" 2>/dev/null || tail -20 "$LOGS/rab.log"
  echo "== robustness (H11)"; last "$LOGS/robustness.log"; fails "$LOGS/robustness.log"
  echo "== sanitize (H11; + rab cases)"; grep -v "^      ok" "$LOGS/sanitize.log" | tail -30
  echo "== transforms (H20)"; last "$LOGS/transforms_tests.log"; fails "$LOGS/transforms_tests.log"
  tail -n 15 "$LOGS/transforms_bench.log"
} > "$out/summary.txt" 2>&1
cp "$LOGS/rab/ml_summary.txt" "$out/ml_summary.txt" 2>/dev/null
for f in hstu_bench.json hstu_bench_per_shape.json bsa_bench.json bsa_table.json \
         transforms_bench.json; do
  [ -f "$LOGS/$f" ] && cp "$LOGS/$f" "$out/"
done
tar czf "$out/logs.tgz" -C "$LOGS" . 2>/dev/null
cat "$out/summary.txt"
stamp "done"
