"""GPU: the one-launch K->Q list kernel of the block-sparse backward
(``kernels/bsa_kq_lists.py``, switch ``bsa_kq_impl="kernel"``, the default) against
``metadata.build_kq_csr`` of the metadata clamped by ``sanitize_bsa_metadata`` (offsets
and every entry slot equal, bit for bit; the slots past the lists zero in both), over chain counts below, at and above the cluster's eight CTAs,
GQA groups, rows longer than a bitmap word and more rows than the cluster has threads,
ragged and empty rows, every block listed, and garbage metadata (ids outside
``[0, N_kv)``, which are clipped into it, counts outside ``[0, K_max]``, repeated ids,
arbitrary values past the counts); then the backward with the kernel's lists against the one with
XLA's (dK / dV bitwise equal: each KV block's CTA walks the same list). With
``bsa_kq_impl="items"`` the same launch computes the bucket split's work items:
``metadata.kq_bucket_items_reference`` of the lists bit for bit (rows split, chains kept
whole past ``max_extra``, unused items), and the backward on them equals the one on XLA's
items (dK / dV bitwise).

Run on the H200: ``python -m pytest -m gpu tests/test_gpu_kq_lists.py``; the whole
block-sparse grid runs the kernel's lists by default, XLA's with ``BSA_TEST_IMPLS=kqxla``.
"""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

from jax_sparse_attn import metadata  # noqa: E402

pytestmark = pytest.mark.gpu

#: name, b, h_q, h_kv, n_q, n_kv, k_max, metadata kind
CASES = [
    ("blk64-bench-like", 1, 16, 16, 256, 256, 32, "fixed"),
    ("one-chain-all-listed", 1, 1, 1, 64, 64, 64, "fixed"),
    ("gqa8-ragged", 2, 16, 2, 64, 100, 20, "ragged"),
    ("many-chains-empty-rows", 3, 12, 12, 17, 33, 5, "empty"),
    ("more-rows-than-threads", 2, 16, 16, 64, 300, 12, "ragged"),
    ("wide-rows-gqa8", 1, 16, 2, 200, 60, 6, "ragged"),
    ("garbage", 2, 6, 3, 23, 19, 8, "garbage"),
    ("repeated-ids", 2, 4, 2, 30, 12, 10, "repeated"),
    ("s32768-blk64", 1, 16, 16, 512, 512, 64, "fixed"),
    ("single-query-block", 1, 4, 1, 1, 7, 7, "ragged"),
    ("long-chain", 1, 2, 1, 16, 1100, 8, "ragged"),
]


def _metadata(case, seed):
    name, b, h_q, h_kv, n_q, n_kv, k_max, kind = case
    rng = np.random.default_rng(seed)
    k_used = min(k_max, n_kv)
    idx = np.argsort(rng.random((b, h_q, n_q, n_kv)), axis=-1)[..., :k_used]
    if k_used < k_max:
        idx = np.concatenate([idx, rng.integers(0, n_kv, (b, h_q, n_q, k_max - k_used))], -1)
    nums = np.full((b, h_q, n_q), k_used)
    if kind in ("ragged", "empty", "garbage", "repeated"):
        nums = rng.integers(0, k_used + 1, (b, h_q, n_q))
    if kind == "empty":
        nums[:, :, ::3] = 0
    # values past each row's count are garbage: they must be skipped
    j = np.arange(k_max)
    past = j[None, None, None, :] >= nums[..., None]
    idx = np.where(past, rng.integers(-5, n_kv + 5, idx.shape), idx)
    if kind == "garbage":
        idx = np.where(rng.random(idx.shape) < 0.2, rng.integers(-9, 2 * n_kv, idx.shape), idx)
        nums = rng.integers(-3, k_max + 4, (b, h_q, n_q))
    if kind == "repeated":
        idx[..., 1::2] = idx[..., 0::2][..., : idx[..., 1::2].shape[-1]]
    return jnp.asarray(idx, jnp.int32), jnp.asarray(nums, jnp.int32)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_kq_lists_kernel_matches_build_kq_csr(case):
    from jax_sparse_attn.ffi import bsa as fb

    _, b, h_q, h_kv, n_q, n_kv, k_max, _ = case
    assert fb.kq_config((b, h_q, n_q, k_max), h_kv, n_kv) is not None, "not a kernel case"
    assert b * h_q * n_q * n_kv <= metadata._DENSE_CSR_MAX_ELEMS  # XLA's bitmap lists
    lists = jax.jit(lambda i, n: fb.kq_lists(i, n, num_kv_heads=h_kv, num_kv_blocks=n_kv))
    for seed in (0, 1):
        idx, nums = _metadata(case, seed)
        # the definition: build_kq_csr (XLA) of the metadata clamped as the backward clamps
        # them; the kernel reads the raw metadata (and clamps) or the clamped ones
        si, sn, _ = metadata.sanitize_bsa_metadata(idx, nums, None, num_kv_blocks=n_kv,
                                                   block_size=64)
        want = jax.jit(lambda i, n: metadata.build_kq_csr(
            i, n, num_kv_heads=h_kv, num_kv_blocks=n_kv))(si, sn)
        off_w, ent_w = (np.asarray(x) for x in want)
        for got in (lists(idx, nums), lists(si, sn), lists(idx, nums)):
            # (the third call writes into buffers that held the first call's lists)
            off_g, ent_g = (np.asarray(x) for x in got)
            assert off_g.shape == off_w.shape and ent_g.shape == ent_w.shape
            np.testing.assert_array_equal(off_g, off_w)
            np.testing.assert_array_equal(ent_g, ent_w)
        if case[-1] == "fixed":
            assert int(off_w[-1]) == b * h_q * n_q * k_max  # every slot listed


def _compare_backwards(blk, h_q, h_kv, s, idx, nums, impls):
    """The public backward (B 1, D 128, bf16, ``S = s``) on fresh random inputs with
    ``bsa_kq_impl`` ``impls[0]`` against ``impls[1]``: dK and dV bitwise equal (the same
    lists and work items, walked in the same order), dQ within fp32 reordering of its
    additions, everything finite and dK not all zero."""
    import jax_sparse_attn as jsa
    from jax_sparse_attn.config import Switches

    b, d = 1, 128
    ks = jax.random.split(jax.random.PRNGKey(blk + h_kv), 4)
    q = jax.random.normal(ks[0], (b, h_q, s, d), jnp.bfloat16)
    k = jax.random.normal(ks[1], (b, h_kv, s, d), jnp.bfloat16)
    v = jax.random.normal(ks[2], (b, h_kv, s, d), jnp.bfloat16)
    do = jax.random.normal(ks[3], (b, h_q, s, d), jnp.bfloat16)
    kw = dict(layout="bhsd", sparse_block_size=blk, softmax_scale=d ** -0.5, backend="kernel",
              allow_empty_block_nums=True)
    out, lse = jax.jit(lambda q, k, v: jsa.block_sparse_attention_forward(
        q, k, v, idx, None, None, nums, **kw))(q, k, v)
    res = {}
    for kq in impls:
        f = jax.jit(lambda do, q, k, v, o, l, kq=kq: jsa.block_sparse_attention_backward(
            do, q, k, v, o, l, idx, None, None, nums, **kw,
            switches=Switches(bsa_kq_impl=kq)))
        res[kq] = [np.asarray(x, np.float32) for x in f(do, q, k, v, out, lse)]
    for name, x, y in zip(("dq", "dk", "dv"), res[impls[0]], res[impls[1]]):
        assert np.isfinite(y).all(), name
        if name == "dq":
            np.testing.assert_allclose(y, x, rtol=2e-2, atol=2e-2 * np.abs(x).max())
        else:
            np.testing.assert_array_equal(y, x)
    assert np.abs(res[impls[1]][1]).max() > 0


@pytest.mark.parametrize("blk,h_q,h_kv", [(128, 8, 8), (64, 8, 2)])
def test_backward_with_kernel_lists(blk, h_q, h_kv):
    """The public backward with ``bsa_kq_impl="kernel"`` (the default) against XLA's lists
    (:func:`_compare_backwards`)."""
    s = 2048
    n = s // blk
    rng = np.random.default_rng(blk)
    idx = jnp.asarray(np.argsort(rng.random((1, h_q, n, n)), -1)[..., : n // 4], jnp.int32)
    nums = jnp.asarray(rng.integers(0, n // 4 + 1, (1, h_q, n)), jnp.int32)
    _compare_backwards(blk, h_q, h_kv, s, idx, nums, ("xla", "kernel"))


#: case name, bucket_entries, max_extra
ITEM_CASES = [("blk64-bench-like", 64, 12), ("one-chain-all-listed", 16, 192),
              ("one-chain-all-listed", 16, 2), ("gqa8-ragged", 64, 40), ("gqa8-ragged", 8, 40),
              ("many-chains-empty-rows", 2, 30), ("more-rows-than-threads", 4, 200),
              ("wide-rows-gqa8", 30, 0), ("garbage", 3, 25), ("s32768-blk64", 128, 24),
              ("single-query-block", 1, 3), ("many-chains-empty-rows", 2, 4),
              ("long-chain", 1, 900)]


@pytest.mark.parametrize("name,n_b,extra", ITEM_CASES,
                         ids=[f"{c[0]}-n{c[1]}-x{c[2]}" for c in ITEM_CASES])
def test_kq_items_kernel_matches_definition(name, n_b, extra):
    """The list launch with the work items: the offsets and entries as without them, the
    items ``kq_bucket_items_reference`` of the offsets, bit for bit (with the first
    list entry of every query row set to KV block 0, so that row 0 of each chain is long)."""
    from jax_sparse_attn.ffi import bsa as fb

    case = next(c for c in CASES if c[0] == name)
    _, b, h_q, h_kv, n_q, n_kv, k_max, _ = case
    assert fb.kq_config((b, h_q, n_q, k_max), h_kv, n_kv, n_b, extra).bucket_entries == n_b
    n_rows = b * h_kv * n_kv
    f = jax.jit(lambda i, n: fb.kq_lists(i, n, num_kv_heads=h_kv, num_kv_blocks=n_kv,
                                         bucket_entries=n_b, max_extra=extra,
                                         kernel_items=True))
    plain = jax.jit(lambda i, n: fb.kq_lists(i, n, num_kv_heads=h_kv, num_kv_blocks=n_kv))
    for seed in (0, 1):
        idx, nums = _metadata(case, seed)
        idx = idx.at[..., 0].set(0)
        off_p, ent_p = (np.asarray(x) for x in plain(idx, nums))
        for _ in range(2):
            off, ent = (np.asarray(x) for x in f(idx, nums))
            np.testing.assert_array_equal(off[:n_rows + 1], off_p)
            np.testing.assert_array_equal(ent, ent_p)
            want = metadata.kq_bucket_items_reference(off_p, num_kv_blocks=n_kv,
                                                      bucket_entries=n_b, max_extra=extra)
            np.testing.assert_array_equal(off[n_rows + 1:].reshape(want.shape), want)


@pytest.mark.parametrize("blk,h_q,h_kv,hot", [(128, 8, 8, False), (64, 8, 2, True),
                                              (64, 32, 16, True)])
def test_backward_with_kernel_items(blk, h_q, h_kv, hot):
    """The public backward (bucket split, the default) with ``bsa_kq_impl="items"`` against
    ``"kernel"`` (XLA's items), :func:`_compare_backwards`; ``hot``: KV block 0 in every
    list, so its K->Q list is split."""
    s = 4096
    n = s // blk
    rng = np.random.default_rng(blk + h_kv)
    if hot:
        # Block 0 first, then distinct blocks drawn from 1..n-1 (active indices are unique).
        rest = 1 + np.argsort(rng.random((1, h_q, n, n - 1)), -1)[..., : n // 4 - 1]
        idx = np.concatenate([np.zeros((1, h_q, n, 1), rest.dtype), np.sort(rest, -1)], -1)
    else:
        idx = np.argsort(rng.random((1, h_q, n, n)), -1)[..., : n // 4]
    idx = jnp.asarray(idx, jnp.int32)
    nums = jnp.asarray(rng.integers(1, n // 4 + 1, (1, h_q, n)), jnp.int32)
    _compare_backwards(blk, h_q, h_kv, s, idx, nums, ("kernel", "items"))
