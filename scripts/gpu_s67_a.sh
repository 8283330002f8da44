#!/usr/bin/env bash
# The forward's O staged in the work item's own Q buffer, the freed 16 KiB as a third V
# stage (bsa_fwd_ws=oinq): its GPU cases, then the forward rows against the default in the
# same call (default, oinq, oinq+vlag, interleaved twice by bsa_bench), then the block-sparse
# grid with oinq, then the tests session 66 did not reach (scripts/gpu_s66_next.sh) as far
# as the budget goes.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/gpu_s67_a.sh [seconds]
. "$(dirname "$0")/gpu_lib.sh" s67_a "${1:-560}"
gpu_info
for i in 0 1; do
  BSA_TEST_SHARD=$i/2 timeout 200 $PYT tests/test_gpu_bsa.py -k "sm90ws_forward_oinq" \
    > "$O/t_oinq$i.txt" 2>&1 &
done
wait; t "oinq tests"
report_tests
if grep -qE "^(FAILED|ERROR)|Timeout|timeout" "$O"/t_oinq*.txt; then
  t "oinq tests not clean: no benchmark"
else
  bench fwd 170 fwd 0,1,2,3,4,5,6 ";JAX_SPARSE_ATTN_BSA_WS=oinq;JAX_SPARSE_ATTN_BSA_WS=oinq+vlag"
fi
T=$(( $(left) - 15 ))
for i in 0 1 2; do
  BSA_TEST_IMPLS=oinq,nodefault BSA_TEST_SHARD=$i/3 timeout "$T" $PYT tests/test_gpu_bsa.py \
    -k TestBSAKernelGrid > "$O/t_grid_oinq$i.txt" 2>&1 &
done
bg_test pre tests/test_gpu_bsa.py "preprocess_kernel"
wait; t "tests"
report_tests
t done
