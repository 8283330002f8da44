#!/usr/bin/env bash
# Session 36, call D: the causal and fuzz cases that call C's time limit cut (node ids in
# scripts/sessions/gpu_s36_d_causal.txt and gpu_s36_d_fuzz.txt; fuzz seed 3636).
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/sessions/gpu_s36_d.sh [seconds]
# (then the forward table, default against streamk)
. "$(dirname "$0")/../gpu_lib.sh" d36 "${1:-200}"
D=$(dirname "$0")
timeout $((BUDGET - 10)) $PYT $(head -4 $D/gpu_s36_d_causal.txt) > $O/t_causal1.txt 2>&1 &
timeout $((BUDGET - 10)) $PYT $(tail -n +5 $D/gpu_s36_d_causal.txt) > $O/t_causal2.txt 2>&1 &
JSA_FUZZ_SEED=3636 timeout $((BUDGET - 10)) $PYT $(cat $D/gpu_s36_d_fuzz.txt) > $O/t_fuzz.txt 2>&1 &
wait
for f in causal1 causal2 fuzz; do t "$f: $(tail -1 $O/t_$f.txt)"; done
grep -h "^FAILED\|^E  " $O/t_*.txt | head -20
# the stream-K tail again, now that the epilogue it adds to every split item is cheaper
timeout 70 python3 -m benchmarks.bsa_bench --table ";JAX_SPARSE_ATTN_BSA_WS=streamk" \
  --table-pass fwd --out $O/fwd_sk.json > $O/fwd_sk.txt 2>&1
t "fwd table rc=$?"; grep -v "^wrote" $O/fwd_sk.txt | tail -18
