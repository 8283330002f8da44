#!/usr/bin/env bash
# Session 43's second device call, sustained and burst (`bsa_bench --timing both`, variants
# interleaved in one process, the default first and last): (1) the blk128 and S 32768
# backward rows: default, persist with persistkv=0 / 1 / 2 (persist's default), default;
# (2) the blk64 12.5 % and 25 % rows, default / deterministic / default, and the GQA 16:4 and
# D 64 rows (the #15 rows not re-timed on session 42's defaults); (3) if time is left, the
# blk128 list-length sweep, default and persist.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/gpu_s43_b.sh [seconds]
. "$(dirname "$0")/gpu_lib.sh" s43b "${1:-400}"
W=JAX_SPARSE_ATTN_BSA_BWD_WS
V=";$W=persist+persistkv=0;$W=persist+persistkv=1;$W=persist;"
timeout $(( $(left) / 2 )) python3 -m benchmarks.bsa_bench --table-pass bwd --rows 4,3 \
  --timing both --table "$V" --out $O/bwd.json > $O/bwd.txt 2>&1
t "bwd rows rc=$?"; grep -v "^wrote" $O/bwd.txt | tail -12
timeout $(( $(left) - 15 )) python3 -m benchmarks.bsa_bench --table-pass bwd --rows 0,2 \
  --timing both --table ";deterministic=1;" --out $O/bwd_det.json > $O/bwd_det.txt 2>&1
t "det rows rc=$?"; grep -v "^wrote" $O/bwd_det.txt | tail -8
timeout $(( $(left) - 5 )) python3 -m benchmarks.bsa_bench --table-pass bwd --rows 5,6 \
  --timing both --table ";" --out $O/bwd_gqa.json > $O/bwd_gqa.txt 2>&1
t "gqa/d64 rows rc=$?"; grep -v "^wrote" $O/bwd_gqa.txt | tail -6
# (3) with what is left: the blk128 list-length sweep (sustained), default and persist, for
# the intercept of ms = a + b k
if [ "$(left)" -gt 90 ]; then
  timeout $(( $(left) - 5 )) python3 -m benchmarks.bsa_bench --table-pass bwd --sweep-k \
    --rows 7,8,9,10,11,12,13 --table ";$W=persist" --out $O/sweep.json > $O/sweep.txt 2>&1
  t "sweep rc=$?"; grep "^fit\|FAILED" $O/sweep.txt | tail -4
fi
