#!/usr/bin/env bash
# Session 63's second call (about 400 to 500 s): the block-sparse backward's GPU tests with the
# bucket split of long K->Q lists on by default (autobuckets): the block-sparse grid in three
# shards with the sm90ws backward / public-API cases, the deterministic cases, the bucket
# cases, the causal and fixed-point dQ files; then default vs nobuckets on random and hot
# lists.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/gpu_s63_b.sh [seconds]
. "$(dirname "$0")/gpu_lib.sh" s63_b "${1:-500}"
gpu_info
T=$(( $(left) - 25 ))
bsa_bwd_tests_bg $T
bg_test buckets tests/test_gpu_bsa_buckets.py ""
bg_test causal tests/test_gpu_bsa_causal.py ""
bg_test fixed tests/test_gpu_dq_fixed.py ""
wait; t "tests"
report_tests
W=JAX_SPARSE_ATTN_BSA_BWD_WS
if [ "$(left)" -gt 70 ]; then
  timeout $(( $(left) - 10 )) python3 -m benchmarks.bsa_bench --table-pass bwd --rows 0,4,8 \
    --timing both --lists hot --table ";$W=nobuckets" --out $O/hot.json > $O/hot.txt 2>&1
  t "hot rc=$?"; grep -v "^wrote" $O/hot.txt
fi
t done
cd $OUT && tar czf s63_b.tgz s63_b && rm -rf s63_b
