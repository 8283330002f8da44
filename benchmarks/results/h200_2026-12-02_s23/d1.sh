#!/usr/bin/env bash
# session 23 call 1: launch order of the deterministic HSTU backward (hlpt vs lpt), and the
# default's order at 32x1024
set -u
O=${OUT:-./gpu_out}; mkdir -p $O/r
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
start=$SECONDS
t() { echo "[$((SECONDS - start))s] $*" >> $O/r/timeline.txt; }
R=JAX_SPARSE_ATTN_HSTU_BWD_ORDER
timeout 200 python3 benchmarks/hstu_bench.py --case 8x4096-causal-d64 --case 8x4096-causal --case jagged32-causal --case 8x4096-causal-d256 --bwd-only --deterministic --variant "" --variant "$R=lpt" --variant "" --variant "$R=lpt" --iters 20 --out $O/r/det_order.json > $O/r/det_order.txt 2>&1; t "det order rc=$?"
timeout 100 python3 benchmarks/hstu_bench.py --case 32x1024-causal --bwd-only --variant "" --variant "$R=seq" --variant "$R=lpt" --variant "" --variant "$R=seq" --iters 20 --out $O/r/order_1024.json > $O/r/order_1024.txt 2>&1; t "1024 order rc=$?"
cd $O && tar czf r.tgz r && rm -rf r
