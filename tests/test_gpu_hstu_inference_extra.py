"""More GPU cases of the HSTU inference paths (paged KV, GQA/MQA, split-KV, contiguous short
queries with bottom-right alignment), with shapes the first GPU tests do not have: histories
of 0, 1, 17, 113, 1023 and 4097 tokens and exact multiples of the page size, users with one
query and users with 64 targets in one batch (also more targets than history: rows before
the first key see nothing), MQA (H_kv = 1) at D = 64 in float16 and D = 256 in bfloat16 with
histories ending on both sides of the 64-key tile edge inside a page, a shared page pool with
spare pages full of NaN and +-Inf, a page shared by two users, garbage page ids after each
user's pages, ``jax.vmap`` of a paged call on the kernel (bit for bit the per-item calls) and
output buffers poisoned by an all-NaN call of the same function first.

Every output is compared with the float32 reference reading the same pages by the project's
rule (kernel error <= 2x the error of the input-dtype reference + a small atol; NaN fails);
rows past ``cu_seqlens_q[-1]`` must be 0.

Run on the H200: ``timeout 120 python3 -m pytest -m gpu -q -rA
tests/test_gpu_hstu_inference_extra.py``.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import jax_sparse_attn as jsa  # noqa: E402
from attention_base import _f32, check_rule  # noqa: E402
from jax_sparse_attn import reference  # noqa: E402
from test_hstu_inference import PAGE, _paged_gpu_inputs, _paged_kernel_fn  # noqa: E402

pytestmark = pytest.mark.gpu

# one query per user and 64 targets per user in one batch; histories around the page and
# tile edges, a zero-length history with a query, more targets than history (17, 113)
MIXED_K = [0, 1, 17, 113, 128, 256, 1023, 4097]
MIXED_Q = [1, 1, 64, 64, 1, 64, 1, 64]


def _poisoned_call(fn, *args):
    """``fn(*args)`` after one call on all-NaN float inputs (same shapes), so buffers XLA
    reuses hold NaN where a kernel leaves an element unwritten."""
    nan = [jnp.full_like(a, jnp.nan) if jnp.issubdtype(a.dtype, jnp.floating) else a
           for a in args]
    jax.block_until_ready(fn(*nan))
    return np.asarray(_f32(fn(*args)))


@functools.lru_cache(maxsize=None)
def _paged_ref_fn(cdt, kw_items):
    """The jitted paged reference for one compute dtype and option set (one compile per
    shapes, shared by the calls of a test)."""
    kw = dict(kw_items)
    return jax.jit(lambda q, kv, i, p, a, b: reference.hstu_attention_ref(
        q, None, None, a, b, None, paged_kv=kv, page_ids=i, page_indptrs=p,
        compute_dtype=cdt, **kw))


def _paged_ref(q, kv, ids, ptr, cu_q, cu_k, kw):
    """(float32 reference, input-dtype reference) of the rows inside sequences."""
    n = int(cu_q[-1])
    items = tuple(sorted(kw.items()))
    return tuple(_paged_ref_fn(cdt, items)(q[:n], kv, ids, ptr, cu_q, cu_k)
                 for cdt in (None, jnp.dtype(kv.dtype)))


def _check(out, truth, base, n, label):
    report = []
    check_rule("out", out[:n], truth, base, 2.0, 2e-3, report)
    assert np.abs(truth).max() > 0
    assert not np.any(out[n:]), "out rows past cu_seqlens_q[-1] are not zero"
    print(f"{label} " + report[0])


def _share_full_page(ids, ptr, lens_k, src, dst, dst_page):
    """Page table where user ``dst``'s page ``dst_page`` is user ``src``'s first (full)
    page: two users read one page."""
    assert lens_k[src] >= PAGE and lens_k[dst] > dst_page * PAGE
    ids = np.asarray(ids).copy()
    ptr = np.asarray(ptr)
    ids[ptr[dst] + dst_page] = ids[ptr[src]]
    return jnp.asarray(ids)


@pytest.mark.parametrize("kv_splits", [1, "auto"])
def test_paged_mixed_users_mqa_fp16_d64(kv_splits):
    """8 users (1-query and 64-target users mixed), MQA 8 -> 1 KV head, float16, D = 64;
    spare pages alternately NaN, +Inf, -Inf; user 7 reads user 6's first page as its
    fourth; ``"auto"`` resolves to 2 splits on the H200 (64 work items, 132 SMs)."""
    q, kv, ids, ptr, cu_q, cu_k = _paged_gpu_inputs(
        MIXED_Q, MIXED_K, 8, 1, 64, seed=113, extra_slots=3, spare_pages=5,
        dtype=jnp.float16, spare_fill=(np.nan, np.inf, -np.inf))
    ids = _share_full_page(ids, ptr, MIXED_K, src=6, dst=7, dst_page=3)
    kw = dict(max_seqlen_q=64, max_seqlen_k=max(MIXED_K), alpha=1.0 / 8)
    fn = _paged_kernel_fn("kernel", kv_splits, **kw)
    out = _poisoned_call(fn, q, kv, ids, ptr, cu_q, cu_k)
    _check(out, *_paged_ref(q, kv, ids, ptr, cu_q, cu_k, kw), int(cu_q[-1]),
           f"paged mqa fp16 d64 kv_splits={kv_splits}")


def test_paged_d256_tile_edges_in_page_split():
    """D = 256 (two 64-key tiles per page) bfloat16, MQA 4 -> 1, 3 KV splits: histories
    ending at 64 / 65 keys into a page (the partial tile is the page's first or second
    half), 0 and 1 keys, one long history; 1 query and 64 targets mixed."""
    lens_k = [64, 65, 192, 193, 1, 0, 4097, 127]
    lens_q = [64, 1, 1, 64, 1, 1, 64, 64]
    q, kv, ids, ptr, cu_q, cu_k = _paged_gpu_inputs(lens_q, lens_k, 4, 1, 256, seed=4097,
                                                    spare_fill=(np.inf, np.nan))
    kw = dict(max_seqlen_q=64, max_seqlen_k=4097, alpha=1.0 / 16, scaling_seqlen=100.0)
    fn = _paged_kernel_fn("kernel", 3, **kw)
    out = _poisoned_call(fn, q, kv, ids, ptr, cu_q, cu_k)
    _check(out, *_paged_ref(q, kv, ids, ptr, cu_q, cu_k, kw), int(cu_q[-1]),
           "paged d256 kv_splits=3")


@pytest.mark.parametrize("cache_mapped", [False, True], ids=["shared-cache", "cache-per-item"])
def test_paged_vmap_kernel_equals_loop(cache_mapped):
    """``jax.vmap`` of the paged kernel call (3 items: mapped queries and page tables, one
    shared cache or a cache per item) gives the per-item calls bit for bit (bf16, D = 128,
    GQA 4 -> 2, one split) and each item is within the rule of the reference."""
    lens_k, lens_q = [1023, 0, 129, 17, 300], [1, 1, 64, 17, 7]
    items = [_paged_gpu_inputs(lens_q, lens_k, 4, 2, 128, seed=17 + s) for s in range(3)]
    if not cache_mapped:
        items = [(it[0],) + items[0][1:] for it in items]  # item 0's cache and table
    kw = dict(max_seqlen_q=64, max_seqlen_k=1023, alpha=0.1)
    fn = _paged_kernel_fn("kernel", 1, **kw)
    axes = (0, 0 if cache_mapped else None, 0, 0, 0, 0)
    args = [jnp.stack([it[i] for it in items]) if a == 0 else items[0][i]
            for i, a in enumerate(axes)]
    out = _poisoned_call(jax.jit(jax.vmap(fn, in_axes=axes)), *args)
    for n, it in enumerate(items):
        np.testing.assert_array_equal(out[n], np.asarray(_f32(fn(*it))), err_msg=f"item {n}")
        _check(out[n], *_paged_ref(*it, kw), int(it[4][-1]), f"paged vmap item {n}")


@pytest.mark.parametrize("window,kv_splits", [((-1, 0), 4), ((200, 0), 16)],
                         ids=["causal-s4", "local200-s16"])
def test_contiguous_targets_mqa_fp16_d64(window, kv_splits):
    """Contiguous short-query forwards: the users of the mixed batch (1 query / 64 targets,
    more targets than history for two users, a zero-length history with a query), MQA
    8 -> 1, float16, D = 64, causal and a local window (left 200), 4 / 16 KV splits (16
    splits: most are empty for the short histories); NaN / Inf rows past the packed tokens."""
    cu_q = jnp.asarray(np.concatenate([[0], np.cumsum(MIXED_Q)]), jnp.int32)
    cu_k = jnp.asarray(np.concatenate([[0], np.cumsum(MIXED_K)]), jnp.int32)
    n_q, n_k = int(cu_q[-1]), int(cu_k[-1])
    ks = jax.random.split(jax.random.PRNGKey(1023), 3)
    q = jax.random.normal(ks[0], (n_q + 64, 8, 64), jnp.float32).astype(jnp.float16)
    k, v = (jax.random.normal(kk, (n_k + 64, 1, 64), jnp.float32).astype(jnp.float16)
            for kk in ks[1:])
    q, k, v = q.at[n_q:].set(jnp.nan), k.at[n_k:].set(jnp.inf), v.at[n_k:].set(jnp.nan)
    kw = dict(max_seqlen_q=64, max_seqlen_k=max(MIXED_K), window_size=window, alpha=1.0 / 8)
    fn = jax.jit(lambda q, k, v, a, b: jsa.hstu_attention(
        q, k, v, a, b, backend="kernel", kv_splits=kv_splits, **kw))
    out = _poisoned_call(fn, q, k, v, cu_q, cu_k)

    def ref(cdt):
        return jax.jit(lambda q, k, v, a, b: reference.hstu_attention_ref(
            q, k, v, a, b, None, compute_dtype=cdt, **kw))(q[:n_q], k, v, cu_q, cu_k)

    _check(out, ref(None), ref(jnp.float16), n_q,
           f"contiguous mqa fp16 d64 window={window} kv_splits={kv_splits}")


@pytest.mark.parametrize("layout", ["paged", "contiguous"])
def test_no_query_in_any_sequence_writes_zeros(layout):
    """Calls where no row belongs to a sequence (B = 0, and B = 3 users with histories but 0
    queries each) with 40 query rows, 2 (paged) / 4 (contiguous) KV splits: every output element is written 0 (the
    split partials of the rows past ``cu_seqlens_q[-1]`` included), after a poisoning call
    on the same shapes whose rows are inside sequences."""
    h, h_kv, d = 8, 1, 64
    rng = np.random.default_rng(0)
    q = jnp.asarray(rng.standard_normal((40, h, d)), jnp.float16)
    for cu_q, cu_k in (([0], [0]), ([0, 0, 0, 0], [0, 300, 301, 1000])):
        poison_q = [0, 10, 20, 40] if len(cu_q) == 4 else [0]
        cu_q, cu_k, poison_q = (jnp.asarray(x, jnp.int32) for x in (cu_q, cu_k, poison_q))
        kw = dict(max_seqlen_q=64, max_seqlen_k=1000, alpha=0.1)
        if layout == "paged":
            kv = jnp.asarray(rng.standard_normal((12, 2, PAGE, h_kv, d)), jnp.float16)
            ids = jnp.arange(12, dtype=jnp.int32)
            ptr = jnp.asarray([0, 3, 6, 12][:len(cu_q)], jnp.int32)
            fn = _paged_kernel_fn("kernel", 2, **kw)
            jax.block_until_ready(fn(jnp.full_like(q, jnp.nan), kv, ids, ptr, poison_q, cu_k))
            out = fn(q, kv, ids, ptr, cu_q, cu_k)
        else:
            k = jnp.asarray(rng.standard_normal((1000, h_kv, d)), jnp.float16)
            fn = jax.jit(lambda q, k, v, a, b: jsa.hstu_attention(
                q, k, v, a, b, backend="kernel", kv_splits=4, **kw))
            jax.block_until_ready(fn(jnp.full_like(q, jnp.nan), k, k, poison_q, cu_k))
            out = fn(q, k, k, cu_q, cu_k)
        out = np.asarray(_f32(out))
        assert out.shape == (40, h, d)
        assert not np.any(out), f"{layout} B={len(cu_q) - 1}: nonzero/NaN rows outside sequences"
