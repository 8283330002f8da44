"""HSTU attention forward for SM90: warp-specialized TMA + wgmma mainloop (``impl="sm90ws"``).

Semantics, tile schedule rows and zero-fill conventions are those of ``hstu_fwd_sm80`` (read
its docstring): per sequence and head ``O = (mask * SiLU(alpha Q K^T)) V / scaling_seqlen``;
rows of the pseudo-sequence past ``cu_seqlens_q[-1]`` get zeros.

CTA = 3 warpgroups (384 threads), persistent (``tile_scheduler.StaticLptScheduler``):

* warpgroup 0 (producer, ``setmaxnreg`` down to 24 registers): warp 0 walks the work items and
  issues the TMA loads (``cp.async.bulk.tensor``) of the 128-row Q tile and of the K and V
  tiles into ``stages``-deep shared-memory rings (``pipeline.SmemPipeline``: full / empty
  mbarriers). The one KV tile that crosses a sequence's end is the exception for V: the warp
  copies its in-sequence rows with cp.async and zero-fills the others (a TMA box would read
  the next sequence's rows, and ``0 * NaN`` is NaN), fences them for the async proxy, then
  arrives on the full barrier.
* warpgroups 1 and 2 (consumers, ``setmaxnreg`` up to 240): each owns 64 query rows of the
  tile. Per KV tile: ``S = Q K^T`` (wgmma, both operands in smem), the mask
  (``mask.HstuMask``, only on tiles crossing a mask edge or the sequence end: select, never
  multiply), the score function ``P = h + h * tanh(h)``, ``h = (alpha / 2) S`` (one MUFU op),
  ``P`` converted to 16 bit and kept in registers as the A operand of ``O += P V`` (wgmma RS).
* ``overlap=True`` (intra-warpgroup overlap): iteration ``j`` issues ``S_j = Q K_j^T`` and
  ``O += P_{j-1} V_{j-1}`` back to back, waits only for ``S_j`` (``wgmma.wait_group 1``),
  computes ``P_j`` while the PV GEMM runs, then waits for it.
* ``pingpong=True``: the two consumer warpgroups take turns issuing their GEMMs
  (``pipeline.WarpgroupTurns``), so one's pointwise work overlaps the other's GEMMs.
* epilogue: ``O / scaling_seqlen`` in 16 bit -> swizzled shared memory (a per-warpgroup
  buffer, or the warpgroup's half of the Q buffer where shared memory is short) -> 128-bit
  row-predicated global stores (rows ``< L_q`` only; a TMA store box would overwrite the next
  sequence's rows).

Plug points (FA4's module names): ``seqlen_info`` (varlen offsets), ``block_info`` (which KV
tiles a Q tile visits), ``mask`` (+ the score function ``_score``), ``tile_scheduler``,
``pipeline``; the epilogue is ``_epilogue``.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.memory
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Float32, Int32
from cutlass.cute.nvgpu import OperandMajorMode, cpasync, warpgroup
from cutlass.tensor_utils import LayoutEnum

from . import hstu_common as hc
from .block_info import BlockInfo
from .common import (acc_layout_as_a, acc_mn_view_wg, gmem_load_copy, gmem_store_copy,
                     smem_layout_16b, transpose_view_staged)
from .mask import HstuMask
from .pipeline import SmemPipeline, WarpgroupTurns
from .seqlen_info import SeqlenInfo, offset_rows
from .tile_scheduler import StaticLptScheduler

SMEM_LIMIT = 227 * 1024


def ws_smem_plan(d: int, dv: int, bn: int, max_stages: int = 4, q_stages: int = 2):
    """(K/V stages, Q stages, whether O's smem buffer aliases Q's) that fit the 227 KiB of an
    SM90 CTA: a double-buffered Q (the next tile's Q loads during this tile's mainloop) and
    a separate O buffer first, then one Q stage, then O in Q's buffer."""
    o = 128 * dv * 2
    plans = [(qs, False) for qs in range(q_stages, 0, -1)] + [(1, True)]
    for qs, alias in plans:
        if alias and dv > d:
            continue
        for stages in range(max_stages, 1, -1):
            total = (qs * 128 * d * 2 + stages * bn * (d + dv) * 2 + (0 if alias else o)
                     + 1024 + 256)
            if total <= SMEM_LIMIT:
                return stages, qs, alias
    raise ValueError(f"no shared-memory plan for head_dim={d}, head_dim_v={dv}, block_n={bn}")


class HstuFwdSm90Ws:
    def __init__(self, dtype, head_dim, head_dim_v, block_n, has_func, func_n, num_sms,
                 overlap=True, pingpong=True, max_stages=4, q_stages=2, silu16=False,
                 has_rab=False, rab_per_head=False):
        self.dtype = dtype
        self.d = head_dim
        self.dv = head_dim_v
        self.bm = 128
        self.wg_m = 64
        self.bn = block_n
        self.has_func = has_func
        self.func_n = func_n
        self.num_sms = num_sms
        self.overlap = overlap
        self.pingpong = pingpong
        self.silu16 = silu16
        self.has_rab = has_rab
        self.rab_per_head = rab_per_head
        self.stages, self.q_stages, self.o_alias_q = ws_smem_plan(
            head_dim, head_dim_v, block_n, max_stages, q_stages)
        self.num_threads = 384
        self.regs_producer = 24
        self.regs_consumer = 240

    @cute.jit
    def __call__(self, mQ, mK, mV, mCuQ, mCuK, mTile, mFunc, mScal, mWin, mO, stream,
                 mRab=None):
        dt = self.dtype
        wgm, bn, d, dv = self.wg_m, self.bn, self.d, self.dv
        qk_tiler = (wgm, bn, d)
        pv_tiler = (wgm, dv, bn)
        mma_qk = sm90_utils.make_trivial_tiled_mma(
            dt, dt, OperandMajorMode.K, OperandMajorMode.K, Float32, (1, 1, 1), (wgm, bn))
        # the first K slice of S = Q K^T overwrites the accumulator (no zero fill)
        mma_qk0 = sm90_utils.make_trivial_tiled_mma(
            dt, dt, OperandMajorMode.K, OperandMajorMode.K, Float32, (1, 1, 1), (wgm, bn))
        mma_pv = sm90_utils.make_trivial_tiled_mma(
            dt, dt, OperandMajorMode.K, OperandMajorMode.MN, Float32, (1, 1, 1), (wgm, dv),
            warpgroup.OperandSource.RMEM)
        sQ_layout = sm90_utils.make_smem_layout_a(LayoutEnum.ROW_MAJOR, qk_tiler, dt,
                                                  2 * self.q_stages)
        sK_layout = sm90_utils.make_smem_layout_b(LayoutEnum.ROW_MAJOR, qk_tiler, dt,
                                                  self.stages)
        sV_layout = sm90_utils.make_smem_layout_b(LayoutEnum.COL_MAJOR, pv_tiler, dt,
                                                  self.stages)
        sO_layout = smem_layout_16b(wgm, dv)

        # TMA views: Q, K as (T, D, H) (D contiguous), V as (Dv, T, H) (the MN-major B operand)
        T_q = mQ.shape[0]
        T_k = mK.shape[0]
        H = mQ.shape[1]
        tQ = cute.make_tensor(mQ.iterator, cute.make_layout(
            (T_q, d, H), stride=(mQ.stride[0], 1, mQ.stride[1])))
        tK = cute.make_tensor(mK.iterator, cute.make_layout(
            (T_k, d, H), stride=(mK.stride[0], 1, mK.stride[1])))
        tV = cute.make_tensor(mV.iterator, cute.make_layout(
            (dv, T_k, H), stride=(1, mV.stride[0], mV.stride[1])))
        g2s = cpasync.CopyBulkTensorTileG2SOp()
        tma_q, tma_tQ = cpasync.make_tiled_tma_atom(
            g2s, tQ, cute.slice_(sQ_layout, (None, None, 0)), (wgm, d))
        tma_k, tma_tK = cpasync.make_tiled_tma_atom(
            g2s, tK, cute.slice_(sK_layout, (None, None, 0)), (bn, d))
        tma_v, tma_tV = cpasync.make_tiled_tma_atom(
            g2s, tV, cute.slice_(sV_layout, (None, None, 0)), (dv, bn))

        n_mbar = SmemPipeline.num_barriers(self.q_stages) + 2 * SmemPipeline.num_barriers(
            self.stages)
        o_elems = 0 if cutlass.const_expr(self.o_alias_q) else cute.cosize(sO_layout) * 2

        @cute.struct
        class Smem:
            mbar: cute.struct.MemRange[cutlass.Int64, n_mbar]
            sQ: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sQ_layout)], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sK_layout)], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sV_layout)], 1024]
            sO: cute.struct.Align[cute.struct.MemRange[dt, o_elems], 1024]

        n_work = mTile.shape[0] * H
        grid = StaticLptScheduler.grid(n_work, self.num_sms)
        self.kernel(
            tma_q, tma_tQ, tma_k, tma_tK, tma_v, tma_tV, mV, mCuQ, mCuK, mTile, mFunc, mScal,
            mWin, mO, mRab, sQ_layout, sK_layout, sV_layout, sO_layout, mma_qk, mma_qk0, mma_pv, Smem,
        ).launch(grid=grid, block=[self.num_threads, 1, 1], smem=Smem.size_in_bytes(),
                 stream=stream, min_blocks_per_mp=1)

    # ------------------------------------------------------------------------------------
    @cute.jit
    def _h(self, x, alpha_half):
        """``h`` of an accumulator value: ``(alpha / 2) s``; with rab the tile already holds
        ``h = (alpha s + rab) / 2`` (``_add_rab``)."""
        return x if cutlass.const_expr(self.has_rab) else x * alpha_half

    @cute.jit
    def _score(self, acc_S, alpha_half):
        """HSTU score function: ``SiLU(x) = h + h tanh(h)``, ``h = x / 2`` (``_h``; ``x = alpha s``,
        plus the bias with rab)."""
        for e in cutlass.range_constexpr(cute.size(acc_S)):
            hval = hc.finite_below(self._h(acc_S[e], alpha_half))  # SiLU(-inf) -> 0, not NaN
            acc_S[e] = hval + hval * hc.tanh_approx(hval)

    @cute.jit
    def _to_p(self, acc_S, alpha_half):
        """The 16-bit P fragment (A operand layout of ``acc_S``) of a masked score tile."""
        rP = cute.make_fragment_like(acc_S, self.dtype)
        if cutlass.const_expr(self.silu16):
            rP32 = cute.recast_tensor(rP, cutlass.Uint32)
            for e in cutlass.range_constexpr(cute.size(rP32)):
                rP32[e] = hc.silu_half_pair(self._h(acc_S[2 * e], alpha_half),
                                            self._h(acc_S[2 * e + 1], alpha_half),
                                            self.dtype == cutlass.BFloat16)
        else:
            self._score(acc_S, alpha_half)
            rP.store(acc_S.load().to(self.dtype))
        return rP

    @cute.jit
    def _load_v_rows(self, mV, head, k_start, n, limit, sV_rows, stage, lane):
        """One warp: V rows [n bn, n bn + limit) of the sequence by cp.async, zeros after."""
        copy_v = gmem_load_copy(self.dtype, 32, self.dv)
        mV_b = offset_rows(mV[None, head, None], k_start)
        gV = cute.local_tile(mV_b, (self.bn, self.dv), (n, 0))
        thr = copy_v.get_slice(lane)
        tg = thr.partition_S(gV)
        ts = thr.partition_D(sV_rows[None, None, stage])
        tc = thr.partition_S(cute.make_identity_tensor((self.bn, self.dv)))
        for r in cutlass.range(cute.size(ts.shape[1]), unroll=1):
            if tc[0, r, 0][0] < limit:
                cute.copy(copy_v, tg[None, r, None], ts[None, r, None])
            else:
                ts[None, r, None].fill(0)
        cute.arch.cp_async_commit_group()
        cute.arch.cp_async_wait_group(0)
        # cp.async / zero-fill stores (generic proxy) -> visible to wgmma (async proxy)
        cute.arch.fence_proxy("async.shared", space="cta")
        cute.arch.sync_warp()

    @cute.kernel
    def kernel(self, tma_q, tma_tQ, tma_k, tma_tK, tma_v, tma_tV, mV, mCuQ, mCuK, mTile,
               mFunc, mScal, mWin, mO, mRab, sQ_layout, sK_layout, sV_layout, sO_layout,
               mma_qk, mma_qk0, mma_pv, Smem: cutlass.Constexpr):
        tidx, _, _ = cute.arch.thread_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg_idx = warp // 4
        bm, bn, wgm, d, dv = self.bm, self.bn, self.wg_m, self.d, self.dv
        n_heads = mO.shape[1]
        sched = StaticLptScheduler(n_heads, mTile.shape[0] * n_heads)

        smem = cutlass.memory.SmemAllocator()
        st = smem.allocate(Smem)
        mbar = st.mbar.data_ptr()
        nq = 2 * self.q_stages
        pipe_q = SmemPipeline(mbar, self.q_stages, 8)
        pipe_k = SmemPipeline(mbar + nq, self.stages, 8)
        pipe_v = SmemPipeline(mbar + nq + 2 * self.stages, self.stages, 8)
        if warp == 0:
            pipe_q.init()
            pipe_k.init()
            pipe_v.init()
            cpasync.prefetch_descriptor(tma_q)
            cpasync.prefetch_descriptor(tma_k)
            cpasync.prefetch_descriptor(tma_v)
        cute.arch.mbarrier_init_fence()
        cute.arch.barrier()

        sQ = st.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)  # (64, D, 2 Qstages)
        sK = st.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)  # (BN, D, S)
        sV = st.sV.get_tensor(sV_layout.outer, swizzle=sV_layout.inner)  # (Dv, BN, S)

        left = Int32(mWin[0])
        right = Int32(mWin[1])
        q_bytes = cute.size_in_bytes(self.dtype, cute.slice_(sQ_layout, (None, None, 0))) * 2
        k_bytes = cute.size_in_bytes(self.dtype, cute.slice_(sK_layout, (None, None, 0)))
        v_bytes = cute.size_in_bytes(self.dtype, cute.slice_(sV_layout, (None, None, 0)))

        if wg_idx == 0:
            # ================================ producer ================================
            cute.arch.setmaxregister_decrease(self.regs_producer)
            if warp == 0:
                lane = cute.arch.lane_idx()
                sV_rows = transpose_view_staged(sV)  # (BN, Dv, S)
                c_q = Int32(0)
                c_kv = Int32(0)
                t = sched.first()
                while sched.valid(t):
                    slot, head = sched.coords(t)
                    batch = Int32(mTile[slot, 0])
                    if batch >= 0:
                        seq = SeqlenInfo.create(batch, mCuQ, mCuK)
                        m_block = Int32(mTile[slot, 1])
                        m0 = m_block * bm
                        m1 = cutlass.min(m0 + bm, seq.seqlen_q)
                        blk = BlockInfo.create(mTile, slot, m0, m1, seq.seqlen_k, seq.off,
                                               left, right, bn, self.has_func)
                        if blk.n_count > 0:
                            gQ = cute.local_tile(
                                offset_rows(tma_tQ[None, None, head], seq.q_start),
                                (wgm, d), (None, 0))
                            tQs, tQg = cpasync.tma_partition(
                                tma_q, 0, cute.make_layout(1), cute.group_modes(sQ, 0, 2),
                                cute.group_modes(gQ, 0, 2))
                            gK = cute.local_tile(
                                offset_rows(tma_tK[None, None, head], seq.k_start),
                                (bn, d), (None, 0))
                            tKs, tKg = cpasync.tma_partition(
                                tma_k, 0, cute.make_layout(1), cute.group_modes(sK, 0, 2),
                                cute.group_modes(gK, 0, 2))
                            gV = cute.local_tile(
                                cute.domain_offset((0, seq.k_start), tma_tV[None, None, head]),
                                (dv, bn), (0, None))
                            tVs, tVg = cpasync.tma_partition(
                                tma_v, 0, cute.make_layout(1), cute.group_modes(sV, 0, 2),
                                cute.group_modes(gV, 0, 2))
                            pipe_q.producer_acquire(c_q)
                            pipe_q.producer_expect_tx(c_q, q_bytes)
                            sq = pipe_q.stage(c_q)
                            for w in cutlass.range_constexpr(2):
                                cute.copy(tma_q, tQg[None, 2 * m_block + w], tQs[None, 2 * sq + w],
                                          tma_bar_ptr=pipe_q.full_ptr(c_q))
                            c_q += 1
                            for it in cutlass.range(blk.n_count, unroll=1):
                                n = blk.kv_tile(it)
                                s = pipe_k.stage(c_kv)
                                pipe_k.producer_acquire(c_kv)
                                pipe_k.producer_expect_tx(c_kv, k_bytes)
                                cute.copy(tma_k, tKg[None, n], tKs[None, s],
                                          tma_bar_ptr=pipe_k.full_ptr(c_kv))
                                pipe_v.producer_acquire(c_kv)
                                rows_left = seq.seqlen_k - n * bn
                                if rows_left >= bn:
                                    pipe_v.producer_expect_tx(c_kv, v_bytes)
                                    cute.copy(tma_v, tVg[None, n], tVs[None, s],
                                              tma_bar_ptr=pipe_v.full_ptr(c_kv))
                                else:
                                    self._load_v_rows(mV, head, seq.k_start, n, rows_left,
                                                      sV_rows, s, lane)
                                    pipe_v.producer_arrive(c_kv)
                                c_kv += 1
                    t = sched.next(t)
        else:
            # ================================ consumers ===============================
            cute.arch.setmaxregister_increase(self.regs_consumer)
            wg = wg_idx - 1
            wtid = tidx % 128
            turns = WarpgroupTurns(self.pingpong)
            alpha_half = Float32(mScal[0])
            inv_scale = Float32(mScal[1])

            mma_qk.set(warpgroup.Field.ACCUMULATE, True)
            mma_qk0.set(warpgroup.Field.ACCUMULATE, False)
            mma_pv.set(warpgroup.Field.ACCUMULATE, True)
            thr_mma_qk = mma_qk.get_slice(wtid)
            thr_mma_pv = mma_pv.get_slice(wtid)
            tSrQ = thr_mma_qk.make_fragment_A(thr_mma_qk.partition_A(sQ))
            tSrK = thr_mma_qk.make_fragment_B(thr_mma_qk.partition_B(sK))
            tOrV = thr_mma_pv.make_fragment_B(thr_mma_pv.partition_B(sV))
            tSc = thr_mma_qk.partition_C(cute.make_identity_tensor((wgm, bn)))
            tScS = acc_mn_view_wg(tSc)
            mask = HstuMask(self.has_func, self.func_n if self.has_func else 1, bn, tScS)

            # this warpgroup's O staging buffer: its own buffer, or its half of sQ
            o_base = st.sQ.data_ptr() + wg * (wgm * d)
            if cutlass.const_expr(not self.o_alias_q):
                o_base = st.sO.data_ptr() + wg * cute.cosize(sO_layout)
            sO = cute.make_tensor(cute.recast_ptr(o_base, sO_layout.inner), sO_layout.outer)

            turns.start(wg)
            c_q = Int32(0)
            c_kv = Int32(0)
            t = sched.first()
            while sched.valid(t):
                slot, head = sched.coords(t)
                batch = Int32(mTile[slot, 0])
                if batch >= 0:
                    seq = SeqlenInfo.create(batch, mCuQ, mCuK)
                    m_block = Int32(mTile[slot, 1])
                    m0 = m_block * bm
                    m1 = cutlass.min(m0 + bm, seq.seqlen_q)
                    blk = BlockInfo.create(mTile, slot, m0, m1, seq.seqlen_k, seq.off,
                                           left, right, bn, self.has_func)
                    mw0 = m0 + wg * wgm
                    mw1 = cutlass.min(mw0 + wgm, seq.seqlen_q)
                    acc_O = cute.make_rmem_tensor(thr_mma_pv.partition_shape_C((wgm, dv)),
                                                  Float32)
                    acc_O.fill(0.0)
                    if blk.n_count > 0:
                        row_lo, row_hi, row_f = mask.rows(mFunc, mw0, seq, left, right)
                        rab = None
                        if cutlass.const_expr(self.has_rab):
                            rab = self._rab_tile(mRab, batch, head, seq, mw0)
                        pipe_q.consumer_wait(c_q)
                        c_kv = self._mainloop(
                            mma_qk, mma_qk0, mma_pv, thr_mma_qk,
                            tSrQ[None, None, None, 2 * pipe_q.stage(c_q) + wg], tSrK,
                            tOrV, acc_O, pipe_k, pipe_v, c_kv, blk, mask, row_lo, row_hi,
                            row_f, seq, mw0, mw1, left, right, alpha_half, turns, wg, tSc, rab)
                        if cutlass.const_expr(not self.o_alias_q):
                            pipe_q.consumer_release(c_q)
                    self._epilogue(acc_O, inv_scale, thr_mma_pv, sO, mO, head, seq, mw0, wg,
                                   wtid, blk.n_count > 0)
                    if blk.n_count > 0:
                        if cutlass.const_expr(self.o_alias_q):
                            # generic accesses of the aliased Q buffer before the next TMA write
                            cute.arch.fence_proxy("async.shared", space="cta")
                            pipe_q.consumer_release(c_q)
                        c_q += 1
                t = sched.next(t)

    # ------------------------------------------------------------------------------------
    @cute.jit
    def _rab_tile(self, mRab, batch, head, seq, mw0):
        """This warpgroup's view of the bias for one Q tile: ``(address of rab[b, h % H_rab,
        0, 0], N_k, row offset, lim, rab's dtype)``. Query row ``i`` (tile-relative ``r``) reads bias row
        ``p = mw0 + r + L_k - L_q``; key ``j`` has a bias when ``0 <= p < lim`` and
        ``j < lim``, ``lim = min(L_k, N_k)``."""
        n_k = mRab.shape[3]
        b = cutlass.min(batch, mRab.shape[0] - 1)
        h = head if cutlass.const_expr(self.rab_per_head) else 0
        base = mRab[b, h, None, None].iterator.toint()
        return base, n_k, mw0 + seq.off, cutlass.min(seq.seqlen_k, n_k), mRab.element_type

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
    def _qk(self, mma_qk, mma_qk0, tSrQ, tSrK, stage, acc_S):
        for k in cutlass.range_constexpr(cute.size(tSrQ, mode=[2])):
            cute.gemm(mma_qk0 if k == 0 else mma_qk, acc_S, tSrQ[None, None, k], tSrK[None, None, k, stage], acc_S)

    @cute.jit
    def _pv(self, mma_pv, tOrP, tOrV, stage, acc_O):
        for k in cutlass.range_constexpr(cute.size(tOrP, mode=[2])):
            cute.gemm(mma_pv, acc_O, tOrP[None, None, k], tOrV[None, None, k, stage], acc_O)

    @cute.jit
    def _score_tile(self, acc_S, n, blk, mask, row_lo, row_hi, row_f, seq, mw0, mw1, left,
                    right, alpha_half, tSc, rab, rB):
        n0 = n * self.bn
        if cutlass.const_expr(self.has_rab):
            self._add_rab(acc_S, rB, rab, n0, tSc, alpha_half)
        full = mask.tile_fully_valid(n0, mw0, mw1, seq, left, right, blk.f0)
        if full == 0:
            mask.apply(acc_mn_view_wg(acc_S), n0, row_lo, row_hi, row_f)

    @cute.jit
    def _mainloop(self, mma_qk, mma_qk0, mma_pv, thr_mma_qk, tSrQ, tSrK, tOrV, acc_O, pipe_k, pipe_v,
                  c_kv, blk, mask, row_lo, row_hi, row_f, seq, mw0, mw1, left, right,
                  alpha_half, turns, wg, tSc, rab):
        wgm, bn = self.wg_m, self.bn
        s_shape = thr_mma_qk.partition_shape_C((wgm, bn))
        a_vals = mma_pv.tv_layout_A.shape[1]
        if cutlass.const_expr(self.overlap):
            # prologue: S_0, P_0
            acc_S = cute.make_rmem_tensor(s_shape, Float32)
            rB = self._rab_load(rab, blk.kv_tile(0), tSc)
            pipe_k.consumer_wait(c_kv)
            turns.wait(wg)
            warpgroup.fence()
            self._qk(mma_qk, mma_qk0, tSrQ, tSrK, pipe_k.stage(c_kv), acc_S)
            warpgroup.commit_group()
            turns.pass_turn(wg)
            warpgroup.wait_group(0)
            pipe_k.consumer_release(c_kv)
            self._score_tile(acc_S, blk.kv_tile(0), blk, mask, row_lo, row_hi, row_f, seq,
                             mw0, mw1, left, right, alpha_half, tSc, rab, rB)
            rP = self._to_p(acc_S, alpha_half)
            tOrP = cute.make_tensor(rP.iterator, acc_layout_as_a(rP.layout, a_vals))
            for it in cutlass.range(1, blk.n_count, unroll=1):
                c_new = c_kv + it
                acc_S2 = cute.make_rmem_tensor(s_shape, Float32)
                rB2 = self._rab_load(rab, blk.kv_tile(it), tSc)
                pipe_k.consumer_wait(c_new)
                turns.wait(wg)
                warpgroup.fence()
                self._qk(mma_qk, mma_qk0, tSrQ, tSrK, pipe_k.stage(c_new), acc_S2)
                warpgroup.commit_group()
                pipe_v.consumer_wait(c_new - 1)
                warpgroup.fence()
                self._pv(mma_pv, tOrP, tOrV, pipe_v.stage(c_new - 1), acc_O)
                warpgroup.commit_group()
                turns.pass_turn(wg)
                warpgroup.wait_group(1)
                pipe_k.consumer_release(c_new)
                self._score_tile(acc_S2, blk.kv_tile(it), blk, mask, row_lo, row_hi, row_f,
                                 seq, mw0, mw1, left, right, alpha_half, tSc, rab, rB2)
                rP2 = self._to_p(acc_S2, alpha_half)
                warpgroup.wait_group(0)
                # P_{j-1} stays allocated until the PV GEMM that reads it has completed
                rP32 = cute.recast_tensor(rP, cutlass.Uint32)
                for e in cutlass.range_constexpr(cute.size(rP32)):
                    rP32[e] = hc.keep_u32(rP32[e])
                pipe_v.consumer_release(c_new - 1)
                rP.store(rP2.load())
            c_last = c_kv + blk.n_count - 1
            pipe_v.consumer_wait(c_last)
            turns.wait(wg)
            warpgroup.fence()
            self._pv(mma_pv, tOrP, tOrV, pipe_v.stage(c_last), acc_O)
            warpgroup.commit_group()
            turns.pass_turn(wg)
            warpgroup.wait_group(0)
            pipe_v.consumer_release(c_last)
        else:
            for it in cutlass.range(blk.n_count, unroll=1):
                c = c_kv + it
                acc_S = cute.make_rmem_tensor(s_shape, Float32)
                rB = self._rab_load(rab, blk.kv_tile(it), tSc)
                pipe_k.consumer_wait(c)
                turns.wait(wg)
                warpgroup.fence()
                self._qk(mma_qk, mma_qk0, tSrQ, tSrK, pipe_k.stage(c), acc_S)
                warpgroup.commit_group()
                turns.pass_turn(wg)
                warpgroup.wait_group(0)
                pipe_k.consumer_release(c)
                self._score_tile(acc_S, blk.kv_tile(it), blk, mask, row_lo, row_hi, row_f,
                                 seq, mw0, mw1, left, right, alpha_half, tSc, rab, rB)
                rP = self._to_p(acc_S, alpha_half)
                tOrP = cute.make_tensor(rP.iterator, acc_layout_as_a(rP.layout, a_vals))
                pipe_v.consumer_wait(c)
                turns.wait(wg)
                warpgroup.fence()
                self._pv(mma_pv, tOrP, tOrV, pipe_v.stage(c), acc_O)
                warpgroup.commit_group()
                turns.pass_turn(wg)
                warpgroup.wait_group(0)
                pipe_v.consumer_release(c)
        return c_kv + blk.n_count

    @cute.jit
    def _epilogue(self, acc_O, inv_scale, thr_mma_pv, sO, mO, head, seq, mw0, wg, wtid,
                  has_work):
        """O / scaling_seqlen -> 16 bit -> smem (swizzled) -> 128-bit stores of rows < L_q.

        A tile without visible keys (``has_work`` false) stores zeros straight from registers:
        it must not touch shared memory, which may alias the Q buffer the producer is
        already refilling for the next tile.
        """
        wgm, dv = self.wg_m, self.dv
        bar_id = 3 + wg
        copy_o = gmem_store_copy(self.dtype, 128, dv)
        thr = copy_o.get_slice(wtid)
        mO_b = offset_rows(mO[None, head, None], seq.q_start)
        gO = cute.local_tile(mO_b, (wgm, dv), (mw0 // wgm, 0))
        tOs = thr.partition_S(sO)
        tOg = thr.partition_D(gO)
        tOc = thr.partition_S(cute.make_identity_tensor((wgm, dv)))
        lim = seq.seqlen_q - mw0
        if has_work:
            rO = cute.make_fragment_like(acc_O, self.dtype)
            rO.store((acc_O.load() * inv_scale).to(self.dtype))
            cute.autovec_copy(rO, thr_mma_pv.partition_C(sO))
            cute.arch.barrier(barrier_id=bar_id, number_of_threads=128)
            for r in cutlass.range_constexpr(cute.size(tOs.shape[1])):
                if tOc[0, r, 0][0] < lim:
                    rr = cute.make_fragment_like(tOs[None, r, None])
                    cute.autovec_copy(tOs[None, r, None], rr)
                    cute.copy(copy_o, rr, tOg[None, r, None])
            # every thread's smem reads are done before the buffer is written again
            cute.arch.barrier(barrier_id=bar_id, number_of_threads=128)
        else:
            for r in cutlass.range_constexpr(cute.size(tOs.shape[1])):
                if tOc[0, r, 0][0] < lim:
                    rr = cute.make_fragment_like(tOs[None, r, None])
                    rr.fill(0)
                    cute.copy(copy_o, rr, tOg[None, r, None])
