#!/usr/bin/env bash
# The PV GEMM's first K steps among the next S GEMM's (bsa_fwd_ws=mix=N, opt-in; compiled and
# checked on CPU in session 69, not yet run on a GPU): its GPU cases first
# (test_bsa_sm90ws_forward_early with BSA_TEST_EARLY=mix=2, the grid with
# BSA_TEST_IMPLS=mix2,nodefault), then, if they pass, the forward rows with mix=1, 2, 4
# against the default in one bsa_bench run; on an H200 the floor rows on the defaults too.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/gpu_s69_next.sh [seconds]
. "$(dirname "$0")/gpu_lib.sh" s69_next "${1:-480}"
gpu_info
if flag_tests mix mix=2 mix2,nodefault 3; then
  bench mix 200 fwd 0,1,2,5,3 \
    ";JAX_SPARSE_ATTN_BSA_WS=mix=1;JAX_SPARSE_ATTN_BSA_WS=mix=2;JAX_SPARSE_ATTN_BSA_WS=mix=4"
else
  t "mix tests not clean: no benchmark"
fi
if grep -q H200 "$O/gpu.txt" && [ "$(left)" -gt 100 ]; then
  bench fwd 90 fwd 0,1,2,3,4,5,6 "deterministic=0"
fi
t done
pack_out s69_next
