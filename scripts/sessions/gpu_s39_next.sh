#!/usr/bin/env bash
# Prepared in session 38 for the next device call (not run yet): (1) the forward with qahead
# where the shared-memory plan has one Q buffer (oalias, ctas3k1, selfload: qahead now runs
# as mpre there, and the kernel enables q_ahead only with two Q buffers; before, the
# producer would have waited for the current item's Q buffer) on the blk 64 / D 128 cases of
# test_bsa_sm90ws_forward_ctas3k1 (each flag set in its own process, a hang ends at the
# per-test limit); (2) alone: the forward and backward tables (sustained), every row once.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/sessions/gpu_s39_next.sh [seconds]
. "$(dirname "$0")/../gpu_lib.sh" next39 "${1:-560}"
export JAX_SPARSE_ATTN_GPU_TEST_TIMEOUT=120
T=$((BUDGET - 250))
for fl in oalias,qahead ctas3k1,qahead selfload,qahead; do
  BSA_TEST_K1=$fl timeout $T $PYT tests/test_gpu_bsa.py -k ctas3k1 > $O/t_${fl//,/_}.txt 2>&1 &
done
# the packed-GQA cases at blk 64 / D 128 (split-KV decode included) under ctas3k1 / selfload
for fl in ctas3k1 selfload; do
  BSA_PACK_TEST_FWD_WS=$fl timeout $T $PYT tests/test_gpu_bsa_pack_gqa.py -k "blk64-d128" \
    > $O/p_$fl.txt 2>&1 &
done
wait
for fl in ctas3k1 selfload; do t "pack $fl: $(tail -1 $O/p_$fl.txt)"; done
for fl in oalias,qahead ctas3k1,qahead selfload,qahead; do
  t "$fl: $(tail -1 $O/t_${fl//,/_}.txt)"
done
grep -h "^FAILED\|^E  \|Timeout" $O/t_*.txt $O/p_*.txt | head -20
timeout 80 python3 -m benchmarks.bsa_bench --table "" --table-pass fwd --out $O/fwd.json \
  > $O/fwd.txt 2>&1
t "fwd table rc=$?"; grep -v "^wrote" $O/fwd.txt | tail -10
timeout 150 python3 -m benchmarks.bsa_bench --table "" --table-pass bwd --out $O/bwd.json \
  > $O/bwd.txt 2>&1
t "bwd table rc=$?"; grep -v "^wrote" $O/bwd.txt | tail -10
