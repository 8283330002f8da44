#!/usr/bin/env bash
# Session 48's prepared call (about 300 s, any Hopper GPU; ratios within the call): (1) the
# blk128 and S 32768 backward rows, default / wghand / default, sustained and burst (the dQ
# writer warp handing each consumer warpgroup its half of the staging tile on its own);
# (2) its GPU tests (tests/test_gpu_bwd_variants.py::test_bsa_bwd_wghand: the blk128 sm90ws
# backward cases, alone, with persist and with zerolag).
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/gpu_s48_a.sh [seconds]
. "$(dirname "$0")/gpu_lib.sh" s48a "${1:-300}"
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv > $O/gpu.txt 2>&1
W=JAX_SPARSE_ATTN_BSA_BWD_WS
timeout $(( $(left) - 130 )) python3 -m benchmarks.bsa_bench --table-pass bwd --rows 3,4 \
  --timing both --table ";$W=wghand;" --out $O/bwd128.json > $O/bwd128.txt 2>&1
t "bwd128 rows rc=$?"; grep -v "^wrote" $O/bwd128.txt | tail -8
T=$(( $(left) - 10 ))
timeout $T $PYT tests/test_gpu_bwd_variants.py -k wghand > $O/t_wghand.txt 2>&1
t "wghand: $(tail -1 $O/t_wghand.txt)"
grep -h "^FAILED\|^ERROR\|Timeout\|timed out" $O/t_*.txt | head -20
