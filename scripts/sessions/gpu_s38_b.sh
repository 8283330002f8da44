#!/usr/bin/env bash
# Session 38, call B: the sm90ws BSA forward at blk 64 / D 128 with three CTAs per SM and no
# producer warp (bsa_fwd_ws=selfload: the consumer warpgroup's warp 0 issues the TMA loads of
# Q, K (one stage) and V (two stages) as the warpgroup frees them; 128 threads, 159
# registers, no spills). (1) in parallel: its own cases and the blk 64 / D 128 grid cases
# under it, and (LARGE=1) the tensors of more than 2**31 elements; (2) alone: the blk 64
# forward rows, default against selfload (sustained, interleaved).
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/sessions/gpu_s38_b.sh [seconds]
. "$(dirname "$0")/../gpu_lib.sh" b38 "${1:-540}"
T=$((BUDGET - 150))
BSA_TEST_K1=selfload timeout $T $PYT tests/test_gpu_bsa.py -k ctas3k1 > $O/t_sl.txt 2>&1 &
ids=$(BSA_TEST_IMPLS=nodefault,selfload python3 -m pytest -m gpu --collect-only -q \
  tests/test_gpu_bsa.py -k TestBSAKernelGrid 2>/dev/null | grep -- '-64-' | grep -v 'd32\|d256\|d64')
set -- $ids
half=$(( ($# + 1) / 2 ))
BSA_TEST_IMPLS=nodefault,selfload timeout $T $PYT "${@:1:$half}" > $O/t_grid0.txt 2>&1 &
BSA_TEST_IMPLS=nodefault,selfload timeout $T $PYT "${@:$((half + 1))}" > $O/t_grid1.txt 2>&1 &
if [ "${LARGE:-0}" = 1 ] && [ -f tests/test_gpu_large_tensors.py ]; then
  timeout $T $PYT tests/test_gpu_large_tensors.py > $O/t_large.txt 2>&1 &
fi
wait
for f in sl grid0 grid1 large; do [ -f $O/t_$f.txt ] && t "$f: $(tail -1 $O/t_$f.txt)"; done
grep -h "^FAILED\|^E  " $O/t_*.txt | head -20
timeout $(( $(left) - 10 )) python3 -m benchmarks.bsa_bench --table-pass fwd --rows 0,1,2,5 \
  --table ";JAX_SPARSE_ATTN_BSA_WS=selfload;;JAX_SPARSE_ATTN_BSA_WS=selfload" \
  --out $O/fwd.json > $O/fwd.txt 2>&1
t "fwd rows rc=$?"; grep -v "^wrote" $O/fwd.txt | tail -24
