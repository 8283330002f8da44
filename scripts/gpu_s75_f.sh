#!/usr/bin/env bash
# Ours and cuDNN FE's block-sparse forward interleaved (ours, cuDNN, ours, cuDNN) on rows 0, 2,
# 5 (blk 64 12.5 / 25 %, GQA 16:4), both with NVML clock samples every 20 ms (bsa_bench's and
# the side script's samplers), nvidia-smi logging SM clock and power every 100 ms beside
# them; then one launch of each at blk 64 12.5 % under Nsight Compute (cycles, DRAM / L2 bytes).
# Usage (device, after `source .devcache/setup.sh`, .whl/ carried): OUT=$OUT bash scripts/gpu_s75_f.sh [seconds]
. "$(dirname "$0")/gpu_lib.sh" s75_f "${1:-300}"
gpu_info
python3 -m pip install -q --no-deps --no-index --target /tmp/fe .whl/*.whl > "$O/pip.txt" 2>&1
Q=timestamp,clocks.sm,power.draw,clocks_event_reasons.active
nvidia-smi --query-gpu=power.draw.instant --format=csv > /dev/null 2>&1 && Q=$Q,power.draw.instant
nvidia-smi --query-gpu=$Q --format=csv -lms 100 > "$O/smi.csv" 2>&1 &
SMI=$!
for i in 1 2; do
  bench ours$i 70 fwd 0,2,5 ";"
  PYTHONPATH=/tmp/fe:$PYTHONPATH timeout 60 python3 .whl/cudnn_side.py "$O/cudnn$i.json" 0,2,5 \
    > "$O/cudnn$i.txt" 2>&1
  t "cudnn$i rc=$?"; cat "$O/cudnn$i.txt"
done
kill "$SMI" 2>/dev/null
M=gpu__time_duration.sum,sm__cycles_elapsed.max,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum
ncu_pair "$M" 60
t done
pack_out s75_f
