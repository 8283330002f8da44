#!/usr/bin/env bash
# Session 62's fifth call (about 380 s): where the bucket split's cost on random lists goes
# (per-kernel traces of S 32768 with 2 heads, random and hot lists, unsplit and buckets=64)
# and whether capping the extra work items per (batch, KV head) (`bucketx=M`) removes it
# (rows 4 and 8, random and hot lists).
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/gpu_s62_e.sh [seconds]
. "$(dirname "$0")/gpu_lib.sh" s62_e "${1:-380}"
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,memory.total --format=csv > $O/gpu.txt 2>&1
cat $O/gpu.txt
W=JAX_SPARSE_ATTN_BSA_BWD_WS
trace_variant base X=1 bsa_bwd_s32768_h2 bsa_bwd_s32768_h2_hot
trace_variant b64 $W=buckets=64 bsa_bwd_s32768_h2 bsa_bwd_s32768_h2_hot
trace_variant b64x8 $W=buckets=64,bucketx=8 bsa_bwd_s32768_h2 bsa_bwd_s32768_h2_hot
for f in base b64 b64x8; do echo "== $f"; grep -A6 "^==" $O/trace_$f.txt | cut -c1-140; done
bench rnd 100 bwd 4,8 ";$W=buckets=64;$W=buckets=64+bucketx=8;$W=buckets=64+bucketx=32;"
timeout 100 python3 -m benchmarks.bsa_bench --table-pass bwd --rows 4,8 --timing both \
  --lists hot --table ";$W=buckets=64;$W=buckets=64+bucketx=8;$W=buckets=64+bucketx=32;" \
  --out $O/hot.json > $O/hot.txt 2>&1
t "hot rc=$?"; grep -v "^wrote" $O/hot.txt
t done
cd $OUT && tar czf s62_e.tgz s62_e && rm -rf s62_e
