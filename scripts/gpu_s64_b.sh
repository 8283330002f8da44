#!/usr/bin/env bash
# Session 64's correctness sweep of the block-sparse backward on its current default (the
# bucket split of long K->Q lists, autobuckets) over the GPU test files that the floor calls
# do not run: the fixed-point deterministic dQ, pack_gqa, split KV, the K->Q list kernel, the
# BSA cases of the dQ writer file, the extra options, the bucket cases and the fuzz cases.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/gpu_s64_b.sh [seconds]
. "$(dirname "$0")/gpu_lib.sh" s64_b "${1:-540}"
gpu_info
T=$(( $(left) - 20 ))
bsa_sweep_tests_bg
bg_test kq tests/test_gpu_kq_lists.py ""
bg_test writer tests/test_gpu_dq_writer.py "bsa"
bg_test buckets tests/test_gpu_bsa_buckets.py ""
wait; t "tests"
report_tests
t done
cd $OUT && tar czf s64_b.tgz s64_b && rm -rf s64_b
