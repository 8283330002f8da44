#!/usr/bin/env bash
# session 24 call 4: the fixed dq-writer canonical test, then the deterministic-mode ratio
# with the shared-memory epilogue
set -u
O=${OUT:-./gpu_out}; mkdir -p $O/r
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
start=$SECONDS
t() { echo "[$((SECONDS - start))s] $*" >> $O/r/timeline.txt; }
PYT="python3 -m pytest -m gpu -q -rA -p no:cacheprovider"
timeout 110 $PYT tests/test_gpu_dq_writer.py -k "test_hstu_bwd_dq_writer and canonical" > $O/r/t_dqw_canon.txt 2>&1; t "dqw canon: $(tail -1 $O/r/t_dqw_canon.txt)"
timeout 120 python3 benchmarks/hstu_bench.py --case 32x1024-causal --case jagged32-causal --case 8x4096-causal-d64 --bwd-only --deterministic --iters 20 --out $O/r/hstu_det.json > $O/r/hstu_det.txt 2>&1; t "hstu det rc=$?"
cd $O && tar czf r.tgz r && rm -rf r
