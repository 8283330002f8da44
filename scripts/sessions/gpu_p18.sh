#!/usr/bin/env bash
# pack_gqa on the BSA SM90 kernels (helper p18): GPU tests and benchmark rows on ONE GPU.
# From the tree's root (PYTHONPATH pointing at it):
#   PHASE=tests T=240 OUT=$OUT/p18 bash scripts/sessions/gpu_p18.sh   # GPU tests within T s
#   PHASE=bench TB=60 OUT=$OUT/p18 bash scripts/sessions/gpu_p18.sh   # benchmark rows within TB s
# PHASE=tests: tests/test_gpu_bsa_pack_gqa.py in SHARDS (default 4) processes.
# PHASE=bench: benchmarks/bsa_bench.py --pack-gqa (packed vs unpacked GQA: prefill fwd,
#   decode fwd, prefill bwd; the JSON $OUT/p18_bench.json is rewritten after each group).
# PHASE=all (default): tests within 55 % of T, then the benchmark in the rest.
# Logs: $OUT/p18_logs_$PHASE.tgz (one file).
set -u
T=${T:-240}
TB=${TB:-60}
PHASE=${PHASE:-all}
out=${OUT:-./gpu_out}
LOGS=$(mktemp -d /tmp/p18_logs.XXXX)
mkdir -p "$out"
for s in .devcache/setup.sh ../.devcache/setup.sh; do [ -f "$s" ] && source "$s" && break; done
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
start=$SECONDS
n=${SHARDS:-4}
case $PHASE in
  tests) tt=$(( T - 10 )) ;;
  all) tt=$(( T * 55 / 100 )) ;;
  *) tt=0 ;;
esac
if (( tt > 0 )); then
  for ((i = 0; i < n; i++)); do
    BSA_PACK_SHARD=$i/$n timeout -k 5 "$tt" python3 -m pytest -m gpu -q -rA -s -p no:cacheprovider \
      tests/test_gpu_bsa_pack_gqa.py > "$LOGS/tests_$i.log" 2>&1; echo "rc=$?" >> "$LOGS/tests_$i.log" &
  done
  wait
fi
if [[ $PHASE == bench || $PHASE == all ]]; then
  tb=$TB
  [[ $PHASE == all ]] && tb=$(( T - (SECONDS - start) - 10 ))
  if (( tb > 20 )); then
    timeout -k 5 "$tb" python3 benchmarks/bsa_bench.py --pack-gqa --out "$out/p18_bench.json" \
      > "$LOGS/bench.log" 2>&1; echo "rc=$?" >> "$LOGS/bench.log"
    [ -f "$out/p18_bench.json" ] && cp "$out/p18_bench.json" "$LOGS/"
  else
    echo "no time left for the benchmark ($tb s)" > "$LOGS/bench.log"
  fi
fi
echo "p18 $PHASE: $(( SECONDS - start )) s" | tee "$LOGS/summary.txt"
for f in "$LOGS"/*.log; do
  echo "== $(basename "$f"): $(grep -E "passed|failed|error|rc=" "$f" | tr '\n' ' ' | tail -c 300)" | tee -a "$LOGS/summary.txt"
done
grep -h "TFLOP/s\|err=\|^FAILED\|Error" "$LOGS"/*.log 2>/dev/null | tail -c 5000 | tee -a "$LOGS/summary.txt"
tar czf "$out/p18_logs_$PHASE.tgz" -C "$LOGS" .
