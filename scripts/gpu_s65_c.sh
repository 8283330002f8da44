#!/usr/bin/env bash
# Session 65, a short call for an H200 (about 270 s): the block-sparse issues' floor rows on
# the current defaults (bsa_floor_benches: the backward with and without the bucket split,
# the deterministic ratio, the forward).
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/gpu_s65_c.sh [seconds]
. "$(dirname "$0")/gpu_lib.sh" s65_c "${1:-270}"
gpu_info
bsa_floor_benches
t done
cd $OUT && tar czf s65_c.tgz s65_c && rm -rf s65_c
