#!/usr/bin/env bash
# Session 62's third call (about 540 s; meant for an H200): the block-sparse backward issue's
# GPU tests on the current defaults: the block-sparse grid in three shards with the sm90ws
# backward / public-API cases (one KV block listed by every query block of a 32768-token
# sequence, GQA 8:1, every KV block listed, poisoned outputs), the deterministic cases (five
# runs bitwise equal), the sm90ws forward cases, and on an H200 the 2.28e9-element
# deterministic case with the fixed-point dQ.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/gpu_s62_c.sh [seconds]
. "$(dirname "$0")/gpu_lib.sh" s62_c "${1:-540}"
gpu_info
T=$(( $(left) - 20 ))
bsa_issue_tests $T
large_det_on_h200
t done
cd $OUT && tar czf s62_c.tgz s62_c && rm -rf s62_c
