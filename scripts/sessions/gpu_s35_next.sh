#!/usr/bin/env bash
# What session 34 left unrun on the GPU:
# (1) bsa_bwd_ws=dqclaim (opt-in, built on CPU): its GPU test (every sm90ws backward case,
#     empty rows included), then the backward table rows default / dqclaim (sustained);
# (2) the whole HSTU grid (four shards) and the rab shard its call B cut, with the pair-store
#     epilogue (epivec) as the HSTU forward's default, run without other processes competing
#     (tests/gpu_grids.sh), then the packed-GQA shard call B cut (BSA_PACK_SHARD=0/3).
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/sessions/gpu_s35_next.sh [seconds]
. "$(dirname "$0")/../gpu_lib.sh" next35 "${1:-560}"
timeout 150 $PYT tests/test_gpu_bwd_variants.py -k "test_bsa_bwd_dqclaim" > $O/t_dqclaim.txt 2>&1
rc=$?
t "dqclaim tests rc=$rc: $(tail -1 $O/t_dqclaim.txt)"
if [ $rc -eq 0 ]; then
  timeout 150 python3 -m benchmarks.bsa_bench --table ";JAX_SPARSE_ATTN_BSA_BWD_WS=dqclaim" \
    --table-pass bwd --rows 0,2,3,4 --out $O/dqclaim.json > $O/dqclaim.txt 2>&1
  t "dqclaim table rc=$?"; grep -v "^wrote" $O/dqclaim.txt | tail -10
fi
export LOGS=$O/logs
PARTS="hstu rab" HSTU_SHARDS=4 RAB_SHARDS=3 T=$(($(left) - 100)) OUT=$O/grids bash tests/gpu_grids.sh \
  > /dev/null 2>&1
t "grids done"; cat $O/grids/summary.txt
BSA_PACK_SHARD=0/3 timeout $(($(left) - 10)) $PYT tests/test_gpu_bsa_pack_gqa.py > $O/t_pack_0.txt 2>&1
t "pack shard 0 rc=$?: $(tail -1 $O/t_pack_0.txt)"
