#!/usr/bin/env bash
# snake scheduler (HSTU fwd): bench default vs snake, GPU tests with snake; GPU grids under the current defaults
set -u
O=${OUT:-./gpu_out}; mkdir -p $O/r
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
start=$SECONDS
t() { echo "[$((SECONDS - start))s] $*" >> $O/r/timeline.txt; }
timeout 120 python3 benchmarks/hstu_bench.py --case 8x4096-causal --case jagged32-causal --case 32x1024-causal --case 8x4096-causal-d64 --case 8x4096-causal-d256 --no-bwd --variant "" --variant "JAX_SPARSE_ATTN_HSTU_WS=snake" --variant "" --variant "JAX_SPARSE_ATTN_HSTU_WS=snake" --iters 30 --out $O/r/snake.json > $O/r/snake.txt 2>&1; t "snake bench rc=$?"
PYT="python3 -m pytest -m gpu -v -p no:cacheprovider"
T=440
timeout $T env HSTU_TEST_SM90=sm90ws HSTU_TEST_WS=snake $PYT -k sm90ws_batches tests/test_gpu_hstu.py > $O/r/t_snake_ws.txt 2>&1 &
for i in 0 1; do timeout $T env BSA_TEST_SHARD=$i/2 $PYT tests/test_gpu_bsa.py -k "not sm90ws" > $O/r/t_bsa_$i.txt 2>&1 & done
for i in 0 1; do timeout $T env HSTU_TEST_BWD=sm90 HSTU_TEST_SHARD=$i/4 $PYT -k "BackwardImpls or bwd_batches" tests/test_gpu_hstu.py > $O/r/t_bwd90_$i.txt 2>&1 & done
wait; t "tests"
for f in $O/r/t_*.txt; do echo "$(basename $f): passed=$(grep -c PASSED $f) failed=$(grep -c FAILED $f) skipped=$(grep -c SKIPPED $f) | $(tail -1 $f | cut -c1-150)" >> $O/r/timeline.txt; done
cd $O && tar czf r.tgz r && rm -rf r
