#!/usr/bin/env bash
# Session 38, call F: per-kernel traces of the block-sparse backward alone (20 calls each):
# blk64 12.5 % and 25 %, blk128 12.5 % (where the time outside the attention kernel goes).
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/sessions/gpu_s38_f.sh [seconds]
. "$(dirname "$0")/../gpu_lib.sh" f38 "${1:-300}"
for c in bsa_bwd_blk64 bsa_bwd_blk64_25 bsa_bwd_blk128; do
  timeout 90 python3 scripts/gpu_trace.py --case $c --out $O/$c.json > $O/$c.txt 2>&1
  t "$c rc=$?"; tail -30 $O/$c.txt
done
