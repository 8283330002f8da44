#!/usr/bin/env bash
# next session, device call 1 (after the cold start): where the HSTU D=64 forward's time goes
# (the last #12 floor: 400 TFLOP/s, now ~372): block_n sweep with the current default (dynamic
# deal + 16 MiB chunks), then Nsight Compute (full set + source page) of the default D=64 and
# D=128 forwards for comparison.
set -u
O=${OUT:-./gpu_out}; mkdir -p $O/r
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
start=$SECONDS
t() { echo "[$((SECONDS - start))s] $*" >> $O/r/timeline.txt; }
W=JAX_SPARSE_ATTN_HSTU_WS
V=(--variant "" --variant "$W=bn=64" --variant "$W=bn=192" --variant "$W=bn=256" --variant "$W=q1" --variant "$W=nopingpong")
timeout 200 python3 benchmarks/hstu_bench.py --case 8x4096-causal-d64 --no-bwd "${V[@]}" "${V[@]}" --iters 30 --out $O/r/d64_sweep.json > $O/r/d64_sweep.txt 2>&1; t "sweep rc=$?"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for c in 8x4096-causal-d64 8x4096-causal; do
  timeout 150 $NCU --set full --import-source yes --clock-control none --kernel-name regex:HstuFwdSm90Ws --launch-skip 2 --launch-count 1 -f -o $O/r/ncu_$c python3 benchmarks/hstu_bench.py --iters 3 --case $c --no-bwd --out /tmp/n.json > $O/r/ncu_$c.log 2>&1
  $NCU --import $O/r/ncu_$c.ncu-rep --page details > $O/r/ncu_$c.details.txt 2>&1
  $NCU --import $O/r/ncu_$c.ncu-rep --page source --csv --print-source sass > $O/r/ncu_$c.source.csv 2>&1
  python3 .s17/stalls.py $O/r/ncu_$c.source.csv 40 > $O/r/ncu_$c.stalls.txt 2>&1
  rm -f $O/r/ncu_$c.ncu-rep
done; t "ncu"
cd $O && tar czf r2.tgz r && rm -rf r
