#!/usr/bin/env bash
# What session 31 built but could not run on the GPU: the packws backward (pack_gqa on the
# warp-specialized kernel, with and without causal), causal with splitwait / decouple, the
# det_store vs detzero value checks, the sm90ws backward case cut by a time limit; then the
# packed prefill backward timed with and without packws. (Ran as session 32's call A, before
# packws became the default: the cases it selects with -k packws are now the default ones,
# and the four former packws cases are named *-sm90bwd with bsa_bwd_ws=nopackws.)
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/sessions/gpu_s32_next.sh [seconds]
. "$(dirname "$0")/../gpu_lib.sh" next "${1:-540}"
timeout 150 $PYT tests/test_gpu_bsa_pack_gqa.py -k packws > $O/t_packws.txt 2>&1
t "pack_gqa packws rc=$?: $(tail -1 $O/t_packws.txt)"
timeout 120 $PYT tests/test_gpu_bsa_causal.py -k "packws or splitwait or decouple" > $O/t_causal.txt 2>&1
t "causal packws / variants rc=$?: $(tail -1 $O/t_causal.txt)"
timeout 150 $PYT tests/test_gpu_bsa.py -k "(deterministic and (mha or k63-default or slots4)) or gqa8-blk64-d128-all" > $O/t_det.txt 2>&1
t "det cmp_zero + gqa8 rc=$?: $(tail -1 $O/t_det.txt)"
L=$(left)
if [ $L -gt 40 ]; then
  timeout $((L - 10)) python3 -m benchmarks.bsa_bench --pack-gqa --out $O/bench_pack.json > $O/bench_pack.txt 2>&1
  t "bench pack rc=$?"; grep -v "^wrote" $O/bench_pack.txt
fi
grep -h "FAILED\|^E  \|passed\|failed" $O/t_*.txt 2>/dev/null | head -40 | tee -a $O/timeline.txt
