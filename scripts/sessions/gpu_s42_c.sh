#!/usr/bin/env bash
# Session 42's third device call, on the block-sparse backward defaults with hlpt (longest
# K->Q list first within each (batch, KV head)): (1) in parallel, the block-sparse grid
# (three shards), the sm90ws backward cases with the public-API checks, the causal file
# (two shards), the pack_gqa file (three shards), the options file and the zerolag cases
# (with hlpt now); (2) the blk64 12.5 %, blk128 and GQA 16:4 backward rows (sustained):
# default / nolpt / default.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/sessions/gpu_s42_c.sh [seconds]
. "$(dirname "$0")/../gpu_lib.sh" s42c "${1:-540}"
export JAX_SPARSE_ATTN_GPU_TEST_TIMEOUT=150
T=${TT:-300}
shard() {  # FILE N I: every N-th collected test of FILE from the I-th
  python3 -m pytest -m gpu --collect-only -q -p no:cacheprovider "$1" 2>/dev/null \
    | grep "::" | awk -v n="$2" -v i="$3" 'NR % n == i'
}
bsa_grid_bg $T
for i in 0 1; do
  timeout $T $PYT $(shard tests/test_gpu_bsa_causal.py 2 $i) > $O/t_causal$i.txt 2>&1 &
done
for i in 0 1 2; do
  timeout $T $PYT $(shard tests/test_gpu_bsa_pack_gqa.py 3 $i) > $O/t_pack$i.txt 2>&1 &
done
timeout $T $PYT tests/test_gpu_bsa_options_extra.py > $O/t_opts.txt 2>&1 &
timeout $T $PYT tests/test_gpu_bwd_variants.py -k "test_bsa_bwd_zerolag or (tailconv and \
  zerolag and (9pairs or 16pairs))" > $O/t_zl.txt 2>&1 &
wait
for f in grid0 grid1 grid2 ws causal0 causal1 pack0 pack1 pack2 opts zl; do
  t "$f: $(tail -1 $O/t_$f.txt)"; done
grep -h "^FAILED\|^ERROR\|Timeout\|timed out" $O/t_*.txt | head -20
V=";JAX_SPARSE_ATTN_BSA_BWD_WS=nolpt;"
timeout $(( $(left) - 10 )) python3 -m benchmarks.bsa_bench --table-pass bwd --rows 0,3,5 \
  --table "$V" --out $O/bwd.json > $O/bwd.txt 2>&1
t "bwd rows rc=$?"; grep -v "^wrote" $O/bwd.txt | tail -12
