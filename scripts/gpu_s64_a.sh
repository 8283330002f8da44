#!/usr/bin/env bash
# Session 64's first call (about 580 s; meant for an H200, where the block-sparse floors are
# defined): the block-sparse issues' floor rows on the current defaults (the backward with
# the bucket split, `autobuckets`, and without it, `nobuckets`; the deterministic ratio; the
# forward), then their GPU tests (the grid with the sm90ws backward / public-API cases, the
# deterministic cases, the sm90ws forward cases) and, on an H200, the 2.28e9-element
# deterministic case.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/gpu_s64_a.sh [seconds]
. "$(dirname "$0")/gpu_lib.sh" s64_a "${1:-580}"
gpu_info
bsa_floor_benches
T=$(( $(left) - 70 ))
if [ "$T" -gt 150 ]; then
  bsa_issue_tests $T
fi
large_det_on_h200
t done
cd $OUT && tar czf s64_a.tgz s64_a && rm -rf s64_a
