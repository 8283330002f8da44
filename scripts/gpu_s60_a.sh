#!/usr/bin/env bash
# Session 60's first own call (about 400 s): `wguni` (the consumers' warpgroup index from
# the warp-uniform warp index) against the default on the block-sparse backward rows, in
# both modes (deterministic=True now runs the fixed-point dQ at blk 128 too); then the blk 128
# deterministic cases of the grid on the new default, the
# `wguni` cases, the blk 128 grid with `wguni` and the HSTU `qprobe` cases (D 256 fixed).
# As run in session 60, `wguni` was an opt-in (`$W=wguni` in the timings, BSA_TEST_IMPLS=wguni);
# it is the default mode's default since, so the script now times `nowguni` against the
# default and runs the grid with `nowguni`.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/gpu_s60_a.sh [seconds]
. "$(dirname "$0")/gpu_lib.sh" s60_a "${1:-400}"
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv > $O/gpu.txt 2>&1
W=JAX_SPARSE_ATTN_BSA_BWD_WS
timeout 110 python3 -m benchmarks.bsa_bench --table-pass bwd --rows 3,4 --timing both \
  --table ";$W=nowguni;;$W=nowguni" --out $O/bwd.json > $O/bwd.txt 2>&1
t "bwd rc=$?"; grep -v "^wrote" $O/bwd.txt | tail -12
timeout 110 python3 -m benchmarks.bsa_bench --table-pass bwd --rows 3,4 --timing both \
  --table ";deterministic=1;deterministic=1,$W=wguni;" \
  --out $O/det.json > $O/det.txt 2>&1
t "det rc=$?"; grep -v "^wrote" $O/det.txt | tail -10
T=$(( $(left) - 90 ))
if [ "$T" -gt 60 ]; then
  timeout $T $PYT tests/test_gpu_bsa.py -k "bwd_deterministic and blk128" > $O/t_128.txt 2>&1 &
  timeout $T $PYT tests/test_gpu_bwd_variants.py -k "nowguni or hstu_bwd_qprobe" \
    > $O/t_var.txt 2>&1 &
  BSA_TEST_IMPLS=nowguni,nodefault timeout $T $PYT tests/test_gpu_bsa.py \
    -k "TestBSAKernelGrid and 128" > $O/t_grid.txt 2>&1 &
  wait; t "tests"
fi
T=$(( $(left) - 10 ))
if [ "$T" -gt 50 ]; then
  # deterministic=True's fixed-point dQ past 2**31 elements (17 x 2**20 x 128, 46 GB)
  timeout $T $PYT tests/test_gpu_large_tensors.py -k "bsa_deterministic and fixed" \
    > $O/t_large.txt 2>&1; t "large rc=$?"
fi
for f in $O/t_*.txt; do echo "== $f"; tail -n 1 $f; grep -E "^(FAILED|ERROR)" $f | head -5; done
t done
cd $OUT && tar czf s60_a.tgz s60_a && rm -rf s60_a
