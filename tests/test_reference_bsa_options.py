"""Block-sparse attention options ``kv_splits``, ``pack_gqa`` and ``causal`` on the reference
backend vs the float64 row oracle (``tests/oracle.py``), their validation, and the kernel
backend declining them.

Semantics under test (``jax_sparse_attn.bsa``): ``kv_splits`` cuts each row's active block
list into contiguous chunks whose softmax partials are merged (same result); ``pack_gqa``
takes metadata ``(B, H_kv, ceil(S_q r / blk), K_max)`` over packed query rows ``s r + g``;
``causal`` masks keys ``j > i + S_kv - S_q`` inside the listed blocks (fully masked rows:
out 0, lse -inf, no gradient).
"""

from __future__ import annotations

import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_sparse_attn as jsa
from jax_sparse_attn import _platform, masks, metadata, reference
from jax_sparse_attn.ffi import bsa as _ffi_bsa
from oracle import broadcast_sizes, bsa_rows_oracle_vjp, x64


def make_case(*, B=1, Hq=2, Hkv=1, Sq=70, Skv=150, D=8, blk=64, K=3, pack=False, seed=0,
              allow_empty=True, sizes_rank=None):
    """Random float64 q, k, v, do and metadata (garbage past the active prefix) in the
    packed contract when ``pack``."""
    rng = np.random.default_rng(seed)
    r = Hq // Hkv
    Hm = Hkv if pack else Hq
    Nq = -(-(Sq * r if pack else Sq) // blk)
    Nkv = -(-Skv // blk)
    q = rng.standard_normal((B, Hq, Sq, D))
    k = rng.standard_normal((B, Hkv, Skv, D))
    v = rng.standard_normal((B, Hkv, Skv, D))
    do = rng.standard_normal((B, Hq, Sq, D))
    idx = rng.integers(-50, 50, (B, Hm, Nq, K)).astype(np.int32)
    lo = 0 if allow_empty else 1
    nums = rng.integers(lo, min(K, Nkv) + 1, (B, Hm, Nq)).astype(np.int32)
    for b in range(B):
        for h in range(Hm):
            for m in range(Nq):
                idx[b, h, m, :nums[b, h, m]] = rng.permutation(Nkv)[:nums[b, h, m]]
    sizes = None
    if sizes_rank is not None:
        shape = {1: (Nkv,), 2: (B, Nkv), 3: (B, Hm, Nkv)}[sizes_rank]
        sizes = rng.integers(1, blk + 1, shape).astype(np.int32)
    return q, k, v, do, idx, nums, sizes


def run(q, k, v, do, idx, nums, sizes=None, *, blk=64, layout="bhsd", **opts):
    """``(out, lse, dq, dk, dv)`` of the public forward (jax.vjp with both cotangents
    through the custom_vjp) on the reference backend in float64."""
    with x64():
        def f(q_, k_, v_):
            return tuple(jsa.block_sparse_attention_forward(
                q_, k_, v_, jnp.asarray(idx), q2k_block_nums=jnp.asarray(nums),
                block_sizes=None if sizes is None else jnp.asarray(sizes),
                sparse_block_size=blk, layout=layout, allow_empty_block_nums=True,
                backend="reference", **opts))

        (o, lse), vjp = jax.vjp(f, *(jnp.asarray(x) for x in (q, k, v)))
        dq, dk, dv = vjp((jnp.asarray(do), jnp.zeros_like(lse)))
    return tuple(np.asarray(x) for x in (o, lse, dq, dk, dv))


def check_vs_oracle(got, q, k, v, do, idx, nums, sizes=None, *, blk=64, layout="bhsd",
                    pack_gqa=False, causal=False):
    Hm = idx.shape[1]
    n_kv = -(-k.shape[2 if layout == "bhsd" else 1] // blk)
    want = bsa_rows_oracle_vjp(q, k, v, do, idx, nums,
                               broadcast_sizes(sizes, q.shape[0], Hm, n_kv), blk=blk,
                               layout=layout, pack_gqa=pack_gqa, causal=causal)
    o, lse = got[0], got[1]
    assert not any(np.isnan(x).any() for x in got)
    assert np.array_equal(np.isneginf(lse), np.isneginf(want[1]))
    fin = np.isfinite(want[1])
    np.testing.assert_allclose(lse[fin], want[1][fin], rtol=1e-12, atol=1e-12)
    for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), got, want):
        if name != "lse":
            np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-11, err_msg=name)
    return want


# ----------------------------------------------------------------------------- kv_splits


@pytest.mark.parametrize("kv_splits", [1, 2, 3, 7, 64, 256, "auto"])
def test_kv_splits_match_oracle(kv_splits):
    # K = 6 listed blocks at most, counts 0..6: splits beyond a row's count are empty
    case = make_case(Hq=2, Hkv=1, Sq=130, Skv=420, K=6, seed=11)
    got = run(*case, kv_splits=kv_splits)
    check_vs_oracle(got, *case)


def test_kv_splits_result_equals_one_split_and_empty_rows():
    q, k, v, do, idx, nums, _ = make_case(Hq=4, Hkv=2, Sq=200, Skv=300, K=4, seed=12)
    nums[0, 1, :] = 0  # a head without keys
    nums[0, 0, 1] = 1
    one = run(q, k, v, do, idx, nums, kv_splits=1)
    for s in (2, 5):
        many = run(q, k, v, do, idx, nums, kv_splits=s)
        for a, b in zip(one, many):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-13)
        assert np.all(many[0][0, 1] == 0) and np.all(np.isneginf(many[1][0, 1]))


def test_combine_kv_splits_empty_and_mixed():
    o = np.arange(24, dtype=np.float64).reshape(3, 2, 4)  # (splits, rows, D_v)
    neg = -np.inf
    lse = np.array([[neg, 0.5], [neg, neg], [neg, 1.5]])  # row 0: every split empty
    with x64():
        out, l = reference.combine_kv_splits(jnp.asarray(o), jnp.asarray(lse))
    out, l = np.asarray(out), np.asarray(l)
    assert np.all(out[0] == 0) and np.isneginf(l[0]) and not np.isnan(out).any()
    w = np.exp(np.array([0.5, 1.5]) - np.logaddexp(0.5, 1.5))
    np.testing.assert_allclose(out[1], w[0] * o[0, 1] + w[1] * o[2, 1], rtol=1e-13)
    np.testing.assert_allclose(l[1], np.logaddexp(0.5, 1.5))


def test_kv_split_ids_cut_the_active_prefix_into_chunks():
    ids = np.asarray(metadata.kv_split_ids(jnp.asarray([0, 1, 5, 7, 8]), 8, 3))
    np.testing.assert_array_equal(ids[1, :1], [0])
    np.testing.assert_array_equal(ids[2, :5], [0, 0, 1, 1, 2])  # c = ceil(5 / 3) = 2
    np.testing.assert_array_equal(ids[3, :7], [0, 0, 0, 1, 1, 1, 2])
    np.testing.assert_array_equal(ids[4], [0, 0, 0, 1, 1, 1, 2, 2])
    assert ids.max() < 3 and ids.min() >= 0


def test_auto_kv_splits_rule():
    assert metadata.auto_kv_splits(16, 64, sms=132) == 8  # 16 rows x 8 splits fill 132 SMs
    assert metadata.auto_kv_splits(16, 4, sms=132) == 4  # never more splits than blocks
    assert metadata.auto_kv_splits(1000, 64, sms=132) == 1
    assert metadata.auto_kv_splits(1, 10_000, sms=1000) == 256


# ----------------------------------------------------------------------------- pack_gqa


@pytest.mark.parametrize("r", [2, 4, 8])
@pytest.mark.parametrize("sizes_rank", [None, 1, 3])
def test_pack_gqa_matches_oracle(r, sizes_rank):
    case = make_case(Hq=r * 2, Hkv=2, Sq=45, Skv=200, K=3, pack=True, seed=20 + r,
                     sizes_rank=sizes_rank)
    assert case[4].shape[:3] == (1, 2, -(-45 * r // 64))
    got = run(*case, pack_gqa=True)
    check_vs_oracle(got, *case, pack_gqa=True)


def test_pack_gqa_bshd_and_kv_splits():
    q, k, v, do, idx, nums, sizes = make_case(Hq=4, Hkv=1, Sq=50, Skv=130, K=3, pack=True,
                                              seed=31, sizes_rank=2)
    sw = [np.swapaxes(x, 1, 2) for x in (q, k, v, do)]
    got = run(*sw, idx, nums, sizes, layout="bshd", pack_gqa=True, kv_splits=2)
    check_vs_oracle(got, *sw, idx, nums, sizes, layout="bshd", pack_gqa=True)


def test_pack_gqa_one_block_serves_the_group():
    # packed block m of KV head 0 covers positions [m blk / r, (m + 1) blk / r) of every
    # head of the group: listing block n there is the unpacked listing of n for those rows
    r, blk, Sq = 4, 64, 64
    q, k, v, do, idx, nums, _ = make_case(Hq=r, Hkv=1, Sq=Sq, Skv=128, K=1, pack=True,
                                          seed=32, allow_empty=False)
    idx[0, 0, :, 0] = [0, 1, 1, 0]
    got = run(q, k, v, do, idx, nums, blk=blk, pack_gqa=True)
    uidx = np.zeros((1, r, 1, 1), np.int32)
    for m, n in enumerate([0, 1, 1, 0]):
        rows = slice(m * blk // r, (m + 1) * blk // r)
        uidx[:] = n
        ref = run(q, k, v, do, uidx, np.ones((1, r, 1), np.int32), blk=blk)
        np.testing.assert_allclose(got[0][:, :, rows], ref[0][:, :, rows], rtol=1e-12)


# ----------------------------------------------------------------------------- causal


@pytest.mark.parametrize("Sq,Skv", [(70, 150), (150, 70), (128, 128), (1, 65)])
def test_causal_matches_oracle(Sq, Skv):
    case = make_case(Hq=2, Hkv=1, Sq=Sq, Skv=Skv, K=3, seed=40 + Sq)
    got = run(*case, causal=True)
    check_vs_oracle(got, *case, causal=True)


def test_causal_rows_listing_only_future_blocks():
    # S_q = S_kv = 192, blk 64: query block 0 lists only blocks 1 and 2 (all keys in the
    # future) -> out 0, lse -inf, zero dq, finite grads; query block 1 lists its diagonal
    q, k, v, do, idx, nums, _ = make_case(Hq=2, Hkv=1, Sq=192, Skv=192, K=2, seed=50,
                                          allow_empty=False)
    idx[0, :, 0] = [1, 2]
    nums[0, :, 0] = 2
    idx[0, :, 1] = [1, 0]
    nums[0, :, 1] = 2
    got = run(q, k, v, do, idx, nums, causal=True)
    check_vs_oracle(got, q, k, v, do, idx, nums, causal=True)
    o, lse, dq = got[:3]
    assert np.all(o[0, :, :64] == 0) and np.all(np.isneginf(lse[0, :, :64]))
    assert np.all(dq[0, :, :64] == 0)
    assert all(np.isfinite(g).all() for g in got[2:])
    # the diagonal block is causal inside: row 64 sees keys 0..64 only
    assert np.isfinite(lse[0, :, 64:128]).all()


def test_causal_pack_gqa_kv_splits_together():
    case = make_case(Hq=8, Hkv=2, Sq=40, Skv=100, K=3, pack=True, seed=60, sizes_rank=3)
    got = run(*case, pack_gqa=True, causal=True, kv_splits=3)
    check_vs_oracle(got, *case, pack_gqa=True, causal=True)


def test_backward_entry_point_with_options():
    q, k, v, do, idx, nums, _ = make_case(Hq=4, Hkv=2, Sq=60, Skv=90, K=2, pack=True,
                                          seed=70)
    opts = dict(q2k_block_nums=jnp.asarray(nums), sparse_block_size=64,
                allow_empty_block_nums=True, backend="reference", pack_gqa=True, causal=True)
    with x64():
        a = [jnp.asarray(x) for x in (q, k, v)]
        o, lse = jsa.block_sparse_attention_forward(*a, jnp.asarray(idx), **opts)
        dq, dk, dv = jsa.block_sparse_attention_backward(jnp.asarray(do), *a, o, lse,
                                                         jnp.asarray(idx), **opts)
    want = bsa_rows_oracle_vjp(q, k, v, do, idx, nums, blk=64, pack_gqa=True, causal=True)
    for x, w in zip((dq, dk, dv), want[2:]):
        np.testing.assert_allclose(np.asarray(x), w, rtol=1e-10, atol=1e-11)


def test_options_under_jit_and_vmap():
    q, k, v, do, idx, nums, _ = make_case(B=1, Hq=4, Hkv=2, Sq=40, Skv=80, K=2, pack=True,
                                          seed=80, allow_empty=False)
    opts = dict(sparse_block_size=64, backend="reference", pack_gqa=True, causal=True,
                kv_splits=2)
    with x64():
        qs, ks, vs = (jnp.stack([jnp.asarray(x), jnp.asarray(x) * 0.5]) for x in (q, k, v))

        def f(q_, k_, v_):
            return jsa.block_sparse_attention(q_, k_, v_, jnp.asarray(idx),
                                              q2k_block_nums=jnp.asarray(nums), **opts)

        out = jax.jit(jax.vmap(f))(qs, ks, vs)
        g = jax.jit(jax.grad(lambda a, b, c: jnp.sum(f(a, b, c) ** 2)))(qs[1], ks[1], vs[1])
    for i in range(2):
        want = bsa_rows_oracle_vjp(np.asarray(qs[i]), np.asarray(ks[i]), np.asarray(vs[i]),
                                   do, idx, nums, blk=64, pack_gqa=True, causal=True)
        np.testing.assert_allclose(np.asarray(out[i]), want[0], rtol=1e-10, atol=1e-11)
    assert np.isfinite(np.asarray(g)).all() and np.abs(np.asarray(g)).max() > 0


# ----------------------------------------------------------------------------- masks


def test_topk_block_index_packed_metadata_runs():
    rng = np.random.default_rng(90)
    q = jnp.asarray(rng.standard_normal((1, 8, 100, 16)), jnp.float32)
    k = jnp.asarray(rng.standard_normal((1, 2, 300, 16)), jnp.float32)
    v = k
    idx, nums = masks.topk_block_index(q, k, 3, sparse_block_size=64, pack_gqa=True,
                                       causal=True)
    n_qp = -(-100 * 4 // 64)
    assert idx.shape == (1, 2, n_qp, 3) and nums.shape == (1, 2, n_qp)
    # causal: packed block m's last position s_last; its diagonal block holds key
    # s_last + 200 and is listed first (forced to the top score)
    for m in range(n_qp):
        s_last = min(((m + 1) * 64 - 1) // 4, 99)
        assert int(idx[0, 0, m, 0]) == (s_last + 200) // 64
        assert np.all(np.asarray(idx[0, 0, m, :int(nums[0, 0, m])]) <= (s_last + 200) // 64)
    out = jsa.block_sparse_attention(q, k, v, idx, q2k_block_nums=nums, sparse_block_size=64,
                                     pack_gqa=True, causal=True, allow_empty_block_nums=True,
                                     backend="reference")
    assert out.shape == q.shape and np.isfinite(np.asarray(out)).all()
    with pytest.raises(ValueError, match="r = H_q / H_kv = 3"):
        masks.topk_block_index(q[:, :6], k, 3, sparse_block_size=64, pack_gqa=True)


# ----------------------------------------------------------------------------- validation


def _args(pack=False, Hq=4, Hkv=2, Sq=64, Skv=128):
    q, k, v, _, idx, nums, _ = make_case(Hq=Hq, Hkv=Hkv, Sq=Sq, Skv=Skv, K=2, pack=pack,
                                         seed=1, allow_empty=False)
    return [jnp.asarray(x, jnp.float32) for x in (q, k, v)], jnp.asarray(idx), jnp.asarray(nums)


@pytest.mark.parametrize("bad,err,msg", [
    (0, ValueError, r"kv_splits must be in \[1, 256\] or 'auto', got 0"),
    (257, ValueError, r"kv_splits must be in \[1, 256\]"),
    ("max", ValueError, r"kv_splits must be an int in \[1, 256\] or 'auto', got 'max'"),
    (2.0, TypeError, "kv_splits must be a static Python int"),
    (True, TypeError, "kv_splits must be a static Python int"),
])
def test_kv_splits_validated(bad, err, msg):
    (q, k, v), idx, nums = _args()
    with pytest.raises(err, match=msg):
        jsa.block_sparse_attention(q, k, v, idx, q2k_block_nums=nums, sparse_block_size=64,
                                   kv_splits=bad, backend="reference")


def test_pack_gqa_and_causal_validated():
    (q, k, v), idx, nums = _args()
    kw = dict(sparse_block_size=64, backend="reference")
    for name in ("pack_gqa", "causal"):
        with pytest.raises(TypeError, match=f"{name} must be a bool, got 1"):
            jsa.block_sparse_attention(q, k, v, idx, q2k_block_nums=nums, **{name: 1}, **kw)
    # unpacked metadata passed with pack_gqa=True: the packed shape is named
    with pytest.raises(ValueError, match=r"pack_gqa=True q2k_block_index must have shape "
                                         r"\(B, H_kv, N_qp, K_max\) = \(1, 2, 2, K_max\)"):
        jsa.block_sparse_attention(q, k, v, idx, q2k_block_nums=nums, pack_gqa=True, **kw)
    (q, k, v), pidx, pnums = _args(pack=True)
    with pytest.raises(ValueError, match=r"q2k_block_nums must have shape \(B, H_kv, N_qp\)"):
        jsa.block_sparse_attention(q, k, v, pidx, q2k_block_nums=nums, pack_gqa=True, **kw)
    with pytest.raises(ValueError, match=r"block_sizes must have shape .* \(B, H_kv, N_kv\)"):
        jsa.block_sparse_attention(q, k, v, pidx, q2k_block_nums=pnums, pack_gqa=True,
                                   block_sizes=jnp.ones((1, 4, 2), jnp.int32), **kw)
    # value checks run on the packed rows
    bad = pidx.at[0, 1, 0, 0].set(9)
    with pytest.raises(ValueError, match=r"q2k_block_index\[\(0, 1, 0, 0\)\]=9 is outside"):
        jsa.block_sparse_attention(q, k, v, bad, q2k_block_nums=pnums, pack_gqa=True, **kw)
    # r must divide the block size
    (q, k, v), idx, nums = _args(Hq=6, Hkv=2)
    with pytest.raises(ValueError, match=r"r = H_q / H_kv = 6 / 2 = 3 to divide "
                                         r"sparse_block_size=64"):
        jsa.block_sparse_attention(q, k, v, idx, q2k_block_nums=nums, pack_gqa=True, **kw)


def test_pack_gqa_without_query_heads_is_a_value_error():
    """H_q = 0 query heads give no GQA group (r = 0) to pack: a ValueError naming pack_gqa
    (unpacked, H_q = 0 is an empty call)."""
    q = jnp.zeros((1, 0, 128, 16))
    k = jnp.zeros((1, 1, 128, 16))
    idx = jnp.zeros((1, 1, 0, 1), jnp.int32)
    with pytest.raises(ValueError, match=r"pack_gqa=True needs H_q >= 1 query heads"):
        jsa.block_sparse_attention(q, k, k, idx, 1, sparse_block_size=64, pack_gqa=True)
    with pytest.raises(ValueError, match=r"pack_gqa=True needs H_q >= 1 query heads"):
        jsa.validate_bsa_metadata(q, k, k, idx, 1, sparse_block_size=64, pack_gqa=True)
    with pytest.raises(ValueError, match=r"pack_gqa=True needs H_q >= 1 query heads"):
        masks.topk_block_index(q, k, 1, sparse_block_size=64, pack_gqa=True)
    out = jsa.block_sparse_attention(q, k, k, jnp.zeros((1, 0, 2, 1), jnp.int32), 1,
                                     sparse_block_size=64)
    assert out.shape == (1, 0, 128, 16)


@pytest.fixture
def fake_kernel_platform(monkeypatch):
    """A kernel platform whose bsa module accepts every call (the option checks run
    first): backend="kernel" reaches the option checks on this CPU machine."""
    monkeypatch.setattr(_platform, "kernel_platform_unavailable_reason", lambda: None)
    m = types.ModuleType("fake_ffi_bsa")
    m.bsa_kernel_unsupported_reason = lambda **kw: None
    m.pack_gqa_unsupported_reason = _ffi_bsa.pack_gqa_unsupported_reason
    m.fwd_config = m.bwd_config = lambda *a: a
    m.pre_config = lambda *a: None
    import jax_sparse_attn.ffi as ffi_pkg  # noqa: PLC0415

    monkeypatch.setitem(sys.modules, "jax_sparse_attn.ffi.bsa", m)
    monkeypatch.setattr(ffi_pkg, "bsa", m, raising=False)
    yield
    jax.clear_caches()


# causal=True and pack_gqa=True run on the sm90 kernels; where the mma.sync kernels would run
# they are declined (tests/test_lowering_bsa.py::test_causal_declined_where_sm80_kernels_run,
# test_pack_gqa_runs_on_the_sm90_kernels_only below); kv_splits: every forward splits
# (tests/test_lowering_bsa_splits.py), pack_gqa included; pack_gqa together with causal runs
# on the sm90 kernels too (tests/test_lowering_bsa_pack_gqa.py), with or without kv_splits.
@pytest.mark.parametrize("extra", [dict(causal=True), dict(causal=True, kv_splits=2)],
                         ids=["causal", "causal-splits2"])
def test_kernel_backend_takes_pack_gqa_with_causal(fake_kernel_platform, extra):
    q, k, v, _, idx, nums, _ = make_case(Hq=4, Hkv=2, Sq=64, Skv=128, D=64, K=2, pack=True,
                                         seed=2, allow_empty=False)
    q, k, v = (jnp.asarray(x, jnp.bfloat16) for x in (q, k, v))
    kw = dict(q2k_block_nums=nums, sparse_block_size=64, pack_gqa=True, **extra)
    for backend in ("auto", "kernel"):
        choice = jsa.which_backend(jsa.block_sparse_attention, q, k, v, idx, backend=backend,
                                   **kw)
        assert choice.backend == "kernel", choice.reason


@pytest.mark.parametrize("kv_splits", [2, 7, "auto"])
def test_kernel_backend_takes_pack_gqa_with_kv_splits(fake_kernel_platform, kv_splits):
    """pack_gqa with any kv_splits passes the option checks (the packed sm90ws forward
    splits); the real ffi module's check says so too."""
    q, k, v, _, idx, nums, _ = make_case(Hq=4, Hkv=2, Sq=64, Skv=128, D=64, K=2, pack=True,
                                         seed=1, allow_empty=False)
    q, k, v = (jnp.asarray(x, jnp.bfloat16) for x in (q, k, v))
    kw = dict(q2k_block_nums=nums, sparse_block_size=64, pack_gqa=True, kv_splits=kv_splits)
    for backend in ("auto", "kernel"):
        choice = jsa.which_backend(jsa.block_sparse_attention, q, k, v, idx, backend=backend,
                                   **kw)
        assert choice.backend == "kernel", choice.reason
    for d, blk, r in ((128, 128, 8), (64, 64, 2)):
        assert _ffi_bsa.pack_gqa_unsupported_reason(
            head_dim=d, sparse_block_size=blk, group=r, kv_splits=kv_splits) is None


def test_pack_gqa_runs_on_the_sm90_kernels_only():
    """pack_gqa: the sm90ws forward and the sm90ws (or sm90) backward pack; a pass that
    would run an mma.sync (sm80 / portable) kernel declines with a reason naming it (then
    backend="auto" runs the reference); the kernels' compile keys carry r."""
    from jax_sparse_attn.config import Switches
    from jax_sparse_attn.ffi import bsa as ffi_bsa

    why = ffi_bsa.pack_gqa_unsupported_reason
    kw = dict(head_dim=128, sparse_block_size=128, group=8)
    assert why(**kw, switches=Switches()) is None
    assert why(**kw, switches=Switches(bsa_fwd_impl="sm90ws")) is None
    assert why(**kw, switches=Switches(), causal=True) is None
    assert why(head_dim=64, sparse_block_size=64, group=4,
               switches=Switches(bsa_fwd_impl="sm90ws")) is None
    msg = why(**kw, switches=Switches(bsa_fwd_impl="sm80"))
    assert "mma.sync" in msg and "forward" in msg
    msg = why(**kw, switches=Switches(bsa_bwd_impl="sm80"))
    assert "mma.sync" in msg and "backward" in msg
    assert why(**kw, passes=("fwd",), switches=Switches(bsa_bwd_impl="sm80")) is None
    assert "head_dim=256" in why(head_dim=256, sparse_block_size=128, group=2,
                                 switches=Switches())
    assert "dividing 64" in why(head_dim=128, sparse_block_size=128, group=128,
                                switches=Switches())
    assert "mma.sync" in why(**kw, switches=Switches(kernel_family="portable"))
    sw = Switches()
    assert ffi_bsa.fwd_config("bfloat16", 128, 128, False, sw).pack_gqa == 1
    assert ffi_bsa.fwd_config("bfloat16", 128, 128, False, sw, pack_gqa=8).pack_gqa == 8
    assert ffi_bsa.bwd_config("bfloat16", 64, 64, True, sw, pack_gqa=4).pack_gqa == 4
