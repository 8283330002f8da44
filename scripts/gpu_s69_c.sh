#!/usr/bin/env bash
# Whether the 64-column S GEMMs cost the blk 64 forward cycles: the blk 128 forward with each
# S = Q K^T issued as two 64-column GEMMs (bsa_fwd_ws=sn64, an ablation) against the default,
# the blk 64 rows beside them, and nosm (no online-softmax step, a timing ablation) to
# measure what the softmax costs; then sn64's GPU cases (test_bsa_sm90ws_forward_early with
# BSA_TEST_EARLY=sn64, the grid with it).
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/gpu_s69_c.sh [seconds]
. "$(dirname "$0")/gpu_lib.sh" s69_c "${1:-300}"
gpu_info
bench sn64 150 fwd 3,4,0,1 ";JAX_SPARSE_ATTN_BSA_WS=sn64;JAX_SPARSE_ATTN_BSA_WS=nosm"
flag_tests sn64 sn64 sn64,nodefault 3
t done
pack_out s69_c
