#!/usr/bin/env bash
# Where 64 x 128 steps wait, half2 against pairstep4: Nsight Compute (full set, clocks as
# they are, one launch) of bsa_fwd_ws=half2 on the blk 128 12.5 % row (64-row items, one
# 128-row K stage and two 128-row V stages) and of pairstep4 on the blk 64 12.5 % row (the
# same step shape from two 64-row stages), each with its default for reference as the
# budget allows; then the block-sparse floor rows on the current defaults (an H200 is what
# the floors are set on; the reply's device names the card).
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/gpu_s72_a.sh [seconds]
. "$(dirname "$0")/gpu_lib.sh" s72_a "${1:-540}"
gpu_info
W=JAX_SPARSE_ATTN_BSA_WS
if [ -n "$NCU" ]; then
  ncu_prof half2 3 "$W=half2"
  ncu_prof ps4 0 "$W=pairstep4"
  [ "$(left)" -gt 300 ] && ncu_prof def128 3 ";"
  [ "$(left)" -gt 250 ] && ncu_prof def64 0 ";"
fi
[ "$(left)" -gt 90 ] && bench fwd 80 fwd 0,1,2,3,4,5,6 ";"
t done
pack_out s72_a
