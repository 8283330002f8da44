#!/usr/bin/env bash
# session 18, device call 6: the schedule launch zeroes the dynamic deal's counter (no XLA
# copy of a zero constant before the forward): deal + schedule tests, default vs static
# bench (three readings), profiler trace of the B=32 L=1024 forward call.
set -u
O=${OUT:-./gpu_out}; mkdir -p $O/r
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
start=$SECONDS
t() { echo "[$((SECONDS - start))s] $*" >> $O/r/timeline.txt; }
PYT="python3 -m pytest -m gpu -v -p no:cacheprovider"
timeout 200 $PYT -k dynamic_deal tests/test_gpu_hstu.py > $O/r/t_deal.txt 2>&1 &
timeout 200 $PYT -k "schedule_kernel" tests/test_gpu_hstu.py > $O/r/t_sched.txt 2>&1 &
wait; t "tests"
W=JAX_SPARSE_ATTN_HSTU_WS
V=(--variant "" --variant "$W=static")
timeout 150 python3 benchmarks/hstu_bench.py --case 32x1024-causal --case jagged32-causal --case 8x4096-causal --no-bwd "${V[@]}" "${V[@]}" "${V[@]}" --iters 30 --out $O/r/bench.json > $O/r/bench.txt 2>&1; t "bench rc=$?"
timeout 90 python3 scripts/gpu_trace.py --case hstu_fwd_32x1024 --out $O/r/trace.json > $O/r/trace.txt 2>&1; t "trace rc=$?"
for f in $O/r/t_*.txt; do echo "$(basename $f): passed=$(grep -c PASSED $f) failed=$(grep -c FAILED $f) | $(tail -1 $f | cut -c1-120)" >> $O/r/timeline.txt; done
grep -h "FAILED\|^E  " $O/r/t_*.txt | head -20 >> $O/r/timeline.txt
cd $O && tar czf r.tgz r && rm -rf r
