#!/usr/bin/env python3
"""sha256 of the PTX of the HSTU kernels without rab, lowered for sm_90a on CPU.

Used to check that a change leaves the kernels without a relative attention bias
byte-identical: run it on two trees and diff the outputs, e.g.

    CUTE_DSL_ARCH=sm_90a PYTHONPATH=<tree> python scripts/hstu_ptx_hashes.py /tmp/dump > a.txt

Each line: ``<fwd|bwd>-<forward impl>-<D>-<func endpoints>-<dtype> <n ptx> <sha256[:16]>``.
It goes through the public ``hstu_attention`` (forward) and ``jax.grad`` of it (backward
only), selecting the forward with ``JAX_SPARSE_ATTN_HSTU_FWD_IMPL``.
"""

import glob
import hashlib
import os
import sys

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
os.environ["JAX_SPARSE_ATTN_FORCE_KERNEL"] = "1"
dump = sys.argv[1] if len(sys.argv) > 1 else "/tmp/hstu_ptx_dump"
os.makedirs(dump, exist_ok=True)
os.environ["CUTE_DSL_DUMP_DIR"] = dump
os.environ["CUTE_DSL_KEEP"] = "ptx"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import jax_sparse_attn as jsa  # noqa: E402

T, B = 300, 3
CASES = [(direction, impl, d, fn, dt)
         for direction, impls in (("fwd", ("sm90ws", "sm80")), ("bwd", ("sm90ws",)))
         for impl in impls
         for d, fn, dt in ((128, 0, jnp.bfloat16), (64, 3, jnp.float16), (256, 0, jnp.bfloat16),
                           (32, 5, jnp.bfloat16))]

for direction, impl, d, fn, dt in CASES:
    os.environ["JAX_SPARSE_ATTN_HSTU_FWD_IMPL"] = impl
    jax.clear_caches()  # the implementation is read at trace time
    q = jax.ShapeDtypeStruct((T, 2, d), dt)
    cu = jax.ShapeDtypeStruct((B + 1,), jnp.int32)
    func = jax.ShapeDtypeStruct((1, fn, T + 256), jnp.int32) if fn else None
    window = (-1, -1) if fn else (-1, 0)

    def fwd(q, k, v, cu, func):
        return jsa.hstu_attention(q, k, v, cu, cu, func=func, max_seqlen_q=100,
                                  max_seqlen_k=100, scaling_seqlen=100.0, window_size=window,
                                  alpha=1.0, backend="kernel")

    f = fwd if direction == "fwd" else jax.grad(
        lambda q, k, v, cu, func: jnp.sum(fwd(q, k, v, cu, func).astype(jnp.float32)),
        argnums=(0, 1, 2))
    jax.jit(f).trace(q, q, q, cu, func).lower(lowering_platforms=("cuda",))
    ptx = sorted(p for p in glob.glob(os.path.join(dump, "**", "*.ptx"), recursive=True)
                 if "hstu_scheduleHstuSchedule" not in open(p).read())  # not the schedule kernel
    hs = [hashlib.sha256(open(p, "rb").read()).hexdigest()[:16] for p in ptx]
    for p in ptx:
        os.remove(p)
    print(f"{direction}-{impl}-{d}-{fn}-{jnp.dtype(dt).name}", len(ptx), " ".join(hs), flush=True)
