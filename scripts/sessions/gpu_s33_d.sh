#!/usr/bin/env bash
# Session 33, call D: bsa_fwd_ws=epivec (the epilogue stages O with packed 4-byte stores into a
# row-swizzled shared tile and copies it out in 16-byte pieces; the default's element copies
# of the swizzled layout compile to 64 2-byte stores and 64 2-byte loads per thread): smoke,
# the list-length sweep default vs epivec, the forward table rows (both timings), the grid
# with epivec and the sm90ws forward's own cases (poisoned outputs, NaN in unlisted blocks).
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/sessions/gpu_s33_d.sh [seconds]
. "$(dirname "$0")/../gpu_lib.sh" d "${1:-480}"
BSA_TEST_IMPLS=epivec,nodefault timeout 120 $PYT \
  tests/test_gpu_bsa.py -k "TestBSAKernelGrid and (bf16-bhsd-64-mha-fixed or fp16-bshd-128-gqa-var-r3)" > $O/t_smoke.txt 2>&1
rc=$?
t "epivec smoke rc=$rc: $(tail -1 $O/t_smoke.txt)"
if [ $rc -eq 0 ]; then
  timeout 110 python3 -m benchmarks.bsa_bench --table ";JAX_SPARSE_ATTN_BSA_WS=epivec" --sweep-k \
    --table-pass fwd --out $O/sweep.json > $O/sweep.txt 2>&1
  t "sweep rc=$?"; grep -v "^wrote" $O/sweep.txt | tail -32
  timeout 120 python3 -m benchmarks.bsa_bench --timing both --table ";JAX_SPARSE_ATTN_BSA_WS=epivec" \
    --table-pass fwd --rows 0,1,2,3,4,5,6,7 --out $O/table.json > $O/table.txt 2>&1
  t "table rc=$?"; grep -v "^wrote" $O/table.txt | tail -20
  L=$(left)
  BSA_TEST_IMPLS=epivec,nodefault timeout $((L - 10)) $PYT \
    tests/test_gpu_bsa.py -k "TestBSAKernelGrid" > $O/t_grid.txt 2>&1
  t "epivec grid rc=$?: $(tail -1 $O/t_grid.txt)"
fi
grep -h "FAILED\|^E  \|passed\|failed" $O/t_*.txt 2>/dev/null | head -40 | tee -a $O/timeline.txt
