#!/usr/bin/env bash
# Session 37, call B: the TMA-store epilogues as the defaults (hstu_fwd_ws: tmao unless
# notmao; bsa_fwd_ws: packed GQA rows by 5-D TMA stores unless notmaopack). (1) in parallel:
# the whole packed GPU file in four shards (node ids i::4) and the HSTU sm90ws batches in two
# shards, all with the default switches; (2) alone, interleaved rounds: the packed prefill
# forward rows default against notmaopack, then the HSTU forward rows default against notmao.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/sessions/gpu_s37_b.sh [seconds]
. "$(dirname "$0")/../gpu_lib.sh" b37 "${1:-420}"
T=$((BUDGET - 190))
ids=$(JAX_PLATFORMS=cpu python3 -m pytest --collect-only -q -p no:cacheprovider \
      tests/test_gpu_bsa_pack_gqa.py 2>/dev/null | grep "::")
t "packed GPU tests: $(echo "$ids" | wc -l)"
for i in 0 1 2 3; do
  sel=$(echo "$ids" | awk -v i=$i 'NR % 4 == i')
  timeout $T $PYT $sel > $O/t_pack_$i.txt 2>&1 &
done
for i in 0 1; do
  HSTU_TEST_SM90=sm90ws HSTU_TEST_SHARD=$i/2 timeout $T $PYT -k sm90ws_batches \
    tests/test_gpu_hstu.py > $O/t_hstu_ws_$i.txt 2>&1 &
done
wait
for f in pack_0 pack_1 pack_2 pack_3 hstu_ws_0 hstu_ws_1; do t "$f: $(tail -1 $O/t_$f.txt)"; done
grep -h "^FAILED\|^E  " $O/t_*.txt | head -20
for r in 1 2; do
  for ws in "" notmaopack; do
    JAX_SPARSE_ATTN_BSA_WS=$ws timeout 40 python3 -m benchmarks.bsa_bench --pack-gqa \
      --out $O/pack_${r}_${ws:-default}.json > $O/pack_${r}_${ws:-default}.txt 2>&1
    t "packed rows round $r ${ws:-default} rc=$?"
    grep "fwd" $O/pack_${r}_${ws:-default}.txt | head -4
  done
done
for r in 1 2; do
  for ws in "" notmao; do
    JAX_SPARSE_ATTN_HSTU_WS=$ws timeout 45 python3 -m benchmarks.hstu_bench \
      --case 8x4096-causal --case 32x1024-causal --case jagged32-causal --case 64x512-causal \
      --case 8x4096-causal-d64 --no-bwd --out $O/hstu_${r}_${ws:-default}.json \
      > $O/hstu_${r}_${ws:-default}.txt 2>&1
    t "hstu fwd round $r ${ws:-default} rc=$?"; grep -v "^wrote" $O/hstu_${r}_${ws:-default}.txt | tail -5
  done
done
