#!/usr/bin/env bash
# session 19, device call 3: D <= 64 forward defaults (qscale now; block_n 64 if it wins here:
# .s19/decide.py applies .s19/bn64.patch to this copy), then the HSTU default grid (6 shards),
# the sm90ws batches, the qscale / deal tests, the inference extras and memcheck of the
# sm90ws forward garbage-metadata cases, all on the resulting default.
set -u
O=${OUT:-./gpu_out}; mkdir -p $O/r
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
start=$SECONDS
t() { echo "[$((SECONDS - start))s] $*" >> $O/r/timeline.txt; }
W=JAX_SPARSE_ATTN_HSTU_WS
V=(--variant "" --variant "$W=noqscale" --variant "$W=bn=64" --variant "$W=bn=64,noqscale")
timeout 150 python3 benchmarks/hstu_bench.py --case 8x4096-causal-d64 --case 32x1024-causal-d64 --case movielens-128x200 --no-bwd "${V[@]}" "${V[@]}" --iters 30 --out $O/r/d64.json > $O/r/d64.txt 2>&1; t "bench rc=$?"
python3 .s19/decide.py $O/r/d64.json > $O/r/decide.txt 2>&1
if [ "$(tail -1 $O/r/decide.txt)" = apply ]; then patch -p1 < .s19/bn64.patch >> $O/r/decide.txt 2>&1; fi
t "decision: $(tail -1 $O/r/decide.txt)"
PYT="python3 -m pytest -m gpu -v -p no:cacheprovider"
T=$((585 - SECONDS + start))
for i in 0 1 2 3 4 5; do timeout $T env HSTU_TEST_SHARD=$i/6 $PYT -k "not sm90ws_batches" tests/test_gpu_hstu.py > $O/r/t_hstu_$i.txt 2>&1 & done
(for i in 0 1; do timeout $T env HSTU_TEST_SM90=sm90ws HSTU_TEST_SHARD=$i/2 $PYT -k sm90ws_batches tests/test_gpu_hstu.py > $O/r/t_ws_$i.txt 2>&1; done) &
(timeout $T $PYT tests/test_gpu_hstu_inference_extra.py > $O/r/t_infer.txt 2>&1) &
(export JAX_COMPILATION_CACHE_DIR=/tmp/san_jcc JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES=0 JAX_SPARSE_ATTN_CACHE_DIR=/tmp/san_kc XLA_FLAGS=--xla_gpu_autotune_level=0
 timeout 200 python3 tests/sanitize_grid.py --only "hstu fwd=sm90ws" > $O/r/san_warm.txt 2>&1; echo "warm rc=$?" >> $O/r/san_warm.txt
 timeout $((T - SECONDS + start)) compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 python3 tests/sanitize_grid.py --only "hstu fwd=sm90ws" > $O/r/san.txt 2>&1; echo "san rc=$?" >> $O/r/san.txt) &
wait; t "tests"
for f in $O/r/t_*.txt; do echo "$(basename $f): passed=$(grep -c PASSED $f) failed=$(grep -c FAILED $f) skipped=$(grep -c SKIPPED $f) | $(tail -1 $f | cut -c1-150)" >> $O/r/timeline.txt; done
echo "san: $(grep -E 'ERROR SUMMARY|rc=' $O/r/san.txt | tr '\n' ' ') warm: $(tail -2 $O/r/san_warm.txt | tr '\n' ' ')" >> $O/r/timeline.txt
grep -h "FAILED\|^E  " $O/r/t_*.txt | head -30 >> $O/r/timeline.txt
cd $O && tar czf r.tgz r && rm -rf r
