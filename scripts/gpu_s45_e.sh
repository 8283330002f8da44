#!/usr/bin/env bash
# Session 45's check of the new default: deterministic=True at blk 64 runs the fixed-point dQ
# without any switch. The deterministic cases of tests/test_gpu_bsa.py on the default
# switches, in three processes (blk 64 cases, blk 128 cases, the rest).
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/gpu_s45_e.sh [seconds]
. "$(dirname "$0")/gpu_lib.sh" s45e "${1:-300}"
T=$((BUDGET - 10))
export JAX_SPARSE_ATTN_GPU_TEST_TIMEOUT=150
det_tests_bg $T
wait
for f in 64a 64b 128; do t "$f: $(tail -1 $O/t_$f.txt)"; done
grep -h "^FAILED\|^ERROR\|Timeout\|timed out" $O/t_*.txt | head -20
