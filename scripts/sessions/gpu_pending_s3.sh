#!/usr/bin/env bash
# Every GPU check that the work merged on 2026-11-30 (session 3) still owes, in one device
# call on nvidia-h200-x2 (about 8 minutes; ~15 minutes on one GPU). From the repo root:
#   source .devcache/setup.sh; export PYTHONPATH=$PWD:$PYTHONPATH; OUT=$OUT bash scripts/sessions/gpu_pending_s3.sh
# GPU 0: the default HSTU grid (sm90ws forward and sm90 backward after the GQA / paged /
#        split-KV / deterministic / dedupe changes), the sm80 backward grid (QTileRange refactor,
#        per-arch tiles), the BSA grid (bsa_fwd_impl=auto), rab, then the deterministic tests.
# GPU 1: the inference tests (GQA, paged, split-KV) + sanitizer, the portable-family grids.
# Then, alone on the machine: the benchmarks (HSTU floors table, deterministic, inference rows,
# portable rows). Summaries print at the end; logs are packed per part under $OUT.
set -u
out=${OUT:-./gpu_out}; mkdir -p "$out"
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || echo 1)
G1=$(( NGPU > 1 ? 1 : 0 ))
(
  CUDA_VISIBLE_DEVICES=0 OUT=$out/grids PARTS="hstu hstu_bwd80 bsa rab" HSTU_SHARDS=4 \
    BWD_SHARDS=4 BSA_SHARDS=3 RAB_SHARDS=2 T=300 bash tests/gpu_grids.sh > "$out/grids.txt" 2>&1
  CUDA_VISIBLE_DEVICES=0 OUT=$out/det PHASE=dettests T=200 bash scripts/sessions/gpu_hstu_det.sh \
    > "$out/det.txt" 2>&1
) &
(
  CUDA_VISIBLE_DEVICES=$G1 OUT=$out/inference STEPS=gs \
    K_G="gqa_kernel or paged_kernel or split_kv" T_G=300 T_S=120 \
    bash scripts/gpu_hstu_inference.sh > "$out/inference.txt" 2>&1
  CUDA_VISIBLE_DEVICES=$G1 OUT=$out/portable PHASE=grid T=200 bash scripts/gpu_portable.sh \
    > "$out/portable.txt" 2>&1
) &
wait
timeout 150 python3 benchmarks/hstu_bench.py --case 8x4096-causal --case 8x4096-causal-d64 \
  --case 8x4096-causal-d256 --case 32x1024-causal --case jagged32-causal --iters 20 \
  --out "$out/hstu_bench.json" > "$out/hstu_bench.txt" 2>&1
OUT=$out/det PHASE=bench bash scripts/sessions/gpu_hstu_det.sh > "$out/det_bench.txt" 2>&1
OUT=$out/inference STEPS=b T_B=120 bash scripts/gpu_hstu_inference.sh > "$out/inference_bench.txt" 2>&1
OUT=$out/portable PHASE=bench bash scripts/gpu_portable.sh > "$out/portable_bench.txt" 2>&1
for f in grids det inference portable hstu_bench det_bench inference_bench portable_bench; do
  echo "== $f"; tail -40 "$out/$f.txt"
done
