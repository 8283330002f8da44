#!/usr/bin/env bash
# pack_gqa on the BSA SM90 kernels (helper p18): GPU tests + benchmark rows on ONE GPU within
# T seconds (default 240). From the tree's root (PYTHONPATH pointing at it):
#   T=240 OUT=$OUT/p18 bash scripts/gpu_p18.sh
# Phase 1 (~55 % of T): tests/test_gpu_bsa_pack_gqa.py in SHARDS (default 3) processes.
# Phase 2 (the rest): benchmarks/bsa_bench.py --pack-gqa (packed vs unpacked, fwd + bwd).
# STEPS=t / STEPS=b runs one phase. Every log lands in $OUT/p18_logs.tgz (one file).
set -u
T=${T:-240}
out=${OUT:-./gpu_out}
LOGS=$(mktemp -d /tmp/p18_logs.XXXX)
mkdir -p "$out"
for s in .devcache/setup.sh ../.devcache/setup.sh; do [ -f "$s" ] && source "$s" && break; done
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
start=$SECONDS
steps=${STEPS:-tb}
n=${SHARDS:-3}
if [[ $steps == *t* ]]; then
  tt=$(( T * 55 / 100 )); [[ $steps == t ]] && tt=$(( T - 15 ))
  for ((i = 0; i < n; i++)); do
    BSA_PACK_SHARD=$i/$n timeout -k 5 "$tt" python3 -m pytest -m gpu -q -rA -s -p no:cacheprovider \
      tests/test_gpu_bsa_pack_gqa.py > "$LOGS/tests_$i.log" 2>&1; echo "rc=$?" >> "$LOGS/tests_$i.log" &
  done
  wait
fi
if [[ $steps == *b* ]]; then
  tb=$(( T - (SECONDS - start) - 10 ))
  if (( tb > 20 )); then
    timeout -k 5 "$tb" python3 benchmarks/bsa_bench.py --pack-gqa --out "$out/p18_bench.json" \
      > "$LOGS/bench.log" 2>&1; echo "rc=$?" >> "$LOGS/bench.log"
    [ -f "$out/p18_bench.json" ] && cp "$out/p18_bench.json" "$LOGS/"
  else
    echo "no time left for the benchmark ($tb s)" > "$LOGS/bench.log"
  fi
fi
echo "p18: $(( SECONDS - start )) s" | tee "$LOGS/summary.txt"
for f in "$LOGS"/*.log; do
  echo "== $(basename "$f"): $(grep -E "passed|failed|error|rc=" "$f" | tr '\n' ' ' | tail -c 300)" | tee -a "$LOGS/summary.txt"
done
grep -h "TFLOP/s\|err=" "$LOGS"/*.log 2>/dev/null | tail -c 4000 | tee -a "$LOGS/summary.txt"
tar czf "$out/p18_logs.tgz" -C "$LOGS" .
