"""Where a public call's GPU time goes: every kernel of N back-to-back calls, from a JAX
profiler trace (CUPTI; perfetto JSON), split into the attention kernel and the rest
(tile-schedule metadata, casts, ...), next to the wall-clock time per call.

    python scripts/gpu_trace.py --out trace_summary.json [--case hstu_fwd_8x4096 ...]

Not a test; prints one block per case and writes the JSON summary.
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import shutil
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax_sparse_attn as jsa  # noqa: E402

_BACKEND = os.environ.get("TRACE_BACKEND", "kernel")  # "reference": a CPU smoke run


def _hstu(b, l, d, bwd, jagged=False, h=4):
    if jagged:
        from benchmarks._grids import canonical_jagged_lengths

        lens = np.asarray(canonical_jagged_lengths(), np.int64)
    else:
        lens = np.full(b, l, np.int64)
    t, lmax = int(lens.sum()), int(lens.max())
    ks = jax.random.split(jax.random.PRNGKey(0), 4)
    q, k, v, do = (jax.random.normal(kk, (t, h, d), jnp.bfloat16) for kk in ks)
    cu = jnp.asarray(np.concatenate([[0], np.cumsum(lens)]), jnp.int32)
    kw = dict(max_seqlen_q=lmax, max_seqlen_k=lmax, scaling_seqlen=float(lmax),
              window_size=(-1, 0), alpha=1.0 / np.sqrt(d), backend=_BACKEND)
    flops = 2.0 * float(np.sum(lens.astype(np.float64) ** 2)) * h * d
    if bwd:
        fn = jax.jit(lambda do, q, k, v, cu: tuple(
            jsa.hstu_attention_backward(do, q, k, v, cu, cu, **kw)))
        return fn, (do, q, k, v, cu), 2.5 * flops
    fn = jax.jit(lambda q, k, v, cu: jsa.hstu_attention(q, k, v, cu, cu, **kw))
    return fn, (q, k, v, cu), flops


def _bsa(blk, topk, s=16384, h=16, d=128, bwd=False, deterministic=False, h_kv=None,
         lists="random"):
    from benchmarks.bsa_bench import _inputs

    q, k, v, idx, nums = _inputs(jax.random.PRNGKey(1), 1, h, s, d, blk, topk, jnp.bfloat16,
                                 h if h_kv is None else h_kv, lists)[:5]
    kw = dict(layout="bhsd", sparse_block_size=blk, softmax_scale=1.0 / np.sqrt(d),
              backend=_BACKEND, deterministic=deterministic)
    flops = 4.0 * h * s * d * topk * blk
    if bwd == "only":  # the backward alone from the saved forward (bsa_bench --table-pass bwd)
        out, lse = jax.jit(lambda q, k, v: tuple(jsa.block_sparse_attention_forward(
            q, k, v, idx, None, None, nums, **kw)))(q, k, v)
        do = jax.random.normal(jax.random.PRNGKey(2), q.shape, jnp.float32).astype(q.dtype)
        fn = jax.jit(lambda do, q, k, v, out, lse: tuple(jsa.block_sparse_attention_backward(
            do, q, k, v, out, lse, idx, None, None, nums, **kw)))
        return fn, (do, q, k, v, out, lse), 2.5 * flops
    if bwd:
        def loss(q, k, v):
            return jsa.block_sparse_attention(q, k, v, idx, None, None, nums, **kw).astype(
                jnp.float32).sum()

        fn = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
        return fn, (q, k, v), 3.5 * flops
    fn = jax.jit(lambda q, k, v: tuple(
        jsa.block_sparse_attention_forward(q, k, v, idx, None, None, nums, **kw)))
    return fn, (q, k, v), flops


CASES = {
    "hstu_fwd_8x4096": lambda: _hstu(8, 4096, 128, False),
    "hstu_fwd_32x1024": lambda: _hstu(32, 1024, 128, False),
    "hstu_fwd_jagged": lambda: _hstu(0, 0, 128, False, jagged=True),
    "hstu_bwd_8x4096": lambda: _hstu(8, 4096, 128, True),
    "hstu_bwd_32x1024": lambda: _hstu(32, 1024, 128, True),
    "hstu_bwd_jagged": lambda: _hstu(0, 0, 128, True, jagged=True),
    "hstu_bwd_8x4096_d256": lambda: _hstu(8, 4096, 256, True),
    "bsa_fwd_blk128": lambda: _bsa(128, 16),
    "bsa_fwd_blk64": lambda: _bsa(64, 32),
    "bsa_fwd_blk64_5": lambda: _bsa(64, 13),
    "bsa_fwdbwd_blk64": lambda: _bsa(64, 32, bwd=True),
    "bsa_fwdbwd_blk128": lambda: _bsa(128, 16, bwd=True),
    "bsa_fwd_s32768": lambda: _bsa(128, 32, s=32768),
    "bsa_bwd_blk64": lambda: _bsa(64, 32, bwd="only"),
    "bsa_bwd_blk64_25": lambda: _bsa(64, 64, bwd="only"),
    "bsa_bwd_blk128": lambda: _bsa(128, 16, bwd="only"),
    "bsa_bwd_s32768": lambda: _bsa(128, 32, s=32768, bwd="only"),
    "bsa_bwd_gqa_blk64": lambda: _bsa(64, 32, bwd="only", h_kv=4),
    # two heads (bsa_bench row 8), random lists and KV block 0 in every list ("hot")
    "bsa_bwd_s32768_h2": lambda: _bsa(128, 32, s=32768, h=2, bwd="only"),
    "bsa_bwd_s32768_h2_hot": lambda: _bsa(128, 32, s=32768, h=2, bwd="only", lists="hot"),
    # deterministic=True (the dQ order from the environment: JAX_SPARSE_ATTN_BSA_BWD_WS)
    "bsa_bwd_det_blk64": lambda: _bsa(64, 32, bwd="only", deterministic=True),
    "bsa_bwd_det_blk128": lambda: _bsa(128, 16, bwd="only", deterministic=True),
    "bsa_bwd_det_s32768": lambda: _bsa(128, 32, s=32768, bwd="only", deterministic=True),
    "bsa_bwd_det_gqa_blk64": lambda: _bsa(64, 32, bwd="only", deterministic=True, h_kv=4),
}
_OURS = ("Hstu", "Bsa", "Attn", "cutlass")


def _device_events(trace_dir):
    path = glob.glob(os.path.join(trace_dir, "**", "*perfetto_trace.json.gz"), recursive=True)
    if not path:
        return None
    with gzip.open(path[0]) as f:
        t = json.load(f)
    ev = t["traceEvents"] if isinstance(t, dict) else t
    names = {e["pid"]: e.get("args", {}).get("name", "") for e in ev
             if e.get("ph") == "M" and e.get("name") == "process_name"}
    gpu = {p for p, n in names.items() if "GPU" in n or "gpu" in n}
    return [e for e in ev if e.get("ph") == "X" and e.get("pid") in gpu and "dur" in e]


def trace_case(name, iters):
    fn, args, flops = CASES[name]()
    for _ in range(3):
        jax.block_until_ready(fn(*args))
    t0 = time.perf_counter()
    for _ in range(iters):
        r = fn(*args)
    jax.block_until_ready(r)
    wall_ms = (time.perf_counter() - t0) / iters * 1e3
    d = tempfile.mkdtemp(prefix="jtrace_")
    with jax.profiler.trace(d, create_perfetto_trace=True):
        for _ in range(iters):
            r = fn(*args)
        jax.block_until_ready(r)
    ev = _device_events(d) or []
    shutil.rmtree(d, ignore_errors=True)
    by = collections.defaultdict(list)
    for e in ev:
        by[e["name"][:90]].append(e["dur"])
    kernels = sorted(((n, len(v), float(np.sum(v)) / iters) for n, v in by.items()),
                     key=lambda x: -x[2])
    ours = sum(us for n, _, us in kernels if any(o in n for o in _OURS))
    rest = sum(us for n, _, us in kernels if not any(o in n for o in _OURS))
    span = 0.0
    if ev:
        span = (max(e["ts"] + e["dur"] for e in ev) - min(e["ts"] for e in ev)) / iters
    res = dict(case=name, iters=iters, wall_ms=wall_ms, tflops_wall=flops / wall_ms / 1e9,
               attention_kernels_us=ours, other_kernels_us=rest, device_span_us=span,
               tflops_kernels=flops / max(ours, 1e-9) / 1e6 if ours else None,
               kernels=[dict(name=n, calls=c, us_per_call=us) for n, c, us in kernels[:12]])
    print(f"== {name}: wall {wall_ms * 1e3:8.1f} us/call ({res['tflops_wall']:.1f} TFLOP/s); "
          f"attention kernels {ours:8.1f} us, other kernels {rest:6.1f} us, device span "
          f"{span:8.1f} us", flush=True)
    for n, c, us in kernels[:12]:
        print(f"   {us:9.1f} us  x{c // iters:<3d} {n}", flush=True)
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", action="append", choices=sorted(CASES))
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--out", default="trace_summary.json")
    a = ap.parse_args()
    rows = []
    for c in a.case or ["hstu_fwd_8x4096", "hstu_fwd_32x1024", "hstu_bwd_8x4096",
                        "hstu_bwd_32x1024", "bsa_fwd_blk128"]:
        try:
            rows.append(trace_case(c, a.iters))
        except Exception as e:  # noqa: BLE001 - one failing case must not end the run
            print(f"== {c}: FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
        with open(a.out, "w") as f:
            json.dump(dict(device=str(jax.devices()[0]), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
