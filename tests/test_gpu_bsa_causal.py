"""GPU: block-sparse attention with ``causal=True`` on the sm90 kernels vs the fp32 reference.

The token-level causal mask inside the listed blocks (key ``j`` visible from query ``i`` iff
``j <= i + S_kv - S_q``, bottom-right aligned). Every case runs the public forward and its
VJP on the kernel backend and compares out, lse, dq, dk, dv with the float32 reference
under the rule of ``tests/attention_base.py`` (kernel error <= 2x (forward, lse) / 5x
(backward) the input-dtype reference's error, plus a small atol; NaN never passes).

Listings (``pattern``): ``diag`` - every query block lists the blocks that hold its
diagonal (the crossing blocks), random past blocks and, in some rows, a block entirely
above the diagonal (fully masked), in a random order; ``future`` - like ``diag`` but some
rows list only blocks above their diagonal (lse = -inf, out = 0, dq = 0). ``counts``:
``fixed`` / ``var`` / ``empty`` (rows with no listed block). Lengths cover S_q == S_kv,
S_q < S_kv and S_q > S_kv (the first query rows then see no key at all), partial last
blocks, offsets that are not a multiple of the block size. ``poison``: NaN / Inf in every
K/V row that no listed query row sees (unlisted blocks, past ``block_sizes``, keys past
the diagonal of the last row of every query block that lists them); the reference runs on
the clean tensors. Outputs are poisoned by a preceding all-NaN run.

``impl``: ``auto`` (the defaults: sm90ws forward, sm90ws backward, also under ``pack_gqa``;
``bwd_ws="nopackws"``: the sm90 backward for packed rows) or ``sm90ws`` (the forward switch named; the same kernels); ``bwd_impl``: the
backward switch (``sm90``: the cp.async backward). ``pack``: ``pack_gqa=True``, metadata per
(KV head, packed block); the mask applies to each packed row's position (row // r).

Run: ``python -m pytest -m gpu tests/test_gpu_bsa_causal.py`` (``CAUSAL_TEST_SHARD=i/n``
runs every n-th case from i, for parallel processes).
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

from attention_base import _rows_bhs, bsa_fwd_vjp, check_rule, shard  # noqa: E402
from jax_sparse_attn.config import Switches  # noqa: E402

pytestmark = pytest.mark.gpu

SHARD = os.environ.get("CAUSAL_TEST_SHARD", "")


@dataclasses.dataclass(frozen=True)
class CausalCase:
    name: str
    blk: int = 128
    d: int = 128
    dtype: str = "bfloat16"
    layout: str = "bhsd"
    hq: int = 4
    hkv: int = 4
    sq: int = 1024
    skv: int = 1024
    kmax: int = 6
    counts: str = "var"
    pattern: str = "diag"
    sizes: bool = False
    poison: bool = True
    impl: str = "auto"
    b: int = 2
    pack: bool = False  # pack_gqa=True: metadata per (KV head, packed block of blk rows)
    bwd_impl: str = "auto"  # the backward switch (auto: sm90ws)
    bwd_ws: str = ""  # bsa_bwd_ws options of the sm90ws backward (comma list)
    fwd_ws: str = ""  # bsa_fwd_ws options of the sm90ws forward (comma list)


CASES = [
    CausalCase("bf16-blk128-d128-square", sq=1024, skv=1024, counts="fixed"),
    CausalCase("fp16-blk64-d64-square-odd-gqa", blk=64, d=64, dtype="float16", layout="bshd",
               hq=8, hkv=2, sq=1000, skv=1000),
    CausalCase("bf16-blk128-d64-sq-lt-skv", d=64, layout="bshd", sq=300, skv=1000, sizes=True),
    CausalCase("fp16-blk64-d128-sq-lt-skv-future", blk=64, dtype="float16", sq=257, skv=1025,
               pattern="future"),
    CausalCase("bf16-blk64-d128-sq-gt-skv", blk=64, sq=1000, skv=333, kmax=4),
    CausalCase("fp16-blk128-d128-sq-gt-skv-gqa-empty", dtype="float16", layout="bshd", hq=8,
               hkv=2, sq=1100, skv=700, counts="empty", kmax=4),
    CausalCase("bf16-blk128-d128-future-empty-sizes", sq=777, skv=1000, pattern="future",
               counts="empty", sizes=True),
    CausalCase("fp16-blk64-d64-sizes-gqa", blk=64, d=64, dtype="float16", hq=4, hkv=1,
               sq=1023, skv=1100, sizes=True, kmax=8),
    # the forward switch named (bsa_fwd_impl="sm90ws") at each block size and head dim
    CausalCase("bf16-blk128-d128-sm90wsfwd", sq=1000, skv=1100, impl="sm90ws", hq=8, hkv=2),
    CausalCase("fp16-blk64-d64-sm90wsfwd", blk=64, d=64, dtype="float16", layout="bshd",
               sq=700, skv=650, impl="sm90ws", pattern="future"),
    CausalCase("bf16-blk64-d128-sm90wsfwd-sizes", blk=64, sq=1000, skv=1000, impl="sm90ws",
               sizes=True, counts="empty"),
    CausalCase("fp16-blk128-d64-sm90wsfwd-sq-lt-skv", d=64, dtype="float16", sq=200, skv=900,
               impl="sm90ws", counts="fixed", kmax=4),
    # pack_gqa: packed row p is position p // r of query head g r + p % r; the mask uses the
    # position (r 2 / 4 / 8, both block sizes and head dims, S_q vs S_kv both ways)
    CausalCase("pack8-bf16-blk128-d128-square", hq=16, hkv=2, sq=500, skv=500, pack=True),
    CausalCase("pack4-fp16-blk64-d64-sq-lt-skv-future", blk=64, d=64, dtype="float16",
               layout="bshd", hq=8, hkv=2, sq=300, skv=1000, pack=True, pattern="future"),
    CausalCase("pack2-bf16-blk64-d128-sq-gt-skv-empty-sizes", blk=64, hq=4, hkv=2, sq=700,
               skv=333, pack=True, counts="empty", sizes=True, kmax=5),
    CausalCase("pack4-fp16-blk128-d64-sizes-fixed", d=64, dtype="float16", layout="bshd",
               hq=4, hkv=1, sq=777, skv=1000, pack=True, counts="fixed", sizes=True),
    # packed rows on the sm90 backward (bsa_bwd_ws nopackws; the default is sm90ws)
    CausalCase("pack8-bf16-blk128-d128-sm90bwd", hq=16, hkv=2, sq=500, skv=600, pack=True,
               bwd_ws="nopackws"),
    CausalCase("pack2-fp16-blk64-d64-sq-gt-skv-sm90bwd", blk=64, d=64, dtype="float16",
               layout="bshd", hq=4, hkv=2, sq=700, skv=333, pack=True, counts="empty",
               sizes=True, kmax=5, bwd_ws="nopackws"),
    # the sm90 backward named (the default backward is sm90ws)
    CausalCase("bf16-blk128-d128-sm90bwd-sq-lt-skv", sq=600, skv=1000, bwd_impl="sm90",
               pattern="future", sizes=True),
    CausalCase("fp16-blk64-d64-sm90bwd-gqa", blk=64, d=64, dtype="float16", layout="bshd",
               hq=8, hkv=2, sq=900, skv=800, bwd_impl="sm90"),
    # sm90ws backward variants with the causal select (splitwait: P^T masked before the dP^T
    # wait; decouple: each warpgroup adds its own keys' dQ)
    CausalCase("bf16-blk128-d128-splitwait", sq=1000, skv=1100, bwd_ws="splitwait",
               sizes=True),
    CausalCase("fp16-blk128-d64-decouple", d=64, dtype="float16", layout="bshd", sq=900,
               skv=800, bwd_ws="decouple", pattern="future"),
    # the forward's pairwg (blk 64: two consumer warpgroups with items of their own)
    CausalCase("bf16-blk64-d128-pairwg-sizes-empty", blk=64, sq=1000, skv=1000, sizes=True,
               counts="empty", fwd_ws="pairwg"),
    CausalCase("fp16-blk64-d64-pairwg-future-gqa", blk=64, d=64, dtype="float16",
               layout="bshd", hq=8, hkv=2, sq=700, skv=650, pattern="future",
               fwd_ws="pairwg"),
]


def _switches(c):
    return Switches(bsa_fwd_impl=c.impl, bsa_bwd_impl=c.bwd_impl,
                    bsa_bwd_ws=tuple(o for o in c.bwd_ws.split(",") if o),
                    bsa_fwd_ws=tuple(o for o in c.fwd_ws.split(",") if o))


def causal_inputs(c, seed=0):
    """Clean (q, k, v, do), poisoned (k, v), the metadata in public form, and the per-row
    masks the checks need."""
    rng = np.random.default_rng(seed)
    b, hq, hkv, sq, skv, d, blk = c.b, c.hq, c.hkv, c.sq, c.skv, c.d, c.blk
    g = hq // hkv
    # metadata rows: query heads, or KV heads over S_q r packed rows (position = row // r)
    r = g if c.pack else 1
    hm, sm = (hkv, sq * r) if c.pack else (hq, sq)
    nq, nkv = -(-sm // blk), -(-skv // blk)
    off = skv - sq
    kmax = c.kmax
    idx = np.zeros((b, hm, nq, kmax), np.int32)
    nums = np.zeros((b, hm, nq), np.int32)
    for bi in range(b):
        for h in range(hm):
            for m in range(nq):
                # last key the block's last row sees
                last = (min((m + 1) * blk, sm) - 1) // r + off
                n_hi = min(last // blk, nkv - 1) if last >= 0 else -1
                past = list(range(0, n_hi + 1))
                future = list(range(max(n_hi + 1, 0), nkv))
                pos0 = (m * blk) // r  # the block's first position
                first = (pos0 + off) // blk if pos0 + off >= 0 else -1
                # the crossing blocks: those holding the diagonal of the block's rows
                cross = [n for n in past if n >= first]
                rest = [n for n in past if n < first]
                rng.shuffle(rest)
                if c.pattern == "future" and future and rng.random() < 0.3:
                    lst = list(rng.permutation(future)[:kmax])
                else:
                    lst = cross + rest
                    if future and rng.random() < 0.5:
                        lst = lst[: kmax - 1] + [int(rng.choice(future))]
                    lst = lst[:kmax]
                lst = [int(x) for x in rng.permutation(lst)] if lst else []
                idx[bi, h, m, : len(lst)] = lst
                if c.counts == "fixed":
                    nums[bi, h, m] = len(lst)
                else:
                    nums[bi, h, m] = rng.integers(1, len(lst) + 1) if lst else 0
    if c.counts == "empty":
        nums[:, :, ::3] = 0
    if c.counts == "fixed":
        # a fixed count needs the same number of entries everywhere: pad with distinct
        # unlisted blocks (any position, causal masks what it must)
        kfix = int(nums.max())
        for bi in range(b):
            for h in range(hm):
                for m in range(nq):
                    have = list(idx[bi, h, m, : nums[bi, h, m]])
                    extra = [n for n in rng.permutation(nkv) if n not in have]
                    idx[bi, h, m, : kfix] = (have + extra)[:kfix]
        nums[...] = kfix
        kmax_used = kfix
    else:
        kmax_used = kmax
    if min(nums.min(), 1) == 0 and c.counts != "empty" and c.pattern != "future":
        # rows without any block (S_q > S_kv at blk granularity) need allow_empty
        pass
    sizes = None
    if c.sizes:
        sizes = rng.integers(1, blk + 1, size=(b, nkv)).astype(np.int32)
        sizes[:, 0] = blk
    # which keys some listed query row sees (per batch, KV head)
    seen = np.zeros((b, hkv, skv), bool)
    jj = np.arange(kmax_used)
    for bi in range(b):
        for h in range(hm):
            for m in range(nq):
                last = (min((m + 1) * blk, sm) - 1) // r + off
                for n in idx[bi, h, m, jj < nums[bi, h, m]]:
                    lo = n * blk
                    hi = min(lo + blk, skv, last + 1)
                    if sizes is not None:
                        hi = min(hi, lo + sizes[bi, n])
                    if hi > lo:
                        seen[bi, h if c.pack else h // g, lo:hi] = True
    dt = jnp.dtype(c.dtype)

    def t(s, h):
        shape = (b, h, s, d) if c.layout == "bhsd" else (b, s, h, d)
        return rng.standard_normal(shape, dtype=np.float32)

    q, k, v, do = t(sq, hq), t(skv, hkv), t(skv, hkv), t(sq, hq)
    kp, vp = k.copy(), v.copy()
    if c.poison:
        for x, val in ((kp, np.nan), (vp, np.inf)):
            xs = x if c.layout == "bhsd" else np.swapaxes(x, 1, 2)  # a view (B, H, S, D)
            xs[~seen] = val
    garbage = rng.choice(np.array([-7, 10**6, nkv, -1], np.int32), size=(b, hm, nq, kmax_used))
    idx = np.where(jj[None, None, None, :] < nums[..., None], idx[..., :kmax_used], garbage)
    cast = lambda x: jnp.asarray(x).astype(dt)  # noqa: E731
    meta = dict(q2k_block_index=jnp.asarray(idx.astype(np.int32)),
                block_sizes=None if sizes is None else jnp.asarray(sizes))
    if c.counts == "fixed":
        meta["block_sparse_num"] = kmax_used
    else:
        meta["q2k_block_nums"] = jnp.asarray(nums)
        meta["allow_empty_block_nums"] = True
    kw = dict(layout=c.layout, sparse_block_size=blk, softmax_scale=float(0.7 / np.sqrt(d)),
              causal=True)
    if c.pack:
        kw["pack_gqa"] = True
    return dict(clean=tuple(cast(x) for x in (q, k, v, do)), kp=cast(kp), vp=cast(vp),
                meta=meta, kw=kw, nums=nums, seen=seen)


def _kernel(c, x, q, k, v, do):
    m = x["meta"]
    kw = dict(x["kw"], backend="kernel", switches=_switches(c),
              **{n: val for n, val in m.items() if n != "q2k_block_index"})
    return jax.block_until_ready(bsa_fwd_vjp(m["q2k_block_index"], **kw)(q, k, v, do))


def _reference(x, compute_dtype):
    from jax_sparse_attn import reference
    from jax_sparse_attn.metadata import normalize_bsa_metadata

    m = x["meta"]
    idx, nums, sizes = normalize_bsa_metadata(m["q2k_block_index"], m.get("block_sparse_num"),
                                              m["block_sizes"], m.get("q2k_block_nums"))
    q, k, v, do = x["clean"]
    if compute_dtype is None:
        q, k, v, do = (a.astype(jnp.float32) for a in (q, k, v, do))
    kw = dict(x["kw"], compute_dtype=compute_dtype)

    @jax.jit
    def f(q, k, v, do):
        out, lse = reference.block_sparse_attention_ref(q, k, v, idx, nums, sizes, **kw)
        return (out, lse) + tuple(reference.block_sparse_attention_bwd_ref(
            do, q, k, v, out, lse, idx, nums, sizes, **kw))

    return f(q, k, v, do)


@pytest.mark.parametrize("c", shard(CASES, SHARD), ids=lambda c: c.name)
def test_bsa_causal_kernel_vs_reference(c):
    x = causal_inputs(c)
    q, k, v, do = x["clean"]
    kp, vp = x["kp"], x["vp"]
    # poisoned outputs: an all-NaN run first leaves NaN in buffers XLA is likely to reuse
    _kernel(c, x, q * jnp.nan, kp, vp, do * jnp.nan)
    got = _kernel(c, x, q, kp, vp, do)
    truth = _reference(x, None)
    base = _reference(x, jnp.dtype(c.dtype))
    report = []
    check_rule("out", got[0], truth[0], base[0], 2.0, 2e-3, report)
    lse_g = np.asarray(got[1], np.float64)
    lse_t = np.asarray(truth[1], np.float64)
    assert not np.isnan(lse_g).any(), "lse: NaN"
    assert np.array_equal(np.isneginf(lse_g), np.isneginf(lse_t)), "lse -inf pattern differs"
    fin = np.isfinite(lse_t)
    check_rule("lse", lse_g[fin], lse_t[fin], np.asarray(base[1], np.float64)[fin], 2.0, 1e-4,
               report)
    for i, name in enumerate(("dq", "dk", "dv"), start=2):
        check_rule(name, got[i], truth[i], base[i], 5.0, 5e-3, report)
    # rows with no visible key: out = 0, lse = -inf, dq = 0 exactly
    empty = np.isneginf(lse_t)
    o_rows = _rows_bhs(np.asarray(got[0], np.float32), c.layout)
    dq_rows = _rows_bhs(np.asarray(got[2], np.float32), c.layout)
    assert np.all(o_rows[empty] == 0) and np.all(dq_rows[empty] == 0)
    if c.pattern == "future" or c.sq > c.skv or c.counts == "empty":
        assert empty.any(), "the case should have rows without visible keys"
    # keys nobody sees get dk = dv = 0 exactly
    unseen = ~x["seen"]
    for i in (3, 4):
        rows = _rows_bhs(np.asarray(got[i], np.float32), c.layout)
        assert np.all(rows[unseen] == 0)
    print(c.name, f"empty rows {int(empty.sum())}, unseen keys {int(unseen.sum())};",
          "; ".join(report))


def test_bsa_causal_no_mask_needed_matches_noncausal():
    """A listing where every listed block is at or below the diagonal of every row
    (blocks n < m, S_q == S_kv): causal=True must equal causal=False bit for bit."""
    import jax_sparse_attn as jsa

    if SHARD and SHARD.split("/")[0] != "0":
        pytest.skip("runs in shard 0")
    rng = np.random.default_rng(1)
    b, h, s, d, blk = 1, 4, 1024, 128, 128
    n = s // blk
    q, k, v = (jnp.asarray(rng.standard_normal((b, h, s, d), dtype=np.float32)).astype(
        jnp.bfloat16) for _ in range(3))
    idx = np.zeros((b, h, n, n), np.int32)
    nums = np.zeros((b, h, n), np.int32)
    for m in range(1, n):
        idx[:, :, m, :m] = rng.permutation(m)
        nums[:, :, m] = m
    kw = dict(q2k_block_nums=jnp.asarray(nums), allow_empty_block_nums=True,
              sparse_block_size=blk, backend="kernel")
    a = jsa.block_sparse_attention_forward(q, k, v, jnp.asarray(idx), **kw)
    c = jsa.block_sparse_attention_forward(q, k, v, jnp.asarray(idx), causal=True, **kw)
    assert np.array_equal(np.asarray(a[0], np.float32), np.asarray(c[0], np.float32))
    assert np.array_equal(np.asarray(a[1]), np.asarray(c[1]), equal_nan=True)
