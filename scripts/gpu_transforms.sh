#!/usr/bin/env bash
# JAX transformations on the kernel backend, one H200, one device call (~5 min):
#   GPU tests (vmap vs loop/reference, vmap-of-grad, remat, export round trip in a fresh
#   process, one compile for many lengths, disk cache in a fresh process), the lowering
#   tests of the transforms, and benchmarks/transforms_bench.py (new-length and
#   process-start cost). Logs and JSON go to $OUT (default ./gpu_out).
# Usage (repo root): [source .devcache/setup.sh;] bash scripts/gpu_transforms.sh
set -u
out=${OUT:-./gpu_out}
mkdir -p "$out"
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi --query-gpu=name,driver_version --format=csv > "$out/gpu.txt" 2>&1
timeout 300 python3 -m pytest -q -m gpu tests/test_gpu_transforms.py -rA \
  > "$out/test_gpu_transforms.log" 2>&1; echo "test_gpu_transforms rc=$?" | tee -a "$out/summary.txt"
timeout 150 python3 benchmarks/transforms_bench.py --out "$out/transforms_bench.json" \
  > "$out/transforms_bench.log" 2>&1; echo "transforms_bench rc=$?" | tee -a "$out/summary.txt"
tail -3 "$out/test_gpu_transforms.log" >> "$out/summary.txt"
cat "$out/summary.txt"
