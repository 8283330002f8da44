#!/usr/bin/env bash
# session 18, device call 4: the new default forward against the static alternating deal
# (two readings each) on the five HSTU forward cases, plus B=32 L=1024 full mask and fwd+bwd.
set -u
O=${OUT:-./gpu_out}; mkdir -p $O/r
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
start=$SECONDS
t() { echo "[$((SECONDS - start))s] $*" >> $O/r/timeline.txt; }
W=JAX_SPARSE_ATTN_HSTU_WS
V=(--variant "" --variant "$W=static")
timeout 300 python3 benchmarks/hstu_bench.py --case 32x1024-causal --case jagged32-causal --case 8x4096-causal --case 8x4096-causal-d64 --case 8x4096-causal-d256 --case 8x4096-full --no-bwd "${V[@]}" "${V[@]}" "${V[@]}" --iters 30 --out $O/r/default_vs_static.json > $O/r/default_vs_static.txt 2>&1; t "bench rc=$?"
cd $O && tar czf r.tgz r && rm -rf r
