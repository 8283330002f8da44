#!/usr/bin/env bash
# next session, device call 1 (after the cold start): the dynamic deal (hstu_fwd_ws=dynamic)
# against the default alternating deal: correctness first, then the forward bench (two
# readings each), then the HSTU sm90ws batches with it.
set -u
O=${OUT:-./gpu_out}; mkdir -p $O/r
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
start=$SECONDS
t() { echo "[$((SECONDS - start))s] $*" >> $O/r/timeline.txt; }
PYT="python3 -m pytest -m gpu -v -p no:cacheprovider"
timeout 200 $PYT -k dynamic_deal tests/test_gpu_hstu.py > $O/r/t_dynamic.txt 2>&1; t "dynamic test rc=$? $(tail -1 $O/r/t_dynamic.txt | cut -c1-120)"
timeout 150 python3 benchmarks/hstu_bench.py --case 8x4096-causal --case jagged32-causal --case 32x1024-causal --case 8x4096-causal-d64 --case 8x4096-causal-d256 --no-bwd --variant "" --variant "JAX_SPARSE_ATTN_HSTU_WS=dynamic" --variant "" --variant "JAX_SPARSE_ATTN_HSTU_WS=dynamic" --iters 30 --out $O/r/dynamic.json > $O/r/dynamic.txt 2>&1; t "bench rc=$?"
for i in 0 1; do timeout 200 env HSTU_TEST_SM90=sm90ws HSTU_TEST_WS=dynamic HSTU_TEST_SHARD=$i/2 $PYT -k sm90ws_batches tests/test_gpu_hstu.py > $O/r/t_ws_$i.txt 2>&1 & done; wait; t "ws batches"
for f in $O/r/t_*.txt; do echo "$(basename $f): passed=$(grep -c PASSED $f) failed=$(grep -c FAILED $f) | $(tail -1 $f | cut -c1-120)" >> $O/r/timeline.txt; done
cd $O && tar czf r.tgz r && rm -rf r
