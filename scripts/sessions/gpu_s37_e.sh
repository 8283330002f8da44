#!/usr/bin/env bash
# Session 37, call E: the packed decode forward (B 16, H_q 32 / H_kv 4, S_q 16, S_kv 16384,
# blk128 12.5 %; one packed block per KV head) with the packed rows' TMA stores (default)
# against notmaopack, one split and kv_splits="auto", three interleaved rounds, each variant
# in its own process (the switches are read from the environment).
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/sessions/gpu_s37_e.sh [seconds]
. "$(dirname "$0")/../gpu_lib.sh" e37 "${1:-200}"
for r in 1 2 3; do
  for ws in "" notmaopack; do
    JAX_SPARSE_ATTN_BSA_WS=$ws timeout 40 python3 -c "
import json, benchmarks.bsa_bench as bb
rows = bb.pack_gqa_rows(b=16, s_q=16, passes=('fwd',), tag='decode', n_sets=8,
                        variants=(('pack_gqa', True, 1), ('pack_gqa_splits_auto', True, 'auto')))
json.dump(rows, open('$O/decode_${r}_${ws:-default}.json', 'w'), default=str)
" > $O/decode_${r}_${ws:-default}.txt 2>&1
    t "decode round $r ${ws:-default} rc=$?"; grep "fwd" $O/decode_${r}_${ws:-default}.txt | tail -2
  done
done
