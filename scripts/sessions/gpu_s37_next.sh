#!/usr/bin/env bash
# Prepared in session 36 for the next device call: the HSTU forward's TMA stores
# (hstu_fwd_ws=tmao, opt-in; the HSTU grid and the sm90ws batches passed under it) on the
# GPU files the grid does not cover, through JAX_SPARSE_ATTN_HSTU_WS=tmao (read by every test
# that passes no switches): rab (three shards), GQA / paged / dynamic-deal / three-warpgroup
# tests of test_gpu_hstu.py, the inference extras; then the forward rows default against
# tmao with rab and the inference rows (all pass and no row slower: make tmao the default);
# then the packed GQA rows by TMA stores (bsa_fwd_ws=tmaopack).
# Two calls: PART=hstu (the default) and PART=pack.
# Usage (device, after `source .devcache/setup.sh`): [PART=pack] OUT=$OUT bash scripts/sessions/gpu_s37_next.sh [seconds]
. "$(dirname "$0")/../gpu_lib.sh" next37_${PART:-hstu} "${1:-560}"
if [ "${PART:-hstu}" = hstu ]; then
T=$((BUDGET - 250))
export JAX_SPARSE_ATTN_HSTU_WS=tmao
for i in 0 1 2; do
  HSTU_TEST_SHARD=$i/3 timeout $T $PYT tests/test_gpu_hstu_rab.py > $O/t_rab_$i.txt 2>&1 &
done
timeout $T $PYT -k "gqa_kernel or paged_kernel" tests/test_gpu_hstu.py > $O/t_gqa_paged.txt 2>&1 &
timeout $T $PYT -k "dynamic_deal or three_consumer or qscale_alpha" tests/test_gpu_hstu.py \
  > $O/t_deal_wg3.txt 2>&1 &
timeout $T $PYT tests/test_gpu_hstu_inference_extra.py > $O/t_inference.txt 2>&1 &
wait
for f in rab_0 rab_1 rab_2 gqa_paged deal_wg3 inference; do t "$f: $(tail -1 $O/t_$f.txt)"; done
grep -h "^FAILED\|^E  " $O/t_*.txt | head -20
unset JAX_SPARSE_ATTN_HSTU_WS
for r in 1 2; do
  for ws in "" tmao; do
    JAX_SPARSE_ATTN_HSTU_WS=$ws timeout 60 python3 -m benchmarks.hstu_bench \
      --case 8x4096-causal --case jagged32-causal --case 32x1024-causal --rab f32:1 --no-bwd \
      --out $O/fwd_rab_${r}_${ws:-default}.json > $O/fwd_rab_${r}_${ws:-default}.txt 2>&1
    t "hstu fwd (+ rab) round $r ${ws:-default} rc=$?"
    grep -v "^wrote" $O/fwd_rab_${r}_${ws:-default}.txt | tail -8
  done
done
timeout 90 python3 -m benchmarks.hstu_bench --inference all --no-bwd \
  --contiguous-variant JAX_SPARSE_ATTN_HSTU_WS=tmao \
  --paged-variant JAX_SPARSE_ATTN_HSTU_WS=tmao --out $O/inference.json > $O/inference.txt 2>&1
t "inference rows rc=$?"; grep -v "^wrote" $O/inference.txt | tail -20
fi
if [ "${PART:-hstu}" = pack ]; then
# the packed rows by TMA stores (bsa_fwd_ws=tmaopack, opt-in, built on CPU in session 36):
# the packed GPU file under it, then the packed prefill rows against the default
BSA_PACK_TEST_FWD_WS=tmaopack timeout 200 $PYT tests/test_gpu_bsa_pack_gqa.py \
  > $O/t_tmaopack.txt 2>&1
t "tmaopack tests rc=$?: $(tail -1 $O/t_tmaopack.txt)"
grep -h "^FAILED\|^E  " $O/t_tmaopack.txt | head -10
# (the packed rows read the switches from the environment; the first group of rows is the
# prefill forward, packed and unpacked)
for ws in "" tmaopack; do
  JAX_SPARSE_ATTN_BSA_WS=$ws timeout 60 python3 -m benchmarks.bsa_bench --pack-gqa \
    --out $O/pack_${ws:-default}.json > $O/pack_${ws:-default}.txt 2>&1
  t "packed rows ${ws:-default} rc=$?"; grep -v "^wrote" $O/pack_${ws:-default}.txt | head -6
done
fi
