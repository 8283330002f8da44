"""Every JAX transform of every op agrees with a Python loop / the untransformed op, and
the ``_forward`` entry points are differentiable with cotangents for ``out`` and ``lse``.

Reference backend in CI (vmap, vmap of grad, jit, remat); the kernel backend runs the
transforms it supports (jit, grad, remat; ``gpu`` marker).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_sparse_attn import (
    block_sparse_attention,
    block_sparse_attention_backward,
    block_sparse_attention_forward,
    hstu_attention,
    hstu_attention_backward,
    hstu_attention_forward,
)

from oracle import fd_check, x64

H, D, BLK = 2, 32, 64


def _close(a, b, tol):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    # a - b broadcasts: a result of the wrong shape (e.g. a missing or extra vmapped axis)
    # would otherwise be compared element by element with the broadcast copy
    assert a.shape == b.shape, (a.shape, b.shape)
    err = np.max(np.abs(a - b)) if a.size else 0.0
    assert err <= tol * max(1.0, np.max(np.abs(b)) if b.size else 1.0), err


def _hstu_inputs(rng, n, dtype):
    cu = jnp.array([0, 17, 17, 50], jnp.int32)
    T = 50
    qs = jnp.asarray(rng.standard_normal((n, T, H, D)) * 0.5, dtype)
    k = jnp.asarray(rng.standard_normal((T, H, D)) * 0.5, dtype)
    v = jnp.asarray(rng.standard_normal((T, H, D)), dtype)
    w = jnp.asarray(rng.standard_normal((T, H, D)), jnp.float32)
    return qs, k, v, w, cu


def _bsa_inputs(rng, n, dtype):
    S = 128 + 17
    qs = jnp.asarray(rng.standard_normal((n, 1, H, S, D)), dtype)
    k = jnp.asarray(rng.standard_normal((1, H, S, D)), dtype)
    v = jnp.asarray(rng.standard_normal((1, H, S, D)), dtype)
    w = jnp.asarray(rng.standard_normal((1, H, S, D)), jnp.float32)
    u = jnp.asarray(rng.standard_normal((1, H, S)), jnp.float32)
    idx = jnp.array([[[[0, 2, 1], [2, 1, 0], [1, 0, 2]], [[1, 0, 2], [0, 1, 2], [2, 0, 1]]]],
                    jnp.int32)
    nums = jnp.array([[[2, 3, 1], [1, 2, 3]]], jnp.int32)
    return qs, k, v, w, u, idx, nums


# ----------------------------------------------------------------------------- vmap == loop


def _ops(backend):
    """(name, make_inputs, loss(q, k, v, extra...)) for every public op."""
    hkw = dict(max_seqlen_q=33, max_seqlen_k=33, alpha=0.7, backend=backend)
    bkw = dict(sparse_block_size=BLK, backend=backend)

    def hstu_loss(q, k, v, w, cu):
        return jnp.sum(hstu_attention(q, k, v, cu, cu, **hkw).astype(jnp.float32) * w)

    def hstu_fwd_loss(q, k, v, w, cu):
        (o,) = hstu_attention_forward(q, k, v, cu, cu, **hkw)
        return jnp.sum(o.astype(jnp.float32) * w)

    def hstu_bwd_loss(q, k, v, w, cu):
        r = hstu_attention_backward(w.astype(q.dtype), q, k, v, cu, cu, **hkw)
        return sum(jnp.sum(x.astype(jnp.float32) ** 2) for x in r)

    def bsa_loss(q, k, v, w, u, idx, nums):
        o = block_sparse_attention(q, k, v, idx, q2k_block_nums=nums, **bkw)
        return jnp.sum(o.astype(jnp.float32) * w)

    def bsa_fwd_loss(q, k, v, w, u, idx, nums):
        o, lse = block_sparse_attention_forward(q, k, v, idx, q2k_block_nums=nums, **bkw)
        return jnp.sum(o.astype(jnp.float32) * w) + jnp.sum(lse * u)

    def bsa_bwd_loss(q, k, v, w, u, idx, nums):
        o, lse = block_sparse_attention_forward(q, k, v, idx, q2k_block_nums=nums, **bkw)
        r = block_sparse_attention_backward(w.astype(q.dtype), q, k, v, o, lse, idx,
                                            q2k_block_nums=nums, **bkw)
        return sum(jnp.sum(x.astype(jnp.float32) ** 2) for x in r)

    return [
        ("hstu_attention", _hstu_inputs, hstu_loss),
        ("hstu_attention_forward", _hstu_inputs, hstu_fwd_loss),
        ("hstu_attention_backward", _hstu_inputs, hstu_bwd_loss),
        ("block_sparse_attention", _bsa_inputs, bsa_loss),
        ("block_sparse_attention_forward", _bsa_inputs, bsa_fwd_loss),
        ("block_sparse_attention_backward", _bsa_inputs, bsa_bwd_loss),
    ]


_OP_NAMES = [name for name, _, _ in _ops("reference")]
_GRADLESS = ("hstu_attention_backward", "block_sparse_attention_backward")  # no 2nd order


def _op(name, backend):
    return next(o for o in _ops(backend) if o[0] == name)


@pytest.mark.parametrize("name", _OP_NAMES)
@pytest.mark.parametrize("shared", ["q_only", "all"])
def test_vmap_matches_loop_reference(name, shared):
    """vmap of the loss and (where differentiable) vmap of its grad == Python loop."""
    _, make, loss = _op(name, "reference")
    rng = np.random.default_rng(0)
    qs, k, v, *rest = make(rng, 2, jnp.float32)
    if shared == "all":  # k and v batched too
        ks = jnp.stack([k, k * 0.5 + 0.1])
        vs = jnp.stack([v, -v])
        in_axes = (0, 0, 0) + (None,) * len(rest)
        per = [(qs[i], ks[i], vs[i]) for i in range(2)]
        args = (qs, ks, vs, *rest)
    else:
        in_axes = (0, None, None) + (None,) * len(rest)
        per = [(qs[i], k, v) for i in range(2)]
        args = (qs, k, v, *rest)
    got = jax.vmap(loss, in_axes=in_axes)(*args)
    want = jnp.stack([loss(*p, *rest) for p in per])
    _close(got, want, 1e-5)
    if name in _GRADLESS:
        return
    g = jax.vmap(jax.grad(loss, argnums=(0, 1, 2)), in_axes=in_axes)(*args)
    for i, p in enumerate(per):
        gl = jax.grad(loss, argnums=(0, 1, 2))(*p, *rest)
        for a, b in zip(g, gl):
            _close(a[i], b, 1e-5)


BACKENDS = [
    pytest.param("reference", id="reference"),
    pytest.param("kernel", id="kernel", marks=pytest.mark.gpu),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", [n for n in _OP_NAMES if n not in _GRADLESS])
def test_jit_and_remat_match_eager(name, backend):
    """jit(grad) and grad(remat) equal the eager grad (kernel: 16-bit inputs)."""
    _, make, loss = _op(name, backend)
    dt = jnp.float32 if backend == "reference" else jnp.bfloat16
    qs, k, v, *rest = make(np.random.default_rng(1), 1, dt)
    q = qs[0]
    g_eager = jax.grad(loss, argnums=(0, 1, 2))(q, k, v, *rest)
    g_jit = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v, *rest)
    g_remat = jax.grad(jax.checkpoint(loss), argnums=(0, 1, 2))(q, k, v, *rest)
    for a, b, c in zip(g_eager, g_jit, g_remat):
        assert np.all(np.isfinite(np.asarray(a, np.float32)))
        _close(b, a, 1e-5 if backend == "reference" else 1e-2)
        _close(c, a, 1e-5 if backend == "reference" else 1e-2)


# ----------------------------------------------------------------------------- out/lse gradients


def test_bsa_forward_out_and_lse_gradients_match_finite_differences():
    """block_sparse_attention_forward: gradients of <w, out> + <u, lse> (float64, reference)
    agree with central finite differences; the lse cotangent alone also does."""
    with x64():
        rng = np.random.default_rng(3)
        qs, k, v, w, u, idx, nums = _bsa_inputs(rng, 1, jnp.float64)
        q = qs[0]
        w64, u64 = w.astype(jnp.float64), u.astype(jnp.float64)

        def f(q_, k_, v_):
            o, lse = block_sparse_attention_forward(q_, k_, v_, idx, q2k_block_nums=nums,
                                                    sparse_block_size=BLK, backend="reference")
            return jnp.concatenate([o.reshape(-1), lse.reshape(-1)])

        cot = jnp.concatenate([w64.reshape(-1), u64.reshape(-1)])
        fd_check(f, (q, k, v), cot)
        cot_lse = jnp.concatenate([jnp.zeros(w64.size), u64.reshape(-1)])
        _, (dq, _, _) = fd_check(f, (q, k, v), cot_lse, seed=1)
        assert float(jnp.max(jnp.abs(dq))) > 0  # the lse term really contributes


def test_bsa_backward_dlse_equals_forward_vjp():
    """block_sparse_attention_backward(dlse=u) == jax.vjp of the forward with (w, u)."""
    rng = np.random.default_rng(4)
    qs, k, v, w, u, idx, nums = _bsa_inputs(rng, 1, jnp.float32)
    q = qs[0]
    kw = dict(q2k_block_nums=nums, sparse_block_size=BLK, backend="reference")
    (o, lse), vjp = jax.vjp(lambda *a: tuple(block_sparse_attention_forward(*a, idx, **kw)),
                            q, k, v)
    want = vjp((w, u))
    got = block_sparse_attention_backward(w, q, k, v, o, lse, idx, dlse=u, **kw)
    for a, b in zip(got, want):
        _close(a, b, 1e-5)


def test_hstu_forward_is_differentiable():
    """hstu_attention_forward: grad of <w, o_tensor> matches finite differences (float64)."""
    with x64():
        rng = np.random.default_rng(5)
        qs, k, v, w, cu = _hstu_inputs(rng, 1, jnp.float64)

        def f(q_, k_, v_):
            (o,) = hstu_attention_forward(q_, k_, v_, cu, cu, max_seqlen_q=33, max_seqlen_k=33,
                                          backend="reference")
            return o

        fd_check(f, (qs[0], k, v), w.astype(jnp.float64))


@pytest.mark.gpu
def test_bsa_forward_out_lse_grads_kernel_matches_reference():
    """The kernel backend's gradients of <w, out> + <u, lse> equal the reference's."""
    rng = np.random.default_rng(6)
    qs, k, v, w, u, idx, nums = _bsa_inputs(rng, 1, jnp.bfloat16)
    q = qs[0]

    def loss(backend, q_, k_, v_):
        o, lse = block_sparse_attention_forward(q_, k_, v_, idx, q2k_block_nums=nums,
                                                sparse_block_size=BLK, backend=backend)
        return jnp.sum(o.astype(jnp.float32) * w) + jnp.sum(lse * u)

    gk = jax.jit(jax.grad(functools.partial(loss, "kernel"), argnums=(0, 1, 2)))(q, k, v)
    q32, k32, v32 = (x.astype(jnp.float32) for x in (q, k, v))
    gr = jax.grad(functools.partial(loss, "reference"), argnums=(0, 1, 2))(q32, k32, v32)
    for a, b in zip(gk, gr):
        _close(a, b, 3e-2)
