#!/usr/bin/env bash
# session 20, device call A: wg3 open points (tests with split keys; fp16 timing)
set -u
O=${OUT:-./gpu_out}; mkdir -p $O/r
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
start=$SECONDS
t() { echo "[$((SECONDS - start))s] $*" >> $O/r/timeline.txt; }
W=JAX_SPARSE_ATTN_HSTU_WS
V=(--variant "$W=wg2" --variant "$W=wg3")
PYT="python3 -m pytest -m gpu -v -p no:cacheprovider"
timeout 240 $PYT -k "three_consumer or dynamic_deal" tests/test_gpu_hstu.py > $O/r/t_wg3.txt 2>&1; t "tests rc=$?"
timeout 150 python3 benchmarks/hstu_bench.py --dtype float16 --case 16x2048-causal-d64 --case 8x4096-causal-d64 --no-bwd "${V[@]}" "${V[@]}" --iters 30 --out $O/r/wg3_fp16.json > $O/r/wg3_fp16.txt 2>&1; t "fp16 rc=$?"
cd $O && tar czf r.tgz r && rm -rf r
