#!/usr/bin/env bash
# blk 64 walked two listed blocks per step (bsa_fwd_ws=pairstep: O in the Q buffer, two K
# and three V stages; pairstep4: one Q buffer, two K and four V stages): its early GPU cases
# first (a hang or a wrong result shows before the timing), then timed against the default on
# the blk 64 rows and GQA, then the grid with BSA_TEST_IMPLS=pairstep,pairstep4,nodefault as
# the budget allows.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/gpu_s71_a.sh [seconds]
. "$(dirname "$0")/gpu_lib.sh" s71_a "${1:-300}"
gpu_info
W=JAX_SPARSE_ATTN_BSA_WS
BSA_TEST_EARLY=pairstep timeout 150 $PYT tests/test_gpu_bsa.py -k sm90ws_forward_early \
  > "$O/t_early_ps.txt" 2>&1 &
BSA_TEST_EARLY=pairstep4 timeout 150 $PYT tests/test_gpu_bsa.py -k sm90ws_forward_early \
  > "$O/t_early_ps4.txt" 2>&1 &
wait; t "early tests"; report_tests
if grep -qE "^(FAILED|ERROR)|Timeout|timeout" "$O"/t_early_*.txt; then
  t "early cases failed: no timing"
else
  bench pair 150 fwd 0,1,2,5 ";$W=pairstep;$W=pairstep4"
fi
grid_tests ps pairstep,pairstep4,nodefault
t done
pack_out s71_a
