#!/usr/bin/env bash
# pack_gqa's backward on the warp-specialized kernel by default (packws): the whole packed
# grid, the packed causal cases, compute-sanitizer memcheck of packed option cases with
# garbage metadata, then bsa_bench --pack-gqa (prefill blk128 and blk64, decode, backward
# against nopackws).
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/sessions/gpu_s32_b.sh [seconds]
. "$(dirname "$0")/../gpu_lib.sh" b "${1:-540}"
timeout 200 $PYT tests/test_gpu_bsa_pack_gqa.py > $O/t_pack.txt 2>&1
t "pack_gqa grid rc=$?: $(tail -1 $O/t_pack.txt)"
timeout 100 $PYT tests/test_gpu_bsa_causal.py -k pack > $O/t_causal.txt 2>&1
t "causal pack rc=$?: $(tail -1 $O/t_causal.txt)"
for only in "r=8 causal=True kv_splits=3" "r=4 causal=True kv_splits=1"; do
  L=$(left); [ $L -lt 150 ] && break
  timeout 80 compute-sanitizer --tool memcheck --report-api-errors no \
    --error-exitcode 9 python3 tests/sanitize_grid.py --only "$only" > "$O/san_${only// /_}.txt" 2>&1
  t "sanitize rc=$? $(grep -h 'ERROR SUMMARY' "$O/san_${only// /_}.txt" | tail -1) | $only"
done
L=$(left)
if [ $L -gt 40 ]; then
  timeout $((L - 10)) python3 -m benchmarks.bsa_bench --pack-gqa --out $O/bench_pack.json > $O/bench_pack.txt 2>&1
  t "bench pack rc=$?"; grep -v "^wrote" $O/bench_pack.txt
fi
grep -h "FAILED\|^E  \|passed\|failed" $O/t_*.txt 2>/dev/null | head -40 | tee -a $O/timeline.txt
