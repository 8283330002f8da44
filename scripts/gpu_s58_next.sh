#!/usr/bin/env bash
# Session 58's next call (about 520 s; best on an H200): the block-sparse floor rows with the
# current defaults (qprobe at blk 128) against `noqprobe`, the deterministic rows, the
# forward rows, then the GPU files not yet run on the current default in four processes.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/gpu_s58_next.sh [seconds]
. "$(dirname "$0")/gpu_lib.sh" s58_next "${1:-520}"
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv > $O/gpu.txt 2>&1
W=JAX_SPARSE_ATTN_BSA_BWD_WS
timeout 160 python3 -m benchmarks.bsa_bench --table-pass bwd --rows 0,2,3,4,5,6 --timing both \
  --table ";$W=noqprobe;" --out $O/bwd.json > $O/bwd.txt 2>&1
t "bwd rc=$?"; grep -v "^wrote" $O/bwd.txt | tail -18
timeout 80 python3 -m benchmarks.bsa_bench --table-pass bwd --rows 0,3,4 --timing both \
  --table ";deterministic=1;" --out $O/det.json > $O/det.txt 2>&1
t "det rc=$?"; grep -v "^wrote" $O/det.txt | tail -9
timeout 80 python3 -m benchmarks.bsa_bench --table-pass fwd --rows 0,1,2,3,4,5,6 --timing both \
  --table ";" --out $O/fwd.json > $O/fwd.txt 2>&1
t "fwd rc=$?"; grep -v "^wrote" $O/fwd.txt | tail -7
T=$(( $(left) - 15 ))
if [ "$T" -gt 60 ]; then
  timeout $T $PYT tests/test_gpu_bsa.py -k "TestBSAKernelGrid or sm90ws_backward or grad_through" \
    > $O/t_bsa.txt 2>&1 &
  timeout $T $PYT tests/test_gpu_bsa_pack_gqa.py > $O/t_pack.txt 2>&1 &
  timeout $T $PYT tests/test_gpu_bwd_variants.py -k "step_start or (step_order and entahead)" \
    > $O/t_var.txt 2>&1 &
  timeout $T $PYT tests/test_gpu_bsa_causal.py > $O/t_causal.txt 2>&1 &
  wait; t "tests"
  for f in $O/t_*.txt; do echo "== $f"; tail -n 1 $f; grep -E "^(FAILED|ERROR)" $f | head -5; done
fi
t done
cd $OUT && tar czf s58_next.tgz s58_next && rm -rf s58_next
