#!/usr/bin/env bash
# Session 65, one call (about 480 s): the GPU tests of the block-sparse backward with the
# bucket split's work items from the K->Q list launch (`bsa_kq_impl=items`, now the
# default): the list launch's own tests, the bucket split's tests and the block-sparse grid
# with the sm90ws backward / public-API cases (bsa_grid_bg).
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/gpu_s65_a.sh [seconds]
. "$(dirname "$0")/gpu_lib.sh" s65_a "${1:-480}"
gpu_info
T=$(( $(left) - 40 ))
bg_test kq tests/test_gpu_kq_lists.py ""
bg_test buckets tests/test_gpu_bsa_buckets.py ""
bsa_grid_bg $T
wait; t "tests"
report_tests
t done
cd $OUT && tar czf s65_a.tgz s65_a && rm -rf s65_a
