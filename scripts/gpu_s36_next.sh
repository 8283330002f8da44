#!/usr/bin/env bash
# What session 35 left for the GPU:
# (1) the K->Q offsets' running sum in two levels (scripts/kq_csr_ab.py variant
#     rows-offsets2, built and checked equal on CPU) against the current construction:
#     per-kernel traces and the sustained backward rows, two interleaved rounds;
# (2) the HSTU grid (four shards) and rab (three) with the pair-store epilogue as the HSTU
#     forward's default, which no device call has finished since that default changed
#     (tests/gpu_grids.sh, no other process competing).
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/gpu_s36_next.sh [seconds]
. "$(dirname "$0")/gpu_lib.sh" next36 "${1:-560}"
timeout 150 python3 scripts/kq_csr_ab.py --variants rows,rows-offsets2 --out $O/kq_ab.json \
  > $O/kq_ab.txt 2>&1
t "kq ab rc=$?"
grep -E "^##|^== |reduce_window|bwd " $O/kq_ab.txt | head -40
export LOGS=$O/logs
PARTS="hstu rab" HSTU_SHARDS=4 RAB_SHARDS=3 T=$(($(left) - 30)) OUT=$O/grids bash tests/gpu_grids.sh \
  > /dev/null 2>&1
t "grids done"; cat $O/grids/summary.txt
