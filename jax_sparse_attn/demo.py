"""Short runnable demo of both ops: ``python -m jax_sparse_attn.demo``.

Runs HSTU attention on a packed batch of variable-length sequences and block-sparse
attention with top-k KV blocks (chosen block-causally), each forward + backward under ``jax.jit``, on whatever
backend ``backend="auto"`` selects here (printed with the reason), and checks them
against the pure-JAX reference: the printed error is the relative L2 error
``|out - ref| / |ref|`` of the op's output against the pure-JAX reference on the same
(16-bit) inputs (float32 accumulation, output rounded to the input dtype), so on the kernel
backend it measures the kernel's rounding error against the reference's (about 1e-3 to 1e-2
for bfloat16) and on the reference backend it is 0.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

import jax_sparse_attn as jsa
from jax_sparse_attn import masks, reference


def _rel_err(a, b):
    a = np.asarray(a, np.float32)
    b = np.asarray(b, np.float32)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def demo_hstu(key, dtype, backend):
    lengths = [17, 0, 113, 64, 1]
    H, D = 2, 64
    cu = jnp.asarray(np.concatenate([[0], np.cumsum(lengths)]), jnp.int32)
    T, max_len = int(cu[-1]), max(lengths)
    kq, kk, kv, kd = jax.random.split(key, 4)
    q = jax.random.normal(kq, (T, H, D), dtype)
    k = jax.random.normal(kk, (T, H, D), dtype)
    v = jax.random.normal(kv, (T, H, D), dtype)
    opts = dict(max_seqlen_q=max_len, max_seqlen_k=max_len, window_size=(-1, 0), alpha=1.0 / D)

    @jax.jit
    def loss(q, k, v):
        out = jsa.hstu_attention(q, k, v, cu, cu, backend=backend, **opts)
        return jnp.sum(out.astype(jnp.float32) ** 2)

    t0 = time.perf_counter()
    val, grads = jax.value_and_grad(loss, argnums=(0, 1, 2))(q, k, v)
    jax.block_until_ready(grads)
    dt = time.perf_counter() - t0
    out = jsa.hstu_attention(q, k, v, cu, cu, backend=backend, **opts)
    ref = reference.hstu_attention_ref(q, k, v, cu, cu, **opts)
    print(jsa.which_backend(jsa.hstu_attention, q, k, v, cu, cu, backend=backend, **opts))
    print(f"HSTU  causal, lengths {lengths}, H={H}, D={D}, {jnp.dtype(dtype).name}: "
          f"out {out.shape}, loss {float(val):.4f}, |dq| {float(jnp.linalg.norm(grads[0].astype(jnp.float32))):.4f}, "
          f"rel. L2 err of out vs reference (fp32 accum.) {_rel_err(out, ref):.2e}, "
          f"fwd+bwd (incl. compile) {dt:.2f} s")


def demo_bsa(key, dtype, backend):
    B, Hq, Hkv, S, D, blk, top_k = 2, 4, 2, 1000, 64, 128, 3
    kq, kk, kv = jax.random.split(key, 3)
    q = jax.random.normal(kq, (B, Hq, S, D), dtype)
    k = jax.random.normal(kk, (B, Hkv, S, D), dtype)
    v = jax.random.normal(kv, (B, Hkv, S, D), dtype)
    index, nums = masks.topk_block_index(q, k, top_k, sparse_block_size=blk, causal=True)

    @jax.jit
    def loss(q, k, v):
        out = jsa.block_sparse_attention(q, k, v, index, q2k_block_nums=nums,
                                         sparse_block_size=blk, backend=backend)
        return jnp.sum(out.astype(jnp.float32) ** 2)

    t0 = time.perf_counter()
    val, grads = jax.value_and_grad(loss, argnums=(0, 1, 2))(q, k, v)
    jax.block_until_ready(grads)
    dt = time.perf_counter() - t0
    out, lse = jsa.block_sparse_attention_forward(q, k, v, index, q2k_block_nums=nums,
                                                  sparse_block_size=blk, backend=backend)
    ref, _ = reference.block_sparse_attention_ref(q, k, v, index, nums, sparse_block_size=blk)
    print(jsa.which_backend(jsa.block_sparse_attention, q, k, v, index, q2k_block_nums=nums,
                            sparse_block_size=blk, backend=backend))
    # the blocks are picked causally (none past a query block's diagonal block); inside the
    # diagonal block every key is attended (the op's causal=False)
    print(f"BSA   block-causal top-{top_k} of {-(-S // blk)} blocks, B={B}, H_q={Hq}, H_kv={Hkv}, S={S}, "
          f"D={D}, {jnp.dtype(dtype).name}: out {out.shape}, lse {lse.shape}, loss {float(val):.4f}, "
          f"rel. L2 err of out vs reference (fp32 accum.) {_rel_err(out, ref):.2e}, "
          f"fwd+bwd (incl. compile) {dt:.2f} s")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="auto", choices=("auto", "kernel", "reference"))
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    dev = jax.devices()[0]
    print(f"jax {jax.__version__} on {dev.platform} ({dev.device_kind}), backend={args.backend!r}")
    print(jsa.kernel_status())
    k1, k2 = jax.random.split(jax.random.PRNGKey(args.seed))
    dtype = jnp.dtype(args.dtype)
    demo_hstu(k1, dtype, args.backend)
    demo_bsa(k2, dtype, args.backend)


if __name__ == "__main__":
    main()
