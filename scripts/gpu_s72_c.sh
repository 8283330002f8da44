#!/usr/bin/env bash
# The walk order of a list: the forward rows on random lists with sortlists (XLA sorts each
# active list before the kernel; its cost timed with it) against the default; then on lists
# sorted by the benchmark (--lists sorted: no sort in the timed call), default and pairbox; cuDNN FE's forward on the sorted lists (SORTED=1) where the throwaway
# side script is carried (.whl/); the grid with BSA_TEST_IMPLS=sortlists,nodefault.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/gpu_s72_c.sh [seconds]
. "$(dirname "$0")/gpu_lib.sh" s72_c "${1:-480}"
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
[ "$(left)" -gt 125 ] && grid_tests srt sortlists,nodefault
t done
pack_out s72_c
