#!/usr/bin/env bash
# sparse_block_size 128 walked by 64-row work items (bsa_fwd_ws=half: 64 x 128 score tiles,
# one consumer warpgroup and one CTA per SM, the K / V traffic per row of blk 64): the blk
# 128 rows with and without it beside the blk 64 12.5 % row (the same FLOPs), then its GPU
# cases (test_bsa_sm90ws_forward_early with BSA_TEST_EARLY=half, the grid with it).
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/gpu_s69_b.sh [seconds]
. "$(dirname "$0")/gpu_lib.sh" s69_b "${1:-420}"
gpu_info
bench half 150 fwd 3,4,0 ";JAX_SPARSE_ATTN_BSA_WS=half;JAX_SPARSE_ATTN_BSA_WS=half+stages=2"
flag_tests half half half,nodefault 3
t done
pack_out s69_b
