#!/usr/bin/env bash
# Session 64, a short call (about 320 s): the bucket split's work items computed by the K->Q
# list launch (`bsa_kq_impl=items`, opt-in) against XLA's items (the default): the list
# kernel's GPU tests, then the backward's blk64 12.5 % and S 32768 rows on random lists and
# the blk64 and S 32768 H 2 rows on hot lists with each.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/gpu_s64_c.sh [seconds]
. "$(dirname "$0")/gpu_lib.sh" s64_c "${1:-320}"
gpu_info
T=$(( $(left) - 150 ))
bg_test kq tests/test_gpu_kq_lists.py ""
wait; t "tests"
report_tests
K=JAX_SPARSE_ATTN_BSA_KQ_IMPL
bench rnd 80 bwd 0,4 ";$K=items;"
bench hot 55 bwd 0,8 ";$K=items" hot
t done
cd $OUT && tar czf s64_c.tgz s64_c && rm -rf s64_c
