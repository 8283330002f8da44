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


def test_time_bucket_rejects_a_negative_or_non_int_num_buckets():
    """num_buckets=-1 returned bucket -1 for every gap (an index before the table) and a
    float one float-valued buckets; they are a ValueError / TypeError naming num_buckets."""
    dts = jnp.asarray([0, 5, 10**6], jnp.int32)
    assert np.asarray(bias.time_bucket(dts, 0)).tolist() == [0, 0, 0]
    with pytest.raises(ValueError, match=r"num_buckets must be >= 0, got -1"):
        bias.time_bucket(dts, -1)
    with pytest.raises(TypeError, match=r"num_buckets must be a static Python int"):
        bias.time_bucket(dts, 2.5)


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


# ----------------------------------------------------------------------------- gradients


def _gather_relative_bias(w_pos, w_ts, ts, tq):
    """The plain-gather formulation (autodiff transposes its gathers to scatter-adds)."""
    wp = w_pos if w_pos.ndim == 2 else w_pos[None]
    wt = w_ts if w_ts.ndim == 2 else w_ts[None]
    n, m = (wp.shape[-1] + 1) // 2, ts.shape[1]
    p, j = jnp.arange(m)[:, None], jnp.arange(m)[None, :]
    bucket = bias.time_bucket(tq[:, :, None] - ts[:, None, :], wt.shape[-1] - 1)
    return wp[:, n - 1 + j - p][None] + jnp.moveaxis(wt[:, bucket], 0, 1)


def _bias_inputs(rng, B, m, n, heads, nbuckets=33, dtype=np.float32):
    shp = (lambda L: (L,)) if heads is None else (lambda L: (heads, L))
    # gaps spread over many log buckets, including 0 and negative gaps
    ts = np.sort(rng.integers(0, 10**7, size=(B, m)), axis=1).astype(np.int32)
    tq = rng.integers(0, 10**7, size=(B, m)).astype(np.int32)
    return (jnp.asarray(rng.standard_normal(shp(2 * n - 1)).astype(dtype)),
            jnp.asarray(rng.standard_normal(shp(nbuckets)).astype(dtype)),
            jnp.asarray(ts), jnp.asarray(tq))


@pytest.mark.parametrize("heads", [None, 3])
@pytest.mark.parametrize("m,n", [(1, 1), (1, 4), (2, 2), (5, 5), (6, 9), (17, 17)])
def test_relative_bias_value_and_gradients_match_gather_formulation(heads, m, n):
    rng = np.random.default_rng(10 + m + n)
    w_pos, w_ts, ts, tq = _bias_inputs(rng, 4, m, n, heads)
    got = bias.relative_bias(w_pos, w_ts, ts, tq)
    want = _gather_relative_bias(w_pos, w_ts, ts, tq)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    g = jnp.asarray(rng.standard_normal(got.shape).astype(np.float32))
    grads = [jax.grad(lambda a, b, f=f: jnp.sum(f(a, b, ts, tq) * g), argnums=(0, 1))(w_pos, w_ts)
             for f in (bias.relative_bias, _gather_relative_bias)]
    for new, old in zip(*grads):
        assert new.shape == old.shape and new.dtype == old.dtype
        np.testing.assert_allclose(np.asarray(new), np.asarray(old), rtol=1e-5, atol=1e-5)
        assert float(jnp.abs(new).sum()) > 0


def test_bias_gradients_match_finite_differences_float64():
    rng = np.random.default_rng(11)
    with x64():
        w_pos, w_ts, ts, tq = _bias_inputs(rng, 3, 6, 8, 2, nbuckets=129, dtype=np.float64)
        g = jnp.asarray(rng.standard_normal((3, 2, 6, 6)))

        def f(a, b):
            return jnp.sum(jnp.sin(bias.relative_bias(a, b, ts, tq)) * g)

        gp, gt = jax.grad(f, argnums=(0, 1))(w_pos, w_ts)
        assert gp.dtype == jnp.float64 and gt.dtype == jnp.float64
        eps = 1e-6
        for which, w, grad in ((0, w_pos, gp), (1, w_ts, gt)):
            used = np.flatnonzero(np.asarray(grad).reshape(-1))
            assert used.size > 0
            for flat in list(used[:6]) + [int(np.argmin(np.abs(np.asarray(grad).reshape(-1))))]:
                e = jnp.zeros(w.size, w.dtype).at[flat].set(eps).reshape(w.shape)
                args_p = (w_pos + e, w_ts) if which == 0 else (w_pos, w_ts + e)
                args_m = (w_pos - e, w_ts) if which == 0 else (w_pos, w_ts - e)
                fd = (f(*args_p) - f(*args_m)) / (2 * eps)
                np.testing.assert_allclose(float(fd), float(grad.reshape(-1)[flat]), rtol=1e-7,
                                           atol=1e-9)


def test_time_bias_gradient_accumulates_low_precision_tables_in_float32():
    rng = np.random.default_rng(12)
    _, w_ts, ts, tq = _bias_inputs(rng, 8, 32, 32, None, dtype=np.float32)
    w16 = w_ts.astype(jnp.bfloat16)
    g = jnp.asarray(rng.standard_normal((8, 1, 32, 32)).astype(np.float32))
    got = jax.grad(lambda w: jnp.sum(bias.time_bias(w, ts, tq).astype(jnp.float32)
                                     * g.astype(jnp.bfloat16).astype(jnp.float32)))(w16)
    assert got.dtype == jnp.bfloat16
    bucket = np.asarray(bias.time_bucket(tq[:, :, None] - ts[:, None, :], 32))
    g16 = np.asarray(g.astype(jnp.bfloat16).astype(jnp.float32))[:, 0]
    want = np.array([g16[bucket == k].sum(dtype=np.float64) for k in range(33)])
    # one bf16 rounding of the float32 sum (a bf16 scatter-add would round every update)
    np.testing.assert_allclose(np.asarray(got, np.float32), want, rtol=2 ** -7, atol=1e-6)


def test_bias_grad_under_jit_and_vmap():
    rng = np.random.default_rng(13)
    w_pos, w_ts, ts, tq = _bias_inputs(rng, 2, 5, 6, None)
    stack_pos = jnp.stack([w_pos, 2 * w_pos, -w_pos])
    stack_ts = jnp.stack([w_ts, w_ts + 1, -w_ts])

    def loss(a, b, t, q):
        return jnp.sum(jnp.cos(bias.relative_bias(a, b, t, q)))

    grad = jax.jit(jax.grad(loss, argnums=(0, 1)))
    vm = jax.jit(jax.vmap(jax.grad(loss, argnums=(0, 1)), in_axes=(0, 0, None, None)))(
        stack_pos, stack_ts, ts, tq)
    for i in range(3):
        one = grad(stack_pos[i], stack_ts[i], ts, tq)
        ref = jax.grad(lambda a, b: jnp.sum(jnp.cos(_gather_relative_bias(a, b, ts, tq))),
                       argnums=(0, 1))(stack_pos[i], stack_ts[i])
        for a, b, c in zip(one, (vm[0][i], vm[1][i]), ref):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-6)
            np.testing.assert_allclose(np.asarray(a), np.asarray(c), rtol=1e-5, atol=1e-5)
    # vmap over the timestamps too (a batch of batches), and the forward under vmap
    ts3 = jnp.stack([ts, ts + 1000, ts * 2])
    out = jax.vmap(lambda t: bias.relative_bias(w_pos, w_ts, t, t))(ts3)
    for i in range(3):
        np.testing.assert_array_equal(np.asarray(out[i]),
                                      np.asarray(_gather_relative_bias(w_pos, w_ts, ts3[i], ts3[i])))
    # second order: the backward is itself differentiable in the cotangent path
    h = jax.grad(lambda b: jnp.sum(jax.grad(loss, argnums=1)(w_pos, b, ts, tq) ** 2))(w_ts)
    h_ref = jax.grad(lambda b: jnp.sum(jax.grad(
        lambda c: jnp.sum(jnp.cos(_gather_relative_bias(w_pos, c, ts, tq))))(b) ** 2))(w_ts)
    np.testing.assert_allclose(np.asarray(h), np.asarray(h_ref), rtol=1e-4, atol=1e-5)


def test_forward_mode_in_time_table_raises():
    rng = np.random.default_rng(14)
    w_pos, w_ts, ts, tq = _bias_inputs(rng, 2, 4, 4, None)
    # position bias: plain jnp, forward mode works
    _, t = jax.jvp(lambda a: bias.position_bias(a, 4), (w_pos,), (jnp.ones_like(w_pos),))
    assert t.shape == (1, 1, 4, 4)
    with pytest.raises(TypeError):
        jax.jvp(lambda b: bias.time_bias(b, ts, tq), (w_ts,), (jnp.ones_like(w_ts),))


@pytest.mark.parametrize("platform", ["cuda", "cpu"])
def test_bias_gradient_lowering_has_no_scatter_on_gpu(platform):
    """The training-shape backward (B=128, N=200, 129 buckets) lowered for the GPU has no
    scatter (and no sort); on the CPU the time-table gradient is one segment sum."""
    B, N = 128, 200
    ts = jax.ShapeDtypeStruct((B, N), jnp.int32)

    def loss(a, b, t, q):
        return jnp.sum(jnp.sin(bias.relative_bias(a, b, t, q)))

    f = jax.jit(jax.grad(loss, argnums=(0, 1)))
    text = f.trace(jax.ShapeDtypeStruct((2 * N - 1,), jnp.float32),
                   jax.ShapeDtypeStruct((129,), jnp.float32), ts, ts).lower(
        lowering_platforms=(platform,)).as_text()
    scatters = [ln for ln in text.splitlines() if "scatter" in ln and "=" in ln]
    if platform == "cuda":
        assert not scatters, scatters[:3]
        assert "stablehlo.sort" not in text
    else:
        assert len([ln for ln in scatters if '"stablehlo.scatter"' in ln]) == 1, scatters


@pytest.mark.parametrize("heads", [1, 3])
def test_onehot_and_segment_bucket_sums_agree(heads):
    """Both backward forms of the time-table gradient (the one-hot reduction runs on GPUs,
    the segment sum on the CPU) give the same sums, including empty buckets."""
    rng = np.random.default_rng(15)
    k = 40
    bucket = jnp.asarray(rng.integers(0, k - 5, size=(3, 7, 7)).astype(np.uint8))  # 5 unused
    gt = jnp.asarray(rng.standard_normal((3, 7, 7, heads)).astype(np.float32))
    a = bias._bucket_sum_onehot(k, bucket, gt)
    b = bias._bucket_sum_segment(k, bucket, gt)
    assert a.shape == b.shape == (k, heads)
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)
    assert not np.any(np.asarray(a)[k - 5:])
    want = np.zeros((k, heads))
    np.add.at(want, np.asarray(bucket).reshape(-1), np.asarray(gt).reshape(-1, heads))
    np.testing.assert_allclose(np.asarray(a), want, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
def test_bias_gradients_on_gpu_match_gather_formulation():
    """On the GPU (the one-hot backward) at the MovieLens shape: the tables' gradients
    equal the plain-gather formulation's (fp32 sums of 5.1 M terms, order differs)."""
    rng = np.random.default_rng(16)
    w_pos, w_ts, ts, tq = _bias_inputs(rng, 128, 200, 200, None, nbuckets=129)
    g = jnp.asarray(rng.standard_normal((128, 1, 200, 200)).astype(np.float32))
    grads = [jax.jit(jax.grad(lambda a, b, f=f: jnp.sum(f(a, b, ts, tq) * g), argnums=(0, 1)))(
        w_pos, w_ts) for f in (bias.relative_bias, _gather_relative_bias)]
    for new, old in zip(*grads):
        np.testing.assert_allclose(np.asarray(new), np.asarray(old), rtol=1e-4, atol=2e-2)


def test_int64_timestamps_past_int32_are_refused_not_wrapped():
    """Millisecond timestamps (~1.6e12) as a NumPy int64 array were silently wrapped to
    int32 (JAX's default without x64), so every gap of 2**31 ms (~25 days) or more got a
    wrong bucket (a 50-day gap: bucket 56 instead of 73). They are a ValueError naming the
    argument; timestamps that fit int32 (seconds) are unchanged."""
    if jax.config.jax_enable_x64:
        pytest.skip("with x64 int64 timestamps are exact")
    day_ms = 86_400_000
    ts_ms = np.array([[1_600_000_000_000, 1_600_000_000_000 + 50 * day_ms]], np.int64)
    w = jnp.arange(129, dtype=jnp.float32)
    for fn in (lambda: bias.time_bias(w, ts_ms),
               lambda: bias.relative_bias(jnp.zeros(3), w, ts_ms),
               lambda: bias.next_timestamps(ts_ms),
               lambda: bias.time_bias(w, ts_ms // 1000, query_timestamps=ts_ms)):
        with pytest.raises(ValueError, match=r"timestamps.* outside int32.*seconds"):
            fn()
    got = np.asarray(bias.time_bias(w, ts_ms // 1000))  # seconds: exact
    assert got[0, 0, 0, 0] == _bucket(50 * 86_400, 128)
