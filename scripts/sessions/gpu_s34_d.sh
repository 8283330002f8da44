#!/usr/bin/env bash
# Session 34, call D: the pair-store epilogue (the HSTU default now) where items are short or
# the head dim small (MovieLens-like 128 x 200 at D 64, 64 x 512, D 32) and on the inference
# rows (contiguous and paged K / V), default against noepivec in the same call; then the
# block-sparse backward table (whole backward, sustained) for the record.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/sessions/gpu_s34_d.sh [seconds]
. "$(dirname "$0")/../gpu_lib.sh" d "${1:-330}"
timeout 100 python3 -m benchmarks.hstu_bench --no-bwd --case movielens-128x200 --case 64x512-causal \
  --case 8x4096-causal-d32 --variant "" --variant "JAX_SPARSE_ATTN_HSTU_WS=noepivec" --variant "" \
  --variant "JAX_SPARSE_ATTN_HSTU_WS=noepivec" --out $O/hstu_short.json > $O/hstu_short.txt 2>&1
t "hstu short rc=$?"; grep -v "^wrote" $O/hstu_short.txt | tail -14
timeout 80 python3 -m benchmarks.hstu_bench --inference target1-8x8192 --inference target64-8x8192 \
  --inference paged-8x4096 --paged-variant JAX_SPARSE_ATTN_HSTU_WS=noepivec \
  --contiguous-variant JAX_SPARSE_ATTN_HSTU_WS=noepivec --out $O/hstu_inf.json > $O/hstu_inf.txt 2>&1
t "hstu inference rc=$?"; grep -v "^wrote" $O/hstu_inf.txt | tail -14
L=$(left)
timeout $((L - 5)) python3 -m benchmarks.bsa_bench --table "" --table-pass bwd --rows 0,1,2,3,4,5,6 \
  --out $O/bwd.json > $O/bwd.txt 2>&1
t "bsa bwd table rc=$?"; grep -v "^wrote" $O/bwd.txt | tail -10
