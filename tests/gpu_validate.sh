#!/usr/bin/env bash
# One-shot GPU validation of the whole project on an H200 (SM90), in one device call.
# (The final run of the integrated branch is tests/gpu_final.sh: every branch's GPU work in one call.)
# Run from the repo root after `source .devcache/setup.sh`. Data files (git-ignored,
# never committed) are read from $DATA (default /tmp/mldata): ml-1m-sequences.npz for the
# MovieLens main job, minilm_qkv.npz for the block-sparse real-attention example.
#
# Phase 1 (GPU to itself): kernel benchmarks (issue 3 and issue 4 floor shapes).
# Phase 2 (in parallel): the GPU test grids (HSTU default + wgmma forwards, BSA), the
#   MovieLens full runs (kernel and reference backends) and the real-attention example.
# Logs go to $LOGS; a tarball of them and a summary go to $OUT.
# The H200 run of 2026-11-29 (first version of this script) timed out several shards at
# T_TEST=170 with 16 shards + MovieLens sharing 16 cores; give the grids ~240 s or fewer shards.
# Phase 3 (robustness): the NaN-isolation / transform / lse-gradient GPU tests
#   (tests/test_robustness.py, tests/test_transforms_vs_loop.py) and the garbage-metadata grid under
#   compute-sanitizer memcheck (tests/sanitize_grid.py; SANITIZE_ARGS=--quick for a short run).
# Env: PHASES (default "12"), ML_EPOCHS (default: --full = 101), T_TEST (per-shard timeout),
# T_ML (MovieLens timeout; the example writes its JSON after every epoch), T_SAN (sanitizer
# timeout, default 540).
set -u
out=${OUT:-./gpu_out}
DATA=${DATA:-/tmp/mldata}
LOGS=${LOGS:-/tmp/gv_logs}
PHASES=${PHASES:-12}
T_TEST=${T_TEST:-240}
T_ML=${T_ML:-330}
mkdir -p "$out" "$LOGS"
export XLA_PYTHON_CLIENT_PREALLOCATE=false
start=$(date +%s)
stamp() { echo "[$(( $(date +%s) - start ))s] $*"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > "$LOGS/gpu.txt" 2>&1

if [[ $PHASES == *1* ]]; then
  stamp "phase 1: benchmarks"
  timeout 90 python3 benchmarks/hstu_bench.py --tiles "impl=sm90ws;ws=nooverlap" \
    --out "$LOGS/hstu_bench.json" > "$LOGS/hstu_bench.log" 2>&1
  stamp "hstu_bench rc=$?"
  timeout 110 python3 -m benchmarks.bsa_bench --out "$LOGS/bsa_bench.json" \
    > "$LOGS/bsa_bench.log" 2>&1
  stamp "bsa_bench rc=$?"
fi

if [[ $PHASES == *2* ]]; then
  stamp "phase 2: MovieLens + example + test grids"
  ml_epochs=${ML_EPOCHS:+--epochs $ML_EPOCHS}
  for be in kernel reference; do
    timeout $T_ML python3 examples/hstu_movielens.py --full ${ml_epochs} --backend $be \
      --data-cache "$DATA/ml-1m-sequences.npz" --out "$LOGS/ml1m_full_$be.json" \
      > "$LOGS/ml1m_full_$be.log" 2>&1 &
  done
  (python3 examples/bsa_real_attention.py --qkv "$DATA/minilm_qkv.npz" --backend kernel \
     --out "$LOGS/bsa_real_kernel.json" > "$LOGS/bsa_real_kernel.log" 2>&1;
   python3 examples/bsa_real_attention.py --qkv "$DATA/minilm_qkv.npz" --backend reference \
     --dtype bfloat16 --out "$LOGS/bsa_real_ref_bf16.json" > "$LOGS/bsa_real_ref_bf16.log" 2>&1) &
  pids=()
  for i in 0 1 2 3; do
    HSTU_TEST_SHARD=$i/4 nice -n 5 timeout $T_TEST python3 -m pytest -m gpu -k "not sm90" \
      tests/test_gpu_hstu.py -q -rA -p no:cacheprovider > "$LOGS/hstu_default_$i.log" 2>&1 &
    pids+=($!)
  done
  for i in 0 1 2 3 4 5; do
    HSTU_TEST_SM90=1 HSTU_TEST_SHARD=$i/6 nice -n 5 timeout $T_TEST python3 -m pytest -m gpu \
      -k "ForwardImpls or sm90ws" \
      tests/test_gpu_hstu.py -q -rA -p no:cacheprovider > "$LOGS/hstu_sm90_$i.log" 2>&1 &
    pids+=($!)
  done
  for i in 0 1 2 3 4 5; do
    BSA_TEST_SHARD=$i/6 nice -n 5 timeout $T_TEST python3 -m pytest -m gpu tests/test_gpu_bsa.py -q -rA \
      -p no:cacheprovider > "$LOGS/bsa_$i.log" 2>&1 &
    pids+=($!)
  done
  wait "${pids[@]}"
  stamp "test grids done"
  wait
  stamp "MovieLens + example done"
fi

if [[ $PHASES == *3* ]]; then
  stamp "phase 3: robustness tests + compute-sanitizer grid"
  timeout $T_TEST python3 -m pytest -m gpu tests/test_robustness.py tests/test_transforms_vs_loop.py -q -rA \
    -p no:cacheprovider > "$LOGS/robustness.log" 2>&1
  stamp "robustness rc=$?"
  timeout ${T_SAN:-540} compute-sanitizer --tool memcheck --error-exitcode 9 \
    python3 tests/sanitize_grid.py ${SANITIZE_ARGS:-} > "$LOGS/sanitize.log" 2>&1
  stamp "sanitize rc=$? (0 clean, 9 memcheck errors, 1 a failed case, 124 timeout)"
fi

{
  cat "$LOGS/gpu.txt"
  echo "== hstu_bench"; grep -v "^WARNING\|^I0000\|^W0000" "$LOGS/hstu_bench.log" 2>/dev/null | tail -12
  echo "== bsa_bench"; tail -14 "$LOGS/bsa_bench.log" 2>/dev/null
  for g in hstu_default hstu_sm90 bsa; do
    echo "== $g shards (last line each)"; tail -qn 1 "$LOGS"/${g}_*.log 2>/dev/null
    grep -h "^FAILED\|^ERROR" "$LOGS"/${g}_*.log 2>/dev/null | head -20
  done
  for be in kernel reference; do
    echo "== ml1m $be"; tail -25 "$LOGS/ml1m_full_$be.log" 2>/dev/null
  done
  echo "== bsa_real"; tail -12 "$LOGS/bsa_real_kernel.log" 2>/dev/null; tail -4 "$LOGS/bsa_real_ref_bf16.log" 2>/dev/null
  echo "== robustness"; tail -3 "$LOGS/robustness.log" 2>/dev/null
  grep -h "^FAILED\|^ERROR" "$LOGS/robustness.log" 2>/dev/null | head -20
  echo "== sanitize"; grep -v "^      ok" "$LOGS/sanitize.log" 2>/dev/null | tail -30
} > "$out/summary.txt" 2>&1
tar czf "$out/logs.tgz" -C "$LOGS" . 2>/dev/null
for f in hstu_bench.json bsa_bench.json ml1m_full_kernel.json ml1m_full_reference.json bsa_real_kernel.json; do
  [ -f "$LOGS/$f" ] && cp "$LOGS/$f" "$out/"
done
cat "$out/summary.txt"
stamp "done"
