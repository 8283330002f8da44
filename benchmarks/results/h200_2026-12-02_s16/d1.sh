#!/usr/bin/env bash
set -u
O=${OUT:-./gpu_out}; mkdir -p $O/r
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
start=$SECONDS
t() { echo "[$((SECONDS - start))s] $*" >> $O/r/timeline.txt; }
timeout 220 python3 scripts/gpu_trace.py --out $O/r/trace.json --case hstu_bwd_32x1024 --case hstu_bwd_jagged --case hstu_bwd_8x4096_d256 --case bsa_fwdbwd_blk64 --case bsa_fwdbwd_blk128 > $O/r/trace.txt 2>&1; t "trace rc=$?"
PROFILES="bwd_d256 bwd_jagged" NCU_T=100 OUT=$O/r bash scripts/gpu_ncu.sh > $O/r/ncu_summary.txt 2>&1; t "ncu rc=$?"
cd $O && tar czf r.tgz r && rm -rf r
