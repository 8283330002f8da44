#!/usr/bin/env bash
# session 19, device call 4: three consumer warpgroups (hstu_fwd_ws=wg3, 192-row tiles) at
# D <= 64: bench against the default; if wg3 wins (.s19/decide_wg3.py), this copy makes it
# the default (.s19/wg3default.patch) and the D <= 64 part of the HSTU GPU suite runs on it;
# else the wg3 tests run opt-in. Memcheck of the sm90ws garbage-metadata cases either way.
set -u
O=${OUT:-./gpu_out}; mkdir -p $O/r
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
start=$SECONDS
t() { echo "[$((SECONDS - start))s] $*" >> $O/r/timeline.txt; }
W=JAX_SPARSE_ATTN_HSTU_WS
V=(--variant "" --variant "$W=wg3" --variant "$W=wg3,bn=64")
timeout 110 python3 benchmarks/hstu_bench.py --case 8x4096-causal-d64 --case 32x1024-causal-d64 --case movielens-128x200 --case 8x4096-causal --no-bwd "${V[@]}" "${V[@]}" --iters 30 --out $O/r/wg3.json > $O/r/wg3.txt 2>&1; t "bench rc=$?"
python3 .s19/decide_wg3.py $O/r/wg3.json > $O/r/decide.txt 2>&1
dec=$(tail -1 $O/r/decide.txt)
if [ "$dec" = apply ]; then patch -p1 < .s19/wg3default.patch >> $O/r/decide.txt 2>&1; WS=""; else WS=wg3; fi
t "decision: $dec"
PYT="python3 -m pytest -m gpu -v -p no:cacheprovider"
T=$((420 - SECONDS + start))
timeout $T $PYT -k "three_consumer or qscale_alpha" tests/test_gpu_hstu.py > $O/r/t_wg3.txt 2>&1 &
for i in 0 1; do timeout $T env HSTU_TEST_WS=$WS HSTU_TEST_SHARD=$i/2 $PYT -k "TestHSTUKernelGrid and (d32 or d64)" tests/test_gpu_hstu.py > $O/r/t_grid_$i.txt 2>&1 & done
timeout $T env HSTU_TEST_SM90=sm90ws HSTU_TEST_WS=$WS $PYT -k "sm90ws_batches and d32" tests/test_gpu_hstu.py > $O/r/t_ws.txt 2>&1 &
if [ "$dec" = apply ]; then
  timeout $T $PYT -k "dynamic_deal and d64" tests/test_gpu_hstu.py > $O/r/t_deal.txt 2>&1 &
  timeout $T $PYT -k "64 or 32" tests/test_gpu_hstu_inference_extra.py > $O/r/t_infer.txt 2>&1 &
fi
(export JAX_COMPILATION_CACHE_DIR=/tmp/san_jcc JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES=0 JAX_SPARSE_ATTN_CACHE_DIR=/tmp/san_kc XLA_FLAGS=--xla_gpu_autotune_level=0
 timeout 150 python3 tests/sanitize_grid.py --only "hstu fwd=sm90ws" > $O/r/san_warm.txt 2>&1; echo "warm rc=$?" >> $O/r/san_warm.txt
 timeout $((T - SECONDS + start)) compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 python3 tests/sanitize_grid.py --only "hstu fwd=sm90ws" > $O/r/san.txt 2>&1; echo "san rc=$?" >> $O/r/san.txt) &
wait; t "tests"
for f in $O/r/t_*.txt; do echo "$(basename $f): passed=$(grep -c PASSED $f) failed=$(grep -c FAILED $f) skipped=$(grep -c SKIPPED $f) | $(tail -1 $f | cut -c1-150)" >> $O/r/timeline.txt; done
echo "san: $(grep -E 'ERROR SUMMARY|rc=' $O/r/san.txt | tr '\n' ' ') warm: $(tail -2 $O/r/san_warm.txt | tr '\n' ' ')" >> $O/r/timeline.txt
grep -h "FAILED\|^E  " $O/r/t_*.txt | head -30 >> $O/r/timeline.txt
cd $O && tar czf r.tgz r && rm -rf r
