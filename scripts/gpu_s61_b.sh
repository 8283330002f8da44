#!/usr/bin/env bash
# Session 61's second call (about 480 s): the block-sparse GPU tests on the final defaults
# (`wguni` in both modes; the shared-memory plan that counts the fixed-point multipliers):
# `dqalias` with the fixed-point dQ at blk 128 (failed to compile in the first call), the
# block-sparse grid in three shards with the sm90ws backward / public-API cases, the sm90ws
# forward cases, the fixed-point tests, `nowguni` in deterministic mode at blk 128, and on an H200 the 2.28e9-element deterministic case.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/gpu_s61_b.sh [seconds]
. "$(dirname "$0")/gpu_lib.sh" s61_b "${1:-480}"
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,memory.total --format=csv > $O/gpu.txt 2>&1
cat $O/gpu.txt
T=$(( $(left) - 20 ))
bg_test alias128 tests/test_gpu_bsa_dqalias.py "deterministic and blk128"
bsa_grid_bg $T
ws_fwd_tests_bg
bg_test fixed tests/test_gpu_dq_fixed.py "not fixemu and not nowguni"
bg_test nowguni tests/test_gpu_dq_fixed.py "deterministic_nowguni and blk128"
wait; t "tests"
report_tests
large_det_on_h200
t done
cd $OUT && tar czf s61_b.tgz s61_b && rm -rf s61_b
