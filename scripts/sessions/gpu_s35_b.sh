#!/usr/bin/env bash
# Session 35, call B: the stream-K tail of the block-sparse forward (bsa_fwd_ws=streamk,
# opt-in, built on CPU): (1) its GPU tests (uniform lists split between CTAs at blk 128 / 64,
# D 128 / 64, partial query and key blocks, NaN in unlisted keys, poisoned outputs; the
# round-robin fallback with empty rows) and the sm90ws forward's own cases through the shared
# checker; (2) the forward table, default against streamk (sustained), and the wave probe.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/sessions/gpu_s35_b.sh [seconds]
. "$(dirname "$0")/../gpu_lib.sh" b35 "${1:-540}"
timeout 260 $PYT tests/test_gpu_bsa.py -k "streamk or test_bsa_sm90ws_forward" > $O/t_streamk.txt 2>&1
rc=$?
t "streamk tests rc=$rc: $(tail -1 $O/t_streamk.txt)"
grep -h "^FAILED\|^E  \|Error" $O/t_streamk.txt | head -20
if [ $rc -eq 0 ]; then
  timeout 200 python3 -m benchmarks.bsa_bench --table ";JAX_SPARSE_ATTN_BSA_WS=streamk" \
    --table-pass fwd --out $O/fwd.json > $O/fwd.txt 2>&1
  t "fwd table rc=$?"; grep -v "^wrote" $O/fwd.txt | tail -18
fi
