#!/usr/bin/env bash
# Block-sparse split-KV (kv_splits) on one GPU: the GPU tests of tests/test_gpu_bsa_splits.py
# (kernel vs reference for kv_splits in {1, 2, 7, 64, "auto"}, fwd + grad; SHARDS pytest
# processes in parallel) and then the split-KV decode rows of benchmarks/bsa_bench.py
# (--splits: B=1 H=16 S_q=128 S_kv=131072 blk128 top-64, kv_splits="auto" vs 1).
# From the repo root (PYTHONPATH = the repo root):
#   T=240 OUT=$OUT bash scripts/gpu_s18.sh
# Everything stays under T seconds (timeout on every python call); logs, the benchmark JSON
# and summary.txt are packed into $OUT/s18_logs.tgz (summary also printed).
# Knobs: SHARDS (default 6: one test shape per process), TB (benchmark seconds, default 70), K (pytest -k filter),
# STEPS ("tb": tests and bench; "t" or "b" for one of them).
set -u
T=${T:-240}
out=${OUT:-./gpu_out}
LOGS=$(mktemp -d /tmp/s18_logs.XXXX)
mkdir -p "$out"
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
export PYTHONPATH=${PYTHONPATH:-$PWD}
start=$SECONDS
SHARDS=${SHARDS:-6}
TB=${TB:-70}
STEPS=${STEPS:-tb}
TT=$((T - TB - 10))
[ "$STEPS" = t ] && TT=$((T - 10))
[ "$STEPS" = b ] && TB=$((T - 10))
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv > "$LOGS/nvidia_smi.txt" 2>&1
if [[ $STEPS == *t* ]]; then
  for ((i = 0; i < SHARDS; i++)); do
    {
      timeout -k 5 "$TT" env BSA_TEST_SHARD=$i/$SHARDS python3 -m pytest -m gpu -v -rA -s \
        -p no:cacheprovider ${K:+-k "$K"} tests/test_gpu_bsa_splits.py \
        > "$LOGS/tests_shard$i.log" 2>&1
      echo "rc=$? at $((SECONDS - start)) s" >> "$LOGS/tests_shard$i.log"
    } &
  done
  wait
fi
if [[ $STEPS == *b* ]]; then
  left=$((T - 5 - (SECONDS - start)))
  [ "$left" -gt "$TB" ] && left=$TB
  timeout -k 5 "$left" python3 -m benchmarks.bsa_bench --splits \
    --out "$LOGS/bsa_splits_bench.json" > "$LOGS/bench.log" 2>&1
  echo "rc=$? at $((SECONDS - start)) s" >> "$LOGS/bench.log"
fi
{
  echo "s18 GPU script: wall $((SECONDS - start)) s (T=$T)"
  cat "$LOGS/nvidia_smi.txt"
  for f in "$LOGS"/tests_shard*.log; do
    [ -f "$f" ] || continue
    echo "$(basename "$f"): PASSED $(grep -c ' PASSED' "$f") FAILED $(grep -c ' FAILED' "$f") SKIPPED $(grep -c ' SKIPPED' "$f") | $(grep -E '(passed|failed|skipped).* in ' "$f" | tail -n 1) $(grep '^rc=' "$f" | tail -n 1)"
  done
  grep -h "kv_splits=.*out: err" "$LOGS"/tests_shard*.log 2>/dev/null | sort
  grep -h "^FAILED\|^ERROR\|Error\b" "$LOGS"/tests_shard*.log 2>/dev/null | sort | uniq | head -40
  [ -f "$LOGS/bench.log" ] && grep -v "Warning\|warn" "$LOGS/bench.log"
} > "$LOGS/summary.txt" 2>&1
tar czf "$out/s18_logs.tgz" -C "$LOGS" . 2>/dev/null
cat "$LOGS/summary.txt"
