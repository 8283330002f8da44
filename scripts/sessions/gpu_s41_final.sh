#!/usr/bin/env bash
# Session 41's last device call: (1) in parallel, the pairwg forward's GPU cases (with and
# without turns), its causal cases, the K->Q list kernel's comparison (its third version:
# word-by-word entries), the preprocessing cases (kernel4 included) and the robustness
# kernel cases; then tailconv's cases (its reordering now launched by the backward's call);
# (2) per-kernel traces of the backward alone (blk64 25 %, blk128) with the list kernel,
# kernel4 and tailconv; (3) only if pairwg's cases passed: the blk64 forward rows
# 12.5 % and 25 %, default / pairwg / default.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/sessions/gpu_s41_final.sh [seconds]
. "$(dirname "$0")/../gpu_lib.sh" final41 "${1:-540}"
export JAX_SPARSE_ATTN_GPU_TEST_TIMEOUT=120
T=210
BSA_TEST_PAIR=pairwg timeout $T $PYT tests/test_gpu_bsa.py -k pairwg > $O/t_pair.txt 2>&1 &
BSA_TEST_PAIR=pairwg,nopingpong timeout $T $PYT tests/test_gpu_bsa.py -k pairwg \
  > $O/t_pair_nopp.txt 2>&1 &
timeout $T $PYT tests/test_gpu_bsa_causal.py -k pairwg > $O/t_pair_causal.txt 2>&1 &
timeout $T $PYT tests/test_gpu_kq_lists.py > $O/t_kq.txt 2>&1 &
timeout $T $PYT tests/test_gpu_bsa.py -k preprocess > $O/t_pre.txt 2>&1 &
timeout $T $PYT tests/test_robustness.py > $O/t_robust.txt 2>&1 &
wait
for f in pair pair_nopp pair_causal kq pre robust; do t "$f: $(tail -1 $O/t_$f.txt)"; done
grep -h "^FAILED\|^E  \|Timeout\|timed out" $O/t_*.txt | head -20
ok() { grep -q " passed" $O/t_$1.txt && ! grep -qi "failed\|error\|timeout" $O/t_$1.txt; }
timeout 120 $PYT tests/test_gpu_bwd_variants.py -k "tailconv and (9pairs or gqa8)" \
  > $O/t_tc.txt 2>&1
t "tc: $(tail -1 $O/t_tc.txt)"
for v in kq pre4 tc; do
  case $v in kq) ok kq || continue; E="JAX_SPARSE_ATTN_BSA_KQ_IMPL=kernel";;
             pre4) ok pre || continue; E="JAX_SPARSE_ATTN_BSA_PRE_IMPL=kernel4";;
             tc) ok tc || continue; E="JAX_SPARSE_ATTN_BSA_BWD_WS=tailconv";; esac
  env $E timeout 50 python3 scripts/gpu_trace.py --iters 10 --case bsa_bwd_blk64_25 \
    --case bsa_bwd_blk128 --out $O/trace_$v.json > $O/trace_$v.txt 2>&1
  t "trace $v rc=$?"; grep "^==\|us  x1" $O/trace_$v.txt | head -14
done
if ok pair; then
  timeout $(( $(left) - 10 )) python3 -m benchmarks.bsa_bench --table-pass fwd --rows 0,2 \
    --table ";JAX_SPARSE_ATTN_BSA_WS=pairwg;" --out $O/fwd.json > $O/fwd.txt 2>&1
  t "fwd rows rc=$?"; grep -v "^wrote" $O/fwd.txt | tail -10
else
  t "pairwg cases did not all pass: no pairwg rows"
fi
