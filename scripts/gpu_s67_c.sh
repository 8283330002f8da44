#!/usr/bin/env bash
# On an H200: the forward floor rows, oinq (the default at D 128) against nooinq, then the
# large-tensor block-sparse forward / backward cases (H200 memory) beside the causal cases
# call B did not reach.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/gpu_s67_c.sh [seconds]
. "$(dirname "$0")/gpu_lib.sh" s67_c "${1:-480}"
gpu_info
bench fwd 170 fwd 0,1,2,3,4,5,6 ";JAX_SPARSE_ATTN_BSA_WS=nooinq;;JAX_SPARSE_ATTN_BSA_WS=nooinq"
T=$(( $(left) - 5 ))
bg_test causal tests/test_gpu_bsa_causal.py "no_mask_needed or decouple or pairwg"
bg_test large tests/test_gpu_large_tensors.py "large_bsa_fwd_bwd or large_bsa_gqa"
wait; t "tests"
report_tests
t done
