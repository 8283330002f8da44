#!/usr/bin/env bash
# session 23 call 6: hstu_bwd_ws=epismem (dK / dV through shared memory, coalesced stores):
# bitwise check against the default, then timing
set -u
O=${OUT:-./gpu_out}; mkdir -p $O/r
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 90 python3 benchmarks/results/h200_2026-12-02_s23/epi_check.py > $O/r/epi_check.txt 2>&1; echo "check rc=$?" >> $O/r/epi_check.txt
W=JAX_SPARSE_ATTN_HSTU_BWD_WS
timeout 75 python3 benchmarks/hstu_bench.py --case 32x1024-causal --case jagged32-causal --case 8x4096-causal --case 8x4096-causal-d64 --bwd-only --variant "" --variant "$W=epismem" --iters 20 --out $O/r/epi.json > $O/r/epi.txt 2>&1
cd $O && tar czf r.tgz r && rm -rf r
