#!/usr/bin/env bash
# Session 38, call A: the sm90ws BSA forward with three CTAs per SM at blk 64 / D 128
# (bsa_fwd_ws=ctas3k1: one K buffer, two V buffers, O staged in the Q buffer, a one-warp
# producer, 160 threads at 128 registers) and with it the non-overlapped mainloop
# (ctas3k1+nooverlap, which ptxas compiles with 16 bytes of spills instead of 148).
# (1) in parallel: its own cases (two flag sets) and the blk 64 / D 128 grid cases under it;
# (2) alone: the blk 64 forward rows, default against both variants (sustained).
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/sessions/gpu_s38_a.sh [seconds]
. "$(dirname "$0")/../gpu_lib.sh" a38 "${1:-540}"
T=$((BUDGET - 200))
BSA_TEST_K1=ctas3k1 timeout $T $PYT tests/test_gpu_bsa.py -k ctas3k1 > $O/t_k1.txt 2>&1 &
BSA_TEST_K1=ctas3k1,nooverlap timeout $T $PYT tests/test_gpu_bsa.py -k ctas3k1 > $O/t_k1no.txt 2>&1 &
ids=$(BSA_TEST_IMPLS=nodefault,ctas3k1 python3 -m pytest -m gpu --collect-only -q \
  tests/test_gpu_bsa.py -k TestBSAKernelGrid 2>/dev/null | grep -- '-64-' | grep -v 'd32\|d256\|d64')
set -- $ids
half=$(( ($# + 1) / 2 ))
BSA_TEST_IMPLS=nodefault,ctas3k1 timeout $T $PYT "${@:1:$half}" > $O/t_grid0.txt 2>&1 &
BSA_TEST_IMPLS=nodefault,ctas3k1 timeout $T $PYT "${@:$((half + 1))}" > $O/t_grid1.txt 2>&1 &
wait
for f in k1 k1no grid0 grid1; do t "$f: $(tail -1 $O/t_$f.txt)"; done
grep -h "^FAILED\|^E  " $O/t_*.txt | head -20
timeout $(( $(left) - 10 )) python3 -m benchmarks.bsa_bench --table-pass fwd --rows 0,1,2,5 \
  --table ";JAX_SPARSE_ATTN_BSA_WS=ctas3k1;JAX_SPARSE_ATTN_BSA_WS=ctas3k1+nooverlap;" \
  --out $O/fwd.json > $O/fwd.txt 2>&1
t "fwd rows rc=$?"; grep -v "^wrote" $O/fwd.txt | tail -24
