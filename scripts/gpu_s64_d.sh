#!/usr/bin/env bash
# Session 64, one call for an H100 (about 450 s): the GPU tests of the K->Q list launch with
# the bucket split's work items (`bsa_kq_impl=items`, opt-in) next to the block-sparse
# backward's remaining GPU test files on the current default (bsa_sweep_tests_bg), then
# the backward's random-list and hot-list rows with XLA's items (the default) and the
# kernel's.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/gpu_s64_d.sh [seconds]
. "$(dirname "$0")/gpu_lib.sh" s64_d "${1:-450}"
gpu_info
T=$(( $(left) - 190 ))
bg_test kq tests/test_gpu_kq_lists.py ""
bsa_sweep_tests_bg
wait; t "tests"
report_tests
K=JAX_SPARSE_ATTN_BSA_KQ_IMPL
bench rnd 100 bwd 0,2,4 ";$K=items;"
bench hot 60 bwd 0,4,8 ";$K=items" hot
t done
cd $OUT && tar czf s64_d.tgz s64_d && rm -rf s64_d
