#!/usr/bin/env bash
# The pair-step blk 64 forward with the producer issuing a step's two K tiles before its two
# V tiles, in four shared-memory plans (pairstep: O in the Q buffer, two K / three V stages;
# pairstep4: one Q buffer, two K / four V; pairstepk3: three K / three V; pairstepk4: four K /
# two V): early GPU cases of each, then timed against the default (blk 64 rows and GQA),
# Nsight Compute (full set, clocks as they are, one launch) of the fastest of them on the
# blk 64 12.5 % row, then the grid with BSA_TEST_IMPLS=pairstep,pairstepk3,nodefault as the
# budget allows.
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
# the fastest pair variant on row 0 (blk64 12.5 %)
BEST=$(grep "^blk64 top32" "$O/pair.txt" | grep "BSA_WS=" \
  | awk '{for (i = 1; i <= NF; i++) if ($i == "TFLOP/s") print $(i - 1), $5}' \
  | sort -g | tail -1 | sed 's/.*BSA_WS=//')
t "fastest pair variant: $BEST"
if [ -n "$NCU" ] && [ -n "$BEST" ] && [ "$(left)" -gt 250 ]; then
  ncu_prof "ps_$BEST" 0 "$W=$BEST"
fi
grid_tests ps pairstep,pairstepk3,nodefault
t done
pack_out s71_b
