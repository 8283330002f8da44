#!/usr/bin/env bash
# Session 61's first call (about 540 s): the block-sparse backward floor rows on the current
# defaults, the deterministic mode now with the warp-uniform warpgroup index (`wguni`) by
# default, and `fixemu=4` / `fixemu=8` against it; the forward floor rows; then the
# deterministic grid of tests/test_gpu_bsa.py on the new default, `fixemu=N` bit for bit
# against it, and `dqalias` with the fixed-point dQ at blk 128.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/gpu_s61_a.sh [seconds]
. "$(dirname "$0")/gpu_lib.sh" s61_a "${1:-540}"
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv > $O/gpu.txt 2>&1
cat $O/gpu.txt
W=JAX_SPARSE_ATTN_BSA_BWD_WS
bench bwd 150 bwd 0,2,3,4,5,6 ";"
bench det 130 bwd 3,4 ";deterministic=1;deterministic=1,$W=fixemu=4;deterministic=1,$W=fixemu=8;"
bench fwd 80 fwd 0,1,2,3,4,5,6 ";"
T=$(( $(left) - 15 ))
if [ "$T" -gt 60 ]; then
  det_tests_bg $T
  bg_test fixemu tests/test_gpu_dq_fixed.py "fixemu"
  bg_test alias128 tests/test_gpu_bsa_dqalias.py "deterministic and blk128"
  wait; t "tests"
  report_tests
fi
t done
cd $OUT && tar czf s61_a.tgz s61_a && rm -rf s61_a
