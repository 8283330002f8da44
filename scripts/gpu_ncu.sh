#!/usr/bin/env bash
# Nsight Compute profiles of the HSTU kernels (one launch each, full section set, GPU clocks
# left as they are): the sm90ws forward at B8 L4096 and B32 L1024 (D128, causal) and the
# sm80 backward at B8 L4096. Reports (.ncu-rep) and text details go to $OUT/ncu.
# Usage (repo root, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/gpu_ncu.sh
set -u
out=${OUT:-./gpu_out}/ncu
mkdir -p "$out"
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -n "$NCU" ] || { echo "ncu not found" | tee "$out/summary.txt"; exit 0; }
prof() {  # name kernel-regex bench-args...
  local name=$1 kern=$2; shift 2
  timeout -k 5 "${NCU_T:-150}" "$NCU" --set full --clock-control none --kernel-name "regex:$kern" \
    --launch-skip 2 --launch-count 1 -f -o "$out/$name" \
    python3 benchmarks/hstu_bench.py --iters 3 --out "/tmp/ncu_$name.json" "$@" > "$out/$name.run.log" 2>&1
  echo "$name rc=$?" >> "$out/summary.txt"
  "$NCU" --import "$out/$name.ncu-rep" --page details > "$out/$name.details.txt" 2>&1
}
prof fwd_8x4096 HstuFwdSm90Ws --case 8x4096-causal --no-bwd
prof fwd_32x1024 HstuFwdSm90Ws --case 32x1024-causal --no-bwd
prof bwd_8x4096 HstuBwdSm80 --case 8x4096-causal
for f in "$out"/*.details.txt; do
  echo "== $(basename "$f")"
  grep -E "Duration|SM Frequency|Compute \(SM\) Throughput|Memory Throughput|L2 Cache Throughput|Registers Per|Achieved Occupancy|Issue Slots Busy|Executed Ipc A|No Eligible|One or More|Warp Cycles Per Issued" "$f" | head -20
done >> "$out/summary.txt"
cat "$out/summary.txt"
