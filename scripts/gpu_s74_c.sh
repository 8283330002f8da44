#!/usr/bin/env bash
# Ours and cuDNN FE's block-sparse forward side by side on one GPU, with the clock logged for
# both: rows 0, 1, 2, 5 (blk 64 12.5 / 5 / 25 %, GQA 16:4), the default twice (bench records
# its clocks); cuDNN through the throwaway side script (.whl/, carried) with nvidia-smi
# sampling the SM clock and power beside it; then DRAM / L2 bytes and elapsed cycles of one
# launch of each kernel at blk 64 12.5 % (Nsight Compute, no clock control).
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/gpu_s74_c.sh [seconds]
. "$(dirname "$0")/gpu_lib.sh" s74_c "${1:-400}"
gpu_info
bench side 130 fwd 0,1,2,5 ";"
[ -f .whl/cudnn_side.py ] || { t "no .whl/cudnn_side.py"; pack_out s74_c; exit 0; }
python3 -m pip install -q --no-deps --no-index --target /tmp/fe .whl/*.whl > "$O/pip.txt" 2>&1
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,clocks_event_reasons.active \
  --format=csv -lms 200 > "$O/smi_cudnn.csv" 2>&1 &
SMI=$!
PYTHONPATH=/tmp/fe:$PYTHONPATH timeout 100 python3 .whl/cudnn_side.py "$O/cudnn.json" 0,1,2,5 \
  > "$O/cudnn.txt" 2>&1
t "cudnn rc=$?"; kill "$SMI" 2>/dev/null; tail -n 4 "$O/cudnn.txt"
M=gpu__time_duration.sum,sm__cycles_elapsed.max,smsp__cycles_active.avg.per_second,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum,lts__t_sector_hit_rate.pct
ncu_pair "$M" 80
t done
pack_out s74_c
