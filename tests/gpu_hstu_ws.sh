#!/usr/bin/env bash
# GPU check of the warp-specialized HSTU forward (impl sm90ws, the default) in one device call, from the repo
# root after `source .devcache/setup.sh`: a smoke case (a hang in the mbarrier pipeline is
# cut by `timeout`), the benchmark (default, then the ablation variants without intra-warpgroup
# overlap / without ping-pong / with a single Q stage, and the portable sm80 forward), then the
# GPU grid of tests/test_gpu_hstu.py with HSTU_TEST_SM90=sm90ws (the default grid, forward and
# backward, plus the sm90ws forward extras and batches; sharded). Logs under $OUT (or
# ./gpu_out). Env: STEPS (default "sbg": smoke, bench, grid), T_GRID (per-shard timeout),
# SHARDS.
set -u
out=${OUT:-./gpu_out}
mkdir -p "$out"
STEPS=${STEPS:-sbg}
T_GRID=${T_GRID:-420}
SHARDS=${SHARDS:-6}
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
start=$(date +%s)
stamp() { echo "[$(( $(date +%s) - start ))s] $*"; }
if [[ $STEPS == *s* ]]; then
  timeout 120 python3 -m pytest -m gpu -q -rA -p no:cacheprovider tests/test_gpu_hstu.py \
    -k "test_hstu_grid and bflo-d128-w-1_0 and not lq_lt_lk and not partial" \
    > "$out/smoke.log" 2>&1
  rc=$?; stamp "smoke rc=$rc"; tail -5 "$out/smoke.log"
  [[ $rc == 0 ]] || exit 1
fi
if [[ $STEPS == *b* ]]; then
  timeout ${T_BENCH:-240} python3 benchmarks/hstu_bench.py --no-bwd --iters 10 \
    --case 8x4096-causal --case 8x4096-causal-d64 --case 8x4096-causal-d256 \
    --case 32x1024-causal --case jagged32-causal --case 8x4096-full \
    --tiles "impl=sm90ws;ws=nooverlap" --tiles "impl=sm90ws;ws=nopingpong" \
    --tiles "impl=sm90ws;ws=q1" --tiles impl=sm80 ${BENCH_EXTRA:-} \
    --out "$out/hstu_ws_bench.json" > "$out/bench.log" 2>&1
  stamp "bench rc=$?"; grep -v "^WARNING\|^I0000\|^W0000" "$out/bench.log" | tail -40
fi
if [[ $STEPS == *g* ]]; then
  pids=()
  for ((i = 0; i < SHARDS; i++)); do
    HSTU_TEST_SM90=sm90ws HSTU_TEST_SHARD=$i/$SHARDS timeout $T_GRID python3 -m pytest -m gpu \
      tests/test_gpu_hstu.py -q -rA -p no:cacheprovider > "$out/grid_$i.log" 2>&1 &
    pids+=($!)
  done
  wait "${pids[@]}"
  stamp "grid done"
  tail -qn 1 "$out"/grid_*.log; grep -h "^FAILED\|^ERROR\|Timeout" "$out"/grid_*.log | head -30
fi
stamp done
