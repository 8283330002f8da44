"""jax_sparse_attn.bias vs explicit loops of the paper's formulas; rab end to end."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_sparse_attn as jsa
from jax_sparse_attn import bias
from oracle import hstu_oracle, x64


def _bucket(dt, nb):
    return min(max(int(math.floor(math.log(max(abs(dt), 1)) / 0.301)), 0), nb)


def test_position_bias_matches_loop_and_paper_construction():
    rng = np.random.default_rng(0)
    n = 7
    w = rng.standard_normal(2 * n - 1).astype(np.float32)
    got = np.asarray(bias.position_bias(jnp.asarray(w), 5))
    assert got.shape == (1, 1, 5, 5)
    for p in range(5):
        for j in range(5):
            assert got[0, 0, p, j] == w[n - 1 + j - p]
    # the paper code's pad / repeat / reshape construction, evaluated with numpy
    t = np.tile(np.pad(w, (0, n)), n)[:-n].reshape(n, 3 * n - 2)
    r = (2 * n - 1) // 2
    np.testing.assert_array_equal(got[0, 0], t[:, r:-r][:5, :5])


def test_position_bias_per_head_and_errors():
    w = jnp.arange(2 * 9).reshape(2, 9).astype(jnp.float32)  # N = 5
    got = np.asarray(bias.position_bias(w, 5))
    assert got.shape == (1, 2, 5, 5)
    assert got[0, 1, 0, 4] == 9 + 4 + 4
    with pytest.raises(ValueError, match="exceeds N"):
        bias.position_bias(w, 6)
    with pytest.raises(ValueError, match="odd length"):
        bias.position_bias(jnp.zeros(8), 2)
    with pytest.raises(TypeError, match="floating"):
        bias.position_bias(jnp.zeros(9, jnp.int32), 2)


def test_time_bucket_formula():
    dts = np.array([0, 1, -1, 2, 3, 59, -60, 3600, 86400, -86400 * 30, 2_000_000_000], np.int64)
    got = np.asarray(bias.time_bucket(jnp.asarray(dts, jnp.int32), 128))
    want = [_bucket(int(d), 128) for d in dts]
    np.testing.assert_array_equal(got, want)
    assert np.asarray(bias.time_bucket(jnp.asarray([10**9]), 5))[0] == 5  # clamp


def test_time_and_relative_bias_match_loops():
    rng = np.random.default_rng(1)
    B, N = 3, 6
    ts = np.sort(rng.integers(9e8, 9.1e8, size=(B, N)), axis=1).astype(np.int32)
    w_ts = rng.standard_normal(129).astype(np.float32)
    w_pos = rng.standard_normal(2 * 8 - 1).astype(np.float32)
    got = np.asarray(bias.relative_bias(jnp.asarray(w_pos), jnp.asarray(w_ts), jnp.asarray(ts)))
    assert got.shape == (B, 1, N, N)
    for b in range(B):
        for p in range(N):
            nxt = ts[b, p + 1] if p + 1 < N else ts[b, N - 1]
            for j in range(N):
                want = w_pos[8 - 1 + j - p] + w_ts[_bucket(int(nxt) - int(ts[b, j]), 128)]
                np.testing.assert_allclose(got[b, 0, p, j], want, rtol=1e-6)
    # per-sequence lengths: rows from L-1 on use the last item's own timestamp
    lens = jnp.asarray([6, 3, 1])
    nt = np.asarray(bias.next_timestamps(jnp.asarray(ts), lens))
    np.testing.assert_array_equal(nt[1], [ts[1, 1], ts[1, 2], ts[1, 2], ts[1, 2], ts[1, 2], ts[1, 2]])
    np.testing.assert_array_equal(nt[2], [ts[2, 0]] * N)
    q_ts = rng.integers(9e8, 9.2e8, size=(B, N)).astype(np.int32)
    tb = np.asarray(bias.time_bias(jnp.asarray(w_ts), jnp.asarray(ts), jnp.asarray(q_ts)))
    assert tb[1, 0, 2, 4] == w_ts[_bucket(int(q_ts[1, 2]) - int(ts[1, 4]), 128)]


def test_relative_bias_is_differentiable_and_jittable():
    rng = np.random.default_rng(2)
    ts = jnp.asarray(np.sort(rng.integers(0, 10**6, size=(2, 4)), axis=1).astype(np.int32))
    w_pos = jnp.asarray(rng.standard_normal(7).astype(np.float32))
    w_ts = jnp.asarray(rng.standard_normal(33).astype(np.float32))
    f = jax.jit(lambda a, b: jnp.sum(bias.relative_bias(a, b, ts) ** 2))
    gp, gt = jax.grad(f, argnums=(0, 1))(w_pos, w_ts)
    assert gp.shape == w_pos.shape and gt.shape == w_ts.shape
    assert float(jnp.abs(gp).sum()) > 0 and float(jnp.abs(gt).sum()) > 0
    # finite difference along one table entry
    e = jnp.zeros(7).at[3].set(1e-2)
    fd = (f(w_pos + e, w_ts) - f(w_pos - e, w_ts)) / 2e-2
    np.testing.assert_allclose(float(fd), float(gp[3]), rtol=1e-3)


def test_built_bias_through_hstu_attention_matches_oracle():
    """bias builder -> rab -> hstu_attention (reference) == oracle with the same bias."""
    rng = np.random.default_rng(3)
    lens = [5, 0, 3]
    N = 5
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    T, H, D = int(cu[-1]), 2, 4
    q, k, v = (rng.standard_normal((T, H, D)) for _ in range(3))
    ts = np.zeros((3, N), np.int32)
    for b, L in enumerate(lens):
        ts[b, :L] = np.sort(rng.integers(0, 10**7, L))
    with x64():
        rab = bias.relative_bias(jnp.asarray(rng.standard_normal(9)), jnp.asarray(rng.standard_normal(129)),
                                 jnp.asarray(ts), bias.next_timestamps(jnp.asarray(ts), jnp.asarray(lens)))
        out = jsa.hstu_attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), jnp.asarray(cu),
                                 jnp.asarray(cu), max_seqlen_q=N, max_seqlen_k=N, backend="reference",
                                 rab=rab)
    want = hstu_oracle(q, k, v, cu, cu, max_seqlen_q=N, rab=np.asarray(rab))
    np.testing.assert_allclose(np.asarray(out), want, rtol=1e-10, atol=1e-12)
