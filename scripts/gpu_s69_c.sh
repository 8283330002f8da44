#!/usr/bin/env bash
# Whether the 64-column S GEMMs cost the blk 64 forward cycles: the blk 128 forward with each
# S = Q K^T issued as two 64-column GEMMs (bsa_fwd_ws=sn64, an ablation) against the default,
# the blk 64 row beside them; its GPU cases first (test_bsa_sm90ws_forward_early with
# BSA_TEST_EARLY=sn64), then the grid with it. nosm (no online-softmax step, a timing
# ablation) beside them measures what the softmax costs.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/gpu_s69_c.sh [seconds]
. "$(dirname "$0")/gpu_lib.sh" s69_c "${1:-300}"
gpu_info
if BSA_TEST_EARLY=sn64 shard_tests sn64 tests/test_gpu_bsa.py "sm90ws_forward_early" 2 150; then
  bench sn64 150 fwd 3,4,0,1 ";JAX_SPARSE_ATTN_BSA_WS=sn64;JAX_SPARSE_ATTN_BSA_WS=nosm"
else
  t "sn64 tests not clean: no benchmark"
fi
T=$(( $(left) - 15 ))
for i in 0 1 2; do
  BSA_TEST_IMPLS=sn64,nodefault BSA_TEST_SHARD=$i/3 timeout "$T" $PYT \
    tests/test_gpu_bsa.py -k TestBSAKernelGrid > "$O/t_grid_sn64$i.txt" 2>&1 &
done
wait; t "tests"
report_tests
t done
tar czf "$O/../s69_c.tgz" -C "$O" . && rm -rf "$O"
