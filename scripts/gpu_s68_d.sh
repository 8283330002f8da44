#!/usr/bin/env bash
# A short H200 call: the block-sparse forward floor rows on the current defaults (oinq at
# D 128, no XLA clamp before the kernel), then the large-tensor block-sparse forward /
# backward cases (they need the H200's memory) as far as the budget goes.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/gpu_s68_d.sh [seconds]
. "$(dirname "$0")/gpu_lib.sh" s68_d "${1:-240}"
gpu_info
bench fwd 100 fwd 0,1,2,3,4,5,6 "deterministic=0"
T=$(( $(left) - 10 ))
if [ "$T" -gt 40 ]; then
  bg_test large tests/test_gpu_large_tensors.py "large_bsa_fwd_bwd or large_bsa_gqa"
  wait; t "large"; report_tests
fi
t done
tar czf "$O/../s68_d.tgz" -C "$O" . && rm -rf "$O"
