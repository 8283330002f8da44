#!/usr/bin/env bash
# new defaults (dq_writer auto: BSA sm90ws bwd + HSTU D256; det_writer at HSTU D256): GPU tests, then
# benchmarks of the deterministic HSTU D256 backward (writer on/off) and the non-det defaults
set -u
O=${OUT:-./gpu_out}; mkdir -p $O/r
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
start=$SECONDS
t() { echo "[$((SECONDS - start))s] $*" >> $O/r/timeline.txt; }
T=270
timeout $T python3 -m pytest -m gpu -q tests/test_gpu_dq_writer.py -k "hstu" > $O/r/t_w_hstu.txt 2>&1 &
timeout $T python3 -m pytest -m gpu -q tests/test_gpu_dq_writer.py -k "bsa" > $O/r/t_w_bsa.txt 2>&1 &
timeout $T python3 -m pytest -m gpu -q tests/test_gpu_det_writer.py tests/test_gpu_hstu_bwd_d256.py > $O/r/t_det_d256.txt 2>&1 &
timeout $T python3 -m pytest -m gpu -q tests/test_gpu_bsa.py -k "sm90ws_backward or deterministic" > $O/r/t_bsa_bwd.txt 2>&1 &
timeout $T python3 -m pytest -m gpu -q tests/test_gpu_bsa_dqalias.py tests/test_gpu_bsa_dqearly.py > $O/r/t_alias_early.txt 2>&1 &
timeout $T python3 -m pytest -m gpu -q tests/test_gpu_bsa.py -k "TestBSAKernelGrid" > $O/r/t_bsa_grid.txt 2>&1 &
for i in 0 1; do
HSTU_TEST_BWD=sm90 HSTU_TEST_SHARD=$i/2 timeout $T python3 -m pytest -m gpu -q tests/test_gpu_hstu.py -k "bwd_batches or gqa" > $O/r/t_hstu_s$i.txt 2>&1 &
done
wait; t "tests"; for f in t_w_hstu t_w_bsa t_det_d256 t_bsa_bwd t_alias_early t_bsa_grid t_hstu_s0 t_hstu_s1; do echo "$f: $(tail -1 $O/r/$f.txt)" >> $O/r/timeline.txt; done
timeout 100 python3 benchmarks/hstu_bench.py --case 8x4096-causal-d256 --case jagged32-causal --bwd-only --deterministic --variant "" --variant "JAX_SPARSE_ATTN_DET_WRITER=0" --iters 20 --out $O/r/hstu_det.json > $O/r/hstu_det_bench.txt 2>&1; t "hstu det bench rc=$?"
timeout 100 python3 benchmarks/hstu_bench.py --case 8x4096-causal-d256 --case 8x4096-causal --bwd-only --variant "" --variant "JAX_SPARSE_ATTN_DQ_WRITER=off" --iters 20 --out $O/r/hstu_nd.json > $O/r/hstu_nd_bench.txt 2>&1; t "hstu nd bench rc=$?"
cd $O && tar czf r.tgz r && rm -rf r
