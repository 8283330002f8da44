#!/usr/bin/env bash
# gpu_s72_c.sh cut to what a short device budget holds: blk 64 12.5 % and 5 % on lists the
# benchmark sorted (--lists sorted, no sort in the timed call), default and pairbox; then on
# random lists, default and sortlists (XLA's sort timed with the kernel).
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/gpu_s72_d.sh [seconds]
. "$(dirname "$0")/gpu_lib.sh" s72_d "${1:-150}"
gpu_info
W=JAX_SPARSE_ATTN_BSA_WS
bench sorted 55 fwd 0,1 ";$W=pairbox" sorted
bench rand 55 fwd 0,1 ";$W=sortlists"
t done
pack_out s72_d
