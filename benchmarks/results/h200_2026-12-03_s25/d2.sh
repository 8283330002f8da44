#!/usr/bin/env bash
# session 25 call 2: the preprocess launch zeroes the dQ workspace (bsa_pre_impl=kernel) —
# GPU tests (BSA grid in 4 shards, preprocess test), bwd bench default vs delta (XLA memset),
# per-kernel traces of the BSA fwd / bwd calls
set -u
O=${OUT:-./gpu_out}; mkdir -p $O/r
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
start=$SECONDS
t() { echo "[$((SECONDS - start))s] $*" >> $O/r/timeline.txt; }
PYT="python3 -m pytest -m gpu -q -rA -p no:cacheprovider"
T=300
for i in 0 1 2 3; do (timeout $T env BSA_TEST_SHARD=$i/4 $PYT tests/test_gpu_bsa.py > $O/r/t_bsa_$i.txt 2>&1; t "bsa grid $i: $(tail -1 $O/r/t_bsa_$i.txt)") & done
(timeout $T $PYT tests/test_gpu_bwd_variants.py -k bsa > $O/r/t_bsa_var.txt 2>&1; t "bsa variants: $(tail -1 $O/r/t_bsa_var.txt)") &
wait
grep -h "FAILED\|^E  " $O/r/t_*.txt | head -20 >> $O/r/timeline.txt
P=JAX_SPARSE_ATTN_BSA_PRE_IMPL
timeout 200 python3 -m benchmarks.bsa_bench --table ";$P=delta;" --table-pass bwd --rows 0,2,3,4,6,7 --out $O/r/bsa_bwd.json > $O/r/bsa_bwd.txt 2>&1; t "bsa bwd rc=$?"
timeout 120 python3 scripts/gpu_trace.py --case bsa_fwd_blk128 --case bsa_fwd_s32768 --case bsa_bwd_blk128 --case bsa_bwd_s32768 --case bsa_bwd_blk64 --iters 20 --out $O/r/trace_bsa.json > $O/r/trace_bsa.txt 2>&1; t "trace rc=$?"
cd $O && tar czf r.tgz r && rm -rf r
