#!/usr/bin/env bash
# session 20, call C: split_wait (V full barrier re-checked before the PV wait) against
# nosplitwait, BSA and HSTU forwards, same call, alternating order
set -u
O=${OUT:-./gpu_out}; mkdir -p $O/r
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
start=$SECONDS
t() { echo "[$((SECONDS - start))s] $*" >> $O/r/timeline.txt; }
B=JAX_SPARSE_ATTN_BSA_WS
timeout 260 python3 -m benchmarks.bsa_bench --table "$B=nosplitwait;$B=;$B=nosplitwait;$B=" --rows 0,1,2,3,4,5,6 --out $O/r/bsa_sw.json > $O/r/bsa_sw.txt 2>&1; t "bsa rc=$?"
W=JAX_SPARSE_ATTN_HSTU_WS
timeout 300 python3 benchmarks/hstu_bench.py --case 8x4096-causal --case 8x4096-causal-d64 --case 32x1024-causal --case jagged32-causal --case 8x4096-causal-d256 --no-bwd --variant "$W=nosplitwait" --variant "" --variant "$W=nosplitwait" --variant "" --iters 30 --out $O/r/hstu_sw.json > $O/r/hstu_sw.txt 2>&1; t "hstu rc=$?"
cd $O && tar czf r.tgz r && rm -rf r
