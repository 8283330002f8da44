#!/usr/bin/env bash
# The sm90ws forward without the XLA clamps of its metadata before the kernel (the kernel
# clamps every value it reads; `xlaclamp` keeps the clamps): the garbage-metadata cases, the
# block-sparse grid and the sm90ws forward cases on the new default, then per-kernel traces
# of the blk64 12.5 % / 5 % forward and the forward rows, default against xlaclamp.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/gpu_s68_c.sh [seconds]
. "$(dirname "$0")/gpu_lib.sh" s68_c "${1:-400}"
gpu_info
T=200
bg_test garbage tests/test_gpu_bsa.py "garbage_metadata"
bsa_grid_bg 200
ws_fwd_tests_bg
wait; t "tests"
report_tests
trace_variant def "X=1" bsa_fwd_blk64_5 bsa_fwd_blk64
trace_variant xla "JAX_SPARSE_ATTN_BSA_WS=xlaclamp" bsa_fwd_blk64_5 bsa_fwd_blk64
grep -E "^==|us  x" "$O"/trace_*.txt | head -40
bench fwd 150 fwd 1,0,2,5,6 ";JAX_SPARSE_ATTN_BSA_WS=xlaclamp"
t done
# the device tool returns a few files per call: one archive of the logs
tar czf "$O/../s68_c.tgz" -C "$O" . && rm -rf "$O"
