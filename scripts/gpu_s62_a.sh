#!/usr/bin/env bash
# Session 62's first call (about 580 s; meant for an H200, where the block-sparse floors are
# defined): every block-sparse backward floor row and the deterministic ratio on the current
# defaults (session 61: `wguni` in both modes) and with `mult1p` (the fixed-point multipliers'
# norms in one pass over dO and V instead of two), the forward floor rows, and per-kernel traces
# of the blk 128 / S 32768 backward in both modes (where the deterministic mode's extra time
# goes: the main kernel, the XLA passes of the fixed-point multipliers over K, V and dO, the
# dq conversion).
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/gpu_s62_a.sh [seconds]
. "$(dirname "$0")/gpu_lib.sh" s62_a "${1:-580}"
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,memory.total --format=csv > $O/gpu.txt 2>&1
cat $O/gpu.txt
W=JAX_SPARSE_ATTN_BSA_BWD_WS
bench bwd 150 bwd 0,2,3,4,5,6 ";"
bench det 170 bwd 0,3,4 ";deterministic=1;deterministic=1,$W=mult1p;"
bench fwd 80 fwd 0,1,2,3,4,5,6 ";"
T=$(( $(left) - 10 ))
if [ "$T" -gt 60 ]; then
  timeout $T python3 scripts/gpu_trace.py --iters 10 --case bsa_bwd_blk128 \
    --case bsa_bwd_det_blk128 --case bsa_bwd_s32768 --case bsa_bwd_det_s32768 \
    --out $O/trace.json > $O/trace.txt 2>&1
  t "trace rc=$?"; tail -n 60 $O/trace.txt
fi
t done
cd $OUT && tar czf s62_a.tgz s62_a && rm -rf s62_a
