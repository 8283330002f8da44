#!/usr/bin/env bash
# session 25 call 4: bsa_bwd_ws=dqalt (blk 128: the consumer warpgroups take turns computing a
# step's whole dQ): timing against the default in the same process (nvidia-smi sampling clocks,
# power and throttle reasons meanwhile), the training step at B=8 L=4096, then the GPU tests
# of dqalt
set -u
O=${OUT:-./gpu_out}; mkdir -p $O/r
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
start=$SECONDS
t() { echo "[$((SECONDS - start))s] $*" >> $O/r/timeline.txt; }
PYT="python3 -m pytest -m gpu -q -rA -p no:cacheprovider"
W=JAX_SPARSE_ATTN_BSA_BWD_WS
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active --format=csv -lms 200 > $O/r/smi.csv 2>&1 &
SMI=$!
t "bench start"
timeout 110 python3 -m benchmarks.bsa_bench --table ";$W=dqalt;;$W=dqalt" --table-pass bwd --rows 3,4 --out $O/r/bsa_dqalt.json > $O/r/bsa_dqalt.txt 2>&1; t "bench dqalt rc=$?"
kill $SMI
timeout 80 python3 benchmarks/hstu_bench.py --case 8x4096-causal --case 8x4096-causal-d64 --case 8x4096-causal-d256 --iters 20 --out $O/r/train_step.json > $O/r/train_step.txt 2>&1; t "train step rc=$?"
T=190
(timeout $T $PYT tests/test_gpu_bwd_variants.py -k dqalt > $O/r/t_dqalt.txt 2>&1; t "dqalt variants: $(tail -1 $O/r/t_dqalt.txt)") &
for i in 0 1 2; do (timeout $T env BSA_TEST_IMPLS=dqalt,nodefault BSA_TEST_SHARD=$i/3 $PYT tests/test_gpu_bsa.py -k "Grid" > $O/r/t_bsa_alt_$i.txt 2>&1; t "bsa grid dqalt $i: $(tail -1 $O/r/t_bsa_alt_$i.txt)") & done
wait
grep -h "FAILED\|^E  " $O/r/t_*.txt | head -20 >> $O/r/timeline.txt
