#!/usr/bin/env bash
# The HSTU backward with a relative attention bias (rab) on the GPU, about 6 minutes:
# 1. benchmarks/hstu_bench.py --bwd-only with a float32 rab of H_rab = 1 and a bf16 rab of
#    H_rab = H at 8x4096 / 32x1024 (D 128) and 8x4096 (D 64), causal: the default (sm90
#    backward, order auto) and the sm80 backward (hstu_bwd_ws=rabsm80); ORDERS="hlpt lpt"
#    adds the sm90 backward in those orders;
# 2. at once: tests/test_gpu_large_tensors.py -k large_hstu_rab (rab and d rab of 2.26e9
#    elements: 64-bit addressing of the default backward with rab; about 40 GB),
#    tests/test_gpu_hstu_rab.py in three shards (the default backward, the *_sm80 cases,
#    NaN / inf where masked, poisoned d rab, deterministic) and the deterministic HSTU cases
#    of tests/test_gpu_hstu.py (with rab at D 128 and D 256).
# From the repo root after `source .devcache/setup.sh`:  OUT=$OUT bash scripts/gpu_rab_bwd.sh
. "$(dirname "$0")/gpu_lib.sh" rab_bwd "${1:-540}"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv > "$O/gpu.txt" 2>&1
t "gpu: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
b() { local name=$1 rab=$2; shift 2
  env "$@" timeout 60 python3 benchmarks/hstu_bench.py --case 8x4096-causal \
    --case 32x1024-causal --case 8x4096-causal-d64 --rab "$rab" --bwd-only \
    --out "$O/bench_$name.json" > "$O/bench_$name.txt" 2>&1
  t "bench $name rc=$?"; grep "rab=" "$O/bench_$name.txt" | head -3; }
for rab in f32:1 q:h; do
  r=${rab/:/}
  b "default_$r" "$rab" X=1
  b "sm80_$r" "$rab" JAX_SPARSE_ATTN_HSTU_BWD_WS=rabsm80
  for o in ${ORDERS:-}; do b "${o}_$r" "$rab" JAX_SPARSE_ATTN_HSTU_BWD_ORDER=$o; done
done
LARGE_TEST_MIN_FREE_GB=${LARGE_TEST_MIN_FREE_GB:-60} timeout $(( $(left) - 5 )) $PYT \
  tests/test_gpu_large_tensors.py -k large_hstu_rab > "$O/t_large.txt" 2>&1 &
for i in 0 1 2; do
  HSTU_TEST_SHARD=$i/3 timeout $(( $(left) - 5 )) $PYT tests/test_gpu_hstu_rab.py \
    > "$O/t_rab$i.txt" 2>&1 &
done
timeout $(( $(left) - 5 )) $PYT tests/test_gpu_hstu.py -k bwd_deterministic \
  > "$O/t_det.txt" 2>&1 &
wait
t "large rab: $(tail -1 "$O/t_large.txt")"
for i in 0 1 2; do t "rab $i: $(tail -1 "$O/t_rab$i.txt")"; done
t "det: $(tail -1 "$O/t_det.txt")"
grep -h "^FAILED\|^ERROR" "$O"/t_*.txt | head -20
t done
