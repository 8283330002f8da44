#!/usr/bin/env bash
# Extra block-sparse option cases (tests/test_gpu_bsa_options_extra.py) on one GPU, from the
# repo root: T=120 OUT=$OUT bash scripts/sessions/gpu_r1.sh
# SHARDS (7) pytest processes in parallel (EXTRA_SHARD=i/SHARDS, about 2 cases each), each
# under timeout; logs and summary.txt packed into $OUT/r1_logs.tgz (summary also printed).
set -u
T=${T:-120}
SHARDS=${SHARDS:-7}
out=${OUT:-./gpu_out}
LOGS=$(mktemp -d /tmp/r1_logs.XXXX)
mkdir -p "$out"
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
export PYTHONPATH=${PYTHONPATH:-$PWD}
start=$SECONDS
for ((i = 0; i < SHARDS; i++)); do
  {
    timeout -k 5 "$((T - 6))" env EXTRA_SHARD=$i/$SHARDS python3 -m pytest -m gpu -v -rA -s \
      -p no:cacheprovider tests/test_gpu_bsa_options_extra.py > "$LOGS/shard$i.log" 2>&1
    echo "rc=$? at $((SECONDS - start)) s" >> "$LOGS/shard$i.log"
  } &
done
wait
{
  echo "r1 GPU script: wall $((SECONDS - start)) s (T=$T, $SHARDS shards)"
  for f in "$LOGS"/shard*.log; do
    echo "$(basename "$f"): $(grep -E '(passed|failed|skipped|error).* in ' "$f" | tail -n 1) $(grep '^rc=' "$f" | tail -n 1)"
    grep -E '^(PASSED|FAILED|ERROR) ' "$f"
  done
} > "$LOGS/summary.txt"
cat "$LOGS/summary.txt"
tar -czf "$out/r1_logs.tgz" -C "$LOGS" .
