#!/usr/bin/env bash
# next session, device call 1 (after the cold start): (1) hstu_fwd_ws=headouter against the default
# on the forward rows (built in session 16, not measured), (2) Nsight Compute of the BSA blk128
# backward (425 vs floor 500; the dQ writer changed nothing there) and of the HSTU D=256 backward
# with the writer, source pages exported on the device.
set -u
O=${OUT:-./gpu_out}; mkdir -p $O/r
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
start=$SECONDS
t() { echo "[$((SECONDS - start))s] $*" >> $O/r/timeline.txt; }
timeout 200 python3 benchmarks/hstu_bench.py --case 32x1024-causal --case 8x4096-causal --case jagged32-causal --case 8x4096-causal-d64 --case 8x4096-causal-d256 --no-bwd --variant "" --variant "JAX_SPARSE_ATTN_HSTU_WS=headouter" --iters 20 --out $O/r/headouter.json > $O/r/headouter.txt 2>&1; t "headouter bench rc=$?"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
timeout 150 "$NCU" --set full --clock-control none --kernel-name "regex:BsaBwdSm90Ws" --launch-skip 2 --launch-count 1 -f -o $O/r/bsa_bwd_blk128 \
  python3 -m benchmarks.bsa_bench --table "JAX_SPARSE_ATTN_PDL=1" --table-pass bwd --rows 3 --out /tmp/ncu_bsa_bwd.json > $O/r/bsa_bwd_ncu.log 2>&1; t "ncu bsa bwd rc=$?"
PROFILES="bwd_d256" NCU_T=120 OUT=$O/r bash scripts/gpu_ncu.sh > $O/r/ncu_summary.txt 2>&1; t "ncu d256 rc=$?"
for n in bsa_bwd_blk128 ncu/bwd_d256; do "$NCU" --import $O/r/$n.ncu-rep --page source --csv --print-source sass > $O/r/$(basename $n).src.csv 2>&1; "$NCU" --import $O/r/$n.ncu-rep --page details > $O/r/$(basename $n).details.txt 2>&1; done; t "export"
cd $O && tar czf r.tgz r && rm -rf r
