#!/usr/bin/env bash
# Q as the register operand of the blk 64 S GEMMs (bsa_fwd_ws=qregs) on the current defaults:
# the blk 64 rows with qregs, nosm (no online-softmax step, a timing ablation) and both,
# against the default in one bsa_bench run; then qregs' GPU cases (test_bsa_sm90ws_forward_early
# with BSA_TEST_EARLY=qregs, the grid with BSA_TEST_IMPLS=qregs,nodefault).
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/gpu_s69_d.sh [seconds]
. "$(dirname "$0")/gpu_lib.sh" s69_d "${1:-300}"
gpu_info
bench qregs 150 fwd 0,1,2,5 \
  ";JAX_SPARSE_ATTN_BSA_WS=qregs;JAX_SPARSE_ATTN_BSA_WS=nosm;JAX_SPARSE_ATTN_BSA_WS=qregs+nosm"
flag_tests qregs qregs qregs,nodefault 2
t done
pack_out s69_d
