#!/usr/bin/env bash
# Session 45's timing call (after gpu_s44_a.sh, whose detfixed / ordfast cases passed as far
# as its time limit let them run): sustained and burst rows, variants interleaved in one
# process, the default first and last. (1) The deterministic backward at blk64 12.5 % and
# blk128: default mode, deterministic (the schedule order), deterministic with detfixed and
# with ordfast. (2) cuDNN's dense attention (the anchors' timing). (3) The L2 policies:
# forward rows blk64 12.5 % and blk128, then backward rows blk64 12.5 % and blk128, default /
# l2hint / l2normal / default.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/gpu_s45_b.sh [seconds]
. "$(dirname "$0")/gpu_lib.sh" s45b "${1:-560}"
W=JAX_SPARSE_ATTN_BSA_BWD_WS F=JAX_SPARSE_ATTN_BSA_WS
timeout 240 python3 -m benchmarks.bsa_bench --table-pass bwd --rows 0,3 --timing both \
  --table ";deterministic=1;deterministic=1,$W=detfixed;deterministic=1,$W=ordfast;" \
  --out $O/det.json > $O/det.txt 2>&1
t "det rows rc=$?"; grep -v "^wrote" $O/det.txt | tail -12
timeout 70 python3 -m benchmarks.bsa_bench --dense --timing both --out $O/dense.json \
  > $O/dense.txt 2>&1
t "dense rc=$?"; grep -v "^wrote" $O/dense.txt | tail -8
timeout $(( $(left) / 2 )) python3 -m benchmarks.bsa_bench --table-pass fwd --rows 0,3 \
  --timing both --table ";$F=l2hint;$F=l2normal;" --out $O/fwd_l2.json > $O/fwd_l2.txt 2>&1
t "fwd l2 rows rc=$?"; grep -v "^wrote" $O/fwd_l2.txt | tail -10
timeout $(( $(left) - 5 )) python3 -m benchmarks.bsa_bench --table-pass bwd --rows 0,3 \
  --timing both --table ";$W=l2hint;$W=l2normal;" --out $O/bwd_l2.json > $O/bwd_l2.txt 2>&1
t "bwd l2 rows rc=$?"; grep -v "^wrote" $O/bwd_l2.txt | tail -10
