#!/usr/bin/env bash
# sparse_block_size 128 walked by 64-row work items (bsa_fwd_ws=half: 64 x 128 score tiles,
# one consumer warpgroup and one CTA per SM, the K / V traffic per row of blk 64): its GPU
# cases (test_bsa_sm90ws_forward_early with BSA_TEST_EARLY=half), then the blk 128 rows with
# and without it beside the blk 64 12.5 % row (the same FLOPs), then the grid with it.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/gpu_s69_b.sh [seconds]
. "$(dirname "$0")/gpu_lib.sh" s69_b "${1:-420}"
gpu_info
if BSA_TEST_EARLY=half shard_tests half tests/test_gpu_bsa.py "sm90ws_forward_early" 2 150; then
  bench half 150 fwd 3,4,0 ";JAX_SPARSE_ATTN_BSA_WS=half;JAX_SPARSE_ATTN_BSA_WS=half+stages=2"
else
  t "half tests not clean: no benchmark"
fi
T=$(( $(left) - 15 ))
for i in 0 1 2; do
  BSA_TEST_IMPLS=half,nodefault BSA_TEST_SHARD=$i/3 timeout "$T" $PYT \
    tests/test_gpu_bsa.py -k TestBSAKernelGrid > "$O/t_grid_half$i.txt" 2>&1 &
done
wait; t "tests"
report_tests
t done
tar czf "$O/../s69_b.tgz" -C "$O" . && rm -rf "$O"
