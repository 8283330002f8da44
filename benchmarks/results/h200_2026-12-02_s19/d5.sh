#!/usr/bin/env bash
# session 19, device call 5: wg3 (three consumer warpgroups) against the default at D = 64 on
# more lengths (where 192-row tiles win and where they lose), two readings.
set -u
O=${OUT:-./gpu_out}; mkdir -p $O/r
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
W=JAX_SPARSE_ATTN_HSTU_WS
V=(--variant "" --variant "$W=wg3")
timeout 150 python3 benchmarks/hstu_bench.py --case 4x8192-causal-d64 --case 8x4096-causal-d64 --case 16x2048-causal-d64 --case 32x1024-causal-d64 --case 64x512-causal-d64 --case jagged32-causal-d64 --no-bwd "${V[@]}" "${V[@]}" --iters 30 --out $O/r/wg3_lengths.json > $O/r/wg3_lengths.txt 2>&1
python3 .s19/decide_wg3.py $O/r/wg3_lengths.json > $O/r/means.txt 2>&1
cd $O && tar czf r.tgz r && rm -rf r
