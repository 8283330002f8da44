#!/usr/bin/env bash
# Prepared in session 42 for the next device call (not run yet): (1) the GPU cases added
# after session 42's calls (zerolag in grid order) and the sm90ws backward cases on the
# per-chain order computed by one batched argsort; (2) per-kernel traces of the block-sparse
# backward alone (blk128 12.5 %, GQA 16:4 blk64) with the default order (hlpt, its XLA sort
# of the K->Q rows included) and with nolpt.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/sessions/gpu_s42_d.sh [seconds]
. "$(dirname "$0")/../gpu_lib.sh" s42d "${1:-300}"
timeout 200 $PYT tests/test_gpu_bwd_variants.py -k "tailconv and (9pairs or 16pairs)" \
  > $O/t_tc.txt 2>&1 &
timeout 200 $PYT tests/test_gpu_bsa.py -k sm90ws_backward > $O/t_ws.txt 2>&1 &
wait
for f in tc ws; do t "$f: $(tail -1 $O/t_$f.txt)"; done
for v in default nolpt; do
  case $v in default) E="X=1";; nolpt) E="JAX_SPARSE_ATTN_BSA_BWD_WS=nolpt";; esac
  env $E timeout 55 python3 scripts/gpu_trace.py --iters 10 --case bsa_bwd_blk128 \
    --case bsa_bwd_gqa_blk64 --out $O/trace_$v.json > $O/trace_$v.txt 2>&1
  t "trace $v rc=$?"; grep "^==\|us  x1" $O/trace_$v.txt | head -24
done
