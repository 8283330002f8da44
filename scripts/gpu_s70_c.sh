#!/usr/bin/env bash
# The K ring three stages deep (bsa_fwd_ws=kdeep: with O in the Q buffer the stage beyond the
# K / V pairs goes to K, three K and two V stages) with the producer issuing K a tile ahead
# of V (vlag): timed against the default, vlag and kdeep alone, then its GPU cases (early
# cases, the grid with BSA_TEST_IMPLS=kdeep,nodefault as the budget allows).
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/gpu_s70_c.sh [seconds]
. "$(dirname "$0")/gpu_lib.sh" s70_c "${1:-300}"
gpu_info
W=JAX_SPARSE_ATTN_BSA_WS
bench kdeep 100 fwd 0,1,3,5 ";$W=vlag;$W=kdeep;$W=kdeep+vlag"
BSA_TEST_EARLY=kdeep,vlag shard_tests kdeep tests/test_gpu_bsa.py "sm90ws_forward_early" 2 100
T=$(( $(left) - 10 ))
if [ "$T" -gt 40 ]; then
  for i in 0 1 2; do
    BSA_TEST_IMPLS=kdeep,nodefault BSA_TEST_SHARD=$i/3 timeout "$T" $PYT tests/test_gpu_bsa.py \
      -k TestBSAKernelGrid > "$O/t_grid_kdeep$i.txt" 2>&1 &
  done
  wait; t "grid tests"; report_tests
fi
t done
pack_out s70_c
