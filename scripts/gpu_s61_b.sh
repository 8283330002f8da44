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
bg_test fwd tests/test_gpu_bsa.py "test_bsa_sm90ws_forward and not ctas3k1 and not pairwg and not streamk"
bg_test fixed tests/test_gpu_dq_fixed.py "not fixemu and not nowguni"
bg_test nowguni tests/test_gpu_dq_fixed.py "deterministic_nowguni and blk128"
wait; t "tests"
report_tests
T=$(( $(left) - 10 ))
if [ "$T" -gt 60 ] && grep -q H200 $O/gpu.txt; then
  bg_test large tests/test_gpu_large_tensors.py "bsa_deterministic and fixed"
  wait; t "large"; tail -n 3 $O/t_large.txt
fi
t done
cd $OUT && tar czf s61_b.tgz s61_b && rm -rf s61_b
