"""The sm90ws block-sparse forward's work order, CTAs per SM and shared-memory plan (CPU, no
kernel compile): ``tile_scheduler.HeadMajorScheduler`` decodes every work item exactly once
in KV-head-major order, the compile key picks three CTAs per SM by default only at blk 64 /
D 64 (at D 128 with the opt-in ``ctas3k1`` / ``selfload``), the ablation flags reach the
key, and the shared-memory plans fit their per-CTA limits."""

from __future__ import annotations

import itertools
import os

import pytest

# CuTe DSL reads its target arch when cutlass is first imported: set it before that (this
# module is collected before the lowering tests, which need sm_90a)
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

import jax.numpy as jnp  # noqa: E402

pytest.importorskip("cutlass")  # noqa: E402

from jax_sparse_attn.config import Switches  # noqa: E402
from jax_sparse_attn.ffi import bsa  # noqa: E402
from jax_sparse_attn.kernels.attn_fwd_sm90_ws import SMEM_LIMIT  # noqa: E402
from jax_sparse_attn.kernels.bsa_fwd_sm90_ws import (  # noqa: E402
    SMEM_LIMIT_2CTA, SMEM_LIMIT_3CTA, bsa_ws_smem_plan)
from jax_sparse_attn.kernels.tile_scheduler import (  # noqa: E402
    HeadMajorScheduler, StaticLptScheduler)


def _decode(sched, n_heads, n_blocks, t):
    """(batch, head, block, split) of item ``t``, as ``BsaFwdSm90Ws._work`` decodes it."""
    slot, hs = sched.coords(t)
    split, head = divmod(hs, n_heads)
    batch, block = divmod(slot, n_blocks)
    return batch, head, block, split


@pytest.mark.parametrize("b,h_q,h_kv,n_blocks,splits", [
    (1, 16, 16, 5, 1), (2, 16, 4, 3, 1), (3, 8, 1, 4, 1), (2, 4, 2, 3, 3), (1, 6, 3, 2, 7)])
def test_head_major_order_is_a_bijection_kv_head_major(b, h_q, h_kv, n_blocks, splits):
    group = h_q // h_kv
    n_hs = h_q * splits
    n_work = b * n_blocks * n_hs
    sched = HeadMajorScheduler(n_hs, n_work, splits * group, group, n_blocks, h_kv)
    items = [_decode(sched, h_q, n_blocks, t) for t in range(n_work)]
    # every (batch, head, block, split) exactly once
    assert sorted(items) == sorted(itertools.product(range(b), range(h_q), range(n_blocks),
                                                     range(splits)))
    # batch, then KV head, then query block change slowest; the (split, head of the group)
    # pairs of one query block are consecutive
    keys = [(bb, hh // group, blk) for bb, hh, blk, _ in items]
    assert keys == sorted(keys)
    for t0 in range(0, n_work, splits * group):
        run = items[t0:t0 + splits * group]
        assert len({(bb, hh // group, blk) for bb, hh, blk, _ in run}) == 1
    # the previous order: query block major, heads fastest
    old = StaticLptScheduler(n_hs, n_work)
    first = [_decode(old, h_q, n_blocks, t) for t in range(n_hs)]
    assert {(bb, blk) for bb, _, blk, _ in first} == {(0, 0)}


def test_compile_key_options():
    dt = jnp.bfloat16
    key = bsa.fwd_config(dt, 64, 64, False, Switches())
    assert key.impl == "sm90ws" and key.ws_head_major and key.ws_three_ctas
    assert not (key.ws_lazy_rescale or key.ws_o_alias)
    for d, blk in ((128, 64), (64, 128), (128, 128)):
        k = bsa.fwd_config(dt, d, blk, False, Switches())
        assert k.impl == "sm90ws" and not k.ws_three_ctas
    sw = Switches(bsa_fwd_ws=("headinner", "ctas2", "oalias", "lazyrescale"))
    k = bsa.fwd_config(dt, 64, 64, True, sw)
    assert (k.ws_head_major, k.ws_three_ctas, k.ws_o_alias, k.ws_lazy_rescale) == (
        False, False, True, True)
    # chained work items: opt-in (slower on the H200), crossepi the epilogue-first order
    assert key.ws_cross == 0
    assert bsa.fwd_config(dt, 128, 128, False, Switches(bsa_fwd_ws=("cross",))).ws_cross == 1
    assert bsa.fwd_config(dt, 128, 64, False, Switches(bsa_fwd_ws=("crossepi",))).ws_cross == 2
    # head dims sm90ws does not implement run the mma.sync forward, as does the sm80 switch
    for d in (32, 256):
        assert bsa.fwd_config(dt, d, 64, False, Switches()).impl == "sm80"
        assert bsa.fwd_config(dt, d, 128, False, Switches(bsa_fwd_impl="sm90ws")).impl == "sm80"
    assert bsa.fwd_config(dt, 128, 64, False, Switches(bsa_fwd_impl="sm80")).impl == "sm80"


def test_three_ctas_k1_keys():
    """``ctas3k1`` / ``selfload`` reach the key only at blk 64 / D 128 (elsewhere the key is
    the default's); ``selfload`` runs as ``ctas3k1`` (with the producer warp) where the
    consumer warpgroup cannot issue its own loads; ``qahead`` is ``mpre`` wherever O is
    staged in the single Q buffer (``oalias``, ``ctas3k1``), which holds the current item
    until its epilogue."""
    dt = jnp.bfloat16
    splits = {"kv_splits": 3, "num_rows": 8, "k_max": 16}
    for d, blk in ((64, 64), (64, 128), (128, 128)):
        for kw in ({}, {"pack_gqa": 4}, splits):
            base = bsa.fwd_config(dt, d, blk, False, Switches(), **kw)
            for flag in ("ctas3k1", "selfload"):
                assert bsa.fwd_config(dt, d, blk, False, Switches(bsa_fwd_ws=(flag,)),
                                      **kw) == base, (d, blk, kw, flag)
    base = bsa.fwd_config(dt, 128, 64, False, Switches())
    assert not (base.ws_k_single or base.ws_self_load or base.ws_three_ctas)
    assert base.ws_tma_o
    k1 = bsa.fwd_config(dt, 128, 64, False, Switches(bsa_fwd_ws=("ctas3k1",)))
    sl = bsa.fwd_config(dt, 128, 64, False, Switches(bsa_fwd_ws=("selfload",)))
    assert (k1.ws_k_single, k1.ws_self_load, k1.ws_three_ctas, k1.ws_tma_o) == (
        True, False, True, False)
    assert (sl.ws_k_single, sl.ws_self_load, sl.ws_three_ctas, sl.ws_tma_o) == (
        True, True, True, False)
    for more, kw in [(("nooverlap",), {}), (("streamk",), {}), (("cross",), {}),
                     (("crossepi",), {}), (("mpre",), {}), (("qahead",), {}),
                     ((), {"pack_gqa": 4}), ((), splits)]:
        k = bsa.fwd_config(dt, 128, 64, False, Switches(bsa_fwd_ws=("selfload",) + more), **kw)
        assert k.ws_k_single and not k.ws_self_load, (more, kw)
        assert k == bsa.fwd_config(dt, 128, 64, False,
                                   Switches(bsa_fwd_ws=("ctas3k1",) + more), **kw)
    # qahead: a second Q buffer or none of it (the kernel would wait for the current item's
    # Q buffer before issuing the rest of its K / V tiles)
    qa = bsa.fwd_config(dt, 128, 64, False, Switches(bsa_fwd_ws=("qahead",)))
    assert (qa.ws_q_ahead, qa.ws_meta_prefetch) == (True, False)
    for more in (("ctas3k1",), ("oalias",)):
        for d, blk in ((128, 64), (64, 64), (128, 128)):
            k = bsa.fwd_config(dt, d, blk, False, Switches(bsa_fwd_ws=("qahead",) + more))
            single_q = more == ("oalias",) or (d, blk) == (128, 64)
            assert (k.ws_q_ahead, k.ws_meta_prefetch) == (not single_q, single_q), (more, d)


def test_three_ctas_k1_kernel_shape():
    """``k_single``: three CTAs per SM at blk 64 / D 128 with one Q buffer (O staged in it),
    one K stage and two V stages within the three-CTA shared-memory limit, a one-warp
    producer (160 threads) or with ``self_load`` none (128); the combinations the kernel
    does not implement raise NotImplementedError."""
    import cutlass  # noqa: PLC0415

    from jax_sparse_attn.kernels.bsa_fwd_sm90_ws import BsaFwdSm90Ws  # noqa: PLC0415

    bf16 = cutlass.BFloat16
    k = BsaFwdSm90Ws(bf16, 128, 64, False, 132, three_ctas=True, k_single=True)
    assert (k.ctas_per_sm, k.q_stages, k.k_stages, k.stages, k.o_alias_q) == (3, 1, 1, 2, True)
    assert (k.num_threads, k.warp_producer, k.self_load, k.tma_o) == (160, True, False, False)
    assert (64 * 128 + 3 * 64 * 128) * 2 + 1024 <= SMEM_LIMIT_3CTA
    s = BsaFwdSm90Ws(bf16, 128, 64, False, 132, three_ctas=True, k_single=True,
                     self_load=True)
    assert (s.num_threads, s.self_load, s.k_stages) == (128, True, 1)
    with pytest.raises(NotImplementedError, match="k_single needs three_ctas"):
        BsaFwdSm90Ws(bf16, 128, 64, False, 132, k_single=True)
    for kw in ({}, {"k_single": True, "pack_gqa": 4}, {"k_single": True, "kv_splits": 2},
               {"k_single": True, "overlap": False}, {"k_single": True, "stream_k": True},
               {"k_single": True, "q_ahead": True}):
        with pytest.raises(NotImplementedError, match="self_load needs"):
            BsaFwdSm90Ws(bf16, 128, 64, False, 132, three_ctas=True, self_load=True, **kw)


def _bytes(d, bm, bn, plan):
    stages, q_stages, alias = plan
    return q_stages * bm * d * 2 + stages * bn * 2 * d * 2 + (0 if alias else bm * d * 2) + 1024


@pytest.mark.parametrize("d,blk,limit,want", [
    (128, 128, SMEM_LIMIT, (2, 2, False)),
    (64, 128, SMEM_LIMIT, (4, 2, False)),
    (128, 64, SMEM_LIMIT_2CTA, (2, 2, False)),  # to the byte: 113 KiB
    (64, 64, SMEM_LIMIT_3CTA, (3, 2, False)),
])
def test_shared_memory_plans_fit(d, blk, limit, want):
    plan = bsa_ws_smem_plan(d, blk, blk, limit)
    assert plan == want
    assert _bytes(d, blk, blk, plan) <= limit
    # two / three CTAs per SM with the driver's 1 KiB each fit the SM's 228 KiB
    ctas = {SMEM_LIMIT: 1, SMEM_LIMIT_2CTA: 2, SMEM_LIMIT_3CTA: 3}[limit]
    assert ctas * (limit + 1024) <= 228 * 1024 or ctas == 1


def test_three_ctas_needs_blk64():
    import cutlass  # noqa: PLC0415

    from jax_sparse_attn.kernels.bsa_fwd_sm90_ws import BsaFwdSm90Ws  # noqa: PLC0415

    with pytest.raises(NotImplementedError, match="sparse_block_size=64"):
        BsaFwdSm90Ws(cutlass.BFloat16, 64, 128, False, 132, three_ctas=True)
    with pytest.raises(ValueError, match="no shared-memory plan"):
        BsaFwdSm90Ws(cutlass.BFloat16, 128, 64, False, 132, three_ctas=True)
    k = BsaFwdSm90Ws(cutlass.BFloat16, 64, 64, False, 132, three_ctas=True)
    assert (k.ctas_per_sm, k.regs_consumer, k.stages) == (3, 136, 3)


@pytest.mark.parametrize("kw,chained", [
    ({}, False), ({"cross_item": 1}, True), ({"cross_item": 2}, True),
    # chaining needs the overlapped mainloop and the next item's Q in a buffer of its own
    ({"cross_item": 1, "q_stages": 1}, False), ({"cross_item": 1, "overlap": False}, False),
    ({"cross_item": 2, "o_alias_first": True}, False),
])
def test_chained_items_need_two_q_buffers(kw, chained):
    import cutlass  # noqa: PLC0415

    from jax_sparse_attn.kernels.bsa_fwd_sm90_ws import BsaFwdSm90Ws  # noqa: PLC0415

    k = BsaFwdSm90Ws(cutlass.BFloat16, 128, 128, False, 132, **kw)
    assert k.cross_item == chained
    assert k.cross_epi_first == (chained and kw.get("cross_item") == 2)


def test_pair_wg_keys():
    """``pairwg`` reaches the key at blk 64 (D 64 and 128; at D 64 instead of the three CTAs
    per SM) without split-KV, ``pack_gqa`` and the options that change the item walk or the Q
    buffers; elsewhere the key is the one without it."""
    dt = jnp.bfloat16
    pair = Switches(bsa_fwd_ws=("pairwg",))
    for d in (64, 128):
        k = bsa.fwd_config(dt, d, 64, True, pair)
        assert k.ws_pair_wg and not (k.ws_three_ctas or k.ws_k_single), d
        assert bsa.fwd_config(dt, d, 64, True, pair, causal=True).ws_pair_wg
        assert not bsa.fwd_config(dt, d, 64, True, Switches()).ws_pair_wg
        assert bsa.fwd_config(dt, d, 128, False, pair) == bsa.fwd_config(dt, d, 128, False,
                                                                          Switches())
    splits = {"kv_splits": 3, "num_rows": 8, "k_max": 16}
    for kw in ({"pack_gqa": 4}, splits):
        assert bsa.fwd_config(dt, 128, 64, False, pair, **kw) == bsa.fwd_config(
            dt, 128, 64, False, Switches(), **kw), kw
    for more in ("ctas3k1", "selfload", "streamk", "cross", "crossepi", "mpre", "qahead",
                 "oalias"):
        k = bsa.fwd_config(dt, 128, 64, False, Switches(bsa_fwd_ws=("pairwg", more)))
        assert not k.ws_pair_wg, more
        assert k == bsa.fwd_config(dt, 128, 64, False, Switches(bsa_fwd_ws=(more,))), more
    for more in ("nopingpong", "nooverlap", "q1", "notmao", "qregs", "vlag", "stages=3"):
        assert bsa.fwd_config(dt, 128, 64, False,
                              Switches(bsa_fwd_ws=("pairwg", more))).ws_pair_wg, more


@pytest.mark.parametrize("d,stages", [(128, 2), (64, 4)])
def test_pair_wg_kernel_shape(d, stages):
    """``pair_items``: one CTA per SM of 384 threads (producer warpgroup, two consumer
    warpgroups of 64-row work items), each warpgroup's ring set planned as one of two CTAs
    per SM would be, the two sets, their mbarriers and the turn flags within the SM's shared
    memory; the combinations the kernel does not implement raise NotImplementedError."""
    import cutlass  # noqa: PLC0415

    from jax_sparse_attn.kernels.bsa_fwd_sm90_ws import BsaFwdSm90Ws  # noqa: PLC0415

    bf16 = cutlass.BFloat16
    k = BsaFwdSm90Ws(bf16, d, 64, False, 132, pair_items=True)
    assert (k.num_wg, k.bm, k.ctas_per_sm, k.num_threads) == (2, 64, 1, 384)
    assert (k.stages, k.q_stages, k.o_alias_q, k.pingpong) == (stages, 2, False, True)
    assert (k.regs_producer, k.regs_consumer) == (24, 240)
    assert (k._rings(), k._q_slices()) == (2, 1)
    # two rings of buffers (Q, K, V, O), the mbarriers and the turn flags (1 KiB each,
    # rounded up) within one CTA's limit
    per_ring = 2 * 64 * d * 2 + stages * 64 * 2 * d * 2 + 64 * d * 2
    assert 2 * per_ring + 2 * 1024 <= SMEM_LIMIT
    assert not BsaFwdSm90Ws(bf16, d, 64, False, 132, pair_items=True, pingpong=False).pingpong
    for kw in ({"three_ctas": True}, {"kv_splits": 2}, {"pack_gqa": 2}, {"stream_k": True},
               {"cross_item": 1}, {"meta_prefetch": True}, {"q_ahead": True},
               {"o_alias_first": True}):
        with pytest.raises(NotImplementedError, match="pair_items needs"):
            BsaFwdSm90Ws(bf16, d, 64, False, 132, pair_items=True, **kw)
    with pytest.raises(NotImplementedError, match="pair_items needs"):
        BsaFwdSm90Ws(bf16, d, 128, False, 132, pair_items=True)
