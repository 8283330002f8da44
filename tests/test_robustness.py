"""NaN/Inf isolation: data outside a sequence, unused index entries, empty rows,
partial-block tails and unused page slots never reach a result; SiLU's limit at -inf.

Each case runs on the reference backend (CI) and on the kernel backend (``gpu`` marker,
H200). Expected values are computed in float64 NumPy in the test.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_sparse_attn import metadata
from jax_sparse_attn import (
    block_sparse_attention,
    block_sparse_attention_forward,
    hstu_attention,
)

BACKENDS = [
    pytest.param("reference", id="reference"),
    pytest.param("kernel", id="kernel", marks=pytest.mark.gpu),
]


def _dtype(backend):
    # the kernels take 16-bit inputs; the reference runs the same case in float32
    return jnp.float32 if backend == "reference" else jnp.bfloat16


def _tol(backend):
    return 1e-5 if backend == "reference" else 2e-2


def _silu(x):
    return x / (1.0 + math.exp(-x))


# ----------------------------------------------------------------------------- HSTU


@pytest.mark.parametrize("backend", BACKENDS)
def test_hstu_nan_in_next_sequence_values(backend):
    """cu_seqlens [0, 1, 3]: v[1] = NaN belongs to sequence 1 and must not reach sequence 0."""
    dt = _dtype(backend)
    q = k = jnp.ones((3, 1, 1), dt)
    v = jnp.ones((3, 1, 1), dt).at[1].set(jnp.nan)
    cu = jnp.array([0, 1, 3], jnp.int32)
    out = hstu_attention(q, k, v, cu, cu, max_seqlen_q=2, max_seqlen_k=2, backend=backend)
    np.testing.assert_allclose(float(out[0, 0, 0]), _silu(1.0) / 2, rtol=_tol(backend))


@pytest.mark.parametrize("backend", BACKENDS)
def test_hstu_nan_in_next_sequence_keys_grad(backend):
    """NaN in k[1] (sequence 1): sequence 0's output and dq stay finite and exact."""
    dt = _dtype(backend)
    q = jnp.ones((3, 1, 1), dt)
    k = jnp.ones((3, 1, 1), dt).at[1].set(jnp.nan)
    v = jnp.ones((3, 1, 1), dt)
    cu = jnp.array([0, 1, 3], jnp.int32)

    def loss(q_, k_, v_):
        o = hstu_attention(q_, k_, v_, cu, cu, max_seqlen_q=2, max_seqlen_k=2, backend=backend)
        return jnp.sum(o[:1].astype(jnp.float32))

    out = hstu_attention(q, k, v, cu, cu, max_seqlen_q=2, max_seqlen_k=2, backend=backend)
    dq, dk, dv = jax.grad(loss, argnums=(0, 1, 2))(q, k, v)
    np.testing.assert_allclose(float(out[0, 0, 0]), _silu(1.0) / 2, rtol=_tol(backend))
    # d/dq SiLU(q k) v / 2 at q = k = v = 1: SiLU'(1) / 2
    sig = 1.0 / (1.0 + math.exp(-1.0))
    dsilu = sig * (1.0 + 1.0 * (1.0 - sig))
    np.testing.assert_allclose(float(dq[0, 0, 0]), dsilu / 2, rtol=_tol(backend))
    np.testing.assert_allclose(float(dk[0, 0, 0]), dsilu / 2, rtol=_tol(backend))
    np.testing.assert_allclose(float(dv[0, 0, 0]), _silu(1.0) / 2, rtol=_tol(backend))


def test_hstu_paged_nan_in_unused_page_slots():
    """Paged KV: the slots of a sequence's last page past L_k hold NaN; out is finite and
    equals the packed computation."""
    rng = np.random.default_rng(0)
    H, D, P = 2, 8, 128
    lens = [130, 5]
    T = sum(lens)
    cu = jnp.array([0, lens[0], T], jnp.int32)
    q = jnp.asarray(rng.standard_normal((T, H, D)), jnp.float32)
    k = jnp.asarray(rng.standard_normal((T, H, D)), jnp.float32)
    v = jnp.asarray(rng.standard_normal((T, H, D)), jnp.float32)
    # sequence 0: pages 0, 1 (page 1 uses 2 of 128 slots); sequence 1: page 2 (5 slots)
    paged = np.full((3, 2, P, H, D), np.nan, np.float32)
    paged[0, 0], paged[0, 1] = np.asarray(k[:128]), np.asarray(v[:128])
    paged[1, 0, :2], paged[1, 1, :2] = np.asarray(k[128:130]), np.asarray(v[128:130])
    paged[2, 0, :5], paged[2, 1, :5] = np.asarray(k[130:]), np.asarray(v[130:])
    page_ids = jnp.array([0, 1, 2], jnp.int32)
    page_indptrs = jnp.array([0, 2, 3], jnp.int32)
    kw = dict(max_seqlen_q=130, max_seqlen_k=130, alpha=0.3, backend="reference")
    got = hstu_attention(q, None, None, cu, cu, paged_kv=jnp.asarray(paged), page_ids=page_ids,
                         page_indptrs=page_indptrs, **kw)
    want = hstu_attention(q, k, v, cu, cu, **kw)
    assert np.all(np.isfinite(np.asarray(got)))
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_hstu_score_below_float_min_is_silu_limit_zero(backend):
    """A score of -inf (q.k overflows below -3.4e38) contributes SiLU's limit 0, not NaN."""
    dt = _dtype(backend)
    # query 1 (causal) sees key 0 with score 1 and key 1 with score 1e20 * -1e20 = -inf
    q = jnp.array([[[1.0]], [[1e20]]], dt)
    k = jnp.array([[[1e-20]], [[-1e20]]], dt)
    v = jnp.array([[[1.0]], [[1.0]]], dt)
    cu = jnp.array([0, 2], jnp.int32)
    out = hstu_attention(q, k, v, cu, cu, max_seqlen_q=2, max_seqlen_k=2, backend=backend)
    qn, kn = np.asarray(q, np.float64), np.asarray(k, np.float64)
    s10 = float(qn[1, 0, 0] * kn[0, 0, 0])
    s00 = float(qn[0, 0, 0] * kn[0, 0, 0])
    assert np.all(np.isfinite(np.asarray(out, np.float32)))
    np.testing.assert_allclose(float(out[1, 0, 0]), _silu(s10) / 2, rtol=_tol(backend))
    np.testing.assert_allclose(float(out[0, 0, 0]), _silu(s00) / 2, rtol=_tol(backend), atol=1e-6)


# ----------------------------------------------------------------------------- BSA


def _softmax_rows(q, k, v, scale):
    """float64 softmax attention of q (S_q, D) over the keys k, v (n, D)."""
    s = (q @ k.T) * scale
    s = s - s.max(-1, keepdims=True)
    p = np.exp(s)
    return (p / p.sum(-1, keepdims=True)) @ v


@pytest.mark.parametrize("backend", BACKENDS)
def test_bsa_unused_index_entries_and_empty_rows_are_not_read(backend):
    """S = 128, blk 64, K_max = 2, block_sparse_num = 1, both rows list block 1: NaN in
    block 0's v (only named by the unused second entry) must not reach any output."""
    dt = _dtype(backend)
    rng = np.random.default_rng(1)
    D = 32
    q = rng.standard_normal((1, 1, 128, D)).astype(np.float32)
    k = rng.standard_normal((1, 1, 128, D)).astype(np.float32)
    v = rng.standard_normal((1, 1, 128, D)).astype(np.float32)
    v[0, 0, 5] = np.nan
    idx = jnp.array([[[[1, 0], [1, 0]]]], jnp.int32)
    qj, kj, vj = (jnp.asarray(x, dt) for x in (q, k, v))
    out, lse = block_sparse_attention_forward(qj, kj, vj, idx, 1, sparse_block_size=64,
                                              backend=backend)
    qn, kn, vn = (np.asarray(x, np.float64) for x in (qj, kj, vj))
    want = _softmax_rows(qn[0, 0], kn[0, 0, 64:], vn[0, 0, 64:], 1 / math.sqrt(D))
    assert np.all(np.isfinite(np.asarray(out, np.float32)))
    np.testing.assert_allclose(np.asarray(out[0, 0], np.float64), want, atol=_tol(backend) * 2,
                               rtol=_tol(backend) * 2)
    # empty rows (count 0) next to a NaN block: out 0, lse -inf, nothing else
    nums = jnp.array([[[0, 1]]], jnp.int32)
    out2, lse2 = block_sparse_attention_forward(qj, kj, vj, idx, q2k_block_nums=nums,
                                                sparse_block_size=64, allow_empty_block_nums=True,
                                                backend=backend)
    assert np.all(np.asarray(out2[0, 0, :64], np.float32) == 0)
    assert np.all(np.isneginf(np.asarray(lse2[0, 0, :64])))
    np.testing.assert_allclose(np.asarray(out2[0, 0, 64:], np.float64), want[64:],
                               atol=_tol(backend) * 2, rtol=_tol(backend) * 2)


@pytest.mark.parametrize("backend", BACKENDS)
def test_bsa_nan_query_and_cotangent_of_empty_rows_stay_out_of_dk_dv(backend):
    """S = 128, blk 64, K_max = 2: query block 0 lists block 1 (its unused second entry names
    block 0), query block 1 lists nothing (count 0) and holds NaN in q and in the output
    cotangent. Its rows have no key, so dK / dV equal those of finite rows there and dQ of
    the empty rows is 0; block 0, listed by no row, gets zero gradients."""
    dt = _dtype(backend)
    rng = np.random.default_rng(5)
    q, k, v, do = (jnp.asarray(rng.standard_normal((1, 1, 128, 32)), dt) for _ in range(4))
    idx = jnp.array([[[[1, 0], [0, 1]]]], jnp.int32)
    nums = jnp.array([[[1, 0]]], jnp.int32)

    def grads(q, do):
        out, vjp = jax.vjp(lambda q, k, v: block_sparse_attention(
            q, k, v, idx, q2k_block_nums=nums, sparse_block_size=64,
            allow_empty_block_nums=True, backend=backend), q, k, v)
        return [np.asarray(x, np.float32) for x in (out,) + vjp(do)]

    clean = grads(q, do)
    bad = grads(q.at[0, 0, 64:].set(jnp.nan), do.at[0, 0, 70].set(jnp.nan))
    for got, want in zip(bad, clean):
        assert np.all(np.isfinite(got))
        np.testing.assert_array_equal(got, want)
    assert np.all(bad[1][0, 0, 64:] == 0)  # dq of the empty rows
    assert np.all(bad[2][0, 0, :64] == 0) and np.all(bad[3][0, 0, :64] == 0)  # block 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_bsa_partial_block_tail_not_read(backend):
    """S = 64, block_sizes = [40], v[40:] = NaN (and k[40:] = NaN): out, lse and the
    gradients are finite and equal attention over the first 40 keys."""
    dt = _dtype(backend)
    rng = np.random.default_rng(2)
    D = 32
    q = rng.standard_normal((1, 1, 64, D)).astype(np.float32)
    k = rng.standard_normal((1, 1, 64, D)).astype(np.float32)
    v = rng.standard_normal((1, 1, 64, D)).astype(np.float32)
    k[:, :, 40:] = np.nan
    v[:, :, 40:] = np.nan
    w = jnp.asarray(rng.standard_normal((1, 1, 64, D)), jnp.float32)
    qj, kj, vj = (jnp.asarray(x, dt) for x in (q, k, v))
    idx = jnp.zeros((1, 1, 1, 1), jnp.int32)
    sizes = jnp.array([40], jnp.int32)

    def loss(q_, k_, v_):
        o = block_sparse_attention(q_, k_, v_, idx, 1, sizes, sparse_block_size=64,
                                   backend=backend)
        return jnp.sum(o.astype(jnp.float32) * w)

    out = block_sparse_attention(qj, kj, vj, idx, 1, sizes, sparse_block_size=64,
                                 backend=backend)
    qn, kn, vn = (np.asarray(x, np.float64) for x in (qj, kj, vj))
    want = _softmax_rows(qn[0, 0], kn[0, 0, :40], vn[0, 0, :40], 1 / math.sqrt(D))
    assert np.all(np.isfinite(np.asarray(out, np.float32)))
    np.testing.assert_allclose(np.asarray(out[0, 0], np.float64), want, atol=_tol(backend) * 2,
                               rtol=_tol(backend) * 2)
    dq, dk, dv = jax.grad(loss, argnums=(0, 1, 2))(qj, kj, vj)
    for name, g in (("dq", dq), ("dk", dk), ("dv", dv)):
        assert np.all(np.isfinite(np.asarray(g, np.float32))), name
    # keys past the block size get exactly zero gradient
    assert np.all(np.asarray(dk[0, 0, 40:], np.float32) == 0)
    assert np.all(np.asarray(dv[0, 0, 40:], np.float32) == 0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_bsa_gqa_per_head_block_sizes_nan_tail(backend):
    """GQA (2 query heads, 1 KV head), per-head block sizes 40 and 20: keys past 40 (no head
    uses them) hold NaN. Out and gradients equal those with the NaN rows replaced by zeros."""
    dt = _dtype(backend)
    rng = np.random.default_rng(3)
    q = jnp.asarray(rng.standard_normal((1, 2, 64, 32)), dt)
    kv = rng.standard_normal((2, 1, 1, 64, 32)).astype(np.float32)
    clean = [jnp.asarray(x, dt) for x in kv]
    kv[:, :, :, 40:] = np.nan
    dirty = [jnp.asarray(x, dt) for x in kv]
    clean = [c.at[:, :, 40:].set(0) for c in clean]
    idx = jnp.zeros((1, 2, 1, 1), jnp.int32)
    sizes = jnp.array([[[40], [20]]], jnp.int32)
    w = jnp.asarray(rng.standard_normal((1, 2, 64, 32)), jnp.float32)

    def run(k, v):
        def loss(q_, k_, v_):
            o = block_sparse_attention(q_, k_, v_, idx, 1, sizes, sparse_block_size=64,
                                       backend=backend)
            return jnp.sum(o.astype(jnp.float32) * w)
        return jax.value_and_grad(loss, argnums=(0, 1, 2))(q, k, v)

    (l_d, g_d), (l_c, g_c) = run(*dirty), run(*clean)
    assert np.isfinite(float(l_d))
    np.testing.assert_allclose(float(l_d), float(l_c), rtol=1e-6)
    # the kernel's dq accumulates with atomics (order varies): one bf16 ulp apart at most
    rtol, atol = (0, 0) if backend == "reference" else (1e-2, 1e-3)
    for a, b in zip(g_d, g_c):
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32),
                                   rtol=rtol, atol=atol)


@pytest.mark.parametrize("backend", BACKENDS)
def test_bsa_out_of_range_metadata_under_jit_act_as_clamped(backend):
    """Under jax.jit (no eager checks) counts above K_max / below 0 and block ids past N_kv /
    below 0 give exactly the result of the clamped metadata (and never an invalid access)."""
    dt = _dtype(backend)
    rng = np.random.default_rng(4)
    B, H, S, D, blk, kmax = 1, 2, 512, 32, 64, 3
    n = S // blk
    q, k, v = (jnp.asarray(rng.standard_normal((B, H, S, D)), dt) for _ in range(3))
    idx = np.stack([rng.permutation(n)[:kmax] for _ in range(B * H * n)]).reshape(B, H, n, kmax)
    idx = idx.astype(np.int32)
    nums = np.full((B, H, n), 2, np.int32)
    idx[0, 0, 1] = [999, -5, 2]
    nums[0, 0, 1] = 50
    nums[0, 1, 5] = -7
    idx[0, 1, 3] = [1 << 30, 4, 1]
    good_idx = np.clip(idx, 0, n - 1)
    good_nums = np.clip(nums, 0, kmax)
    kw = dict(sparse_block_size=blk, allow_empty_block_nums=True, backend=backend)

    def fwd(i, m):
        o, lse = block_sparse_attention_forward(q, k, v, i, q2k_block_nums=m, **kw)
        return o.astype(jnp.float32), lse

    got = jax.jit(fwd)(jnp.asarray(idx), jnp.asarray(nums))
    want = fwd(jnp.asarray(good_idx), jnp.asarray(good_nums))  # eagerly validated metadata
    for a, b in zip(got, want):  # same computation (reference: up to XLA fusion order)
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("cu", [[0, -50, 250, 400], [0, 300, 200, 400], [0, 100, 200, 999],
                                [500, 600, 700, 800], [100, 200, 300, 400]],
                         ids=["negative", "decreasing", "past_T", "start_past_T", "start_nonzero"])
def test_hstu_garbage_cu_seqlens_under_jit_finite(backend, cu):
    """cu_seqlens the validators reject, traced under jit: finite outputs and gradients."""
    dt = _dtype(backend)
    rng = np.random.default_rng(5)
    q, k, v = (jnp.asarray(rng.standard_normal((400, 2, 64)) * 0.3, dt) for _ in range(3))

    @jax.jit
    def f(q_, k_, v_, c):
        def loss(a, b, d):
            o = hstu_attention(a, b, d, c, c, max_seqlen_q=200, max_seqlen_k=200, backend=backend)
            return jnp.sum(o.astype(jnp.float32))
        return jax.value_and_grad(loss, argnums=(0, 1, 2))(q_, k_, v_)

    val, grads = f(q, k, v, jnp.asarray(cu, jnp.int32))
    assert np.isfinite(float(val))
    for g in grads:
        assert np.all(np.isfinite(np.asarray(g, np.float32)))


@pytest.mark.parametrize("cu,total,want", [
    ([0, 3, 7], 10, [0, 3, 7]),              # valid: unchanged
    ([0, -5, 7], 10, [0, 0, 7]),             # negative: clamped
    ([0, 8, 4, 12], 10, [0, 8, 8, 10]),      # decreasing and past the total
    ([5, 6, 7], 10, [0, 6, 7]),              # rows before cu[0] join sequence 0
    ([50, 60, 70], 10, [0, 10, 10]),         # everything past the total
])
def test_sanitize_cu_seqlens(cu, total, want):
    """The kernels' cu_seqlens clamp: inside [0, total], starting at 0, non-decreasing."""
    got = metadata.sanitize_cu_seqlens(jnp.asarray(cu, jnp.int32), total)
    assert got.tolist() == want


@pytest.mark.parametrize("window", [(-1, 0), (-1, -1), (40, 3)])
def test_hstu_bwd_lpt_schedule_is_a_permutation(window):
    """The sm90 backward's KV-tile schedule (window given) holds the canonical KV tiles in
    another order: every (batch, n_block) once, heaviest first (visible query rows under the
    window, checked by brute force), idle slots last."""
    lens_q = [300, 0, 257, 5, 129]
    lens_k = [300, 0, 257, 40, 129]
    cu_q = jnp.asarray(np.concatenate([[0], np.cumsum(lens_q), [sum(lens_q)]]), jnp.int32)
    cu_k = jnp.asarray(np.concatenate([[0], np.cumsum(lens_k), [sum(lens_k) + 50]]), jnp.int32)
    t_q, t_k = sum(lens_q), sum(lens_k) + 50
    base, qs0, _ = metadata.hstu_bwd_schedule(cu_q, cu_k, None, 64, 128, t_q, t_k)
    lpt, qs1, _ = metadata.hstu_bwd_schedule(cu_q, cu_k, None, 64, 128, t_q, t_k,
                                             window_size=window)
    base, lpt = np.asarray(base), np.asarray(lpt)
    assert np.array_equal(np.asarray(qs0), np.asarray(qs1))
    assert sorted(map(tuple, base)) == sorted(map(tuple, lpt))
    cq, ck = np.asarray(cu_q), np.asarray(cu_k)

    def work(b, n):
        if b < 0:
            return -1
        lq, lk = cq[b + 1] - cq[b], ck[b + 1] - ck[b]
        left, right = window
        rows = 0
        for i in range(lq):
            j = np.arange(n * 128, min(n * 128 + 128, lk))
            ok = np.ones_like(j, bool)
            if left >= 0:
                ok &= j >= i + lk - lq - left
            if right >= 0:
                ok &= j <= i + lk - lq + right
            rows += bool(ok.any())
        return rows

    w = [work(int(b), int(n)) for b, n in lpt]
    assert w == sorted(w, reverse=True), w


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("tokens", [1, 300, 1000, 100_000])
@pytest.mark.parametrize("window", [(-1, 0), (-1, -1), (40, 3)])
def test_hstu_bwd_chunked_schedule(tokens, window, deterministic):
    """The backward's KV-tile schedule in chunked order (``tokens_per_chunk``) holds the
    same KV tiles as the longest-first order: by non-decreasing chunk ``min(cu_q[b] //
    tokens, 126)`` of the tile's sequence (its first query; L_q != L_k here), the
    longest-first order within a chunk, idle slots last; deterministic: every sequence's KV
    tiles still ascend; one chunk gives the longest-first order itself."""
    lens_q = [300, 0, 257, 5, 129, 1030, 64, 1]
    lens_k = [300, 0, 257, 40, 129, 900, 64, 70]
    cu_q = jnp.asarray(np.concatenate([[0], np.cumsum(lens_q), [sum(lens_q)]]), jnp.int32)
    cu_k = jnp.asarray(np.concatenate([[0], np.cumsum(lens_k), [sum(lens_k) + 50]]), jnp.int32)
    t_q, t_k = sum(lens_q), sum(lens_k) + 50
    kw = dict(window_size=window, deterministic=deterministic)
    base, _, _ = metadata.hstu_bwd_schedule(cu_q, cu_k, None, 64, 128, t_q, t_k, **kw)
    got, _, _ = metadata.hstu_bwd_schedule(cu_q, cu_k, None, 64, 128, t_q, t_k, **kw,
                                           tokens_per_chunk=tokens)
    base, got = np.asarray(base), np.asarray(got)
    assert sorted(map(tuple, base.tolist())) == sorted(map(tuple, got.tolist()))
    valid = got[:, 0] >= 0
    assert not (valid[1:] & ~valid[:-1]).any(), "idle rows last"
    rows = got[valid]
    chunk = np.minimum(np.asarray(cu_q)[rows[:, 0]] // tokens, 126)
    assert (np.diff(chunk) >= 0).all()
    # within a chunk: the order of the unchunked schedule
    pos = {tuple(r): i for i, r in enumerate(base.tolist())}
    for c in np.unique(chunk):
        p = [pos[tuple(r)] for r in rows[chunk == c].tolist()]
        assert p == sorted(p), (c, p)
    if deterministic:
        for b in np.unique(rows[:, 0]):
            n = rows[rows[:, 0] == b][:, 1]
            assert (np.diff(n) > 0).all(), (b, n)
    if tokens == 100_000:
        np.testing.assert_array_equal(got, base)


@pytest.mark.parametrize("tokens", [1, 300, 1000, 100_000])
@pytest.mark.parametrize("window", [(-1, 0), (-1, -1), (40, 3)])
def test_hstu_fwd_chunked_schedule(tokens, window):
    """The forward's tile schedule in chunked order (``tokens_per_chunk``) holds the same
    query tiles as the longest-first order: by non-decreasing chunk ``min(cu_k[b] //
    tokens, 126)`` of the tile's sequence, the most visible keys first within a chunk
    (brute force), idle slots last; one chunk gives the longest-first order itself."""
    lens = [300, 0, 257, 5, 129, 1030, 64, 1]
    cu = jnp.asarray(np.concatenate([[0], np.cumsum(lens), [sum(lens) + 40]]), jnp.int32)
    t = sum(lens) + 40
    base = np.asarray(metadata.hstu_fwd_schedule(cu, cu, None, 128, t, window))
    got = np.asarray(metadata.hstu_fwd_schedule(cu, cu, None, 128, t, window,
                                                tokens_per_chunk=tokens))
    assert sorted(map(tuple, base.tolist())) == sorted(map(tuple, got.tolist()))
    valid = got[:, 0] >= 0
    assert not (valid[1:] & ~valid[:-1]).any(), "idle rows last"
    c = np.asarray(cu)

    def work(b, m):
        lq = lk = c[b + 1] - c[b]
        rows = np.arange(m * 128, min(m * 128 + 128, lq))
        j = np.arange(lk)
        ok = np.ones((len(rows), lk), bool)
        if window[0] >= 0:
            ok &= j[None] >= rows[:, None] - window[0]
        if window[1] >= 0:
            ok &= j[None] <= rows[:, None] + window[1]
        cols = np.nonzero(ok.any(0))[0]
        return int(cols[-1] - cols[0] + 1) if len(cols) else 0

    rows = got[valid]
    chunk = np.minimum(c[rows[:, 0]] // tokens, 126)
    assert (np.diff(chunk) >= 0).all()
    w = np.asarray([work(int(b), int(m)) for b, m in rows[:, :2]])
    assert (np.where(np.diff(chunk) == 0, np.diff(w), 0) <= 0).all(), (chunk, w)
    if tokens == 100_000:
        np.testing.assert_array_equal(got, base)


@pytest.mark.parametrize("tokens", [1, 200, 700])
def test_hstu_fwd_chunked_schedule_takes_the_chunk_from_the_keys(tokens):
    """With L_q != L_k and the pseudo-sequences of the kernel path (rows past cu_q[B] without
    keys), the chunk of a query tile is that of its sequence's first key
    (``cu_k[b] // tokens``), not of its first query row."""
    lens_q, lens_k = [300, 5, 257, 0, 129], [40, 600, 257, 90, 500]
    t_q, t_k = sum(lens_q) + 70, sum(lens_k)
    cu_q = metadata.append_pseudo_sequence(
        jnp.asarray(np.concatenate([[0], np.cumsum(lens_q)]), jnp.int32), t_q)
    cu_k = metadata.append_pseudo_sequence(
        jnp.asarray(np.concatenate([[0], np.cumsum(lens_k)]), jnp.int32), None)
    got = np.asarray(metadata.hstu_fwd_schedule(cu_q, cu_k, None, 128, t_q, (-1, 0),
                                                tokens_per_chunk=tokens))
    base = np.asarray(metadata.hstu_fwd_schedule(cu_q, cu_k, None, 128, t_q, (-1, 0)))
    assert sorted(map(tuple, base.tolist())) == sorted(map(tuple, got.tolist()))
    rows = got[got[:, 0] >= 0]
    ck = np.asarray(cu_k)
    chunk = np.minimum(ck[rows[:, 0]] // tokens, 126)
    assert (np.diff(chunk) >= 0).all(), (rows[:, 0], chunk)
    # the pseudo-sequence (index 5: the 70 rows past cu_q[5]) is in the chunk of cu_k[5]
    assert 5 in rows[:, 0]
    cq = np.asarray(cu_q)
    assert (np.minimum(cq[rows[:, 0]] // tokens, 126) != chunk).any() or tokens == 1
