#!/usr/bin/env bash
# The block-sparse forward floor rows on the current defaults, then (on an H200, as far as
# the budget goes) the large-tensor block-sparse cases, which need its memory.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/gpu_s69_e.sh [seconds]
. "$(dirname "$0")/gpu_lib.sh" s69_e "${1:-200}"
gpu_info
bench fwd 110 fwd 0,1,2,3,4,5,6 "deterministic=0"
T=$(( $(left) - 10 ))
if [ "$T" -gt 40 ] && grep -q H200 "$O/gpu.txt"; then
  bg_test large tests/test_gpu_large_tensors.py "large_bsa_fwd_bwd or large_bsa_gqa"
  wait; t "large"; report_tests
fi
t done
pack_out s69_e
