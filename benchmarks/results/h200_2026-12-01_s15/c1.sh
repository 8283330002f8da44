#!/usr/bin/env bash
# device call 1 (next session): the dQ writer warp (JAX_SPARSE_ATTN_DET_WRITER), the D = 256
# tile workspace (JAX_SPARSE_ATTN_HSTU_BWD_DQ=tile256) and dqlate (JAX_SPARSE_ATTN_BSA_BWD_WS=dqlate) — GPU tests (5-run bitwise, reference,
# poisoned rows), then benchmarks of each against the default (same call)
set -u
O=${OUT:-./gpu_out}; mkdir -p $O
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
export JAX_SPARSE_ATTN_CACHE_DIR=/tmp/jsa_cache
start=$SECONDS
t() { echo "[$((SECONDS - start))s] $*" >> $O/timeline.txt; }
# a hang (deadlock) shows as rc 124; tests in parallel (3 processes)
timeout 300 python3 -m pytest -m gpu -x -q -s tests/test_gpu_det_writer.py -k bsa > $O/detw_bsa.txt 2>&1 &
timeout 300 python3 -m pytest -m gpu -x -q -s tests/test_gpu_det_writer.py -k hstu > $O/detw_hstu.txt 2>&1 &
timeout 300 python3 -m pytest -m gpu -x -q -s tests/test_gpu_hstu_tile256.py > $O/tile256.txt 2>&1 &
timeout 300 python3 -m pytest -m gpu -x -q -s tests/test_gpu_bsa_dqlate.py > $O/dqlate.txt 2>&1 &
wait; t "tests done"; for f in detw_bsa detw_hstu tile256 dqlate; do echo "$f: $(tail -1 $O/$f.txt)" >> $O/timeline.txt; done
timeout 100 python3 benchmarks/hstu_bench.py --case 8x4096-causal-d256 --bwd-only --variant "" --variant "JAX_SPARSE_ATTN_HSTU_BWD_DQ=tile256" --iters 20 --out $O/hstu_d256.json > $O/hstu_d256.txt 2>&1; t "d256 bench rc=$?"
timeout 120 python3 -m benchmarks.bsa_bench --table ";JAX_SPARSE_ATTN_BSA_BWD_WS=dqlate" --table-pass bwd --rows 0,1,2,5 --out $O/bsa_dqlate.json > $O/bsa_dqlate.txt 2>&1; t "bsa dqlate bench rc=$?"
cd $O && tar czf /tmp/c1.tgz . && mv /tmp/c1.tgz $O/c1.tgz
