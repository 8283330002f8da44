#!/usr/bin/env bash
# session 20, call E: the fp16 rows of the HSTU grid (D = 64: wg3 now the default in fp16)
set -u
O=${OUT:-./gpu_out}; mkdir -p $O/r
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
PYT="python3 -m pytest -m gpu -v -p no:cacheprovider"
timeout 300 $PYT -k "TestHSTUKernelGrid and floa-d64-w-1_0" tests/test_gpu_hstu.py > $O/r/t_grid_fp16_d64.txt 2>&1 &
timeout 300 $PYT -k "TestHSTUKernelGrid and floa-d64-w-1_-1-func3" tests/test_gpu_hstu.py > $O/r/t_grid_fp16_d64_func.txt 2>&1 &
timeout 300 $PYT -k "TestHSTUKernelGrid and bflo-d64-w-1_0" tests/test_gpu_hstu.py > $O/r/t_grid_bf16_d64.txt 2>&1 &
wait
cd $O && tar czf r.tgz r && rm -rf r
