#!/usr/bin/env bash
# The HSTU backward with a relative attention bias (rab) on the GPU, about 6 minutes:
# 1. benchmarks/hstu_bench.py --bwd-only with a float32 rab of H_rab = 1 and a bf16 rab of
#    H_rab = H at 8x4096 / 32x1024 (D 128) and 8x4096 (D 64), causal, in one process per
#    bias: the default (sm90 backward with the fast path and the L2 prefetches), the sm90
#    backward without them (hstu_bwd_ws=norabfast,norabpf,nodrabs) and the sm80 backward
#    (hstu_bwd_ws=rabsm80); ORDERS="hlpt lpt" adds the default in those orders;
# 2. at once: tests/test_gpu_large_tensors.py -k large_hstu_rab (rab and d rab of 2.26e9
#    elements: 64-bit addressing of the default backward with rab; about 40 GB),
#    tests/test_gpu_hstu_rab.py in three shards (the default backward, the *_sm80 cases,
#    NaN / inf where masked, poisoned d rab, deterministic, GQA), the deterministic HSTU
#    cases of tests/test_gpu_hstu.py (with rab at D 128 and D 256) and the rab cases of
#    tests/sanitize_grid.py under compute-sanitizer memcheck.
# From the repo root after `source .devcache/setup.sh`:  OUT=$OUT bash scripts/gpu_rab_bwd.sh
. "$(dirname "$0")/gpu_lib.sh" rab_bwd "${1:-540}"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv > "$O/gpu.txt" 2>&1
t "gpu: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
W=JAX_SPARSE_ATTN_HSTU_BWD_WS
b() { local name=$1 rab=$2 o vs=("" "$W=norabfast+norabpf+nodrabs" "$W=rabsm80")
  for o in ${ORDERS:-}; do vs+=("JAX_SPARSE_ATTN_HSTU_BWD_ORDER=$o"); done
  local args=(); for o in "${vs[@]}"; do args+=(--variant "$o"); done
  timeout 150 python3 benchmarks/hstu_bench.py --case 8x4096-causal --case 32x1024-causal \
    --case 8x4096-causal-d64 --rab "$rab" --rab-only --bwd-only "${args[@]}" \
    --out "$O/bench_$name.json" > "$O/bench_$name.txt" 2>&1
  t "bench $name rc=$?"; grep "rab=" "$O/bench_$name.txt"; }
b f321 f32:1
b qh q:h
LARGE_TEST_MIN_FREE_GB=${LARGE_TEST_MIN_FREE_GB:-60} timeout $(( $(left) - 5 )) $PYT \
  tests/test_gpu_large_tensors.py -k large_hstu_rab > "$O/t_large.txt" 2>&1 &
for i in 0 1 2; do
  HSTU_TEST_SHARD=$i/3 timeout $(( $(left) - 5 )) $PYT tests/test_gpu_hstu_rab.py \
    > "$O/t_rab$i.txt" 2>&1 &
done
timeout $(( $(left) - 5 )) $PYT tests/test_gpu_hstu.py -k bwd_deterministic \
  > "$O/t_det.txt" 2>&1 &
timeout $(( $(left) - 5 )) compute-sanitizer --tool memcheck --report-api-errors no \
  --error-exitcode 9 python3 tests/sanitize_grid.py --only "rab" > "$O/t_san.txt" 2>&1 &
wait
t "large rab: $(tail -1 "$O/t_large.txt")"
for i in 0 1 2; do t "rab $i: $(tail -1 "$O/t_rab$i.txt")"; done
t "det: $(tail -1 "$O/t_det.txt")"
t "sanitizer: $(grep -E "cases ok|ERROR SUMMARY" "$O/t_san.txt" | tr '\n' ' ')"
grep -h "^FAILED\|^ERROR" "$O"/t_*.txt | head -20
t done
