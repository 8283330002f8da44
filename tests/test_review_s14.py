"""Review session 14: inputs that broke the public API on the CPU (reference backend).

Each test is a problem found by trying the ops as a new user would; the docstring of each
says what happened before the fix.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_sparse_attn import (
    block_sparse_attention,
    hstu_attention,
    validate_hstu_inputs,
)

INT32_MAX = 2**31 - 1


def _silu(x):
    return x / (1.0 + np.exp(-x))


def _hstu_oracle(q, k, v, cu_q, cu_k, window, alpha, scaling):
    """float64 numpy HSTU forward of the documented semantics (window masks only)."""
    out = np.zeros(q.shape[:2] + (v.shape[2],))
    left, right = window
    for b in range(len(cu_q) - 1):
        L_q, L_k = cu_q[b + 1] - cu_q[b], cu_k[b + 1] - cu_k[b]
        for i in range(L_q):
            p = i + L_k - L_q
            for j in range(L_k):
                if (left >= 0 and j < p - left) or (right >= 0 and j > p + right):
                    continue
                s = alpha * np.einsum("hd,hd->h", q[cu_q[b] + i], k[cu_k[b] + j])
                out[cu_q[b] + i] += _silu(s)[:, None] * v[cu_k[b] + j] / scaling
    return out


def _hstu_inputs(lens_q=(5, 7), lens_k=(6, 9), H=2, D=8, seed=0):
    rng = np.random.default_rng(seed)
    cu_q = np.cumsum((0,) + tuple(lens_q)).astype(np.int32)
    cu_k = np.cumsum((0,) + tuple(lens_k)).astype(np.int32)
    q = rng.standard_normal((cu_q[-1], H, D)).astype(np.float32)
    k = rng.standard_normal((cu_k[-1], H, D)).astype(np.float32)
    v = rng.standard_normal((cu_k[-1], H, D)).astype(np.float32)
    return q, k, v, cu_q, cu_k


# ----------------------------------------------------------------------------- HSTU windows


@pytest.mark.parametrize("window", [(-1, INT32_MAX), (INT32_MAX, INT32_MAX), (3, INT32_MAX),
                                    (INT32_MAX, 0), (2**40, 0), (0, 2**40), (10**30, 10**30)])
def test_hstu_huge_window_side_is_unbounded(window):
    """A window side of INT32_MAX (a common "no limit" sentinel) wrapped around in
    ``p + right`` (int32) and masked every key: the output was silently all zeros (and
    ``2**40`` raised an internal OverflowError from the jitted reference). A side that
    reaches past every key must act as -1 (unbounded)."""
    q, k, v, cu_q, cu_k = _hstu_inputs()
    opts = dict(max_seqlen_q=8, max_seqlen_k=10, alpha=0.3)
    got = np.asarray(hstu_attention(q, k, v, cu_q, cu_k, window_size=window, **opts))
    want_window = tuple(-1 if w >= 18 else w for w in window)
    want = _hstu_oracle(q, k, v, cu_q, cu_k, want_window, 0.3, 8)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert np.abs(got).max() > 0


@pytest.mark.parametrize("window", [(7, 0), (8, 2), (0, 9), (9, 8)])
def test_hstu_large_finite_window_exact(window):
    """Windows just below the "reaches every key" bound keep their exact (finite) mask."""
    q, k, v, cu_q, cu_k = _hstu_inputs(lens_q=(8, 3), lens_k=(6, 9))
    got = np.asarray(hstu_attention(q, k, v, cu_q, cu_k, max_seqlen_q=8, max_seqlen_k=9,
                                    window_size=window, alpha=0.5))
    np.testing.assert_allclose(got, _hstu_oracle(q, k, v, cu_q, cu_k, window, 0.5, 8),
                               rtol=1e-5, atol=1e-6)


def test_hstu_huge_window_under_jit_and_grad():
    """The same through jit + grad (traced cu_seqlens): gradients match the unbounded mask."""
    q, k, v, cu_q, cu_k = _hstu_inputs()

    def loss(q, cu, w):
        return jnp.sum(hstu_attention(q, k, v, cu, cu_k, max_seqlen_q=8, max_seqlen_k=10,
                                      window_size=w) ** 2)

    g_big = jax.jit(jax.grad(lambda q, cu: loss(q, cu, (-1, INT32_MAX))))(q, cu_q)
    g_full = jax.grad(lambda q, cu: loss(q, cu, (-1, -1)))(q, cu_q)
    np.testing.assert_allclose(g_big, g_full, rtol=1e-6, atol=1e-7)


# ----------------------------------------------------------------------------- static numbers


@pytest.mark.parametrize("name,value", [("max_seqlen_q", 2**31), ("max_seqlen_q", 2**40),
                                        ("max_seqlen_k", 2**31), ("max_seqlen_k", 2**63)])
def test_hstu_max_seqlen_beyond_int32(name, value):
    """``max_seqlen_q=2**40`` raised jax's internal OverflowError ("while parsing an argument
    to a jitted computation, whose argument path is x2"), ``max_seqlen_k=2**31`` ran out of
    memory allocating 1.2 TB. Both must be a ValueError naming the argument."""
    q, k, v, cu_q, cu_k = _hstu_inputs()
    opts = dict(max_seqlen_q=8, max_seqlen_k=10)
    opts[name] = value
    with pytest.raises(ValueError, match=rf"{name} must be <= {INT32_MAX}"):
        hstu_attention(q, k, v, cu_q, cu_k, **opts)
    with pytest.raises(ValueError, match=name):
        validate_hstu_inputs(q, k, v, cu_q, cu_k, **opts)


@pytest.mark.parametrize("name,value", [("alpha", 1e39), ("alpha", -1e300),
                                        ("scaling_seqlen", 1e300), ("scaling_seqlen", 1e-300),
                                        ("scaling_seqlen", 1e-39)])
def test_hstu_scalars_beyond_float32(name, value):
    """alpha / 1 / scaling_seqlen are float32 scalars: alpha=1e39 or scaling_seqlen=1e-300
    became inf and the output silently NaN. They must be a ValueError naming the argument."""
    q, k, v, cu_q, cu_k = _hstu_inputs()
    with pytest.raises(ValueError, match=rf"{name} must be"):
        hstu_attention(q, k, v, cu_q, cu_k, max_seqlen_q=8, max_seqlen_k=10, **{name: value})


@pytest.mark.parametrize("name,value", [("alpha", 1e30), ("scaling_seqlen", 1e-30),
                                        ("scaling_seqlen", 1e30)])
def test_hstu_scalars_large_but_float32_ok(name, value):
    """Values inside float32's range are still accepted (finite result, equal to the
    float64 oracle)."""
    q, k, v, cu_q, cu_k = _hstu_inputs()
    q = q * 1e-10 if name == "alpha" else q
    out = hstu_attention(q, k, v, cu_q, cu_k, max_seqlen_q=8, max_seqlen_k=10, **{name: value})
    assert out.shape == (12, 2, 8)
    out = np.asarray(out, np.float64)
    assert np.isfinite(out).all()
    opts = dict(alpha=1.0, scaling=8.0)  # the defaults: alpha 1, scaling_seqlen = max_seqlen_q
    opts["scaling" if name == "scaling_seqlen" else name] = value
    with np.errstate(over="ignore"):  # exp(-s) of a huge score: SiLU's limit, not an error
        want = _hstu_oracle(*(x.astype(np.float64) for x in (q, k, v)), cu_q, cu_k, (-1, 0),
                            opts["alpha"], opts["scaling"])
    assert np.abs(want).max() > 0
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-6 * np.abs(want).max())


@pytest.mark.parametrize("scale", [1e39, -1e300])
def test_bsa_softmax_scale_beyond_float32(scale):
    """softmax_scale=1e39 became inf in float32: every score was +-inf and the output NaN.
    It must be a ValueError naming softmax_scale."""
    x = jnp.ones((1, 1, 64, 16), jnp.float32)
    idx = jnp.zeros((1, 1, 1, 1), jnp.int32)
    with pytest.raises(ValueError, match="softmax_scale must be finite in float32"):
        block_sparse_attention(x, x, x, idx, 1, sparse_block_size=64, softmax_scale=scale)


# ----------------------------------------------------------------------------- bias builders


def _raises(exc, match, f):
    with pytest.raises(exc, match=match):
        f()


@pytest.mark.parametrize("case", ["pos_negative_len", "pos_float_len", "ts_empty_table",
                                  "ts_zero_heads", "heads_mismatch", "next_ts_1d",
                                  "next_ts_lengths_shape", "time_bias_1d_ts"])
def test_bias_builders_bad_input(case):
    """Bad inputs of jax_sparse_attn.bias raised JAX-internal errors ("reshape new_sizes
    must all be positive", "Slice size at index 1 in gather op is out of range", "add got
    incompatible shapes for broadcasting", an IndexError) or were silently truncated
    (``max_seqlen_k=2.5`` gave a 2 x 2 bias). Each must name the argument."""
    from jax_sparse_attn import bias

    ts = jnp.array([[0, 10, 100, 1000], [5, 5, 5, 5]], jnp.int32)
    cases = {
        "pos_negative_len": (ValueError, "max_seqlen_k must be >= 0",
                             lambda: bias.position_bias(jnp.zeros(7), -1)),
        "pos_float_len": (TypeError, "max_seqlen_k must be a static Python int",
                          lambda: bias.position_bias(jnp.zeros(7), 2.5)),
        "ts_empty_table": (ValueError, "w_ts must have H_rab >= 1 heads and at least one entry",
                           lambda: bias.time_bias(jnp.zeros(0), ts)),
        "ts_zero_heads": (ValueError, "w_ts must have H_rab >= 1",
                          lambda: bias.time_bias(jnp.zeros((0, 9)), ts)),
        "heads_mismatch": (ValueError, "w_pos and w_ts must have the same number of heads",
                           lambda: bias.relative_bias(jnp.zeros((2, 7)), jnp.zeros((3, 9)), ts)),
        "next_ts_1d": (ValueError, r"timestamps must have shape \(B, N\)",
                       lambda: bias.next_timestamps(ts[0])),
        "next_ts_lengths_shape": (ValueError, r"lengths must have shape \(B,\)",
                                  lambda: bias.next_timestamps(ts, jnp.array([1, 2, 3]))),
        "time_bias_1d_ts": (ValueError, r"timestamps must have shape \(B, N\)",
                            lambda: bias.time_bias(jnp.zeros(9), ts[0])),
    }
    exc, match, f = cases[case]
    _raises(exc, match, f)


@pytest.mark.parametrize("hp,ht", [(1, 1), (2, 1), (1, 3), (3, 3)])
def test_bias_relative_heads_broadcast(hp, ht):
    """Tables with equal head counts or one shared (1-head) table still combine."""
    from jax_sparse_attn import bias

    ts = jnp.array([[0, 10, 100, 1000], [5, 5, 5, 5]], jnp.int32)
    w_pos = jnp.arange(hp * 7, dtype=jnp.float32).reshape(hp, 7)
    w_ts = jnp.arange(ht * 9, dtype=jnp.float32).reshape(ht, 9)
    out = bias.relative_bias(w_pos, w_ts, ts)
    assert out.shape == (2, max(hp, ht), 4, 4)
    want = bias.position_bias(w_pos, 4) + bias.time_bias(w_ts, ts)
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("dt,want", [(-(2**31), 71), (2**31 - 1, 71), (-1000, 22), (1000, 22),
                                     (0, 0), (-1, 0)])
def test_time_bucket_int32_extremes(dt, want):
    """``time_bucket`` took ``abs`` in int32, where ``|-2**31|`` wraps to ``-2**31``: the
    largest negative gap fell into bucket 0 instead of bucket 71 (= floor(ln 2**31 / 0.301))."""
    from jax_sparse_attn import bias

    got = int(bias.time_bucket(jnp.array([dt], jnp.int32), 128)[0])
    assert got == want == min(128, int(np.floor(np.log(max(abs(float(dt)), 1.0)) / 0.301)))


# ----------------------------------------------------------------------------- mask builders


def _mask_cases():
    from jax_sparse_attn import masks

    cu = jnp.array([0, 6, 14], jnp.int32)
    q = jnp.ones((1, 2, 256, 16), jnp.float32)
    idx = jnp.zeros((1, 2, 3, 2), jnp.int32)
    return {
        # hstu_target_func
        "tf_num_targets_len": (ValueError, r"num_targets must have shape \(B,\) = \(2,\)",
                               lambda: masks.hstu_target_func(cu, 14, num_targets=jnp.array([2, 2, 2]))),
        "tf_num_targets_2d": (ValueError, "num_targets must have rank 1",
                              lambda: masks.hstu_target_func(cu, 14, num_targets=jnp.array([[2, 2]]))),
        "tf_num_targets_float": (TypeError, "num_targets must be an integer",
                                 lambda: masks.hstu_target_func(cu, 14, num_targets=jnp.array([2.5, 2.0]))),
        "tf_cu_2d": (ValueError, "cu_seqlens must have rank 1",
                     lambda: masks.hstu_target_func(cu[None], 14)),
        "tf_cu_float": (TypeError, "cu_seqlens must be an integer",
                        lambda: masks.hstu_target_func(cu.astype(jnp.float32), 14)),
        "tf_total_float": (TypeError, "total_len must be a static Python int",
                           lambda: masks.hstu_target_func(cu, 14.5)),
        "tf_ctx_float": (TypeError, "contextual_seq_len must be a static Python int",
                         lambda: masks.hstu_target_func(cu, 14, contextual_seq_len=1.5)),
        "tf_window_float": (TypeError, "max_attn_len must be a static Python int",
                            lambda: masks.hstu_target_func(cu, 14, max_attn_len=2.5)),
        # block_mask_to_index
        "bm_max_blocks_float": (TypeError, "max_blocks must be a static Python int",
                                lambda: masks.block_mask_to_index(jnp.ones((1, 2, 3, 4), bool), 2.5)),
        "bm_no_kv_blocks": (ValueError, "N_kv = 0",
                            lambda: masks.block_mask_to_index(jnp.ones((1, 1, 1, 0), bool))),
        # topk_block_index
        "topk_float_k": (TypeError, "top_k must be a static Python int",
                         lambda: masks.topk_block_index(q, q, 2.5)),
        "topk_rank3": (ValueError, "q must have rank 4",
                       lambda: masks.topk_block_index(q[0], q[0], 2)),
        "topk_head_dim": (ValueError, "k must have q's batch size 1 and head dim 16",
                          lambda: masks.topk_block_index(q, q[..., :8], 2)),
        "topk_batch": (ValueError, "k must have q's batch size 1",
                       lambda: masks.topk_block_index(q, jnp.concatenate([q, q]), 2)),
        "topk_no_kv_heads": (ValueError, r"at least one KV head \(H_kv >= 1\), got H_kv=0 \(H_q=2\)",
                             lambda: masks.topk_block_index(q, q[:, :0], 2)),
        "topk_no_heads": (ValueError, r"at least one KV head \(H_kv >= 1\), got H_kv=0 \(H_q=0\)",
                          lambda: masks.topk_block_index(q[:, :0], q[:, :0], 2)),
        "topk_no_keys": (ValueError, "S_kv >= 1",
                         lambda: masks.topk_block_index(q, q[:, :, :0], 2)),
        # transpose_block_index
        "tr_nums_shape": (ValueError, "q2k_block_nums must have rank 3",
                          lambda: masks.transpose_block_index(idx, jnp.ones((1, 2), jnp.int32), 4)),
        "tr_nums_mismatch": (ValueError, r"q2k_block_nums must have shape \(B, H, N_q\) = \(1, 2, 3\)",
                             lambda: masks.transpose_block_index(idx, jnp.ones((1, 2, 4), jnp.int32), 4)),
        "tr_negative_blocks": (ValueError, "num_kv_blocks must be >= 0",
                               lambda: masks.transpose_block_index(idx, jnp.ones((1, 2, 3), jnp.int32), -1)),
        "tr_float_index": (TypeError, "q2k_block_index must be an integer",
                           lambda: masks.transpose_block_index(idx.astype(jnp.float32),
                                                               jnp.ones((1, 2, 3), jnp.int32), 4)),
    }


@pytest.mark.parametrize("case", sorted(_mask_cases()))
def test_mask_builders_bad_input(case):
    """Bad inputs of jax_sparse_attn.masks gave JAX-internal errors ("integer modulo by
    zero", "not enough values to unpack", an einsum label error, "k argument to top_k must
    be no larger than size along axis", "a should be 1-dimensional", broadcasting errors)
    or silent garbage: ``topk_block_index`` with k of batch 2 and q of batch 1 returned an
    index of batch 2 with counts of batch 1; ``num_targets`` of the wrong length or a float
    dtype and float static sizes were silently truncated. Each must name the argument."""
    exc, match, f = _mask_cases()[case]
    with pytest.raises(exc, match=match):
        f()


def test_mask_builders_valid_inputs_unchanged():
    """The accepted spellings still work: NumPy ints, max_attn_len 0 / None (unbounded),
    Python-list cu_seqlens and num_targets."""
    from jax_sparse_attn import masks

    cu = [0, 6, 14]
    a = masks.hstu_target_func(cu, np.int64(14), num_targets=[2, 2], max_attn_len=0)
    b = masks.hstu_target_func(jnp.array(cu, jnp.int32), 14, num_targets=np.array([2, 2]),
                               max_attn_len=None, contextual_seq_len=np.int32(0))
    np.testing.assert_array_equal(a, b)
    idx, nums = masks.block_mask_to_index(jnp.ones((1, 1, 2, 3), bool), max_blocks=np.int64(2))
    assert idx.shape == (1, 1, 2, 2) and nums.tolist() == [[[2, 2]]]
    q = jnp.ones((1, 2, 130, 16), jnp.float32)
    i, n = masks.topk_block_index(q, q[:, :1], np.int32(1), sparse_block_size=64)
    assert i.shape == (1, 2, 3, 1) and n.shape == (1, 2, 3)


# ----------------------------------------------------------------------------- which_backend


@pytest.mark.parametrize("name", ["hstu_attention", "hstu_attention_forward",
                                  "block_sparse_attention", "block_sparse_attention_forward"])
def test_which_backend_by_name(name):
    """README: ``which_backend(op, *args, **kwargs)``; passing the op's name (the natural
    reading of ``op``) failed with "'str' object is not callable". Names of the public ops
    now resolve to the ops; the result equals passing the function."""
    import jax_sparse_attn as jsa

    if name.startswith("hstu"):
        q = jnp.ones((8, 2, 16), jnp.float32)
        args, kw = (q, q, q, jnp.array([0, 8], jnp.int32), jnp.array([0, 8], jnp.int32)), \
            dict(max_seqlen_q=8, max_seqlen_k=8)
    else:
        x = jnp.ones((1, 2, 64, 16), jnp.float32)
        args, kw = (x, x, x, jnp.zeros((1, 2, 1, 1), jnp.int32), 1), dict(sparse_block_size=64)
    by_name = jsa.which_backend(name, *args, **kw)
    by_fn = jsa.which_backend(getattr(jsa, name), *args, **kw)
    assert by_name == by_fn and by_name.backend == "reference"
    assert by_name.op == name


def test_which_backend_rejects_other_callables_before_running_them():
    """A callable that is not a public op is rejected without being called."""
    import jax_sparse_attn as jsa

    calls = []
    with pytest.raises(TypeError, match="op must be a public jax_sparse_attn op"):
        jsa.which_backend(lambda *a: calls.append(a), 1, 2)
    assert calls == []


@pytest.mark.parametrize("op", ["hstu", "print", 3, None])
def test_which_backend_bad_op(op):
    """Unknown names and non-callables: a TypeError listing the public op names."""
    import jax_sparse_attn as jsa

    with pytest.raises(TypeError, match="op must be a public jax_sparse_attn op or its name"):
        jsa.which_backend(op)


# ----------------------------------------------------------------------------- per-shard cu_seqlens


def _per_shard_inputs(seed=0):
    rng = np.random.default_rng(seed)
    q, k, v, do = (jnp.asarray(rng.standard_normal((16, 2, 8)), jnp.float32) for _ in range(4))
    return q, k, v, do


_BAD_SHARD_CU = {
    "max_seqlen_too_small": ([[0, 3, 8], [0, 8, 8]], dict(max_seqlen_q=4, max_seqlen_k=8),
                             "max_seqlen_q=4 is smaller"),
    "non_monotone": ([[0, 5, 3], [0, 8, 8]], dict(max_seqlen_q=8, max_seqlen_k=8),
                     "must be non-decreasing"),
    "past_shard_slice": ([[0, 8, 8], [0, 3, 9]], dict(max_seqlen_q=9, max_seqlen_k=9),
                         "exceeds the number of tokens 8"),
}


@pytest.mark.parametrize("case", sorted(_BAD_SHARD_CU))
@pytest.mark.parametrize("op", ["forward", "backward"])
def test_per_shard_cu_seqlens_value_checks(case, op):
    """hstu_attention with concrete per-shard cu_seqlens ``(num_shards, B_local + 1)``
    skipped the eager value checks (the shards run under a vmap, where they are tracers):
    a too small max_seqlen_q, decreasing offsets or offsets past the shard's token slice ran
    silently with unspecified output. The checks must run per shard and name it."""
    from jax_sparse_attn import hstu_attention_backward

    cu, opts, msg = _BAD_SHARD_CU[case]
    cu = jnp.array(cu, jnp.int32)
    q, k, v, do = _per_shard_inputs()
    shard = 1 if case == "past_shard_slice" else 0
    with pytest.raises(ValueError, match=rf"shard {shard} of the per-shard cu_seqlens.*{msg}"):
        if op == "forward":
            hstu_attention(q, k, v, cu, cu, **opts)
        else:
            hstu_attention_backward(do, q, k, v, cu, cu, **opts)


def test_per_shard_argument_errors_match_the_one_dimensional_call():
    """With per-shard cu_seqlens a non-array q or do gave ValueError "... got shape None"
    (TypeError "must be an array" with 1-D cu_seqlens), k=None "T divisible by num_shards,
    got shape None", and zero shards "T divisible by num_shards=0". Each now gets the
    1-D call's error type and a message naming what is wrong."""
    from jax_sparse_attn import hstu_attention_backward

    q, k, v, do = _per_shard_inputs()
    cu = jnp.array([[0, 3, 8], [0, 8, 8]], jnp.int32)
    opts = dict(max_seqlen_q=8, max_seqlen_k=8)
    with pytest.raises(TypeError, match=r"q must be an array with \.shape and \.dtype"):
        hstu_attention(np.asarray(q).tolist(), k, v, cu, cu, **opts)
    with pytest.raises(ValueError, match=r"k is required \(got None\)"):
        hstu_attention(q, None, v, cu, cu, **opts)
    with pytest.raises(TypeError, match=r"do must be an array"):
        hstu_attention_backward(None, q, k, v, cu, cu, **opts)
    none = jnp.zeros((0, 3), jnp.int32)
    with pytest.raises(ValueError, match=r"num_shards >= 1 rows, got shape \(0, 3\)"):
        hstu_attention(q, k, v, none, none, **opts)


@pytest.mark.parametrize("with_rab", [False, True])
def test_per_shard_backward_matches_vjp(with_rab):
    """The hstu_attention_backward docstring (shared argument lines) says cu_seqlens "may
    instead be per-shard (num_shards, B_local+1) arrays", but the backward raised
    "cu_seqlens_q must have rank 1". It must equal the vjp of the per-shard forward."""
    from jax_sparse_attn import hstu_attention_backward

    q, k, v, do = _per_shard_inputs(1)
    cu_q = jnp.array([[0, 3, 7], [0, 0, 6]], jnp.int32)   # L_q <= L_k (rab's rule)
    cu_k = jnp.array([[0, 4, 8], [0, 1, 7]], jnp.int32)
    opts = dict(max_seqlen_q=6, max_seqlen_k=6, alpha=0.4, window_size=(3, 0))
    rab = (jnp.asarray(np.random.default_rng(2).standard_normal((4, 1, 6, 6)), jnp.float32)
           if with_rab else None)
    args = (q, k, v) + ((rab,) if with_rab else ())

    def f(q, k, v, rab=None):
        return hstu_attention(q, k, v, cu_q, cu_k, rab=rab, **opts)

    _, vjp = jax.vjp(f, *args)
    want = vjp(do)
    got = hstu_attention_backward(do, q, k, v, cu_q, cu_k, rab=rab, **opts)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_sharded_ops_check_concrete_metadata():
    """hstu_attention_sharded / block_sparse_attention_sharded run the op inside
    jax.shard_map, where the metadata are tracers: concrete bad metadata (a too small
    max_seqlen_q, an out-of-range block id) ran silently. They must raise the op's
    ValueError before sharding (one-device mesh here; the same code path as N devices)."""
    from jax.sharding import Mesh

    from jax_sparse_attn import sharding

    mesh = Mesh(np.array(jax.devices()[:1]), ("x",))
    q, k, v, _ = _per_shard_inputs()
    cu = jnp.array([[0, 5, 16]], jnp.int32)
    with pytest.raises(ValueError, match="shard 0 of the per-shard cu_seqlens.*max_seqlen_q=8"):
        sharding.hstu_attention_sharded(q, k, v, cu, cu, mesh=mesh, token_axis="x",
                                        max_seqlen_q=8, max_seqlen_k=11)
    out = sharding.hstu_attention_sharded(q, k, v, cu, cu, mesh=mesh, token_axis="x",
                                          max_seqlen_q=11, max_seqlen_k=11)
    np.testing.assert_allclose(out, hstu_attention(q, k, v, cu, cu, max_seqlen_q=11,
                                                   max_seqlen_k=11), rtol=1e-6, atol=1e-6)

    x = jnp.ones((2, 2, 128, 16), jnp.float32)
    idx = jnp.zeros((2, 2, 2, 1), jnp.int32).at[1, 0, 1, 0].set(7)
    with pytest.raises(ValueError, match=r"q2k_block_index\[\(1, 0, 1, 0\)\]=7 is outside"):
        sharding.block_sparse_attention_sharded(x, x, x, idx, 1, mesh=mesh, batch_axis="x",
                                                sparse_block_size=64)
    out = sharding.block_sparse_attention_sharded(x, x, x, jnp.zeros_like(idx), 1, mesh=mesh,
                                                  batch_axis="x", sparse_block_size=64)
    assert out.shape == x.shape


def test_hstu_backward_gqa_shapes_as_documented():
    """The hstu_attention_backward docstring gave dk/dv as ``(T_k, H, D)``; with grouped KV
    heads they are ``(T_k, H_kv, D)`` (each the sum over its group), as the docs now say."""
    from jax_sparse_attn import hstu_attention_backward

    rng = np.random.default_rng(5)
    q = jnp.asarray(rng.standard_normal((9, 4, 8)), jnp.float32)
    k = jnp.asarray(rng.standard_normal((9, 1, 8)), jnp.float32)
    v = jnp.asarray(rng.standard_normal((9, 1, 6)), jnp.float32)
    do = jnp.asarray(rng.standard_normal((9, 4, 6)), jnp.float32)
    cu = jnp.array([0, 4, 9], jnp.int32)
    res = hstu_attention_backward(do, q, k, v, cu, cu, max_seqlen_q=5, max_seqlen_k=5)
    assert res.dq_tensor.shape == (9, 4, 8)
    assert res.dk_tensor.shape == (9, 1, 8) and res.dv_tensor.shape == (9, 1, 6)
    k4, v4 = jnp.repeat(k, 4, axis=1), jnp.repeat(v, 4, axis=1)
    full = hstu_attention_backward(do, q, k4, v4, cu, cu, max_seqlen_q=5, max_seqlen_k=5)
    np.testing.assert_allclose(res.dk_tensor[:, 0], full.dk_tensor.sum(1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(res.dv_tensor[:, 0], full.dv_tensor.sum(1), rtol=1e-5, atol=1e-6)
