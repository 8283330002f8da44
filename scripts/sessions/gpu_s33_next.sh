#!/usr/bin/env bash
# What session 32 left unrun on the GPU: the packed sm90ws backward (the pack_gqa default
# since session 32) under the backward's tuning switches (dqalt, lpt, dq_writer off,
# dqalias + epiregs), then the BSA fuzz test's causal and split profiles with an unseen seed.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/sessions/gpu_s33_next.sh [seconds]
. "$(dirname "$0")/../gpu_lib.sh" next "${1:-400}"
timeout 150 $PYT tests/test_gpu_bsa_pack_gqa.py -k "dqalt or lpt or nowriter or epiregs" > $O/t_pack_sw.txt 2>&1
t "packed backward tuning switches rc=$?: $(tail -1 $O/t_pack_sw.txt)"
L=$(left)
if [ $L -gt 60 ]; then
  JAX_SPARSE_ATTN_CACHE_DIR=/tmp/jsa_kc JSA_FUZZ_SEED=3303 timeout $((L - 10)) $PYT \
    tests/test_gpu_fuzz.py -k "bsa and (causal or sauto)" -n 3 > $O/t_fuzz.txt 2>&1
  t "fuzz rc=$?: $(tail -1 $O/t_fuzz.txt)"
fi
grep -h "FAILED\|^E  \|passed\|failed" $O/t_*.txt 2>/dev/null | head -40 | tee -a $O/timeline.txt
