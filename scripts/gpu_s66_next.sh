#!/usr/bin/env bash
# For the next device call (about 450 s): the block-sparse GPU tests that session 66's H200
# calls did not reach: the preprocessing kernel cases and the opt-in forward shapes of
# tests/test_gpu_bsa.py (ctas3k1, pairwg, streamk), and the last 27 cases of
# tests/test_gpu_dq_fixed.py (nomult1p, nowguni, test_detfixed_*), four processes at once.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/gpu_s66_next.sh [seconds]
. "$(dirname "$0")/gpu_lib.sh" s66_next "${1:-450}"
gpu_info
T=$(( $(left) - 20 ))
bg_test pre tests/test_gpu_bsa.py "preprocess_kernel"
bg_test fwdopt tests/test_gpu_bsa.py "ctas3k1 or pairwg or streamk"
bg_test fx1 tests/test_gpu_dq_fixed.py "nomult1p or test_detfixed_"
bg_test fx2 tests/test_gpu_dq_fixed.py "nowguni"
wait; t "tests"
report_tests
t done
cd $OUT && tar czf s66_next.tgz s66_next && rm -rf s66_next
