#!/usr/bin/env bash
# The blk 64 forward with one empty-barrier arrival per consumer warpgroup (bsa_fwd_ws=wgrelease)
# against the default, interleaved with cuDNN FE's (ours, cuDNN, ours, cuDNN) on rows 0, 2, 5 (blk 64
# 12.5 / 25 %, GQA 16:4), NVML clock samples every 20 ms in both and nvidia-smi power every
# 100 ms beside them: whether wgrelease holds a higher sustained clock at the same cycles,
# and the clock cuDNN holds. Then wgrelease's GPU tests (the sm90ws forward's own cases with
# the flag, the grid with BSA_TEST_IMPLS=wgrelease, the pairwg cases with it) and, with time
# left, ncu_pair.
# Usage (device, after `source .devcache/setup.sh`, .whl/ carried): OUT=$OUT bash scripts/gpu_s76_a.sh [seconds]
. "$(dirname "$0")/gpu_lib.sh" s76_a "${1:-560}"
gpu_info
side_start
F=JAX_SPARSE_ATTN_BSA_WS
for i in 1 2; do side_round $i 80 ";$F=wgrelease"; done
kill "$SMI" 2>/dev/null
flag_tests wgr wgrelease wgrelease 3
# wgrelease with two consumer warpgroups of their own rings per CTA (pairwg)
if [ "$(left)" -gt 100 ]; then
  BSA_TEST_PAIR=pairwg,wgrelease T=$(( $(left) - 40 )) bg_test pair tests/test_gpu_bsa.py \
    "sm90ws_forward_pairwg"
  wait; t "pairwg tests"; tail -n 3 "$O/t_pair.txt"
fi
M=gpu__time_duration.sum,sm__cycles_elapsed.max,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum
[ "$(left)" -gt 70 ] && ncu_pair "$M" 60
t done
pack_out s76_a
