"""HSTU reference path vs the independent float64 loop oracle, gradients, jit/vmap/grad."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import jax_sparse_attn as jsa
from jax_sparse_attn import reference
from attention_base import HSTUReferenceGrid
from attention_base import generate as pytest_generate_tests  # noqa: F401
from oracle import fd_check, hstu_oracle, x64


def make_case(lengths_q, lengths_k=None, *, H=2, D=8, D_v=None, seed=0, dtype=np.float64):
    rng = np.random.default_rng(seed)
    lengths_k = lengths_q if lengths_k is None else lengths_k
    D_v = D if D_v is None else D_v
    cu_q = np.concatenate([[0], np.cumsum(lengths_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lengths_k)]).astype(np.int32)
    T_q, T_k = int(cu_q[-1]), int(cu_k[-1])
    q = rng.standard_normal((T_q, H, D)).astype(dtype)
    k = rng.standard_normal((T_k, H, D)).astype(dtype)
    v = rng.standard_normal((T_k, H, D_v)).astype(dtype)
    return q, k, v, cu_q, cu_k, max(lengths_q, default=0), max(lengths_k, default=0)


def random_func(rng, T_q, n, max_k, overlapping=True):
    """Random interval endpoints (1, n, T_q + 256), unordered and overlapping intervals."""
    f = rng.integers(0, max_k + 1, size=(1, n, T_q + 256)).astype(np.int32)
    if overlapping and n >= 5:
        # make [F3, F4) overlap [F1, F2) and put it before it
        f[0, 3] = np.maximum(f[0, 1] - 2, 0)
        f[0, 4] = np.minimum(f[0, 1] + 3, max_k)
    return f


def run_ref(q, k, v, cu_q, cu_k, mq, mk, **kw):
    with x64():
        return np.asarray(jsa.hstu_attention(
            jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), jnp.asarray(cu_q), jnp.asarray(cu_k),
            max_seqlen_q=mq, max_seqlen_k=mk, backend="reference", **kw))


WINDOWS = [(-1, -1), (-1, 0), (0, 0), (3, 2), (5, -1), (-1, 4), (2, 0)]


@pytest.mark.parametrize("window_size", WINDOWS)
@pytest.mark.parametrize("lengths", [[5, 0, 17, 1], [13]])
def test_hstu_windows_match_oracle(window_size, lengths):
    q, k, v, cu_q, cu_k, mq, mk = make_case(lengths, seed=len(lengths))
    out = run_ref(q, k, v, cu_q, cu_k, mq, mk, window_size=window_size, alpha=0.7)
    want = hstu_oracle(q, k, v, cu_q, cu_k, max_seqlen_q=mq, window_size=window_size, alpha=0.7)
    np.testing.assert_allclose(out, want, rtol=1e-10, atol=1e-12)
    assert np.abs(want).max() > 0


@pytest.mark.parametrize("window_size", [(-1, 0), (-1, -1), (4, 1)])
def test_hstu_bottom_right_lq_lt_lk(window_size):
    # L_q < L_k per sequence (and one L_q > L_k): queries sit at the end of the keys
    q, k, v, cu_q, cu_k, mq, mk = make_case([3, 1, 0, 6], [9, 4, 5, 2], seed=3, D_v=5)
    out = run_ref(q, k, v, cu_q, cu_k, mq, mk, window_size=window_size)
    want = hstu_oracle(q, k, v, cu_q, cu_k, max_seqlen_q=mq, window_size=window_size)
    np.testing.assert_allclose(out, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("n_endpoints", [1, 3, 5, 7])
def test_hstu_func_matches_oracle(n_endpoints):
    q, k, v, cu_q, cu_k, mq, mk = make_case([7, 0, 12, 3], seed=n_endpoints)
    func = random_func(np.random.default_rng(n_endpoints), q.shape[0], n_endpoints, mk)
    out = run_ref(q, k, v, cu_q, cu_k, mq, mk, window_size=(-1, -1), func=func)
    want = hstu_oracle(q, k, v, cu_q, cu_k, max_seqlen_q=mq, window_size=(-1, -1), func=func)
    np.testing.assert_allclose(out, want, rtol=1e-10, atol=1e-12)
    # the func must actually mask something relative to the full mask
    full = hstu_oracle(q, k, v, cu_q, cu_k, max_seqlen_q=mq, window_size=(-1, -1))
    assert np.abs(full - want).max() > 1e-3


def test_hstu_long_and_odd_lengths():
    q, k, v, cu_q, cu_k, mq, mk = make_case([1, 113, 0, 1023, 17], H=1, D=4, seed=11)
    out = run_ref(q, k, v, cu_q, cu_k, mq, mk, window_size=(-1, 0), alpha=0.5)
    want = hstu_oracle(q, k, v, cu_q, cu_k, max_seqlen_q=mq, window_size=(-1, 0), alpha=0.5)
    np.testing.assert_allclose(out, want, rtol=1e-9, atol=1e-12)


def test_hstu_scaling_seqlen_scales_exactly():
    q, k, v, cu_q, cu_k, mq, mk = make_case([4, 9], seed=5)
    a = run_ref(q, k, v, cu_q, cu_k, mq, mk)  # default scaling = max_seqlen_q = 9
    b = run_ref(q, k, v, cu_q, cu_k, mq, mk, scaling_seqlen=3.0)
    np.testing.assert_allclose(b, a * 3.0, rtol=1e-13)
    want = hstu_oracle(q, k, v, cu_q, cu_k, max_seqlen_q=mq, scaling_seqlen=3.0)
    np.testing.assert_allclose(b, want, rtol=1e-10, atol=1e-12)


def test_hstu_max_seqlen_larger_than_needed():
    q, k, v, cu_q, cu_k, mq, mk = make_case([4, 9], seed=6)
    a = run_ref(q, k, v, cu_q, cu_k, mq, mk, scaling_seqlen=9.0)
    b = run_ref(q, k, v, cu_q, cu_k, 40, 300, scaling_seqlen=9.0)
    np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


def test_hstu_zero_tokens_and_zero_length():
    q, k, v, cu_q, cu_k, mq, mk = make_case([0, 0], seed=0)
    assert q.shape[0] == 0
    out = run_ref(q, k, v, cu_q, cu_k, mq, mk)
    assert out.shape == (0, 2, 8)
    # T_q = 0 with keys present, and its gradients
    q0 = np.zeros((0, 2, 8))
    _, k1, v1, _, cu_k1, _, mk1 = make_case([3, 4], seed=1)
    cu_q0 = np.zeros(3, np.int32)
    out = run_ref(q0, k1, v1, cu_q0, cu_k1, 0, mk1)
    assert out.shape == (0, 2, 8)
    with x64():
        g = jax.grad(lambda k_: jsa.hstu_attention(
            jnp.asarray(q0), k_, jnp.asarray(v1), jnp.asarray(cu_q0), jnp.asarray(cu_k1),
            max_seqlen_q=0, max_seqlen_k=mk1, backend="reference").sum())(jnp.asarray(k1))
    assert g.shape == k1.shape and not np.any(np.asarray(g))


def test_hstu_tail_rows_outside_sequences_are_zero():
    q, k, v, cu_q, cu_k, mq, mk = make_case([4, 5], seed=2)
    q = np.concatenate([q, np.ones((3,) + q.shape[1:])])  # 3 rows past cu_q[-1]
    out = run_ref(q, k, v, cu_q, cu_k, mq, mk)
    assert np.all(out[9:] == 0)
    np.testing.assert_allclose(out[:9], hstu_oracle(q[:9], k, v, cu_q, cu_k, max_seqlen_q=mq),
                               rtol=1e-10, atol=1e-12)


def test_hstu_paged_kv_matches_oracle():
    rng = np.random.default_rng(7)
    H, D, P = 2, 8, 128
    lengths_q, lengths_k = [3, 0, 5], [130, 0, 200]
    cu_q = np.concatenate([[0], np.cumsum(lengths_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lengths_k)]).astype(np.int32)
    n_pages = 6
    paged_kv = rng.standard_normal((n_pages, 2, P, H, D))
    page_ids = np.array([4, 1, 0, 5, 9], np.int32)  # seq 0: pages 4, 1; seq 2: 0, 5; 9 unused
    page_indptrs = np.array([0, 2, 2, 4], np.int32)
    q = rng.standard_normal((int(cu_q[-1]), H, D))
    with x64():
        out = np.asarray(jsa.hstu_attention(
            jnp.asarray(q), None, None, jnp.asarray(cu_q), jnp.asarray(cu_k), max_seqlen_q=5,
            max_seqlen_k=200, paged_kv=jnp.asarray(paged_kv), page_ids=jnp.asarray(page_ids),
            page_indptrs=jnp.asarray(page_indptrs), backend="reference"))
    want = hstu_oracle(q, None, None, cu_q, cu_k, max_seqlen_q=5, paged_kv=paged_kv,
                       page_ids=page_ids, page_indptrs=page_indptrs)
    np.testing.assert_allclose(out, want, rtol=1e-10, atol=1e-12)
    # equals the packed-KV call on the gathered keys
    ks, vs = [], []
    for b in range(3):
        for j in range(lengths_k[b]):
            pg = page_ids[page_indptrs[b] + j // P]
            ks.append(paged_kv[pg, 0, j % P])
            vs.append(paged_kv[pg, 1, j % P])
    packed = run_ref(q, np.stack(ks), np.stack(vs), cu_q, cu_k, 5, 200)
    np.testing.assert_allclose(out, packed, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_hstu_low_precision_inputs(dtype):
    q, k, v, cu_q, cu_k, mq, mk = make_case([6, 17, 2], D=16, seed=9, dtype=np.float32)
    qd, kd, vd = (jnp.asarray(x, dtype) for x in (q, k, v))
    out = jsa.hstu_attention(qd, kd, vd, jnp.asarray(cu_q), jnp.asarray(cu_k), max_seqlen_q=mq,
                             max_seqlen_k=mk, alpha=0.25, backend="reference")
    assert out.dtype == jnp.dtype(dtype)
    want = hstu_oracle(np.asarray(qd, np.float64), np.asarray(kd, np.float64),
                       np.asarray(vd, np.float64), cu_q, cu_k, max_seqlen_q=mq, alpha=0.25)
    err = np.abs(np.asarray(out, np.float64) - want).max()
    assert err <= 1e-2 * np.abs(want).max() + 1e-3
    # same computation in the input dtype: a different (noisier) but close result
    low = reference.hstu_attention_ref(qd, kd, vd, jnp.asarray(cu_q), jnp.asarray(cu_k),
                                       max_seqlen_q=mq, max_seqlen_k=mk, alpha=0.25,
                                       compute_dtype=dtype)
    err_low = np.abs(np.asarray(low, np.float64) - want).max()
    assert low.dtype == jnp.dtype(dtype)
    assert err_low <= 5e-2 * np.abs(want).max() + 1e-2
    assert err_low >= err  # the fp32-internal reference is at least as accurate


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lengths=st.lists(st.integers(0, 12), min_size=1, max_size=4),
    extra_k=st.lists(st.integers(0, 5), min_size=4, max_size=4),
    left=st.integers(-1, 6),
    right=st.integers(-1, 6),
    use_func=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_hstu_random_cases(lengths, extra_k, left, right, use_func, seed):
    lengths_k = [n + e for n, e in zip(lengths, extra_k)]
    q, k, v, cu_q, cu_k, mq, mk = make_case(lengths, lengths_k, H=1, D=4, D_v=3, seed=seed)
    kw = dict(window_size=(left, right), alpha=1.3)
    if use_func:
        rng = np.random.default_rng(seed)
        kw = dict(window_size=(-1, -1), func=random_func(rng, q.shape[0], 3, max(mk, 1)))
    out = run_ref(q, k, v, cu_q, cu_k, mq, mk, **kw)
    want = hstu_oracle(q, k, v, cu_q, cu_k, max_seqlen_q=mq, **kw)
    np.testing.assert_allclose(out, want, rtol=1e-10, atol=1e-12)


# ------------------------------------------------------------------ gradients


@pytest.mark.parametrize("case", ["causal", "local", "func", "lq_lt_lk"])
def test_hstu_grad_matches_finite_differences(case):
    lengths_k = [6, 0, 9, 2] if case == "lq_lt_lk" else None
    q, k, v, cu_q, cu_k, mq, mk = make_case([4, 0, 9, 2], lengths_k, H=2, D=5, D_v=3, seed=13)
    kw = {"causal": dict(window_size=(-1, 0)), "local": dict(window_size=(2, 1)),
          "lq_lt_lk": dict(window_size=(-1, 0))}.get(case)
    if case == "func":
        kw = dict(window_size=(-1, -1), func=random_func(np.random.default_rng(1), q.shape[0], 5, mk))
    with x64():
        cu_qj, cu_kj = jnp.asarray(cu_q), jnp.asarray(cu_k)

        def f(q_, k_, v_):
            return jsa.hstu_attention(q_, k_, v_, cu_qj, cu_kj, max_seqlen_q=mq, max_seqlen_k=mk,
                                      alpha=0.8, backend="reference", **kw)

        args = tuple(jnp.asarray(x) for x in (q, k, v))
        cot = jnp.asarray(np.random.default_rng(2).standard_normal((q.shape[0], 2, 3)))
        _, grads = fd_check(f, args, cot)
        # the explicit backward API agrees with jax.vjp
        res = jsa.hstu_attention_backward(cot, *args, cu_qj, cu_kj, max_seqlen_q=mq,
                                          max_seqlen_k=mk, alpha=0.8, backend="reference", **kw)
        dq, dk, dv = res
        for a, b in zip((dq, dk, dv), grads):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-10, atol=1e-12)
        assert np.abs(np.asarray(res["dk_tensor"])).max() > 0


def test_hstu_grad_zero_for_empty_and_masked_rows():
    q, k, v, cu_q, cu_k, mq, mk = make_case([3, 0, 4], H=1, D=4, seed=4)
    k = np.concatenate([k, np.ones((2, 1, 4))])  # two keys outside every sequence
    v = np.concatenate([v, np.ones((2, 1, 4))])
    with x64():
        g = jax.grad(lambda k_, v_: jnp.sum(jsa.hstu_attention(
            jnp.asarray(q), k_, v_, jnp.asarray(cu_q), jnp.asarray(cu_k), max_seqlen_q=mq,
            max_seqlen_k=mk, backend="reference") ** 2), argnums=(0, 1))(jnp.asarray(k), jnp.asarray(v))
    assert np.all(np.asarray(g[0])[-2:] == 0) and np.all(np.asarray(g[1])[-2:] == 0)
    assert np.abs(np.asarray(g[0])[:-2]).max() > 0


# ------------------------------------------------------------------ jit / vmap / grad


def test_hstu_jit_vmap_grad():
    q, k, v, cu_q, cu_k, mq, mk = make_case([5, 3, 8], H=2, D=4, seed=21, dtype=np.float32)
    cu = jnp.asarray(cu_q)

    def f(q_, k_, v_, cu_):
        return jsa.hstu_attention(q_, k_, v_, cu_, cu_, max_seqlen_q=mq, max_seqlen_k=mk,
                                  window_size=(3, 0), backend="reference")

    eager = f(q, k, v, cu)
    jitted = jax.jit(f)(q, k, v, cu)  # cu_seqlens traced under jit
    np.testing.assert_allclose(np.asarray(jitted), np.asarray(eager), rtol=1e-6, atol=1e-7)
    # vmap over a leading batch of independent problems (second one scaled)
    qs = jnp.stack([q, 2 * q])
    vm = jax.vmap(f, in_axes=(0, None, None, None))(qs, k, v, cu)
    np.testing.assert_allclose(np.asarray(vm[0]), np.asarray(eager), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(np.asarray(vm[1]), np.asarray(f(2 * q, k, v, cu)), rtol=1e-6, atol=1e-7)
    # vmap over cu_seqlens too
    cus = jnp.stack([cu, jnp.asarray([0, 8, 8, 16], jnp.int32)])
    vm2 = jax.vmap(f, in_axes=(None, None, None, 0))(q, k, v, cus)
    np.testing.assert_allclose(np.asarray(vm2[1]), np.asarray(f(q, k, v, cus[1])), rtol=1e-6, atol=1e-7)
    # grad under jit equals eager grad
    loss = lambda q_: jnp.sum(f(q_, k, v, cu) ** 2)  # noqa: E731
    np.testing.assert_allclose(np.asarray(jax.jit(jax.grad(loss))(q)),
                               np.asarray(jax.grad(loss)(q)), rtol=1e-5, atol=1e-7)
    # vmap of grad
    vg = jax.vmap(jax.grad(loss))(qs)
    np.testing.assert_allclose(np.asarray(vg[0]), np.asarray(jax.grad(loss)(q)), rtol=1e-5, atol=1e-7)


def test_hstu_tiling_does_not_change_results():
    q, k, v, cu_q, cu_k, mq, mk = make_case([40, 3, 29], H=2, D=4, seed=8)
    with x64():
        args = [jnp.asarray(x) for x in (q, k, v, cu_q, cu_k)]
        a = reference.hstu_attention_ref(*args, max_seqlen_q=mq, max_seqlen_k=mk, q_tile=7)
        b = reference.hstu_attention_ref(*args, max_seqlen_q=mq, max_seqlen_k=mk, q_tile=128)
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(np.asarray(a), hstu_oracle(q, k, v, cu_q, cu_k, max_seqlen_q=mq),
                               rtol=1e-10, atol=1e-12)


def test_hstu_chunked_evaluation_matches(monkeypatch):
    """Small lax.map chunks (with a remainder) give the same forward and gradients."""
    q, k, v, cu_q, cu_k, mq, mk = make_case([40, 3, 29], H=2, D=4, seed=12)
    cot = np.random.default_rng(1).standard_normal(q.shape[:2] + v.shape[2:])
    kw = dict(max_seqlen_q=mq, max_seqlen_k=mk, window_size=(5, 0))
    with x64():
        args = [jnp.asarray(x) for x in (q, k, v, cu_q, cu_k)]
        a = reference.hstu_attention_ref(*args, **kw)
        ga = reference.hstu_attention_bwd_ref(jnp.asarray(cot), *args, **kw)
        # forward (q_tile 16): 8 items (6 used) of 2 x 16 x 40 scores, 5 per chunk
        assert reference.hstu_ref_tiles(3, 72, 72, mq, mk, 16) == (16, 40, 8)
        monkeypatch.setattr(reference, "_CHUNK_ELEMS_CPU", 5 * 2 * 16 * 40)
        monkeypatch.setattr(reference, "_CHUNK_ELEMS_ACCEL", 5 * 2 * 16 * 40)
        b = reference._hstu_attention_ref_impl(*args, q_tile=16, **kw)
        # backward (default tiles of 32 rows): 6 items of 2 x 32 x 40 scores, 4 per chunk
        assert reference.hstu_ref_tiles(3, 72, 72, mq, mk) == (32, 40, 6)
        monkeypatch.setattr(reference, "_CHUNK_ELEMS_CPU", 4 * 2 * 32 * 40)
        monkeypatch.setattr(reference, "_CHUNK_ELEMS_ACCEL", 4 * 2 * 32 * 40)
        gb = reference._hstu_attention_bwd_ref_impl(jnp.asarray(cot), *args, **kw)
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-13, atol=1e-15)
    for x, y in zip(gb, ga):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("q_tile", [1, 5, 16, 128])
@pytest.mark.parametrize("window_size", [(-1, 0), (-1, -1), (3, 2)])
def test_hstu_loose_bounds_follow_real_lengths(q_tile, window_size):
    """Bounds far looser than the lengths (and many zero-length sequences): the reference
    evaluates only the query tiles the lengths need, against min(max_seqlen_k, T_k) key
    slots, and gives the oracle's output and the tight bounds' gradients."""
    lengths_q, lengths_k = [0, 1, 0, 37, 2, 0, 0, 17, 0, 33], [3, 1, 0, 37, 9, 0, 4, 20, 0, 33]
    q, k, v, cu_q, cu_k, mq, mk = make_case(lengths_q, lengths_k, H=2, D=4, seed=q_tile)
    cot = np.random.default_rng(2).standard_normal(q.shape)
    kw = dict(window_size=window_size, alpha=0.8, scaling_seqlen=11.0)
    tile, n_keys, n_items = reference.hstu_ref_tiles(len(lengths_q), q.shape[0], k.shape[0],
                                                     5000, 70000, q_tile)
    # 90 rows over 10 sequences: 9 per sequence, tiles of at most 16 rows
    assert (tile, n_keys) == (min(q_tile, 16), k.shape[0])
    assert n_items == -(-q.shape[0] // tile) + len(lengths_q)
    assert sum(-(-n // tile) for n in lengths_q) <= n_items
    with x64():
        args = [jnp.asarray(x) for x in (q, k, v, cu_q, cu_k)]
        loose = reference.hstu_attention_ref(*args, max_seqlen_q=5000, max_seqlen_k=70000,
                                             q_tile=q_tile, **kw)
        g_loose = reference.hstu_attention_bwd_ref(jnp.asarray(cot), *args, max_seqlen_q=5000,
                                                   max_seqlen_k=70000, **kw)
        g_tight = reference.hstu_attention_bwd_ref(jnp.asarray(cot), *args, max_seqlen_q=mq,
                                                   max_seqlen_k=mk, **kw)
    want = hstu_oracle(q, k, v, cu_q, cu_k, max_seqlen_q=mq, **kw)
    np.testing.assert_allclose(np.asarray(loose), want, rtol=1e-10, atol=1e-12)
    assert np.abs(want).max() > 0
    for a, b in zip(g_loose, g_tight):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-10, atol=1e-12)
        assert np.abs(np.asarray(b)).max() > 0


def test_hstu_reference_tiles_bounds():
    """The reference's static tiling: tiny sequences under huge bounds cost a few short
    tiles against T_k keys; tight bounds keep one tile column per sequence; many short
    sequences get short tiles and only as many items as can be non-empty; a paged cache
    (no T_k) keeps max_seqlen_k keys; symbolic sizes keep the bound-only tiling."""
    assert reference.hstu_ref_tiles(2, 7, 9, 300000, 300000) == (16, 9, 3)
    assert reference.hstu_ref_tiles(128, 128 * 150, 128 * 150, 200, 200) == (128, 200, 256)
    assert reference.hstu_ref_tiles(4, 1000, None, 300, 512) == (128, 512, 12)
    # 5000 sequences of one token and one of 1000: 16-row tiles, 375 + 5001 items
    assert reference.hstu_ref_tiles(5001, 6000, 6000, 1000, 1000) == (16, 1000, 5376)
    # 4096 sequences (most empty) packing 512 tokens: at most 512 can be non-empty
    assert reference.hstu_ref_tiles(4096, 512, 512, 64, 64) == (16, 64, 544)
    assert reference.hstu_ref_tiles(3, 0, 0, 8, 8) == (8, 1, 0)
    b = jax.export.symbolic_shape("b")[0]
    assert reference.hstu_ref_tiles(b, 100, 100, 300, 512)[1:] == (100, b * 3)


@pytest.mark.parametrize("window_size", [(-1, 0), (-1, -1)])
def test_hstu_many_short_sequences_and_one_long(window_size):
    """Short tiles (200 one-token sequences and empty ones beside one of 300 tokens: tiles
    of 16 rows, the long sequence spread over 19 of them) give the oracle's output."""
    lengths = [1] * 100 + [0] * 20 + [300] + [1] * 100 + [0, 2]
    q, k, v, cu_q, cu_k, mq, mk = make_case(lengths, H=1, D=4, seed=31)
    assert reference.hstu_ref_tiles(len(lengths), q.shape[0], k.shape[0], mq, mk)[0] == 16
    out = run_ref(q, k, v, cu_q, cu_k, mq, mk, window_size=window_size, alpha=0.6)
    want = hstu_oracle(q, k, v, cu_q, cu_k, max_seqlen_q=mq, window_size=window_size, alpha=0.6)
    np.testing.assert_allclose(out, want, rtol=1e-10, atol=1e-12)
    assert np.abs(want[:100]).max() > 0


def test_hstu_two_tiny_sequences_under_huge_bounds():
    """Two sequences of a few tokens with bounds of 300000 (a loose bound a notebook might
    pass): the public reference path (jit, forward and gradient) gives the tight bounds'
    results without padding to the bounds."""
    q, k, v, cu_q, cu_k, mq, mk = make_case([3, 4], [5, 2], H=2, D=8, seed=4, dtype=np.float32)
    args = [jnp.asarray(x) for x in (q, k, v, cu_q, cu_k)]

    def run(m):
        def loss(q_, k_, v_):
            o = jsa.hstu_attention(q_, k_, v_, args[3], args[4], max_seqlen_q=m, max_seqlen_k=m,
                                   scaling_seqlen=4.0, backend="reference")
            return jnp.sum(o * o), o
        (_, o), g = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(*args[:3])
        return o, g

    o_big, g_big = run(300000)
    o_small, g_small = run(max(mq, mk))
    np.testing.assert_allclose(np.asarray(o_big), np.asarray(o_small), rtol=1e-6, atol=1e-7)
    for a, b in zip(g_big, g_small):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(
        np.asarray(o_small), hstu_oracle(q, k, v, cu_q, cu_k, max_seqlen_q=mq, scaling_seqlen=4.0),
        rtol=1e-5, atol=1e-6)


class TestHSTUGrid(HSTUReferenceGrid):
    """The shared grid (tests/attention_base.py) on the reference backend vs the float64
    oracle."""


# ------------------------------------------------------------------ relative attention bias

RAB_MASKS = {
    "full": dict(window_size=(-1, -1)),
    "causal": dict(window_size=(-1, 0)),
    "local": dict(window_size=(2, 1)),
    "left_only": dict(window_size=(3, -1)),
    "func": "func",
}


def _rab_case(h_rab, mask, seed, lengths_q=(4, 0, 7, 1, 3), lengths_k=(6, 0, 7, 2, 3)):
    q, k, v, cu_q, cu_k, mq, mk = make_case(list(lengths_q), list(lengths_k), H=2, D=5, D_v=3,
                                            seed=seed)
    rng = np.random.default_rng(seed + 100)
    rab = rng.standard_normal((len(lengths_q), h_rab, mk, mk))
    kw = RAB_MASKS[mask]
    if kw == "func":
        kw = dict(window_size=(-1, -1), func=random_func(rng, q.shape[0], 5, mk))
    return q, k, v, cu_q, cu_k, mq, mk, rab, kw


@pytest.mark.parametrize("h_rab", [1, 2])
@pytest.mark.parametrize("mask", list(RAB_MASKS))
def test_hstu_rab_matches_oracle(h_rab, mask):
    q, k, v, cu_q, cu_k, mq, mk, rab, kw = _rab_case(h_rab, mask, seed=21)
    out = run_ref(q, k, v, cu_q, cu_k, mq, mk, alpha=0.6, rab=rab, **kw)  # float64 under x64
    want = hstu_oracle(q, k, v, cu_q, cu_k, max_seqlen_q=mq, alpha=0.6, rab=rab, **kw)
    np.testing.assert_allclose(out, want, rtol=1e-10, atol=1e-12)
    base = hstu_oracle(q, k, v, cu_q, cu_k, max_seqlen_q=mq, alpha=0.6, **kw)
    assert np.abs(want - base).max() > 1e-3  # the bias matters in this case


@pytest.mark.parametrize("h_rab", [1, 2])
@pytest.mark.parametrize("mask", ["causal", "local", "func"])
def test_hstu_rab_grad_matches_finite_differences(h_rab, mask):
    q, k, v, cu_q, cu_k, mq, mk, rab, kw = _rab_case(h_rab, mask, seed=31)
    with x64():
        cu_qj, cu_kj = jnp.asarray(cu_q), jnp.asarray(cu_k)

        def f(q_, k_, v_, r_):
            return jsa.hstu_attention(q_, k_, v_, cu_qj, cu_kj, max_seqlen_q=mq,
                                      max_seqlen_k=mk, alpha=0.8, scaling_seqlen=3.0,
                                      backend="reference", rab=r_, **kw)

        args = tuple(jnp.asarray(x) for x in (q, k, v, rab))
        cot = jnp.asarray(np.random.default_rng(3).standard_normal((q.shape[0], 2, 3)))
        _, grads = fd_check(f, args, cot)
        res = jsa.hstu_attention_backward(cot, *args[:3], cu_qj, cu_kj, max_seqlen_q=mq,
                                          max_seqlen_k=mk, alpha=0.8, scaling_seqlen=3.0,
                                          backend="reference", rab=args[3], **kw)
        assert isinstance(res, jsa.HSTUBackwardRabResult)
        for a, b in zip(res, grads):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-10, atol=1e-12)
        drab = np.asarray(res["drab_tensor"])
    assert drab.shape == rab.shape and np.abs(drab).max() > 0
    # zero outside each sequence's rows p in [L_k - L_q, L_k) and keys j < L_k
    lq, lk = np.diff(cu_q), np.diff(cu_k)
    for b in range(len(lq)):
        inside = np.zeros((mk, mk), bool)
        inside[lk[b] - lq[b]:lk[b], :lk[b]] = True
        assert not np.any(drab[b][:, ~inside])


def test_hstu_rab_float32_with_low_precision_q_and_jit():
    """rab may be float32 while q is bfloat16; its gradient comes back in float32; under
    jit with L_q > L_k (not checked there) rows with p < 0 get bias 0."""
    q, k, v, cu_q, cu_k, mq, mk = make_case([3, 1], [5, 1], H=2, D=4, seed=5)
    rab = np.random.default_rng(6).standard_normal((2, 1, mk, mk)).astype(np.float32)
    qb, kb, vb = (jnp.asarray(x, jnp.bfloat16) for x in (q, k, v))
    g = jax.grad(lambda r: jnp.sum(jsa.hstu_attention(
        qb, kb, vb, jnp.asarray(cu_q), jnp.asarray(cu_k), max_seqlen_q=mq, max_seqlen_k=mk,
        backend="reference", rab=r).astype(jnp.float32)))(jnp.asarray(rab))
    assert g.dtype == jnp.float32 and g.shape == rab.shape

    @jax.jit
    def f(cq, ck):
        return jsa.hstu_attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), cq, ck,
                                  max_seqlen_q=mq, max_seqlen_k=mk, backend="reference",
                                  window_size=(-1, -1), rab=jnp.asarray(rab))

    cq = np.array([0, 3, 4], np.int32)
    ck = np.array([0, 1, 2], np.int32)  # sequence 0: L_q = 3 > L_k = 1
    out = np.asarray(f(jnp.asarray(cq), jnp.asarray(ck)))
    want = hstu_oracle(q, k[:2], v[:2], cq, ck, max_seqlen_q=mq, window_size=(-1, -1),
                       rab=rab)  # the oracle gives rows with p < 0 no bias
    np.testing.assert_allclose(out, want, rtol=2e-5, atol=2e-6)


def test_hstu_rab_validation_errors():
    q, k, v, cu_q, cu_k, mq, mk = make_case([3, 2], [4, 2], H=2, D=4, seed=7)
    args = tuple(jnp.asarray(x, jnp.float32) for x in (q, k, v)) + (jnp.asarray(cu_q), jnp.asarray(cu_k))
    kw = dict(max_seqlen_q=mq, max_seqlen_k=mk, backend="reference")
    with pytest.raises(ValueError, match="rab must have shape"):
        jsa.hstu_attention(*args, rab=jnp.zeros((2, 3, mk, mk)), **kw)  # H_rab not 1 or H
    with pytest.raises(ValueError, match="rab must have shape"):
        jsa.hstu_attention(*args, rab=jnp.zeros((2, 1, mk, mk + 1)), **kw)
    with pytest.raises(ValueError, match="rab must have rank 4"):
        jsa.hstu_attention(*args, rab=jnp.zeros((2, mk, mk)), **kw)
    with pytest.raises(TypeError, match="rab dtype"):
        jsa.hstu_attention(*args, rab=jnp.zeros((2, 1, mk, mk), jnp.bfloat16), **kw)
    q, k, v, cu_q, cu_k, mq, mk = make_case([3, 2], [2, 3], H=2, D=4, seed=8)
    with pytest.raises(ValueError, match="L_q <= L_k"):
        jsa.hstu_attention(*(jnp.asarray(x, jnp.float32) for x in (q, k, v)), jnp.asarray(cu_q),
                           jnp.asarray(cu_k), rab=jnp.zeros((2, 1, mk, mk)), max_seqlen_q=mq,
                           max_seqlen_k=mk, backend="reference")


def test_nan_in_a_visible_key_or_query_propagates():
    """A NaN in data a row does see reaches that row (NaN is not taken for a masked score):
    causal, two sequences; NaN in the first key of sequence 0 (seen by all its rows) makes
    all of sequence 0 NaN, and its dk row NaN; a NaN query row makes that row alone NaN.
    Sequence 1 stays finite, and so do the other rows of the query case."""
    q, k, v, cu_q, cu_k, mq, mk = make_case([5, 4], seed=3, dtype=np.float32)

    def run(q, k, v):
        return jsa.hstu_attention(q, k, v, cu_q, cu_k, max_seqlen_q=mq, max_seqlen_k=mk,
                                  window_size=(-1, 0), alpha=0.5, backend="reference")

    kn = np.where(np.arange(k.shape[0])[:, None, None] == 0, np.nan, k)
    out = np.asarray(run(q, kn, v))
    assert np.isnan(out[:5]).all() and np.isfinite(out[5:]).all()
    dk = jax.grad(lambda k_: jnp.sum(run(q, k_, v)[:5]))(jnp.asarray(kn))
    assert np.isnan(np.asarray(dk)[0]).all()
    qn = np.where(np.arange(q.shape[0])[:, None, None] == 2, np.nan, q)
    out = np.asarray(run(qn, k, v))
    assert np.isnan(out[2]).all()
    assert np.isfinite(np.delete(out, 2, axis=0)).all()


@pytest.mark.parametrize("window_size", [(-1, 2**31 - 1), (2**31 - 1, 0), (2**40, 2**31),
                                         (3, 10**12)])
def test_reference_entry_points_take_windows_past_int32(window_size):
    """reference.hstu_attention_ref / hstu_attention_bwd_ref (public: the any-backend path
    and the oracle) compared p + right in int32: a right side of 2**31 - 1 wrapped around
    and masked every key (all-zero output), and a side past int32 raised OverflowError. A
    side that reaches every key means -1 there too, as in hstu_attention."""
    q, k, v, cu_q, cu_k, mq, mk = make_case([5, 0, 7], [6, 2, 9], seed=3, dtype=np.float32)
    unbounded = tuple(-1 if w >= 2**31 - 1 else w for w in window_size)
    kw = dict(max_seqlen_q=mq, max_seqlen_k=mk)
    want = reference.hstu_attention_ref(q, k, v, cu_q, cu_k, window_size=unbounded, **kw)
    assert np.abs(np.asarray(want)).max() > 0
    got = reference.hstu_attention_ref(q, k, v, cu_q, cu_k, window_size=window_size, **kw)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    np.testing.assert_array_equal(np.asarray(got), np.asarray(jsa.hstu_attention(
        q, k, v, cu_q, cu_k, window_size=window_size, backend="reference", **kw)))
    do = np.ones_like(q)
    want = reference.hstu_attention_bwd_ref(do, q, k, v, cu_q, cu_k, window_size=unbounded, **kw)
    got = reference.hstu_attention_bwd_ref(do, q, k, v, cu_q, cu_k, window_size=window_size, **kw)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
