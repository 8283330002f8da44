#!/usr/bin/env bash
# GPU validation of the opt-in BSA backward variant (kernels/bsa_bwd_sm90_v2.py) and the
# preprocessing kernel (kernels/bsa_pre.py): the whole tests/test_gpu_bsa.py grid with
# JAX_SPARSE_ATTN_BSA_BWD_IMPL=sm90v2 JAX_SPARSE_ATTN_BSA_PRE_IMPL=kernel in 10 parallel
# shards, then the backward benchmark of the variants against the default.
# Run from the repo root on the H200 after `source .devcache/setup.sh`; logs go to ${OUT:-.}.
# Pass: 27 passed summed over the shard summary lines and no FAILED/ERROR line.
out=${OUT:-.}
export XLA_PYTHON_CLIENT_PREALLOCATE=false
(
  export JAX_SPARSE_ATTN_BSA_BWD_IMPL=sm90v2 JAX_SPARSE_ATTN_BSA_PRE_IMPL=kernel
  for i in $(seq 0 9); do
    BSA_TEST_SHARD=$i/10 timeout 85 python3 -m pytest -m gpu tests/test_gpu_bsa.py -q -rA \
      -p no:cacheprovider > "$out/bsa_v2_shard$i.log" 2>&1 &
  done
  wait
)
tail -qn 1 "$out"/bsa_v2_shard*.log
grep -h "^FAILED\|^ERROR" "$out"/bsa_v2_shard*.log
V="JAX_SPARSE_ATTN_BSA_BWD_IMPL"
P="JAX_SPARSE_ATTN_BSA_PRE_IMPL"
timeout 60 python3 -m benchmarks.bsa_bench --out "$out/bsa_v2_bench.json" --variants \
  "$V=sm90:blk64bwd,blk128bwd;$V=sm90v2,$P=kernel:blk64bwd,blk128bwd;$V=sm90v2:blk64bwd;$V=sm90v2n,$P=kernel:blk64bwd" \
  2>&1 | tee "$out/bsa_v2_bench.log"
