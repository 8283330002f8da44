#!/usr/bin/env bash
# session 20, device call B: Nsight Compute of the BSA forward (blk64, blk128) and backward (blk128)
set -u
O=${OUT:-./gpu_out}; mkdir -p $O/r
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
start=$SECONDS
t() { echo "[$((SECONDS - start))s] $*" >> $O/r/timeline.txt; }
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
prof() {  # name regex row pass
  timeout 170 $NCU --set full --import-source yes --clock-control none --kernel-name regex:$2 --launch-skip 2 --launch-count 1 -f -o $O/r/ncu_$1 python3 -m benchmarks.bsa_bench --table "JAX_SPARSE_ATTN_BSA_FWD_IMPL=auto" --table-pass $4 --rows $3 --out /tmp/b.json > $O/r/ncu_$1.log 2>&1
  $NCU --import $O/r/ncu_$1.ncu-rep --page details > $O/r/ncu_$1.details.txt 2>&1
  $NCU --import $O/r/ncu_$1.ncu-rep --page source --csv --print-source sass > $O/r/ncu_$1.source.csv 2>&1
  python3 .s17/stalls.py $O/r/ncu_$1.source.csv 50 > $O/r/ncu_$1.stalls.txt 2>&1
  rm -f $O/r/ncu_$1.ncu-rep; gzip -f $O/r/ncu_$1.source.csv; t "ncu $1"
}
prof fwd64 BsaFwdSm90Ws 0 fwd
prof fwd128 BsaFwdSm90Ws 3 fwd
prof bwd128 BsaBwdSm90Ws 3 bwd
cd $O && tar czf r.tgz r && rm -rf r
