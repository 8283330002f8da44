#!/usr/bin/env bash
# Session 34, call C: (1) on a quiet GPU, the forward table's rows with cross-item chaining
# (cross / crossepi) against the default now that the default epilogue is the cheaper
# pair-store one, and the pack_gqa rows (packed forward now on that epilogue too); (2) the
# HSTU forward tests call B's time limit cut (GQA, paged, split keys, deals, three consumer
# warpgroups, qscale, schedules) with epivec the default, three processes.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/sessions/gpu_s34_c.sh [seconds]
. "$(dirname "$0")/../gpu_lib.sh" c "${1:-540}"
timeout 130 python3 -m benchmarks.bsa_bench --table ";JAX_SPARSE_ATTN_BSA_WS=cross;JAX_SPARSE_ATTN_BSA_WS=crossepi" \
  --table-pass fwd --rows 0,1,3,4 --out $O/cross.json > $O/cross.txt 2>&1
t "cross table rc=$?"; grep -v "^wrote" $O/cross.txt | tail -16
timeout 90 python3 -m benchmarks.bsa_bench --pack-gqa --out $O/pack.json > $O/pack.txt 2>&1
t "pack rows rc=$?"; grep -v "^wrote" $O/pack.txt | tail -12
L=$(left)
K="gqa_kernel or paged_kernel or split_kv_kernel or dynamic_deal or three_consumer or qscale_alpha or schedule_kernel_vs or tq_zero"
for i in 0 1 2; do
  HSTU_TEST_SHARD=$i/3 timeout $((L - 15)) $PYT tests/test_gpu_hstu.py -k "$K" > $O/t_hstu_$i.txt 2>&1 &
done
wait
t "hstu tests done"
for f in $O/t_*.txt; do echo "$(basename $f): $(tail -1 $f)"; done | tee -a $O/timeline.txt
grep -h "^FAILED\|^E  " $O/t_*.txt 2>/dev/null | head -30
