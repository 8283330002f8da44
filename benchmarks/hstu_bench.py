"""HSTU kernel benchmark: prints ms and TFLOP/s, writes JSON (not a test).

FLOPs (issue 3): causal forward = 2 * sum_b L_b^2 * H * D, full = 2x that; backward =
2.5x forward. Times are wall-clock per call of the jitted kernel-backend function
(``jax_sparse_attn.ffi.hstu``; tile-schedule metadata ops included), averaged over
``--iters`` back-to-back calls after warm-up.

    python benchmarks/hstu_bench.py --out /tmp/hstu_bench.json
    python benchmarks/hstu_bench.py --case 8x4096 --dtype bfloat16
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np

from jax_sparse_attn.config import Switches

CASES = {
    # name: (B, L, H, D, window)
    "8x4096-causal": (8, 4096, 4, 128, (-1, 0)),
    "32x1024-causal": (32, 1024, 4, 128, (-1, 0)),
    "8x4096-full": (8, 4096, 4, 128, (-1, -1)),
    "8x4096-causal-d64": (8, 4096, 4, 64, (-1, 0)),
    "8x4096-causal-d256": (8, 4096, 4, 256, (-1, 0)),
}


def flops_fwd(b, l, h, d, window):
    causal = 2.0 * b * l * l * h * d
    return 2 * causal if window == (-1, -1) else causal


def _time(fn, args, iters, warmup=3):
    for _ in range(warmup):
        jax.block_until_ready(fn(*args))
    t0 = time.perf_counter()
    for _ in range(iters):
        r = fn(*args)
    jax.block_until_ready(r)
    return (time.perf_counter() - t0) / iters * 1e3


def run_case(name, dtype, iters, do_bwd, switches=None):
    import jax_sparse_attn as jsa

    b, l, h, d, window = CASES[name]
    t = b * l
    ks = jax.random.split(jax.random.PRNGKey(0), 4)
    q, k, v, do = (jax.random.normal(kk, (t, h, d), jnp.float32).astype(dtype) for kk in ks)
    cu = jnp.arange(b + 1, dtype=jnp.int32) * l
    kw = dict(max_seqlen_q=l, max_seqlen_k=l, scaling_seqlen=float(l), window_size=window,
              alpha=1.0 / np.sqrt(d), backend="kernel", switches=switches)
    fwd = jax.jit(lambda q, k, v, cu: jsa.hstu_attention(q, k, v, cu, cu, **kw))
    t0 = time.perf_counter()
    jax.block_until_ready(fwd(q, k, v, cu))
    compile_fwd = time.perf_counter() - t0
    ms = _time(fwd, (q, k, v, cu), iters)
    fl = flops_fwd(b, l, h, d, window)
    res = dict(case=name, dtype=jnp.dtype(dtype).name, B=b, L=l, H=h, D=d, window=window,
               fwd_ms=ms, fwd_tflops=fl / ms / 1e9, fwd_first_call_s=compile_fwd)
    if do_bwd:
        bwd = jax.jit(lambda do, q, k, v, cu: tuple(
            jsa.hstu_attention_backward(do, q, k, v, cu, cu, **kw)))
        t0 = time.perf_counter()
        jax.block_until_ready(bwd(do, q, k, v, cu))
        res["bwd_first_call_s"] = time.perf_counter() - t0
        ms_b = _time(bwd, (do, q, k, v, cu), iters)
        res.update(bwd_ms=ms_b, bwd_tflops=2.5 * fl / ms_b / 1e9)
    line = (f"{name:22s} {res['dtype']:9s} fwd {ms:8.3f} ms {res['fwd_tflops']:7.1f} TFLOP/s")
    if do_bwd:
        line += f" | bwd {res['bwd_ms']:8.3f} ms {res['bwd_tflops']:7.1f} TFLOP/s"
    print(line, flush=True)
    return res


def _tile(text):
    return None if text is None else tuple(int(x) for x in text.split(","))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", action="append", choices=sorted(CASES),
                    help="case(s) to run (default: 8x4096-causal and 32x1024-causal)")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--no-bwd", action="store_true")
    ap.add_argument("--out", default="hstu_bench.json")
    ap.add_argument("--tiles", action="append", default=[],
                    help="extra variant 'fwd=bm,bn,warps;bwd=bm,bn,warps;impl=sm90' (sweep; "
                         "impl=sm90 / sm90pp select a wgmma forward; sm90pp is the default)")
    a = ap.parse_args()
    cases = a.case or ["8x4096-causal", "32x1024-causal"]
    print(f"device: {jax.devices()[0]}")
    results = [run_case(c, jnp.dtype(a.dtype), a.iters, not a.no_bwd) for c in cases]
    for variant in a.tiles:
        env = dict(kv.split("=") for kv in variant.split(";") if kv)
        sw = Switches(hstu_fwd_impl=env.get("impl", "sm80"),
                      hstu_fwd_tile=_tile(env.get("fwd")), hstu_bwd_tile=_tile(env.get("bwd")))
        print(f"-- tiles {variant}")
        for c in cases:
            r = run_case(c, jnp.dtype(a.dtype), a.iters, "bwd" in env, sw)
            r["tiles"] = variant
            results.append(r)
    with open(a.out, "w") as f:
        json.dump(dict(device=str(jax.devices()[0]), results=results), f, indent=1)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
