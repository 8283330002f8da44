#!/usr/bin/env bash
# The interleaved GEMM chains (bsa_fwd_ws=mix=N, opt-in) timed against the default on the
# forward rows, the GEMM-only ablations (nosm, nosm+sn64, nosm+mix=2: is the blk 64 tile bound
# by its GEMM shape, by its chain or by two free-running CTAs? pairwg: one CTA whose
# two consumer warpgroups take turns), then the GPU cases of mix=2 (early cases, then the grid
# with BSA_TEST_IMPLS=mix2,nodefault in three shards).
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/gpu_s70_a.sh [seconds]
. "$(dirname "$0")/gpu_lib.sh" s70_a "${1:-540}"
gpu_info
bench mix 190 fwd 0,1,2,5,3 \
  ";JAX_SPARSE_ATTN_BSA_WS=mix=1;JAX_SPARSE_ATTN_BSA_WS=mix=2;JAX_SPARSE_ATTN_BSA_WS=mix=4"
W=JAX_SPARSE_ATTN_BSA_WS
bench gemm64 90 fwd 0 "$W=nosm;$W=nosm+mix=2;$W=pairwg;$W=pairwg+nosm;$W=pairwg+nopingpong+nosm"
bench gemm128 50 fwd 3 "$W=nosm;$W=nosm+sn64"
flag_tests mix mix=2 mix2,nodefault 3 || t "mix early cases not clean: no grid"
t done
pack_out s70_a
