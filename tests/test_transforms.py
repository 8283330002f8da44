"""JAX transformations of both ops on CPU: vmap (batched and unbatched metadata, nested,
vmap-of-grad, the _forward/_backward entry points), jax.checkpoint, jax.export.

vmap folds the mapped axis into the kernel batch (jax_sparse_attn/_transforms.py) on every
backend, so these reference-backend tests check the folding itself against a Python loop
of unmapped calls. test_lowering_transforms.py checks that the kernel path lowers to one
CuTe DSL call.
"""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import jax_sparse_attn as jsa  # noqa: E402
from jax_sparse_attn import masks  # noqa: E402

N, T, H, D = 3, 40, 2, 16
MAXQ = 23


def _qkv(seed, n=N, t=T, dv=D, dtype=jnp.float32):
    ks = jax.random.split(jax.random.PRNGKey(seed), 3)
    return (jax.random.normal(ks[0], (n, t, H, D), dtype),
            jax.random.normal(ks[1], (n, t, H, D), dtype),
            jax.random.normal(ks[2], (n, t, H, dv), dtype))


# per item: a causal packed batch; item 1 has a zero-length sequence and padding rows
# past cu[-1] (rows 33..39 of item 0, none of item 1, 37 rows of item 2)
CU = jnp.array([[0, 5, 20, 33], [0, 17, 17, 40], [0, 1, 2, 3]], jnp.int32)


def _hstu(q, k, v, cu, func=None, window=(-1, 0)):
    return jsa.hstu_attention(q, k, v, cu, cu, max_seqlen_q=MAXQ, max_seqlen_k=MAXQ,
                              window_size=window, alpha=0.7, func=func, backend="reference")


def _loop(f, in_axes, *args):
    outs = []
    n = next(a.shape[ax] for a, ax in zip(args, in_axes) if ax is not None)
    for i in range(n):
        outs.append(f(*[a if ax is None else jnp.take(a, i, axis=ax)
                        for a, ax in zip(args, in_axes)]))
    return jax.tree.map(lambda *xs: jnp.stack(xs), *outs)


def _close(a, b, tol=1e-5):
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    # zip would stop at the shorter list: a missing (or an extra) output must fail
    assert len(la) == len(lb) and la, (len(la), len(lb))
    for x, y in zip(la, lb):
        assert x.shape == y.shape
        assert np.all(np.isfinite(np.asarray(x)))
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=tol, atol=tol)


@pytest.mark.parametrize("in_axes", [(0, 0, 0, 0), (0, 0, 0, None), (None, 0, None, 0), (0, None, None, 0)],
                         ids=["all", "cu-unbatched", "k-cu-batched", "q-cu-batched"])
def test_hstu_vmap_matches_loop(in_axes):
    q, k, v = _qkv(0)
    cu = CU if in_axes[3] == 0 else CU[0]
    args = [x if ax == 0 else x[0] for x, ax in zip((q, k, v), in_axes)] + [cu]
    f = lambda q, k, v, cu: _hstu(q, k, v, cu)  # noqa: E731
    got = jax.jit(jax.vmap(f, in_axes=in_axes))(*args)
    want = _loop(f, in_axes, *args)
    _close(got, want)
    # rows past each item's cu[-1] are exactly zero
    if in_axes[3] == 0:
        assert float(jnp.max(jnp.abs(got[0, 33:]))) == 0.0
        assert float(jnp.max(jnp.abs(got[2, 3:]))) == 0.0


def test_hstu_vmap_folds_into_one_call():
    """The vmapped jaxpr runs the op once on the stacked tokens (N*T rows), not a loop."""
    q, k, v = _qkv(0)
    jaxpr = jax.make_jaxpr(jax.vmap(_hstu))(q, k, v, CU)
    text = str(jaxpr)
    assert f"{N * T},{H},{D}" in text.replace(" ", "")
    # the folded cu_seqlens: N * (B + 2) + 1 entries
    assert f"i32[{N * (CU.shape[1] + 1) + 1}]" in text.replace(" ", "")


def test_hstu_vmap_func_mask():
    q, k, v = _qkv(1)
    f_one = masks.hstu_target_func(CU[0], T, num_targets=jnp.array([1, 2, 3], jnp.int32))
    func = jnp.stack([f_one, jnp.roll(f_one, 1, axis=-1), f_one])
    f = lambda q, k, v, cu, fn: _hstu(q, k, v, cu, func=fn, window=(-1, -1))  # noqa: E731
    _close(jax.vmap(f)(q, k, v, CU, func), _loop(f, (0,) * 5, q, k, v, CU, func))
    # func unbatched
    g = jax.vmap(f, in_axes=(0, 0, 0, None, None))(q, k, v, CU[0], f_one)
    _close(g, _loop(f, (0, 0, 0, None, None), q, k, v, CU[0], f_one))


def test_hstu_vmap_of_grad_and_grad_of_vmap():
    q, k, v = _qkv(2)
    w = jax.random.normal(jax.random.PRNGKey(9), (N, T, H, D))

    def loss(q, k, v, cu, w):
        return jnp.sum(_hstu(q, k, v, cu) * w)

    g = jax.grad(loss, argnums=(0, 1, 2))
    got = jax.jit(jax.vmap(g))(q, k, v, CU, w)
    _close(got, _loop(g, (0,) * 5, q, k, v, CU, w), 1e-4)
    # grad of a vmapped loss: the batched backward entry runs once
    g2 = jax.grad(lambda q, k, v: jnp.sum(jax.vmap(_hstu)(q, k, v, CU) * w), argnums=(0, 1, 2))
    _close(g2(q, k, v), got, 1e-4)


def test_hstu_vmap_over_no_item():
    """``jax.vmap`` over an axis of size 0 gives empty results of the right shapes and dtypes
    (forward, gradients with rab, paged KV) instead of an IndexError of the fold."""
    q, k, v = (x[:0] for x in _qkv(3, dv=8))
    rab = jnp.zeros((0, CU.shape[1] - 1, 1, MAXQ, MAXQ))

    def f(q, k, v, cu, rb):
        return jsa.hstu_attention(q, k, v, cu, cu, max_seqlen_q=MAXQ, max_seqlen_k=MAXQ,
                                  rab=rb, backend="reference")

    out = jax.vmap(f)(q, k, v, CU[:0], rab)
    assert out.shape == (0, T, H, 8) and out.dtype == q.dtype
    g = jax.vmap(jax.grad(lambda *a: jnp.sum(f(*a)), argnums=(0, 1, 2, 4)),
                 in_axes=(0, 0, 0, None, 0))(q, k, v, CU[0], rab)
    assert [x.shape for x in g] == [q.shape, k.shape, v.shape, rab.shape]
    kv = jnp.zeros((4, 2, 128, H, D), jnp.bfloat16)
    out = jax.vmap(lambda q: jsa.hstu_attention(
        q, None, None, CU[0], CU[0], max_seqlen_q=MAXQ, max_seqlen_k=MAXQ, paged_kv=kv,
        page_ids=jnp.zeros((4,), jnp.int32), page_indptrs=jnp.asarray([0, 1, 2, 3]),
        backend="reference"))(jnp.zeros((0, T, H, D), jnp.bfloat16))
    assert out.shape == (0, T, H, D) and out.dtype == jnp.bfloat16


def test_hstu_vmap_with_rab_matches_loop():
    """rab (per item (B, H_rab, L, L), batched or shared) folds with the sequences: the
    output and the gradients (drab included) equal a loop of unmapped calls, and the folded
    call still runs once."""
    q, k, v = _qkv(4)
    rab = 0.5 * jax.random.normal(jax.random.PRNGKey(5), (N, CU.shape[1] - 1, 1, MAXQ, MAXQ))

    def f(q, k, v, cu, rb):
        return jsa.hstu_attention(q, k, v, cu, cu, max_seqlen_q=MAXQ, max_seqlen_k=MAXQ,
                                  alpha=0.7, rab=rb, backend="reference")

    _close(jax.vmap(f)(q, k, v, CU, rab), _loop(f, (0,) * 5, q, k, v, CU, rab))
    shared = (0, 0, 0, 0, None)
    _close(jax.vmap(f, in_axes=shared)(q, k, v, CU, rab[0]),
           _loop(f, shared, q, k, v, CU, rab[0]))
    text = str(jax.make_jaxpr(jax.vmap(f))(q, k, v, CU, rab)).replace(" ", "")
    assert f"{N * T},{H},{D}" in text and f"{N * (CU.shape[1] + 1)},1,{MAXQ},{MAXQ}" in text

    w = jax.random.normal(jax.random.PRNGKey(6), (N, T, H, D))
    g = jax.grad(lambda q, k, v, cu, rb, w: jnp.sum(f(q, k, v, cu, rb) * w),
                 argnums=(0, 1, 2, 4))
    got = jax.jit(jax.vmap(g))(q, k, v, CU, rab, w)
    want = _loop(g, (0,) * 6, q, k, v, CU, rab, w)
    _close(got, want, 1e-4)
    assert got[3].shape == rab.shape and float(jnp.max(jnp.abs(got[3]))) > 0


def test_hstu_per_shard_cu_seqlens_with_rab():
    """Per-shard cu_seqlens (num_shards, B_local + 1) with rab of num_shards * B_local
    sequences equal one call per shard; a rab of another batch is a ValueError."""
    q, k, v = _qkv(7)
    rab = jax.random.normal(jax.random.PRNGKey(8), (N * (CU.shape[1] - 1), 2, MAXQ, MAXQ))
    flat = lambda x: x.reshape((N * T,) + x.shape[2:])  # noqa: E731
    kw = dict(max_seqlen_q=MAXQ, max_seqlen_k=MAXQ, backend="reference")
    got = jsa.hstu_attention(flat(q), flat(k), flat(v), CU, CU, rab=rab, **kw)
    nb = CU.shape[1] - 1
    want = jnp.concatenate([
        jsa.hstu_attention(q[s], k[s], v[s], CU[s], CU[s], rab=rab[s * nb:(s + 1) * nb], **kw)
        for s in range(N)])
    _close(got, want)
    with pytest.raises(ValueError, match="rab"):
        jsa.hstu_attention(flat(q), flat(k), flat(v), CU, CU, rab=rab[:nb], **kw)


def test_hstu_nested_vmap():
    q, k, v = _qkv(3)
    q2, k2, v2 = (x.reshape((N, 1, T, H, D))[:, [0, 0]] * jnp.array([1.0, 0.5])[None, :, None,
                                                                           None, None]
                  for x in (q, k, v))
    f = jax.vmap(jax.vmap(_hstu, in_axes=(0, 0, 0, None)), in_axes=(0, 0, 0, 0))
    got = f(q2, k2, v2, CU)
    for i in range(N):
        for j in range(2):
            _close(got[i, j], _hstu(q2[i, j], k2[i, j], v2[i, j], CU[i]))


def test_hstu_entry_points_vmap():
    q, k, v = _qkv(4)
    do = jax.random.normal(jax.random.PRNGKey(5), q.shape)
    opts = dict(max_seqlen_q=MAXQ, max_seqlen_k=MAXQ, alpha=0.7, backend="reference")
    fwd = lambda q, k, v, cu: jsa.hstu_attention_forward(q, k, v, cu, cu, **opts)["o_tensor"]  # noqa: E731
    bwd = lambda do, q, k, v, cu: tuple(jsa.hstu_attention_backward(do, q, k, v, cu, cu, **opts))  # noqa: E731
    _close(jax.vmap(fwd)(q, k, v, CU), _loop(fwd, (0,) * 4, q, k, v, CU))
    _close(jax.vmap(bwd)(do, q, k, v, CU), _loop(bwd, (0,) * 5, do, q, k, v, CU), 1e-4)


def _bsa_inputs(seed, n=2, b=2, hq=2, hkv=1, s=128, blk=64, dtype=jnp.float32):
    ks = jax.random.split(jax.random.PRNGKey(seed), 3)
    q = jax.random.normal(ks[0], (n, b, hq, s, 32), dtype)
    k = jax.random.normal(ks[1], (n, b, hkv, s, 32), dtype)
    v = jax.random.normal(ks[2], (n, b, hkv, s, 32), dtype)
    rep = jnp.repeat(k, hq // hkv, axis=2)
    idx, nums = jax.vmap(lambda q, k: masks.topk_block_index(q, k, 2, sparse_block_size=blk))(q, rep)
    return q, k, v, idx, nums


def _bsa(q, k, v, idx, nums):
    return jsa.block_sparse_attention(q, k, v, idx, q2k_block_nums=nums, sparse_block_size=64,
                                      backend="reference")


def test_bsa_vmap_matches_loop():
    q, k, v, idx, nums = _bsa_inputs(0)
    _close(jax.jit(jax.vmap(_bsa))(q, k, v, idx, nums), _loop(_bsa, (0,) * 5, q, k, v, idx, nums))
    # metadata unbatched
    f = jax.vmap(_bsa, in_axes=(0, 0, 0, None, None))
    _close(f(q, k, v, idx[0], nums[0]), _loop(_bsa, (0, 0, 0, None, None), q, k, v, idx[0], nums[0]))


def test_bsa_vmap_grad_nested_and_entry_points():
    q, k, v, idx, nums = _bsa_inputs(1)
    g = jax.grad(lambda q, k, v, i, n: jnp.sum(_bsa(q, k, v, i, n) ** 2), argnums=(0, 1, 2))
    _close(jax.vmap(g)(q, k, v, idx, nums), _loop(g, (0,) * 5, q, k, v, idx, nums), 1e-4)
    # nested: vmap over items of vmap over a split batch axis
    split = lambda x: x.reshape((x.shape[0], 2, 1) + x.shape[2:])  # noqa: E731
    got = jax.vmap(jax.vmap(_bsa))(*map(split, (q, k, v, idx, nums)))
    _close(got.reshape((2, 2) + got.shape[3:]), jax.vmap(_bsa)(q, k, v, idx, nums))
    opts = dict(q2k_block_nums=None, sparse_block_size=64, backend="reference")

    def fwd(q, k, v, i, n):
        o, lse = jsa.block_sparse_attention_forward(q, k, v, i, **{**opts, "q2k_block_nums": n})
        return o, lse

    o, lse = jax.vmap(fwd)(q, k, v, idx, nums)
    _close((o, lse), _loop(fwd, (0,) * 5, q, k, v, idx, nums))

    def bwd(do, q, k, v, o, lse, i, n):
        return tuple(jsa.block_sparse_attention_backward(do, q, k, v, o, lse, i,
                                                         **{**opts, "q2k_block_nums": n}))

    do = jax.random.normal(jax.random.PRNGKey(3), o.shape)
    _close(jax.vmap(bwd)(do, q, k, v, o, lse, idx, nums),
           _loop(bwd, (0,) * 8, do, q, k, v, o, lse, idx, nums), 1e-4)


def test_remat_matches_plain_grad():
    q, k, v = _qkv(6)
    loss = lambda q, k, v: jnp.sum(_hstu(q[0], k[0], v[0], CU[0]) ** 2)  # noqa: E731
    _close(jax.grad(jax.checkpoint(loss), argnums=(0, 1, 2))(q, k, v),
           jax.grad(loss, argnums=(0, 1, 2))(q, k, v), 1e-5)
    bq, bk, bv, idx, nums = _bsa_inputs(7)
    lb = lambda q, k, v: jnp.sum(_bsa(q[0], k[0], v[0], idx[0], nums[0]) ** 2)  # noqa: E731
    _close(jax.grad(jax.checkpoint(lb), argnums=(0, 1, 2))(bq, bk, bv),
           jax.grad(lb, argnums=(0, 1, 2))(bq, bk, bv), 1e-5)


def _dense_hstu(q, k, v, cu, maxq, alpha):
    """Causal HSTU per sequence with plain jnp ops (no custom_vjp)."""
    outs = []
    for b in range(cu.shape[0] - 1):
        s0, s1 = int(cu[b]), int(cu[b + 1])
        s = alpha * jnp.einsum("qhd,khd->hqk", q[s0:s1], k[s0:s1])
        keep = jnp.tril(jnp.ones((s1 - s0, s1 - s0), bool))
        outs.append(jnp.einsum("hqk,khd->qhd", jnp.where(keep, jax.nn.silu(s), 0.0),
                               v[s0:s1]) / maxq)
    return jnp.concatenate(outs)


def _grad_of_grad(f, args, w):
    """Reverse over reverse: the gradient of a function of the first gradients."""
    loss = lambda *a: (jnp.sin(f(*a)) * w).sum()  # noqa: E731
    inner = lambda *a: jax.grad(loss, argnums=(0, 1, 2))(*a)  # noqa: E731
    outer = lambda *a: sum((jnp.cos(g) * w[..., :g.shape[-1]]).sum() for g in inner(*a))  # noqa: E731
    return jax.grad(outer, argnums=(0, 1, 2))(*args)


def test_second_order_differentiation_on_the_reference_backend():
    """A second jax.grad (and jax.hessian) runs through the reference backend's forward and
    backward and equals that of the same attention written with plain jnp ops."""
    q, k, v = (x[0] for x in _qkv(7))
    cu = jnp.array([0, 15, 33], jnp.int32)
    w = jax.random.normal(jax.random.PRNGKey(8), q.shape)
    hstu = lambda q, k, v: jsa.hstu_attention(q, k, v, cu, cu, max_seqlen_q=18,  # noqa: E731
                                              max_seqlen_k=18, alpha=0.5)
    dense = lambda q, k, v: jnp.concatenate(  # noqa: E731
        [_dense_hstu(q, k, v, cu, 18, 0.5), jnp.zeros((T - 33, H, D))])
    _close(_grad_of_grad(hstu, (q, k, v), w), _grad_of_grad(dense, (q, k, v), w), 1e-4)

    qb, kb, vb = (jnp.swapaxes(x[:, :, :1], 1, 2)[..., :8] for x in _qkv(9, n=1, t=128))
    idx = jnp.broadcast_to(jnp.array([1, 0], jnp.int32), (1, 1, 2, 2))
    bsa = lambda q, k, v: jsa.block_sparse_attention(q, k, v, idx, 2, sparse_block_size=64,  # noqa: E731
                                                     softmax_scale=0.3)
    dense_bsa = lambda q, k, v: jnp.einsum(  # noqa: E731
        "bhqk,bhkd->bhqd", jax.nn.softmax(0.3 * jnp.einsum("bhqd,bhkd->bhqk", q, k)), v)
    wb = jax.random.normal(jax.random.PRNGKey(10), qb.shape)
    _close(_grad_of_grad(bsa, (qb, kb, vb), wb), _grad_of_grad(dense_bsa, (qb, kb, vb), wb),
           1e-4)
    hess = jax.hessian(lambda x: bsa(qb.at[0, 0, 3, 1].set(x), kb, vb).sum())(0.5)
    want = jax.hessian(lambda x: dense_bsa(qb.at[0, 0, 3, 1].set(x), kb, vb).sum())(0.5)
    _close(hess, want, 1e-4)


def test_export_round_trip_reference():
    """jax.export of a function calling both ops (forward and grad), serialized and
    deserialized, gives the same results (reference backend on CPU)."""
    from jax import export  # noqa: PLC0415

    q, k, v = _qkv(8)
    bq, bk, bv, idx, nums = _bsa_inputs(9)

    def f(q, k, v, cu, bq, bk, bv, idx, nums):
        def loss(q, k, v, bq):
            return jnp.sum(_hstu(q, k, v, cu) ** 2) + jnp.sum(_bsa(bq, bk, bv, idx, nums) ** 2)

        return loss(q, k, v, bq), jax.grad(loss, argnums=(0, 1, 2, 3))(q, k, v, bq)

    args = (q[0], k[0], v[0], CU[0], bq[0], bk[0], bv[0], idx[0], nums[0])
    exp = export.export(jax.jit(f), disabled_checks=jsa.export_safety_checks())(*args)
    blob = exp.serialize()
    back = export.deserialize(blob)
    _close(back.call(*args), jax.jit(f)(*args), 1e-5)


def test_export_serializes_the_result_types():
    """A function returning the ``*_forward`` / ``*_backward`` result types (named tuples)
    exports, serializes and deserializes; the call gives the same named results."""
    from jax import export  # noqa: PLC0415

    q, k, v = _qkv(11)
    bq, bk, bv, idx, nums = _bsa_inputs(12)
    ml = int(np.max(np.diff(np.asarray(CU[0]))))

    def f(q, k, v, cu, bq, bk, bv, idx, nums):
        ho = jsa.hstu_attention_forward(q, k, v, cu, cu, max_seqlen_q=ml, max_seqlen_k=ml,
                                        backend="reference")
        hb = jsa.hstu_attention_backward(ho.o_tensor, q, k, v, cu, cu, max_seqlen_q=ml,
                                         max_seqlen_k=ml, backend="reference")
        bo = jsa.block_sparse_attention_forward(bq, bk, bv, idx, None, None, nums,
                                                sparse_block_size=64, backend="reference")
        bb = jsa.block_sparse_attention_backward(bo.o_tensor, bq, bk, bv, bo.o_tensor,
                                                 bo.lse_tensor, idx, None, None, nums,
                                                 sparse_block_size=64, backend="reference")
        return ho, hb, bo, bb

    args = (q[0], k[0], v[0], CU[0], bq[0], bk[0], bv[0], idx[0], nums[0])
    exp = export.export(jax.jit(f), disabled_checks=jsa.export_safety_checks())(*args)
    back = export.deserialize(exp.serialize())
    got, want = back.call(*args), jax.jit(f)(*args)
    assert [type(x).__name__ for x in got] == ["HSTUForwardResult", "HSTUBackwardResult",
                                               "BSAForwardResult", "BSABackwardResult"]
    assert np.asarray(got[2]["lse_tensor"]).shape == np.asarray(want[2].lse_tensor).shape
    _close(got, want, 1e-5)


def test_export_symbolic_token_count_reference():
    """A symbolic total token count exports on the reference backend (batch B static)."""
    from jax import export  # noqa: PLC0415

    (t,) = export.symbolic_shape("t")
    q = jax.ShapeDtypeStruct((t, H, D), jnp.float32)
    cu = jax.ShapeDtypeStruct((4,), jnp.int32)
    exp = export.export(jax.jit(lambda q, k, v, cu: _hstu(q, k, v, cu)))(q, q, q, cu)
    qq, kk, vv = _qkv(10)
    for n in (40, 33):
        _close(exp.call(qq[0, :n], kk[0, :n], vv[0, :n], jnp.minimum(CU[0], n)),
               _hstu(qq[0, :n], kk[0, :n], vv[0, :n], jnp.minimum(CU[0], n)))


def test_export_symbolic_token_count_constant_cu_seqlens():
    """cu_seqlens as a constant of the exported function (not an argument) beside a
    symbolic token count: the trace-time check ``cu_seqlens[-1] <= T`` has no value of T
    and is skipped (it raised JAX's InconclusiveDimensionOperation); the other checks of
    the constant still run, and the export matches the jitted call."""
    from jax import export  # noqa: PLC0415

    (t,) = export.symbolic_shape("t")
    q = jax.ShapeDtypeStruct((t, H, D), jnp.float32)
    cu = CU[0]
    f = jax.jit(lambda q, k, v: _hstu(q, k, v, cu))
    exp = export.export(f)(q, q, q)
    qq, kk, vv = _qkv(13)
    for n in (40, 33):
        _close(exp.call(qq[0, :n], kk[0, :n], vv[0, :n]), f(qq[0, :n], kk[0, :n], vv[0, :n]))
    # a constant cu_seqlens that breaks a check needing no T still fails at trace time
    bad = jnp.array([0, 5, 30, 20], jnp.int32)
    with pytest.raises(ValueError, match=r"cu_seqlens_q must be non-decreasing"):
        export.export(jax.jit(lambda q: _hstu(q, q, q, bad)))(q)


def test_export_with_debug_checks_is_refused():
    """debug_checks=True checks traced metadata with a host callback, which jax.export
    cannot serialize. Block-sparse metadata with a symbolic batch: the op raises
    NotImplementedError naming debug_checks (JAX's callback lowering crashed with
    RuntimeError std::bad_cast). HSTU with a symbolic token count (the metadata's shapes
    are static): JAX's own NotImplementedError on the callback; tracing alone
    (jax.eval_shape) still works, and without debug_checks the function exports."""
    from jax import export  # noqa: PLC0415

    (b,) = export.symbolic_shape("b")
    idx = jnp.zeros((1, 1, 2, 1), jnp.int32)
    f = lambda q: jsa.block_sparse_attention(  # noqa: E731
        q, q, q, jnp.broadcast_to(idx, (q.shape[0], 1, 2, 1)), 1, sparse_block_size=64,
        debug_checks=True)
    with pytest.raises(NotImplementedError, match=r"debug_checks=True .* jax\.export cannot "
                                                  r"serialize host callbacks; "
                                                  r"q2k_block_index has the symbolic shape"):
        export.export(jax.jit(f))(jax.ShapeDtypeStruct((b, 1, 128, 8), jnp.float32))

    (t,) = export.symbolic_shape("t")
    args = (jax.ShapeDtypeStruct((t, H, D), jnp.float32), jax.ShapeDtypeStruct((4,), jnp.int32))

    def g(debug):
        return lambda q, cu: jsa.hstu_attention(q, q, q, cu, cu, max_seqlen_q=MAXQ,
                                                max_seqlen_k=MAXQ, debug_checks=debug)

    assert jax.eval_shape(g(True), *args).shape == args[0].shape
    with pytest.raises(NotImplementedError, match=r"host_callback"):
        export.export(jax.jit(g(True)))(*args)
    export.export(jax.jit(g(False)))(*args)


def test_export_constant_cu_seqlens_against_a_constrained_token_count():
    """Where the symbolic token count's constraints decide ``cu_seqlens[-1] <= T``, the
    check still runs at trace time (only an undecidable comparison is skipped)."""
    from jax import export  # noqa: PLC0415

    (t,) = export.symbolic_shape("t", constraints=["t <= 30"])
    q = jax.ShapeDtypeStruct((t, H, D), jnp.float32)
    cu = CU[0]  # a concrete constant (indexed outside the traced function)
    with pytest.raises(ValueError, match=r"cu_seqlens_q\[-1\]=33 exceeds the number of tokens"):
        export.export(jax.jit(lambda q: _hstu(q, q, q, cu)))(q)


def test_export_constant_page_ids_against_a_symbolic_page_count():
    """Paged KV with a symbolic page count and the page table as constants: ids are checked
    against the count where its constraints decide it, else only from below; the export
    matches the jitted call."""
    from jax import export  # noqa: PLC0415

    cu = jnp.asarray([0, 100, 180], jnp.int32)
    ptrs = jnp.asarray([0, 1, 2], jnp.int32)
    q = jax.ShapeDtypeStruct((180, H, D), jnp.float32)

    def f(ids):
        return lambda q, kv: jsa.hstu_attention(q, None, None, cu, cu, max_seqlen_q=100,
                                                max_seqlen_k=100, paged_kv=kv, page_ids=ids,
                                                page_indptrs=ptrs, backend="reference")

    (p,) = export.symbolic_shape("p")
    kv = jax.ShapeDtypeStruct((p, 2, 128, H, D), jnp.float32)
    ids = jnp.asarray([3, 0], jnp.int32)
    exp = export.export(jax.jit(f(ids)))(q, kv)
    qq = jax.random.normal(jax.random.PRNGKey(0), (180, H, D))
    kk = jax.random.normal(jax.random.PRNGKey(1), (4, 2, 128, H, D))
    _close(exp.call(qq, kk), jax.jit(f(ids))(qq, kk))
    with pytest.raises(ValueError, match=r"page_ids\[1\]=-1 is outside"):
        export.export(jax.jit(f(jnp.asarray([3, -1], jnp.int32))))(q, kv)
    (p2,) = export.symbolic_shape("p2", constraints=["p2 <= 3"])
    kv2 = jax.ShapeDtypeStruct((p2, 2, 128, H, D), jnp.float32)
    with pytest.raises(ValueError, match=r"page_ids\[0\]=3 is outside"):
        export.export(jax.jit(f(ids)))(q, kv2)


@pytest.mark.parametrize("op", ["forward", "grad", "backward"])
def test_export_symbolic_number_of_sequences_names_the_argument(op):
    """The number of HSTU sequences is static (docs/design.md, jax.export): a symbolic
    cu_seqlens length raised JAX's InconclusiveDimensionOperation from inside the
    reference. It must be a ValueError naming the argument and what to do instead."""
    from jax import export  # noqa: PLC0415

    (b1,) = export.symbolic_shape("b1")
    cu = jax.ShapeDtypeStruct((b1,), jnp.int32)
    q = jax.ShapeDtypeStruct((40, H, D), jnp.float32)
    opts = dict(max_seqlen_q=16, max_seqlen_k=16)
    if op == "forward":
        f = lambda q, cu: jsa.hstu_attention(q, q, q, cu, cu, **opts)  # noqa: E731
    elif op == "grad":
        f = jax.grad(lambda q, cu: jsa.hstu_attention(q, q, q, cu, cu, **opts).sum())
    else:
        f = lambda q, cu: jsa.hstu_attention_backward(q, q, q, q, cu, cu, **opts)  # noqa: E731
    with pytest.raises(ValueError, match=r"cu_seqlens_q must have a static length B\+1.*"
                                         r"symbolic b1"):
        export.export(jax.jit(f))(q, cu)


@pytest.mark.parametrize("opts", [{}, {"kv_splits": "auto"}, {"causal": True, "kv_splits": 3},
                                  {"pack_gqa": True}])
def test_export_bsa_symbolic_batch_reference(opts):
    """A symbolic batch B exports on the reference backend, forward and backward
    (kv_splits="auto" then runs one split: the rows are not known at trace time)."""
    from jax import export  # noqa: PLC0415

    (b,) = export.symbolic_shape("b")
    rows = (b, 1, 4, 2) if opts.get("pack_gqa") else (b, 2, 2, 2)
    f = jax.jit(jax.value_and_grad(lambda q, k, i: jsa.block_sparse_attention(
        q, k, k, i, 2, sparse_block_size=64, **opts).sum()))
    exp = export.export(f)(jax.ShapeDtypeStruct((b, 2, 128, 8), jnp.float32),
                           jax.ShapeDtypeStruct((b, 1, 128, 8), jnp.float32),
                           jax.ShapeDtypeStruct(rows, jnp.int32))
    for n in (1, 3):
        q, k = (jax.random.normal(jax.random.PRNGKey(s), (n, h, 128, 8)) for s, h in ((n, 2), (9, 1)))
        idx = jnp.zeros((n,) + rows[1:], jnp.int32).at[..., 1].set(1)
        _close(exp.call(q, k, idx), f(q, k, idx), 1e-5)


def test_export_safety_checks_name_the_cute_targets():
    checks = jsa.export_safety_checks()
    assert isinstance(checks, tuple)
    try:
        import cutlass.jax  # noqa: F401, PLC0415
    except Exception:  # pragma: no cover
        assert checks == ()
        return
    names = " ".join(map(str, checks))
    assert "CuteDSLRT_NvJaxCutlassCall" in names, names
