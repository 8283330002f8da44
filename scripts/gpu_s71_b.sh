#!/usr/bin/env bash
# The pair-step blk 64 forward with the producer issuing a step's two K tiles before its two
# V tiles, in four shared-memory plans (pairstep: O in the Q buffer, two K / three V stages;
# pairstep4: one Q buffer, two K / four V; pairstepk3: three K / three V; pairstepk4: four K /
# two V): early GPU cases of each, then timed against the default (blk 64 rows and GQA),
# then the grid with BSA_TEST_IMPLS=pairstep,pairstepk3,nodefault as the budget allows.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/gpu_s71_b.sh [seconds]
. "$(dirname "$0")/gpu_lib.sh" s71_b "${1:-300}"
gpu_info
W=JAX_SPARSE_ATTN_BSA_WS
for v in pairstep pairstep4 pairstepk3 pairstepk4; do
  BSA_TEST_EARLY=$v timeout 170 $PYT tests/test_gpu_bsa.py -k sm90ws_forward_early \
    > "$O/t_early_$v.txt" 2>&1 &
done
wait; t "early tests"; report_tests
bench pair 200 fwd 0,1,2,5 ";$W=pairstep;$W=pairstep4;$W=pairstepk3;$W=pairstepk4"
T=$(( $(left) - 15 ))
if [ "$T" -gt 40 ]; then
  for i in 0 1 2; do
    BSA_TEST_IMPLS=pairstep,pairstepk3,nodefault BSA_TEST_SHARD=$i/3 timeout "$T" $PYT \
      tests/test_gpu_bsa.py -k TestBSAKernelGrid > "$O/t_grid_ps$i.txt" 2>&1 &
  done
  wait; t "grid tests"; report_tests
fi
t done
pack_out s71_b
