# Shared preamble of the device scripts (source it: `. "$(dirname "$0")/gpu_lib.sh" NAME SECONDS`).
# Sets O=$OUT/NAME (created), the GPU test environment (no preallocation, per-test time
# limit and hang log), BUDGET (seconds, default 540) and start; defines t (a timestamped
# line, also appended to $O/timeline.txt), left (seconds of the budget left) and PYT (the
# GPU pytest command).
set -u
O=${OUT:-./gpu_out}/$1; mkdir -p "$O"
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
export JAX_SPARSE_ATTN_GPU_TEST_TIMEOUT=${JAX_SPARSE_ATTN_GPU_TEST_TIMEOUT:-150}
export JAX_SPARSE_ATTN_GPU_HANG_LOG=$O/hang.log
BUDGET=${2:-540}
start=$SECONDS
t() { echo "[$((SECONDS - start))s] $*" | tee -a "$O/timeline.txt"; }
left() { echo $((BUDGET - (SECONDS - start))); }
PYT="python3 -m pytest -m gpu -q -rA -p no:cacheprovider"
# gpu_info: the GPU's name, clocks, power limit and memory to $O/gpu.txt, and printed
gpu_info() {
  nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,memory.total --format=csv \
    > "$O/gpu.txt" 2>&1
  cat "$O/gpu.txt"
}
# bsa_bwd_tests_bg T: in the background, the block-sparse grid with the sm90ws backward /
# public-API cases (bsa_grid_bg) and the deterministic cases (det_tests_bg), under timeout T
bsa_bwd_tests_bg() {
  bsa_grid_bg "$1"
  det_tests_bg "$1"
}
# bsa_floor_benches: the block-sparse floor rows on the current defaults: the backward
# (with and without the bucket split), the deterministic ratio and the forward
bsa_floor_benches() {
  bench bwd 110 bwd 0,2,3,4,5,6 ";JAX_SPARSE_ATTN_BSA_BWD_WS=nobuckets"
  bench det 70 bwd 0,3,4 ";deterministic=1"
  bench fwd 75 fwd 0,1,2,3,4,5,6 ";"
}
# bsa_issue_tests T: the block-sparse issues' GPU tests (bsa_bwd_tests_bg, ws_fwd_tests_bg)
# under timeout T, waited for and reported
bsa_issue_tests() {
  bsa_bwd_tests_bg "$1"
  ws_fwd_tests_bg
  wait; t "tests"
  report_tests
}
# bsa_grid_bg T: in the background, the block-sparse grid in three shards (t_grid0..2.txt) and
# the sm90ws backward cases with the public-API checks (t_ws.txt), each under timeout T
bsa_grid_bg() {
  local i
  for i in 0 1 2; do
    BSA_TEST_SHARD=$i/3 timeout "$1" $PYT tests/test_gpu_bsa.py -k TestBSAKernelGrid \
      > "$O/t_grid$i.txt" 2>&1 &
  done
  timeout "$1" $PYT tests/test_gpu_bsa.py -k "sm90ws_backward or grad_through or \
    fresh_inputs or block_causal_equals" > "$O/t_ws.txt" 2>&1 &
}
# trace_variant NAME ENV CASE...: per-kernel traces (scripts/gpu_trace.py, 10 calls) of the
# CASEs with the environment assignment ENV ("X=1" for none), to $O/trace_NAME.{json,txt}
trace_variant() {
  local name=$1 e=$2 c args=()
  shift 2
  for c in "$@"; do args+=(--case "$c"); done
  env "$e" timeout 60 python3 scripts/gpu_trace.py --iters 10 "${args[@]}" \
    --out "$O/trace_$name.json" > "$O/trace_$name.txt" 2>&1
  t "trace $name rc=$?"
}
# det_tests_bg T: in the background, the deterministic cases of the block-sparse grid on the
# default switches in three processes (t_64a.txt: blk 64 D 128, t_64b.txt: blk 64 other D,
# t_128.txt: blk 128), each under timeout T
det_tests_bg() {
  timeout "$1" $PYT tests/test_gpu_bsa.py -k "bwd_deterministic and blk64 and d128" \
    > "$O/t_64a.txt" 2>&1 &
  timeout "$1" $PYT tests/test_gpu_bsa.py -k "bwd_deterministic and blk64 and not d128" \
    > "$O/t_64b.txt" 2>&1 &
  timeout "$1" $PYT tests/test_gpu_bsa.py -k "bwd_deterministic and blk128" \
    > "$O/t_128.txt" 2>&1 &
}
# ncu_pair METRICS T: one launch each of our block-sparse forward and of cuDNN FE's (the side
# script in .whl/, its wheels installed under /tmp/fe) at blk 64 12.5 % under Nsight Compute,
# no clock control, each under timeout T and only while more than T seconds of the budget are
# left; to $O/ncu_ours.txt and $O/ncu_cudnn.txt, the metric lines printed
ncu_pair() {
  if [ "$(left)" -gt "$2" ]; then
    timeout -k 5 "$2" "$NCU" --metrics "$1" --clock-control none --kernel-name \
      "regex:BsaFwdSm90Ws" --launch-skip 2 --launch-count 1 python3 -m benchmarks.bsa_bench \
      --table "" --rows 0 --out /tmp/ncu_ours.json > "$O/ncu_ours.txt" 2>&1
    t "ncu ours rc=$?"; grep -E "^ +[a-z0-9_]+__" "$O/ncu_ours.txt"
  fi
  if [ "$(left)" -gt "$2" ]; then
    PYTHONPATH=/tmp/fe:$PYTHONPATH timeout -k 5 "$2" "$NCU" --metrics "$1" --clock-control none \
      --kernel-name "regex:(?i)sdpa|fmha|attn|sparse" --launch-skip 2 --launch-count 1 \
      python3 .whl/cudnn_side.py /tmp/ncu_cudnn.json 0 > "$O/ncu_cudnn.txt" 2>&1
    t "ncu cudnn rc=$?"; grep -E "^ +[a-z0-9_]+__|==PROF==" "$O/ncu_cudnn.txt" | head -12
  fi
}
# side_start: the cuDNN FE side script's wheels (.whl/) into /tmp/fe, and nvidia-smi logging the
# SM clock and the power every 100 ms to $O/smi.csv in the background (SMI: its pid)
side_start() {
  python3 -m pip install -q --no-deps --no-index --target /tmp/fe .whl/*.whl > "$O/pip.txt" 2>&1
  local q=timestamp,clocks.sm,power.draw,clocks_event_reasons.active
  nvidia-smi --query-gpu=power.draw.instant --format=csv > /dev/null 2>&1 && q=$q,power.draw.instant
  nvidia-smi --query-gpu=$q --format=csv -lms 100 > "$O/smi.csv" 2>&1 &
  SMI=$!
}
# side_round I SECS TABLE: ours on rows 0, 2, 5 with the table variants TABLE (bench oursI,
# timeout SECS), then cuDNN FE's kernel on the same rows (.whl/cudnn_side.py, to $O/cudnnI.json)
side_round() {
  bench "ours$1" "$2" fwd 0,2,5 "$3"
  PYTHONPATH=/tmp/fe:$PYTHONPATH timeout 60 python3 .whl/cudnn_side.py "$O/cudnn$1.json" 0,2,5 \
    > "$O/cudnn$1.txt" 2>&1
  t "cudnn$1 rc=$?"; cat "$O/cudnn$1.txt"
}
# bench NAME SECS PASS ROWS TABLE [LISTS]: `benchmarks.bsa_bench --table-pass PASS --rows ROWS
# --timing both --table TABLE [--lists LISTS]` under timeout SECS, to $O/NAME.{json,txt};
# prints its table
bench() {
  timeout "$2" python3 -m benchmarks.bsa_bench --table-pass "$3" --rows "$4" --timing both \
    --table "$5" ${6:+--lists "$6"} --out "$O/$1.json" > "$O/$1.txt" 2>&1
  t "$1 rc=$?"; grep -v "^wrote" "$O/$1.txt"
}
# report_tests: the last line and the failures of every $O/t_*.txt
report_tests() {
  local f
  for f in "$O"/t_*.txt; do
    echo "== $f"; tail -n 1 "$f"; grep -E "^(FAILED|ERROR)" "$f" | head -5
  done
}
# shard_tests NAME FILE KEXPR N SECS: the GPU tests of FILE selected by KEXPR in N shards at
# once (BSA_TEST_SHARD), each under timeout SECS, to $O/t_NAME<i>.txt; waited for, reported;
# returns non-zero if a shard failed, errored or timed out
shard_tests() {
  local i
  for i in $(seq 0 $(( $4 - 1 ))); do
    BSA_TEST_SHARD=$i/$4 timeout "$5" $PYT "$2" -k "$3" > "$O/t_$1$i.txt" 2>&1 &
  done
  wait; t "$1 tests"
  report_tests
  ! grep -qE "^(FAILED|ERROR)|Timeout|timeout" "$O"/t_"$1"*.txt
}
# NCU: the Nsight Compute binary (empty where none is installed). ncu_prof NAME ROW VARIANT:
# Nsight Compute (full set, clocks left as they are, one launch after two) of the sm90ws
# block-sparse forward on bsa_bench row ROW with the table variant VARIANT, to
# $O/NAME.details.txt and the SASS source page with its stall samples $O/NAME.csv.gz (for
# scripts/ncu_stalls.py); prints the headline metrics
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
ncu_prof() {
  timeout -k 5 90 "$NCU" --set full --clock-control none --kernel-name "regex:BsaFwdSm90Ws" \
    --launch-skip 2 --launch-count 1 -f -o "/tmp/$1" \
    python3 -m benchmarks.bsa_bench --table "$3" --rows "$2" --out "/tmp/ncu_$1.json" \
    > "$O/$1.run.log" 2>&1
  t "prof $1 rc=$?"
  "$NCU" --import "/tmp/$1.ncu-rep" --page details > "$O/$1.details.txt" 2>&1
  "$NCU" --import "/tmp/$1.ncu-rep" --page source --csv --print-source sass 2>/dev/null \
    | gzip > "$O/$1.csv.gz"
  grep -E "Duration|SM Frequency|Elapsed Cycles|Compute \(SM\) Throughput|L2 Cache Throughput|Issue Slots Busy|No Eligible|Warp Cycles Per Issued" \
    "$O/$1.details.txt" | head -10
}
# grid_tests NAME IMPLS: the block-sparse grid with BSA_TEST_IMPLS=IMPLS in three shards under
# timeout $(left) - 15, to $O/t_grid_NAME<i>.txt, waited for and reported; skipped when fewer
# than 40 s would be left for it
grid_tests() {
  local i T=$(( $(left) - 15 ))
  [ "$T" -gt 40 ] || return 0
  for i in 0 1 2; do
    BSA_TEST_IMPLS=$2 BSA_TEST_SHARD=$i/3 timeout "$T" $PYT tests/test_gpu_bsa.py \
      -k TestBSAKernelGrid > "$O/t_grid_$1$i.txt" 2>&1 &
  done
  wait; t "grid tests"; report_tests
}
# grid_garbage_tests NAME IMPLS KEY: grid_tests NAME IMPLS with, beside it, the
# garbage-metadata cases of tests/test_gpu_bsa.py selected by -k "garbage_metadata and KEY"
# (to $O/t_garbage.txt); skipped when 125 s or less are left
grid_garbage_tests() {
  [ "$(left)" -gt 125 ] || return 0
  T=$(( $(left) - 15 )) bg_test garbage tests/test_gpu_bsa.py "garbage_metadata and $3"
  grid_tests "$1" "$2"
  tail -n 4 "$O/t_garbage.txt"
}
# flag_tests NAME EARLY_FLAGS IMPLS N: the sm90ws forward's GPU cases with the bsa_fwd_ws flags
# EARLY_FLAGS (test_bsa_sm90ws_forward_early, BSA_TEST_EARLY, two shards, shard_tests) and the
# block-sparse grid with BSA_TEST_IMPLS=IMPLS in N shards under timeout $(left) - 15, to
# $O/t_NAME<i>.txt and $O/t_grid_NAME<i>.txt; waited for and reported; returns non-zero if the
# first ones failed (the grid then does not run; nor where 40 s or less would be left for it)
flag_tests() {
  local i T
  BSA_TEST_EARLY=$2 shard_tests "$1" tests/test_gpu_bsa.py "sm90ws_forward_early" 2 150 || return 1
  T=$(( $(left) - 15 ))
  [ "$T" -gt 40 ] || return 0
  for i in $(seq 0 $(( $4 - 1 ))); do
    BSA_TEST_IMPLS=$3 BSA_TEST_SHARD=$i/$4 timeout "$T" $PYT tests/test_gpu_bsa.py \
      -k TestBSAKernelGrid > "$O/t_grid_$1$i.txt" 2>&1 &
  done
  wait; t "grid tests"
  report_tests
}
# pack_out NAME: everything under $O into $OUT/NAME.tgz (one file comes back), $O removed
pack_out() {
  tar czf "$O/../$1.tgz" -C "$O" . && rm -rf "$O"
}
# bg_test NAME FILE KEXPR: in the background, the GPU tests of FILE selected by KEXPR under
# timeout $T, to $O/t_NAME.txt
bg_test() {
  timeout "$T" $PYT "$2" -k "$3" > "$O/t_$1.txt" 2>&1 &
}
# ws_fwd_tests_bg: in the background, the sm90ws block-sparse forward cases of
# tests/test_gpu_bsa.py without the opt-in shapes (ctas3k1, pairwg, streamk), to $O/t_fwd.txt
ws_fwd_tests_bg() {
  bg_test fwd tests/test_gpu_bsa.py \
    "test_bsa_sm90ws_forward and not ctas3k1 and not pairwg and not streamk"
}
# large_det_on_h200: with more than 60 s left and an H200 (gpu.txt), the 2.28e9-element
# deterministic block-sparse case on the fixed-point dQ (it needs 100 GB free), to $O/t_large.txt
large_det_on_h200() {
  T=$(( $(left) - 10 ))
  if [ "$T" -gt 60 ] && grep -q H200 "$O/gpu.txt"; then
    bg_test large tests/test_gpu_large_tensors.py "bsa_deterministic and fixed"
    wait; t "large"; tail -n 3 "$O/t_large.txt"
  fi
}
# bsa_sweep_tests_bg: in the background under timeout $T, the block-sparse GPU test files that
# the floor calls do not run: the fixed-point deterministic dQ, pack_gqa, the BSA fuzz cases,
# split KV and the extra options (t_fixed, t_packgqa, t_fuzz, t_splits, t_extra)
bsa_sweep_tests_bg() {
  bsa_sweep_core_bg
  bg_test extra tests/test_gpu_bsa_options_extra.py ""
}
# bsa_sweep_core_bg: bsa_sweep_tests_bg without the extra options (t_fixed, t_packgqa,
# t_fuzz, t_splits)
bsa_sweep_core_bg() {
  bg_test fixed tests/test_gpu_dq_fixed.py ""
  bg_test packgqa tests/test_gpu_bsa_pack_gqa.py ""
  bg_test fuzz tests/test_gpu_fuzz.py "bsa"
  bg_test splits tests/test_gpu_bsa_splits.py ""
}
