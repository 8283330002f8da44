#!/usr/bin/env bash
# dq_writer: smoke, benchmarks default vs JAX_SPARSE_ATTN_DQ_WRITER=1, then the GPU tests
set -u
O=${OUT:-./gpu_out}; mkdir -p $O/r
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
start=$SECONDS
t() { echo "[$((SECONDS - start))s] $*" >> $O/r/timeline.txt; }
timeout 150 python3 -m pytest -m gpu -q tests/test_gpu_dq_writer.py -k "lens-0-1-63-64-65-0-127-129-d256-causal-clean or bwd_dq_writer[ws-last-block-nan-blk64-d128] or bwd_dq_writer[ws-all-blocks-blk128-d128]" > $O/r/t_smoke.txt 2>&1; t "smoke rc=$? $(tail -1 $O/r/t_smoke.txt)"
timeout 170 python3 benchmarks/hstu_bench.py --case 8x4096-causal-d256 --case 32x1024-causal --case jagged32-causal --case 8x4096-causal --case 8x4096-causal-d64 --bwd-only --variant "" --variant "JAX_SPARSE_ATTN_DQ_WRITER=1" --iters 20 --out $O/r/hstu_bwd.json > $O/r/hstu_bwd_bench.txt 2>&1; t "hstu bench rc=$?"
timeout 160 python3 -m benchmarks.bsa_bench --table ";JAX_SPARSE_ATTN_DQ_WRITER=1" --table-pass bwd --rows 0,1,2,3,5,6,7 --out $O/r/bsa_bwd.json > $O/r/bsa_bwd_bench.txt 2>&1; t "bsa bench rc=$?"
timeout 200 python3 -m pytest -m gpu -q tests/test_gpu_dq_writer.py -k "hstu_bwd_dq_writer and not seeds" > $O/r/t_hstu.txt 2>&1 &
timeout 200 python3 -m pytest -m gpu -q tests/test_gpu_dq_writer.py -k "seeds" > $O/r/t_seeds.txt 2>&1 &
timeout 200 python3 -m pytest -m gpu -q tests/test_gpu_dq_writer.py -k "gqa" > $O/r/t_gqa.txt 2>&1 &
timeout 200 python3 -m pytest -m gpu -q tests/test_gpu_dq_writer.py -k "bsa" > $O/r/t_bsa.txt 2>&1 &
wait; t "tests"; for f in t_hstu t_seeds t_gqa t_bsa; do echo "$f: $(tail -1 $O/r/$f.txt)" >> $O/r/timeline.txt; done
cd $O && tar czf r.tgz r && rm -rf r
