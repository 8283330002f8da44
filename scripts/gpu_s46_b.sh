#!/usr/bin/env bash
# Session 46's second H200 call (after gpu_s46_a.sh): (1) the blk128 and S 32768 backward
# rows, default / persist,persistkv=0 / persist / l2hint / default, sustained and burst (the
# #15 rows not met; session 43's call of them was lost); (2) the blk64 12.5 % backward row with
# l2hint; (3) with the time left, per-kernel traces (burst) of the blk128 backward, default
# and persist,persistkv=0, and of the blk64 forward, default and l2hint.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/gpu_s46_b.sh [seconds]
. "$(dirname "$0")/gpu_lib.sh" s46b "${1:-580}"
W=JAX_SPARSE_ATTN_BSA_BWD_WS
V=";$W=persist+persistkv=0;$W=persist;$W=l2hint;"
timeout $(( $(left) - 150 )) python3 -m benchmarks.bsa_bench --table-pass bwd --rows 3,4 \
  --timing both --table "$V" --out $O/bwd128.json > $O/bwd128.txt 2>&1
t "bwd128 rows rc=$?"; grep -v "^wrote" $O/bwd128.txt | tail -14
timeout $(( $(left) - 80 )) python3 -m benchmarks.bsa_bench --table-pass bwd --rows 0 \
  --timing both --table ";$W=l2hint;" --out $O/bwd64.json > $O/bwd64.txt 2>&1
t "bwd64 rows rc=$?"; grep -v "^wrote" $O/bwd64.txt | tail -6
trace_variant default X=1 bsa_bwd_blk128
trace_variant persistkv0 "$W=persist,persistkv=0" bsa_bwd_blk128
grep -h "==" $O/trace_*.txt | cut -c1-150
