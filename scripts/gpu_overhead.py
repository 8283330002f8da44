"""Per-call overhead of the public HSTU forward: is a small call bound by the GPU or by the
host? Times the same forward three ways on one device:

- ``separate``: back-to-back jitted calls (what ``benchmarks/hstu_bench.py`` reports);
- ``in_loop``: N calls inside one jitted ``lax.fori_loop`` (one dispatch for N calls; each
  iteration's q depends on the previous output through ``acc * 0`` so nothing is hoisted);
- ``loop_body_only``: the same loop without the attention call (the dependency op alone),
  subtracted from ``in_loop``.

    python scripts/gpu_overhead.py --out overhead.json [--case 32x1024 --case 8x4096]

If ``separate`` is well above ``in_loop - loop_body_only``, the difference is per-call host
work (dispatch, buffer allocation, command-buffer updates), not kernel time. Not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax_sparse_attn as jsa  # noqa: E402

_BACKEND = os.environ.get("TRACE_BACKEND", "kernel")  # "reference": a CPU smoke run
_CASES = {"32x1024": (32, 1024), "8x4096": (8, 4096), "8x1024": (8, 1024)}


def _median_ms(fn, args, reps, samples=7):
    jax.block_until_ready(fn(*args))
    out = []
    for _ in range(samples):
        t0 = time.perf_counter()
        for _ in range(reps):
            r = fn(*args)
        jax.block_until_ready(r)
        out.append((time.perf_counter() - t0) / reps * 1e3)
    return float(np.median(out))


def run(name, iters, h=4, d=128):
    b, l = _CASES[name]
    ks = jax.random.split(jax.random.PRNGKey(0), 3)
    q, k, v = (jax.random.normal(kk, (b * l, h, d), jnp.bfloat16) for kk in ks)
    cu = jnp.asarray(np.arange(b + 1) * l, jnp.int32)
    kw = dict(max_seqlen_q=l, max_seqlen_k=l, scaling_seqlen=float(l), window_size=(-1, 0),
              alpha=1.0 / np.sqrt(d), backend=_BACKEND)
    flops = 2.0 * b * l * l * h * d

    def attn(q):
        return jsa.hstu_attention(q, k, v, cu, cu, **kw)

    def loop(with_attn):
        def body(i, acc):
            qi = q + (acc * 0).astype(q.dtype)
            o = attn(qi) if with_attn else qi
            return acc + o[0, 0, 0].astype(jnp.float32)
        return jax.jit(lambda: jax.lax.fori_loop(0, iters, body, jnp.float32(0)))

    sep = _median_ms(jax.jit(attn), (q,), iters)
    full = _median_ms(loop(True), (), 1) / iters
    base = _median_ms(loop(False), (), 1) / iters
    row = dict(case=name, B=b, L=l, H=h, D=d, iters=iters, separate_ms=sep,
               in_loop_ms=full, loop_body_only_ms=base, in_loop_attention_ms=full - base)
    for key in ("separate_ms", "in_loop_attention_ms"):
        row[key.replace("_ms", "_tflops")] = flops / (row[key] * 1e-3) / 1e12
    print(f"{name:8s} separate {sep:.4f} ms ({row['separate_tflops']:.1f} TFLOP/s) | in one "
          f"jit loop {full - base:.4f} ms ({row['in_loop_attention_tflops']:.1f}) | loop body "
          f"alone {base:.4f} ms", flush=True)
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", action="append", choices=sorted(_CASES))
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    rows = [run(c, a.iters) for c in (a.case or ["32x1024", "8x4096"])]
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"device": str(jax.devices()[0]), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
