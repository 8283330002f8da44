#!/usr/bin/env bash
# Session 51's prepared call (about 520 s, any Hopper GPU; ratios within the call): the
# block-sparse backward rows blk128 top-16 and S 32768 with the default, bsa_bwd_ws=dklag (a
# step's dK GEMM issued in the next step, after its S^T / dP^T GEMMs), bsa_bwd_ws=dvwait and
# the default again, sustained and burst; then the GPU cases of both switches
# (tests/test_gpu_bwd_variants.py -k "dklag or dvwait"). A switch faster in both rows in
# both readings becomes the default where it applies (config text, docs/design.md row, tests).
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/gpu_s51_a.sh [seconds]
. "$(dirname "$0")/gpu_lib.sh" s51a_dklag "${1:-520}"
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv > $O/gpu.txt 2>&1
timeout 220 python3 -m benchmarks.bsa_bench --table-pass bwd --rows 3,4 --timing both \
  --table ";JAX_SPARSE_ATTN_BSA_BWD_WS=dklag;JAX_SPARSE_ATTN_BSA_BWD_WS=dvwait;" \
  --out $O/bwd.json > $O/bwd.txt 2>&1
t "bwd rc=$?"; grep -v "^wrote" $O/bwd.txt | tail -10
timeout $(( $(left) - 5 )) $PYT tests/test_gpu_bwd_variants.py -k "dklag or dvwait" \
  > $O/t_lag.txt 2>&1
t "dklag / dvwait: $(tail -1 $O/t_lag.txt)"
grep -h "^FAILED\|^ERROR\|Timeout\|timed out" $O/t_*.txt | head -20
