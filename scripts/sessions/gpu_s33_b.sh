#!/usr/bin/env bash
# Session 33, call B: the forward's per-work-item cost. A smoke test of bsa_fwd_ws=mpre (the
# next item's list metadata loaded during the current item), then the list-length sweep
# (bsa_bench --sweep-k: blk64 / blk128, top-k 1..64, default vs mpre vs cross, fit
# ms = a + b k), then the BSA grid with mpre.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/sessions/gpu_s33_b.sh [seconds]
. "$(dirname "$0")/../gpu_lib.sh" b "${1:-480}"
BSA_TEST_IMPLS=mpre,nodefault timeout 120 $PYT \
  tests/test_gpu_bsa.py -k "TestBSAKernelGrid and (bf16-bhsd-64-mha-fixed or fp16-bshd-128-gqa-var-r3)" > $O/t_smoke.txt 2>&1
rc=$?
t "mpre smoke rc=$rc: $(tail -1 $O/t_smoke.txt)"
V=";JAX_SPARSE_ATTN_BSA_WS=mpre"
[ $rc -eq 0 ] || V=""
timeout 260 python3 -m benchmarks.bsa_bench --table "$V;JAX_SPARSE_ATTN_BSA_WS=cross" --sweep-k \
  --table-pass fwd --out $O/sweep.json > $O/sweep.txt 2>&1
t "sweep rc=$?"; grep -v "^wrote" $O/sweep.txt | tail -60
L=$(left)
if [ $rc -eq 0 ] && [ $L -gt 40 ]; then
  BSA_TEST_IMPLS=mpre,nodefault timeout $((L - 10)) $PYT \
    tests/test_gpu_bsa.py -k TestBSAKernelGrid > $O/t_grid.txt 2>&1
  t "mpre grid rc=$?: $(tail -1 $O/t_grid.txt)"
fi
grep -h "FAILED\|^E  \|passed\|failed" $O/t_*.txt 2>/dev/null | head -40 | tee -a $O/timeline.txt
