#!/usr/bin/env bash
# Nsight Compute profiles of the default SM90 kernels (one launch each, full section set, GPU
# clocks left as they are): the HSTU sm90ws forward and sm90 backward at B8 L4096 and B32 L1024
# (D128, causal), the backward also at D256 (bwd_d256) and on the canonical jagged batch
# (bwd_jagged) and with a relative attention bias (bwd_rab1: float32, H_rab = 1; bwd_rabh: one
# bias per head, q's dtype), and the BSA sm90ws forward at blk128 12.5 % (S=16384). PROFILES selects a
# subset (names below). Reports (.ncu-rep) and text details go to $OUT/ncu.
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
PROFILES=${PROFILES:-"fwd_8x4096 fwd_32x1024 bwd_8x4096 bwd_32x1024 bsa_blk128"}
want() { case " $PROFILES " in *" $1 "*) return 0;; esac; return 1; }
want fwd_8x4096 && prof fwd_8x4096 HstuFwdSm90Ws --case 8x4096-causal --no-bwd
want fwd_32x1024 && prof fwd_32x1024 HstuFwdSm90Ws --case 32x1024-causal --no-bwd
want bwd_8x4096 && prof bwd_8x4096 HstuBwdSm90 --case 8x4096-causal --bwd-only
want bwd_32x1024 && prof bwd_32x1024 HstuBwdSm90 --case 32x1024-causal --bwd-only
want bwd_d256 && prof bwd_d256 HstuBwdSm90 --case 8x4096-causal-d256 --bwd-only
want bwd_jagged && prof bwd_jagged HstuBwdSm90 --case jagged32-causal --bwd-only
# the backward with a float32 bias shared by the heads (H_rab = 1 < H; order lpt) and with
# one bias per head (order hlpt): where the bias's time goes
want bwd_rab1 && prof bwd_rab1 HstuBwdSm90 --case 8x4096-causal --bwd-only --rab f32:1 --rab-only
want bwd_rabh && prof bwd_rabh HstuBwdSm90 --case 8x4096-causal --bwd-only --rab q:h --rab-only
if want bsa_blk128; then
  timeout -k 5 "${NCU_T:-150}" "$NCU" --set full --clock-control none --kernel-name "regex:BsaFwdSm90Ws" \
    --launch-skip 2 --launch-count 1 -f -o "$out/bsa_blk128" \
    python3 benchmarks/bsa_bench.py --table JAX_SPARSE_ATTN_BSA_FWD_IMPL=sm90ws --rows 3 \
    --out /tmp/ncu_bsa.json > "$out/bsa_blk128.run.log" 2>&1
  echo "bsa_blk128 rc=$?" >> "$out/summary.txt"
  "$NCU" --import "$out/bsa_blk128.ncu-rep" --page details > "$out/bsa_blk128.details.txt" 2>&1
fi
for f in "$out"/*.details.txt; do
  echo "== $(basename "$f")"
  grep -E "Duration|SM Frequency|Compute \(SM\) Throughput|Memory Throughput|L2 Cache Throughput|Registers Per|Achieved Occupancy|Issue Slots Busy|Executed Ipc A|No Eligible|One or More|Warp Cycles Per Issued" "$f" | head -20
done >> "$out/summary.txt"
cat "$out/summary.txt"
# the device tool returns a few files per call: pack the text reports into one archive
tar czf "$out/../ncu_text.tgz" -C "$out" $(cd "$out" && ls *.details.txt *.run.log summary.txt 2>/dev/null)
rm -f "$out"/*.details.txt "$out"/*.run.log
