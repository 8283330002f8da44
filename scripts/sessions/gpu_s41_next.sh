#!/usr/bin/env bash
# Prepared in session 40 (no device that session; not run yet) for the next device call:
# (1) in parallel, each process under its own time limit: the opt-in forward variant
# bsa_fwd_ws=pairwg (blk 64: one CTA per SM of two consumer warpgroups with work items of
# their own, turns at their GEMMs) on its own cases with and without ping-pong and with
# nooverlap + q1 + vlag and qregs + stages=8, its causal
# cases, the blk 64 cases of the BSA grid under it, and the kernel cases of
# tests/test_robustness.py (left over from session 39's plan, scripts/sessions/gpu_s40_next.sh);
# (2) alone, only if the pairwg cases passed without a hang: the blk 64 forward rows (12.5 %,
# 5 %, 25 %, GQA 16:4, D 64), default / pairwg / pairwg + nopingpong / default (sustained);
# (3) the blk 64 12.5 % and 25 % rows with neighbouring query blocks sharing their lists
# (bsa_bench --lists paired), default (and pairwg if it passed).
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/sessions/gpu_s41_next.sh [seconds]
. "$(dirname "$0")/../gpu_lib.sh" next41 "${1:-560}"
export JAX_SPARSE_ATTN_GPU_TEST_TIMEOUT=120
T=$((BUDGET - 260))
BSA_TEST_PAIR=pairwg timeout $T $PYT tests/test_gpu_bsa.py -k pairwg > $O/t_pair.txt 2>&1 &
BSA_TEST_PAIR=pairwg,nopingpong timeout $T $PYT tests/test_gpu_bsa.py -k pairwg \
  > $O/t_pair_nopp.txt 2>&1 &
BSA_TEST_PAIR=pairwg,nooverlap,q1,vlag timeout $T $PYT tests/test_gpu_bsa.py -k pairwg \
  > $O/t_pair_flags1.txt 2>&1 &
BSA_TEST_PAIR=pairwg,qregs,stages=8 timeout $T $PYT tests/test_gpu_bsa.py -k pairwg \
  > $O/t_pair_flags2.txt 2>&1 &
timeout $T $PYT tests/test_gpu_bsa_causal.py -k pairwg > $O/t_pair_causal.txt 2>&1 &
ids=$(BSA_TEST_IMPLS=nodefault,pairwg python3 -m pytest -m gpu --collect-only -q \
  tests/test_gpu_bsa.py -k TestBSAKernelGrid 2>/dev/null | grep -- '-64-' | grep -v 'd32\|d256')
BSA_TEST_IMPLS=nodefault,pairwg timeout $T $PYT $ids > $O/t_pair_grid.txt 2>&1 &
timeout $T $PYT tests/test_robustness.py > $O/t_robust.txt 2>&1 &
wait
for f in pair pair_nopp pair_flags1 pair_flags2 pair_causal pair_grid robust; do t "$f: $(tail -1 $O/t_$f.txt)"; done
grep -h "^FAILED\|^E  \|Timeout\|timed out" $O/t_*.txt | head -20
V=";"
if grep -q " passed" $O/t_pair.txt && ! grep -qi "failed\|error\|timeout" $O/t_pair.txt; then
  V=";JAX_SPARSE_ATTN_BSA_WS=pairwg"
  timeout $(( $(left) - 70 )) python3 -m benchmarks.bsa_bench --table-pass fwd --rows 0,1,2,5,6 \
    --table ";JAX_SPARSE_ATTN_BSA_WS=pairwg;JAX_SPARSE_ATTN_BSA_WS=pairwg+nopingpong;" \
    --out $O/fwd.json > $O/fwd.txt 2>&1
  t "fwd rows rc=$?"; grep -v "^wrote" $O/fwd.txt | tail -30
else
  t "pairwg cases did not all pass: no pairwg benchmark"
fi
# neighbouring query blocks sharing their lists (blk 64 12.5 % and 25 %): whether the K/V
# blocks two concurrent items read in common change the L2-bound time
timeout $(( $(left) - 10 )) python3 -m benchmarks.bsa_bench --table-pass fwd --rows 0,2 \
  --lists paired --table "$V" --out $O/paired.json > $O/paired.txt 2>&1
t "paired rows rc=$?"; grep -v "^wrote" $O/paired.txt | tail -8
