#!/usr/bin/env bash
set -u
O=${OUT:-./gpu_out}; mkdir -p $O/r
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
start=$SECONDS
t() { echo "[$((SECONDS - start))s] $*" >> $O/r/timeline.txt; }
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
src() { "$NCU" --import "$1" --page source --csv --print-source sass > "$2" 2>&1 || "$NCU" --import "$1" --page source --csv > "$2" 2>&1; }
src .s16/d1/r/ncu/bwd_d256.ncu-rep $O/r/bwd_d256.src.csv; src .s16/d1/r/ncu/bwd_jagged.ncu-rep $O/r/bwd_jagged.src.csv; t "src export"
timeout 240 python3 -m pytest -q -m gpu -n 4 tests/test_gpu_bsa_dqalias.py > $O/r/t_dqalias.txt 2>&1; t "dqalias tests rc=$?"
timeout 120 python3 scripts/gpu_trace.py --out $O/r/trace.json --case hstu_fwd_32x1024 --case hstu_fwd_8x4096 --case hstu_fwd_jagged --case bsa_fwd_blk128 --case bsa_fwd_blk64 > $O/r/trace.txt 2>&1; t "trace rc=$?"
PROFILES="fwd_32x1024 fwd_8x4096" NCU_T=100 OUT=$O/r bash scripts/gpu_ncu.sh > $O/r/ncu_summary.txt 2>&1; t "ncu rc=$?"
for n in fwd_32x1024 fwd_8x4096; do src $O/r/ncu/$n.ncu-rep $O/r/$n.src.csv; done; t "src2"
rm -f $O/r/ncu/*.ncu-rep.bak
cd $O && tar czf r.tgz r && rm -rf r
