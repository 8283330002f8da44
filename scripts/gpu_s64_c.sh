#!/usr/bin/env bash
# Session 64: the bucket split's work items computed by the K->Q list launch
# (`bsa_kq_impl=items`, opt-in) against XLA's items (the default): the list kernel's GPU
# tests, the backward's random-list and hot-list rows with each, and per-kernel traces of the
# S 32768 H 2 case.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/gpu_s64_c.sh [seconds]
. "$(dirname "$0")/gpu_lib.sh" s64_c "${1:-420}"
gpu_info
T=200
bg_test kq tests/test_gpu_kq_lists.py ""
wait; t "tests"
report_tests
K=JAX_SPARSE_ATTN_BSA_KQ_IMPL
bench rnd 110 bwd 0,2,4,6 ";$K=items;"
timeout 70 python3 -m benchmarks.bsa_bench --table-pass bwd --rows 0,4,8 --timing both \
  --lists hot --table ";$K=items" --out $O/hot.json > $O/hot.txt 2>&1
t "hot rc=$?"; grep -v "^wrote" $O/hot.txt
trace_variant base X=1 bsa_bwd_s32768_h2
trace_variant items $K=items bsa_bwd_s32768_h2
head -8 $O/trace_base.txt $O/trace_items.txt
t done
cd $OUT && tar czf s64_c.tgz s64_c && rm -rf s64_c
