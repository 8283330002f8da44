#!/usr/bin/env bash
# session 23 call 4: wgskip rebuilt (the whole step duplicated, each variant ending with no
# wgmma in flight) and revheads (the dq reordering kernel reads the heads last to first):
# HSTU grid, bwd batches, deterministic tests with both; timing; per-kernel traces
set -u
O=${OUT:-./gpu_out}; mkdir -p $O/r
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
start=$SECONDS
t() { echo "[$((SECONDS - start))s] $*" >> $O/r/timeline.txt; }
PYT="python3 -m pytest -m gpu -q -rA -p no:cacheprovider"
T=300
W=JAX_SPARSE_ATTN_HSTU_BWD_WS
for i in 0 1 2 3; do (timeout $T env HSTU_TEST_BWD_WS=wgskip,revheads HSTU_TEST_SHARD=$i/4 $PYT -k TestHSTUKernelGrid tests/test_gpu_hstu.py > $O/r/t_grid_$i.txt 2>&1; t "grid wgskip,revheads $i: $(tail -1 $O/r/t_grid_$i.txt)") & done
for i in 0 1; do (timeout $T env HSTU_TEST_BWD_WS=wgskip,revheads HSTU_TEST_BWD=sm90 HSTU_TEST_SHARD=$i/2 $PYT -k bwd_batches tests/test_gpu_hstu.py > $O/r/t_bwdb_$i.txt 2>&1; t "bwd batches wgskip,revheads $i: $(tail -1 $O/r/t_bwdb_$i.txt)") & done
(timeout $T env $W=wgskip,revheads $PYT -k "test_hstu_bwd_deterministic and (d128 or d64)" tests/test_gpu_hstu.py > $O/r/t_det.txt 2>&1; t "det wgskip,revheads: $(tail -1 $O/r/t_det.txt)") &
wait
grep -h "FAILED\|^E  " $O/r/t_*.txt | head -20 >> $O/r/timeline.txt
timeout 220 python3 benchmarks/hstu_bench.py --case 32x1024-causal --case jagged32-causal --case 8x4096-causal --bwd-only --variant "" --variant "$W=wgskip" --variant "$W=revheads" --variant "$W=wgskip,revheads" --variant "" --variant "$W=wgskip" --iters 20 --out $O/r/v2.json > $O/r/v2.txt 2>&1; t "bench rc=$?"
timeout 90 python3 benchmarks/hstu_bench.py --case 32x1024-causal --case jagged32-causal --bwd-only --deterministic --variant "" --variant "$W=wgskip" --iters 20 --out $O/r/v2_det.json > $O/r/v2_det.txt 2>&1; t "det bench rc=$?"
for v in "" "wgskip" "revheads"; do timeout 40 env $W=$v python3 scripts/gpu_trace.py --case hstu_bwd_32x1024 --iters 20 --out $O/r/trace_${v:-default}.json > $O/r/trace_${v:-default}.txt 2>&1; t "trace $v rc=$?"; done
cd $O && tar czf r.tgz r && rm -rf r
