#!/usr/bin/env bash
# Two-GPU checks (nvidia-h200-x2), one device call (~4 min): batch- and head-sharded HSTU
# and BSA forward + grad on the kernel backend equal the single-GPU result with no
# all-gather / all-to-all in the compiled HLO (tests/sharding_worker.py), then the
# data-parallel training example with the weak-scaling benchmark (1 GPU vs 2 GPUs).
# Logs and JSON go to $OUT (default ./gpu_out).
# Usage (repo root): [source .devcache/setup.sh;] bash scripts/gpu_transforms_x2.sh
set -u
out=${OUT:-./gpu_out}
mkdir -p "$out"
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi --query-gpu=name,driver_version --format=csv > "$out/gpu.txt" 2>&1
timeout 240 python3 tests/sharding_worker.py --backend kernel --train-steps 3 \
  > "$out/sharding_worker.log" 2>&1; echo "sharding_worker rc=$?" | tee -a "$out/summary.txt"
python3 - "$out/sharding_worker.log" <<'PY' | tee -a "$out/summary.txt"
import json, sys
lines = [l for l in open(sys.argv[1]) if l.startswith("RESULT ")]
if not lines:
    print("sharding: no RESULT line"); sys.exit(0)
r = json.loads(lines[-1][7:])
for k, v in r.items():
    if isinstance(v, dict) and "collectives" in v:
        ok = v["collectives"]["all-gather"] == 0 and v["collectives"]["all-to-all"] == 0
        print(f"{k}: max_abs_diff={v['max_abs_diff']:.3g} collectives={v['collectives']} "
              f"{'PASS' if ok and v['max_abs_diff'] <= 2e-2 * v['scale'] else 'FAIL'}")
print("train losses", r.get("train", {}).get("losses"))
PY
timeout 240 python3 examples/hstu_dp_train.py --backend kernel --steps 20 --bench \
  --out "$out/hstu_dp_train.json" > "$out/hstu_dp_train.log" 2>&1
echo "hstu_dp_train rc=$?" | tee -a "$out/summary.txt"; tail -2 "$out/hstu_dp_train.log" >> "$out/summary.txt"
cat "$out/summary.txt"
