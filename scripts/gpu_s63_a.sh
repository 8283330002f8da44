#!/usr/bin/env bash
# Session 63's first call (about 560 s): whether the bucket split of long K->Q lists
# (`autobuckets`: at the table's shapes N = 64 to 256, at most 8 to 16 extra items per pair) costs
# anything on random lists now that its work-item metadata
# has no loop (session 62 measured 2-7 % there, the metadata's while loop), on every
# backward floor row and both modes, and what it gains on hot lists (KV block 0 in every
# list); per-kernel traces of the 2-head S 32768 rows; then the bucket GPU tests.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/gpu_s63_a.sh [seconds]
. "$(dirname "$0")/gpu_lib.sh" s63_a "${1:-560}"
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,memory.total --format=csv > $O/gpu.txt 2>&1
cat $O/gpu.txt
W=JAX_SPARSE_ATTN_BSA_BWD_WS
B="$W=autobuckets"
trace_variant base X=1 bsa_bwd_s32768_h2 bsa_bwd_s32768_h2_hot
trace_variant auto $W=autobuckets bsa_bwd_s32768_h2 bsa_bwd_s32768_h2_hot
for f in base auto; do echo "== $f"; grep -A6 "^==" $O/trace_$f.txt | cut -c1-140; done
bench rnd 200 bwd 0,2,3,4,5,6,8 ";$B;"
bench det 90 bwd 0,3,4 "deterministic=1;deterministic=1,$B;deterministic=1"
timeout 100 python3 -m benchmarks.bsa_bench --table-pass bwd --rows 0,4,8 --timing both \
  --lists hot --table ";$B;" --out $O/hot.json > $O/hot.txt 2>&1
t "hot rc=$?"; grep -v "^wrote" $O/hot.txt
T=$(( $(left) - 15 ))
if [ "$T" -gt 90 ]; then
  bg_test buckets tests/test_gpu_bsa_buckets.py "buckets"
  wait; t "tests"; report_tests
fi
t done
cd $OUT && tar czf s63_a.tgz s63_a && rm -rf s63_a
