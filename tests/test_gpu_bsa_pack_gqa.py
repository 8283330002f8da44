"""GPU: block-sparse attention with ``pack_gqa=True`` on the SM90 kernels vs the fp32 reference.

Packed metadata ``(B, H_kv, N_qp, K_max)`` over packed query rows ``p = s r + g``
(``r = H_q / H_kv``; ``jax_sparse_attn.bsa``). Every case runs the forward (out, lse) and the
backward (dq, dk, dv) of the public ops on the kernel backend and checks the test rule of
``tests/attention_base.py`` (kernel error vs the float32 reference <= 2x (out, lse) / 5x
(dq, dk, dv) the error of the reference computed in the input dtype, plus a small atol; no
NaN). Inputs are hostile: S_q not a multiple of ``blk / r`` (a partial last packed block),
S_kv not a multiple of blk, per-row counts with empty packed rows (out 0, lse -inf, dq 0 on
their (position, head) rows), garbage past each row's active prefix, K/V NaN in every KV
block no active row lists and past ``block_sizes``, and outputs poisoned by a preceding
all-NaN run. The kernels: the ``sm90ws`` forward (the default ``bsa_fwd_impl="auto"``, or
named per case: ``impl``) and the ``sm90ws`` backward on the packed rows (the ``sm90`` one in
the ``nopackws`` cases, ``-sm90bwd``).

Split-KV with packing (cases with ``kv_splits`` 2, 7 or ``"auto"``, mostly decode-like: one
packed block per KV head against a long list): the packed forward's work items are (packed
block, split, KV head), its per-split fp32 partials land in the unpacked ``(S, B, H_q, S_q,
D)`` buffers and the combine kernel merges them. Their counts are random in ``[0, K_max]``,
so rows are empty, or have fewer listed blocks than splits (empty splits: zeros and ``-inf``
partials); each case checks that its split count resolves above 1
(``"auto"``: over the packed rows ``B H_kv N_qp``). ``test_bsa_pack_gqa_splits_equal_unpacked``
compares the packed split forward with the unpacked one (same listing, same ``kv_splits``)
and with the packed one-split forward; ``test_bsa_pack_gqa_splits_all_rows_empty`` runs every
split of every item empty (K/V all NaN). Only those:
``python -m pytest -m gpu tests/test_gpu_bsa_pack_gqa.py -k split``.

Run on the H200: ``python -m pytest -m gpu tests/test_gpu_bsa_pack_gqa.py`` (shard with
``BSA_PACK_SHARD=i/n``); ``scripts/sessions/gpu_p18.sh`` runs it with the benchmark rows.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

from attention_base import bsa_fwd_vjp, check_rule, check_unreached, shard  # noqa: E402

pytestmark = pytest.mark.gpu

SHARD = os.environ.get("BSA_PACK_SHARD", "")
# the backend under test; "reference" checks the test itself on a CPU (with the gpu marker
# deselected: python -m pytest -m "gpu or not gpu" ... does not skip; see scripts/sessions/gpu_p18.sh)
BACKEND = os.environ.get("BSA_PACK_TEST_BACKEND", "kernel")
# BSA_PACK_TEST_FWD_WS: the sm90ws forward's switch for these cases (a comma list, e.g.
# "notmaopack": the packed rows copied out instead of the default TMA tensor stores)
FWD_WS = tuple(o for o in os.environ.get("BSA_PACK_TEST_FWD_WS", "").split(",") if o)


@dataclasses.dataclass(frozen=True)
class PackCase:
    name: str
    r: int
    blk: int
    d: int = 128
    dtype: str = "bfloat16"
    layout: str = "bhsd"
    hkv: int = 2
    sq: int = 1000
    skv: int = 1025
    kmax: int = 4
    sizes_rank: int = 0
    impl: str = "auto"  # bsa_fwd_impl
    b: int = 2
    kv_splits: object = 1
    bwd_ws: str = ""  # bsa_bwd_ws ("nopackws": the sm90 backward adds the packed rows)
    dq_writer: str = "auto"  # Switches.dq_writer ("off": the consumer warps add their dQ)


CASES = [
    # bsa_bwd_ws=nopackws: the sm90 backward (the default is the warp-specialized backward
    # on packed rows), each (blk, D) pair, block_sizes ranks, a partial last packed tile
    PackCase("r2-blk64-d128-bf16-sm90bwd", 2, 64, sq=1001, bwd_ws="nopackws"),
    PackCase("r8-blk128-d128-bf16-bshd-sizes3-sm90bwd", 8, 128, layout="bshd", sq=1002,
             sizes_rank=3, bwd_ws="nopackws"),
    PackCase("r4-blk64-d64-fp16-bshd-sizes1-sm90bwd", 4, 64, d=64, dtype="float16",
             layout="bshd", sq=999, sizes_rank=1, bwd_ws="nopackws"),
    PackCase("r2-blk128-d64-bf16-sizes2-sm90bwd", 2, 128, d=64, sq=77, skv=4096, kmax=8,
             sizes_rank=2, bwd_ws="nopackws"),
    PackCase("r2-blk64-d128-bf16-bhsd", 2, 64, sq=1001),
    PackCase("r4-blk64-d64-fp16-bshd-sizes3", 4, 64, d=64, dtype="float16", layout="bshd",
             sq=999, sizes_rank=3),
    PackCase("r8-blk64-d128-bf16-bshd-sizes1", 8, 64, layout="bshd", sq=1003, sizes_rank=1),
    PackCase("r2-blk128-d64-bf16-bhsd-sizes2", 2, 128, d=64, sq=1000, skv=4096, kmax=8,
             sizes_rank=2),
    PackCase("r4-blk128-d128-fp16-bhsd", 4, 128, dtype="float16", sq=1001),
    PackCase("r8-blk128-d128-bf16-bshd-sizes3", 8, 128, layout="bshd", sq=1002, sizes_rank=3),
    # the forward switch named (bsa_fwd_impl="sm90ws") at each block size
    PackCase("r4-blk64-d128-bf16-sm90ws", 4, 64, sq=77, impl="sm90ws"),
    PackCase("r8-blk128-d64-fp16-sm90ws-sizes3", 8, 128, d=64, dtype="float16", sq=130,
             impl="sm90ws", sizes_rank=3),
    # a group of 16 (4 positions per 64-row slice), one KV head
    PackCase("r16-blk128-d128-bf16-bshd-hkv1", 16, 128, layout="bshd", hkv=1, sq=333, b=3),
    # the packed sm90ws backward with its tuning switches: the warpgroups taking turns at dQ
    # (blk 128), longest K->Q list first, no dQ writer warp, dQ staged in the Q / dO tiles
    PackCase("r8-blk128-d128-bf16-dqalt", 8, 128, sq=700, bwd_ws="dqalt", sizes_rank=3),
    PackCase("r4-blk64-d128-fp16-lpt", 4, 64, dtype="float16", sq=555, bwd_ws="lpt"),
    PackCase("r2-blk128-d64-bf16-bshd-nowriter", 2, 128, d=64, layout="bshd", sq=901,
             dq_writer="off"),
    PackCase("r8-blk128-d128-fp16-dqalias-epiregs", 8, 128, dtype="float16", sq=333,
             bwd_ws="dqalias,epiregs", sizes_rank=1),
    # a group of 64: one position per 64-row slice and per packed block at blk 64
    PackCase("r64-blk64-d64-fp16-hkv1", 64, 64, d=64, dtype="float16", hkv=1, sq=50, skv=700,
             kmax=5),
    # one position (a single partial packed block), one KV block
    PackCase("r8-blk128-d128-bf16-q1", 8, 128, sq=1, skv=65, kmax=1),
    PackCase("r2-blk64-d64-bf16-q1-sm90ws", 2, 64, d=64, sq=1, skv=300, kmax=3, impl="sm90ws"),
    # decode-like (S_q r = blk) with kv_splits="auto": 4 * 2 * 1 packed rows, 8 splits
    PackCase("r8-blk128-d128-bf16-decode-splitsauto", 8, 128, sq=16, skv=4096, kmax=8,
             kv_splits="auto", b=4),
    # ---- pack_gqa with kv_splits (packed block, split, KV head work items)
    PackCase("r8-blk128-d128-bf16-decode-splits2", 8, 128, sq=16, skv=4096, kmax=8,
             kv_splits=2, b=4),
    # S_q r = 120 of 128 rows (partial packed block), 7 splits of <= 8 blocks: most rows
    # have empty splits
    PackCase("r8-blk128-d64-fp16-bshd-decode-splits7-sizes3", 8, 128, d=64, dtype="float16",
             layout="bshd", sq=15, skv=3000, kmax=8, kv_splits=7, b=3, sizes_rank=3),
    # "auto": 2 * 2 * 1 packed rows -> min(num_SMs // 4, 12) = 12 splits
    PackCase("r2-blk64-d128-fp16-decode-splitsauto", 2, 64, dtype="float16", sq=13, skv=2049,
             kmax=12, kv_splits="auto"),
    # 7 clamps to K_max = 6
    PackCase("r2-blk128-d64-bf16-bshd-decode-splits7-sizes1-sm90ws", 2, 128, d=64,
             layout="bshd", sq=64, skv=1500, kmax=6, kv_splits=7, sizes_rank=1,
             impl="sm90ws"),
    # several packed blocks (the last partial), blk 64
    PackCase("r8-blk64-d64-bf16-splits2-sizes2-sm90ws", 8, 64, d=64, sq=21, skv=1025, kmax=4,
             kv_splits=2, sizes_rank=2, impl="sm90ws"),
    # 2 * 4 * 1 packed rows -> 16 splits of <= 16 blocks
    PackCase("r8-blk64-d128-fp16-bshd-decode-splitsauto-hkv4", 8, 64, dtype="float16",
             layout="bshd", hkv=4, sq=8, skv=8192, kmax=16, kv_splits="auto"),
    # prefill-like: 11 packed blocks per KV head
    PackCase("r4-blk128-d128-bf16-splits7", 4, 128, sq=333, skv=2048, kmax=8, kv_splits=7),
    # long-KV decode, one sequence: 1 * 2 * 1 packed rows -> 64 splits of <= 64 blocks
    PackCase("r8-blk128-d128-bf16-longkv-splitsauto-b1", 8, 128, sq=16, skv=32768, kmax=64,
             kv_splits="auto", b=1),
]


def pack_inputs(c: PackCase, seed=0):
    """q, k, v, do (the case's layout and dtype) and packed metadata: random unique listed
    blocks, counts in [0, K_max] (block 0 of every KV head empty), garbage past the active
    prefix; K and V NaN in unlisted blocks and past block_sizes."""
    rng = np.random.default_rng(seed)
    b, hkv, r, d, blk = c.b, c.hkv, c.r, c.d, c.blk
    hq = hkv * r
    nqp, nkv = -(-c.sq * r // blk), -(-c.skv // blk)
    kmax = min(c.kmax, nkv)
    idx = np.argsort(rng.random((b, hkv, nqp, nkv)), axis=-1)[..., :kmax].astype(np.int32)
    nums = rng.integers(0, kmax + 1, size=(b, hkv, nqp)).astype(np.int32)
    if nqp > 1:
        nums[:, :, 0] = 0
        nums[:, :, -1] = kmax  # the partial last packed block is never empty
    else:
        nums[:, 0, 0], nums[:, -1, 0] = 0, kmax
    j = np.arange(kmax)[None, None, None, :]
    garbage = rng.choice(np.array([-7, 10**6, nkv, -1], np.int32), size=idx.shape)
    idx = np.where(j < nums[..., None], idx, garbage).astype(np.int32)
    sizes = None
    full = np.full((b, hkv, nkv), blk, np.int32)
    if c.sizes_rank:
        shape = {1: (nkv,), 2: (b, nkv), 3: (b, hkv, nkv)}[c.sizes_rank]
        sizes = rng.integers(1, blk + 1, size=shape).astype(np.int32)
        # ranks 1 / 2 broadcast over the batch / KV heads: (N_kv,) or (B, N_kv)
        full = np.broadcast_to(sizes if sizes.ndim == 3 else
                               sizes[None, None] if sizes.ndim == 1 else sizes[:, None],
                               (b, hkv, nkv)).copy()
    listed = np.zeros((b, hkv, nkv), bool)
    for bi in range(b):
        for h in range(hkv):
            for m in range(nqp):
                listed[bi, h, idx[bi, h, m, :nums[bi, h, m]]] = True
    # key rows that no active row uses: NaN
    pos = np.arange(nkv * blk)
    keep = listed[..., pos // blk] & ((pos % blk) < full[..., pos // blk])  # (b, hkv, S)
    keep = keep[..., : c.skv]
    dt = jnp.dtype(c.dtype)

    def t(s, h, nan_rows=None):
        x = rng.standard_normal((b, h, s, d)).astype(np.float32)
        if nan_rows is not None:
            x = np.where(nan_rows[..., None], x, np.nan)
        if c.layout == "bshd":
            x = np.swapaxes(x, 1, 2)
        return jnp.asarray(x).astype(dt)

    q, do = t(c.sq, hq), t(c.sq, hq)
    k, v = t(c.skv, hkv, keep), t(c.skv, hkv, keep)
    return dict(q=q, k=k, v=v, do=do, idx=jnp.asarray(idx), nums=jnp.asarray(nums),
                nums_np=nums, sizes=None if sizes is None else jnp.asarray(sizes),
                kw=dict(layout=c.layout, sparse_block_size=blk,
                        softmax_scale=float(0.7 / np.sqrt(d))))


def _kernel_fn(c: PackCase, kw):
    import jax_sparse_attn as jsa
    from jax_sparse_attn.config import Switches

    sw = Switches(bsa_fwd_impl=c.impl, bsa_bwd_ws=tuple(o for o in c.bwd_ws.split(",") if o),
                  dq_writer=c.dq_writer, bsa_fwd_ws=FWD_WS)
    opts = dict(kw, backend=BACKEND, switches=sw, pack_gqa=True, allow_empty_block_nums=True,
                kv_splits=c.kv_splits)

    @jax.jit
    def f(q, k, v, do, idx, nums, sizes):
        o = dict(opts, q2k_block_nums=nums, block_sizes=sizes)
        out, lse = jsa.block_sparse_attention_forward(q, k, v, idx, **o)
        _, vjp = jax.vjp(lambda q, k, v: jsa.block_sparse_attention(q, k, v, idx, **o), q, k, v)
        return (out, lse) + vjp(do)

    return f


def _reference(x, compute_dtype):
    from jax_sparse_attn import reference
    from jax_sparse_attn.metadata import normalize_bsa_metadata

    idx, nums, sizes = normalize_bsa_metadata(x["idx"], None, x["sizes"], x["nums"])
    kw = dict(x["kw"], pack_gqa=True, compute_dtype=compute_dtype)
    args = [x[n] for n in ("q", "k", "v", "do")]
    if compute_dtype is None:
        args = [a.astype(jnp.float32) for a in args]
    q, k, v, do = args

    @jax.jit
    def f(q, k, v, do):
        out, lse = reference.block_sparse_attention_ref(q, k, v, idx, nums, sizes, **kw)
        return (out, lse) + tuple(reference.block_sparse_attention_bwd_ref(
            do, q, k, v, out, lse, idx, nums, sizes, **kw))

    return f(q, k, v, do)


def resolved_splits(c: PackCase):
    """The split count the case's forward runs: ``kv_splits`` clamped to the listed blocks
    ``K_max``, ``"auto"`` over the packed metadata rows ``B H_kv N_qp``
    (``ffi.bsa.resolve_kv_splits``)."""
    from jax_sparse_attn.ffi import bsa as ffi_bsa

    nqp, nkv = -(-c.sq * c.r // c.blk), -(-c.skv // c.blk)
    return ffi_bsa.resolve_kv_splits(c.kv_splits, num_rows=c.b * c.hkv * nqp,
                                     k_max=min(c.kmax, nkv), impl="sm90ws")


def _bhs(a, layout):
    a = np.asarray(jnp.asarray(a, jnp.float32))
    return a if layout == "bhsd" else np.swapaxes(a, 1, 2)


@pytest.mark.parametrize("c", shard(CASES, SHARD), ids=lambda c: c.name)
def test_bsa_pack_gqa_kernel_vs_reference(c):
    if c.kv_splits != 1:
        assert resolved_splits(c) > 1, "a split case that runs one split"
    x = pack_inputs(c)
    f = _kernel_fn(c, x["kw"])
    args = (x["q"], x["k"], x["v"], x["do"], x["idx"], x["nums"], x["sizes"])
    # poisoned outputs: an all-NaN run first leaves NaN in buffers XLA is likely to reuse
    jax.block_until_ready(f(x["q"] * jnp.nan, *args[1:]))
    got = jax.block_until_ready(f(*args))
    truth = _reference(x, None)
    base = _reference(x, jnp.dtype(c.dtype))
    report = []
    check_rule("out", got[0], truth[0], base[0], 2.0, 2e-3, report)
    lse_g, lse_t, lse_b = (np.asarray(a, np.float64) for a in (got[1], truth[1], base[1]))
    assert lse_g.shape == (c.b, c.hkv * c.r, c.sq)
    assert not np.isnan(lse_g).any(), "lse: NaN"
    assert np.array_equal(np.isneginf(lse_g), np.isneginf(lse_t)), "lse -inf pattern differs"
    fin = np.isfinite(lse_t)
    check_rule("lse", lse_g[fin], lse_t[fin], lse_b[fin], 2.0, 1e-4, report)
    for i, name in enumerate(("dq", "dk", "dv"), start=2):
        check_rule(name, got[i], truth[i], base[i], 5.0, 5e-3, report)
    # empty packed rows: their (position, query head) rows give out 0, lse -inf, dq 0
    nums = x["nums_np"]
    p = np.arange(c.sq * c.r)
    empty = np.zeros((c.b, c.hkv * c.r, c.sq), bool)
    for h in range(c.hkv):
        e = nums[:, h, p // c.blk] == 0  # (b, S r)
        empty[:, h * c.r + p % c.r, p // c.r] = e
    assert empty.any()
    assert np.all(_bhs(got[0], c.layout)[empty] == 0)
    assert np.all(np.isneginf(lse_g[empty]))
    assert np.all(_bhs(got[2], c.layout)[empty] == 0)
    # key rows no active row uses (unlisted, past block_sizes: NaN in k / v): dk = dv = 0
    # exactly (dv = 0 in the truth)
    check_unreached(("dk", "dv"), (got[3], got[4]), truth[4])
    print(c.name, " | ".join(report))


def test_bsa_pack_gqa_equals_unpacked_listing():
    """Packed metadata whose every packed block lists the blocks the unpacked rows of its
    positions list (one pattern per position block, the same for every head of the group):
    packed and unpacked kernel results agree to rounding (same math, other row grouping)."""
    import jax_sparse_attn as jsa

    if SHARD and not SHARD.startswith("0/"):
        pytest.skip("BSA_PACK_SHARD: runs in shard 0")

    r, blk, hkv, sq, skv, d = 4, 128, 2, 1024, 2048, 128
    rng = np.random.default_rng(5)
    dt = jnp.bfloat16
    q = jnp.asarray(rng.standard_normal((1, hkv * r, sq, d)), dt)
    k = jnp.asarray(rng.standard_normal((1, hkv, skv, d)), dt)
    v = jnp.asarray(rng.standard_normal((1, hkv, skv, d)), dt)
    nkv, nq = skv // blk, sq // blk
    # unpacked rows: query block m of every head of KV head h lists sel[h, m]
    sel = np.argsort(rng.random((hkv, nq, nkv)), axis=-1)[..., :3].astype(np.int32)
    u_idx = np.repeat(sel[None], r, axis=1).reshape(1, hkv * r, nq, 3)
    # packed block mp of KV head h covers positions [mp blk / r, (mp + 1) blk / r): block m
    mp = np.arange(nq * r)
    p_idx = sel[None][:, :, mp * blk // r // blk]
    kw = dict(sparse_block_size=blk, block_sparse_num=3, backend=BACKEND)
    out_u, lse_u = jsa.block_sparse_attention_forward(q, k, v, jnp.asarray(u_idx), **kw)
    out_p, lse_p = jsa.block_sparse_attention_forward(q, k, v, jnp.asarray(p_idx), pack_gqa=True,
                                                      **kw)
    np.testing.assert_allclose(np.asarray(lse_p), np.asarray(lse_u), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(out_p, np.float32), np.asarray(out_u, np.float32),
                               rtol=2e-2, atol=2e-2)


# (r, blk, D, S_q, S_kv, listed blocks, kv_splits): decode-like, one packed block per KV head
SPLIT_EQ = [
    (8, 128, 128, 16, 8192, 24, 5),
    (2, 64, 64, 32, 4096, 16, "auto"),
    (4, 128, 64, 64, 6144, 12, 7),
]


@pytest.mark.parametrize("r,blk,d,sq,skv,n_listed,kv_splits", SPLIT_EQ,
                         ids=[f"r{c[0]}-blk{c[1]}-d{c[2]}-splits{c[6]}" for c in SPLIT_EQ])
def test_bsa_pack_gqa_splits_equal_unpacked(r, blk, d, sq, skv, n_listed, kv_splits):
    """pack_gqa with kv_splits against (a) the unpacked forward with the same listing and the
    same kv_splits (every head of a group lists what its packed block lists) and (b) the
    packed forward with one split: they agree to rounding (same math; other row grouping,
    other split merge). Counts vary per row (some rows with fewer blocks than splits, one
    KV head's rows empty)."""
    import jax_sparse_attn as jsa

    if SHARD and not SHARD.startswith("0/"):
        pytest.skip("BSA_PACK_SHARD: runs in shard 0")
    hkv, b = 2, 2
    rng = np.random.default_rng(7)
    dt = jnp.bfloat16
    q = jnp.asarray(rng.standard_normal((b, hkv * r, sq, d)), dt)
    k = jnp.asarray(rng.standard_normal((b, hkv, skv, d)), dt)
    v = jnp.asarray(rng.standard_normal((b, hkv, skv, d)), dt)
    nkv, nq, nqp = -(-skv // blk), -(-sq // blk), -(-sq * r // blk)
    # unpacked query block m of every head of KV head h lists sel[b, h, m, :cnt[b, h, m]]
    sel = np.argsort(rng.random((b, hkv, nq, nkv)), axis=-1)[..., :n_listed].astype(np.int32)
    cnt = rng.integers(0, n_listed + 1, size=(b, hkv, nq)).astype(np.int32)
    cnt[0, 0] = 0
    cnt[-1, -1] = n_listed
    u_idx = np.repeat(sel, r, axis=1)
    u_nums = np.repeat(cnt, r, axis=1)
    # packed block mp of KV head h covers positions [mp blk / r, (mp + 1) blk / r): block m
    m_of = np.arange(nqp) * blk // r // blk
    p_idx, p_nums = sel[:, :, m_of], cnt[:, :, m_of]
    kw = dict(sparse_block_size=blk, backend=BACKEND, allow_empty_block_nums=True)

    def fwd(idx, nums, **o):
        return jsa.block_sparse_attention_forward(q, k, v, jnp.asarray(idx),
                                                  q2k_block_nums=jnp.asarray(nums), **kw, **o)

    out_p, lse_p = fwd(p_idx, p_nums, pack_gqa=True, kv_splits=kv_splits)
    for out_o, lse_o in (fwd(u_idx, u_nums, kv_splits=kv_splits),
                         fwd(p_idx, p_nums, pack_gqa=True)):
        lp, lo = np.asarray(lse_p), np.asarray(lse_o)
        assert np.array_equal(np.isneginf(lp), np.isneginf(lo))
        fin = np.isfinite(lo)
        np.testing.assert_allclose(lp[fin], lo[fin], rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(np.asarray(out_p, np.float32), np.asarray(out_o, np.float32),
                                   rtol=2e-2, atol=2e-2)
    empty = np.repeat(cnt == 0, r, axis=1)[..., None].repeat(blk, -1).reshape(b, hkv * r, -1)
    empty = empty[..., :sq]
    assert empty.any()
    assert np.all(np.asarray(out_p, np.float32)[empty] == 0)
    assert np.all(np.isneginf(np.asarray(lse_p)[empty]))


def test_bsa_pack_gqa_splits_all_rows_empty():
    """Every packed row empty, K/V all NaN, pack_gqa with kv_splits 3 (every split of every
    item empty): out 0, lse -inf, grads 0, no NaN, after a poisoned run (the packed split
    forward, the combine kernel and the backward on empty lists)."""
    from jax_sparse_attn.config import Switches

    if SHARD and not SHARD.startswith("0/"):
        pytest.skip("BSA_PACK_SHARD: runs in shard 0")
    rng = np.random.default_rng(13)
    for blk, r, d, impl in ((128, 8, 128, "auto"), (64, 2, 64, "sm90ws")):
        b, hkv, sq, skv, kmax = 2, 2, 40, 700, 4
        nqp = -(-sq * r // blk)
        q, do = (jnp.asarray(rng.standard_normal((b, hkv * r, sq, d)), jnp.bfloat16)
                 for _ in range(2))
        kv = jnp.full((b, hkv, skv, d), jnp.nan, jnp.bfloat16)
        idx = jnp.asarray(rng.integers(-3, 99, (b, hkv, nqp, kmax)), jnp.int32)  # inactive
        nums = jnp.zeros((b, hkv, nqp), jnp.int32)
        kw = dict(q2k_block_nums=nums, sparse_block_size=blk, allow_empty_block_nums=True,
                  backend=BACKEND, kv_splits=3, pack_gqa=True,
                  switches=Switches(bsa_fwd_impl=impl))
        f = bsa_fwd_vjp(idx, **kw)

        jax.block_until_ready(f(q * jnp.nan, kv, kv, do))  # poisoned buffers
        out, lse, dq, dk, dv = (np.asarray(x, np.float32) for x in f(q, kv, kv, do))
        assert np.all(out == 0) and np.all(np.isneginf(lse)), blk
        assert np.all(dq == 0) and np.all(dk == 0) and np.all(dv == 0), blk
