#!/usr/bin/env bash
# session 19, device call 1: GPU tests for the commits since 4971523 (qscale, rab keys, deal)
# then the qscale forward against the default on five shapes.
set -u
O=${OUT:-./gpu_out}; mkdir -p $O/r
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
start=$SECONDS
t() { echo "[$((SECONDS - start))s] $*" >> $O/r/timeline.txt; }
PYT="python3 -m pytest -m gpu -v -p no:cacheprovider"
for i in 0 1; do timeout 240 env HSTU_TEST_SM90=sm90ws HSTU_TEST_WS=qscale HSTU_TEST_SHARD=$i/2 $PYT -k sm90ws_batches tests/test_gpu_hstu.py > $O/r/t_qscale_$i.txt 2>&1 & done
timeout 240 $PYT -k "qscale_alpha or dynamic_deal" tests/test_gpu_hstu.py > $O/r/t_alpha_deal.txt 2>&1 &
timeout 240 $PYT -k schedule_kernel tests/test_gpu_hstu.py > $O/r/t_sched.txt 2>&1 &
PARTS=rab RAB_SHARDS=3 T=240 OUT=$O/grid bash tests/gpu_grids.sh > /dev/null 2>&1 &
wait; t "tests: $(grep -c PASSED $O/r/t_*.txt | tr '\n' ' ') failed: $(grep -c 'FAILED\|ERROR' $O/r/t_*.txt | tr '\n' ' ')"
timeout 170 python3 benchmarks/hstu_bench.py --case 8x4096-causal-d64 --case 8x4096-causal --case 32x1024-causal --case jagged32-causal --case 8x4096-causal-d256 --no-bwd --variant "" --variant "JAX_SPARSE_ATTN_HSTU_WS=qscale" --variant "" --variant "JAX_SPARSE_ATTN_HSTU_WS=qscale" --iters 30 --out $O/r/qscale.json > $O/r/qscale.txt 2>&1; t "qscale bench rc=$?"
cd $O && tar czf r.tgz r grid 2>/dev/null; rm -rf r grid
