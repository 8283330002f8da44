#!/usr/bin/env bash
# Session 36, call C: TMA tensor stores of O are the block-sparse forward's default
# (bsa_fwd_ws=notmao the previous epilogue). (1) in parallel: the sm90ws forward's cases
# (default and notmao) and the stream-K cases (which now end in the TMA epilogue); the causal
# file; 24 fresh block-sparse fuzz cases (seed 3636); the extra options file; (2) then, alone,
# the forward table, default against notmao.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/sessions/gpu_s36_c.sh [seconds]
. "$(dirname "$0")/../gpu_lib.sh" c36 "${1:-330}"
T=$((BUDGET - 75))
timeout $T $PYT tests/test_gpu_bsa.py -k "sm90ws_forward or streamk" > $O/t_fwd.txt 2>&1 &
timeout $T $PYT tests/test_gpu_bsa_causal.py > $O/t_causal.txt 2>&1 &
JSA_FUZZ_SEED=3636 timeout $T $PYT tests/test_gpu_fuzz.py -k bsa > $O/t_fuzz.txt 2>&1 &
timeout $T $PYT tests/test_gpu_bsa_options_extra.py > $O/t_extra.txt 2>&1 &
wait
for f in fwd causal fuzz extra; do t "$f: $(tail -1 $O/t_$f.txt)"; done
grep -h "^FAILED\|^E  " $O/t_*.txt | head -20
timeout 70 python3 -m benchmarks.bsa_bench --table ";JAX_SPARSE_ATTN_BSA_WS=notmao" \
  --table-pass fwd --out $O/fwd.json > $O/fwd.txt 2>&1
t "fwd table rc=$?"; grep -v "^wrote" $O/fwd.txt | tail -18
