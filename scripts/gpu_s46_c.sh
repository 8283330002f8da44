#!/usr/bin/env bash
# Session 46's call for an H100 (when no H200 is lent): (1) the deterministic cases of the BSA
# grid on the default switches (blk 64 runs the fixed-point dQ without a switch since session
# 45), three processes; (2) the blk128 and S 32768 backward rows, default /
# persist,persistkv=0 / persist / default, sustained and burst (ratios within the call);
# (3) with the time left, per-kernel traces of the blk128 and S 32768 backward, default and
# persist,persistkv=0.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/gpu_s46_c.sh [seconds]
. "$(dirname "$0")/gpu_lib.sh" s46c "${1:-540}"
T=${TT:-170}
export JAX_SPARSE_ATTN_GPU_TEST_TIMEOUT=120
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv > $O/gpu.txt 2>&1
det_tests_bg $T
wait
for f in 64a 64b 128; do t "$f: $(tail -1 $O/t_$f.txt)"; done
grep -h "^FAILED\|^ERROR\|Timeout\|timed out" $O/t_*.txt | head -20
W=JAX_SPARSE_ATTN_BSA_BWD_WS
timeout $(( $(left) - 100 )) python3 -m benchmarks.bsa_bench --table-pass bwd --rows 3,4 \
  --timing both --table ";$W=persist+persistkv=0;$W=persist;" --out $O/bwd128.json \
  > $O/bwd128.txt 2>&1
t "bwd128 rows rc=$?"; grep -v "^wrote" $O/bwd128.txt | tail -12
[ "$(left)" -gt 70 ] && trace_variant default X=1 bsa_bwd_blk128 bsa_bwd_s32768
[ "$(left)" -gt 70 ] && trace_variant persistkv0 "$W=persist,persistkv=0" bsa_bwd_blk128 bsa_bwd_s32768
grep -h "==" $O/trace_*.txt | cut -c1-150
