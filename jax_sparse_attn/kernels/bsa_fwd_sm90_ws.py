"""Block-sparse attention forward for SM90 on the warp-specialized TMA + wgmma mainloop
(``impl="sm90ws"``).

Contract and semantics are those of :mod:`bsa_fwd_sm80` / :mod:`bsa_fwd_sm90` (tensor modes
``q, k, v, out: (B, S, H, D)`` in the caller's physical layout, ``q2k_block_index (B, H_q, N_q,
K_max)``, ``q2k_block_nums (B, H_q, N_q)``, optional ``block_sizes (B, H_q, N_kv)``, ``lse
(B, H_q, S_q)`` fp32 natural log); the mainloop structure is that of the HSTU forward
:mod:`hstu_fwd_sm90_ws` (read its docstring), with the block-sparse variation points:

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
  With ``overlap`` the PV GEMM of block ``j - 1`` runs while block ``j``'s softmax is
  computed; the O accumulator is rescaled after that GEMM completes.
* Epilogue: ``O / l`` in 16 bit through swizzled shared memory to row-predicated 128-bit
  global stores, ``lse = scale m + ln l``; a row with no visible key gets ``O = 0`` and
  ``lse = -inf``; rows past ``S_q`` are never written.

CTA shapes: ``sparse_block_size = 128``: 384 threads (producer warpgroup + two consumer
warpgroups of 64 query rows, sharing each K/V load, ping-pong), one CTA per SM.
``sparse_block_size = 64``: 256 threads (producer warpgroup + one consumer warpgroup owning a
64-row query block), two CTAs per SM. Work items (query block, query head, batch) are walked
by the persistent ``tile_scheduler.StaticLptScheduler``; consecutive items are the query heads
of one query block, so the heads of a GQA group read the same K/V blocks close in time.
Implemented for D in {64, 128}; other head dims use the mma.sync kernel (``bsa_fwd_sm80``).
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
from .block_info import BlockList
from .common import (acc_layout_as_a, acc_mn_view_wg, gmem_load_copy, gmem_store_copy,
                     smem_layout_16b, transpose_view_staged)
from .mask import KeyLimitMask
from .pipeline import SmemPipeline, WarpgroupTurns
from .softmax import OnlineSoftmax
from .tile_scheduler import StaticLptScheduler

SMEM_LIMIT = 227 * 1024
# two CTAs per SM: 228 KiB of shared memory per SM less 1 KiB reserved per CTA
SMEM_LIMIT_2CTA = 113 * 1024


def bsa_ws_smem_plan(d: int, bm: int, bn: int, limit: int, max_stages: int = 4,
                     q_stages: int = 2):
    """(K/V stages, Q stages, whether O's smem buffer aliases Q's) within ``limit`` bytes:
    a double-buffered Q with its own O buffer first, then one Q stage, then O in Q's buffer;
    for each, the most K/V stages (at least 2)."""
    o = bm * d * 2
    plans = [(qs, False) for qs in range(q_stages, 0, -1)] + [(1, True)]
    for qs, alias in plans:
        for stages in range(max_stages, 1, -1):
            total = qs * bm * d * 2 + stages * bn * 2 * d * 2 + (0 if alias else o) + 1024 + 256
            if total <= limit:
                return stages, qs, alias
    raise ValueError(f"no shared-memory plan for head_dim={d}, sparse_block_size={bn}")


class BsaFwdSm90Ws:
    def __init__(self, dtype, head_dim: int, block_size: int, has_block_sizes: bool,
                 num_sms: int, overlap: bool = True, pingpong: bool = True,
                 max_stages: int = 4, q_stages: int = 2):
        if block_size not in (64, 128) or head_dim not in (64, 128):
            raise NotImplementedError(
                f"bsa_fwd_sm90_ws implements head_dim in (64, 128) and sparse_block_size in "
                f"(64, 128), got head_dim={head_dim}, sparse_block_size={block_size}")
        self.dtype = dtype
        self.d = head_dim
        self.bn = block_size
        self.wg_m = 64
        self.num_wg = block_size // 64
        self.bm = 64 * self.num_wg
        self.has_sizes = has_block_sizes
        self.overlap = overlap
        self.pingpong = pingpong and self.num_wg == 2
        self.ctas_per_sm = 1 if self.num_wg == 2 else 2
        limit = SMEM_LIMIT if self.ctas_per_sm == 1 else SMEM_LIMIT_2CTA
        self.stages, self.q_stages, self.o_alias_q = bsa_ws_smem_plan(
            head_dim, self.bm, block_size, limit, max_stages, q_stages)
        self.num_sms = num_sms
        self.num_threads = 128 * (1 + self.num_wg)
        # register budget per CTA: 65536 / ctas_per_sm = 128 * (producer + num_wg * consumer)
        self.regs_producer = 24
        self.regs_consumer = 240 if self.num_wg == 2 else 232

    @staticmethod
    def can_implement(dtype, head_dim: int, block_size: int) -> bool:
        return (dtype in (cutlass.Float16, cutlass.BFloat16) and head_dim in (64, 128)
                and block_size in (64, 128))

    @cute.jit
    def __call__(self, mQ, mK, mV, mIdx, mNums, mSizes, mScale, mO, mLSE, stream):
        dt = self.dtype
        wgm, bn, d = self.wg_m, self.bn, self.d
        qk_tiler = (wgm, bn, d)
        pv_tiler = (wgm, d, bn)
        mma_qk = sm90_utils.make_trivial_tiled_mma(
            dt, dt, OperandMajorMode.K, OperandMajorMode.K, Float32, (1, 1, 1), (wgm, bn))
        # the first K slice of S = Q K^T overwrites the accumulator (no zero fill)
        mma_qk0 = sm90_utils.make_trivial_tiled_mma(
            dt, dt, OperandMajorMode.K, OperandMajorMode.K, Float32, (1, 1, 1), (wgm, bn))
        mma_pv = sm90_utils.make_trivial_tiled_mma(
            dt, dt, OperandMajorMode.K, OperandMajorMode.MN, Float32, (1, 1, 1), (wgm, d),
            warpgroup.OperandSource.RMEM)
        sQ_layout = sm90_utils.make_smem_layout_a(LayoutEnum.ROW_MAJOR, qk_tiler, dt,
                                                  self.num_wg * self.q_stages)
        sK_layout = sm90_utils.make_smem_layout_b(LayoutEnum.ROW_MAJOR, qk_tiler, dt,
                                                  self.stages)
        sV_layout = sm90_utils.make_smem_layout_b(LayoutEnum.COL_MAJOR, pv_tiler, dt,
                                                  self.stages)
        sO_layout = smem_layout_16b(wgm, d)

        # TMA views: Q, K as (S, D, H, B) (D contiguous), V as (D, S, H, B) (MN-major B operand)
        B = mQ.shape[0]
        S_q = mQ.shape[1]
        H_q = mQ.shape[2]
        S_k = mK.shape[1]
        H_kv = mK.shape[2]
        tQ = cute.make_tensor(mQ.iterator, cute.make_layout(
            (S_q, d, H_q, B), stride=(mQ.stride[1], 1, mQ.stride[2], mQ.stride[0])))
        tK = cute.make_tensor(mK.iterator, cute.make_layout(
            (S_k, d, H_kv, B), stride=(mK.stride[1], 1, mK.stride[2], mK.stride[0])))
        tV = cute.make_tensor(mV.iterator, cute.make_layout(
            (d, S_k, H_kv, B), stride=(1, mV.stride[1], mV.stride[2], mV.stride[0])))
        g2s = cpasync.CopyBulkTensorTileG2SOp()
        tma_q, tma_tQ = cpasync.make_tiled_tma_atom(
            g2s, tQ, cute.slice_(sQ_layout, (None, None, 0)), (wgm, d))
        tma_k, tma_tK = cpasync.make_tiled_tma_atom(
            g2s, tK, cute.slice_(sK_layout, (None, None, 0)), (bn, d))
        tma_v, tma_tV = cpasync.make_tiled_tma_atom(
            g2s, tV, cute.slice_(sV_layout, (None, None, 0)), (d, bn))

        n_mbar = SmemPipeline.num_barriers(self.q_stages) + 2 * SmemPipeline.num_barriers(
            self.stages)
        o_elems = 0 if cutlass.const_expr(self.o_alias_q) else cute.cosize(sO_layout) * self.num_wg

        @cute.struct
        class Smem:
            mbar: cute.struct.MemRange[cutlass.Int64, n_mbar]
            sQ: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sQ_layout)], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sK_layout)], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sV_layout)], 1024]
            sO: cute.struct.Align[cute.struct.MemRange[dt, o_elems], 1024]

        n_q_blocks = (S_q + self.bm - 1) // self.bm
        n_work = B * n_q_blocks * H_q
        grid = StaticLptScheduler.grid(n_work, self.num_sms * self.ctas_per_sm)
        self.kernel(
            tma_q, tma_tQ, tma_k, tma_tK, tma_v, tma_tV, mV, mIdx, mNums, mSizes, mScale, mO,
            mLSE, sQ_layout, sK_layout, sV_layout, sO_layout, mma_qk, mma_qk0, mma_pv, Smem,
        ).launch(grid=grid, block=[self.num_threads, 1, 1], smem=Smem.size_in_bytes(),
                 stream=stream, min_blocks_per_mp=self.ctas_per_sm,
                 # two CTAs per SM need the largest shared-memory carveout (percent)
                 preferred_smem_carveout=100 if self.ctas_per_sm > 1 else None)

    # ------------------------------------------------------------------------------------
    @cute.jit
    def _work(self, sched, t, n_q_blocks, mIdx, mNums, mSizes, seqlen_k):
        """(batch, query head, query block, its BlockList) of work item ``t``."""
        slot, head = sched.coords(t)
        batch = slot // n_q_blocks
        m_block = slot - batch * n_q_blocks
        blist = BlockList.create(mIdx, mNums, mSizes, batch, head, m_block, seqlen_k, self.bn,
                                 self.has_sizes)
        return batch, head, m_block, blist

    @cute.jit
    def _load_v_rows(self, mV, batch, head_kv, n, limit, sV_rows, stage, lane):
        """One warp: V rows [n bn, n bn + limit) by cp.async, zeros in the rest of the tile."""
        copy_v = gmem_load_copy(self.dtype, 32, self.d)
        gV = cute.local_tile(mV[batch, None, head_kv, None], (self.bn, self.d), (n, 0))
        thr = copy_v.get_slice(lane)
        tg = thr.partition_S(gV)
        ts = thr.partition_D(sV_rows[None, None, stage])
        tc = thr.partition_S(cute.make_identity_tensor((self.bn, self.d)))
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
    def kernel(self, tma_q, tma_tQ, tma_k, tma_tK, tma_v, tma_tV, mV, mIdx, mNums, mSizes,
               mScale, mO, mLSE, sQ_layout, sK_layout, sV_layout, sO_layout, mma_qk, mma_qk0,
               mma_pv, Smem: cutlass.Constexpr):
        tidx, _, _ = cute.arch.thread_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg_idx = warp // 4
        bm, bn, wgm, d, nwg = self.bm, self.bn, self.wg_m, self.d, self.num_wg
        n_batch = mO.shape[0]
        seqlen_q = mO.shape[1]
        n_heads = mO.shape[2]
        seqlen_k = mV.shape[1]
        group = n_heads // mV.shape[2]
        n_q_blocks = (seqlen_q + bm - 1) // bm
        sched = StaticLptScheduler(n_heads, n_batch * n_q_blocks * n_heads)

        smem = cutlass.memory.SmemAllocator()
        st = smem.allocate(Smem)
        mbar = st.mbar.data_ptr()
        nq = 2 * self.q_stages
        pipe_q = SmemPipeline(mbar, self.q_stages, 4 * nwg)
        pipe_k = SmemPipeline(mbar + nq, self.stages, 4 * nwg)
        pipe_v = SmemPipeline(mbar + nq + 2 * self.stages, self.stages, 4 * nwg)
        if warp == 0:
            pipe_q.init()
            pipe_k.init()
            pipe_v.init()
            cpasync.prefetch_descriptor(tma_q)
            cpasync.prefetch_descriptor(tma_k)
            cpasync.prefetch_descriptor(tma_v)
        cute.arch.mbarrier_init_fence()
        cute.arch.barrier()

        sQ = st.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)  # (64, D, nwg Qstages)
        sK = st.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)  # (BN, D, S)
        sV = st.sV.get_tensor(sV_layout.outer, swizzle=sV_layout.inner)  # (D, BN, S)

        q_bytes = cute.size_in_bytes(self.dtype, cute.slice_(sQ_layout, (None, None, 0))) * nwg
        k_bytes = cute.size_in_bytes(self.dtype, cute.slice_(sK_layout, (None, None, 0)))
        v_bytes = cute.size_in_bytes(self.dtype, cute.slice_(sV_layout, (None, None, 0)))

        if wg_idx == 0:
            # ================================ producer ================================
            cute.arch.setmaxregister_decrease(self.regs_producer)
            if warp == 0:
                lane = cute.arch.lane_idx()
                sV_rows = transpose_view_staged(sV)  # (BN, D, S)
                c_q = Int32(0)
                c_kv = Int32(0)
                t = sched.first()
                while sched.valid(t):
                    batch, head, m_block, blist = self._work(sched, t, n_q_blocks, mIdx, mNums,
                                                             mSizes, seqlen_k)
                    head_kv = head // group
                    if blist.n_count > 0:
                        gQ = cute.local_tile(tma_tQ[None, None, head, batch], (wgm, d), (None, 0))
                        tQs, tQg = cpasync.tma_partition(
                            tma_q, 0, cute.make_layout(1), cute.group_modes(sQ, 0, 2),
                            cute.group_modes(gQ, 0, 2))
                        gK = cute.local_tile(tma_tK[None, None, head_kv, batch], (bn, d),
                                             (None, 0))
                        tKs, tKg = cpasync.tma_partition(
                            tma_k, 0, cute.make_layout(1), cute.group_modes(sK, 0, 2),
                            cute.group_modes(gK, 0, 2))
                        gV = cute.local_tile(tma_tV[None, None, head_kv, batch], (d, bn),
                                             (0, None))
                        tVs, tVg = cpasync.tma_partition(
                            tma_v, 0, cute.make_layout(1), cute.group_modes(sV, 0, 2),
                            cute.group_modes(gV, 0, 2))
                        pipe_q.producer_acquire(c_q)
                        pipe_q.producer_expect_tx(c_q, q_bytes)
                        sq = pipe_q.stage(c_q)
                        for w in cutlass.range_constexpr(nwg):
                            cute.copy(tma_q, tQg[None, nwg * m_block + w], tQs[None, nwg * sq + w],
                                      tma_bar_ptr=pipe_q.full_ptr(c_q))
                        c_q += 1
                        for it in cutlass.range(blist.n_count, unroll=1):
                            n = blist.kv_tile(it)
                            s = pipe_k.stage(c_kv)
                            pipe_k.producer_acquire(c_kv)
                            pipe_k.producer_expect_tx(c_kv, k_bytes)
                            cute.copy(tma_k, tKg[None, n], tKs[None, s],
                                      tma_bar_ptr=pipe_k.full_ptr(c_kv))
                            pipe_v.producer_acquire(c_kv)
                            limit = blist.valid_keys(n)
                            # a box crossing S is zero-filled by TMA; only block_sizes
                            # partial blocks inside S need the zero-filling copy
                            if limit >= cutlass.min(Int32(bn), seqlen_k - n * bn):
                                pipe_v.producer_expect_tx(c_kv, v_bytes)
                                cute.copy(tma_v, tVg[None, n], tVs[None, s],
                                          tma_bar_ptr=pipe_v.full_ptr(c_kv))
                            else:
                                self._load_v_rows(mV, batch, head_kv, n, limit, sV_rows, s, lane)
                                pipe_v.producer_arrive(c_kv)
                            c_kv += 1
                    t = sched.next(t)
        else:
            # ================================ consumers ===============================
            cute.arch.setmaxregister_increase(self.regs_consumer)
            wg = wg_idx - 1
            wtid = tidx % 128
            turns = WarpgroupTurns(self.pingpong)
            softmax_scale = Float32(mScale[0])

            mma_qk.set(warpgroup.Field.ACCUMULATE, True)
            mma_qk0.set(warpgroup.Field.ACCUMULATE, False)
            mma_pv.set(warpgroup.Field.ACCUMULATE, True)
            thr_mma_qk = mma_qk.get_slice(wtid)
            thr_mma_pv = mma_pv.get_slice(wtid)
            tSrQ = thr_mma_qk.make_fragment_A(thr_mma_qk.partition_A(sQ))
            tSrK = thr_mma_qk.make_fragment_B(thr_mma_qk.partition_B(sK))
            tOrV = thr_mma_pv.make_fragment_B(thr_mma_pv.partition_B(sV))
            tScS = acc_mn_view_wg(thr_mma_qk.partition_C(cute.make_identity_tensor((wgm, bn))))
            mask = KeyLimitMask(tScS)
            smax = OnlineSoftmax.create(cute.size(tScS, mode=[0]), softmax_scale)

            # this warpgroup's O staging buffer: its own buffer, or its part of sQ
            o_base = st.sQ.data_ptr() + wg * (wgm * d)
            if cutlass.const_expr(not self.o_alias_q):
                o_base = st.sO.data_ptr() + wg * cute.cosize(sO_layout)
            sO = cute.make_tensor(cute.recast_ptr(o_base, sO_layout.inner), sO_layout.outer)

            turns.start(wg)
            c_q = Int32(0)
            c_kv = Int32(0)
            t = sched.first()
            while sched.valid(t):
                batch, head, m_block, blist = self._work(sched, t, n_q_blocks, mIdx, mNums,
                                                         mSizes, seqlen_k)
                mw0 = m_block * bm + wg * wgm
                acc_O = cute.make_rmem_tensor(thr_mma_pv.partition_shape_C((wgm, d)), Float32)
                acc_O.fill(0.0)
                smax.reset()
                if blist.n_count > 0:
                    pipe_q.consumer_wait(c_q)
                    c_kv = self._mainloop(
                        mma_qk, mma_qk0, mma_pv, thr_mma_qk,
                        tSrQ[None, None, None, nwg * pipe_q.stage(c_q) + wg], tSrK, tOrV,
                        acc_O, pipe_k, pipe_v, c_kv, blist, mask, smax, turns, wg)
                    if cutlass.const_expr(not self.o_alias_q):
                        pipe_q.consumer_release(c_q)
                self._epilogue(acc_O, smax, thr_mma_pv, sO, mO, mLSE, batch, head, seqlen_q,
                               mw0, wg, wtid, blist.n_count > 0)
                if blist.n_count > 0:
                    if cutlass.const_expr(self.o_alias_q):
                        # generic accesses of the aliased Q buffer before the next TMA write
                        cute.arch.fence_proxy("async.shared", space="cta")
                        pipe_q.consumer_release(c_q)
                    c_q += 1
                t = sched.next(t)

    # ------------------------------------------------------------------------------------
    @cute.jit
    def _qk(self, mma_qk, mma_qk0, tSrQ, tSrK, stage, acc_S):
        for k in cutlass.range_constexpr(cute.size(tSrQ, mode=[2])):
            cute.gemm(mma_qk0 if k == 0 else mma_qk, acc_S, tSrQ[None, None, k],
                      tSrK[None, None, k, stage], acc_S)

    @cute.jit
    def _pv(self, mma_pv, tOrP, tOrV, stage, acc_O):
        for k in cutlass.range_constexpr(cute.size(tOrP, mode=[2])):
            cute.gemm(mma_pv, acc_O, tOrP[None, None, k], tOrV[None, None, k, stage], acc_O)

    @cute.jit
    def _score_tile(self, acc_S, limit, mask, smax, corr):
        """Mask the keys past the block's valid count ``limit``, then the online-softmax
        step. The caller reads ``limit`` (metadata loads) before it waits for the GEMM, so
        their latency hides behind it."""
        acc_mn = acc_mn_view_wg(acc_S)
        if limit < self.bn:
            mask.apply(acc_mn, limit)
        smax.step(acc_mn, corr)

    @cute.jit
    def _mainloop(self, mma_qk, mma_qk0, mma_pv, thr_mma_qk, tSrQ, tSrK, tOrV, acc_O, pipe_k,
                  pipe_v, c_kv, blist, mask, smax, turns, wg):
        wgm, bn = self.wg_m, self.bn
        s_shape = thr_mma_qk.partition_shape_C((wgm, bn))
        a_vals = mma_pv.tv_layout_A.shape[1]
        corr = cute.make_rmem_tensor((cute.size(mask.tScS, mode=[0]),), Float32)
        acc_O_mn = acc_mn_view_wg(acc_O)
        if cutlass.const_expr(self.overlap):
            # prologue: S_0, P_0 (acc_O is still zero: no rescale)
            acc_S = cute.make_rmem_tensor(s_shape, Float32)
            limit = blist.valid_keys(blist.kv_tile(0))
            pipe_k.consumer_wait(c_kv)
            turns.wait(wg)
            warpgroup.fence()
            self._qk(mma_qk, mma_qk0, tSrQ, tSrK, pipe_k.stage(c_kv), acc_S)
            warpgroup.commit_group()
            turns.pass_turn(wg)
            warpgroup.wait_group(0)
            pipe_k.consumer_release(c_kv)
            self._score_tile(acc_S, limit, mask, smax, corr)
            rP = cute.make_fragment_like(acc_S, self.dtype)
            rP.store(acc_S.load().to(self.dtype))
            tOrP = cute.make_tensor(rP.iterator, acc_layout_as_a(rP.layout, a_vals))
            for it in cutlass.range(1, blist.n_count, unroll=1):
                c_new = c_kv + it
                acc_S2 = cute.make_rmem_tensor(s_shape, Float32)
                limit2 = blist.valid_keys(blist.kv_tile(it))
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
                self._score_tile(acc_S2, limit2, mask, smax, corr)
                rP2 = cute.make_fragment_like(acc_S2, self.dtype)
                rP2.store(acc_S2.load().to(self.dtype))
                warpgroup.wait_group(0)
                # P_{j-1} stays allocated until the PV GEMM that reads it has completed
                rP32 = cute.recast_tensor(rP, cutlass.Uint32)
                for e in cutlass.range_constexpr(cute.size(rP32)):
                    rP32[e] = hc.keep_u32(rP32[e])
                pipe_v.consumer_release(c_new - 1)
                # O holds P_{j-1} V_{j-1} now: bring it to block j's running max
                smax.rescale(acc_O_mn, corr)
                rP.store(rP2.load())
            c_last = c_kv + blist.n_count - 1
            pipe_v.consumer_wait(c_last)
            turns.wait(wg)
            warpgroup.fence()
            self._pv(mma_pv, tOrP, tOrV, pipe_v.stage(c_last), acc_O)
            warpgroup.commit_group()
            turns.pass_turn(wg)
            warpgroup.wait_group(0)
            pipe_v.consumer_release(c_last)
        else:
            for it in cutlass.range(blist.n_count, unroll=1):
                c = c_kv + it
                acc_S = cute.make_rmem_tensor(s_shape, Float32)
                limit = blist.valid_keys(blist.kv_tile(it))
                pipe_k.consumer_wait(c)
                turns.wait(wg)
                warpgroup.fence()
                self._qk(mma_qk, mma_qk0, tSrQ, tSrK, pipe_k.stage(c), acc_S)
                warpgroup.commit_group()
                turns.pass_turn(wg)
                warpgroup.wait_group(0)
                pipe_k.consumer_release(c)
                self._score_tile(acc_S, limit, mask, smax, corr)
                smax.rescale(acc_O_mn, corr)
                rP = cute.make_fragment_like(acc_S, self.dtype)
                rP.store(acc_S.load().to(self.dtype))
                tOrP = cute.make_tensor(rP.iterator, acc_layout_as_a(rP.layout, a_vals))
                pipe_v.consumer_wait(c)
                turns.wait(wg)
                warpgroup.fence()
                self._pv(mma_pv, tOrP, tOrV, pipe_v.stage(c), acc_O)
                warpgroup.commit_group()
                turns.pass_turn(wg)
                warpgroup.wait_group(0)
                pipe_v.consumer_release(c)
        return c_kv + blist.n_count

    @cute.jit
    def _epilogue(self, acc_O, smax, thr_mma_pv, sO, mO, mLSE, batch, head, seqlen_q, mw0, wg,
                  wtid, has_work):
        """``O / l`` -> 16 bit -> smem (swizzled) -> 128-bit stores of rows ``< S_q``; LSE.

        A work item without listed blocks (``has_work`` false) stores zeros and ``-inf``
        straight from registers: it must not touch shared memory, which may alias the Q
        buffer the producer is already refilling for the next item.
        """
        wgm, d = self.wg_m, self.d
        bar_id = 3 + wg
        lim = seqlen_q - mw0
        acc_O_mn = acc_mn_view_wg(acc_O)
        tOcO_mn = acc_mn_view_wg(thr_mma_pv.partition_C(cute.make_identity_tensor((wgm, d))))
        for r in cutlass.range_constexpr(cute.size(acc_O_mn, mode=[0])):
            inv, lse = smax.finalize(r)
            row = tOcO_mn[r, 0][0]
            if row < lim:
                if wtid % 4 == 0:
                    mLSE[batch, head, mw0 + row] = lse
            acc_O_mn[r, None] = acc_O_mn[r, None].load() * inv

        copy_o = gmem_store_copy(self.dtype, 128, d)
        thr = copy_o.get_slice(wtid)
        gO = cute.local_tile(mO[batch, None, head, None], (wgm, d), (mw0 // wgm, 0))
        tOs = thr.partition_S(sO)
        tOg = thr.partition_D(gO)
        tOc = thr.partition_S(cute.make_identity_tensor((wgm, d)))
        if has_work:
            rO = cute.make_fragment_like(acc_O, self.dtype)
            rO.store(acc_O.load().to(self.dtype))
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
