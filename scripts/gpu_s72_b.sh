#!/usr/bin/env bash
# Whether the K-tile waits that separate pairbox (blk 64, 963 K cycles at 12.5 %) from half2
# (blk 128 halves, 883 K) come from the lists: the blk 64 rows with --lists paired (query
# blocks 2i and 2i + 1 share one list, as half2's two 64-row items share one), default and
# pairbox; then the forward floor rows (default, twice interleaved) and cuDNN FE's
# block-sparse forward on the same GPU where the throwaway side script and its wheels are
# carried (.whl/, not part of the project).
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/gpu_s72_b.sh [seconds]
. "$(dirname "$0")/gpu_lib.sh" s72_b "${1:-540}"
gpu_info
W=JAX_SPARSE_ATTN_BSA_WS
bench paired 110 fwd 0,1,2 ";$W=pairbox" paired
bench fwd 170 fwd 0,1,2,3,4,5,6 ";"
if [ -f .whl/cudnn_side.py ] && [ "$(left)" -gt 100 ]; then
  python3 -m pip install -q --no-deps --no-index --target /tmp/fe .whl/*.whl > "$O/pip.txt" 2>&1
  PYTHONPATH=/tmp/fe:$PYTHONPATH timeout $(( $(left) - 30 )) python3 .whl/cudnn_side.py \
    "$O/cudnn.json" > "$O/cudnn.txt" 2>&1
  t "cudnn rc=$?"; tail -n 12 "$O/cudnn.txt"
fi
t done
pack_out s72_b
