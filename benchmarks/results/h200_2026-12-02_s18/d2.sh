#!/usr/bin/env bash
# session 18, device call 2: GPU tests of the chunked tile order (+ dynamic deal), then the
# forward bench of the deal / order variants (two readings each), then ncu DRAM bytes of the
# 32x1024 forward for three variants.
set -u
O=${OUT:-./gpu_out}; mkdir -p $O/r
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
start=$SECONDS
t() { echo "[$((SECONDS - start))s] $*" >> $O/r/timeline.txt; }
PYT="python3 -m pytest -m gpu -v -p no:cacheprovider"
timeout 240 $PYT -k dynamic_deal tests/test_gpu_hstu.py > $O/r/t_deal.txt 2>&1 &
timeout 240 $PYT -k "schedule_kernel" tests/test_gpu_hstu.py > $O/r/t_sched.txt 2>&1 &
wait; t "tests"
W=JAX_SPARSE_ATTN_HSTU_WS
V=(--variant "" --variant "$W=dynamic" --variant "$W=dynamic+chunk=8192" --variant "$W=dynamic+chunk=16384" --variant "$W=dynamic+chunk=32768" --variant "$W=chunk=16384")
timeout 300 python3 benchmarks/hstu_bench.py --case 32x1024-causal --case jagged32-causal --case 8x4096-causal --case 8x4096-causal-d64 --case 8x4096-causal-d256 --no-bwd "${V[@]}" "${V[@]}" --iters 30 --out $O/r/chunk.json > $O/r/chunk.txt 2>&1; t "bench rc=$?"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for var in "" "$W=dynamic" "$W=dynamic+chunk=16384"; do
  n=$(echo "x$var" | tr -c 'a-z0-9\n' '_')
  timeout 100 $NCU --metrics dram__bytes_read.sum,dram__bytes_write.sum,gpu__time_duration.sum,lts__t_sector_hit_rate.pct --clock-control none --kernel-name regex:HstuFwdSm90Ws --launch-skip 2 --launch-count 1 python3 benchmarks/hstu_bench.py --iters 3 --case 32x1024-causal --no-bwd --variant "$var" --out /tmp/n.json > $O/r/ncu_$n.txt 2>&1
done; t "ncu"
for f in $O/r/t_*.txt; do echo "$(basename $f): passed=$(grep -c PASSED $f) failed=$(grep -c FAILED $f) | $(tail -1 $f | cut -c1-120)" >> $O/r/timeline.txt; done
grep -E "FAILED|Error" $O/r/t_*.txt | head -20 >> $O/r/timeline.txt
cd $O && tar czf r.tgz r && rm -rf r
