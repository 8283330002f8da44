#!/usr/bin/env bash
# Session 33, call A: what session 32 left unrun (scripts/sessions/gpu_s33_next.sh), then per-kernel
# traces of the blk 64 backward, default and deterministic (where the deterministic call's
# time goes: order kernel, preprocessing, backward kernel).
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/sessions/gpu_s33_a.sh [seconds]
. "$(dirname "$0")/../gpu_lib.sh" a "${1:-480}"
OUT=$OUT bash "$(dirname "$0")/gpu_s33_next.sh" $((BUDGET - 100))
for c in bsa_bwd_blk64 bsa_bwd_det_blk64; do
  L=$(left); [ $L -gt 25 ] || break
  echo "### $c" >> $O/trace.txt
  timeout 40 python3 scripts/gpu_trace.py --case $c --iters 20 --out $O/trace_$c.json 2>&1 \
    | grep -v "^cutedsl" | head -30 >> $O/trace.txt
done
cat $O/trace.txt
