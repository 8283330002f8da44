#!/usr/bin/env bash
# Session 59's next call (about 540 s; best on an H200): the block-sparse floor rows with the
# current defaults (dqlag and qprobe at blk 128) against `nodqlag`, the deterministic modes
# (ordered; fixed-point `detfixed`, alone and with `dqlag` at blk 128) against the default at
# blk 64 and 128, the forward rows,
# then the fixed-point and block-sparse GPU cases on the current default.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/gpu_s59_next.sh [seconds]
. "$(dirname "$0")/gpu_lib.sh" s59_next "${1:-540}"
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv > $O/gpu.txt 2>&1
W=JAX_SPARSE_ATTN_BSA_BWD_WS
timeout 160 python3 -m benchmarks.bsa_bench --table-pass bwd --rows 0,2,3,4,5,6 --timing both \
  --table ";$W=nodqlag;" --out $O/bwd.json > $O/bwd.txt 2>&1
t "bwd rc=$?"; grep -v "^wrote" $O/bwd.txt | tail -18
timeout 150 python3 -m benchmarks.bsa_bench --table-pass bwd --rows 0,3,4 --timing both \
  --table ";deterministic=1;deterministic=1,$W=detfixed;deterministic=1,$W=detfixed+dqlag;" \
  --out $O/det.json > $O/det.txt 2>&1
t "det rc=$?"; grep -v "^wrote" $O/det.txt | tail -12
timeout 80 python3 -m benchmarks.bsa_bench --table-pass fwd --rows 0,1,2,3,4,5,6 --timing both \
  --table ";" --out $O/fwd.json > $O/fwd.txt 2>&1
t "fwd rc=$?"; grep -v "^wrote" $O/fwd.txt | tail -7
T=$(( $(left) - 15 ))
if [ "$T" -gt 60 ]; then
  timeout $T $PYT tests/test_gpu_dq_fixed.py > $O/t_fixed.txt 2>&1 &
  timeout $T $PYT tests/test_gpu_bsa.py -k "TestBSAKernelGrid and 128" > $O/t_grid.txt 2>&1 &
  timeout $T $PYT tests/test_gpu_bwd_variants.py -k "step_start or step_order" > $O/t_var.txt 2>&1 &
  wait; t "tests"
  for f in $O/t_*.txt; do echo "== $f"; tail -n 1 $f; grep -E "^(FAILED|ERROR)" $f | head -5; done
fi
t done
cd $OUT && tar czf s59_next.tgz s59_next && rm -rf s59_next
