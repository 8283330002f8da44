#!/usr/bin/env bash
# Final validation of a tree on one H200 host in one device call (about 7 minutes):
#   1. benchmarks that need a quiet GPU (serial, ~90 s): hstu_bench.py 8x4096 and 32x1024
#      causal D128 forward + backward, the 8x4096 forward with an fp32 rab (H_rab = 1),
#      bsa_bench.py's default rows, transforms_bench.py (a new length's cost in this
#      layer and the warm-process start)
#   2. tests/gpu_grids.sh with PARTS (default: hstu bsa rab sanitize), fewer shards so that
#      about 16 processes share the 16 cores.
# Run from the repo root after `source .devcache/setup.sh`:  OUT=$OUT bash tests/gpu_final.sh
# Env: OUT, PARTS, T (per-process timeout of the grids), SKIP_BENCH=1.
set -u
out=${OUT:-./gpu_out}
mkdir -p "$out/bench"
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
start=$SECONDS
if [ "${SKIP_BENCH:-0}" != 1 ]; then
  b() { local name=$1 t=$2; shift 2
    timeout -k 5 "$t" python3 "$@" > "$out/bench/$name.log" 2>&1; echo "rc=$?" >> "$out/bench/$name.log"; }
  b hstu 100 benchmarks/hstu_bench.py --case 8x4096-causal --case 32x1024-causal --out "$out/bench/hstu_bench.json"
  b hstu_rab 60 benchmarks/hstu_bench.py --case 8x4096-causal --no-bwd --rab f32:1 --out "$out/bench/hstu_bench_rab.json"
  b bsa 70 benchmarks/bsa_bench.py --out "$out/bench/bsa_bench.json"
  b transforms 90 benchmarks/transforms_bench.py --out "$out/bench/transforms_bench.json"
  echo "benchmarks done at $((SECONDS - start)) s" > "$out/bench/summary.txt"
  grep -h "TFLOP\|total_tokens\|cold\|warm" "$out"/bench/*.log | cut -c1-220 >> "$out/bench/summary.txt"
fi
PARTS=${PARTS:-"hstu bsa rab sanitize"} HSTU_SHARDS=${HSTU_SHARDS:-4} BSA_SHARDS=${BSA_SHARDS:-3} \
  RAB_SHARDS=${RAB_SHARDS:-3} SAN_SHARDS=${SAN_SHARDS:-6} T=${T:-330} SAN_T=${SAN_T:-200} \
  OUT=$out bash tests/gpu_grids.sh > /dev/null 2>&1
echo "all done at $((SECONDS - start)) s" >> "$out/summary.txt"
cat "$out/bench/summary.txt" "$out/summary.txt" 2>/dev/null
