#!/usr/bin/env bash
# GPU check of the warp-specialized block-sparse forward (switch bsa_fwd_impl=sm90ws,
# JAX_SPARSE_ATTN_BSA_FWD_IMPL=sm90ws; what the default "auto" runs) in one device call, from the repo root (after `source .devcache/setup.sh` where the
# environment needs it). Steps (STEPS, default "sgtb"), each under `timeout` so that a hang in
# the mbarrier pipeline cannot eat the call:
#   s  smoke: one small sm90ws case (blk128, all blocks listed); stops here on failure
#   g  the sm90ws cases of tests/test_gpu_bsa.py (test_bsa_sm90ws_forward)
#   t  the whole BSA GPU grid with the forward on sm90ws (BSA_TEST_IMPLS=sm90ws, sharded;
#      the backward is the default one)
#   b  benchmark: the issue-table forward rows, sm90ws vs the mma.sync forward sm80, then the
#      sm90ws ablation (no overlap, no ping-pong, one Q stage, two K/V stages) on two rows
# Worst case (every timeout hit) is over 10 minutes: with one device call of 600 s, run
# STEPS=sgt and STEPS=b as two calls, or STEPS=sgb alone.
# Logs and JSON under $OUT (or ./gpu_out).
set -u
out=${OUT:-./gpu_out}
mkdir -p "$out"
STEPS=${STEPS:-sgtb}
SHARDS=${SHARDS:-4}
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
start=$(date +%s)
stamp() { echo "[$(( $(date +%s) - start ))s] $*"; }
PYT="python3 -m pytest -m gpu -q -rA -p no:cacheprovider"
if [[ $STEPS == *s* ]]; then
  timeout ${T_SMOKE:-120} $PYT tests/test_gpu_bsa.py -k "test_bsa_sm90ws_forward and all-blocks-blk128" \
    > "$out/bsa_ws_smoke.log" 2>&1
  rc=$?; stamp "smoke rc=$rc"; tail -5 "$out/bsa_ws_smoke.log"
  [[ $rc == 0 ]] || { grep -h "Error\|error\|assert" "$out/bsa_ws_smoke.log" | head -20; exit 1; }
fi
if [[ $STEPS == *g* ]]; then
  timeout ${T_WS:-180} $PYT tests/test_gpu_bsa.py -k "test_bsa_sm90ws_forward" > "$out/bsa_ws_cases.log" 2>&1
  stamp "sm90ws cases rc=$?"; tail -qn 1 "$out/bsa_ws_cases.log"
  grep -h "^FAILED\|^ERROR" "$out/bsa_ws_cases.log" | head -20
fi
if [[ $STEPS == *t* ]]; then
  pids=()
  for ((i = 0; i < SHARDS; i++)); do
    BSA_TEST_IMPLS=sm90ws BSA_TEST_SHARD=$i/$SHARDS timeout ${T_GRID:-240} $PYT \
      tests/test_gpu_bsa.py -k "TestBSAKernelGrid and sm90ws" > "$out/bsa_ws_grid_$i.log" 2>&1 &
    pids+=($!)
  done
  wait "${pids[@]}"
  stamp "sm90ws grid done"
  tail -qn 1 "$out"/bsa_ws_grid_*.log; grep -h "^FAILED\|^ERROR\|Timeout" "$out"/bsa_ws_grid_*.log | head -30
fi
if [[ $STEPS == *b* ]]; then
  I=JAX_SPARSE_ATTN_BSA_FWD_IMPL
  W=JAX_SPARSE_ATTN_BSA_WS
  # every table row: sm90ws vs the portable mma.sync forward
  timeout ${T_BENCH:-240} python3 -m benchmarks.bsa_bench --table "$I=sm90ws;$I=sm80" \
    --out "$out/bsa_ws_bench.json" > "$out/bsa_ws_bench.log" 2>&1
  stamp "bench rc=$?"; grep -v "^WARNING\|^I0000\|^W0000" "$out/bsa_ws_bench.log" | tail -20
  # ablation on blk64 top-32 and blk128 top-16: no overlap, no ping-pong, 1 Q stage, 2 K/V stages
  timeout ${T_ABL:-150} python3 -m benchmarks.bsa_bench --rows 0,3 \
    --table "$I=sm90ws,$W=nooverlap;$I=sm90ws,$W=nopingpong;$I=sm90ws,$W=q1;$I=sm90ws,$W=stages=2" \
    --out "$out/bsa_ws_ablation.json" > "$out/bsa_ws_ablation.log" 2>&1
  stamp "ablation rc=$?"; grep -v "^WARNING\|^I0000\|^W0000" "$out/bsa_ws_ablation.log" | tail -12
fi
stamp done
