#!/usr/bin/env bash
# The forward's O rescale under the next S GEMM (bsa_fwd_ws=oearly) and pairwise row sums
# (sumtree): their GPU cases (test_bsa_sm90ws_forward_early, both flags), then the forward
# rows against the default in the same call (default, oearly, sumtree, oearly+sumtree,
# interleaved by bsa_bench), then the block-sparse grid with each flag.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/gpu_s68_a.sh [seconds]
. "$(dirname "$0")/gpu_lib.sh" s68_a "${1:-560}"
gpu_info
if shard_tests early tests/test_gpu_bsa.py "sm90ws_forward_early" 2 200; then
  bench fwd 200 fwd 0,1,2,3,5 \
    ";JAX_SPARSE_ATTN_BSA_WS=oearly;JAX_SPARSE_ATTN_BSA_WS=sumtree;JAX_SPARSE_ATTN_BSA_WS=oearly+sumtree"
else
  t "early tests not clean: no benchmark"
fi
T=$(( $(left) - 15 ))
for i in 0 1 2; do
  BSA_TEST_IMPLS=oearly,sumtree,nodefault BSA_TEST_SHARD=$i/3 timeout "$T" $PYT \
    tests/test_gpu_bsa.py -k TestBSAKernelGrid > "$O/t_grid_early$i.txt" 2>&1 &
done
wait; t "tests"
report_tests
t done
