#!/usr/bin/env bash
# Session 65, second call (about 440 s): the block-sparse GPU test files that session 64's
# call left unfinished, on the current defaults (`bsa_kq_impl=items`): the fixed-point
# deterministic dQ, pack_gqa, the BSA fuzz cases and split KV.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/gpu_s65_b.sh [seconds]
. "$(dirname "$0")/gpu_lib.sh" s65_b "${1:-440}"
gpu_info
T=$(( $(left) - 25 ))
bsa_sweep_core_bg
wait; t "tests"
report_tests
t done
cd $OUT && tar czf s65_b.tgz s65_b && rm -rf s65_b
