#!/usr/bin/env bash
# What session 34 left unrun on the GPU: the whole HSTU grid (four shards) and the rab shard
# its call B cut, with the pair-store epilogue (epivec) as the HSTU forward's default, run
# without other processes competing (tests/gpu_grids.sh), then the packed-GQA shard call B
# cut (BSA_PACK_SHARD=0/3).
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/gpu_s35_next.sh [seconds]
. "$(dirname "$0")/gpu_lib.sh" next35 "${1:-540}"
export LOGS=$O/logs
PARTS="hstu rab" HSTU_SHARDS=4 RAB_SHARDS=3 T=$((BUDGET - 140)) OUT=$O/grids bash tests/gpu_grids.sh \
  > /dev/null 2>&1
t "grids done"; cat $O/grids/summary.txt
BSA_PACK_SHARD=0/3 timeout $(($(left) - 10)) $PYT tests/test_gpu_bsa_pack_gqa.py > $O/t_pack_0.txt 2>&1
t "pack shard 0 rc=$?: $(tail -1 $O/t_pack_0.txt)"
