#!/usr/bin/env bash
# session 24 call 1: hstu_bwd_ws=epismem check + GPU tests with it, then timing
set -u
O=${OUT:-./gpu_out}; mkdir -p $O/r
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
start=$SECONDS
t() { echo "[$((SECONDS - start))s] $*" >> $O/r/timeline.txt; }
PYT="python3 -m pytest -m gpu -q -rA -p no:cacheprovider"
T=280
W=JAX_SPARSE_ATTN_HSTU_BWD_WS
(timeout 120 python3 benchmarks/results/h200_2026-12-02_s23/epi_check.py > $O/r/epi_check.txt 2>&1; t "check rc=$? $(tail -1 $O/r/epi_check.txt)") &
(timeout $T env $W=epismem $PYT -k test_hstu_bwd_deterministic tests/test_gpu_hstu.py > $O/r/t_det_epi.txt 2>&1; t "det epi: $(tail -1 $O/r/t_det_epi.txt)") &
for i in 0 1; do (timeout $T env HSTU_TEST_BWD_WS=epismem HSTU_TEST_BWD=sm90 HSTU_TEST_SHARD=$i/2 $PYT -k bwd_batches tests/test_gpu_hstu.py > $O/r/t_bwdb_epi_$i.txt 2>&1; t "bwd batches epi $i: $(tail -1 $O/r/t_bwdb_epi_$i.txt)") & done
wait
grep -h "FAILED\|^E  " $O/r/t_*.txt | head -20 >> $O/r/timeline.txt
timeout 150 python3 benchmarks/hstu_bench.py --case 32x1024-causal --case jagged32-causal --case 8x4096-causal --case 8x4096-causal-d64 --bwd-only --variant "" --variant "$W=epismem" --variant "" --variant "$W=epismem" --iters 20 --out $O/r/epi.json > $O/r/epi.txt 2>&1; t "bench rc=$?"
cd $O && tar czf r.tgz r && rm -rf r
