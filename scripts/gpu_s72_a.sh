#!/usr/bin/env bash
# The pair step with half2's stages (bsa_fwd_ws=pairbox: a step's two listed blk 64 blocks in
# the halves of one 128-row K / V stage, one 64-row TMA box per half under one barrier):
# its early GPU cases first, then timed against the default and pairstep4 on the blk 64
# rows and half2 on the blk 128 12.5 % row (the same step shape from one blk 128 list),
# Nsight Compute (full set, clocks as they are, one launch) of pairbox and half2 where the
# budget allows, then the grid with BSA_TEST_IMPLS=pairbox,nodefault.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/gpu_s72_a.sh [seconds]
. "$(dirname "$0")/gpu_lib.sh" s72_a "${1:-540}"
gpu_info
W=JAX_SPARSE_ATTN_BSA_WS
BSA_TEST_EARLY=pairbox shard_tests box tests/test_gpu_bsa.py "sm90ws_forward_early" 2 170
if grep -qE "^(FAILED|ERROR)|Timeout|timeout" "$O"/t_box*.txt; then
  t "early cases failed: no timing"
else
  bench box 150 fwd 0,1,2,5 ";$W=pairbox;$W=pairstep4"
  bench half 60 fwd 3 ";$W=half2"
  if [ -n "$NCU" ] && [ "$(left)" -gt 300 ]; then
    ncu_prof box 0 "$W=pairbox"
    ncu_prof half2 3 "$W=half2"
  fi
fi
grid_tests box pairbox,nodefault
t done
pack_out s72_a
