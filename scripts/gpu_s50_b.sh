#!/usr/bin/env bash
# Session 50's prepared call (about 200 s, any Hopper GPU; ratios within the call): the
# block-sparse backward rows blk128 top-16 and S 32768 with the default, bsa_bwd_ws=dvwait
# (dK issued once the dV GEMM has completed) and the default again, sustained and burst; then
# tests/test_gpu_bwd_variants.py -k dvwait. If dvwait is faster in both rows, make it the
# default where it applies (config text, docs/design.md row, tests).
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/gpu_s50_b.sh [seconds]
. "$(dirname "$0")/gpu_lib.sh" s50b_dvwait "${1:-200}"
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv > $O/gpu.txt 2>&1
timeout 130 python3 -m benchmarks.bsa_bench --table-pass bwd --rows 3,4 --timing both \
  --table ";JAX_SPARSE_ATTN_BSA_BWD_WS=dvwait;" --out $O/bwd.json > $O/bwd.txt 2>&1
t "bwd rc=$?"; grep -v "^wrote" $O/bwd.txt | tail -6
timeout $(( $(left) - 5 )) $PYT tests/test_gpu_bwd_variants.py -k dvwait > $O/t_dvwait.txt 2>&1
t "dvwait: $(tail -1 $O/t_dvwait.txt)"
grep -h "^FAILED\|^ERROR\|Timeout\|timed out" $O/t_*.txt | head -20
