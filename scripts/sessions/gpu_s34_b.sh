#!/usr/bin/env bash
# Session 34, call B: the epilogue with packed pair stores (epivec) as the HSTU forward's
# default and on the packed-GQA block-sparse forward: the HSTU grids (default + sm90ws
# batches), rab, the inference file (paged K / V, split keys) and the packed-GQA / causal
# block-sparse files, all as concurrent processes (correctness only; no timing here).
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/sessions/gpu_s34_b.sh [seconds]
. "$(dirname "$0")/../gpu_lib.sh" b "${1:-420}"
export LOGS=$O/logs
PARTS="hstu rab" HSTU_SHARDS=4 RAB_SHARDS=3 T=$((BUDGET - 20)) OUT=$O/grids bash tests/gpu_grids.sh \
  > /dev/null 2>&1 &
for i in 0 1 2; do
  BSA_PACK_SHARD=$i/3 timeout $((BUDGET - 20)) $PYT tests/test_gpu_bsa_pack_gqa.py \
    > $O/t_pack_$i.txt 2>&1 &
done
timeout $((BUDGET - 20)) $PYT tests/test_gpu_bsa_causal.py -k pack > $O/t_causal_pack.txt 2>&1 &
timeout $((BUDGET - 20)) $PYT tests/test_gpu_hstu_inference_extra.py > $O/t_hstu_inference.txt 2>&1 &
wait
t "done"
cat $O/grids/summary.txt
for f in $O/t_*.txt; do echo "$(basename $f): $(tail -1 $f)"; done | tee -a $O/timeline.txt
grep -h "^FAILED\|^E  " $O/t_*.txt 2>/dev/null | head -30
