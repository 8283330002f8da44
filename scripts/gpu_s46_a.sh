#!/usr/bin/env bash
# Session 46's first H200 call: (1) cuDNN's dense attention sustained and in bursts on the
# H200 (the calibration of the anchors' timing: the design notes' B8 L4096 H4 causal fwd
# 535 / bwd 454 TFLOP/s); (2) in parallel, the deterministic cases of the BSA grid on the
# default switches (blk 64 runs the fixed-point dQ without a switch since session 45) and
# the grid with `l2hint` (three shards); (3) the forward rows blk64 12.5 / 5 / 25 %,
# default / l2hint / default (l2hint only if its grid passed); (4) the deterministic
# backward rows blk64 12.5 % and blk128 12.5 % against the default mode on the H200 (the
# ratio floor 0.85).
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/gpu_s46_a.sh [seconds]
. "$(dirname "$0")/gpu_lib.sh" s46a "${1:-560}"
T=${TT:-200}
export JAX_SPARSE_ATTN_GPU_TEST_TIMEOUT=120
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv > $O/gpu.txt 2>&1
# the anchors' timing first (the machine may be taken back mid-call)
timeout 80 python3 -m benchmarks.bsa_bench --dense --timing both --out $O/dense.json \
  > $O/dense.txt 2>&1
t "dense rc=$?"; grep -v "^wrote" $O/dense.txt | tail -8
det_tests_bg $T
for i in 0 1 2; do
  BSA_TEST_IMPLS=nodefault,l2hint BSA_TEST_SHARD=$i/3 timeout $T $PYT tests/test_gpu_bsa.py \
    -k TestBSAKernelGrid > $O/t_hint$i.txt 2>&1 &
done
wait
for f in 64a 64b 128 hint0 hint1 hint2; do t "$f: $(tail -1 $O/t_$f.txt)"; done
grep -h "^FAILED\|^ERROR\|Timeout\|timed out" $O/t_*.txt | head -20
ok() { grep -q "passed" $O/t_$1.txt && ! grep -qi "failed\|error\|timeout\|timed out" $O/t_$1.txt; }
F=JAX_SPARSE_ATTN_BSA_WS
VF=";"
if ok hint0 && ok hint1 && ok hint2; then VF=";$F=l2hint;"; fi
t "fwd variants: '$VF'"
timeout $(( ($(left) - 10) / 2 )) python3 -m benchmarks.bsa_bench --table-pass fwd --rows 0,1,2 \
  --timing both --table "$VF" --out $O/fwd.json > $O/fwd.txt 2>&1
t "fwd rows rc=$?"; grep -v "^wrote" $O/fwd.txt | tail -16
timeout $(( $(left) - 8 )) python3 -m benchmarks.bsa_bench --table-pass bwd --rows 0,3 \
  --timing both --table ";deterministic=1;" --out $O/bwd_det.json > $O/bwd_det.txt 2>&1
t "det rows rc=$?"; grep -v "^wrote" $O/bwd_det.txt | tail -10
