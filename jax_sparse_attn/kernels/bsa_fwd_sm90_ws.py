"""Block-sparse attention forward for SM90 on the warp-specialized TMA + wgmma mainloop
(``impl="sm90ws"``).

Contract and semantics are those of :mod:`bsa_fwd_sm80` (tensor modes
``q, k, v, out: (B, S, H, D)`` in the caller's physical layout, ``q2k_block_index (B, H_q, N_q,
K_max)``, ``q2k_block_nums (B, H_q, N_q)``, optional ``block_sizes (B, H_q, N_kv)``, ``lse
(B, H_q, S_q)`` fp32 natural log). The TMA producer, pipelines, persistent loop, mainloop
and smem epilogue are those of ``attn_fwd_sm90_ws.AttnFwdSm90Ws`` (shared with the HSTU
forward :mod:`hstu_fwd_sm90_ws`, whose docstring describes them); this class supplies the
block-sparse variation points:

* KV tiles (``block_info.BlockList``): query block ``m`` visits the KV blocks listed in the
  active prefix of its row, one KV tile per listed block (``tile_n = sparse_block_size``); the
  producer reads the same list and TMA-loads only those K/V blocks. Counts are clamped to
  ``[0, K_max]`` and indices to ``[0, N_kv - 1]``.
* Loads: TMA boxes over ``(S, D, H, B)`` views of q / k / v (the batch is its own TMA mode, so
  a box that crosses ``S`` is zero-filled by the hardware and never reads the next batch).
  A V block with fewer valid keys than ``tile_n`` (``block_sizes``) is copied by the producer
  warp with cp.async, rows past the valid count zero-filled (``0 * NaN`` is NaN), fenced for
  the async proxy, then published with a plain arrival on the full barrier.
* Score plug point: key columns at or past the block's valid count become ``-inf``
  (``mask.KeyLimitMask``, a select), then the online softmax (``softmax.OnlineSoftmax``).
  ``causal`` (static): the valid count is also capped at the keys the query block's last row
  sees (``BlockList`` ``key_end``; the V rows past it are zero-filled), and a block that
  crosses the diagonal of a warpgroup's rows gets the per-row causal limit
  (``KeyLimitMask.apply_causal``); blocks at or below it need no mask, a block entirely above
  it is fully masked with zero V (it costs its GEMMs and contributes nothing). With
  ``pack_gqa`` a packed row's causal limit is that of its position (row // r).
  With ``overlap`` the PV GEMM of block ``j - 1`` runs while block ``j``'s softmax is
  computed; the O accumulator is rescaled after that GEMM completes.
* Epilogue: ``O / l`` in 16 bit through swizzled shared memory to row-predicated 128-bit
  global stores, ``lse = scale m + ln l``; a row with no visible key gets ``O = 0`` and
  ``lse = -inf``; rows past ``S_q`` are never written.

CTA shapes: ``sparse_block_size = 128``: 384 threads (producer warpgroup + two consumer
warpgroups of 64 query rows, sharing each K/V load, ping-pong), one CTA per SM.
``sparse_block_size = 64``: 256 threads (producer warpgroup + one consumer warpgroup owning a
64-row query block), two CTAs per SM, or three with ``three_ctas`` (75 KiB of shared memory
and 136 consumer registers each; the caller sets it at D = 64). Work items (query block, query head, batch) are walked
by a persistent scheduler: ``head_major`` (default) ``tile_scheduler.HeadMajorScheduler``
(batch, KV head, query block, query head of the group fastest: the CTAs running at one time
share one KV head's K/V in L2, and the heads of a GQA group read the same K/V blocks
together), else ``StaticLptScheduler`` (query block, then head fastest: the CTAs running at
one time span every head, whose K/V together can exceed L2).
Implemented for D in {64, 128}; other head dims use the mma.sync kernel (``bsa_fwd_sm80``).

Split-KV (``kv_splits = S > 1``, a compile-time option; ``S = 1`` compiles none of this): the
work items are (query block, split, query head), a row's ``S * H_q`` items consecutive with
the heads of one split adjacent; split ``s`` visits the chunk ``[s c, min((s + 1) c, n))`` of
its row's active list, ``c = ceil(n / S)`` (``block_info.BlockListSplit``). ``mO`` / ``mLSE``
are then the fp32 partials ``(S, B, H_q, S_q, D)`` / ``(S, B, H_q, S_q)``: the split's output
normalised by its own softmax denominator, stored from registers, and its natural-log LSE; a
split without keys stores zeros and ``-inf``. ``bsa_combine`` merges them.

Packed GQA (``pack_gqa = r > 1``, static; ``r = H_q / H_kv`` divides 64): a work item is a
block of packed query rows of one KV head, packed row ``p`` of KV head ``g`` being position
``p // r`` of query head ``g r + p % r`` (``pack_gqa.packed_row``), so the ``r`` heads of a
group share each K/V load. The metadata are indexed by (batch, KV head, packed block) ``(B,
H_kv, ceil(S_q r / bm), K_max)``; Q is loaded with one 5-D TMA box per 64-row slice
(``pack_gqa.pack_rows_view``); each packed row ``< S_q r`` is stored to its own (position,
query head) row of ``out`` / ``lse`` (``_store_o_packed``). With ``kv_splits > 1`` the work
items are (packed block, split, KV head) and split ``s`` visits chunk ``s`` of the packed
row's list as above; ``_epilogue_split`` stores each packed row's fp32 partial and LSE to
the (position, query head) row of the unpacked partials ``(S, B, H_q, S_q, D)`` / ``(S, B,
H_q, S_q)``, so the combine kernel is the unpacked one."""

from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from .attn_fwd_sm90_ws import SMEM_LIMIT, AttnFwdSm90Ws, WorkItem, smem_plan
from .block_info import BlockList, BlockListSplit
from .common import (acc_mn_view_wg, elem_ptr, gmem_store_copy, stage_acc_swz, swz_piece_ptr,
                     tma_view)
from .mask import KeyLimitMask
from .pack_gqa import pack_rows_view, packed_row, row_tile_view
from .softmax import OnlineSoftmax
from .tile_scheduler import HeadMajorScheduler, StaticLptScheduler

# two CTAs per SM: 228 KiB of shared memory per SM less 1 KiB reserved per CTA
SMEM_LIMIT_2CTA = 113 * 1024
# three CTAs per SM (blk 64, ``three_ctas``): a third of it, less 1 KiB
SMEM_LIMIT_3CTA = 75 * 1024


def bsa_ws_smem_plan(d: int, bm: int, bn: int, limit: int, max_stages: int = 4,
                     q_stages: int = 2, alias_first: bool = False):
    """(K/V stages, Q stages, whether O's smem buffer aliases Q's) within ``limit`` bytes
    (``attn_fwd_sm90_ws.smem_plan`` with ``D_v = D``; the struct is exactly the buffers
    plus the mbarriers padded to 1 KiB, so ``limit`` may be met to the byte)."""
    try:
        return smem_plan(d, d, bm, bn, limit, max_stages, q_stages, alias_first=alias_first,
                         reserve=1024)
    except ValueError:
        raise ValueError(
            f"no shared-memory plan for head_dim={d}, sparse_block_size={bn}") from None


@dataclass(frozen=True)
class _Tile:
    """A consumer warpgroup's context for one work item (its 64 rows from ``mw0``)."""

    mw0: object
    mask: object
    smax: object
    seqlen_q: object
    mO: object
    mLSE: object
    split: object = None  # split-KV: this item's split


class BsaFwdSm90Ws(AttnFwdSm90Ws):
    def __init__(self, dtype, head_dim: int, block_size: int, has_block_sizes: bool,
                 num_sms: int, overlap: bool = True, pingpong: bool = True,
                 max_stages: int = 4, q_stages: int = 2, pack_gqa: int = 1,
                 causal: bool = False, kv_splits: int = 1, head_major: bool = True,
                 lazy_rescale: bool = False, three_ctas: bool = False,
                 o_alias_first: bool = False, cross_item: int = 0, v_lag: bool = False,
                 split_wait: bool = False, pdl: bool = False, q_regs: bool = False,
                 meta_prefetch: bool = False, q_ahead: bool = False, epi_vec: bool = False):
        self.pdl = pdl
        # the epilogue's O staging as packed pair stores into a row-swizzled tile, copied
        # out in 16-byte pieces (AttnFwdSm90Ws._epi_vec; packed rows: _store_o_packed)
        self.epi_vec = epi_vec
        # the producer and the consumers load the next work item's listed-block count (the
        # producer also its first list entry) while the current item runs
        self.meta_prefetch = meta_prefetch or q_ahead
        # the producer issues the next work item's Q during the current item (after its
        # first K / V stages) instead of at the next item's start (needs two Q buffers)
        self.q_ahead = q_ahead and kv_splits == 1 and q_stages >= 2
        self.split_wait = split_wait
        if block_size not in (64, 128) or head_dim not in (64, 128):
            raise NotImplementedError(
                f"bsa_fwd_sm90_ws implements head_dim in (64, 128) and sparse_block_size in "
                f"(64, 128), got head_dim={head_dim}, sparse_block_size={block_size}")
        self.dtype = dtype
        self.d = head_dim
        self.dv = head_dim
        self.bn = block_size
        self.wg_m = 64
        self.num_wg = block_size // 64
        self.bm = 64 * self.num_wg
        self.has_sizes = has_block_sizes
        self.causal = causal
        self.overlap = overlap
        self.pingpong = pingpong and self.num_wg == 2
        self.ctas_per_sm = 1 if self.num_wg == 2 else 2
        if three_ctas:
            if self.num_wg != 1:
                raise NotImplementedError("three CTAs per SM need sparse_block_size=64")
            self.ctas_per_sm = 3
        limit = {1: SMEM_LIMIT, 2: SMEM_LIMIT_2CTA, 3: SMEM_LIMIT_3CTA}[self.ctas_per_sm]
        self.stages, self.q_stages, self.o_alias_q = bsa_ws_smem_plan(
            head_dim, self.bm, block_size, limit, max_stages, q_stages, o_alias_first)
        self.num_sms = num_sms
        # chained work items (``AttnFwdSm90Ws._consume_items``): needs the overlapped
        # mainloop and the next item's Q in its own buffer
        # (``cross_item``: 0 off, 1 on, 2 on with the last PV GEMM issued before the next
        # item's first S GEMM and the epilogue while that one runs)
        self.cross_item = (bool(cross_item) and overlap and self.q_stages >= 2
                           and not self.o_alias_q)
        self.cross_epi_first = self.cross_item and cross_item == 2
        # Q as the register operand of S = Q K^T (AttnFwdSm90Ws._q_regs; not with chained
        # items, whose next Q slice is read from shared memory)
        self.q_regs = q_regs and not self.cross_item
        # the producer issues V tile j after K tile j + 1 (the PV GEMM lags the S GEMM)
        self.v_lag = v_lag
        self.kv_splits = kv_splits
        self.head_major = head_major
        # lazy_rescale: rows keep a stale max up to 2^8 below the true one (softmax.py)
        self.rescale_threshold = 8.0 if lazy_rescale else None
        self.num_threads = 128 * (1 + self.num_wg)
        # register budget per CTA: 65536 / ctas_per_sm = 128 * (producer + num_wg * consumer)
        self.regs_producer = 24
        self.regs_consumer = 240 if self.num_wg == 2 else 232
        if self.ctas_per_sm == 3:
            # 80 registers per thread at launch (65536 / 768, multiple of 8): the producer
            # warpgroup's 56 spare registers go to the consumer warpgroup
            self.regs_consumer = 136
        # pack_gqa: r = H_q / H_kv query heads per work item (1: off); r divides the 64-row
        # warpgroup tile, so a Q slice is one (D, r, 64 / r) TMA box
        if 64 % pack_gqa:
            raise NotImplementedError(
                f"bsa_fwd_sm90_ws packs GQA groups of a size dividing 64, got {pack_gqa}")
        self.pack = pack_gqa

    @staticmethod
    def can_implement(dtype, head_dim: int, block_size: int) -> bool:
        return (dtype in (cutlass.Float16, cutlass.BFloat16) and head_dim in (64, 128)
                and block_size in (64, 128))


    @cute.jit
    def __call__(self, mQ, mK, mV, mIdx, mNums, mSizes, mScale, mO, mLSE, stream):
        d = self.d
        mma_qk, mma_qk0, mma_pv, sQ_layout, sK_layout, sV_layout, sO_layout = (
            self._mmas_and_layouts())
        # TMA views: Q, K as (S, D, H, B) (D contiguous), V as (D, S, H, B) (MN-major B operand)
        tQ, tK, tV = tma_view(mQ, d), tma_view(mK, d), tma_view(mV, d, d_first=True)
        B = mQ.shape[0]
        S_q = mQ.shape[1]
        H_q = mQ.shape[2]
        if cutlass.const_expr(self.pack > 1):
            # work items are (packed block, KV head, batch); Q rows are packed rows
            tQ = pack_rows_view(tQ, self.pack, 0, 2)
            S_q = S_q * self.pack
            H_q = mK.shape[2]
        tma_q, tma_tQ, tma_k, tma_tK, tma_v, tma_tV = self._tma_atoms(
            tQ, tK, tV, sQ_layout, sK_layout, sV_layout)
        Smem = self._smem_struct(sQ_layout, sK_layout, sV_layout, sO_layout)
        n_q_blocks = (S_q + self.bm - 1) // self.bm
        n_work = B * n_q_blocks * H_q
        if cutlass.const_expr(self.kv_splits > 1):
            n_work = n_work * self.kv_splits
        grid = StaticLptScheduler.grid(n_work, self.num_sms * self.ctas_per_sm)
        self.kernel(
            tma_q, tma_tQ, tma_k, tma_tK, tma_v, tma_tV, mV, mIdx, mNums, mSizes, mScale, mO,
            mLSE, sQ_layout, sK_layout, sV_layout, sO_layout, mma_qk, mma_qk0, mma_pv, Smem,
        ).launch(grid=grid, block=[self.num_threads, 1, 1], smem=Smem.size_in_bytes(),
                 stream=stream, min_blocks_per_mp=self.ctas_per_sm, use_pdl=self.pdl,
                 # two CTAs per SM need the largest shared-memory carveout (percent)
                 preferred_smem_carveout=100 if self.ctas_per_sm > 1 else None)

    @cute.jit
    def _work(self, sched, t, n_q_blocks, mIdx, mNums, mSizes, seqlen_k, seqlen_q=None,
              n_heads=None, nums=None):
        """(batch, query head, query block, its BlockList) of work item ``t`` (packed: KV
        head and packed block; ``seqlen_q``: causal only); split-KV: the split's part of the
        list (``BlockListSplit``) and the split, last. ``nums``: the item's raw
        ``q2k_block_nums`` entry, loaded earlier (``_item_meta``)."""
        slot, head = sched.coords(t)
        split = None
        if cutlass.const_expr(self.kv_splits > 1):
            split = head // n_heads
            head = head - split * n_heads
        batch = slot // n_q_blocks
        m_block = slot - batch * n_q_blocks
        if cutlass.const_expr(self.causal and self.pack > 1):
            # ---- causal, packed rows (``seqlen_q`` = S_q r): the last row's position is
            # (last packed row) // r
            key_end = ((cutlass.min((m_block + 1) * self.bm, seqlen_q) - 1) // self.pack + 1
                       + seqlen_k - seqlen_q // self.pack)
            blist = BlockList.create(mIdx, mNums, mSizes, batch, head, m_block, seqlen_k,
                                     self.bn, self.has_sizes, key_end, nums)
        elif cutlass.const_expr(self.causal):
            # ---- causal: one past the last key the query block's last row sees
            key_end = cutlass.min((m_block + 1) * self.bm, seqlen_q) + seqlen_k - seqlen_q
            blist = BlockList.create(mIdx, mNums, mSizes, batch, head, m_block, seqlen_k,
                                     self.bn, self.has_sizes, key_end, nums)
        else:
            blist = BlockList.create(mIdx, mNums, mSizes, batch, head, m_block, seqlen_k,
                                     self.bn, self.has_sizes, None, nums)
        if cutlass.const_expr(self.kv_splits > 1):
            return batch, head, m_block, BlockListSplit.create(blist, split, self.kv_splits), split
        return batch, head, m_block, blist

    @cute.jit
    def _item_meta(self, sched, t, n_q_blocks, mIdx, mNums, n_heads):
        """Work item ``min(t, last)``'s raw ``q2k_block_nums`` entry and first
        ``q2k_block_index`` entry (its list position 0; 0 where ``K_max`` is 0), the loads
        issued here and their values used an item later (``meta_prefetch``)."""
        t = cutlass.min(t, sched.n_work - 1)
        slot, head = sched.coords(t)
        if cutlass.const_expr(self.kv_splits > 1):
            head = head - (head // n_heads) * n_heads
        batch = slot // n_q_blocks
        m_block = slot - batch * n_q_blocks
        first = Int32(0)
        if Int32(mIdx.shape[3]) > 0:
            first = Int32(mIdx[batch, head, m_block, 0])
        return Int32(mNums[batch, head, m_block]), first

    @cute.kernel
    def kernel(self, tma_q, tma_tQ, tma_k, tma_tK, tma_v, tma_tV, mV, mIdx, mNums, mSizes,
               mScale, mO, mLSE, sQ_layout, sK_layout, sV_layout, sO_layout, mma_qk, mma_qk0,
               mma_pv, Smem: cutlass.Constexpr):
        tidx, _, _ = cute.arch.thread_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg_idx = warp // 4
        bm, wgm = self.bm, self.wg_m
        if cutlass.const_expr(self.kv_splits > 1):
            # fp32 partials: mLSE is (S, B, H_q, S_q)
            n_batch = mLSE.shape[1]
            seqlen_q = mLSE.shape[3]
            n_heads = mLSE.shape[2]
        else:
            n_batch = mO.shape[0]
            seqlen_q = mO.shape[1]
            n_heads = mO.shape[2]
        seqlen_k = mV.shape[1]
        group = n_heads // mV.shape[2]
        if cutlass.const_expr(self.pack > 1):
            # (packed block, KV head, batch) items over S_q r packed rows
            seqlen_q = seqlen_q * self.pack
            n_heads = mV.shape[2]
            group = 1
        n_q_blocks = (seqlen_q + bm - 1) // bm
        # split-KV: "heads" of the schedule are (split, head) pairs, split-major
        n_hs = n_heads
        if cutlass.const_expr(self.kv_splits > 1):
            n_hs = n_heads * self.kv_splits
        if cutlass.const_expr(self.head_major):
            sched = HeadMajorScheduler(n_hs, n_batch * n_q_blocks * n_hs, n_hs // n_heads * group,
                                       group, n_q_blocks, n_heads // group)
        else:
            sched = StaticLptScheduler(n_hs, n_batch * n_q_blocks * n_hs)
        st, pipe_q, pipe_k, pipe_v, sQ, sK, sV, q_bytes, k_bytes, v_bytes = (
            self._smem_and_pipes(Smem, sQ_layout, sK_layout, sV_layout, tma_q, tma_k, tma_v,
                                 warp))

        if wg_idx == 0:
            # ================================ producer ================================
            cute.arch.setmaxregister_decrease(self.regs_producer)
            if warp == 0:
                lane, sV_rows, c_q, c_kv, t = self._producer_warp_start(sV, sched)
                if cutlass.const_expr(self.meta_prefetch):
                    # the next item's count and first entry load while this item's K / V
                    # loads go out
                    nums, first = self._item_meta(sched, t, n_q_blocks, mIdx, mNums, n_heads)
                    # q_ahead: 1 while the current item's Q still has to be issued
                    q_mine = Int32(1)
                    while sched.valid(t):
                        t_next = sched.next(t)
                        nums_next, first_next = self._item_meta(sched, t_next, n_q_blocks,
                                                                mIdx, mNums, n_heads)
                        batch, head, m_block, blist = self._work(
                            sched, t, n_q_blocks, mIdx, mNums, mSizes, seqlen_k, seqlen_q,
                            n_heads, nums)[:4]
                        work = WorkItem(blist, head, mV, batch=batch, head_kv=head // group)
                        first_entry = None
                        if cutlass.const_expr(self.kv_splits == 1):
                            first_entry = first
                        if cutlass.const_expr(self.q_ahead):
                            nbatch, nhead, nm_block, nblist = self._work(
                                sched, cutlass.min(t_next, sched.n_work - 1), n_q_blocks, mIdx,
                                mNums, mSizes, seqlen_k, seqlen_q, n_heads, nums_next)[:4]
                            nwork = WorkItem(nblist, nhead, mV, batch=nbatch,
                                             head_kv=nhead // group)
                            # the next item's Q goes out during this one when both have
                            # blocks (an item without blocks has no Q)
                            go = Int32(0)
                            if sched.valid(t_next):
                                if nblist.n_count > 0:
                                    if blist.n_count > 0:
                                        go = Int32(1)
                            c_q, c_kv = self._produce(
                                work, m_block, tma_q, tma_tQ, tma_k, tma_tK, tma_v, tma_tV, sQ,
                                sK, sV, sV_rows, pipe_q, pipe_k, pipe_v, q_bytes, k_bytes,
                                v_bytes, c_q, c_kv, lane, first_entry, q_mine,
                                (nwork, nm_block, go))
                            q_mine = 1 - go
                        else:
                            c_q, c_kv = self._produce(
                                work, m_block, tma_q, tma_tQ, tma_k, tma_tK, tma_v, tma_tV, sQ,
                                sK, sV, sV_rows, pipe_q, pipe_k, pipe_v, q_bytes, k_bytes,
                                v_bytes, c_q, c_kv, lane, first_entry)
                        nums = nums_next
                        first = first_next
                        t = t_next
                else:
                    while sched.valid(t):
                        batch, head, m_block, blist = self._work(
                            sched, t, n_q_blocks, mIdx, mNums, mSizes, seqlen_k, seqlen_q,
                            n_heads)[:4]
                        head_kv = head // group
                        work = WorkItem(blist, head, mV, batch=batch, head_kv=head_kv)
                        c_q, c_kv = self._produce(
                            work, m_block, tma_q, tma_tQ, tma_k, tma_tK, tma_v, tma_tV, sQ, sK,
                            sV, sV_rows, pipe_q, pipe_k, pipe_v, q_bytes, k_bytes, v_bytes, c_q,
                            c_kv, lane)
                        t = sched.next(t)
        else:
            # ================================ consumers ===============================
            wg, wtid, turns = self._consumer_start(wg_idx, tidx)
            softmax_scale = Float32(mScale[0])
            thr_mma_qk, thr_mma_pv, tSrQ, tSrK, tOrV, tSc = self._consumer_fragments(
                mma_qk, mma_qk0, mma_pv, sQ, sK, sV, wtid)
            tScS = acc_mn_view_wg(tSc)
            mask = KeyLimitMask(tScS)
            smax = OnlineSoftmax.create(cute.size(tScS, mode=[0]), softmax_scale,
                                        self.rescale_threshold)
            sO = self._o_buffer(st, sO_layout, wg)

            turns.start(wg)
            smaxes = (smax, smax)
            if cutlass.const_expr(self.cross_item):
                # the next item's first score tile needs its own softmax state
                smaxes = (smax, OnlineSoftmax.create(cute.size(tScS, mode=[0]), softmax_scale,
                                                     self.rescale_threshold))
            ctx = (sched, n_q_blocks, mIdx, mNums, mSizes, seqlen_k, seqlen_q, n_heads, mV,
                   mask, smaxes, mO, mLSE, wg)
            if cutlass.const_expr(self.cross_item):
                self._consume_items(sched, sched.n_work, ctx, mma_qk, mma_qk0, mma_pv,
                                    thr_mma_qk, thr_mma_pv, tSrQ, tSrK, tOrV, pipe_q, pipe_k,
                                    pipe_v, sO, turns, wg, wtid)
            elif cutlass.const_expr(self.meta_prefetch):
                # the next item's count loads while this item runs
                c_q, c_kv, t = self._loop_start(sched)
                nums = self._item_meta(sched, t, n_q_blocks, mIdx, mNums, n_heads)[0]
                while sched.valid(t):
                    t_next = sched.next(t)
                    nums_next = self._item_meta(sched, t_next, n_q_blocks, mIdx, mNums,
                                                n_heads)[0]
                    work, tile, _ = self._decode(t, ctx, 0, nums)
                    c_kv, c_q = self._consume(
                        work, tile, mma_qk, mma_qk0, mma_pv, thr_mma_qk, thr_mma_pv, tSrQ,
                        tSrK, tOrV, pipe_q, pipe_k, pipe_v, c_q, c_kv, sO, turns, wg, wtid)
                    nums = nums_next
                    t = t_next
            else:
                c_q, c_kv, t = self._loop_start(sched)
                while sched.valid(t):
                    work, tile, _ = self._decode(t, ctx, 0)
                    c_kv, c_q = self._consume(
                        work, tile, mma_qk, mma_qk0, mma_pv, thr_mma_qk, thr_mma_pv, tSrQ,
                        tSrK, tOrV, pipe_q, pipe_k, pipe_v, c_q, c_kv, sO, turns, wg, wtid)
                    t = sched.next(t)

    @cute.jit
    def _decode(self, t, ctx, which: cutlass.Constexpr, nums=None):
        """Item ``t``'s work, tile context (with softmax state ``which``; chained items,
        ``_consume_items``: 0 or 1) and listed-block count; ``nums``: its raw
        ``q2k_block_nums`` entry, loaded earlier."""
        (sched, n_q_blocks, mIdx, mNums, mSizes, seqlen_k, seqlen_q, n_heads, mV, mask, smaxes,
         mO, mLSE, wg) = ctx
        item = self._work(sched, t, n_q_blocks, mIdx, mNums, mSizes, seqlen_k, seqlen_q,
                          n_heads, nums)
        batch, head, m_block, blist = item[:4]
        split = None
        if cutlass.const_expr(self.kv_splits > 1):
            split = item[4]
        tile = _Tile(m_block * self.bm + wg * self.wg_m, mask, smaxes[which], seqlen_q, mO,
                     mLSE, split)
        return WorkItem(blist, head, mV, batch=batch), tile, blist.n_count

    @cute.jit
    def _handoff(self, tile, next_tile):
        """The next item's running max and sum become the current softmax state."""
        tile.smax.row_max.store(next_tile.smax.row_max.load())
        tile.smax.row_sum.store(next_tile.smax.row_sum.load())

    # ------------------------------------------------- variation points (AttnFwdSm90Ws)
    def _q_tile(self, tma_tQ, work):
        return tma_tQ[None, None, work.head, work.batch]

    def _k_tile(self, tma_tK, work):
        return tma_tK[None, None, work.head_kv, work.batch]

    def _v_tile(self, tma_tV, work):
        return tma_tV[None, None, work.head_kv, work.batch]

    def _v_limit(self, work, n):
        """Valid keys of block ``n``; a box crossing S is zero-filled by TMA, so only
        block_sizes partial blocks inside S need the zero-filling copy."""
        limit = work.kv.valid_keys(n)
        return limit, limit >= cutlass.min(Int32(self.bn), work.kv.seqlen_k - n * self.bn)

    @cute.jit
    def _load_v_rows(self, work, n, limit, sV_rows, stage, lane):
        """One warp: V rows [n bn, n bn + limit) by cp.async, zeros in the rest of the tile."""
        gV = cute.local_tile(work.mV[work.batch, None, work.head_kv, None], (self.bn, self.d),
                             (n, 0))
        self._copy_v_rows(gV, limit, sV_rows, stage, lane)

    def _work_start(self, tile):
        tile.smax.reset()

    def _work_rows(self, work, tile):
        return None

    @cute.jit
    def _tile_state(self, acc_O, tile):
        """The online softmax's per-row correction factors, the row view of O, the softmax."""
        corr = cute.make_rmem_tensor((cute.size(tile.mask.tScS, mode=[0]),), Float32)
        return corr, acc_mn_view_wg(acc_O), tile.smax

    def _tile_pre(self, work, tile, rows, it):
        """The valid key count of iteration ``it``'s block (metadata loads issued before the
        QK GEMM is waited on); causal: with the tile's ``row_lim0`` (``mask.KeyLimitMask``)."""
        if self.causal:
            n = work.kv.kv_tile(it)
            if self.pack > 1:
                # packed rows: tile.mw0 (a multiple of 64, so of r) is position mw0 / r and
                # tile.seqlen_q is S_q r
                row_lim0 = (tile.mw0 // self.pack + work.kv.seqlen_k
                            - tile.seqlen_q // self.pack + 1 - n * self.bn)
            else:
                row_lim0 = tile.mw0 + work.kv.seqlen_k - tile.seqlen_q + 1 - n * self.bn
            return work.kv.valid_keys(n), row_lim0
        return work.kv.valid_keys(work.kv.kv_tile(it))

    @cute.jit
    def _tile_p(self, acc_S, work, tile, rows, state, pre, it):
        """Key mask and online-softmax step of a score tile -> the 16-bit P fragment;
        without ``overlap`` O is rescaled here (its PV GEMM has completed)."""
        corr, acc_O_mn, _ = state
        self._score_tile(acc_S, pre, tile.mask, tile.smax, corr)
        if cutlass.const_expr(not self.overlap):
            tile.smax.rescale(acc_O_mn, corr)
        rP = cute.make_fragment_like(acc_S, self.dtype)
        rP.store(acc_S.load().to(self.dtype))
        return rP

    @cute.jit
    def _pv_done(self, acc_O, state):
        """O holds P_{j-1} V_{j-1} now: bring it to block j's running max."""
        corr, acc_O_mn, smax = state
        smax.rescale(acc_O_mn, corr)

    @cute.jit
    def _score_tile(self, acc_S, limit, mask, smax, corr):
        """Mask the keys past the block's valid count ``limit``, then the online-softmax
        step. The caller reads ``limit`` (metadata loads) before it waits for the GEMM, so
        their latency hides behind it."""
        acc_mn = acc_mn_view_wg(acc_S)
        if cutlass.const_expr(self.causal):
            # ---- causal: ``limit`` is (valid count, row_lim0); only diagonal-crossing or
            # partial blocks are masked
            key_lim, row_lim0 = limit
            if cutlass.min(key_lim, row_lim0) < self.bn:
                mask.apply_causal(acc_mn, key_lim, row_lim0, self.pack)
        else:
            if limit < self.bn:
                mask.apply(acc_mn, limit)
        smax.step(acc_mn, corr)

    @cute.jit
    def _epilogue(self, acc_O, work, tile, thr_mma_pv, sO, wg, wtid, has_work):
        """``O / l`` -> 16 bit -> smem (swizzled) -> 128-bit stores of rows ``< S_q``; LSE
        (``lse = -inf`` and ``O = 0`` for a work item without listed blocks). Split-KV: the
        split's fp32 partial ``O / l`` and LSE (``_epilogue_split``)."""
        if cutlass.const_expr(self.kv_splits > 1):
            self._epilogue_split(acc_O, work, tile, thr_mma_pv, wtid)
        else:
            self._epilogue_out(acc_O, work, tile, thr_mma_pv, sO, wg, wtid, has_work)

    @cute.jit
    def _epilogue_split(self, acc_O, work, tile, thr_mma_pv, wtid):
        """Split-KV: ``O / l`` of this warpgroup's rows ``< S_q`` in fp32 from registers into
        ``mO[split, b, h]`` and their LSE into ``mLSE[split, b, h]`` (a split without keys:
        ``O = 0`` from the zero-filled accumulator, ``lse = -inf``). Packed rows (``pack_gqa``;
        ``work.head`` is the KV head, rows ``mw0 + i < S_q r``): each row into the row
        ``mO[split, b, h, s]`` / ``mLSE[split, b, h, s]`` of its (position ``s``, query head
        ``h``) (``pack_gqa.packed_row``). No shared memory: an item without KV tiles must
        not touch the Q buffer the producer may be refilling."""
        wgm, d = self.wg_m, self.d
        mw0 = tile.mw0
        lim = tile.seqlen_q - mw0
        acc_O_mn = acc_mn_view_wg(acc_O)
        tOcO_mn = acc_mn_view_wg(thr_mma_pv.partition_C(cute.make_identity_tensor((wgm, d))))
        if cutlass.const_expr(self.pack == 1):
            mLSE_s = tile.mLSE[tile.split, work.batch, work.head, None]
        for r in cutlass.range_constexpr(cute.size(acc_O_mn, mode=[0])):
            inv, lse = tile.smax.finalize(r)
            row = tOcO_mn[r, 0][0]
            if row < lim:
                if cutlass.const_expr(self.pack > 1):
                    s, h = packed_row(mw0 + row, work.head, self.pack)
                    if wtid % 4 == 0:
                        tile.mLSE[tile.split, work.batch, h, s] = lse
                    # a (wgm, d) view whose every row is global row (s, h): the
                    # accumulator's partition of it addresses this thread's columns of it
                    gRow = cute.make_tensor(
                        tile.mO[tile.split, work.batch, h, s, None].iterator,
                        cute.make_layout((wgm, d), stride=(0, 1)))
                    tRow = acc_mn_view_wg(thr_mma_pv.partition_C(gRow))
                    for c in cutlass.range_constexpr(cute.size(acc_O_mn, mode=[1])):
                        tRow[r, c] = acc_O_mn[r, c] * inv
                else:
                    if wtid % 4 == 0:
                        mLSE_s[mw0 + row] = lse
            if cutlass.const_expr(self.pack == 1):
                acc_O_mn[r, None] = acc_O_mn[r, None].load() * inv
        if cutlass.const_expr(self.pack == 1):
            gP = cute.local_tile(tile.mO[tile.split, work.batch, work.head, None, None],
                                 (wgm, d), (mw0 // wgm, 0))
            tPg = thr_mma_pv.partition_C(gP)
            tPc = thr_mma_pv.partition_C(cute.make_identity_tensor((wgm, d)))
            for e in cutlass.range_constexpr(cute.size(acc_O)):
                if tPc[e][0] < lim:
                    tPg[e] = acc_O[e]

    @cute.jit
    def _epilogue_out(self, acc_O, work, tile, thr_mma_pv, sO, wg, wtid, has_work):
        wgm, d = self.wg_m, self.d
        mw0 = tile.mw0
        lim = tile.seqlen_q - mw0
        acc_O_mn = acc_mn_view_wg(acc_O)
        tOcO_mn = acc_mn_view_wg(thr_mma_pv.partition_C(cute.make_identity_tensor((wgm, d))))
        for r in cutlass.range_constexpr(cute.size(acc_O_mn, mode=[0])):
            inv, lse = tile.smax.finalize(r)
            row = tOcO_mn[r, 0][0]
            if row < lim:
                if wtid % 4 == 0:
                    if cutlass.const_expr(self.pack > 1):
                        s, h = packed_row(mw0 + row, work.head, self.pack)
                        tile.mLSE[work.batch, h, s] = lse
                    else:
                        tile.mLSE[work.batch, work.head, mw0 + row] = lse
            acc_O_mn[r, None] = acc_O_mn[r, None].load() * inv
        if cutlass.const_expr(self.pack > 1):
            self._store_o_packed(acc_O, thr_mma_pv, sO, tile.mO, work, mw0, tile.seqlen_q, wg,
                                 wtid, has_work)
        else:
            self._store_o(acc_O, None, thr_mma_pv, sO,
                          tile.mO[work.batch, None, work.head, None], mw0, tile.seqlen_q, wg,
                          wtid, has_work)

    @cute.jit
    def _store_o_packed(self, acc_O, thr_mma_pv, sO, mO, work, mw0, n_rows, wg, wtid,
                        has_work):
        """``_store_o`` for packed rows: 16 bit -> smem -> 128-bit stores of this warpgroup's
        packed rows ``mw0 + i < n_rows`` (``S_q r``), each to its own (position, query head)
        row of ``mO`` (B, S, H, D); an item without KV tiles stores zeros from registers.
        With ``epi_vec`` the tile is staged by ``common.stage_acc_swz`` and read back in
        16-byte pieces, consecutive threads on consecutive pieces of a row."""
        wgm, dv = self.wg_m, self.dv
        bar_id = 3 + wg
        lim = n_rows - mw0
        if has_work:
            if cutlass.const_expr(self._epi_vec()):
                stage_acc_swz(acc_O, thr_mma_pv.partition_C(cute.make_identity_tensor((wgm, dv))),
                              sO.iterator, dv, self.dtype == cutlass.BFloat16)
            else:
                rO = cute.make_fragment_like(acc_O, self.dtype)
                rO.store(acc_O.load().to(self.dtype))
                cute.autovec_copy(rO, thr_mma_pv.partition_C(sO))
            cute.arch.barrier(barrier_id=bar_id, number_of_threads=128)
        if cutlass.const_expr(self._epi_vec()):
            if has_work:
                per = 16 // (self.dtype.width // 8)
                chunks = dv // per
                for it in cutlass.range_constexpr(wgm * chunks // 128):
                    k = it * 128 + wtid
                    row = k // chunks
                    piece = k % chunks
                    if row < lim:
                        s, h = packed_row(mw0 + row, work.head, self.pack)
                        g_ptr = cute.make_ptr(
                            self.dtype, elem_ptr(mO, (work.batch, s, h, piece * per)).toint(),
                            cute.AddressSpace.gmem, assumed_align=16)
                        cute.make_tensor(g_ptr, cute.make_layout(per)).store(
                            cute.make_tensor(swz_piece_ptr(sO.iterator, row, piece, dv,
                                                           self.dtype),
                                             cute.make_layout(per)).load())
            else:
                self._rows_packed(sO, mO, work, mw0, lim, wtid, False)
        else:
            self._rows_packed(sO, mO, work, mw0, lim, wtid, has_work)
        if has_work:
            # every thread's smem reads are done before the buffer is written again
            cute.arch.barrier(barrier_id=bar_id, number_of_threads=128)

    @cute.jit
    def _rows_packed(self, sO, mO, work, mw0, lim, wtid, from_smem):
        """This warpgroup's packed rows ``mw0 + i`` with ``i < lim`` to their (position, query
        head) rows of ``mO`` in 128-bit stores: from the element-copy staging ``sO`` where
        ``from_smem``, else zeros."""
        wgm, dv = self.wg_m, self.dv
        copy_o = gmem_store_copy(self.dtype, 128, dv)
        thr = copy_o.get_slice(wtid)
        tOs = thr.partition_S(sO)
        tOc = thr.partition_S(cute.make_identity_tensor((wgm, dv)))
        for r in cutlass.range_constexpr(cute.size(tOs.shape[1])):
            row = tOc[0, r, 0][0]
            if row < lim:
                s, h = packed_row(mw0 + row, work.head, self.pack)
                tOg = thr.partition_D(row_tile_view(mO, work.batch, s, h, wgm, dv))
                rr = cute.make_fragment_like(tOs[None, r, None])
                if from_smem:
                    cute.autovec_copy(tOs[None, r, None], rr)
                else:
                    rr.fill(0)
                cute.copy(copy_o, rr, tOg[None, r, None])
