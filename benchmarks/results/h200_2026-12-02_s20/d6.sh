#!/usr/bin/env bash
# session 20, call F: BSA sm90ws backward with the lse read before the GEMM issue (default now)
# against lselate, then the BSA grid + writer / deterministic tests on the new default
set -u
O=${OUT:-./gpu_out}; mkdir -p $O/r
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
start=$SECONDS
t() { echo "[$((SECONDS - start))s] $*" >> $O/r/timeline.txt; }
B=JAX_SPARSE_ATTN_BSA_BWD_WS
timeout 200 python3 -m benchmarks.bsa_bench --table "$B=lselate;$B=;$B=lselate;$B=" --table-pass bwd --rows 0,1,2,3,4,5,6,7 --out $O/r/bsa_bwd_lse.json > $O/r/bsa_bwd_lse.txt 2>&1; t "bench rc=$?"
PYT="python3 -m pytest -m gpu -q -rA -p no:cacheprovider"
timeout 320 $PYT tests/test_gpu_det_writer.py tests/test_gpu_dq_writer.py -k "bsa" > $O/r/t_writer.txt 2>&1 &
PARTS="bsa" BSA_SHARDS=3 T=320 OUT=$O/grid bash tests/gpu_grids.sh > /dev/null 2>&1
wait; t "tests"
cd $O && tar czf r.tgz r grid 2>/dev/null; rm -rf r grid
