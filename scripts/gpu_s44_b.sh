#!/usr/bin/env bash
# Session 44's second device call (after gpu_s44_a.sh): the deterministic rows not timed
# there and the order path's other builds. (1) Sustained and burst rows blk64 25 %, D 64
# blk64 and GQA 16:4: default mode, deterministic, deterministic with ordfast and with
# detfixed, default mode again; (2) per-kernel traces of the deterministic blk64 backward
# with ordfast,ordscan=8 and ordfast,detstream.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/gpu_s44_b.sh [seconds]
. "$(dirname "$0")/gpu_lib.sh" s44b "${1:-400}"
W=JAX_SPARSE_ATTN_BSA_BWD_WS
V=";deterministic=1;deterministic=1,$W=ordfast;deterministic=1,$W=detfixed;"
timeout $(( $(left) - 70 )) python3 -m benchmarks.bsa_bench --table-pass bwd --rows 2,6,5 \
  --timing both --table "$V" --out $O/bwd_det.json > $O/bwd_det.txt 2>&1
t "det rows rc=$?"; grep -v "^wrote" $O/bwd_det.txt | tail -16
trace_variant ordfast_scan8 "$W=ordfast,ordscan=8" bsa_bwd_det_blk64
trace_variant ordfast_stream "$W=ordfast,detstream" bsa_bwd_det_blk64
grep -h "==\|Order\|BsaBwd" $O/trace_ordfast_*.txt | cut -c1-150 | head -10
