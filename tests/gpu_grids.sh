#!/usr/bin/env bash
# The GPU correctness grids alone (no benchmarks, no MovieLens), for a device call that must
# fit in about 6 minutes on a 16-core H200 host: HSTU default grid (6 shards) + the sm90ws
# batches, BSA grid (4 shards), rab tests (2 shards), the 1-GPU transformation tests, and the
# garbage-metadata grid under compute-sanitizer memcheck (--quick; API-error reports off,
# XLA autotuning off so compiles under the sanitizer stay short). Every process runs under
# `timeout`; logs and a summary go to $OUT. Run from the repo root after
# `source .devcache/setup.sh`:  OUT=$OUT bash tests/gpu_grids.sh
set -u
out=${OUT:-./gpu_out}
LOGS=${LOGS:-/tmp/gg_logs}
T=${T:-320}
mkdir -p "$out" "$LOGS"
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
PYT="python3 -m pytest -m gpu -q -rA -p no:cacheprovider"
run() { local name=$1; shift; timeout -k 10 "$T" env "$@" > "$LOGS/$name.log" 2>&1; echo "rc=$?" >> "$LOGS/$name.log"; }
for i in 0 1 2 3 4 5; do run hstu_$i HSTU_TEST_SHARD=$i/6 $PYT -k "not sm90" tests/test_gpu_hstu.py & done
run hstu_ws $PYT -k sm90ws tests/test_gpu_hstu.py &
for i in 0 1 2 3; do run bsa_$i BSA_TEST_SHARD=$i/4 $PYT tests/test_gpu_bsa.py -k "not sm90ws" & done
for i in 0 1; do run rab_$i HSTU_TEST_SHARD=$i/2 $PYT tests/test_gpu_hstu_rab.py & done
run transforms $PYT tests/test_gpu_transforms.py &
(XLA_FLAGS=--xla_gpu_autotune_level=0 timeout -k 10 "$T" compute-sanitizer --tool memcheck \
   --report-api-errors no --error-exitcode 9 python3 tests/sanitize_grid.py --quick \
   > "$LOGS/sanitize.log" 2>&1; echo "rc=$? (0 clean, 9 memcheck errors, 1 failed case, 124 timeout)" >> "$LOGS/sanitize.log") &
wait
{
  for f in "$LOGS"/*.log; do
    echo "$(basename "$f"): $(grep -E "passed|failed|error" "$f" | grep -v "^E " | tail -n 1) $(grep '^rc=' "$f" | tail -n 1)"
  done
  grep -h "^FAILED\|^ERROR" "$LOGS"/*.log | head -40
  echo "== sanitize tail"; grep -v "^=========     Host Frame\|^========= *$" "$LOGS/sanitize.log" | tail -25
} > "$out/summary.txt" 2>&1
tar czf "$out/logs.tgz" -C "$LOGS" . 2>/dev/null
cat "$out/summary.txt"
