#!/usr/bin/env bash
# The GPU correctness grids in one device call, spread over every visible GPU (round robin).
# PARTS selects what runs (default: all):
#   hstu       HSTU default grid (HSTU_SHARDS processes) + the sm90ws batches (2 processes)
#   hstu_bwd90 the HSTU grid + packed batches with hstu_bwd_impl=sm90 (BWD_SHARDS processes)
#   hstu_bwd80 the same with hstu_bwd_impl=sm80 (rab: part rab, sm90 by default, its *_sm80
#              cases with hstu_bwd_ws=rabsm80)
#   hstu_det   deterministic=True: bitwise 5-run tests + the HSTU grid on both backwards
#              (1 + DET_SHARDS processes; not in the default PARTS)
#   bsa        BSA grid (BSA_SHARDS processes)
#   bsa_ws     the opt-in sm90ws BSA forward: its own cases + the BSA grid with it (2 + 1)
#   rab        rab tests (RAB_SHARDS processes)
#   transforms the 1-GPU transformation tests (3 processes)
#   extra      the option / variant files outside the grids (not in the default PARTS): the
#              block-sparse causal / pack_gqa / split-KV / options files, the dQ writer and
#              deterministic-writer files, HSTU D = 256, the dqalias / dqearly variants and the
#              randomized tests/test_gpu_fuzz.py (split by op), one process per group
#   sanitize   the garbage-metadata grid (tests/sanitize_grid.py) under compute-sanitizer
#              memcheck, in two phases: a plain run fills JAX's persistent compilation cache
#              and the kernel cache (so the sanitized processes compile nothing: XLA compiles
#              under the sanitizer take minutes), then SAN_SHARDS sanitized processes run
#              the same cases from the caches. SAN_ARGS=--quick for one implementation per op.
# Every process runs under `timeout` T (seconds; SAN_T for each sanitizer phase); logs and summary.txt go to $OUT.
# Each gpu test runs under the watchdog of tests/hang_guard.py (JAX_SPARSE_ATTN_GPU_TEST_TIMEOUT,
# default here 240 s, below T; 0 turns it off): a test that hangs (or is still running when
# `timeout` ends its process) leaves its stack in $OUT/gpu_hang.log, a start line without done.
# From the repo root after `source .devcache/setup.sh`:  OUT=$OUT bash tests/gpu_grids.sh
set -u
out=${OUT:-./gpu_out}
LOGS=${LOGS:-/tmp/gg_logs}
T=${T:-320}
PARTS=${PARTS:-"hstu bsa rab transforms sanitize"}
mkdir -p "$out" "$LOGS"
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
export JAX_SPARSE_ATTN_GPU_TEST_TIMEOUT=${JAX_SPARSE_ATTN_GPU_TEST_TIMEOUT-240}
export JAX_SPARSE_ATTN_GPU_HANG_LOG=${JAX_SPARSE_ATTN_GPU_HANG_LOG:-$(cd "$out" && pwd)/gpu_hang.log}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || echo 1); [ "$NGPU" -ge 1 ] || NGPU=1
_n=0
next_gpu() { GPU=$((_n % NGPU)); _n=$((_n + 1)); }
PYT="python3 -m pytest -m gpu -q -rA -p no:cacheprovider"
run() { local name=$1; shift; next_gpu
  timeout -k 10 "${RUN_T:-$T}" env CUDA_VISIBLE_DEVICES=$GPU "$@" > "$LOGS/$name.log" 2>&1
  echo "rc=$?" >> "$LOGS/$name.log"; }
has() { case " $PARTS " in *" $1 "*) return 0;; esac; return 1; }
start=$SECONDS
if has hstu; then
  n=${HSTU_SHARDS:-6}
  for ((i = 0; i < n; i++)); do run hstu_$i HSTU_TEST_SHARD=$i/$n $PYT -k "not sm90ws_batches" tests/test_gpu_hstu.py & done
  for i in 0 1; do run hstu_ws_$i HSTU_TEST_SM90=sm90ws HSTU_TEST_SHARD=$i/2 $PYT -k sm90ws_batches tests/test_gpu_hstu.py & done
fi
for arch in 90 80; do
  if has hstu_bwd$arch; then
    n=${BWD_SHARDS:-4}
    for ((i = 0; i < n; i++)); do run hstu_bwd${arch}_$i HSTU_TEST_BWD=sm$arch HSTU_TEST_SHARD=$i/$n $PYT -k "BackwardImpls or bwd_batches" tests/test_gpu_hstu.py & done
  fi
done
if has hstu_det; then
  # deterministic=True: the 5-run bitwise tests (8 cases, one process) + the HSTU grid with
  # deterministic=True on both backwards (DET_SHARDS processes)
  run hstu_det_tests $PYT "tests/test_gpu_hstu.py::test_hstu_bwd_deterministic" &
  n=${DET_SHARDS:-3}
  for ((i = 0; i < n; i++)); do run hstu_det_$i HSTU_TEST_DET=1 HSTU_TEST_SHARD=$i/$n $PYT -k "TestHSTUBackwardDeterministic" tests/test_gpu_hstu.py & done
fi
if has bsa; then
  n=${BSA_SHARDS:-4}
  for ((i = 0; i < n; i++)); do run bsa_$i BSA_TEST_SHARD=$i/$n $PYT tests/test_gpu_bsa.py -k "not sm90ws" & done
fi
if has bsa_ws; then
  run bsa_ws_cases $PYT tests/test_gpu_bsa.py -k "test_bsa_sm90ws_forward" &
  for i in 0 1; do run bsa_ws_$i BSA_TEST_IMPLS=sm90ws BSA_TEST_SHARD=$i/2 $PYT tests/test_gpu_bsa.py -k "TestBSAKernelGrid and sm90ws" & done
fi
if has rab; then
  n=${RAB_SHARDS:-4}
  for ((i = 0; i < n; i++)); do run rab_$i HSTU_TEST_SHARD=$i/$n $PYT ${RAB_K:+-k "$RAB_K"} tests/test_gpu_hstu_rab.py & done
fi
if has transforms; then
  run transforms_0 $PYT tests/test_gpu_transforms.py -k "vmap" &
  run transforms_1 $PYT tests/test_gpu_transforms.py -k "remat or new_lengths" &
  run transforms_2 $PYT tests/test_gpu_transforms.py -k "export or disk_cache" &
fi
if has extra; then
  run extra_bsa_opts $PYT tests/test_gpu_bsa_causal.py tests/test_gpu_bsa_options_extra.py &
  run extra_bsa_pack $PYT tests/test_gpu_bsa_pack_gqa.py &
  run extra_bsa_splits $PYT tests/test_gpu_bsa_splits.py &
  run extra_writer_hstu $PYT tests/test_gpu_dq_writer.py -k hstu &
  run extra_writer_bsa $PYT -k "bsa or dqalias or dqearly" tests/test_gpu_dq_writer.py \
    tests/test_gpu_bsa_dqalias.py tests/test_gpu_bsa_dqearly.py &
  run extra_det_d256 $PYT tests/test_gpu_det_writer.py tests/test_gpu_hstu_bwd_d256.py &
  run extra_fuzz_hstu $PYT tests/test_gpu_fuzz.py -k hstu &
  run extra_fuzz_bsa $PYT tests/test_gpu_fuzz.py -k bsa &
fi
if has sanitize; then
  (
    n=${SAN_SHARDS:-8}
    export JAX_COMPILATION_CACHE_DIR=/tmp/san_jcc JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 \
           JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES=0 JAX_SPARSE_ATTN_CACHE_DIR=/tmp/san_kc \
           XLA_FLAGS=--xla_gpu_autotune_level=0
    for ((i = 0; i < n; i++)); do
      RUN_T=${SAN_T:-$T} run san_warm_$i python3 tests/sanitize_grid.py ${SAN_ARGS:-} --shard $i/$n &
    done
    wait
    echo "warm phase done at $((SECONDS - start)) s" > "$LOGS/san_phase.log"
    for ((i = 0; i < n; i++)); do
      RUN_T=${SAN_T:-$T} run sanitize_$i compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 \
        python3 tests/sanitize_grid.py ${SAN_ARGS:-} --shard $i/$n &
    done
    wait
    echo "sanitized phase done at $((SECONDS - start)) s (rc 0 clean, 9 memcheck errors, 1 failed case, 124 timeout)" >> "$LOGS/san_phase.log"
  ) &
fi
wait
{
  echo "GPUs: $NGPU; parts: $PARTS; wall $((SECONDS - start)) s"
  for f in "$LOGS"/*.log; do
    echo "$(basename "$f"): $(grep -E "passed|failed|error|cases ok" "$f" | grep -v "^E " | tail -n 1) $(grep '^rc=' "$f" | tail -n 1)"
  done
  grep -h "^FAILED\|^ERROR" "$LOGS"/*.log | head -40
  if has sanitize; then
    echo "== sanitize"; cat "$LOGS/san_phase.log" 2>/dev/null
    grep -h "ERROR SUMMARY\|Invalid\|NON-FINITE\|ERROR " "$LOGS"/sanitize_*.log | sort | uniq -c | head -30
  fi
} > "$out/summary.txt" 2>&1
tar czf "$out/logs.tgz" -C "$LOGS" . 2>/dev/null
cat "$out/summary.txt"
