"""Block-sparse attention reference path vs the float64 loop oracle, gradients, jit/vmap/grad."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import jax_sparse_attn as jsa
from jax_sparse_attn import reference
from attention_base import BSAReferenceGrid
from attention_base import generate as pytest_generate_tests  # noqa: F401
from oracle import broadcast_sizes, bsa_oracle, fd_check, x64


def make_case(B=1, Hq=2, Hkv=1, Sq=150, Skv=140, D=8, Dv=None, blk=64, K=3, seed=0,
              dtype=np.float64, fixed=None, allow_empty=False, garbage=True):
    rng = np.random.default_rng(seed)
    Dv = D if Dv is None else Dv
    Nq, Nkv = -(-Sq // blk), -(-Skv // blk)
    q = rng.standard_normal((B, Hq, Sq, D)).astype(dtype)
    k = rng.standard_normal((B, Hkv, Skv, D)).astype(dtype)
    v = rng.standard_normal((B, Hkv, Skv, Dv)).astype(dtype)
    K = min(K, Nkv) if not garbage else K
    idx = np.full((B, Hq, Nq, K), -7 if garbage else 0, np.int32)
    if garbage:
        idx[...] = rng.integers(-100, 100, size=idx.shape)  # garbage past the prefix
    nums = np.zeros((B, Hq, Nq), np.int32)
    for b in range(B):
        for h in range(Hq):
            for m in range(Nq):
                lo = 0 if allow_empty else 1
                n = fixed if fixed is not None else int(rng.integers(lo, min(K, Nkv) + 1))
                nums[b, h, m] = n
                idx[b, h, m, :n] = rng.permutation(Nkv)[:n]
    return q, k, v, idx, nums


def call(q, k, v, idx, nums=None, fixed=None, **kw):
    with x64():
        res = jsa.block_sparse_attention_forward(
            jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), jnp.asarray(idx),
            block_sparse_num=fixed, q2k_block_nums=None if nums is None else jnp.asarray(nums),
            backend="reference", **kw)
        return np.asarray(res["o_tensor"]), np.asarray(res["lse_tensor"])


def check(o, lse, want_o, want_lse):
    np.testing.assert_allclose(o, want_o, rtol=1e-10, atol=1e-12)
    assert np.array_equal(np.isneginf(lse), np.isneginf(want_lse))
    fin = np.isfinite(want_lse)
    np.testing.assert_allclose(lse[fin], want_lse[fin], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("blk", [64, 128])
@pytest.mark.parametrize("Sq,Skv", [(150, 140), (64, 300), (1, 65)])
def test_bsa_counts_match_oracle(blk, Sq, Skv):
    q, k, v, idx, nums = make_case(Sq=Sq, Skv=Skv, blk=blk, K=3, seed=Sq + Skv)
    o, lse = call(q, k, v, idx, nums, sparse_block_size=blk)
    wo, wl = bsa_oracle(q, k, v, idx, nums, blk=blk)
    check(o, lse, wo, wl)


def test_bsa_fixed_count_and_garbage_past_prefix_ignored():
    q, k, v, idx, nums = make_case(Sq=200, Skv=260, blk=64, K=4, fixed=2, seed=1)
    o, lse = call(q, k, v, idx, fixed=2, sparse_block_size=64)
    wo, wl = bsa_oracle(q, k, v, idx, nums, blk=64)
    check(o, lse, wo, wl)
    idx2 = idx.copy()
    idx2[..., 2:] = np.random.default_rng(5).integers(-10**6, 10**6, size=idx2[..., 2:].shape)
    o2, lse2 = call(q, k, v, idx2, fixed=2, sparse_block_size=64)
    np.testing.assert_array_equal(o, o2)
    np.testing.assert_array_equal(lse, lse2)


def test_bsa_tail_masked_without_block_sizes():
    # S_kv = 130 with blk 128: block 1 holds 2 real keys; keys past S_kv must not count
    q, k, v, idx, nums = make_case(Sq=128, Skv=130, blk=128, K=2, fixed=2, seed=2, garbage=False)
    o, lse = call(q, k, v, idx, fixed=2)
    wo, wl = bsa_oracle(q, k, v, idx, nums, blk=128)
    check(o, lse, wo, wl)
    # only block 1 (2 valid keys) -> each output row is a mix of v[128], v[129]
    idx1 = np.ones_like(idx)
    o1, lse1 = call(q, k, v, idx1, fixed=1)
    wo1, wl1 = bsa_oracle(q, k, v, idx1, np.ones_like(nums), blk=128)
    check(o1, lse1, wo1, wl1)
    # lse over exactly the 2 valid keys
    s = np.einsum("bhqd,bhkd->bhqk", q, k[:, :, 128:130]) / np.sqrt(q.shape[-1])
    np.testing.assert_allclose(lse1, np.log(np.exp(s).sum(-1)), rtol=1e-12)


@pytest.mark.parametrize("rank", [1, 2, 3])
def test_bsa_partial_blocks_all_ranks(rank):
    B, Hq, Skv, blk = 2, 2, 200, 64
    Nkv = -(-Skv // blk)
    q, k, v, idx, nums = make_case(B=B, Hq=Hq, Hkv=2, Sq=100, Skv=Skv, blk=blk, K=3, seed=rank)
    rng = np.random.default_rng(rank)
    shape = {1: (Nkv,), 2: (B, Nkv), 3: (B, Hq, Nkv)}[rank]
    sizes = rng.integers(1, blk + 1, size=shape).astype(np.int32)
    with x64():
        o, lse = jsa.block_sparse_attention_forward(
            *(jnp.asarray(x) for x in (q, k, v, idx)), block_sizes=jnp.asarray(sizes),
            q2k_block_nums=jnp.asarray(nums), sparse_block_size=blk, backend="reference")
    wo, wl = bsa_oracle(q, k, v, idx, nums, broadcast_sizes(sizes, B, Hq, Nkv), blk=blk)
    check(np.asarray(o), np.asarray(lse), wo, wl)
    full, _ = bsa_oracle(q, k, v, idx, nums, blk=blk)
    assert np.abs(full - wo).max() > 1e-3  # the sizes matter


def test_bsa_empty_rows():
    q, k, v, idx, nums = make_case(Sq=192, Skv=192, blk=64, K=2, seed=3, allow_empty=True)
    nums[0, 0, 1] = 0
    nums[0, 1, :] = 0
    o, lse = call(q, k, v, idx, nums, sparse_block_size=64, allow_empty_block_nums=True)
    wo, wl = bsa_oracle(q, k, v, idx, nums, blk=64)
    check(o, lse, wo, wl)
    assert np.all(o[0, 0, 64:128] == 0) and np.all(np.isneginf(lse[0, 0, 64:128]))
    assert np.all(o[0, 1] == 0)
    with x64():
        args = tuple(jnp.asarray(x) for x in (q, k, v))

        def f(q_, k_, v_):
            return jsa.block_sparse_attention(q_, k_, v_, jnp.asarray(idx), q2k_block_nums=jnp.asarray(nums),
                                              sparse_block_size=64, allow_empty_block_nums=True,
                                              backend="reference")

        _, vjp = jax.vjp(f, *args)
        dq, dk, dv = vjp(jnp.ones(q.shape))
    assert np.all(np.isfinite(np.asarray(dq)))
    assert np.all(np.asarray(dq)[0, 1] == 0) and np.all(np.asarray(dq)[0, 0, 64:128] == 0)


def test_bsa_all_rows_empty_zero_grads():
    q, k, v, idx, nums = make_case(Sq=70, Skv=70, blk=64, K=1, seed=4, allow_empty=True)
    nums[...] = 0
    with x64():
        args = tuple(jnp.asarray(x) for x in (q, k, v))
        f = lambda *a: jsa.block_sparse_attention(*a, jnp.asarray(idx), q2k_block_nums=jnp.asarray(nums),  # noqa: E731
                                                  sparse_block_size=64, allow_empty_block_nums=True,
                                                  backend="reference")
        out, vjp = jax.vjp(f, *args)
        grads = vjp(jnp.ones(out.shape))
    assert np.all(np.asarray(out) == 0)
    for g in grads:
        assert np.all(np.asarray(g) == 0)


def test_bsa_gqa_head_mapping():
    q, k, v, idx, nums = make_case(B=1, Hq=4, Hkv=2, Sq=64, Skv=128, blk=64, K=2, seed=6)
    o, lse = call(q, k, v, idx, nums, sparse_block_size=64)
    wo, wl = bsa_oracle(q, k, v, idx, nums, blk=64)
    check(o, lse, wo, wl)
    # head 1 uses KV head 0 and head 2 KV head 1: repeating KV heads gives the MHA result
    k4, v4 = np.repeat(k, 2, axis=1), np.repeat(v, 2, axis=1)
    o4, _ = call(q, k4, v4, idx, nums, sparse_block_size=64)
    np.testing.assert_allclose(o, o4, rtol=1e-13, atol=1e-14)
    # and new data in KV head 1 changes heads 2, 3 only (mapping is h // 2, not h % 2)
    k_new, v_new = k.copy(), v.copy()
    k_new[:, 1], v_new[:, 1] = k[:, 1] + 1.0, -v[:, 1]
    o_new, _ = call(q, k_new, v_new, idx, nums, sparse_block_size=64)
    np.testing.assert_array_equal(o_new[:, :2], o[:, :2])
    assert all(np.abs(o_new[:, h] - o[:, h]).max() > 1e-3 for h in (2, 3))


def test_bsa_layouts_agree():
    q, k, v, idx, nums = make_case(B=2, Hq=2, Hkv=1, Sq=100, Skv=90, blk=64, K=2, seed=7, Dv=5)
    o1, l1 = call(q, k, v, idx, nums, sparse_block_size=64, layout="bhsd")
    t = lambda x: np.swapaxes(x, 1, 2)  # noqa: E731
    o2, l2 = call(t(q), t(k), t(v), idx, nums, sparse_block_size=64, layout="bshd")
    assert o2.shape == (2, 100, 2, 5)
    np.testing.assert_array_equal(t(o2), o1)
    np.testing.assert_array_equal(l2, l1)
    wo, wl = bsa_oracle(t(q), t(k), t(v), idx, nums, blk=64, layout="bshd")
    check(o2, l2, wo, wl)


def test_bsa_softmax_scale_and_default():
    q, k, v, idx, nums = make_case(Sq=64, Skv=128, blk=64, K=2, seed=8)
    o, lse = call(q, k, v, idx, nums, sparse_block_size=64, softmax_scale=0.05)
    wo, wl = bsa_oracle(q, k, v, idx, nums, blk=64, softmax_scale=0.05)
    check(o, lse, wo, wl)
    o_def, _ = call(q, k, v, idx, nums, sparse_block_size=64)
    o_exp, _ = call(q, k, v, idx, nums, sparse_block_size=64, softmax_scale=1 / np.sqrt(8))
    np.testing.assert_array_equal(o_def, o_exp)


_HARD_MAX_CHECK = """
import sys
import jax.numpy as jnp, numpy as np
import jax_sparse_attn as jsa
for n_blocks, kv_splits in ((1, 1), (2, 1), (2, 2)):
    for scale in (1e10, 1e30):
        x = np.random.default_rng(0).standard_normal((1, 1, 128 * n_blocks, 8)).astype(np.float32)
        rows = [[(m + j) % n_blocks for j in range(n_blocks)] for m in range(n_blocks)]
        idx = jnp.asarray(np.array([[rows]], np.int32))
        nums = jnp.full((1, 1, n_blocks), n_blocks, jnp.int32)
        x_ = jnp.asarray(x)
        o, lse = jsa.block_sparse_attention_forward(
            x_, x_, x_, idx, q2k_block_nums=nums, sparse_block_size=128, softmax_scale=scale,
            kv_splits=kv_splits, backend="reference")
        o, lse = np.asarray(o), np.asarray(lse)
        assert np.isfinite(o).all() and np.isfinite(lse).all(), (n_blocks, kv_splits, scale)
        s = (x[0, 0].astype(np.float64) * scale) @ x[0, 0].T.astype(np.float64)
        np.testing.assert_allclose(o[0, 0], x[0, 0][s.argmax(-1)], rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(lse[0, 0], s.max(-1), rtol=1e-5)
print("ok")
"""


def test_bsa_huge_softmax_scale_is_a_hard_max():
    """At a huge finite scale the softmax is a hard max: finite outputs and lse, each row's
    output the value row of its largest score, lse that score (to float32 rounding). Run at
    XLA's default CPU optimisation level (the tests' level 0 does not fuse the score scale
    into the exponent's subtraction, where one rounding less made ``exp`` overflow)."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env["XLA_FLAGS"] = " ".join(f for f in env.get("XLA_FLAGS", "").split()
                                if not f.startswith("--xla_backend_optimization_level"))
    r = subprocess.run([sys.executable, "-c", _HARD_MAX_CHECK], env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_bsa_low_precision(dtype):
    q, k, v, idx, nums = make_case(Sq=128, Skv=200, blk=64, K=3, D=16, seed=9, dtype=np.float32)
    qd, kd, vd = (jnp.asarray(x, dtype) for x in (q, k, v))
    res = jsa.block_sparse_attention_forward(qd, kd, vd, jnp.asarray(idx), q2k_block_nums=jnp.asarray(nums),
                                             sparse_block_size=64, backend="reference")
    o, lse = res
    assert o.dtype == jnp.dtype(dtype) and lse.dtype == jnp.float32
    wo, wl = bsa_oracle(*(np.asarray(x, np.float64) for x in (qd, kd, vd)), idx, nums, blk=64)
    err = np.abs(np.asarray(o, np.float64) - wo).max()
    assert err <= 1e-2
    np.testing.assert_allclose(np.asarray(lse), wl, rtol=1e-5, atol=1e-5)
    lo, llse = reference.block_sparse_attention_ref(qd, kd, vd, idx, nums, sparse_block_size=64,
                                                    compute_dtype=dtype)
    err_low = np.abs(np.asarray(lo, np.float64) - wo).max()
    assert lo.dtype == jnp.dtype(dtype) and llse.dtype == jnp.float32
    assert err <= err_low <= 0.1


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    Sq=st.integers(1, 200), Skv=st.integers(1, 200), K=st.integers(1, 4),
    heads=st.sampled_from([(1, 1), (2, 1), (4, 2)]), layout=st.sampled_from(["bhsd", "bshd"]),
    sizes_rank=st.sampled_from([0, 1, 3]), seed=st.integers(0, 2**16),
)
def test_bsa_random_cases(Sq, Skv, K, heads, layout, sizes_rank, seed):
    blk = 64
    Hq, Hkv = heads
    q, k, v, idx, nums = make_case(B=1, Hq=Hq, Hkv=Hkv, Sq=Sq, Skv=Skv, D=4, Dv=3, blk=blk, K=K,
                                   seed=seed, allow_empty=True)
    Nkv = -(-Skv // blk)
    rng = np.random.default_rng(seed)
    sizes = None
    if sizes_rank:
        shape = (Nkv,) if sizes_rank == 1 else (1, Hq, Nkv)
        sizes = rng.integers(1, blk + 1, size=shape).astype(np.int32)
    t = (lambda x: np.swapaxes(x, 1, 2)) if layout == "bshd" else (lambda x: x)
    with x64():
        o, lse = jsa.block_sparse_attention_forward(
            *(jnp.asarray(t(x)) for x in (q, k, v)), jnp.asarray(idx), q2k_block_nums=jnp.asarray(nums),
            block_sizes=None if sizes is None else jnp.asarray(sizes), sparse_block_size=blk,
            layout=layout, allow_empty_block_nums=True, backend="reference")
    wo, wl = bsa_oracle(q, k, v, idx, nums, broadcast_sizes(sizes, 1, Hq, Nkv), blk=blk)
    check(t(np.asarray(o)), np.asarray(lse), wo, wl)


# ------------------------------------------------------------------ gradients


@pytest.mark.parametrize("case", ["counts_gqa", "sizes_bshd", "empty_rows"])
def test_bsa_grad_matches_finite_differences(case):
    layout = "bshd" if case == "sizes_bshd" else "bhsd"
    q, k, v, idx, nums = make_case(B=1, Hq=4 if case == "counts_gqa" else 2, Hkv=2, Sq=90, Skv=150,
                                   D=6, Dv=4, blk=64, K=3, seed=17, allow_empty=case == "empty_rows")
    sizes = np.array([64, 10, 3], np.int32) if case == "sizes_bshd" else None
    t = (lambda x: np.swapaxes(x, 1, 2)) if layout == "bshd" else (lambda x: x)
    with x64():
        meta = dict(q2k_block_nums=jnp.asarray(nums), sparse_block_size=64, layout=layout,
                    block_sizes=None if sizes is None else jnp.asarray(sizes),
                    allow_empty_block_nums=True)

        def f(q_, k_, v_):
            return jsa.block_sparse_attention(q_, k_, v_, jnp.asarray(idx), backend="reference", **meta)

        args = tuple(jnp.asarray(t(x)) for x in (q, k, v))
        cot = jnp.asarray(np.random.default_rng(3).standard_normal(f(*args).shape))
        out, grads = fd_check(f, args, cot)
        # explicit backward API from (o, lse) agrees with jax.vjp of the op
        o, lse = jsa.block_sparse_attention_forward(*args, jnp.asarray(idx), backend="reference", **meta)
        res = jsa.block_sparse_attention_backward(cot, *args, o, lse, jnp.asarray(idx),
                                                  backend="reference", **meta)
        for a, b in zip(res, grads):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-10, atol=1e-12)
        # and jax.vjp of the plain reference forward (autodiff, no custom rule)
        _, vjp_auto = jax.vjp(lambda *a: reference.block_sparse_attention_ref(
            *a, jnp.asarray(idx), jnp.asarray(nums), meta["block_sizes"], layout=layout,
            sparse_block_size=64)[0], *args)
        for a, b in zip(vjp_auto(cot), grads):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-10, atol=1e-12)
        assert np.abs(np.asarray(res["dk_tensor"])).max() > 0


def test_bsa_jit_vmap_grad():
    q, k, v, idx, nums = make_case(B=1, Hq=2, Hkv=1, Sq=100, Skv=100, blk=64, K=2, seed=23,
                                   dtype=np.float32)
    idx_j, nums_j = jnp.asarray(idx), jnp.asarray(nums)

    def f(q_, k_, v_, idx_, nums_):
        return jsa.block_sparse_attention(q_, k_, v_, idx_, q2k_block_nums=nums_,
                                          sparse_block_size=64, backend="reference")

    eager = f(q, k, v, idx_j, nums_j)
    np.testing.assert_allclose(np.asarray(jax.jit(f)(q, k, v, idx_j, nums_j)), np.asarray(eager),
                               rtol=1e-6, atol=1e-7)
    qs = jnp.stack([q, -q])
    vm = jax.vmap(f, in_axes=(0, None, None, None, None))(qs, k, v, idx_j, nums_j)
    np.testing.assert_allclose(np.asarray(vm[1]), np.asarray(f(-q, k, v, idx_j, nums_j)),
                               rtol=1e-6, atol=1e-7)
    # vmap over the metadata
    idx2 = np.stack([idx, idx[..., ::-1]])
    nums2 = np.stack([nums, np.ones_like(nums)])
    vm2 = jax.vmap(f, in_axes=(None, None, None, 0, 0))(q, k, v, jnp.asarray(idx2), jnp.asarray(nums2))
    np.testing.assert_allclose(np.asarray(vm2[1]),
                               np.asarray(f(q, k, v, jnp.asarray(idx2[1]), jnp.asarray(nums2[1]))),
                               rtol=1e-6, atol=1e-7)
    loss = lambda q_: jnp.sum(f(q_, k, v, idx_j, nums_j) ** 2)  # noqa: E731
    np.testing.assert_allclose(np.asarray(jax.jit(jax.grad(loss))(q)), np.asarray(jax.grad(loss)(q)),
                               rtol=1e-5, atol=1e-7)
    vg = jax.vmap(jax.grad(loss))(qs)
    np.testing.assert_allclose(np.asarray(vg[0]), np.asarray(jax.grad(loss)(q)), rtol=1e-5, atol=1e-7)


def test_bsa_chunked_evaluation_matches(monkeypatch):
    """Many small lax.map / scan chunks (with a remainder) give the same numbers."""
    q, k, v, idx, nums = make_case(B=1, Hq=3, Hkv=1, Sq=300, Skv=200, blk=64, K=3, seed=31)
    sizes = np.array([64, 5, 64, 8], np.int32)
    cot = np.random.default_rng(0).standard_normal(q.shape)
    with x64():
        args = [jnp.asarray(x) for x in (q, k, v)]
        o, lse = reference.block_sparse_attention_ref(*args, idx, nums, sizes, sparse_block_size=64)
        grads = reference.block_sparse_attention_bwd_ref(jnp.asarray(cot), *args, o, lse, idx, nums, sizes,
                                                         sparse_block_size=64)
        # 15 items; 2 items per chunk -> 8 chunks, the last one half empty
        monkeypatch.setattr(reference, "_CHUNK_ELEMS_CPU", 2 * 64 * 3 * 64)
        monkeypatch.setattr(reference, "_CHUNK_ELEMS_ACCEL", 2 * 64 * 3 * 64)
        o2, lse2 = reference._block_sparse_attention_ref_impl(*args, idx, nums, sizes, sparse_block_size=64)
        grads2 = reference._block_sparse_attention_bwd_ref_impl(jnp.asarray(cot), *args, o, lse, idx, nums,
                                                                sizes, sparse_block_size=64)
    np.testing.assert_allclose(np.asarray(o2), np.asarray(o), rtol=1e-13, atol=1e-15)
    np.testing.assert_array_equal(np.asarray(lse2), np.asarray(lse))
    for a, b in zip(grads2, grads):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-12, atol=1e-14)
    wo, _ = bsa_oracle(q, k, v, idx, nums, broadcast_sizes(sizes, 1, 3, 4), blk=64)
    np.testing.assert_allclose(np.asarray(o2), wo, rtol=1e-10, atol=1e-12)


class TestBSAGrid(BSAReferenceGrid):
    """The shared grid (tests/attention_base.py) on the reference backend vs the float64
    oracle."""


@pytest.mark.parametrize("kv_splits", [1, 2])
def test_nan_in_listed_key_propagates(kv_splits):
    """NaN in a listed key: the rows that see it get NaN in out and lse (not the empty-row
    lse of -inf), and the gradients of q, k and v are NaN (not zeros); a row of another
    query block without a listed block keeps lse = -inf and out = 0."""
    import jax_sparse_attn as jsa
    from jax_sparse_attn import reference

    q = k = v = jnp.ones((1, 1, 128, 8), jnp.float32)
    k = k.at[0, 0, 3, 0].set(jnp.nan)
    idx = jnp.array([[[[0, 1], [1, 0]]]], jnp.int32)
    nums = jnp.array([[2, 0]], jnp.int32)[:, None]
    kw = dict(sparse_block_size=64, allow_empty_block_nums=True, kv_splits=kv_splits)
    o, lse = jsa.block_sparse_attention_forward(q, k, v, idx, None, None, nums, **kw)
    assert np.isnan(np.asarray(o[0, 0, :64])).all() and np.isnan(np.asarray(lse[0, 0, :64])).all()
    assert (np.asarray(o[0, 0, 64:]) == 0).all()
    assert (np.asarray(lse[0, 0, 64:]) == -np.inf).all()
    grads = jax.grad(lambda q, k, v: jsa.block_sparse_attention(
        q, k, v, idx, None, None, nums, **kw).sum(), (0, 1, 2))(q, k, v)
    for name, g in zip(("dq", "dk", "dv"), grads):
        assert np.isnan(np.asarray(g)).any(), name
    # merging partials: a NaN split makes the merge NaN; empty splits still give -inf
    o2, l2 = reference.combine_kv_splits(jnp.zeros((2, 3, 4)),
                                         jnp.array([[0.0, -jnp.inf, jnp.nan],
                                                    [1.0, -jnp.inf, 0.0]]))
    assert np.isfinite(np.asarray(l2[0])) and np.asarray(l2[1]) == -np.inf
    assert np.isnan(np.asarray(l2[2])) and np.isnan(np.asarray(o2[2])).all()
