#!/usr/bin/env bash
# The walk order of a list: the forward rows on random lists with sortlists (XLA sorts each
# active list before the kernel; its cost timed with it) against the default; then on lists
# sorted by the benchmark (--lists sorted: no sort in the timed call), default and pairbox;
# cuDNN FE's forward on the sorted lists (SORTED=1) where the throwaway side script is
# carried (.whl/); on an H200 the seven forward rows (default twice) and cuDNN's beside
# them; the grid with BSA_TEST_IMPLS=sortlists,nodefault and the garbage-metadata case with
# sortlists.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/gpu_s72_c.sh [seconds]
. "$(dirname "$0")/gpu_lib.sh" s72_c "${1:-540}"
gpu_info
W=JAX_SPARSE_ATTN_BSA_WS
bench rand 80 fwd 0,1,2,5 ";$W=sortlists"
bench sorted 60 fwd 0,1,2 ";$W=pairbox" sorted
if [ -f .whl/cudnn_side.py ] && [ "$(left)" -gt 170 ]; then
  python3 -m pip install -q --no-deps --no-index --target /tmp/fe .whl/*.whl > "$O/pip.txt" 2>&1
  SORTED=1 PYTHONPATH=/tmp/fe:$PYTHONPATH timeout 50 python3 .whl/cudnn_side.py \
    "$O/cudnn_sorted.json" 0,1,2 > "$O/cudnn_sorted.txt" 2>&1
  t "cudnn rc=$?"; tail -n 12 "$O/cudnn_sorted.txt"
fi
if grep -q H200 "$O/gpu.txt" && [ "$(left)" -gt 280 ]; then
  # the issue's floors are H200 numbers: the seven forward rows and cuDNN beside them
  bench floors 90 fwd 0,1,2,3,4,5,6 ";"
  [ -d /tmp/fe ] && PYTHONPATH=/tmp/fe:$PYTHONPATH timeout 80 python3 .whl/cudnn_side.py \
    "$O/cudnn.json" > "$O/cudnn.txt" 2>&1 && tail -n 8 "$O/cudnn.txt"
fi
grid_garbage_tests srt sortlists,nodefault sortlists
t done
pack_out s72_c
