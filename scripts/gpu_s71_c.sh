#!/usr/bin/env bash
# Two producer warps (bsa_fwd_ws=kvwarps: warp 0 issues Q and K, warp 1 V, so that no K load
# waits behind a V stage) on the default blk 64 forward and on the pair-step plans
# (pairstep4: two K / four V stages, pairstepk3: three / three, pairstepk4: four / two):
# early GPU cases first, then timed against the default and pairstep4 (blk 64 rows), then
# the grid with BSA_TEST_IMPLS=kvwarps,pairstepk4kv,nodefault as the budget allows.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/gpu_s71_c.sh [seconds]
. "$(dirname "$0")/gpu_lib.sh" s71_c "${1:-300}"
gpu_info
W=JAX_SPARSE_ATTN_BSA_WS
for v in kvwarps pairstep4,kvwarps pairstepk3,kvwarps pairstepk4,kvwarps; do
  BSA_TEST_EARLY=$v timeout 170 $PYT tests/test_gpu_bsa.py -k sm90ws_forward_early \
    > "$O/t_early_$v.txt" 2>&1 &
done
wait; t "early tests"; report_tests
bench kv 170 fwd 0,1,5 ";$W=kvwarps;$W=pairstep4;$W=pairstep4+kvwarps;$W=pairstepk3+kvwarps;$W=pairstepk4+kvwarps"
grid_tests kv kvwarps,pairstepk4kv,nodefault
t done
pack_out s71_c
