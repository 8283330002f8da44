#!/usr/bin/env bash
# Block-sparse split-KV (kv_splits) on one GPU, from the repo root (PYTHONPATH = the root):
#   PHASE=tests T=240 OUT=$OUT bash scripts/sessions/gpu_s18.sh  # GPU tests only, within T seconds
#   PHASE=bench TB=60 OUT=$OUT bash scripts/sessions/gpu_s18.sh  # benchmark rows only, within TB
#   T=240 OUT=$OUT bash scripts/sessions/gpu_s18.sh              # both (tests, then bench)
# tests: tests/test_gpu_bsa_splits.py (kernel vs reference for kv_splits in {1, 2, 7, 64,
#   "auto"}, fwd + grad, six shapes over the sm90ws / mma.sync forwards; SHARDS pytest
#   processes in parallel, one shape each).
# bench: benchmarks/bsa_bench.py --splits: the decode rows (B=1 H=16, S_q=128 against
#   S_kv=131072, blk128 top-64; then blk64 top-128) with kv_splits "auto" vs 1 (row 0 also 16
#   splits, and 32 with TB >= 90) and the per-kernel GPU times of one call (--trace).
# Every python call runs under timeout; logs, JSON and summary.txt are packed into
# $OUT/s18_logs_$PHASE.tgz (summary also printed). Knobs: SHARDS (6), K (pytest -k filter).
set -u
PHASE=${PHASE:-all}
T=${T:-240}
TB=${TB:-60}
out=${OUT:-./gpu_out}
LOGS=$(mktemp -d /tmp/s18_logs.XXXX)
mkdir -p "$out"
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
export PYTHONPATH=${PYTHONPATH:-$PWD}
start=$SECONDS
SHARDS=${SHARDS:-6}
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv > "$LOGS/nvidia_smi.txt" 2>&1
if [ "$PHASE" != bench ]; then
  TT=$((T - 8))
  [ "$PHASE" = all ] && TT=$((T - TB - 8))
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
if [ "$PHASE" != tests ]; then
  b0=$SECONDS
  # row 0: auto, 1 and 16 splits (also 32 with TB >= 90); row 1 (auto, 1) in the rest
  SET0=${SET0:-auto,1,16}
  [ "$TB" -ge 90 ] && SET0=${SET0},32
  timeout -k 5 $((TB - 18)) python3 -m benchmarks.bsa_bench --splits --rows 0 \
    --split-settings "$SET0" --trace --out "$LOGS/bsa_splits_row0.json" \
    > "$LOGS/bench_row0.log" 2>&1
  echo "rc=$? at $((SECONDS - start)) s" >> "$LOGS/bench_row0.log"
  left=$((TB - 3 - (SECONDS - b0)))
  if [ "$left" -gt 10 ]; then
    timeout -k 3 "$left" python3 -m benchmarks.bsa_bench --splits --rows 1 \
      --out "$LOGS/bsa_splits_row1.json" > "$LOGS/bench_row1.log" 2>&1
    echo "rc=$? at $((SECONDS - start)) s" >> "$LOGS/bench_row1.log"
  fi
fi
{
  echo "s18 GPU script PHASE=$PHASE: wall $((SECONDS - start)) s (T=$T TB=$TB)"
  cat "$LOGS/nvidia_smi.txt"
  for f in "$LOGS"/tests_shard*.log; do
    [ -f "$f" ] || continue
    echo "$(basename "$f"): PASSED $(grep -c ' PASSED' "$f") FAILED $(grep -c ' FAILED' "$f") SKIPPED $(grep -c ' SKIPPED' "$f") | $(grep -E '(passed|failed|skipped).* in ' "$f" | tail -n 1) $(grep '^rc=' "$f" | tail -n 1)"
  done
  grep -h "kv_splits=.*out: err" "$LOGS"/tests_shard*.log 2>/dev/null | sed 's/^tests.*\] //' | sort
  grep -h "^FAILED\|^ERROR\|Error\b" "$LOGS"/tests_shard*.log 2>/dev/null | sort | uniq | head -40
  for f in "$LOGS"/bench_row*.log; do
    [ -f "$f" ] && grep -v "Warning\|warn" "$f"
  done
} > "$LOGS/summary.txt" 2>&1
tar czf "$out/s18_logs_$PHASE.tgz" -C "$LOGS" . 2>/dev/null
cat "$LOGS/summary.txt"
