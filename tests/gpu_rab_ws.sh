#!/usr/bin/env bash
# GPU check of the relative attention bias in the warp-specialized HSTU forward (sm90ws, the
# default forward) in one device call, from the repo root after `source .devcache/setup.sh`:
# the rab GPU tests (tests/test_gpu_hstu_rab.py: kernel vs reference with rab, forward and all
# grads, both dtypes, D 32-256, window and func masks, H_rab = 1 and H; the forward is sm90ws
# unless a case selects sm80), then the benchmark rows with and without rab
# (8x4096-causal D128 and the MovieLens shape 128x200 H1 D64, fp32 rab with H_rab = 1).
# Logs under $OUT (or ./gpu_out). Env: STEPS (default "gb": grid, bench), T_GRID (per-shard
# timeout, s), SHARDS, T_BENCH.
set -u
out=${OUT:-./gpu_out}
mkdir -p "$out"
STEPS=${STEPS:-gb}
T_GRID=${T_GRID:-180}
SHARDS=${SHARDS:-4}
T_BENCH=${T_BENCH:-110}
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
start=$(date +%s)
stamp() { echo "[$(( $(date +%s) - start ))s] $*"; }
if [[ $STEPS == *g* ]]; then
  pids=()
  for ((i = 0; i < SHARDS; i++)); do
    HSTU_TEST_SHARD=$i/$SHARDS timeout -k 10 $T_GRID python3 -m pytest -m gpu \
      tests/test_gpu_hstu_rab.py -q -rA -p no:cacheprovider > "$out/rab_grid_$i.log" 2>&1 &
    pids+=($!)
  done
  wait "${pids[@]}"
  stamp "rab grid done"
  tail -qn 1 "$out"/rab_grid_*.log; grep -h "^FAILED\|^ERROR\|Timeout" "$out"/rab_grid_*.log | head -30
fi
if [[ $STEPS == *b* ]]; then
  timeout -k 10 $T_BENCH python3 benchmarks/hstu_bench.py --no-bwd --iters 10 \
    --case 8x4096-causal --case movielens-128x200 --rab f32:1 \
    --out "$out/hstu_rab_bench.json" > "$out/rab_bench.log" 2>&1
  stamp "bench rc=$?"; grep -v "^WARNING\|^I0000\|^W0000" "$out/rab_bench.log" | tail -20
fi
stamp done
