#!/usr/bin/env bash
# Ours and cuDNN FE's block-sparse forward interleaved (ours, cuDNN, ours, cuDNN) on rows 0, 2,
# 5 (blk 64 12.5 / 25 %, GQA 16:4), both with NVML clock samples every 20 ms (bsa_bench's and
# the side script's samplers), nvidia-smi logging SM clock and power every 100 ms beside
# them; then one launch of each at blk 64 12.5 % under Nsight Compute (cycles, DRAM / L2 bytes).
# Usage (device, after `source .devcache/setup.sh`, .whl/ carried): OUT=$OUT bash scripts/gpu_s75_f.sh [seconds]
. "$(dirname "$0")/gpu_lib.sh" s75_f "${1:-300}"
gpu_info
side_start
for i in 1 2; do side_round $i 70 ";"; done
kill "$SMI" 2>/dev/null
M=gpu__time_duration.sum,sm__cycles_elapsed.max,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum
ncu_pair "$M" 60
t done
pack_out s75_f
