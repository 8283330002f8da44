#!/usr/bin/env bash
# The sm90ws forward with Q as the register operand of its S GEMMs (bsa_fwd_ws=qregs):
# forward table rows default vs qregs (sustained and burst), then the BSA grid with qregs.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/sessions/gpu_s32_d.sh [seconds]
. "$(dirname "$0")/../gpu_lib.sh" d "${1:-480}"
# a quick correctness smoke of qregs first (one case per block size), so a wrong kernel
# does not cost the whole call
BSA_TEST_IMPLS=qregs,nodefault timeout 120 $PYT \
  tests/test_gpu_bsa.py -k "TestBSAKernelGrid and (bf16-bhsd-64-mha-fixed or fp16-bshd-128-gqa-var-r3)" > $O/t_smoke.txt 2>&1
t "qregs smoke rc=$?: $(tail -1 $O/t_smoke.txt)"
timeout 200 python3 -m benchmarks.bsa_bench --timing both --table ";JAX_SPARSE_ATTN_BSA_WS=qregs" \
  --table-pass fwd --rows 0,1,2,3,4,5 --out $O/bench_fwd.json > $O/bench_fwd.txt 2>&1
t "bench fwd rc=$?"; grep -v "^wrote" $O/bench_fwd.txt | tail -20
L=$(left)
if [ $L -gt 40 ]; then
  BSA_TEST_IMPLS=qregs,nodefault timeout $((L - 10)) $PYT \
    tests/test_gpu_bsa.py -k TestBSAKernelGrid > $O/t_grid.txt 2>&1
  t "qregs grid rc=$?: $(tail -1 $O/t_grid.txt)"
fi
grep -h "FAILED\|^E  \|passed\|failed" $O/t_*.txt 2>/dev/null | head -40 | tee -a $O/timeline.txt
