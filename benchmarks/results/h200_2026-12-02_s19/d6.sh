#!/usr/bin/env bash
# session 19, device call 6 (final): fp16 P conversion after the PV wait (no C7513) against
# `pearly` (the previous fp16 kernel), then the suites that run the new defaults: the deal
# tests (GQA 4:1 at D = 64 with a 4097-long sequence: wg3 by default), the wg3 tests (default,
# wg2), the fp16 cases of the HSTU grid and of the rab tests, the inference extras, the HSTU
# fuzz tests and the transformation tests.
set -u
O=${OUT:-./gpu_out}; mkdir -p $O/r
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
start=$SECONDS
t() { echo "[$((SECONDS - start))s] $*" >> $O/r/timeline.txt; }
W=JAX_SPARSE_ATTN_HSTU_WS
timeout 70 python3 benchmarks/hstu_bench.py --dtype float16 --case 8x4096-causal --case 8x4096-causal-d64 --case 32x1024-causal --no-bwd --variant "" --variant "$W=pearly" --variant "" --variant "$W=pearly" --iters 30 --out $O/r/fp16.json > $O/r/fp16.txt 2>&1; t "bench rc=$?"
PYT="python3 -m pytest -m gpu -v -p no:cacheprovider"
T=$((250 - SECONDS + start))
timeout $T $PYT -k "dynamic_deal" tests/test_gpu_hstu.py > $O/r/t_deal.txt 2>&1 &
timeout $T $PYT -k "three_consumer or qscale_alpha or (TestHSTUKernelGrid and floa)" tests/test_gpu_hstu.py > $O/r/t_wg3_fp16grid.txt 2>&1 &
timeout $T $PYT -k floa tests/test_gpu_hstu_rab.py > $O/r/t_rab_fp16.txt 2>&1 &
timeout $T $PYT tests/test_gpu_hstu_inference_extra.py > $O/r/t_infer.txt 2>&1 &
timeout $T $PYT -k hstu tests/test_gpu_fuzz.py > $O/r/t_fuzz.txt 2>&1 &
timeout $T $PYT tests/test_gpu_transforms.py > $O/r/t_transforms.txt 2>&1 &
wait; t "tests"
for f in $O/r/t_*.txt; do echo "$(basename $f): passed=$(grep -c PASSED $f) failed=$(grep -c FAILED $f) skipped=$(grep -c SKIPPED $f) | $(tail -1 $f | cut -c1-150)" >> $O/r/timeline.txt; done
grep -h "FAILED\|^E  " $O/r/t_*.txt | head -30 >> $O/r/timeline.txt
cd $O && tar czf r.tgz r && rm -rf r
