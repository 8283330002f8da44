#!/usr/bin/env bash
# Session 50's H200 call (about 330 s; ours only, the project's benchmarks): every floor row of
# the block-sparse forward (rows 0-6) and backward (rows 0, 2-6) with the default switches,
# sustained and burst (`benchmarks/bsa_bench.py --timing both`), each pass with the SM clock,
# power and clock-event reasons sampled every 100 ms (smi_fwd.csv / smi_bwd.csv), then Nsight
# Compute (full set, clocks untouched) of the blk64 forward and the S 32768 backward main
# kernels (details pages ncu_*.txt).
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/gpu_s50_h200.sh [seconds]
. "$(dirname "$0")/gpu_lib.sh" s50_h200 "${1:-330}"
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv > $O/gpu.txt 2>&1
Q=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active
nvidia-smi --query-gpu=$Q --format=csv > /dev/null 2>&1 || Q=timestamp,clocks.sm,power.draw,temperature.gpu
smi_bg() { nvidia-smi --query-gpu=$Q --format=csv -lms 100 > $O/smi_$1.csv 2>&1 & SMI=$!; }
smi_end() { kill $SMI 2>/dev/null; wait $SMI 2>/dev/null; }
smi_bg fwd
timeout 120 python3 -m benchmarks.bsa_bench --table-pass fwd --rows 0,1,2,3,4,5,6 \
  --timing both --table ";" --out $O/fwd.json > $O/fwd.txt 2>&1
t "fwd rc=$?"; smi_end; grep -v "^wrote" $O/fwd.txt | tail -8
smi_bg bwd
timeout 150 python3 -m benchmarks.bsa_bench --table-pass bwd --rows 0,2,3,4,5,6 \
  --timing both --table ";" --out $O/bwd.json > $O/bwd.txt 2>&1
t "bwd rc=$?"; smi_end; grep -v "^wrote" $O/bwd.txt | tail -7
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for c in "fwd64 BsaFwdSm90Ws bsa_fwd_blk64" "bwd32k BsaBwdSm90Ws bsa_bwd_s32768"; do
  set -- $c
  [ "$(left)" -lt 40 ] && break
  timeout -k 5 $(( $(left) - 5 )) "$NCU" --set full --clock-control none --kernel-name "regex:$2" \
    --launch-skip 1 --launch-count 1 -f -o "$O/ncu_$1" python3 scripts/gpu_trace.py --iters 3 \
    --case $3 --out /tmp/t_$1.json > "$O/ncu_$1.run.log" 2>&1
  t "ncu $1 rc=$?"
  "$NCU" --import "$O/ncu_$1.ncu-rep" --page details > "$O/ncu_$1.txt" 2>&1 && rm -f "$O/ncu_$1.ncu-rep"
done
