#!/usr/bin/env bash
# session 20, call D: GPU tests of the new defaults (wg3 in fp16, split_wait at BSA blk64 D128)
# and the opt-in splitwait on the HSTU sm90ws batches, then the BSA forward table
set -u
O=${OUT:-./gpu_out}; mkdir -p $O/r
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
start=$SECONDS
t() { echo "[$((SECONDS - start))s] $*" >> $O/r/timeline.txt; }
PYT="python3 -m pytest -m gpu -q -rA -p no:cacheprovider"
timeout 400 $PYT -k "three_consumer" tests/test_gpu_hstu.py > $O/r/t_wg3.txt 2>&1 &
for i in 0 1; do timeout 400 env HSTU_TEST_SM90=sm90ws HSTU_TEST_WS=splitwait HSTU_TEST_SHARD=$i/2 $PYT -k sm90ws_batches tests/test_gpu_hstu.py > $O/r/t_split_$i.txt 2>&1 & done
PARTS="hstu bsa bsa_ws" HSTU_SHARDS=5 BSA_SHARDS=3 T=400 OUT=$O/grid bash tests/gpu_grids.sh > /dev/null 2>&1
wait; t "tests"
B=JAX_SPARSE_ATTN_BSA_WS
timeout 100 python3 -m benchmarks.bsa_bench --table "$B=;$B=nosplitwait" --rows 0,1,2,5,7 --out $O/r/bsa_table.json > $O/r/bsa_table.txt 2>&1; t "bsa rc=$?"
cd $O && tar czf r.tgz r grid 2>/dev/null; rm -rf r grid
