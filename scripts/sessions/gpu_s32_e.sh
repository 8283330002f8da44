#!/usr/bin/env bash
# Unseen packed cases for the packed backward's new default (the warp-specialized kernel on
# packed rows): the BSA fuzz test's pack_gqa profiles with another seed and more cases.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/sessions/gpu_s32_e.sh [seconds]
export JAX_SPARSE_ATTN_CACHE_DIR=/tmp/jsa_kc JAX_SPARSE_ATTN_GPU_TEST_TIMEOUT=200
. "$(dirname "$0")/../gpu_lib.sh" e "${1:-280}"
JSA_FUZZ_SEED=3203 JSA_FUZZ_N=60 timeout $BUDGET $PYT \
  tests/test_gpu_fuzz.py -k "bsa and pack_gqa" -n 3 > $O/t_fuzz_pack.txt 2>&1
t "fuzz pack rc=$?: $(tail -1 $O/t_fuzz_pack.txt)"
grep -h "PASSED\|FAILED\|^E  " $O/t_fuzz_pack.txt | head -40
