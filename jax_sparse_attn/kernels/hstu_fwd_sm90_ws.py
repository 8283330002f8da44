"""HSTU attention forward for SM90: warp-specialized TMA + wgmma mainloop (``impl="sm90ws"``).

Semantics, tile schedule rows and zero-fill conventions are those of ``hstu_fwd_sm80`` (read
its docstring): per sequence and head ``O = (mask * SiLU(alpha Q K^T)) V / scaling_seqlen``;
rows of the pseudo-sequence past ``cu_seqlens_q[-1]`` get zeros.

CTA = 1 + ``num_wg`` warpgroups (``num_wg`` = 2: 384 threads, 128-row query tiles; 3: 512
threads, 192-row tiles, consumers at 160 registers, at head dims up to 64), persistent: the grid's ``G`` CTAs deal the longest-first
work items in rounds of ``G``, alternating direction (``tile_scheduler.SnakeLptScheduler``;
``snake=False``: ``StaticLptScheduler``'s round robin, which gives the lower CTAs the heavier
item of every round):

* warpgroup 0 (producer, ``setmaxnreg`` down to 24 registers): warp 0 walks the work items and
  issues the TMA loads (``cp.async.bulk.tensor``) of the Q tile and of the K and V
  tiles into ``stages``-deep shared-memory rings (``pipeline.SmemPipeline``: full / empty
  mbarriers). The one KV tile that crosses a sequence's end is the exception for V: the warp
  copies its in-sequence rows with cp.async and zero-fills the others (a TMA box would read
  the next sequence's rows, and ``0 * NaN`` is NaN), fences them for the async proxy, then
  arrives on the full barrier.
* warpgroups 1 .. ``num_wg`` (consumers, ``setmaxnreg`` up to 240, or 160 with three): each
  owns 64 query rows of the tile. Per KV tile: ``S = Q K^T`` (wgmma, both operands in smem), the mask
  (``mask.HstuMask``, only on tiles crossing a mask edge or the sequence end: select, never
  multiply), the score function ``P = h + h * tanh(h)``, ``h = (alpha / 2) S`` (one MUFU op),
  ``P`` converted to 16 bit and kept in registers as the A operand of ``O += P V`` (wgmma RS).
* ``overlap=True`` (intra-warpgroup overlap): iteration ``j`` issues ``S_j = Q K_j^T`` and
  ``O += P_{j-1} V_{j-1}`` back to back, waits only for ``S_j`` (``wgmma.wait_group 1``),
  computes ``P_j`` while the PV GEMM runs, then waits for it.
* ``pingpong=True``: the consumer warpgroups take turns issuing their GEMMs, in cyclic order
  (``pipeline.WarpgroupTurns``), so one's pointwise work overlaps the others' GEMMs.
* ``q_scale=True``: each consumer warpgroup multiplies its Q slice by ``alpha / 2`` in shared
  memory once per work item, so ``S`` is ``h`` and no score is multiplied (not with rab).
* epilogue: ``O / scaling_seqlen`` in 16 bit -> swizzled shared memory (a per-warpgroup
  buffer, or the warpgroup's half of the Q buffer where shared memory is short). With
  ``tma_o`` (the default where it applies: no split-KV, O not staged in the Q buffer, ``Dv``
  a multiple of 64) a 64-row slice that ends inside its sequence is staged in the
  128-byte-swizzled operand layout and written by TMA tensor stores at its sequence's row
  offset, which the warpgroup does not wait for; every other slice (a sequence's last,
  partial one: a TMA store box would overwrite the next sequence's rows) goes out by 128-bit
  row-predicated global stores of the rows ``< L_q``.

With a relative attention bias (``has_rab``; ``mRab (B, H_rab, N_k, N_k)``, fp32 or 16-bit,
``rab_per_head`` when ``H_rab = H``), each consumer thread loads the bias elements of its
accumulator fragment from global memory before it waits for the tile's ``S = Q K^T``
(``_rab_load``: one load per pair of adjacent columns when ``N_k`` is even; addresses clamped
into ``rab[b, h]``) and forms ``h = (alpha S + rab) / 2`` before the mask (``_add_rab``: rows
``p = i + L_k - L_q`` outside ``[0, min(L_k, N_k))`` and keys ``j >= min(L_k, N_k)`` get 0).
Without it no bias code is compiled.

The TMA producer, pipelines, persistent loop, mainloop and smem epilogue are those of
``attn_fwd_sm90_ws.AttnFwdSm90Ws``; this class supplies HSTU's variation points (FA4's module
names): ``seqlen_info`` (varlen offsets), ``block_info`` (which KV tiles a Q tile visits:
a range), ``mask`` + the score function (``_tile_p``), and the epilogue's ``1 / scaling_seqlen``.
"""

from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32
from cutlass.cute.nvgpu import cpasync

from . import hstu_common as hc
from .attn_fwd_sm90_ws import SMEM_LIMIT, AttnFwdSm90Ws, WorkItem, smem_plan
from .block_info import BlockInfo
from .common import acc_mn_view_wg, elem_ptr, tma_view
from .mask import HstuMask
from .pipeline import SmemPipeline, fetch_item, publish_item, take_item
from .seqlen_info import SeqlenInfo, offset_rows
from .tile_scheduler import HeadOuterScheduler, SnakeLptScheduler, StaticLptScheduler


#: rows per page of the paged KV cache (``paged_kv.shape[2]``)
PAGE_SIZE = 128


def ws_smem_plan(d: int, dv: int, bn: int, max_stages: int = 4, q_stages: int = 2,
                 q_alias: bool = False, num_wg: int = 2):
    """(K/V stages, Q stages, whether O's smem buffer aliases Q's) that fit the 227 KiB of an
    SM90 CTA with ``64 * num_wg`` query rows (``attn_fwd_sm90_ws.smem_plan``); ``q_alias``:
    one Q buffer that O is staged in, the rest to K/V stages (3 at D = 128 instead of 2)."""
    return smem_plan(d, dv, 64 * num_wg, bn, SMEM_LIMIT, max_stages, q_stages,
                     alias_first=q_alias)


@dataclass(frozen=True)
class _Tile:
    """A consumer warpgroup's context for one work item (its 64 rows ``[mw0, mw1)``)."""

    batch: object
    mw0: object
    mw1: object
    mask: object
    tSc: object
    left: object
    right: object
    alpha_half: object
    inv_scale: object
    mFunc: object
    mRab: object
    mO: object
    split: object = None  # split-KV: this item's key split
    q_base: object = None  # q_scale: the shared-memory pointer of sQ
    tma_o: object = None  # the O store's TMA atom (``tma_o``)
    tma_tO: object = None  # and its coordinate view (T, Dv, H)


class HstuFwdSm90Ws(AttnFwdSm90Ws):
    def __init__(self, dtype, head_dim, head_dim_v, block_n, has_func, func_n, num_sms,
                 overlap=True, pingpong=True, max_stages=4, q_stages=2, silu16=False,
                 has_rab=False, rab_per_head=False, tanh16=False, paged=False,
                 kv_splits=1, page_id_clamp=False, page_prefetch=False, q_alias=False,
                 cross_item=0, v_lag: bool = False, pdl: bool = False,
                 head_outer: bool = False, snake: bool = True, dynamic: bool = False,
                 q_scale: bool = False, num_wg: int = 2, p_late: bool = False,
                 split_wait: bool = False, epi_vec: bool = False, tma_o: bool = False,
                 rab_prefetch: bool = False):
        self.pdl = pdl
        # rab_prefetch: the producer warp issues L2 prefetches of the bias rows of each KV
        # tile right after that tile's K / V loads (the default producer loop: not with
        # paged K / V, v_lag or chained items)
        self.rab_prefetch = (rab_prefetch and has_rab and not paged and not v_lag
                             and not cross_item)
        self.split_wait = split_wait
        # the epilogue's O staging as packed pair stores into a row-swizzled tile, copied
        # out in 16-byte pieces (AttnFwdSm90Ws._epi_vec)
        self.epi_vec = epi_vec
        self.dtype = dtype
        self.d = head_dim
        self.dv = head_dim_v
        # consumer warpgroups of 64 query rows each: 2, or 3 (192-row tiles, 160 registers
        # per consumer thread) without rab, paged K / V or chained items
        if num_wg not in (2, 3) or (num_wg == 3 and (
                has_rab or paged or cross_item or block_n > 128
                or max(head_dim, head_dim_v) > 64)):
            raise NotImplementedError(
                f"hstu_fwd_sm90_ws: {num_wg} consumer warpgroups (2, or 3 at head dims up to 64 "
                "and block_n up to 128 without rab, paged K / V or chained items)")
        self.num_wg = num_wg
        self.wg_m = 64
        self.bm = self.wg_m * num_wg
        self.bn = block_n
        self.has_func = has_func
        self.func_n = func_n
        self.num_sms = num_sms
        self.overlap = overlap
        self.pingpong = pingpong
        self.silu16 = silu16
        self.tanh16 = tanh16
        self.has_rab = has_rab
        self.rab_per_head = rab_per_head
        self.paged = paged
        # paged: the producer clamps each page id it reads into [0, num_pages) (else the
        # caller passes clamped ids)
        self.page_id_clamp = paged and page_id_clamp
        # paged: the producer loads each KV tile's page id one tile ahead
        self.page_prefetch = paged and page_prefetch
        # split-KV: work item = (query tile, head, key split); each split adds its KV tiles'
        # fp32 partial O (times 1 / scaling_seqlen) into its own slice of mO (S, T_q, H, Dv)
        self.kv_splits = kv_splits
        if paged and (PAGE_SIZE % block_n or head_dim != head_dim_v):
            raise NotImplementedError(
                f"hstu_fwd_sm90_ws paged KV: block_n={block_n} must divide the page size "
                f"{PAGE_SIZE} and head_dim={head_dim} equal head_dim_v={head_dim_v}")
        self.stages, self.q_stages, self.o_alias_q = ws_smem_plan(
            head_dim, head_dim_v, block_n, max_stages, q_stages, q_alias, num_wg)
        # chained work items (``AttnFwdSm90Ws._consume_items``): needs the overlapped
        # mainloop and the next item's Q in its own buffer
        # (``cross_item``: 0 off, 1 on, 2 on with the last PV GEMM issued before the next
        # item's first S GEMM and the epilogue while that one runs)
        self.cross_item = (bool(cross_item) and overlap and self.q_stages >= 2
                           and not self.o_alias_q)
        self.cross_epi_first = self.cross_item and cross_item == 2
        # query tiles that end inside their sequence write O by TMA tensor stores
        # (AttnFwdSm90Ws._store_o_tma), the last tile of a sequence through the pair-store
        # copy; not with split-KV (fp32 partials from registers), O staged in the Q buffer,
        # the element-copy epilogue or Dv not a multiple of 64 (the 128-byte swizzle)
        self.tma_o = (tma_o and kv_splits == 1 and not self.o_alias_q and epi_vec
                      and head_dim_v % 64 == 0)
        # the producer issues V tile j after K tile j + 1 (the PV GEMM lags the S GEMM)
        self.v_lag = v_lag
        # work item t = (schedule row t % rows, split-major head t // rows): the CTAs running
        # at one time read one head's K / V (else row t // heads, head t % heads)
        self.head_outer = head_outer
        # CTAs take the longest-first items in boustrophedon order (SnakeLptScheduler)
        self.snake = snake and not head_outer
        # dynamic deal: after its first item (its CTA index) the producer warp takes the
        # next item from a global counter (atomic add; the caller passes it zeroed as
        # mCounter) and hands each item index to the consumers through a shared-memory ring
        # of ``item_ring`` slots (mbarrier pipeline); not with chained items or headouter
        self.dynamic = dynamic and not self.cross_item and not head_outer
        self.item_ring = 4 if self.dynamic else 0
        # each consumer warpgroup scales its Q slice by alpha / 2 in shared memory once per
        # item (one rounding to the 16-bit type), so the score tiles hold h directly (no
        # multiply per score); not with rab (h = (alpha s + rab) / 2) or chained items
        self.q_scale = q_scale and not has_rab and not self.cross_item
        # ``p_late`` (fp16): P converted to 16 bit only after the wait of the PV GEMM that
        # reads the previous P (``_p_into``); converted while that GEMM runs (the default),
        # ptxas may allocate the new P over the old one's registers and then serializes every
        # wgmma of the kernel (C7513), which measured no slower on the H200
        self.p_late = p_late and dtype == cutlass.Float16 and not silu16
        self.num_threads = 128 * (1 + num_wg)
        # 65536 registers per CTA: 128 * (producer + num_wg * consumer)
        self.regs_producer = 24
        self.regs_consumer = 240 if num_wg == 2 else 160

    @cute.jit
    def __call__(self, mQ, mK, mV, mCuQ, mCuK, mTile, mFunc, mScal, mWin, mO, stream,
                 mRab=None, mPageIds=None, mPageIndptrs=None, mCounter=None):
        d, dv = self.d, self.dv
        mma_qk, mma_qk0, mma_pv, sQ_layout, sK_layout, sV_layout, sO_layout = (
            self._mmas_and_layouts())
        # TMA views: Q, K as (T, D, H) (D contiguous), V as (Dv, T, H) (the MN-major B operand)
        tQ = tma_view(mQ, d)
        H = mQ.shape[1]
        if cutlass.const_expr(self.paged):
            # mK = mV = the cache (num_pages, 2, 128, H_kv, D): the rows of K (V) are the
            # (slot, page) pairs ((128, num_pages)), so KV tile t of the view is a 128 / bn
            # part of page t // (128 / bn); no copy of the cache
            n_pages = mK.shape[0]
            H_kv = mK.shape[3]
            rows = cute.make_layout((PAGE_SIZE, n_pages), stride=(mK.stride[2], mK.stride[0]))
            tK = cute.make_tensor(mK.iterator, cute.make_layout(
                (rows.shape, d, H_kv), stride=(rows.stride, 1, mK.stride[3])))
            tV = cute.make_tensor(mK.iterator + mK.stride[1], cute.make_layout(
                (dv, rows.shape, H_kv), stride=(1, rows.stride, mK.stride[3])))
        else:
            H_kv = mK.shape[1]
            tK, tV = tma_view(mK, d), tma_view(mV, dv, d_first=True)
        tma_q, tma_tQ, tma_k, tma_tK, tma_v, tma_tV = self._tma_atoms(
            tQ, tK, tV, sQ_layout, sK_layout, sV_layout)
        Smem = self._smem_struct(sQ_layout, sK_layout, sV_layout, sO_layout)
        tma_o = tma_tO = None
        if cutlass.const_expr(self.tma_o):
            tma_o, tma_tO = cpasync.make_tiled_tma_atom(
                cpasync.CopyBulkTensorTileS2GOp(), tma_view(mO, dv),
                cute.slice_(sO_layout, (None, None, 0)), (self.wg_m, dv))
        n_work = mTile.shape[0] * H * self.kv_splits
        grid = StaticLptScheduler.grid(n_work, self.num_sms)
        self.kernel(
            tma_q, tma_tQ, tma_k, tma_tK, tma_v, tma_tV, mV, mCuQ, mCuK, mTile, mFunc, mScal,
            mWin, mO, mRab, mPageIds, mPageIndptrs, mCounter, H_kv, sQ_layout, sK_layout,
            sV_layout, sO_layout, mma_qk, mma_qk0, mma_pv, Smem, tma_o, tma_tO,
        ).launch(grid=grid, block=[self.num_threads, 1, 1], smem=Smem.size_in_bytes(),
                 stream=stream, min_blocks_per_mp=1, use_pdl=self.pdl)

    @cute.kernel
    def kernel(self, tma_q, tma_tQ, tma_k, tma_tK, tma_v, tma_tV, mV, mCuQ, mCuK, mTile,
               mFunc, mScal, mWin, mO, mRab, mPageIds, mPageIndptrs, mCounter, n_heads_kv,
               sQ_layout, sK_layout, sV_layout, sO_layout, mma_qk, mma_qk0, mma_pv,
               Smem: cutlass.Constexpr, tma_o, tma_tO):
        tidx, _, _ = cute.arch.thread_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg_idx = warp // 4
        bm, bn, wgm = self.bm, self.bn, self.wg_m
        n_heads = mO.shape[2] if cutlass.const_expr(self.kv_splits > 1) else mO.shape[1]
        # GQA/MQA: query head h reads KV head h // group (group = H / H_kv, 1 without GQA)
        group = n_heads // n_heads_kv
        # split-KV: items (row, split * H + head): a row's splits are consecutive items
        n_hs = n_heads * self.kv_splits
        sched = StaticLptScheduler(n_hs, mTile.shape[0] * n_hs)
        if cutlass.const_expr(self.snake):
            sched = SnakeLptScheduler(n_hs, mTile.shape[0] * n_hs)
        if cutlass.const_expr(self.head_outer):
            sched = HeadOuterScheduler(n_hs, mTile.shape[0] * n_hs, mTile.shape[0])
        st, pipe_q, pipe_k, pipe_v, sQ, sK, sV, q_bytes, k_bytes, v_bytes = (
            self._smem_and_pipes(Smem, sQ_layout, sK_layout, sV_layout, tma_q, tma_k, tma_v,
                                 warp))
        left = Int32(mWin[0])
        right = Int32(mWin[1])
        pipe_t = None
        slots = None
        if cutlass.const_expr(self.dynamic):
            # item ring: full / empty mbarriers, then one 8-byte slot per stage
            ring = st.ring.data_ptr()
            pipe_t = SmemPipeline(ring, self.item_ring, 4 * self.num_wg)
            slots = ring + SmemPipeline.num_barriers(self.item_ring)
            if warp == 0:
                pipe_t.init()
            cute.arch.mbarrier_init_fence()
            cute.arch.barrier()

        if wg_idx == 0:
            # ================================ producer ================================
            cute.arch.setmaxregister_decrease(self.regs_producer)
            if warp == 0:
                lane, sV_rows, c_q, c_kv, t = self._producer_warp_start(sV, sched)
                c_t = Int32(0)
                if cutlass.const_expr(self.dynamic):
                    self._publish_item(pipe_t, slots, c_t, t)
                    c_t += 1
                while sched.valid(t):
                    slot, head, split = self._coords(sched, t, n_heads)
                    batch = Int32(mTile[slot, 0])
                    if batch >= 0:
                        work, m_block, m0 = self._work(mTile, slot, head, batch, mCuQ, mCuK,
                                                       left, right, mV, group,
                                                       mPageIds, mPageIndptrs, split)
                        kv_extra = None
                        if cutlass.const_expr(self.rab_prefetch):
                            kv_extra = self._rab_pf_view(mRab, batch, head, work.seq, m0)
                        c_q, c_kv = self._produce(
                            work, m_block, tma_q, tma_tQ, tma_k, tma_tK,
                            tma_v, tma_tV, sQ, sK, sV, sV_rows, pipe_q, pipe_k, pipe_v,
                            q_bytes, k_bytes, v_bytes, c_q, c_kv, lane, kv_extra=kv_extra)
                    if cutlass.const_expr(self.dynamic):
                        # claimed once this item's loads are issued (the consumers are then
                        # within the K / V stages of its end), so the CTAs that finish first
                        # take the next items
                        t = self._fetch_item(mCounter, lane)
                        self._publish_item(pipe_t, slots, c_t, t)
                        c_t += 1
                    else:
                        t = sched.next(t)
        else:
            # ================================ consumers ===============================
            wg, wtid, turns = self._consumer_start(wg_idx, tidx)
            alpha_half = Float32(mScal[0])
            inv_scale = Float32(mScal[1])
            thr_mma_qk, thr_mma_pv, tSrQ, tSrK, tOrV, tSc = self._consumer_fragments(
                mma_qk, mma_qk0, mma_pv, sQ, sK, sV, wtid)
            tScS = acc_mn_view_wg(tSc)
            mask = HstuMask(self.has_func, self.func_n if self.has_func else 1, bn, tScS)
            sO = self._o_buffer(st, sO_layout, wg)

            turns.start(wg)
            if cutlass.const_expr(self.cross_item):
                ctx = (sched, n_heads, mTile, mCuQ, mCuK, left, right, mV, group, mPageIds,
                       mPageIndptrs, mask, tSc, alpha_half, inv_scale, mFunc, mRab, mO, wg,
                       tma_o, tma_tO)
                self._consume_items(sched, sched.n_work, ctx, mma_qk, mma_qk0, mma_pv,
                                    thr_mma_qk, thr_mma_pv, tSrQ, tSrK, tOrV, pipe_q, pipe_k,
                                    pipe_v, sO, turns, wg, wtid)
            else:
                c_q, c_kv, t = self._loop_start(sched)
                c_t = Int32(0)
                if cutlass.const_expr(self.dynamic):
                    t = self._take_item(pipe_t, slots, c_t)
                    c_t += 1
                while sched.valid(t):
                    slot, head, split = self._coords(sched, t, n_heads)
                    batch = Int32(mTile[slot, 0])
                    if batch >= 0:
                        work, m_block, m0 = self._work(mTile, slot, head, batch, mCuQ, mCuK,
                                                       left, right, mV, group, mPageIds,
                                                       mPageIndptrs, split)
                        mw0 = m0 + wg * wgm
                        mw1 = cutlass.min(mw0 + wgm, work.seq.seqlen_q)
                        tile = _Tile(batch, mw0, mw1, mask, tSc, left, right, alpha_half,
                                     inv_scale, mFunc, mRab, mO, split,
                                     st.sQ.data_ptr() if self.q_scale else None, tma_o,
                                     tma_tO)
                        c_kv, c_q = self._consume(
                            work, tile, mma_qk, mma_qk0, mma_pv, thr_mma_qk,
                            thr_mma_pv, tSrQ, tSrK, tOrV, pipe_q, pipe_k, pipe_v, c_q, c_kv,
                            sO, turns, wg, wtid)
                    if cutlass.const_expr(self.dynamic):
                        t = self._take_item(pipe_t, slots, c_t)
                        c_t += 1
                    else:
                        t = sched.next(t)
            # the last O store has read shared memory before the CTA exits
            self._tma_o_drain(wtid)

    @cute.jit
    def _fetch_item(self, mCounter, lane):
        """Dynamic deal, producer warp: the next work item (``pipeline.fetch_item``)."""
        return fetch_item(mCounter.iterator, lane)

    @cute.jit
    def _publish_item(self, pipe_t, slots, c_t, t):
        """Dynamic deal, producer warp: item ``t`` into ring slot ``c_t``."""
        publish_item(pipe_t, slots, c_t, t)

    @cute.jit
    def _take_item(self, pipe_t, slots, c_t):
        """Dynamic deal, consumer warps: the item of ring slot ``c_t``."""
        return take_item(pipe_t, slots, c_t)

    def _early_pre(self):
        """The bias fragment (rab) takes a register per accumulator element: load it late."""
        return not self.has_rab

    @cute.jit
    def _decode(self, t, ctx, which: cutlass.Constexpr):
        """Chained items (``_consume_items``): item ``t``'s work, tile context and KV tile
        count (-1 for a schedule row without a tile: ``mTile[slot, 0] < 0``, decoded as
        sequence 0 so that nothing reads out of bounds). No per-row state (``which``)."""
        (sched, n_heads, mTile, mCuQ, mCuK, left, right, mV, group, mPageIds, mPageIndptrs,
         mask, tSc, alpha_half, inv_scale, mFunc, mRab, mO, wg, tma_o, tma_tO) = ctx
        slot, head, split = self._coords(sched, t, n_heads)
        batch = Int32(mTile[slot, 0])
        b = cutlass.max(batch, Int32(0))
        work, m_block, m0 = self._work(mTile, slot, head, b, mCuQ, mCuK, left, right, mV,
                                       group, mPageIds, mPageIndptrs, split)
        mw0 = m0 + wg * self.wg_m
        mw1 = cutlass.min(mw0 + self.wg_m, work.seq.seqlen_q)
        tile = _Tile(b, mw0, mw1, mask, tSc, left, right, alpha_half, inv_scale, mFunc, mRab,
                     mO, split, None, tma_o, tma_tO)
        n = work.n_count
        if batch < 0:
            n = Int32(-1)
        return work, tile, n

    @cute.jit
    def _coords(self, sched, t, n_heads):
        """(schedule row, head, key split) of work item ``t``."""
        slot, hs = sched.coords(t)
        if cutlass.const_expr(self.kv_splits == 1):
            return slot, hs, None
        return slot, hs % n_heads, hs // n_heads

    @cute.jit
    def _work(self, mTile, slot, head, batch, mCuQ, mCuK, left, right, mV, group,
              mPageIds=None, mPageIndptrs=None, split=None):
        """Work item of schedule row ``slot`` (``batch >= 0``) and ``head``: the sequence, its
        query tile ``m_block`` (first row ``m0``), the KV-tile range it visits and its KV head
        ``head // group``."""
        bm = self.bm
        seq = SeqlenInfo.create(batch, mCuQ, mCuK)
        m_block = Int32(mTile[slot, 1])
        m0 = m_block * bm
        m1 = cutlass.min(m0 + bm, seq.seqlen_q)
        blk = BlockInfo.create(mTile, slot, m0, m1, seq.seqlen_k, seq.off, left, right,
                               self.bn, self.has_func)
        if cutlass.const_expr(self.kv_splits > 1):
            # split s visits KV tiles [n_min + s c, n_min + (s + 1) c) of the range, c =
            # ceil(n_count / S) (none for the splits past the range's end)
            chunk = (blk.n_count + self.kv_splits - 1) // self.kv_splits
            lo = cutlass.min(blk.n_min + split * chunk, blk.n_max)
            hi = cutlass.min(lo + chunk, blk.n_max)
            blk = BlockInfo(blk.j_lo, blk.j_hi, blk.f0, lo, hi, hi - lo)
        pages = None
        if cutlass.const_expr(self.paged):
            # sequence `batch` owns page slots [indptr[b], indptr[b + 1]) of page_ids
            pages = (mPageIds, Int32(mPageIndptrs[batch]), Int32(mPageIds.shape[0]))
        return (WorkItem(blk, head, mV, seq=seq, head_kv=head // group, pages=pages), m_block,
                m0)

    # ------------------------------------------------- variation points (AttnFwdSm90Ws)
    def _q_tile(self, tma_tQ, work):
        return offset_rows(tma_tQ[None, None, work.head], work.seq.q_start)

    def _k_tile(self, tma_tK, work):
        if cutlass.const_expr(self.paged):
            return tma_tK[None, None, work.head_kv]
        return offset_rows(tma_tK[None, None, work.head_kv], work.seq.k_start)

    def _v_tile(self, tma_tV, work):
        if cutlass.const_expr(self.paged):
            return tma_tV[None, None, work.head_kv]
        return cute.domain_offset((0, work.seq.k_start), tma_tV[None, None, work.head_kv])

    @cute.jit
    def _page(self, work, n):
        """Paged KV: the page holding the sequence's KV tile ``n`` (its slot clamped into
        ``page_ids``; the page id clamped into the cache here with ``page_id_clamp``, else
        by the caller)."""
        ids, slot0, n_slots = work.pages
        slot = cutlass.max(cutlass.min(slot0 + n // (PAGE_SIZE // self.bn), n_slots - 1), 0)
        page = Int32(ids[slot])
        if cutlass.const_expr(self.page_id_clamp):
            page = cutlass.max(cutlass.min(page, Int32(work.mV.shape[0]) - 1), 0)
        return page

    def _kv_prefetch(self):
        return self.page_prefetch

    @cute.jit
    def _kv_entry(self, work, n):
        """Paged KV with ``page_prefetch``: issue the load of the page id of the sequence's
        KV tile ``n`` (slot clamped into ``page_ids``; the id is clamped where it is used,
        ``_kv_coord_of``, so nothing waits for the load here)."""
        ids, slot0, n_slots = work.pages
        slot = cutlass.max(cutlass.min(slot0 + n // (PAGE_SIZE // self.bn), n_slots - 1), 0)
        return Int32(ids[slot])

    @cute.jit
    def _kv_coord_of(self, work, n, entry):
        """Paged KV: tile ``n``'s index in the K / V views from its page id ``entry``."""
        tpp = PAGE_SIZE // self.bn
        page = entry
        if cutlass.const_expr(self.page_id_clamp):
            page = cutlass.max(cutlass.min(page, Int32(work.mV.shape[0]) - 1), 0)
        return page * tpp + n % tpp

    @cute.jit
    def _kv_coord(self, work, n):
        """Paged KV: tile ``n`` of the sequence is part ``n % (128 / bn)`` of its page."""
        nk = n
        if cutlass.const_expr(self.paged):
            tpp = PAGE_SIZE // self.bn
            nk = self._page(work, n) * tpp + n % tpp
        return nk

    def _v_limit(self, work, n):
        """Rows of V tile ``n`` inside the sequence; TMA only for a whole tile (a box would
        read the next sequence's rows)."""
        rows_left = work.seq.seqlen_k - n * self.bn
        return rows_left, rows_left >= self.bn

    @cute.jit
    def _load_v_rows(self, work, n, limit, sV_rows, stage, lane):
        """One warp: V rows [n bn, n bn + limit) of the sequence by cp.async, zeros after."""
        if cutlass.const_expr(self.paged):
            tpp = PAGE_SIZE // self.bn
            mV_b = work.mV[self._page(work, n), 1, None, work.head_kv, None]  # (128, Dv)
            gV = cute.local_tile(mV_b, (self.bn, self.dv), (n % tpp, 0))
        else:
            mV_b = offset_rows(work.mV[None, work.head_kv, None], work.seq.k_start)
            gV = cute.local_tile(mV_b, (self.bn, self.dv), (n, 0))
        self._copy_v_rows(gV, limit, sV_rows, stage, lane)

    def _work_start(self, tile):
        pass

    @cute.jit
    def _work_rows(self, work, tile):
        """Per-row mask bounds of this warpgroup's rows (and the bias rows with rab)."""
        row_lo, row_hi, row_f = tile.mask.rows(tile.mFunc, tile.mw0, work.seq, tile.left,
                                               tile.right)
        rab = None
        if cutlass.const_expr(self.has_rab):
            rab = self._rab_tile(tile.mRab, tile.batch, work.head, work.seq, tile.mw0)
        return row_lo, row_hi, row_f, rab

    def _tile_state(self, acc_O, tile):
        return None

    def _tile_pre(self, work, tile, rows, it):
        """The bias fragment of iteration ``it``'s KV tile (loads issued; None without rab)."""
        if cutlass.const_expr(self.has_rab):
            return self._rab_load(rows[3], work.kv_tile(it), tile.tSc)
        return None

    @cute.jit
    def _tile_p(self, acc_S, work, tile, rows, state, pre, it):
        """Bias, mask and score function of a score tile -> the 16-bit P fragment."""
        row_lo, row_hi, row_f, rab = rows
        self._score_tile(acc_S, work.kv_tile(it), work.kv, tile.mask, row_lo, row_hi, row_f,
                         work.seq, tile.mw0, tile.mw1, tile.left, tile.right, tile.alpha_half,
                         tile.tSc, rab, pre)
        return self._to_p(acc_S, tile.alpha_half)

    def _pv_done(self, acc_O, state):
        pass

    @cute.jit
    def _epilogue(self, acc_O, work, tile, thr_mma_pv, sO, wg, wtid, has_work):
        """``O / scaling_seqlen`` of this warpgroup's rows ``< L_q`` (split-KV: the fp32
        partial of this item's split, from registers)."""
        if cutlass.const_expr(self.kv_splits > 1):
            mP_b = offset_rows(tile.mO[tile.split, None, work.head, None], work.seq.q_start)
            gP = cute.local_tile(mP_b, (self.wg_m, self.dv), (tile.mw0 // self.wg_m, 0))
            tPg = thr_mma_pv.partition_C(gP)
            tPc = thr_mma_pv.partition_C(cute.make_identity_tensor((self.wg_m, self.dv)))
            lim = work.seq.seqlen_q - tile.mw0
            # an item without KV tiles stores zeros (acc_O is zero-filled)
            for e in cutlass.range_constexpr(cute.size(acc_O)):
                if tPc[e][0] < lim:
                    tPg[e] = acc_O[e] * tile.inv_scale
        elif cutlass.const_expr(self.tma_o):
            mO_b = offset_rows(tile.mO[None, work.head, None], work.seq.q_start)
            if has_work:
                if tile.mw0 + self.wg_m <= work.seq.seqlen_q:
                    # a whole 64-row slice inside the sequence: TMA tensor stores
                    gO = cute.local_tile(
                        offset_rows(tile.tma_tO[None, None, work.head], work.seq.q_start),
                        (self.wg_m, self.dv), (None, 0))
                    self._store_o_tma(acc_O, tile.inv_scale, thr_mma_pv, sO, tile.tma_o, gO,
                                      tile.mw0 // self.wg_m, wg, wtid)
                else:
                    # the sequence's last, partial slice: a box would write the next
                    # sequence's rows; the pair-store copy, row-predicated
                    self._tma_o_wait(wg, wtid)
                    self._store_o(acc_O, tile.inv_scale, thr_mma_pv, self._plain_o(sO), mO_b,
                                  tile.mw0, work.seq.seqlen_q, wg, wtid, True)
            else:
                self._store_o(acc_O, tile.inv_scale, thr_mma_pv, self._plain_o(sO), mO_b,
                              tile.mw0, work.seq.seqlen_q, wg, wtid, False)
        else:
            mO_b = offset_rows(tile.mO[None, work.head, None], work.seq.q_start)
            self._store_o(acc_O, tile.inv_scale, thr_mma_pv, sO, mO_b, tile.mw0,
                          work.seq.seqlen_q, wg, wtid, has_work)

    # ------------------------------------------------------------- score function
    def _h(self, x, alpha_half):
        """``h`` of an accumulator value: ``(alpha / 2) s``; with rab the tile already holds
        ``h = (alpha s + rab) / 2`` (``_add_rab``), with ``q_scale`` ``s`` is already ``h``
        (``_q_ready``)."""
        return x if cutlass.const_expr(self.has_rab or self.q_scale) else x * alpha_half

    @cute.jit
    def _q_ready(self, tile, q_slice, wg, wtid):
        """``q_scale``: this warpgroup's Q slice (64 x D elements, contiguous in ``sQ``)
        times ``alpha / 2`` in place, 32-bit words of two elements, consecutive threads at
        consecutive words; then the writes are fenced for the async proxy (the QK wgmma) and
        the warpgroup synchronised (its named barrier ``_wg_bar(wg)``, as the epilogue)."""
        if cutlass.const_expr(self.q_scale):
            n = self.wg_m * self.d
            base = cute.recast_ptr(tile.q_base + q_slice * n, dtype=cutlass.Uint32)
            words = cute.make_tensor(base, cute.make_layout(n // 2))
            bf16 = self.dtype == cutlass.BFloat16
            for i in cutlass.range(n // 2 // 128, unroll_full=True):
                words[wtid + 128 * i] = hc.scale_pair(words[wtid + 128 * i], tile.alpha_half,
                                                      bf16)
            cute.arch.fence_proxy("async.shared", space="cta")
            cute.arch.barrier(barrier_id=self._wg_bar(wg), number_of_threads=128)

    @cute.jit
    def _score(self, acc_S, alpha_half):
        """HSTU score function: ``SiLU(x) = h + h tanh(h)``, ``h = x / 2`` (``_h``; ``x = alpha s``,
        plus the bias with rab). With ``tanh16`` one ``tanh.approx.f16x2`` serves two
        elements (half the MUFU work; the rest stays fp32)."""
        if cutlass.const_expr(self.tanh16):
            for e in cutlass.range_constexpr(cute.size(acc_S) // 2):
                h0 = hc.finite_below(self._h(acc_S[2 * e], alpha_half))
                h1 = hc.finite_below(self._h(acc_S[2 * e + 1], alpha_half))
                t = hc.tanh_f16_pair(h0, h1)
                acc_S[2 * e] = h0 + h0 * hc.f16_half(t, False)
                acc_S[2 * e + 1] = h1 + h1 * hc.f16_half(t, True)
        else:
            for e in cutlass.range_constexpr(cute.size(acc_S)):
                hval = hc.finite_below(self._h(acc_S[e], alpha_half))  # SiLU(-inf) -> 0, not NaN
                acc_S[e] = hval + hval * hc.tanh_approx(hval)

    @cute.jit
    def _to_p(self, acc_S, alpha_half):
        """The 16-bit P fragment (A operand layout of ``acc_S``) of a masked score tile. With
        ``silu16``: ``(P fragment to fill, packed pairs)``, the pairs' ``h`` and ``tanh(h)``
        in packed 16-bit form (``hc.pack_pair``, ``hc.tanh_pair``: one MUFU op per two
        scores); ``_p_final`` / ``_p_into`` finish ``h + h tanh(h)`` into the fragment after
        the wait of the PV GEMM that reads the previous P. With ``p_late`` (fp16): the fp32
        scores after the score function, which ``_p_final`` / ``_p_into`` convert."""
        if cutlass.const_expr(self.p_late):
            self._score(acc_S, alpha_half)
            return acc_S
        rP = cute.make_fragment_like(acc_S, self.dtype)
        if cutlass.const_expr(self.silu16):
            bf16 = self.dtype == cutlass.BFloat16
            # h clamped below at the lowest finite value of the 16-bit type (NaN kept): the
            # packed h stays finite, so -inf scores (and fp16's h below -65504) give
            # P = h + h tanh(h) = 0, not -inf + inf = NaN
            lowest = -3.3895313892515355e38 if bf16 else -65504.0
            n = cute.size(rP) // 2
            pend = cute.make_rmem_tensor((2 * n,), cutlass.Uint32)
            for e in cutlass.range_constexpr(n):
                hh = hc.pack_pair(hc.finite_below(self._h(acc_S[2 * e], alpha_half), lowest),
                                  hc.finite_below(self._h(acc_S[2 * e + 1], alpha_half),
                                                  lowest), bf16)
                pend[2 * e] = hh
                pend[2 * e + 1] = hc.tanh_pair(hh, bf16)
            return rP, pend
        self._score(acc_S, alpha_half)
        rP.store(acc_S.load().to(self.dtype))
        return rP

    def _p_final(self, p):
        if cutlass.const_expr(self.silu16):
            self._p_into(p[0], p)
            return p[0]
        if cutlass.const_expr(self.p_late):
            rP = cute.make_fragment_like(p, self.dtype)
            rP.store(p.load().to(self.dtype))
            return rP
        return p

    @cute.jit
    def _p_into(self, rP, p):
        if cutlass.const_expr(self.silu16):
            pend = p[1]
            rP32 = cute.recast_tensor(rP, cutlass.Uint32)
            for e in cutlass.range_constexpr(cute.size(rP32)):
                rP32[e] = hc.silu_finish_pair(pend[2 * e], pend[2 * e + 1],
                                              self.dtype == cutlass.BFloat16)
        elif cutlass.const_expr(self.p_late):
            rP.store(p.load().to(self.dtype))
        else:
            rP.store(p.load())

    # ------------------------------------------------------------- relative attention bias
    @cute.jit
    def _rab_tile(self, mRab, batch, head, seq, mw0):
        """This warpgroup's view of the bias for one Q tile: ``(address of rab[b, h % H_rab,
        0, 0], N_k, row offset, lim, rab's dtype)``. Query row ``i`` (tile-relative ``r``)
        reads bias row ``p = mw0 + r + L_k - L_q``; key ``j`` has a bias when
        ``0 <= p < lim`` and ``j < lim``, ``lim = min(L_k, N_k)``."""
        n_k = mRab.shape[3]
        b = cutlass.min(batch, mRab.shape[0] - 1)
        h = head if cutlass.const_expr(self.rab_per_head) else 0
        base = mRab[b, h, None, None].iterator.toint()
        return base, n_k, mw0 + seq.off, cutlass.min(seq.seqlen_k, n_k), mRab.element_type

    @cute.jit
    def _rab_pf_view(self, mRab, batch, head, seq, m0):
        """What the producer's bias prefetches of one work item need: ``(rab[b, h % H_rab]
        (rows, keys), first bias row m0 + L_k - L_q, lim = min(L_k, N_k))``."""
        n_k = mRab.shape[3]
        b = cutlass.min(batch, mRab.shape[0] - 1)
        h = head if cutlass.const_expr(self.rab_per_head) else 0
        return mRab[b, h, None, None], m0 + seq.off, cutlass.min(seq.seqlen_k, n_k)

    @cute.jit
    def _kv_extra_issue(self, kv_extra, work, m_block, n, lane):
        """After KV tile ``n``'s loads: L2 prefetches of its bias (rows of the work item's
        ``bm`` queries below ``lim``, keys ``n bn ..`` clamped below ``lim``): lane ``l``
        takes rows ``l, l + 32, ..``, per row one address every 128 bytes plus one (a row
        need not start on a line)."""
        mX, row_off, lim = kv_extra
        es = mX.element_type.width // 8
        step = 128 // es
        per = (self.bn * es + 127) // 128 + 1
        n0 = n * self.bn
        j_hi = cutlass.min(n0 + self.bn, lim) - 1
        for r in cutlass.range_constexpr(self.bm // 32):
            p = row_off + r * 32 + lane
            if (p >= 0) & (p < lim) & (n0 < lim):
                for u in cutlass.range_constexpr(per):
                    j = cutlass.min(n0 + u * step, j_hi)
                    hc.prefetch_l2(elem_ptr(mX, (p, j)).toint())

    @cute.jit
    def _rab_load(self, rab, n, tSc):
        """Issue the global loads of KV tile ``n``'s bias in the accumulator layout (rab's
        dtype, one register fragment; ``None`` without rab). Addresses are clamped into
        ``rab[b, h]``; values outside the bias's rows / columns are replaced in ``_add_rab``.
        The two columns of each accumulator pair are adjacent: with an even ``N_k`` they are
        one 8-byte (fp32) or 4-byte (16-bit) load."""
        rB = None
        if cutlass.const_expr(self.has_rab):
            base, n_k, row_off, _, rdt = rab
            esize = rdt.width // 8
            pair_t = cutlass.Int64 if cutlass.const_expr(esize == 4) else cutlass.Int32
            rB = cute.make_rmem_tensor(tSc.shape, rdt)
            rB2 = cute.recast_tensor(rB, pair_t)
            n0 = n * self.bn
            if n_k % 2 == 0:
                for e in cutlass.range_constexpr(cute.size(rB2)):
                    p = cutlass.max(cutlass.min(row_off + tSc[2 * e][0], n_k - 1), 0)
                    j = cutlass.min(n0 + tSc[2 * e][1], n_k - 2)
                    off = cutlass.Int64(p) * cutlass.Int64(n_k) + cutlass.Int64(j)
                    ptr = cute.make_ptr(pair_t, base + off * esize, cute.AddressSpace.gmem,
                                        assumed_align=2 * esize)
                    rB2[e] = cute.make_tensor(ptr, cute.make_layout(1))[0]
            else:
                for e in cutlass.range_constexpr(cute.size(rB)):
                    p = cutlass.max(cutlass.min(row_off + tSc[e][0], n_k - 1), 0)
                    j = cutlass.min(n0 + tSc[e][1], n_k - 1)
                    off = cutlass.Int64(p) * cutlass.Int64(n_k) + cutlass.Int64(j)
                    ptr = cute.make_ptr(rdt, base + off * esize, cute.AddressSpace.gmem,
                                        assumed_align=esize)
                    rB[e] = cute.make_tensor(ptr, cute.make_layout(1))[0]
        return rB

    @cute.jit
    def _add_rab(self, acc_S, rB, rab, n0, tSc, alpha_half):
        """``acc_S = h = (alpha S + rab) / 2`` where the element has a bias, else
        ``alpha S / 2`` (a select: whatever the clamped load read there is dropped)."""
        _, _, row_off, lim, _ = rab
        for e in cutlass.range_constexpr(cute.size(acc_S)):
            p = row_off + tSc[e][0]
            ok = (p >= 0) & (p < lim) & (n0 + tSc[e][1] < lim)
            bias = rB[e].to(Float32) * Float32(0.5)
            acc_S[e] = acc_S[e] * alpha_half + (bias if ok else Float32(0.0))
    @cute.jit
    def _score_tile(self, acc_S, n, blk, mask, row_lo, row_hi, row_f, seq, mw0, mw1, left,
                    right, alpha_half, tSc, rab, rB):
        n0 = n * self.bn
        if cutlass.const_expr(self.has_rab):
            self._add_rab(acc_S, rB, rab, n0, tSc, alpha_half)
        full = mask.tile_fully_valid(n0, mw0, mw1, seq, left, right, blk.f0)
        if full == 0:
            mask.apply(acc_mn_view_wg(acc_S), n0, row_lo, row_hi, row_f)
