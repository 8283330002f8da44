#!/usr/bin/env bash
# Third call on detstream, now the default at blk 64 / D 128: every deterministic case of the
# BSA GPU grid, and benchmark rows default mode / deterministic / nodetstream / detstream.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/sessions/gpu_det_stream3.sh [seconds]
set -u
O=${OUT:-./gpu_out}/st3; mkdir -p $O
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
export JAX_SPARSE_ATTN_GPU_TEST_TIMEOUT=120 JAX_SPARSE_ATTN_GPU_HANG_LOG=$O/hang.log
BUDGET=${1:-480}
start=$SECONDS
t() { echo "[$((SECONDS - start))s] $*" | tee -a $O/timeline.txt; }
left() { echo $((BUDGET - (SECONDS - start))); }
PYT="python3 -m pytest -m gpu -q -rA -p no:cacheprovider"
W=JAX_SPARSE_ATTN_BSA_BWD_WS
timeout 260 $PYT tests/test_gpu_bsa.py -k "deterministic" > $O/tests.txt 2>&1; rc=$?
t "test_gpu_bsa deterministic rc=$rc: $(tail -1 $O/tests.txt)"
if [ $rc -eq 0 ]; then
  L=$(left); t "left $L"
  timeout $((L - 10)) python3 -m benchmarks.bsa_bench --timing both --table \
    ";deterministic=1;deterministic=1,$W=nodetstream;deterministic=1,$W=detstream" \
    --table-pass bwd --rows 0,6,1,2 --out $O/bench.json > $O/bench.txt 2>&1
  t "bench rc=$?"; grep -v "^wrote" $O/bench.txt
fi
grep -h "FAILED\|^E  \|PASSED\|passed\|failed" $O/tests.txt 2>/dev/null | head -30 | tee -a $O/timeline.txt
