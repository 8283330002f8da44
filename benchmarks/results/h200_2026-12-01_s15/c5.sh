#!/usr/bin/env bash
# defaults flipped (dqlate at BSA blk64/D128, tile dQ at HSTU D=256, det_writer on): GPU tests
# under the new defaults, then benchmarks default vs the old behaviour
set -u
O=${OUT:-./gpu_out}; mkdir -p $O
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
start=$SECONDS
t() { echo "[$((SECONDS - start))s] $*" >> $O/timeline.txt; }
timeout 330 python3 -m pytest -m gpu -q tests/test_gpu_bsa.py -k "sm90ws_backward or deterministic" > $O/bsa_bwd.txt 2>&1 &
timeout 330 python3 -m pytest -m gpu -q tests/test_gpu_bsa.py -k "TestBSAKernelGrid" > $O/bsa_grid.txt 2>&1 &
timeout 330 python3 -m pytest -m gpu -q tests/test_gpu_bsa_dqearly.py tests/test_gpu_det_writer.py > $O/early_nowriter.txt 2>&1 &
timeout 330 python3 -m pytest -m gpu -q tests/test_gpu_hstu_bwd_d256.py > $O/hstu_d256.txt 2>&1 &
for i in 0 1 2; do
HSTU_TEST_BWD=sm90 HSTU_TEST_SHARD=$i/3 timeout 330 python3 -m pytest -m gpu -q tests/test_gpu_hstu.py -k "bwd_batches or Deterministic or bwd_deterministic" > $O/hstu_bwd_s$i.txt 2>&1 &
done
wait; t "tests"; for f in bsa_bwd bsa_grid early_nowriter hstu_d256 hstu_bwd_s0 hstu_bwd_s1 hstu_bwd_s2; do echo "$f: $(tail -1 $O/$f.txt)" >> $O/timeline.txt; done
timeout 120 python3 benchmarks/hstu_bench.py --case 8x4096-causal --case jagged32-causal --case 8x4096-causal-d64 --case 8x4096-causal-d256 --bwd-only --deterministic --variant "" --variant "JAX_SPARSE_ATTN_DET_WRITER=0" --iters 20 --out $O/hstu_det.json > $O/hstu_det_bench.txt 2>&1; t "hstu det bench rc=$?"
timeout 150 python3 -m benchmarks.bsa_bench --table ";JAX_SPARSE_ATTN_BSA_BWD_WS=dqearly;deterministic=1" --table-pass bwd --rows 0,1,2,3,5,6 --out $O/bsa_bwd.json > $O/bsa_bwd_bench.txt 2>&1; t "bsa bench rc=$?"
