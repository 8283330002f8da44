#!/usr/bin/env bash
# Two 64 x 128-step CTAs per SM (bsa_fwd_ws=half2: blk 128 walked by 64-row work items, one
# consumer warpgroup per CTA, two CTAs per SM with one Q, one K and two V buffers): timed
# against the default and half at blk 128, the early GPU cases of half2, Nsight Compute (full
# set, clocks left as they are, one launch each) of the blk 64 12.5 % forward with nosm and
# on the default as the budget allows (details and the SASS source pages with their stall
# samples, for scripts/ncu_stalls.py), then the grid with BSA_TEST_IMPLS=half2,nodefault.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/gpu_s70_b.sh [seconds]
. "$(dirname "$0")/gpu_lib.sh" s70_b "${1:-540}"
gpu_info
W=JAX_SPARSE_ATTN_BSA_WS
bench half 110 fwd 3,4 ";$W=half;$W=half2;$W=half2+nosm;$W=nosm"
BSA_TEST_EARLY=half2 shard_tests half2 tests/test_gpu_bsa.py "sm90ws_forward_early" 2 150
if [ -n "$NCU" ] && [ "$(left)" -gt 280 ]; then
  ncu_prof nosm64 0 "$W=nosm"
fi
if [ -n "$NCU" ] && [ "$(left)" -gt 380 ]; then
  ncu_prof def64 0 ";"
fi
T=$(( $(left) - 15 ))
for i in 0 1 2; do
  BSA_TEST_IMPLS=half2,nodefault BSA_TEST_SHARD=$i/3 timeout "$T" $PYT tests/test_gpu_bsa.py \
    -k TestBSAKernelGrid > "$O/t_grid_half2$i.txt" 2>&1 &
done
wait; t "grid tests"
report_tests
t done
pack_out s70_b
