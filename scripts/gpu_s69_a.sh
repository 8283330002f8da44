#!/usr/bin/env bash
# How the block-sparse forward's time follows its L2 traffic: the forward rows with the
# timing ablation bsa_fwd_ws=skipload=N (the producer skips the K / V loads of every N-th
# tile; wrong results, timing only) against the default, interleaved by bsa_bench; then
# cuDNN FE's block-sparse forward on the same GPU where the throwaway side script and its
# wheels are carried (.whl/, not part of the project), then the other forward rows.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/gpu_s69_a.sh [seconds]
. "$(dirname "$0")/gpu_lib.sh" s69_a "${1:-480}"
gpu_info
bench skip 260 fwd 0,1,2,3 \
  ";JAX_SPARSE_ATTN_BSA_WS=skipload=16;JAX_SPARSE_ATTN_BSA_WS=skipload=8;JAX_SPARSE_ATTN_BSA_WS=skipload=4;JAX_SPARSE_ATTN_BSA_WS=skipload=2"
if [ -f .whl/cudnn_side.py ] && [ "$(left)" -gt 100 ]; then
  python3 -m pip install -q --no-deps --no-index --target /tmp/fe .whl/*.whl > "$O/pip.txt" 2>&1
  PYTHONPATH=/tmp/fe:$PYTHONPATH timeout $(( $(left) - 60 )) python3 .whl/cudnn_side.py \
    "$O/cudnn.json" > "$O/cudnn.txt" 2>&1
  t "cudnn rc=$?"; tail -n 12 "$O/cudnn.txt"
fi
T=$(( $(left) - 10 ))
[ "$T" -gt 40 ] && bench rest "$T" fwd 0,1,2,4,5,6 "deterministic=0"
t done
pack_out s69_a
