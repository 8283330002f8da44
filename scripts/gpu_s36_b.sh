#!/usr/bin/env bash
# Session 36, call B: what call A's time limit cut: (1) the sm90ws forward's cases with
# bsa_fwd_ws=tmao and the two D 64 grid cases under it (call A passed the first 17 grid cases);
# (2) the forward table, default against tmao, three rounds (sustained).
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/gpu_s36_b.sh [seconds]
. "$(dirname "$0")/gpu_lib.sh" b36 "${1:-330}"
BSA_TEST_IMPLS=tmao,nodefault timeout 200 $PYT tests/test_gpu_bsa.py \
  -k "tma_o or (TestBSAKernelGrid and d64)" > $O/t_tmao.txt 2>&1
rc=$?
t "tmao tests rc=$rc: $(tail -1 $O/t_tmao.txt)"
grep -h "^FAILED\|^E  \|Error" $O/t_tmao.txt | head -20
for r in 1 2 3; do
  [ $(left) -gt 45 ] || break
  timeout 100 python3 -m benchmarks.bsa_bench --table ";JAX_SPARSE_ATTN_BSA_WS=tmao" \
    --table-pass fwd --out $O/fwd_$r.json > $O/fwd_$r.txt 2>&1
  t "fwd table round $r rc=$?"; grep -v "^wrote" $O/fwd_$r.txt | tail -18
done
