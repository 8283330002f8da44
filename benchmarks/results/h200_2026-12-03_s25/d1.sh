#!/usr/bin/env bash
# session 25 call 1: fixed canonical dq-writer tests; HSTU deterministic ratios (5 shapes);
# BSA fwd+bwd per-kernel trace; ncu of the BSA blk128 backward with the smem epilogue
set -u
O=${OUT:-./gpu_out}; mkdir -p $O/r
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
start=$SECONDS
t() { echo "[$((SECONDS - start))s] $*" >> $O/r/timeline.txt; }
PYT="python3 -m pytest -m gpu -q -rA -p no:cacheprovider"
timeout 110 $PYT tests/test_gpu_dq_writer.py -k "test_hstu_bwd_dq_writer and canonical" > $O/r/t_dqw_canon.txt 2>&1; t "dqw canon: $(tail -1 $O/r/t_dqw_canon.txt)"
timeout 200 python3 benchmarks/hstu_bench.py --case 32x1024-causal --case jagged32-causal --case 8x4096-causal-d64 --case 8x4096-causal --case 8x4096-causal-d256 --bwd-only --deterministic --iters 20 --out $O/r/hstu_det.json > $O/r/hstu_det.txt 2>&1; t "hstu det rc=$?"
timeout 90 python3 scripts/gpu_trace.py --case bsa_fwdbwd_blk128 --case bsa_fwdbwd_blk64 --iters 20 --out $O/r/trace_bsa.json > $O/r/trace_bsa.txt 2>&1; t "trace bsa rc=$?"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
prof() {  # name regex row pass
  timeout 150 $NCU --set full --import-source yes --clock-control none --kernel-name regex:$2 --launch-skip 2 --launch-count 1 -f -o $O/r/ncu_$1 python3 -m benchmarks.bsa_bench --table "JAX_SPARSE_ATTN_BSA_FWD_IMPL=auto" --table-pass $4 --rows $3 --out /tmp/b.json > $O/r/ncu_$1.log 2>&1
  $NCU --import $O/r/ncu_$1.ncu-rep --page details > $O/r/ncu_$1.details.txt 2>&1
  $NCU --import $O/r/ncu_$1.ncu-rep --page source --csv --print-source sass > $O/r/ncu_$1.source.csv 2>&1
  python3 benchmarks/results/h200_2026-12-03_s25/stalls.py $O/r/ncu_$1.source.csv 60 > $O/r/ncu_$1.stalls.txt 2>&1
  rm -f $O/r/ncu_$1.ncu-rep; gzip -f $O/r/ncu_$1.source.csv; t "ncu $1"
}
prof bwd128 BsaBwdSm90Ws 3 bwd
cd $O && tar czf r.tgz r && rm -rf r
