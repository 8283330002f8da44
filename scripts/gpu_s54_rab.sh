#!/usr/bin/env bash
# The sm90 HSTU backward with rab (hstu_bwd_ws=rab), what session 54 left unmeasured
# (about 5 minutes): the backward rows with a float32 rab of H_rab = 1 and a bf16 rab of
# H_rab = H, at D 128 and 64, on sm80 (the default), with the flag, and with the flag and
# hstu_bwd_order=lpt; then the *_sm90 rab tests with hstu_bwd_order=lpt, and the D 64
# max_seqlen_k 301 rab case (both backwards) in the default order.
# From the repo root after `source .devcache/setup.sh`:  OUT=$OUT bash scripts/gpu_s54_rab.sh
. "$(dirname "$0")/gpu_lib.sh" s54rab "${1:-330}"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
b() { local name=$1 rab=$2; shift 2
  env "$@" timeout 60 python3 benchmarks/hstu_bench.py --case 8x4096-causal \
    --case 32x1024-causal --case 8x4096-causal-d64 --rab "$rab" --bwd-only \
    --out "$O/bench_$name.json" > "$O/bench_$name.txt" 2>&1
  t "bench $name rc=$?"; grep -i "bwd" "$O/bench_$name.txt" | head -6; }
for rab in f32:1 q:h; do
  r=${rab/:/}
  b "sm80_$r" "$rab" X=1
  b "sm90_$r" "$rab" JAX_SPARSE_ATTN_HSTU_BWD_WS=rab
  b "sm90lpt_$r" "$rab" JAX_SPARSE_ATTN_HSTU_BWD_WS=rab JAX_SPARSE_ATTN_HSTU_BWD_ORDER=lpt
done
for i in 0 1 2; do
  HSTU_TEST_RAB_ORDER=lpt HSTU_TEST_SHARD=$i/3 timeout $(( $(left) - 5 )) $PYT \
    tests/test_gpu_hstu_rab.py -k "_sm90" > "$O/t_rablpt$i.txt" 2>&1 &
done
# the D 64, H_rab = 1, max_seqlen_k 301 case (added in session 54) in the default order too
timeout $(( $(left) - 5 )) $PYT tests/test_gpu_hstu_rab.py -k "lens301" > "$O/t_rab301.txt" 2>&1 &
wait
for i in 0 1 2; do t "rab lpt $i: $(tail -1 "$O/t_rablpt$i.txt")"; done
t "rab lens301: $(tail -1 "$O/t_rab301.txt")"
grep -h "^FAILED\|^ERROR" "$O"/t_rab*.txt | head -20
t done
