#!/usr/bin/env bash
# Session 43's first device call: the persistent blk 128 block-sparse backward
# (bsa_bwd_ws=persist, opt-in). (1) In parallel: its GPU cases and variants, the cases
# prepared in session 42 (tailconv / zerolag with nolpt, the sm90ws backward cases);
# (2) if the persist cases passed, per-kernel traces of the backward alone at blk128 12.5 %
# and S 32768 (default, persist, without its L2 prefetch, with the register epilogue,
# persistkv=0) and the sustained blk128 / S 32768 rows (default, persist, persist with the
# register epilogue, default); else the default's traces only.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/sessions/gpu_s43_a.sh [seconds]
. "$(dirname "$0")/../gpu_lib.sh" s43a "${1:-540}"
T=${TT:-230}
export JAX_SPARSE_ATTN_GPU_TEST_TIMEOUT=100
timeout $T $PYT tests/test_gpu_bwd_variants.py -k "persist and (376items or 16pairs)" \
  > $O/t_p1.txt 2>&1 &
timeout $T $PYT tests/test_gpu_bwd_variants.py -k "persist and not 376items and not 16pairs" \
  > $O/t_p2.txt 2>&1 &
timeout $T $PYT tests/test_gpu_bwd_variants.py -k "tailconv and (9pairs or 16pairs)" \
  > $O/t_tc.txt 2>&1 &
timeout $T $PYT tests/test_gpu_bsa.py -k sm90ws_backward > $O/t_ws.txt 2>&1 &
wait
for f in p1 p2 tc ws; do t "$f: $(tail -1 $O/t_$f.txt)"; done
grep -h "^FAILED\|^ERROR\|Timeout\|timed out" $O/t_*.txt | head -20
VARS="default"
if grep -q "passed" $O/t_p1.txt && ! grep -qi "failed\|error\|timeout\|timed out" $O/t_p1.txt $O/t_p2.txt; then
  VARS="default persist persist_nokvpf persist_epiregs persistkv0"
fi
t "trace variants: $VARS"
for v in $VARS; do
  case $v in
    default) E="X=1";;
    persist) E="JAX_SPARSE_ATTN_BSA_BWD_WS=persist";;
    persist_nokvpf) E="JAX_SPARSE_ATTN_BSA_BWD_WS=persist,nokvpf";;
    persist_epiregs) E="JAX_SPARSE_ATTN_BSA_BWD_WS=persist,epiregs";;
    persistkv0) E="JAX_SPARSE_ATTN_BSA_BWD_WS=persist,persistkv=0";;
  esac
  env $E timeout 60 python3 scripts/gpu_trace.py --iters 10 --case bsa_bwd_blk128 \
    --case bsa_bwd_s32768 --out $O/trace_$v.json > $O/trace_$v.txt 2>&1
  t "trace $v rc=$?"; grep -v "^$" $O/trace_$v.txt | grep -iv "warn\|^I[0-9]" | head -24
done
if [ "$VARS" != "default" ]; then
  V=";JAX_SPARSE_ATTN_BSA_BWD_WS=persist;JAX_SPARSE_ATTN_BSA_BWD_WS=persist,epiregs;"
  timeout $(( $(left) - 10 )) python3 -m benchmarks.bsa_bench --table-pass bwd --rows 3,4 \
    --table "$V" --out $O/bwd.json > $O/bwd.txt 2>&1
  t "bwd rows rc=$?"; grep -v "^wrote" $O/bwd.txt | tail -20
fi
