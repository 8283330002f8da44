#!/usr/bin/env bash
# One launch each of ours and cuDNN FE's block-sparse forward (blk 64 12.5 %) under Nsight
# Compute, no clock control, two metric sets: A (cycles, instructions by pipe, shared-memory
# wavefronts), B (issue slots busy, warps per scheduler, barrier stalls, branches).
# Usage (device, after `source .devcache/setup.sh`, .whl/ carried): OUT=$OUT bash scripts/gpu_s75_d.sh
. "$(dirname "$0")/gpu_lib.sh" s75_d "${1:-300}"
python3 -m pip install -q --no-deps --no-index --target /tmp/fe .whl/*.whl > /dev/null 2>&1
A=sm__cycles_elapsed.max,sm__inst_executed.sum,smsp__thread_inst_executed.sum,smsp__inst_executed_pipe_fma.sum,smsp__inst_executed_pipe_alu.sum,smsp__inst_executed_pipe_xu.sum,smsp__inst_executed_pipe_uniform.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum
B=sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__warp_issue_stalled_barrier_per_warp_active.pct,smsp__warps_active.avg.per_cycle_active,smsp__issue_active.avg.pct_of_peak_sustained_active,smsp__inst_executed_op_branch.sum
for MS in A B; do
  eval "M=\$$MS"
  timeout -k 5 70 "$NCU" --metrics "$M" --clock-control none --kernel-name "regex:BsaFwdSm90Ws" \
    --launch-skip 2 --launch-count 1 python3 -m benchmarks.bsa_bench --table "" --rows 0 \
    --out /tmp/o.json > "$O/ncu_ours_$MS.txt" 2>&1; t "ours $MS rc=$?"
  grep -E "^\s+[a-z]+__" "$O/ncu_ours_$MS.txt"; grep -E "ERR" "$O/ncu_ours_$MS.txt" | head -3
  PYTHONPATH=/tmp/fe:$PYTHONPATH timeout -k 5 60 "$NCU" --metrics "$M" --clock-control none \
    --kernel-name "regex:(?i)sdpa|fmha|attn|sparse" --launch-skip 2 --launch-count 1 \
    python3 .whl/cudnn_side.py /tmp/c.json 0 > "$O/ncu_cudnn_$MS.txt" 2>&1; t "cudnn $MS rc=$?"
  grep -E "^\s+[a-z]+__" "$O/ncu_cudnn_$MS.txt"; grep -E "ERR" "$O/ncu_cudnn_$MS.txt" | head -3
done
pack_out s75_d
