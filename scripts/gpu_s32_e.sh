#!/usr/bin/env bash
# Unseen packed cases for the packed backward's new default (the warp-specialized kernel on
# packed rows): the BSA fuzz test's pack_gqa profiles with another seed and more cases.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/gpu_s32_e.sh [seconds]
set -u
O=${OUT:-./gpu_out}/e; mkdir -p $O
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 JAX_SPARSE_ATTN_CACHE_DIR=/tmp/jsa_kc
export JAX_SPARSE_ATTN_GPU_TEST_TIMEOUT=200
BUDGET=${1:-280}
start=$SECONDS
JSA_FUZZ_SEED=3203 JSA_FUZZ_N=60 timeout $BUDGET python3 -m pytest -m gpu -q -rA -p no:cacheprovider \
  tests/test_gpu_fuzz.py -k "bsa and pack_gqa" -n 3 > $O/t_fuzz_pack.txt 2>&1
echo "[$((SECONDS - start))s] fuzz pack rc=$?: $(tail -1 $O/t_fuzz_pack.txt)" | tee $O/timeline.txt
grep -h "PASSED\|FAILED\|^E  " $O/t_fuzz_pack.txt | head -40
