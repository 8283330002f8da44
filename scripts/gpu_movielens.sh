#!/usr/bin/env bash
# MovieLens-1M acceptance runs of the relative attention bias (rab) on 1 or 2 GPUs, in one
# device call (<= ~9.5 min), every process under `timeout`, JSONs + logs + a summary in $OUT.
# Run from the repo root (sources .devcache/setup.sh when it is there):
#
#     OUT=$OUT bash scripts/gpu_movielens.sh                      # everything (2 GPUs)
#     OUT=$OUT ML_GROUPS=hstu bash scripts/gpu_movielens.sh        # 1 GPU, call 1
#     OUT=$OUT ML_GROUPS=large bash scripts/gpu_movielens.sh       # 1 GPU, call 2
#
# Data: the MovieLens cache with timestamps ($CACHE, default .data/ml-1m-sequences.npz,
# git-ignored, carried along); see examples/hstu_movielens.py --cache-data.
#
# Jobs (examples/hstu_movielens.py --full, 101 epochs unless EPOCHS is set):
#   group hstu:  rab_kernel_s{42,43,44}  (kernel backend, rab on: the default)
#                rab_reference_s42       (reference backend)
#                norab_kernel_s42        (--no-rab)
#   group large: large_kernel_s{42,43,44} (--large: 8 blocks, 2 heads, d_qk = d_v = 25)
# The jobs are dealt round-robin over the GPUs (CUDA_VISIBLE_DEVICES), largest first;
# PER_GPU processes run at once on a GPU (default: all jobs at once, i.e. ceil(jobs / GPUs);
# extra jobs queue behind a slot). Every job gets --max-seconds (the time left to DEADLINE
# minus a margin), so it stops cleanly with its last epoch evaluated (JSON "complete":
# false) instead of being killed; each JSON is also rewritten after every epoch.
#
# Optional TIMING=1 first runs rab and --no-rab for TIMING_EPOCHS epochs one after the other
# with the GPU to themselves (clean epoch times; the concurrent runs' epoch times are
# inflated by GPU sharing), before the jobs above.
#
# Wall time (H200, estimates from examples/results/*h200* and benchmarks/results/h200_2026-11-30):
# one --full HSTU run alone ~1.5-2 min (compile 20-60 s, 100 x ~0.3-0.4 s epochs, 21
# evaluations); sharing a GPU 4 ways ~4-6 min; --large ~4x the epoch time (8 blocks), 3-4
# min alone, 6-9 min sharing. 2 GPUs, everything: ~8-9.5 min (the large runs may stop at
# DEADLINE, reported incomplete). 1 GPU: GROUPS=hstu ~6-8 min, GROUPS=large ~8-9.5 min.
#
# Env: OUT, CACHE, LOGS, ML_GROUPS ("hstu large"), NGPU (default: nvidia-smi -L count),
#      PER_GPU, DEADLINE (seconds from start for everything, default 550), EPOCHS,
#      TIMING (0), TIMING_EPOCHS (6), EXTRA (more arguments for every job, last: they win).
set -u
out=${OUT:-./gpu_out}
CACHE=${CACHE:-.data/ml-1m-sequences.npz}
LOGS=${LOGS:-/tmp/ml_logs}
GROUPS_=${ML_GROUPS:-hstu large}  # (bash reserves GROUPS)
DEADLINE=${DEADLINE:-550}
TIMING=${TIMING:-0}
TIMING_EPOCHS=${TIMING_EPOCHS:-6}
mkdir -p "$out" "$LOGS"
[ -f .devcache/setup.sh ] && source .devcache/setup.sh
export XLA_PYTHON_CLIENT_PREALLOCATE=false  # several processes share a GPU
start=$(date +%s)
stamp() { echo "[$(( $(date +%s) - start ))s] $*"; }
left() { echo $(( DEADLINE - ($(date +%s) - start) )); }
NGPU=${NGPU:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')}
[ "${NGPU:-0}" -ge 1 ] || NGPU=1
nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.max.sm --format=csv \
  > "$LOGS/gpu.txt" 2>&1

# name|gpu-cost rank|arguments
jobs=()
for g in $GROUPS_; do
  case $g in
    large) for s in 42 43 44; do jobs+=("large_kernel_s$s|--backend kernel --large --seed $s"); done ;;
    hstu)
      for s in 42 43 44; do jobs+=("rab_kernel_s$s|--backend kernel --seed $s"); done
      jobs+=("rab_reference_s42|--backend reference --seed 42")
      jobs+=("norab_kernel_s42|--backend kernel --no-rab --seed 42") ;;
    *) echo "unknown group $g (hstu, large)" >&2; exit 2 ;;
  esac
done
n=${#jobs[@]}
PER_GPU=${PER_GPU:-$(( (n + NGPU - 1) / NGPU ))}
slots=$(( NGPU * PER_GPU ))
epochs_arg=${EPOCHS:+--epochs $EPOCHS}

run_job() {  # name, gpu, arguments...
  local name=$1 gpu=$2; shift 2
  local t=$(( $(left) - 5 ))
  if [ "$t" -lt 60 ]; then echo "skipped: ${t}s left" > "$LOGS/$name.log"; return; fi
  local ms=$(( t - 45 ))  # --max-seconds: room for the last evaluation and the JSON
  local t0=$(date +%s)
  CUDA_VISIBLE_DEVICES=$gpu timeout -k 10 "$t" python3 examples/hstu_movielens.py --full \
    ${epochs_arg} --data-cache "$CACHE" --max-seconds "$ms" --out "$LOGS/$name.json" \
    "$@" ${EXTRA:-} > "$LOGS/$name.log" 2>&1
  echo "rc=$? gpu=$gpu wall=$(( $(date +%s) - t0 ))s" >> "$LOGS/$name.log"
}

if [ "$TIMING" = 1 ]; then
  stamp "timing pair on GPU 0: rab / no-rab, $TIMING_EPOCHS epochs each"
  for v in rab norab; do
    a=(); [ $v = norab ] && a=(--no-rab)
    CUDA_VISIBLE_DEVICES=0 timeout -k 10 200 python3 examples/hstu_movielens.py --full \
      --epochs "$TIMING_EPOCHS" --eval-every 1000 --backend kernel --data-cache "$CACHE" \
      --out "$LOGS/timing_$v.json" "${a[@]}" > "$LOGS/timing_$v.log" 2>&1
    echo "rc=$?" >> "$LOGS/timing_$v.log"
  done
fi

stamp "$n jobs on $NGPU GPU(s), $PER_GPU per GPU, deadline ${DEADLINE}s: ${jobs[*]%%|*}"
for ((slot = 0; slot < slots && slot < n; slot++)); do
  (
    gpu=$(( slot % NGPU ))
    for ((j = slot; j < n; j += slots)); do
      name=${jobs[$j]%%|*}; args=${jobs[$j]#*|}
      # shellcheck disable=SC2086
      run_job "$name" "$gpu" $args
    done
  ) &
done
wait
stamp "jobs done"

python3 - "$LOGS" > "$LOGS/ml_summary.txt" 2>&1 <<'PY'
import glob, json, os, sys
import numpy as np
logs = sys.argv[1]

def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except Exception as e:  # noqa: BLE001
        print(f"  {os.path.basename(path)}: unreadable ({e})")
        return None

def ms(v):
    return f"{v.mean():.4f} +- {v.std():.4f}" if len(v) else "n/a"

epoch_s = {}
for group, label in (("rab_kernel", "HSTU rab, kernel"), ("rab_reference", "HSTU rab, reference"),
                     ("norab_kernel", "HSTU no rab, kernel"), ("large_kernel", "HSTU-large rab, kernel"),
                     ("timing_rab", "timing pair: rab (GPU alone)"),
                     ("timing_norab", "timing pair: no rab (GPU alone)")):
    paths = sorted(glob.glob(os.path.join(logs, group + "*.json")))
    runs = []
    for p in paths:
        r = load(p)
        if r:
            runs += r.get("runs", [])
    if not runs:
        if paths or not group.startswith("timing"):
            print(f"{label}: no results")
        continue
    done = [x for x in runs if x.get("test")]
    hr = np.array([x["test"]["hr@10"] for x in done])
    nd = np.array([x["test"]["ndcg@10"] for x in done])
    ep = np.array([x["epoch_seconds_mean_excl_first"] for x in runs if x.get("epoch_seconds_mean_excl_first")])
    cold = [round(x["first_step_seconds_incl_compile"], 1) for x in runs if x.get("first_step_seconds_incl_compile")]
    epoch_s[group] = float(ep.mean()) if len(ep) else None
    print(f"{label}: seeds {[x['seed'] for x in runs]} epochs {[x.get('epochs_done') for x in runs]} "
          f"complete {[x.get('complete') for x in runs]}")
    print(f"   test HR@10 {ms(hr)} | NDCG@10 {ms(nd)} (population std; last evaluated epoch)")
    print(f"   epoch s (mean excl. first) {np.round(ep, 3).tolist()} | cold first step s {cold}")
for a, b, what in (("rab_kernel", "norab_kernel", "concurrent runs, GPU shared"),
                   ("timing_rab", "timing_norab", "GPU alone")):
    if epoch_s.get(a) and epoch_s.get(b):
        r, n = epoch_s[a], epoch_s[b]
        print(f"rab epoch {r:.3f} s vs no rab {n:.3f} s ({what}): rab = {100 * (r - n) / r:.1f} % "
              f"of the rab step time (target < 25 %)")
PY
{
  echo "== gpu_movielens.sh: groups [$GROUPS_], $NGPU GPU(s), $PER_GPU per GPU, $(( $(date +%s) - start ))s"
  cat "$LOGS/gpu.txt"
  echo "== summary"; cat "$LOGS/ml_summary.txt"
  for f in "$LOGS"/*.log; do
    echo "== $(basename "$f") (tail)"; tail -3 "$f" 2>/dev/null
  done
} > "$out/summary.txt" 2>&1
cp "$LOGS"/*.json "$out/" 2>/dev/null
tar czf "$out/ml_logs.tgz" -C "$LOGS" . 2>/dev/null
cat "$out/summary.txt"
stamp "done"
