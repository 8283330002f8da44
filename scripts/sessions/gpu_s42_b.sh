#!/usr/bin/env bash
# Session 42's second device call, on the new block-sparse backward defaults (the K->Q list
# kernel, tailconv): (1) in parallel, the block-sparse grid (two shards), the sm90ws backward
# cases with the public-API checks, the causal, pack_gqa and options files, the robustness
# kernel cases, the list kernel's comparison and the tailconv / notailconv / hlpt variants;
# (2) the table's blk64 12.5 %, blk128, S 32768 and GQA backward rows (sustained): new default / the old one (XLA lists,
# notailconv) / hlpt / new default.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/sessions/gpu_s42_b.sh [seconds]
. "$(dirname "$0")/../gpu_lib.sh" s42b "${1:-540}"
export JAX_SPARSE_ATTN_GPU_TEST_TIMEOUT=150
T=${TT:-240}
bsa_grid_bg $T
timeout $T $PYT tests/test_gpu_bsa_causal.py > $O/t_causal.txt 2>&1 &
timeout $T $PYT tests/test_gpu_bsa_pack_gqa.py > $O/t_pack.txt 2>&1 &
timeout $T $PYT tests/test_gpu_bsa_options_extra.py > $O/t_opts.txt 2>&1 &
timeout $T $PYT tests/test_robustness.py > $O/t_robust.txt 2>&1 &
timeout $T $PYT tests/test_gpu_kq_lists.py > $O/t_kq.txt 2>&1 &
timeout $T $PYT tests/test_gpu_bwd_variants.py -k "tailconv and (9pairs or 16pairs)" \
  > $O/t_tc.txt 2>&1 &
wait
for f in grid0 grid1 grid2 ws causal pack opts robust kq tc; do t "$f: $(tail -1 $O/t_$f.txt)"; done
grep -h "^FAILED\|^ERROR\|Timeout\|timed out" $O/t_*.txt | head -20
V=";JAX_SPARSE_ATTN_BSA_KQ_IMPL=xla,JAX_SPARSE_ATTN_BSA_BWD_WS=notailconv;JAX_SPARSE_ATTN_BSA_BWD_WS=hlpt;"
timeout $(( $(left) - 10 )) python3 -m benchmarks.bsa_bench --table-pass bwd --rows 0,3,4,5 --table "$V" \
  --out $O/bwd.json > $O/bwd.txt 2>&1
t "bwd rows rc=$?"; grep -v "^wrote" $O/bwd.txt | tail -34
