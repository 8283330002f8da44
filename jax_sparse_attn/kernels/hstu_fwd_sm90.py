"""HSTU attention forward for SM90 with warpgroup MMA (wgmma), cp.async loads.

The default HSTU forward on SM90 in its ping-pong form (``impl="sm90pp"``; ``"sm90"`` is the
lockstep form; GPU tests: ``HSTU_TEST_SM90=1 pytest -m gpu -k sm90 tests/test_gpu_hstu.py``): same semantics, tile
schedule, masks and zero-fill conventions as ``hstu_fwd_sm80`` (read its docstring), but
the two GEMMs run on Hopper's asynchronous warpgroup MMA:

* 256 threads = 2 consumer warpgroups; the CTA owns 128 query rows, warpgroup ``w`` owns
  rows ``[64 w, 64 w + 64)`` (its own 64-row Q tile in smem).
* ``S = Q K^T``: wgmma with both operands from swizzled (128B) smem.
* ``P = mask * SiLU(alpha S)`` in registers, converted to bf16/fp16 and fed to
  ``O += P V`` as the register A operand (wgmma RS); V is the MN-major B operand.
* K and V are double-buffered with cp.async (zero-fill of rows past the sequence end).

Synchronization per KV tile (both warpgroups share the K/V stages): every thread waits for
its own cp.async group of the tile, issues ``fence.proxy.async.shared::cta`` (cp.async and
the zero-fill stores are generic-proxy writes that wgmma reads through the async proxy)
and the CTA barrier makes them visible to all; each wgmma chain is preceded by
``wgmma.fence`` (its accumulator / P registers were written by ordinary code) and followed
by ``commit_group`` + ``wait_group(0)`` before its accumulator is read; a CTA barrier at the
end of the tile orders every wgmma read of the stage before the cp.async that refills it.

``pingpong=True`` (``impl="sm90pp"``): the two warpgroups take turns issuing their GEMMs
through two named barriers (ids 1 and 2, 256 threads: each warpgroup ``bar.sync``s on its
own id before issuing and ``bar.arrive``s on the other's right after issuing), so the
tensor-core issue order inside a tile is QK(wg0), QK(wg1), PV(wg0), PV(wg1): warpgroup 0's
SiLU runs while warpgroup 1's QK GEMM executes and warpgroup 1's SiLU while warpgroup 0's PV
GEMM executes. Everything else (loads, masks, barriers, epilogue) is the same code.

``has_rab`` (relative attention bias, ``mRab (B, H_rab, N_k, N_k)``, q's dtype or fp32):
each thread loads its elements of the bias tile from gmem into registers while the QK
wgmma runs (``hc.rab_load_tile``: rows ``p = i + L_k - L_q`` and columns outside
``[0, min(L_k, N_k))`` get 0 and read a clamped address), and the score becomes
``h = alpha S / 2 + rab / 2`` before the mask; without it no bias code is generated.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.memory
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Float32, Int32
from cutlass.cute.nvgpu import OperandMajorMode, warpgroup
from cutlass.tensor_utils import LayoutEnum

from . import hstu_common as hc
from .common import acc_layout_as_a, acc_mn_view_wg, gmem_load_copy, transpose_view_staged

BIG = 1 << 30


class HstuFwdSm90:
    """Forward kernel (wgmma). Same call signature and grid as ``HstuFwdSm80``."""

    def __init__(self, dtype, head_dim, head_dim_v, block_m, block_n, num_warps, has_func,
                 func_n, pingpong=False, has_rab=False, rab_per_head=False):
        if block_m != 128 or num_warps != 8:
            raise ValueError(f"HstuFwdSm90 needs block_m=128, num_warps=8 (got {block_m}, "
                             f"{num_warps})")
        self.dtype = dtype
        self.d = head_dim
        self.dv = head_dim_v
        self.bm = block_m
        self.wg_m = 64
        self.bn = block_n
        self.num_threads = 256
        self.has_func = has_func
        self.func_n = func_n
        self.stages = 2
        self.pingpong = pingpong
        self.has_rab = has_rab
        self.rab_per_head = rab_per_head

    @cute.jit
    def __call__(self, mQ, mK, mV, mCuQ, mCuK, mTile, mFunc, mScal, mWin, mO, stream,
                 mRab=None):
        dt = self.dtype
        qk_tiler = (self.wg_m, self.bn, self.d)
        pv_tiler = (self.wg_m, self.dv, self.bn)
        mma_qk = sm90_utils.make_trivial_tiled_mma(
            dt, dt, OperandMajorMode.K, OperandMajorMode.K, Float32, (1, 1, 1),
            (self.wg_m, self.bn))
        mma_pv = sm90_utils.make_trivial_tiled_mma(
            dt, dt, OperandMajorMode.K, OperandMajorMode.MN, Float32, (1, 1, 1),
            (self.wg_m, self.dv), warpgroup.OperandSource.RMEM)
        sQ_layout = sm90_utils.make_smem_layout_a(LayoutEnum.ROW_MAJOR, qk_tiler, dt, 2)
        sK_layout = sm90_utils.make_smem_layout_b(LayoutEnum.ROW_MAJOR, qk_tiler, dt,
                                                  self.stages)
        sV_layout = sm90_utils.make_smem_layout_b(LayoutEnum.COL_MAJOR, pv_tiler, dt,
                                                  self.stages)

        @cute.struct
        class Smem:
            sQ: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sQ_layout)], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sK_layout)], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sV_layout)], 1024]

        copy_qk = gmem_load_copy(dt, self.num_threads, self.d)
        copy_v = gmem_load_copy(dt, self.num_threads, self.dv)
        grid = (cute.size(mQ.shape[1]), cute.size(mTile.shape[0]), 1)
        self.kernel(
            mQ, mK, mV, mCuQ, mCuK, mTile, mFunc, mScal, mWin, mO, mRab,
            sQ_layout, sK_layout, sV_layout, copy_qk, copy_v, mma_qk, mma_pv, Smem,
        ).launch(grid=grid, block=[self.num_threads, 1, 1], smem=Smem.size_in_bytes(),
                 stream=stream)

    @cute.jit
    def _turn_wait(self, wg):
        """Ping-pong: wait until it is this warpgroup's turn to issue wgmma (bar.sync 1 + wg)."""
        if cutlass.const_expr(self.pingpong):
            cute.arch.barrier(barrier_id=1 + wg, number_of_threads=256)

    @cute.jit
    def _turn_pass(self, wg):
        """Ping-pong: hand the turn to the other warpgroup (bar.arrive 2 - wg)."""
        if cutlass.const_expr(self.pingpong):
            cute.arch.barrier_arrive(barrier_id=2 - wg, number_of_threads=256)

    @cute.kernel
    def kernel(self, mQ, mK, mV, mCuQ, mCuK, mTile, mFunc, mScal, mWin, mO, mRab,
               sQ_layout, sK_layout, sV_layout, copy_qk, copy_v, mma_qk, mma_pv,
               Smem: cutlass.Constexpr):
        tidx, _, _ = cute.arch.thread_idx()
        head, slot, _ = cute.arch.block_idx()
        bm = self.bm
        bn = self.bn
        wgm = self.wg_m
        wg = tidx // 128
        wtid = tidx % 128
        batch = mTile[slot, 0]
        if batch >= 0:
            m_block = mTile[slot, 1]
            q_start = mCuQ[batch]
            seqlen_q = mCuQ[batch + 1] - q_start
            k_start = mCuK[batch]
            seqlen_k = mCuK[batch + 1] - k_start
            off = seqlen_k - seqlen_q
            m0 = m_block * bm
            m1 = cutlass.min(m0 + bm, seqlen_q)
            left = mWin[0]
            right = mWin[1]
            alpha_half = mScal[0]
            inv_scale = mScal[1]

            j_lo, j_hi, f0, n_min, n_max = hc.fwd_kv_block_range(
                mTile, slot, m0, m1, seqlen_k, off, left, right, bn, self.has_func)
            n_count = n_max - n_min

            mQ_b = cute.domain_offset((q_start, 0), mQ[None, head, None])
            mK_b = cute.domain_offset((k_start, 0), mK[None, head, None])
            mV_b = cute.domain_offset((k_start, 0), mV[None, head, None])
            mO_b = cute.domain_offset((q_start, 0), mO[None, head, None])
            gQ = cute.local_tile(mQ_b, (wgm, self.d), (None, 0))
            gK = cute.local_tile(mK_b, (bn, self.d), (None, 0))
            gV = cute.local_tile(mV_b, (bn, self.dv), (None, 0))

            smem = cutlass.memory.SmemAllocator()
            st = smem.allocate(Smem)
            sQ = st.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)  # (64, D, 2)
            sK = st.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)  # (BN, D, S)
            sV = st.sV.get_tensor(sV_layout.outer, swizzle=sV_layout.inner)  # (Dv, BN, S)
            # (BN, Dv, S) view of V for the gmem -> smem copy
            sV_rows = transpose_view_staged(sV)

            thr_qk = copy_qk.get_slice(tidx)
            thr_v = copy_v.get_slice(tidx)
            tQgQ = thr_qk.partition_S(gQ)
            tQsQ = thr_qk.partition_D(sQ)
            tKgK = thr_qk.partition_S(gK)
            tKsK = thr_qk.partition_D(sK)
            tVgV = thr_v.partition_S(gV)
            tVsV = thr_v.partition_D(sV_rows)
            tQc = thr_qk.partition_S(cute.make_identity_tensor((wgm, self.d)))
            tKc = thr_qk.partition_S(cute.make_identity_tensor((bn, self.d)))
            tVc = thr_v.partition_S(cute.make_identity_tensor((bn, self.dv)))

            thr_mma_qk = mma_qk.get_slice(wtid)
            thr_mma_pv = mma_pv.get_slice(wtid)
            tSrQ = thr_mma_qk.make_fragment_A(thr_mma_qk.partition_A(sQ))
            tSrK = thr_mma_qk.make_fragment_B(thr_mma_qk.partition_B(sK))
            tOrV = thr_mma_pv.make_fragment_B(thr_mma_pv.partition_B(sV))
            acc_O = cute.make_rmem_tensor(thr_mma_pv.partition_shape_C((wgm, self.dv)), Float32)
            acc_O.fill(0.0)
            mma_qk.set(warpgroup.Field.ACCUMULATE, True)
            mma_pv.set(warpgroup.Field.ACCUMULATE, True)

            tScS = acc_mn_view_wg(thr_mma_qk.partition_C(cute.make_identity_tensor((wgm, bn))))
            n_rows = cute.size(tScS, mode=[0])
            n_cols = cute.size(tScS, mode=[1])
            row_lo = cute.make_rmem_tensor((n_rows,), Int32)
            row_hi = cute.make_rmem_tensor((n_rows,), Int32)
            func_n = self.func_n if cutlass.const_expr(self.has_func) else 1
            row_f = cute.make_rmem_tensor((n_rows, func_n), Int32)
            mw0 = m0 + wg * wgm  # first row of this warpgroup's sub-tile
            for r in cutlass.range_constexpr(n_rows):
                i = mw0 + tScS[r, 0][0]
                if cutlass.const_expr(self.has_func):
                    for t in cutlass.range_constexpr(func_n):
                        row_f[r, t] = mFunc[0, t, q_start + i]
                else:
                    row_lo[r] = -BIG if left < 0 else i + off - left
                    row_hi[r] = BIG if right < 0 else i + off + right

            if cutlass.const_expr(self.has_rab):
                rab_nk = mRab.shape[3]
                rab_lim = cutlass.min(seqlen_k, rab_nk)
                rab_h = head if cutlass.const_expr(self.rab_per_head) else 0
                mRab_bh = mRab[cutlass.min(batch, mRab.shape[0] - 1), rab_h, None, None]
                rab_p = cute.make_rmem_tensor((n_rows,), Int32)
                rab_ok = cute.make_rmem_tensor((n_rows,), Int32)
                hc.rab_row_setup(rab_p, rab_ok, tScS, mw0, off, rab_lim, rab_nk)

            if cutlass.const_expr(self.pingpong):
                # warpgroup 0 owns the first turn: pre-arrive on its own turn barrier
                if wg == 0:
                    cute.arch.barrier_arrive(barrier_id=1, number_of_threads=256)

            if n_count > 0:
                for w in cutlass.range_constexpr(2):
                    hc.load_rows(copy_qk, tQgQ[None, None, None, 2 * m_block + w],
                                 tQsQ[None, None, None, w], tQc, seqlen_q - m0 - w * wgm)
                n_first = n_max - 1
                hc.load_rows(copy_qk, tKgK[None, None, None, n_first],
                             tKsK[None, None, None, 0], tKc, seqlen_k - n_first * bn)
                hc.load_rows(copy_v, tVgV[None, None, None, n_first],
                             tVsV[None, None, None, 0], tVc, seqlen_k - n_first * bn)
                cute.arch.cp_async_commit_group()

            for it in cutlass.range(n_count, unroll=1):
                n = n_max - 1 - it
                stage = it % 2
                if it + 1 < n_count:
                    nn = n - 1
                    hc.load_rows(copy_qk, tKgK[None, None, None, nn],
                                 tKsK[None, None, None, 1 - stage], tKc, seqlen_k - nn * bn)
                    hc.load_rows(copy_v, tVgV[None, None, None, nn],
                                 tVsV[None, None, None, 1 - stage], tVc, seqlen_k - nn * bn)
                cute.arch.cp_async_commit_group()
                cute.arch.cp_async_wait_group(1)
                # cp.async / zero-fill writes (generic proxy) -> visible to wgmma (async proxy)
                cute.arch.fence_proxy("async.shared", space="cta")
                cute.arch.barrier()

                acc_S = cute.make_rmem_tensor(thr_mma_qk.partition_shape_C((wgm, bn)), Float32)
                acc_S.fill(0.0)
                self._turn_wait(wg)
                warpgroup.fence()
                for k in cutlass.range_constexpr(cute.size(tSrQ, mode=[2])):
                    cute.gemm(mma_qk, acc_S, tSrQ[None, None, k, wg],
                              tSrK[None, None, k, stage], acc_S)
                warpgroup.commit_group()
                self._turn_pass(wg)
                if cutlass.const_expr(self.has_rab):
                    # bias tile (already / 2) loads overlap the QK wgmma
                    rBias = cute.make_fragment_like(acc_S)
                    hc.rab_load_tile(acc_mn_view_wg(rBias), mRab_bh, rab_p, rab_ok, tScS,
                                     n * bn, rab_lim, rab_nk, 0.5)
                warpgroup.wait_group(0)
                if cutlass.const_expr(self.has_rab):
                    for e in cutlass.range_constexpr(cute.size(acc_S)):
                        acc_S[e] = acc_S[e] * alpha_half + rBias[e]

                n0 = n * bn
                full = Int32(0)
                if cutlass.const_expr(self.has_func):
                    full = Int32(n0 + bn <= f0)
                else:
                    ok_l = Int32(1)
                    ok_r = Int32(1)
                    if left >= 0:
                        ok_l = Int32(n0 >= m1 - 1 + off - left)
                    if right >= 0:
                        ok_r = Int32(n0 + bn - 1 <= m0 + off + right)
                    full = ok_l * ok_r
                acc_S_mn = acc_mn_view_wg(acc_S)
                if full == 0:
                    for r in cutlass.range_constexpr(n_rows):
                        for c in cutlass.range_constexpr(n_cols):
                            j = n0 + tScS[0, c][1]
                            valid = cutlass.Boolean(False)
                            if cutlass.const_expr(self.has_func):
                                valid = j < row_f[r, 0]
                                for t in cutlass.range_constexpr((func_n - 1) // 2):
                                    valid = valid | ((j >= row_f[r, 2 * t + 1])
                                                     & (j < row_f[r, 2 * t + 2]))
                            else:
                                valid = (j >= row_lo[r]) & (j <= row_hi[r])
                            acc_S_mn[r, c] = acc_S_mn[r, c] if valid else Float32(0.0)

                for e in cutlass.range_constexpr(cute.size(acc_S)):
                    # with rab acc_S already holds h = (alpha S + rab) / 2
                    hval = acc_S[e] if cutlass.const_expr(self.has_rab) else acc_S[e] * alpha_half
                    acc_S[e] = hval + hval * hc.tanh_approx(hval)
                rP = cute.make_fragment_like(acc_S, self.dtype)
                rP.store(acc_S.load().to(self.dtype))
                tOrP = cute.make_tensor(
                    rP.iterator, acc_layout_as_a(rP.layout, mma_pv.tv_layout_A.shape[1]))
                self._turn_wait(wg)
                warpgroup.fence()
                for k in cutlass.range_constexpr(cute.size(tOrP, mode=[2])):
                    cute.gemm(mma_pv, acc_O, tOrP[None, None, k], tOrV[None, None, k, stage],
                              acc_O)
                warpgroup.commit_group()
                self._turn_pass(wg)
                warpgroup.wait_group(0)
                cute.arch.barrier()

            # ---- epilogue: registers -> gmem (rows < L_q), O / scaling_seqlen -------------
            cute.arch.cp_async_wait_group(0)
            rO = cute.make_fragment_like(acc_O, self.dtype)
            rO.store((acc_O.load() * inv_scale).to(self.dtype))
            gO = cute.local_tile(mO_b, (wgm, self.dv), (2 * m_block + wg, 0))
            tOg = thr_mma_pv.partition_C(gO)
            tOc = thr_mma_pv.partition_C(cute.make_identity_tensor((wgm, self.dv)))
            lim = seqlen_q - mw0
            for e in cutlass.range_constexpr(cute.size(rO)):
                if tOc[e][0] < lim:
                    tOg[e] = rO[e]
