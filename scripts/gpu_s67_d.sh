#!/usr/bin/env bash
# Any GPU: the vlag + qahead forward cases (it hung before session 67's fix), the causal
# cases call B did not reach, and the tests session 66 did not reach (scripts/gpu_s66_next.sh
# without the preprocessing cases, which ran in call A): the opt-in forward shapes and the
# last fixed-point dQ cases; five processes at once.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/gpu_s67_d.sh [seconds]
. "$(dirname "$0")/gpu_lib.sh" s67_d "${1:-450}"
gpu_info
T=$(( $(left) - 15 ))
bg_test vq tests/test_gpu_bsa.py "vlag_qahead"
bg_test causal tests/test_gpu_bsa_causal.py "no_mask_needed or decouple or pairwg"
bg_test fwdopt tests/test_gpu_bsa.py "ctas3k1 or pairwg or streamk"
bg_test fx1 tests/test_gpu_dq_fixed.py "nomult1p or test_detfixed_"
bg_test fx2 tests/test_gpu_dq_fixed.py "nowguni"
wait; t "tests"
report_tests
t done
