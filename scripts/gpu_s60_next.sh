#!/usr/bin/env bash
# Session 60's next call (about 540 s; best on an H200): the block-sparse backward floor rows
# on the current defaults (wguni, dqlag, qprobe at blk 128) against `nowguni`, the
# deterministic mode (fixed-point dQ, with and without `wguni` named) against the default,
# the forward rows; then the deterministic grid with `wguni` named (its GPU tests, which
# session 60 could not run) and `dqalias` with the fixed-point dQ at blk 128 (reached by
# default since session 60, not yet run).
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/gpu_s60_next.sh [seconds]
. "$(dirname "$0")/gpu_lib.sh" s60_next "${1:-540}"
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv > $O/gpu.txt 2>&1
W=JAX_SPARSE_ATTN_BSA_BWD_WS
timeout 120 python3 -m benchmarks.bsa_bench --table-pass bwd --rows 0,3,4 --timing both \
  --table ";$W=nowguni;" --out $O/bwd.json > $O/bwd.txt 2>&1
t "bwd rc=$?"; grep -v "^wrote" $O/bwd.txt | tail -18
timeout 120 python3 -m benchmarks.bsa_bench --table-pass bwd --rows 0,3,4 --timing both \
  --table ";deterministic=1;deterministic=1,$W=wguni;" --out $O/det.json > $O/det.txt 2>&1
t "det rc=$?"; grep -v "^wrote" $O/det.txt | tail -12
timeout 80 python3 -m benchmarks.bsa_bench --table-pass fwd --rows 0,1,2,3,4,5,6 --timing both \
  --table ";" --out $O/fwd.json > $O/fwd.txt 2>&1
t "fwd rc=$?"; grep -v "^wrote" $O/fwd.txt | tail -7
T=$(( $(left) - 15 ))
if [ "$T" -gt 60 ]; then
  timeout $T $PYT tests/test_gpu_dq_fixed.py -k "deterministic_wguni and blk128" \
    > $O/t_wguni128.txt 2>&1 &
  timeout $T $PYT tests/test_gpu_dq_fixed.py -k "deterministic_wguni and blk64" \
    > $O/t_wguni64.txt 2>&1 &
  timeout $T $PYT tests/test_gpu_bsa_dqalias.py -k "deterministic and blk128" \
    > $O/t_alias128.txt 2>&1 &
  wait; t "tests"
  for f in $O/t_*.txt; do echo "== $f"; tail -n 1 $f; grep -E "^(FAILED|ERROR)" $f | head -5; done
fi
t done
cd $OUT && tar czf s60_next.tgz s60_next && rm -rf s60_next
