#!/usr/bin/env bash
# Session 62's second call (about 540 s): the backward with one long K->Q list per KV head
# (`bsa_bench --lists hot`) and with random lists, each unsplit and split in buckets of 64 / 32
# entries (`buckets=N`, opt-in, built in session 61), after the GPU tests of `buckets=N` and
# of `mult1p` (the fixed-point multipliers' one-pass norms).
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/gpu_s62_b.sh [seconds]
. "$(dirname "$0")/gpu_lib.sh" s62_b "${1:-540}"
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,memory.total --format=csv > $O/gpu.txt 2>&1
cat $O/gpu.txt
T=250
bg_test buckets tests/test_gpu_bsa_buckets.py "buckets"
bg_test mult1p tests/test_gpu_dq_fixed.py "deterministic_mult1p"
wait; t "tests"
report_tests
# one long K->Q list per KV head (KV block 0 in every list) against random lists: the
# backward's tail without a split of long lists (S 32768 with 16 and with 2 heads)
W=JAX_SPARSE_ATTN_BSA_BWD_WS
bench rnd 90 bwd 4,8 ";$W=buckets=64;$W=buckets=32;"
timeout 110 python3 -m benchmarks.bsa_bench --table-pass bwd --rows 4,8 --timing both \
  --lists hot --table ";$W=buckets=64;$W=buckets=32;" --out $O/hot.json > $O/hot.txt 2>&1
t "hot rc=$?"; grep -v "^wrote" $O/hot.txt
t done
cd $OUT && tar czf s62_b.tgz s62_b && rm -rf s62_b
