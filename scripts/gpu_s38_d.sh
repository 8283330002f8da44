#!/usr/bin/env bash
# Session 38, call D: the block-sparse tests on tensors of more than 2**31 elements after the
# fix (the preprocessing launch zeroes the dQ workspace only up to 2**31 - 2**24 elements;
# XLA zeroes a larger one), one test per process.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/gpu_s38_d.sh [seconds]
. "$(dirname "$0")/gpu_lib.sh" d38 "${1:-540}"
export JAX_SPARSE_ATTN_GPU_TEST_TIMEOUT=300 XLA_PYTHON_CLIENT_PREALLOCATE=true
ids=$(python3 -m pytest -m gpu -q --collect-only tests/test_gpu_large_tensors.py -k "${K:-bsa}" \
  2>/dev/null | grep ::)
i=0
for id in $ids; do
  i=$((i + 1))
  [ "$(left)" -lt 40 ] && { t "out of time before $id"; break; }
  timeout $(( $(left) - 20 )) python3 -m pytest -m gpu -q -rA -p no:cacheprovider "$id" > $O/t_$i.txt 2>&1
  t "$id rc=$?: $(tail -1 $O/t_$i.txt)"
  grep -h "^E  \|err=" $O/t_$i.txt | head -12
done
