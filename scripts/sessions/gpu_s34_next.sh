#!/usr/bin/env bash
# What session 33 left unrun on the GPU: (1) the block-sparse forward with epivec (its default
# since session 33) on the paths the BSA grid does not cover (scripts/sessions/gpu_s33_e.sh: the sm90ws
# forward's own cases, packed GQA, causal); (2) hstu_fwd_ws=epivec (opt-in): the HSTU
# forward's benchmark rows default vs epivec, then the HSTU grid with it.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/sessions/gpu_s34_next.sh [seconds]
. "$(dirname "$0")/../gpu_lib.sh" next34 "${1:-480}"
OUT=$OUT bash "$(dirname "$0")/gpu_s33_e.sh" 110
timeout 150 python3 -m benchmarks.hstu_bench --no-bwd --case 8x4096-causal --case 32x1024-causal \
  --case jagged32-causal --case 8x4096-causal-d64 --case 8x4096-causal-d256 \
  --variant "" --variant "JAX_SPARSE_ATTN_HSTU_WS=epivec" --variant "" \
  --variant "JAX_SPARSE_ATTN_HSTU_WS=epivec" --out $O/hstu_epivec.json > $O/hstu_epivec.txt 2>&1
t "hstu bench rc=$?"; grep -v "^wrote" $O/hstu_epivec.txt | tail -24
L=$(left)
if [ $L -gt 40 ]; then
  HSTU_TEST_WS=epivec timeout $((L - 10)) $PYT tests/test_gpu_hstu.py -k "grid" > $O/t_hstu_epivec.txt 2>&1
  t "hstu grid epivec rc=$?: $(tail -1 $O/t_hstu_epivec.txt)"
fi
grep -h "FAILED\|^E  \|passed\|failed" $O/t_*.txt 2>/dev/null | head -40 | tee -a $O/timeline.txt
