#!/usr/bin/env bash
# Session 43's second device call: the blk128 and S 32768 backward rows, sustained and burst
# in one process (variants interleaved, the default first and last): default, persist with
# persistkv=0 / 1 / 2 (the default of persist), default.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/gpu_s43_b.sh [seconds]
. "$(dirname "$0")/gpu_lib.sh" s43b "${1:-400}"
W=JAX_SPARSE_ATTN_BSA_BWD_WS
V=";$W=persist,persistkv=0;$W=persist,persistkv=1;$W=persist;"
timeout $(( $(left) - 10 )) python3 -m benchmarks.bsa_bench --table-pass bwd --rows 4,3 \
  --timing both --table "$V" --out $O/bwd.json > $O/bwd.txt 2>&1
t "bwd rows rc=$?"; grep -v "^wrote" $O/bwd.txt | tail -20
