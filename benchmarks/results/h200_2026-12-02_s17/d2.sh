#!/usr/bin/env bash
# dv_early: benchmarks off vs on (BSA sm90ws bwd, HSTU sm90 bwd D<=128), then the fuzz test under the new default
set -u
O=${OUT:-./gpu_out}; mkdir -p $O/r
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
start=$SECONDS
t() { echo "[$((SECONDS - start))s] $*" >> $O/r/timeline.txt; }
timeout 150 python3 -m benchmarks.bsa_bench --table "JAX_SPARSE_ATTN_DV_EARLY=off;JAX_SPARSE_ATTN_DV_EARLY=on" --table-pass bwd --rows 0,3,5,6 --out $O/r/bsa_bwd.json > $O/r/bsa_bwd_bench.txt 2>&1; t "bsa bench rc=$?"
timeout 150 python3 benchmarks/hstu_bench.py --case 8x4096-causal --case 32x1024-causal --case jagged32-causal --case 8x4096-causal-d64 --bwd-only --variant "JAX_SPARSE_ATTN_DV_EARLY=off" --variant "JAX_SPARSE_ATTN_DV_EARLY=on" --iters 20 --out $O/r/hstu_bwd.json > $O/r/hstu_bwd_bench.txt 2>&1; t "hstu bench rc=$?"
timeout 200 python3 -m pytest -m gpu -q -n 4 tests/test_gpu_fuzz.py > $O/r/t_fuzz.txt 2>&1; t "fuzz rc=$? $(tail -1 $O/r/t_fuzz.txt)"
cd $O && tar czf r.tgz r && rm -rf r
