#!/usr/bin/env bash
# session 23 call 3: wgskip (a consumer warpgroup whose keys are hidden from a whole query
# tile skips the step's GEMMs but dQ): HSTU grid, bwd batches, deterministic tests with it;
# timing against the default
set -u
O=${OUT:-./gpu_out}; mkdir -p $O/r
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
start=$SECONDS
t() { echo "[$((SECONDS - start))s] $*" >> $O/r/timeline.txt; }
PYT="python3 -m pytest -m gpu -q -rA -p no:cacheprovider"
T=330
W=JAX_SPARSE_ATTN_HSTU_BWD_WS
for i in 0 1 2 3; do (timeout $T env HSTU_TEST_BWD_WS=wgskip HSTU_TEST_SHARD=$i/4 $PYT -k TestHSTUKernelGrid tests/test_gpu_hstu.py > $O/r/t_grid_$i.txt 2>&1; t "grid wgskip $i: $(tail -1 $O/r/t_grid_$i.txt)") & done
for i in 0 1; do (timeout $T env HSTU_TEST_BWD_WS=wgskip HSTU_TEST_BWD=sm90 HSTU_TEST_SHARD=$i/2 $PYT -k bwd_batches tests/test_gpu_hstu.py > $O/r/t_bwdb_$i.txt 2>&1; t "bwd batches wgskip $i: $(tail -1 $O/r/t_bwdb_$i.txt)") & done
(timeout $T env $W=wgskip $PYT -k "test_hstu_bwd_deterministic and d128" tests/test_gpu_hstu.py > $O/r/t_det.txt 2>&1; t "det wgskip: $(tail -1 $O/r/t_det.txt)") &
wait
grep -h "FAILED\|^E  " $O/r/t_*.txt | head -20 >> $O/r/timeline.txt
timeout 200 python3 benchmarks/hstu_bench.py --case 32x1024-causal --case jagged32-causal --case 8x4096-causal --bwd-only --variant "" --variant "$W=wgskip" --variant "" --variant "$W=wgskip" --iters 20 --out $O/r/wgskip.json > $O/r/wgskip.txt 2>&1; t "wgskip bench rc=$?"
timeout 100 python3 benchmarks/hstu_bench.py --case 32x1024-causal --case jagged32-causal --bwd-only --deterministic --variant "" --variant "$W=wgskip" --iters 20 --out $O/r/wgskip_det.json > $O/r/wgskip_det.txt 2>&1; t "wgskip det bench rc=$?"
cd $O && tar czf r.tgz r && rm -rf r
