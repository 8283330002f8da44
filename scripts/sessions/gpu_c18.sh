#!/usr/bin/env bash
# c18 GPU check: block-sparse causal=True on the sm90 kernels, on ONE GPU within T seconds
# (default 240), from the repo root with PYTHONPATH at this tree.
#   1. tests/test_gpu_bsa_causal.py in SHARDS parallel processes (CAUSAL_TEST_SHARD=i/n),
#      T - T_BENCH - 15 seconds;
#   2. benchmarks/bsa_bench.py --causal (blk128, diagonal + 15 past blocks, causal vs the same
#      listing non-causal, fwd and bwd; TFLOP/s + JSON), T_BENCH seconds (default 90).
# PHASE=tests / PHASE=bench run one step only (TB: bench seconds). Logs and JSON under $OUT,
# packed into $OUT/c18_logs_$PHASE.tgz at the end.
set -u
T=${T:-240}
OUT=${OUT:-./gpu_out_c18}
mkdir -p "$OUT"
SHARDS=${SHARDS:-6}
T_BENCH=${T_BENCH:-90}
TB_C18=${TB:-$T_BENCH}
T_TEST=$(( T - T_BENCH - 15 ))
[ "${PHASE:-all}" = tests ] && T_TEST=$(( T - 10 ))
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
start=$(date +%s)
stamp() { echo "[$(( $(date +%s) - start ))s] $*" | tee -a "$OUT/summary.txt"; }
stamp "c18 $(cat C18_COMMIT 2>/dev/null || git rev-parse --short HEAD 2>/dev/null) T=$T shards=$SHARDS T_TEST=$T_TEST T_BENCH=$T_BENCH"
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader >> "$OUT/summary.txt" 2>&1
PYT="python3 -m pytest -m gpu -q -rA -p no:cacheprovider"
if [ "${PHASE:-all}" != bench ]; then
pids=()
for ((i = 0; i < SHARDS; i++)); do
  CAUSAL_TEST_SHARD=$i/$SHARDS timeout "$T_TEST" $PYT -s tests/test_gpu_bsa_causal.py \
    > "$OUT/causal_tests_$i.log" 2>&1 &
  pids+=($!)
done
rcs=""
for p in "${pids[@]}"; do wait "$p"; rcs="$rcs $?"; done
stamp "tests rc:$rcs"
tail -qn 1 "$OUT"/causal_tests_*.log >> "$OUT/summary.txt"
grep -h "^PASSED\|^FAILED\|^ERROR\|^SKIPPED" "$OUT"/causal_tests_*.log >> "$OUT/summary.txt"
grep -h "err=" "$OUT"/causal_tests_*.log | cut -c1-400 >> "$OUT/summary.txt"
grep -h "AssertionError\|Error:" "$OUT"/causal_tests_*.log | head -30 | cut -c1-400 >> "$OUT/summary.txt"
fi
if [ "${PHASE:-all}" != tests ]; then
timeout "$TB_C18" python3 -m benchmarks.bsa_bench --causal --out "$OUT/bsa_causal_bench.json" \
  > "$OUT/bsa_causal_bench.log" 2>&1
stamp "bench rc=$?"
grep -v "^WARNING\|^I0000\|^W0000" "$OUT/bsa_causal_bench.log" | tail -8 >> "$OUT/summary.txt"
fi
stamp done
cat "$OUT/summary.txt"
tar -czf "$OUT/c18_logs_${PHASE:-all}.tgz" -C "$OUT" $(cd "$OUT" && ls | grep -v "c18_logs.*tgz")
