#!/usr/bin/env bash
# Executed SASS instructions per opcode of one launch of ours and of cuDNN FE's block-sparse
# forward (blk 64 12.5 %), Nsight Compute, no clock control. Needs .whl/ (cuDNN side script).
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/gpu_s75_e.sh
. "$(dirname "$0")/gpu_lib.sh" s75_e "${1:-200}"
python3 -m pip install -q --no-deps --no-index --target /tmp/fe .whl/*.whl > /dev/null 2>&1
M=sass__inst_executed_per_opcode,sm__cycles_elapsed.max
timeout -k 5 70 "$NCU" --metrics "$M" --print-metric-instances details --clock-control none \
  --kernel-name "regex:BsaFwdSm90Ws" --launch-skip 2 --launch-count 1 \
  python3 -m benchmarks.bsa_bench --table "" --rows 0 --out /tmp/o.json > "$O/op_ours.txt" 2>&1
t "ours rc=$?"; grep -E "sass__|cycles" "$O/op_ours.txt" | cut -c1-3000
PYTHONPATH=/tmp/fe:$PYTHONPATH timeout -k 5 60 "$NCU" --metrics "$M" --print-metric-instances details \
  --clock-control none --kernel-name "regex:(?i)sdpa|fmha|attn|sparse" --launch-skip 2 \
  --launch-count 1 python3 .whl/cudnn_side.py /tmp/c.json 0 > "$O/op_cudnn.txt" 2>&1
t "cudnn rc=$?"; grep -E "sass__|cycles" "$O/op_cudnn.txt" | cut -c1-3000
pack_out s75_e
