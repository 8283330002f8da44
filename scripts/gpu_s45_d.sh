#!/usr/bin/env bash
# Session 45's last call: the deterministic rows gpu_s45_b.sh did not time (blk64 25 %, D 64
# blk64, GQA 16:4 blk64): default mode, deterministic (schedule order), deterministic with
# detfixed, default mode again, sustained and burst; then the two ordfast cases whose
# options the test repeated (fixed in the test).
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/gpu_s45_d.sh [seconds]
. "$(dirname "$0")/gpu_lib.sh" s45d "${1:-380}"
W=JAX_SPARSE_ATTN_BSA_BWD_WS
timeout $(( $(left) - 70 )) python3 -m benchmarks.bsa_bench --table-pass bwd --rows 6,5,2 \
  --timing both --table ";deterministic=1;deterministic=1,$W=detfixed;" \
  --out $O/det.json > $O/det.txt 2>&1
t "det rows rc=$?"; grep -v "^wrote" $O/det.txt | tail -12
timeout $(( $(left) - 3 )) $PYT tests/test_gpu_det_order.py \
  -k "det_sched and ordfast and gqa and (detsched-stream or overlap)" > $O/t_ord.txt 2>&1
t "ord: $(tail -1 $O/t_ord.txt)"
