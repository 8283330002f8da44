"""Short GPU check of the sm90 HSTU backward (``hstu_bwd_impl="sm90"``): named steps, each
printed as it ends (PASS / FAIL with the error), within a wall-clock budget.

    python scripts/sessions/gpu_hstu_bwd_sm90.py smoke bench batches grid --out DIR --budget-s 200

* smoke: D=128 bf16 causal, lengths [0, 1, 63, 64, 65, 0, 127, 129], NaN-poisoned tail rows
  (tests/test_gpu_hstu.py::_bwd_case: dq/dk/dv vs the float32 reference, tolerance rule of
  the GPU grid, tail rows zero).
* bench: B=8 L=4096 H=4 D=128 causal backward, sm90 then sm80 (benchmarks/hstu_bench.py).
* batches: the other packed batches of ``test_hstu_bwd_batches`` (D=64 fp16 full, D=64 local).
* grid: grid cases of ``TestHSTUBackwardImpls`` (L_q != L_k, func masks, fp16 window, ...).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("steps", nargs="+",
                    choices=["smoke", "bench", "batches", "grid", "bulk", "bench2", "grid2"])
    ap.add_argument("--out", default="/tmp/hstu_bwd_sm90")
    ap.add_argument("--budget-s", type=float, default=200.0)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    t_start = time.time()

    import jax
    import jax.numpy as jnp

    import test_gpu_hstu as tg
    from attention_base import HSTUCase
    from jax_sparse_attn.config import Switches

    print("device:", jax.devices()[0], flush=True)
    results = {}

    def step(name, fn):
        left = a.budget_s - (time.time() - t_start)
        if left < 15:
            print(f"SKIP {name} (budget)", flush=True)
            results[name] = "skipped"
            return
        t0 = time.time()
        try:
            r = fn()
            results[name] = "PASS" if r is None else r
            print(f"PASS {name} ({time.time() - t0:.1f} s)", flush=True)
        except Exception as e:  # noqa: BLE001 - report every step
            results[name] = f"FAIL {type(e).__name__}: {str(e)[:500]}"
            print(f"FAIL {name} ({time.time() - t0:.1f} s): {type(e).__name__}: {str(e)[:1500]}",
                  flush=True)
            traceback.print_exc(limit=3)

    lens8 = [0, 1, 63, 64, 65, 0, 127, 129]
    if "smoke" in a.steps:
        step("smoke-d128-bf16-causal-poisoned",
             lambda: tg._bwd_case(lens8, 128, (-1, 0), 9, True, "sm90", "bfloat16"))
    if "bench" in a.steps:
        from benchmarks import hstu_bench as hb

        for impl in ("sm90", "sm80"):
            step(f"bench-8x4096-causal-{impl}", lambda impl=impl: hb.run_case(
                "8x4096-causal", jnp.bfloat16, 10, True, Switches(hstu_bwd_impl=impl),
                do_fwd=False))
    if "bulk" in a.steps:  # the dQ bulk reduce-add variant (hstu_bwd_dq="bulk")
        step("bulk-d128-bf16-causal-poisoned",
             lambda: tg._bwd_case(lens8, 128, (-1, 0), 9, True, "sm90", "bfloat16",
                                  dq="bulk"))
        step("bulk-d64-fp16-full-poisoned",
             lambda: tg._bwd_case(lens8, 64, (-1, -1), 9, True, "sm90", "float16", dq="bulk"))
    if "bench2" in a.steps:
        from benchmarks import hstu_bench as hb

        rows = [("8x4096-causal", "sm90", "red"), ("8x4096-causal", "sm90", "bulk"),
                ("8x4096-causal-d64", "sm90", "red"), ("8x4096-causal-d64", "sm90", "bulk"),
                ("8x4096-causal-d64", "sm80", None),
                ("jagged32-causal", "sm90", "red"), ("jagged32-causal", "sm80", None),
                ("32x1024-causal", "sm90", "red"), ("32x1024-causal", "sm80", None),
                ("8x4096-full", "sm90", "red"), ("8x4096-full", "sm80", None)]
        for case, impl, dq in rows:
            sw = Switches(hstu_bwd_impl=impl, **({"hstu_bwd_dq": dq} if dq else {}))
            step(f"bench-{case}-{impl}-{dq}", lambda case=case, sw=sw: hb.run_case(
                case, jnp.bfloat16, 10, True, sw, do_fwd=False))
    if "grid2" in a.steps:
        grid = tg.TestHSTUBackwardImpls()
        sw = Switches(hstu_bwd_impl="sm90")
        for case in (HSTUCase(64, window=(31, 7), lens="lq_lt_lk"),
                     HSTUCase(128, window=(-1, -1), alpha=0.5, scaling=77.0),
                     HSTUCase(128, window=(63, 17)),
                     HSTUCase(64, lens="partial", window=(-1, -1)),
                     HSTUCase(128, "float16", window=(5, 70)),
                     HSTUCase(128, window=(-1, -1), func_n=7),
                     HSTUCase(128, lens="partial")):
            step(f"grid-{case.id}", lambda case=case: grid.run_case(case, sw, seed=37) and None)
    # the rest in priority order (the budget may cut the tail): L_q != L_k, D = 64 with
    # zero-length sequences and poisoned tails, func masks, local windows, fp16 window
    grid = tg.TestHSTUBackwardImpls()
    sw = Switches(hstu_bwd_impl="sm90")
    rest = [
        ("grid", HSTUCase(128, lens="lq_lt_lk")),
        ("batches", ("batch-d64-fp16-full-poisoned", lens8, 64, (-1, -1), True, "float16")),
        ("grid", HSTUCase(128, window=(-1, -1), func_n=3)),
        ("batches", ("batch-d64-bf16-local-300-0-257-5", [300, 0, 257, 5], 64, (40, 3), False,
                     "bfloat16")),
        ("grid", HSTUCase(64, "float16", window=(-1, -1), func_n=3)),
        ("batches", ("batch-d128-fp16-window-poisoned", lens8, 128, (63, 17), True, "float16")),
        ("grid", HSTUCase(64, window=(31, 7), lens="lq_lt_lk")),
        ("grid", HSTUCase(128, window=(-1, -1), alpha=0.5, scaling=77.0)),
    ]
    for kind, item in rest:
        if kind not in a.steps:
            continue
        if kind == "grid":
            step(f"grid-{item.id}", lambda case=item: grid.run_case(case, sw, seed=31) and None)
        else:
            name, lens, d, window, poison, dt = item
            step(name, lambda lens=lens, d=d, window=window, poison=poison, dt=dt:
                 tg._bwd_case(lens, d, window, 9, poison, "sm90", dt))
    with open(os.path.join(a.out, f"steps_{'_'.join(a.steps)}.json"), "w") as f:
        json.dump(results, f, indent=1, default=str)
    print(json.dumps(results, indent=1, default=str), flush=True)


if __name__ == "__main__":
    main()
