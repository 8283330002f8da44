#!/usr/bin/env bash
# device call 4 (next session): deterministic backwards with and without the dQ writer warp
# (JAX_SPARSE_ATTN_DET_WRITER), benchmarks only (after c1.sh's tests passed)
set -u
O=${OUT:-./gpu_out}; mkdir -p $O
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
start=$SECONDS
t() { echo "[$((SECONDS - start))s] $*" >> $O/timeline.txt; }
timeout 150 python3 -m benchmarks.bsa_bench --table ";deterministic=1;deterministic=1,JAX_SPARSE_ATTN_DET_WRITER=1" --table-pass bwd --rows 0,3,6,7 --out $O/bsa_det.json > $O/bsa_det.txt 2>&1; t "bsa det bench rc=$?"
timeout 170 python3 benchmarks/hstu_bench.py --case 8x4096-causal --case 8x4096-full --case jagged32-causal --case 8x4096-causal-d64 --bwd-only --deterministic --variant "" --variant "JAX_SPARSE_ATTN_DET_WRITER=1" --iters 20 --out $O/hstu_det.json > $O/hstu_det.txt 2>&1; t "hstu det bench rc=$?"
