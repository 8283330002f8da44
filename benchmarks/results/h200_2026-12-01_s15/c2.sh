#!/usr/bin/env bash
# device call 2 (next session): what session 13 did not re-run with pdl on — HSTU shard 0,
# rab shard 0, transforms, BSA causal / options-extra (sanitizer grid: a separate call)
set -u
O=${OUT:-./gpu_out}; mkdir -p $O
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
start=$SECONDS
t() { echo "[$((SECONDS - start))s] $*" >> $O/timeline.txt; }
HSTU_TEST_SHARD=0/4 timeout 540 python3 -m pytest -m gpu -q tests/test_gpu_hstu.py > $O/hstu_s0.txt 2>&1 &
HSTU_TEST_SHARD=0/4 timeout 540 python3 -m pytest -m gpu -q tests/test_gpu_hstu_rab.py > $O/rab_s0.txt 2>&1 &
timeout 540 python3 -m pytest -m gpu -q tests/test_gpu_transforms.py > $O/transforms.txt 2>&1 &
timeout 540 python3 -m pytest -m gpu -q tests/test_gpu_bsa_causal.py tests/test_gpu_bsa_options_extra.py > $O/bsa_extra.txt 2>&1 &
wait; t "done"
for f in $O/*.txt; do echo "== $f"; tail -3 $f; done > $O/summary.txt
