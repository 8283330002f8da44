#!/usr/bin/env bash
# Session 49's HSTU call (about 180 s, any Hopper GPU; ratios within the call): (1) the HSTU
# backward 8x4096 and 32x1024 causal (D 128): the default (no dQ writer warp at D <= 128),
# the writer (JAX_SPARSE_ATTN_DQ_WRITER=on), the writer with hstu_bwd_ws=wghand, the
# default again; (2) tests/test_gpu_dq_writer.py -k wghand in two processes, and the
# block-sparse fuzz cases (lse cotangents among them) with bsa_bwd_ws=ldscale, then the
# ldscale variant cases.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/gpu_s49_b.sh [seconds]
. "$(dirname "$0")/gpu_lib.sh" s49b_hstu "${1:-180}"
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv > $O/gpu.txt 2>&1
timeout 80 python3 benchmarks/hstu_bench.py --case 8x4096-causal --case 32x1024-causal \
  --bwd-only --variant '' --variant JAX_SPARSE_ATTN_DQ_WRITER=on \
  --variant JAX_SPARSE_ATTN_DQ_WRITER=on,JAX_SPARSE_ATTN_HSTU_BWD_WS=wghand --variant '' \
  --out $O/hstu.json > $O/hstu.txt 2>&1
t "hstu bwd rc=$?"; grep -i "bwd" $O/hstu.txt | tail -8
T=$(( $(left) - 5 ))
timeout $T $PYT tests/test_gpu_dq_writer.py -k "wghand and not long" > $O/t_wg.txt 2>&1 &
timeout $T $PYT tests/test_gpu_dq_writer.py -k "wghand_long" > $O/t_wglong.txt 2>&1 &
( JAX_SPARSE_ATTN_BSA_BWD_WS=ldscale timeout $T $PYT tests/test_gpu_fuzz.py -k bsa \
  > $O/t_ldfuzz.txt 2>&1
  timeout $(( $(left) - 5 )) $PYT tests/test_gpu_bwd_variants.py -k ldscale > $O/t_ld.txt 2>&1 ) &
wait
for f in wg wglong ldfuzz ld; do t "$f: $(tail -1 $O/t_$f.txt)"; done
grep -h "^FAILED\|^ERROR\|Timeout\|timed out" $O/t_*.txt | head -20
