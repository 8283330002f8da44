#!/usr/bin/env bash
# session 23 call 2: auto order (lpt for deterministic D <= 64) and the chunked hlpt
# schedule of the HSTU backward: tests, then timing
set -u
O=${OUT:-./gpu_out}; mkdir -p $O/r
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
start=$SECONDS
t() { echo "[$((SECONDS - start))s] $*" >> $O/r/timeline.txt; }
PYT="python3 -m pytest -m gpu -q -rA -p no:cacheprovider"
T=300
W=JAX_SPARSE_ATTN_HSTU_BWD_WS
(timeout $T $PYT -k test_hstu_schedule_kernel tests/test_gpu_hstu.py > $O/r/t_sched.txt 2>&1; t "sched: $(tail -1 $O/r/t_sched.txt)") &
(timeout $T $PYT -k test_hstu_bwd_deterministic tests/test_gpu_hstu.py > $O/r/t_det.txt 2>&1; t "det: $(tail -1 $O/r/t_det.txt)") &
(timeout $T env $W=chunk=64 $PYT -k "test_hstu_bwd_deterministic and causal" tests/test_gpu_hstu.py > $O/r/t_det_chunk.txt 2>&1; t "det chunk=64: $(tail -1 $O/r/t_det_chunk.txt)") &
for i in 0 1; do (timeout $T env $W=chunk=64 HSTU_TEST_BWD=sm90 HSTU_TEST_SHARD=$i/2 $PYT -k bwd_batches tests/test_gpu_hstu.py > $O/r/t_bwdb_chunk_$i.txt 2>&1; t "bwd batches chunk=64 $i: $(tail -1 $O/r/t_bwdb_chunk_$i.txt)") & done
wait
grep -h "FAILED\|^E  " $O/r/t_*.txt | head -20 >> $O/r/timeline.txt
R=JAX_SPARSE_ATTN_HSTU_BWD_ORDER
timeout 240 python3 benchmarks/hstu_bench.py --case 32x1024-causal --case jagged32-causal --case 8x4096-causal --case 8x4096-causal-d64 --case 8x4096-causal-d256 --bwd-only --variant "" --variant "$W=chunk=4096" --variant "$W=chunk=16384" --variant "$W=chunk=65536" --variant "$R=seq" --variant "" --iters 20 --out $O/r/chunk.json > $O/r/chunk.txt 2>&1; t "chunk bench rc=$?"
timeout 90 python3 benchmarks/hstu_bench.py --case 8x4096-causal-d64 --case jagged32-causal --bwd-only --deterministic --variant "" --variant "$R=hlpt" --iters 20 --out $O/r/det_auto.json > $O/r/det_auto.txt 2>&1; t "det auto rc=$?"
cd $O && tar czf r.tgz r && rm -rf r
