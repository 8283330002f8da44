#!/usr/bin/env bash
# deterministic BSA backward orders with the dQ writer warp (now default) and the HSTU sm90
# backward launch orders at B=32 L=1024 and D=256 (benchmarks only)
set -u
O=${OUT:-./gpu_out}; mkdir -p $O
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
start=$SECONDS
t() { echo "[$((SECONDS - start))s] $*" >> $O/timeline.txt; }
timeout 115 python3 -m benchmarks.bsa_bench --table "deterministic=1;deterministic=1,JAX_SPARSE_ATTN_BSA_BWD_WS=detfull;deterministic=1,JAX_SPARSE_ATTN_BSA_BWD_WS=detkv" --table-pass bwd --rows 0,6,3,7 --out $O/bsa_det_order.json > $O/bsa_det_order.txt 2>&1; t "bsa rc=$?"
timeout 70 python3 benchmarks/hstu_bench.py --case 32x1024-causal --case 8x4096-causal-d256 --bwd-only --variant "" --variant "JAX_SPARSE_ATTN_HSTU_BWD_ORDER=lpt" --variant "JAX_SPARSE_ATTN_HSTU_BWD_ORDER=seq" --iters 20 --out $O/hstu_order.json > $O/hstu_order.txt 2>&1; t "hstu rc=$?"
cd $O && tar czf /tmp/c7.tgz *.txt *.json && mv /tmp/c7.tgz $O/c7.tgz
