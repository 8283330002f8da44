#!/usr/bin/env bash
# Session 42's first device call: (1) the backward's list-length sweep (sustained; default /
# K->Q list kernel + tailconv / default) and its fit ms = a + b k per block size and variant;
# (2) the table's blk64 12.5 %, GQA 16:4 and D 64 backward rows with the same three variants;
# (3) the robustness kernel cases, then the HSTU, block-sparse and rab grids (their stricter
# NaN / Inf cases of sessions 39-40 included) in the time left.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/sessions/gpu_s42_a.sh [seconds]
. "$(dirname "$0")/../gpu_lib.sh" s42a "${1:-540}"
V=";JAX_SPARSE_ATTN_BSA_KQ_IMPL=kernel,JAX_SPARSE_ATTN_BSA_BWD_WS=tailconv;"
timeout 230 python3 -m benchmarks.bsa_bench --table-pass bwd --sweep-k --table "$V" \
  --out $O/sweep.json > $O/sweep.txt 2>&1
t "sweep rc=$?"; grep "^fit" $O/sweep.txt
timeout 70 python3 -m benchmarks.bsa_bench --table-pass bwd --rows 0,5,6 --table "$V" \
  --out $O/bwd.json > $O/bwd.txt 2>&1
t "bwd rows rc=$?"; grep -v "^wrote" $O/bwd.txt | tail -10
timeout 60 $PYT tests/test_robustness.py > $O/t_robust.txt 2>&1
t "robustness rc=$?: $(tail -1 $O/t_robust.txt)"
L=$(left)
LOGS=$O/gg OUT=$O PARTS="hstu bsa rab" HSTU_SHARDS=4 BSA_SHARDS=4 RAB_SHARDS=3 \
  T=$((L - 15)) bash tests/gpu_grids.sh > /dev/null 2>&1
t "grids done"; cat $O/summary.txt
