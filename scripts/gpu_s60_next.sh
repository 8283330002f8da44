#!/usr/bin/env bash
# Session 60's next call (about 540 s; best on an H200): the block-sparse backward floor rows
# on the current defaults (wguni, dqlag, qprobe at blk 128) against `nowguni`, the
# deterministic mode (fixed-point dQ, with and without `wguni` named) against the default,
# `fixemu=4` / `fixemu=8` (the fixed-point conversion by float additions), the forward rows;
# then the deterministic grid with `wguni` named (its GPU tests, which session 60 could not
# run), `dqalias` with the fixed-point dQ at blk 128 (reached by default since session 60,
# not yet run) and `fixemu=N` against the default bit for bit.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/gpu_s60_next.sh [seconds]
. "$(dirname "$0")/gpu_lib.sh" s60_next "${1:-540}"
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv > $O/gpu.txt 2>&1
W=JAX_SPARSE_ATTN_BSA_BWD_WS
bench bwd 120 bwd 0,3,4 ";$W=nowguni;"
bench det 150 bwd 3,4 ";deterministic=1;deterministic=1,$W=wguni;deterministic=1,$W=wguni+fixemu=4;deterministic=1,$W=wguni+fixemu=8;"
bench fwd 80 fwd 0,1,2,3,4,5,6 ";"
T=$(( $(left) - 15 ))
if [ "$T" -gt 60 ]; then
  # (session 61 renamed deterministic_wguni to deterministic_nowguni: wguni is the default)
  bg_test wguni128 tests/test_gpu_dq_fixed.py "deterministic_wguni and blk128"
  bg_test wguni64 tests/test_gpu_dq_fixed.py "deterministic_wguni and blk64"
  bg_test alias128 tests/test_gpu_bsa_dqalias.py "deterministic and blk128"
  bg_test fixemu tests/test_gpu_dq_fixed.py "fixemu"
  wait; t "tests"
  report_tests
fi
t done
cd $OUT && tar czf s60_next.tgz s60_next && rm -rf s60_next
