#!/usr/bin/env bash
# deterministic=True HSTU backward on the GPU, in phases (each process under `timeout`: a
# semaphore bug hangs). From the repo root after `source .devcache/setup.sh`:
#   PHASE=tests OUT=$OUT bash scripts/sessions/gpu_hstu_det.sh   # = dettests + grid, in parallel
#   PHASE=dettests ...   # bitwise-reproducibility tests (6 cases in 3 processes)
#   PHASE=grid ...       # the HSTU grid with deterministic=True (DET_SHARDS=4 processes)
#   PHASE=bench OUT=$OUT bash scripts/sessions/gpu_hstu_det.sh   # hstu_bench default vs deterministic
# Logs go to $OUT/det_<phase>.tgz (one file), summary lines to stdout.
set -u
out=${OUT:-./gpu_out}
LOGS=${LOGS:-/tmp/det_logs}
T=${T:-200}
mkdir -p "$out" "$LOGS"
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
PYT="python3 -m pytest -m gpu -q -rA -p no:cacheprovider"
run() { local name=$1; shift
  timeout -k 5 "$T" "$@" > "$LOGS/$name.log" 2>&1; echo "rc=$?" >> "$LOGS/$name.log"; }
start=$SECONDS
case "${PHASE:-tests}" in
tests|dettests|grid)
  # each process compiles its kernels and references on the CPU: keep the process count
  # well below the core count (15 processes on 16 cores did not finish in 118 s)
  if [ "${PHASE:-tests}" != grid ]; then
    t=tests/test_gpu_hstu.py::test_hstu_bwd_deterministic
    run det_a $PYT -s "${t}[canonical-jagged-d128-causal]" "${t}[jagged-d128-func-targets]" &
    run det_b $PYT -s "${t}[canonical-jagged-d256-causal-sm80]" "${t}[jagged-d64-window-64-inf]" &
    run det_c $PYT -s "${t}[jagged-d32-local-sm80]" "${t}[jagged-d128-rab1-sm80]" &
  fi
  if [ "${PHASE:-tests}" != dettests ]; then
    n=${DET_SHARDS:-4}
    for ((i = 0; i < n; i++)); do
      run "grid_$i" env HSTU_TEST_DET=1 HSTU_TEST_SHARD=$i/$n $PYT -k "TestHSTUBackwardDeterministic" tests/test_gpu_hstu.py &
    done
  fi
  wait
  ;;
bench)
  run bench python3 benchmarks/hstu_bench.py --case 8x4096-causal --case jagged32-causal \
    --case 8x4096-causal-d256 --bwd-only --deterministic --iters 10 --out "$out/det_bench.json"
  cat "$LOGS/bench.log"
  ;;
esac
echo "phase ${PHASE:-tests}: $((SECONDS - start)) s"
for f in "$LOGS"/*.log; do
  echo "== $(basename "$f"): $(grep -E "passed|failed|error|rc=" "$f" | tr '\n' ' ' | tail -c 300)"
done
grep -h "default-mode dq\|err=" "$LOGS"/det_*.log 2>/dev/null | tail -c 3000
tar czf "$out/det_${PHASE:-tests}.tgz" -C "$LOGS" .
