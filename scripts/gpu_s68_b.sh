#!/usr/bin/env bash
# The list-length sweep of the block-sparse forward (blk 64 / blk 128, top-k 1 .. 64, the fit
# ms = a + b k: a work item's cost besides its blocks, in blocks), default switches, then on
# an H200 the forward floor rows with oinq against nooinq and the large-tensor cases
# (scripts/gpu_s67_c.sh) as far as the budget goes.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/gpu_s68_b.sh [seconds]
. "$(dirname "$0")/gpu_lib.sh" s68_b "${1:-400}"
gpu_info
timeout 150 python3 -m benchmarks.bsa_bench --table-pass fwd --sweep-k --timing both \
  --table "deterministic=0" --out "$O/sweep.json" > "$O/sweep.txt" 2>&1
t "sweep rc=$?"; grep -E "^fit" "$O/sweep.txt"
if grep -q H200 "$O/gpu.txt" && [ "$(left)" -gt 300 ]; then
  OUT=$OUT bash "$(dirname "$0")/gpu_s67_c.sh" $(( $(left) - 10 ))
fi
t done
