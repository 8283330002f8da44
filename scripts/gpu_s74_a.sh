#!/usr/bin/env bash
# The sm90ws forward's default at blk 64 / D 128 with lists of 32 or more slots (sortlists +
# pairbox) against the previous default (nosortbox) on the seven forward rows, interleaved
# twice; cuDNN FE's forward on the same random lists where the throwaway side script is
# carried (.whl/); the grid with BSA_TEST_IMPLS=sortbox (the default, whose wide cases take
# the new walk, and sortlists + pairbox on every case) and the garbage-metadata cases with
# sortlists.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/gpu_s74_a.sh [seconds]
. "$(dirname "$0")/gpu_lib.sh" s74_a "${1:-540}"
gpu_info
W=JAX_SPARSE_ATTN_BSA_WS
bench sb 170 fwd 0,1,2,3,4,5,6 "$W=nosortbox;;$W=nosortbox;"
if [ -f .whl/cudnn_side.py ] && [ "$(left)" -gt 220 ]; then
  python3 -m pip install -q --no-deps --no-index --target /tmp/fe .whl/*.whl > "$O/pip.txt" 2>&1
  PYTHONPATH=/tmp/fe:$PYTHONPATH timeout 80 python3 .whl/cudnn_side.py "$O/cudnn.json" \
    > "$O/cudnn.txt" 2>&1
  t "cudnn rc=$?"; tail -n 8 "$O/cudnn.txt"
fi
grid_garbage_tests sbx sortbox sortlists
t done
pack_out s74_a
