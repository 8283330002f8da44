#!/usr/bin/env bash
# Session 58's HSTU call (about 200 s, any Hopper GPU; ratios within the call): the HSTU
# backward 8x4096 and 32x1024 causal (D 128) with and without hstu_bwd_ws=qprobe (the next
# step's Q / dO stage tested after the dQ staging stores), interleaved, then its GPU cases.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/gpu_s58_hstu.sh [seconds]
. "$(dirname "$0")/gpu_lib.sh" s58_hstu "${1:-200}"
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv > $O/gpu.txt 2>&1
P=JAX_SPARSE_ATTN_HSTU_BWD_WS=qprobe
timeout 100 python3 benchmarks/hstu_bench.py --case 8x4096-causal --case 32x1024-causal \
  --bwd-only --variant '' --variant $P --variant '' --variant $P \
  --out $O/hstu.json > $O/hstu.txt 2>&1
t "hstu bwd rc=$?"; grep -i "bwd" $O/hstu.txt | tail -8
T=$(( $(left) - 5 ))
timeout $T $PYT tests/test_gpu_bwd_variants.py -k "hstu_bwd_qprobe and clean" > $O/t_q1.txt 2>&1 &
timeout $T $PYT tests/test_gpu_bwd_variants.py -k "hstu_bwd_qprobe and poisoned" > $O/t_q2.txt 2>&1 &
wait
for f in q1 q2; do t "$f: $(tail -1 $O/t_$f.txt)"; done
grep -h "^FAILED\|^ERROR\|Timeout\|timed out" $O/t_*.txt | head -20
cd $OUT && tar czf s58_hstu.tgz s58_hstu && rm -rf s58_hstu
