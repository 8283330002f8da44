#!/usr/bin/env bash
# Prepared in session 39 for the next device call (not run yet): (1) the kernel cases of
# tests/test_robustness.py (the NaN-query / NaN-cotangent empty-row case is new), then (2) the
# HSTU, block-sparse and rab grids in fewer processes than tests/gpu_final.sh starts (session
# 39's call C ran 19 at once and each was cut by its limit), without the sanitizer part.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/sessions/gpu_s40_next.sh [seconds]
. "$(dirname "$0")/../gpu_lib.sh" next40 "${1:-560}"
timeout 150 $PYT tests/test_robustness.py > $O/t_robust.txt 2>&1
t "robustness rc=$?: $(tail -1 $O/t_robust.txt)"
grep -h "^FAILED" $O/t_robust.txt | head
L=$(left)
LOGS=/tmp/gg_next40 OUT=$O PARTS="hstu bsa rab" HSTU_SHARDS=4 BSA_SHARDS=4 RAB_SHARDS=3 \
  T=$((L - 20)) bash tests/gpu_grids.sh > /dev/null 2>&1
cat $O/summary.txt
