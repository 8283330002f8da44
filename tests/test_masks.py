"""Mask / metadata builders vs explicit rules written with loops."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_sparse_attn as jsa
from jax_sparse_attn import masks
from oracle import hstu_dense_mask_oracle, hstu_oracle, x64


def gr_rule(i, j, L, n, c, w):
    """Generative-recommender mask rule from the masks.hstu_target_func docstring."""
    n = min(max(n, 0), L)
    Lh = L - n
    if not (0 <= j < L):
        return False
    ctx = min(c, Lh)  # contextual keys
    if i >= Lh:  # target
        if j == i:
            return True
        if j < ctx:
            return w is None or Lh - c + 1 <= w
        return max(c, 0 if w is None else Lh - w) <= j < Lh
    if i < c:  # contextual
        return j < Lh
    if j < ctx:
        return w is None or i - c + 1 <= w
    return (c if w is None else max(c, i - w)) <= j <= i


def gr_rule_ids(i, j, L, n, c, w):
    """The same mask in the position-id form of generative-recommenders' reference
    (causal): contextual positions share id 0, history positions follow (``p - c + 1``),
    targets share the id after the history's; a query sees a key whose id is lower and
    within ``w`` of its own, itself, and a contextual query every non-target key."""
    n = min(max(n, 0), L)
    if not (0 <= j < L):
        return False

    def pid(p):
        q = max(p - c + 1, 0) if c > 0 else p
        return min(q, L - n - c + 1 if c > 0 else L - n)

    top = L - n - c + 1 if c > 0 else L - n  # the targets' id
    dist = pid(i) - pid(j)
    ok = (i == j or dist > 0) and (w is None or dist <= w)
    if c > 0 and pid(i) == 0 and pid(j) < top:
        ok = True
    return ok


@pytest.mark.parametrize("seed", range(4))
def test_gr_rule_is_the_position_id_rule(seed):
    """The docstring rule equals the position-id formulation on random lengths, target
    counts, contextual lengths and windows (history at least as long as the contextual
    part, as in the generative-recommenders setting)."""
    rng = np.random.default_rng(seed)
    for _ in range(60):
        L = int(rng.integers(1, 14))
        n = int(rng.integers(0, L))
        c = int(rng.integers(0, L - n + 1))
        w = None if rng.random() < 0.3 else int(rng.integers(1, 8))
        for i in range(L):
            for j in range(L):
                assert gr_rule(i, j, L, n, c, w) == gr_rule_ids(i, j, L, n, c, w), (
                    L, n, c, w, i, j)


@pytest.mark.parametrize("num_targets,c,w", [
    (None, 0, None), ([2, 0, 3, 1], 0, None), ([2, 0, 3, 9], 2, None),
    ([1, 1, 0, 2], 0, 3), (None, 3, 2), ([3, 0, 2, 1], 1, 4), ([1, 0, 2, 1], 3, 2),
    ([2, 0, 1, 0], 2, 1),
])
def test_hstu_target_func_matches_rule(num_targets, c, w):
    lengths = [6, 0, 9, 4]
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    T = int(cu[-1])
    nt = None if num_targets is None else jnp.asarray(num_targets, jnp.int32)
    func = jax.jit(masks.hstu_target_func, static_argnums=1,
                   static_argnames=("contextual_seq_len", "max_attn_len"))(
        jnp.asarray(cu), T, num_targets=nt, contextual_seq_len=c, max_attn_len=w)
    assert func.dtype == jnp.int32 and func.shape == (1, 3 if nt is None else 5, T + 256)
    dense = np.asarray(masks.hstu_func_to_dense(func, cu, cu, 9, 9))
    via_oracle = hstu_dense_mask_oracle(cu, cu, 9, 9, (-1, -1), np.asarray(func))
    want = np.zeros_like(dense)
    for b, L in enumerate(lengths):
        n = 0 if num_targets is None else num_targets[b]
        for i in range(L):
            for j in range(L):
                want[b, i, j] = gr_rule(i, j, L, n, c, w)
    np.testing.assert_array_equal(dense, want)
    np.testing.assert_array_equal(via_oracle, want)
    assert np.all(np.asarray(func)[0, :, T:] == 0)  # rows past the sequences see nothing


def test_hstu_target_func_plain_is_causal_and_attention_agrees():
    lengths = [5, 0, 11]
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    rng = np.random.default_rng(0)
    T, H, D = int(cu[-1]), 2, 4
    q, k, v = (rng.standard_normal((T, H, D)) for _ in range(3))
    with x64():
        func = masks.hstu_target_func(jnp.asarray(cu), T)
        a = jsa.hstu_attention(*(jnp.asarray(x) for x in (q, k, v, cu, cu)), max_seqlen_q=11,
                               max_seqlen_k=11, window_size=(-1, -1), func=func, backend="reference")
        b = jsa.hstu_attention(*(jnp.asarray(x) for x in (q, k, v, cu, cu)), max_seqlen_q=11,
                               max_seqlen_k=11, window_size=(-1, 0), backend="reference")
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-13, atol=1e-15)
    # with targets, the op equals the oracle on the func
    with x64():
        func = masks.hstu_target_func(jnp.asarray(cu), T, num_targets=jnp.asarray([2, 0, 4]),
                                      contextual_seq_len=1, max_attn_len=3)
        out = jsa.hstu_attention(*(jnp.asarray(x) for x in (q, k, v, cu, cu)), max_seqlen_q=11,
                                 max_seqlen_k=11, window_size=(-1, -1), func=func, backend="reference")
    want = hstu_oracle(q, k, v, cu, cu, max_seqlen_q=11, window_size=(-1, -1), func=np.asarray(func))
    np.testing.assert_allclose(np.asarray(out), want, rtol=1e-10, atol=1e-12)


def test_hstu_target_func_bad_args():
    cu = jnp.asarray([0, 3], jnp.int32)
    with pytest.raises(ValueError, match="func_len"):
        masks.hstu_target_func(cu, 3, func_len=10)
    with pytest.raises(ValueError, match="contextual_seq_len"):
        masks.hstu_target_func(cu, 3, contextual_seq_len=-1)


def test_hstu_target_func_refuses_cu_seqlens_outside_int32_instead_of_wrapping():
    """NumPy int64 cu_seqlens went through jnp.asarray, which (without x64) wraps them into
    int32 before the function's own checks: [0, 3, 2**32 + 5] became [0, 3, 5] and passed
    with total_len=10 (a mask of other sequences, silently). Values outside int32 (also as
    a list, and num_targets) raise a ValueError naming the argument; int64 values inside
    int32 are unchanged."""
    big = 2**32 + 5
    for cu in (np.array([0, 3, big], np.int64), [0, 3, big], np.array([0, 3, 2**31], np.int64)):
        with pytest.raises(ValueError, match=r"cu_seqlens must hold int32 values.*\[0, "):
            masks.hstu_target_func(cu, 10)
    cu = np.array([0, 3, 5], np.int64)
    with pytest.raises(ValueError, match=r"num_targets must hold int32 values"):
        masks.hstu_target_func(cu, 10, num_targets=np.array([1, big], np.int64))
    want = masks.hstu_target_func(jnp.asarray(cu, jnp.int32), 10, num_targets=[1, 2])
    got = masks.hstu_target_func(cu, 10, num_targets=np.array([1, 2], np.int64))
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_block_mask_to_index_roundtrip():
    rng = np.random.default_rng(1)
    mask = rng.random((2, 3, 4, 6)) < 0.4
    mask[0, 0, 0] = False  # an empty row
    index, nums = jax.jit(masks.block_mask_to_index)(jnp.asarray(mask))
    index, nums = np.asarray(index), np.asarray(nums)
    assert index.shape == (2, 3, 4, 6) and index.dtype == np.int32
    for b, h, m in np.ndindex(2, 3, 4):
        want = [n for n in range(6) if mask[b, h, m, n]]
        assert nums[b, h, m] == len(want)
        assert list(index[b, h, m, : len(want)]) == want
    jsa.validate_bsa_metadata(jnp.zeros((2, 3, 4 * 64, 8)), jnp.zeros((2, 3, 6 * 64, 8)),
                              jnp.zeros((2, 3, 6 * 64, 8)), index, q2k_block_nums=nums,
                              sparse_block_size=64, allow_empty_block_nums=True)
    # max_blocks truncates to the lowest ids
    idx2, nums2 = masks.block_mask_to_index(jnp.asarray(mask), max_blocks=2)
    assert np.asarray(idx2).shape == (2, 3, 4, 2)
    np.testing.assert_array_equal(np.asarray(nums2), np.minimum(nums, 2))
    np.testing.assert_array_equal(np.asarray(idx2), index[..., :2])


def test_block_mask_to_index_matches_dense_attention():
    rng = np.random.default_rng(2)
    B, H, S, D, blk = 1, 2, 128, 8, 64
    mask = rng.random((B, H, 2, 2)) < 0.7
    mask[..., 0] = True
    q, k, v = (rng.standard_normal((B, H, S, D)) for _ in range(3))
    with x64():
        index, nums = masks.block_mask_to_index(jnp.asarray(mask))
        out = jsa.block_sparse_attention(*(jnp.asarray(x) for x in (q, k, v)), index,
                                         q2k_block_nums=nums, sparse_block_size=blk,
                                         backend="reference")
    tok = np.repeat(np.repeat(mask, blk, axis=2), blk, axis=3)
    s = np.einsum("bhqd,bhkd->bhqk", q, k) / np.sqrt(D)
    s = np.where(tok, s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    np.testing.assert_allclose(np.asarray(out), p @ v, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("causal", [False, True])
def test_topk_block_index(causal):
    rng = np.random.default_rng(3)
    B, Hq, Hkv, Sq, Skv, D, blk, top_k = 1, 4, 2, 200, 300, 8, 64, 2
    q = rng.standard_normal((B, Hq, Sq, D)).astype(np.float32)
    k = rng.standard_normal((B, Hkv, Skv, D)).astype(np.float32)
    index, nums = masks.topk_block_index(jnp.asarray(q), jnp.asarray(k), top_k,
                                         sparse_block_size=blk, causal=causal)
    index, nums = np.asarray(index), np.asarray(nums)
    Nq, Nkv = 4, 5
    assert index.shape == (B, Hq, Nq, top_k) and nums.shape == (B, Hq, Nq)
    for h in range(Hq):
        for m in range(Nq):
            qm = q[0, h, m * blk: (m + 1) * blk].mean(0)
            # the block of the last key the block's last query row sees (bottom-right)
            d = (min((m + 1) * blk, Sq) - 1 + Skv - Sq) // blk
            scores = []
            for n in range(Nkv):
                if causal and n > d:
                    continue
                kn = k[0, h // 2, n * blk: (n + 1) * blk].mean(0)
                diag = causal and n == d
                scores.append((np.inf if diag else float(qm @ kn), n))
            best = [n for _, n in sorted(scores, reverse=True)[:top_k]]
            assert nums[0, h, m] == len(best)
            assert list(index[0, h, m, : len(best)]) == best
    # bshd gives the same lists
    i2, n2 = masks.topk_block_index(jnp.asarray(q).swapaxes(1, 2), jnp.asarray(k).swapaxes(1, 2),
                                    top_k, sparse_block_size=blk, layout="bshd", causal=causal)
    np.testing.assert_array_equal(np.asarray(i2), index)
    np.testing.assert_array_equal(np.asarray(n2), nums)


def test_transpose_block_index():
    rng = np.random.default_rng(4)
    B, H, Nq, K, Nkv = 2, 2, 5, 3, 4
    idx = rng.integers(-3, 9, size=(B, H, Nq, K)).astype(np.int32)  # garbage everywhere
    nums = rng.integers(0, K + 1, size=(B, H, Nq)).astype(np.int32)
    for b, h, m in np.ndindex(B, H, Nq):
        idx[b, h, m, : nums[b, h, m]] = rng.permutation(Nkv)[: nums[b, h, m]]
    indptr, k2q = jax.jit(masks.transpose_block_index, static_argnums=2)(
        jnp.asarray(idx), jnp.asarray(nums), Nkv)
    indptr, k2q = np.asarray(indptr), np.asarray(k2q)
    assert indptr.shape == (B, H, Nkv + 1) and k2q.shape == (B, H, Nq * K)
    for b, h in np.ndindex(B, H):
        lists = {n: [] for n in range(Nkv)}
        for m in range(Nq):
            for t in range(nums[b, h, m]):
                lists[int(idx[b, h, m, t])].append(m)
        assert indptr[b, h, 0] == 0
        for n in range(Nkv):
            got = list(k2q[b, h, indptr[b, h, n]: indptr[b, h, n + 1]])
            assert got == sorted(lists[n])
        assert np.all(k2q[b, h, indptr[b, h, -1]:] == -1)


@pytest.mark.parametrize("shape", [(2, 4, 2, 7, 9, 5), (1, 8, 1, 3, 4, 6), (2, 2, 2, 1, 1, 3),
                                   (1, 4, 4, 5, 0, 2), (1, 2, 1, 0, 3, 2)],
                         ids=["gqa2", "gqa8", "one-block", "no-kv-blocks", "no-q-blocks"])
def test_build_kq_csr_dense_constructions(shape):
    """The K->Q lists of ``metadata.build_kq_csr`` (a bitmap in the CSR rows' order packed
    into words, slots placed by popcounts: the backward's construction) equal a numpy oracle,
    the same bitmap with a running count per row (``_kq_csr_dense_rows``, kept for
    ``scripts/kq_csr_ab.py``) and the transposed-bitmap construction of the deterministic
    path: per (batch, KV head, KV block) the ascending ``h_in_group * N_q +
    m`` that list it, repeated ids once, inactive and out-of-range slots skipped, unused
    entry slots 0."""
    from jax_sparse_attn import metadata

    b, hq, hkv, nq, nkv, k = shape
    rng = np.random.default_rng(sum(shape))
    idx = rng.integers(-2, nkv + 2, size=(b, hq, nq, k)).astype(np.int32)  # repeats, garbage
    nums = rng.integers(-1, k + 2, size=(b, hq, nq)).astype(np.int32)
    active = (np.arange(k) < nums[..., None]) & (idx >= 0) & (idx < nkv)
    g = hq // hkv
    off, ent = [0], []
    for bb, gg, n in np.ndindex(b, hkv, nkv):
        row = sorted({hh * nq + m for hh in range(g) for m in range(nq)
                      if np.any(active[bb, gg * g + hh, m] & (idx[bb, gg * g + hh, m] == n))})
        ent += row
        off.append(off[-1] + len(row))
    got = metadata.build_kq_csr(jnp.asarray(idx), jnp.asarray(nums), num_kv_heads=hkv,
                                num_kv_blocks=nkv)
    old = metadata._kq_csr_dense(jnp.asarray(idx), jnp.asarray(active), g, hkv, nkv, False)
    rows = metadata._kq_csr_dense_rows(jnp.asarray(idx), jnp.asarray(active), g, hkv, nkv)
    for o, e in (got, old, rows):
        o, e = np.asarray(o), np.asarray(e)
        np.testing.assert_array_equal(o, off)
        np.testing.assert_array_equal(e[: off[-1]], ent)
        assert e.shape == (b * hq * nq * k,) and np.all(e[off[-1]:] == 0)


def test_topk_block_index_bad_args():
    q = jnp.zeros((1, 2, 200, 8))
    with pytest.raises(ValueError, match=r"top_k must be >= 1, got 0"):
        masks.topk_block_index(q, q, 0, sparse_block_size=64)
    with pytest.raises(ValueError, match=r"sparse_block_size must be one of \(64, 128\), got 96"):
        masks.topk_block_index(q, q, 2, sparse_block_size=96)
    with pytest.raises(ValueError, match=r"H_q=3 must be a multiple of H_kv=2"):
        masks.topk_block_index(jnp.zeros((1, 3, 200, 8)), q, 2)
    for bad in ("64", 64.0):
        with pytest.raises(TypeError, match="sparse_block_size must be a static Python int"):
            masks.topk_block_index(q, q, 2, sparse_block_size=bad)
    for name in ("causal", "pack_gqa"):
        with pytest.raises(TypeError, match=f"{name} must be a bool"):
            masks.topk_block_index(q, q, 2, sparse_block_size=64, **{name: "false"})


def test_topk_block_index_nan_scores_rank_last_and_keep_the_diagonal():
    """A NaN in a key block makes its score NaN: it ranks below every finite score (after the
    finite blocks, before nothing that is excluded), and with ``causal`` the diagonal block
    is still listed first."""
    rng = np.random.default_rng(5)
    q = rng.standard_normal((1, 1, 256, 8)).astype(np.float32)
    k = rng.standard_normal((1, 1, 256, 8)).astype(np.float32)
    k[0, 0, 70] = np.nan  # key block 1 of 4 (blk 64)
    idx, nums = masks.topk_block_index(q, k, 4, sparse_block_size=64)
    idx = np.asarray(idx)
    assert (np.asarray(nums) == 4).all()
    assert (idx[0, 0, :, 3] == 1).all() and all(sorted(r) == [0, 1, 2, 3] for r in idx[0, 0])
    idx, nums = masks.topk_block_index(q, k, 1, sparse_block_size=64, causal=True)
    np.testing.assert_array_equal(np.asarray(idx)[0, 0, :, 0], [0, 1, 2, 3])
    idx, nums = masks.topk_block_index(q, k, 4, sparse_block_size=64, causal=True)
    idx, nums = np.asarray(idx)[0, 0], np.asarray(nums)[0, 0]
    np.testing.assert_array_equal(nums, [1, 2, 3, 4])
    for m in range(4):
        row = list(idx[m, :nums[m]])
        assert row[0] == m and sorted(row) == list(range(m + 1))
        if m > 1:
            assert row[-1] == 1  # the NaN block after the finite ones


def test_topk_block_index_causal_more_q_than_kv_blocks():
    # N_q = 4 > N_kv = 2: query blocks 0 and 1 have no diagonal KV block -> count 0
    rng = np.random.default_rng(5)
    q = jnp.asarray(rng.standard_normal((1, 1, 256, 8)), jnp.float32)
    k = jnp.asarray(rng.standard_normal((1, 1, 128, 8)), jnp.float32)
    index, nums = masks.topk_block_index(q, k, 2, sparse_block_size=64, causal=True)
    np.testing.assert_array_equal(np.asarray(nums)[0, 0], [0, 0, 1, 2])
    assert int(index[0, 0, 2, 0]) == 0 and sorted(np.asarray(index)[0, 0, 3].tolist()) == [0, 1]
    assert int(index[0, 0, 3, 0]) == 1  # the diagonal block comes first


def test_topk_block_index_causal_is_token_exact_packed_or_not():
    """The causal diagonal is the block of the last key the block's last query row sees,
    packed (r = 1) or not: S_q = 129, S_kv = 130 at blk 64 lists blocks up to 1, 2, 2."""
    rng = np.random.default_rng(6)
    q = jnp.asarray(rng.standard_normal((1, 2, 129, 8)), jnp.float32)
    k = jnp.asarray(rng.standard_normal((1, 2, 130, 8)), jnp.float32)
    i0, n0 = masks.topk_block_index(q, k, 3, sparse_block_size=64, causal=True)
    i1, n1 = masks.topk_block_index(q, k, 3, sparse_block_size=64, causal=True, pack_gqa=True)
    np.testing.assert_array_equal(np.asarray(n0)[0, 0], [2, 3, 3])
    np.testing.assert_array_equal(np.asarray(n0), np.asarray(n1))
    np.testing.assert_array_equal(np.asarray(i0)[..., 0], np.asarray(i1)[..., 0])
    np.testing.assert_array_equal(np.asarray(i0)[0, 0, :, 0], [1, 2, 2])  # diagonal first


def test_transpose_block_index_refuses_values_past_int32_instead_of_wrapping():
    """int64 block ids or counts past int32 were cast to int32 and wrapped into valid
    values (2**32 + 1 became block 1 / count 1): a ValueError naming the argument."""
    nums = np.ones((1, 1, 1), np.int32)
    with pytest.raises(ValueError, match=r"q2k_block_index must hold int32 values.*4294967297"):
        masks.transpose_block_index(np.array([[[[2**32 + 1]]]], np.int64), nums, 3)
    with pytest.raises(ValueError, match=r"q2k_block_nums must hold int32 values"):
        masks.transpose_block_index(np.zeros((1, 1, 1, 1), np.int32),
                                    np.array([[[2**32 + 1]]], np.int64), 3)
    # a Python list past int32 too (it overflowed in jnp.asarray)
    with pytest.raises(ValueError, match=r"q2k_block_index must hold int32 values"):
        masks.transpose_block_index([[[[2**32 + 1]]]], nums, 3)
    # traced (jit) metadata are int32 already and not read
    ptr, _ = jax.jit(lambda i, n: masks.transpose_block_index(i, n, 3))(
        jnp.ones((1, 1, 1, 1), jnp.int32), jnp.ones((1, 1, 1), jnp.int32))
    assert np.asarray(ptr).tolist() == [[[0, 0, 1, 1]]]
    # in range, int64 is taken (and out-of-range ids within int32 are ignored, as documented)
    ptr, ent = masks.transpose_block_index(np.array([[[[1], [7]]]], np.int64),
                                           np.ones((1, 1, 2), np.int64), 3)
    assert np.asarray(ptr).tolist() == [[[0, 0, 1, 1]]]
    assert np.asarray(ent).tolist() == [[[0, -1]]]


def test_func_helpers_reject_bad_inputs():
    """func_interval_mask needs an odd number of endpoints (F_0, then pairs); an even one
    dropped the unpaired endpoint. hstu_func_to_dense checks func's rank / dtype / N, the
    offsets' rank and a max_seqlen shorter than a sequence (which cut the mask)."""
    with pytest.raises(ValueError, match=r"endpoints must have an odd leading size N.*\(2, 3\)"):
        masks.func_interval_mask(jnp.zeros((2, 3), jnp.int32), jnp.arange(4))
    cu = jnp.array([0, 2, 5], jnp.int32)
    with pytest.raises(ValueError, match=r"func must have rank 3"):
        masks.hstu_func_to_dense(jnp.zeros((3, 5), jnp.int32), cu, cu, 3, 3)
    with pytest.raises(TypeError, match=r"func must be an integer"):
        masks.hstu_func_to_dense(jnp.zeros((1, 3, 5), jnp.float32), cu, cu, 3, 3)
    with pytest.raises(ValueError, match=r"func must have shape \(1, N, T_q\) with N odd"):
        masks.hstu_func_to_dense(jnp.zeros((1, 2, 5), jnp.int32), cu, cu, 3, 3)
    with pytest.raises(ValueError, match=r"cu_seqlens_q must have rank 1"):
        masks.hstu_func_to_dense(jnp.zeros((1, 3, 5), jnp.int32), cu[None], cu[None], 3, 3)
    with pytest.raises(ValueError, match=r"max_seqlen_k=2 is smaller than sequence 1's "
                                         r"length 3 \(from cu_seqlens_k\)"):
        masks.hstu_func_to_dense(jnp.zeros((1, 3, 5), jnp.int32), cu, cu, 3, 2)
    with pytest.raises(ValueError, match=r"cu_seqlens_q must be non-decreasing"):
        masks.hstu_func_to_dense(jnp.zeros((1, 3, 5), jnp.int32), jnp.array([0, 5, 2]), cu, 5, 5)
    with pytest.raises(ValueError, match=r"cu_seqlens_q must have B\+1 >= 1 entries"):
        masks.hstu_func_to_dense(jnp.zeros((1, 3, 5), jnp.int32), jnp.zeros((0,), jnp.int32),
                                 jnp.zeros((0,), jnp.int32), 3, 3)
    # values past int32 (numpy int64 or Python ints) are refused, not wrapped
    with pytest.raises(ValueError, match=r"cu_seqlens_q must hold int32 values"):
        masks.hstu_func_to_dense(jnp.zeros((1, 3, 5), jnp.int32),
                                 np.array([0, 2**32 + 2, 2**32 + 5]), cu, 3, 3)
    with pytest.raises(ValueError, match=r"func must hold int32 values"):
        masks.hstu_func_to_dense([[[2**32 + 1] * 5] * 3], cu, cu, 3, 3)
    # traced offsets (jit) are not read
    traced = jax.jit(lambda c: masks.hstu_func_to_dense(jnp.zeros((1, 3, 5), jnp.int32), c, c,
                                                        3, 3))(cu)
    assert traced.shape == (2, 3, 3)
    # every key of each sequence (F_0 past the lengths): the masks are the sequences' squares
    dense = np.asarray(masks.hstu_func_to_dense(jnp.full((1, 1, 5), 9, jnp.int32), cu, cu, 3, 3))
    want = np.zeros((2, 3, 3), bool)
    want[0, :2, :2] = True
    want[1] = True
    np.testing.assert_array_equal(dense, want)


def test_mask_builders_reject_bad_inputs():
    """Concrete cu_seqlens are checked by hstu_target_func (start at 0, non-decreasing, within
    total_len); block_mask_to_index takes rank-4 bool / integer masks; topk_block_index takes
    floating q / k. Each error names the argument."""
    with pytest.raises(ValueError, match="cu_seqlens must start at 0 and be non-decreasing"):
        masks.hstu_target_func(np.array([0, 7, 5]), 12)
    with pytest.raises(ValueError, match="cu_seqlens must start at 0"):
        masks.hstu_target_func(np.array([3, 7, 12]), 12)
    with pytest.raises(ValueError, match="exceeds total_len=5"):
        masks.hstu_target_func(np.array([0, 5, 12], np.int32), 5, func_len=268)
    # traced cu_seqlens are not read
    f = jax.jit(lambda cu: masks.hstu_target_func(cu, 12))(jnp.array([0, 5, 12], jnp.int32))
    assert f.shape == (1, 3, 268)
    with pytest.raises(ValueError, match="block_mask must have rank 4"):
        masks.block_mask_to_index(np.ones((2, 3, 4), bool))
    with pytest.raises(TypeError, match="block_mask must be a bool"):
        masks.block_mask_to_index(np.array([[[[0.5, 0.0, -1.0]]]], np.float32))
    idx, nums = masks.block_mask_to_index(np.array([[[[0, 3, 1]]]], np.int32))
    assert np.asarray(nums).tolist() == [[[2]]] and np.asarray(idx)[0, 0, 0, :2].tolist() == [1, 2]
    with pytest.raises(TypeError, match="q must be a floating-point array"):
        masks.topk_block_index(np.ones((1, 2, 128, 8), np.int32),
                               np.ones((1, 2, 128, 8), np.float32), 1, sparse_block_size=64)
