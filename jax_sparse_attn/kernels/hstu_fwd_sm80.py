"""HSTU attention forward, warp-level ``mma.sync`` (SM80 atoms; runs on sm_80+ incl. SM90).

Per packed sequence ``b`` and head ``h``::

    out_i = sum_j M_ij * SiLU(alpha * q_i . k_j) * v_j / scaling_seqlen

No softmax: one CTA owns a ``(block_m, D_v)`` fp32 output tile in registers and walks the
KV tiles ``[n_min, n_max)`` that intersect the mask (block-level skipping); each step does
``S = Q K^T`` (ldmatrix + mma.sync), ``P = mask * SiLU(alpha S)`` in registers
(``SiLU(2h) = h + h tanh(h)``, one MUFU op), ``O += P V`` with P reused from registers.
Only tiles that cross a mask boundary run the per-element mask; sequence tails need no
mask because out-of-range K/V/Q rows are zero-filled in smem and ``SiLU(0) = 0``.

Runtime inputs (not compile keys): cu_seqlens, the tile schedule (which (batch, m_block)
each CTA row handles, longest work first), window sizes, alpha/2 and 1/scaling_seqlen.
Compile-time: dtype, head dims, tile sizes, warps, has_func and the func endpoint count,
and the rab presence (``has_rab``, ``rab_per_head``): with a relative attention bias
``mRab (B, H_rab, N_k, N_k)`` each thread reads its elements of the bias tile from gmem
(``hc.rab_load_tile``; rows ``p = i + L_k - L_q`` or columns outside ``[0, min(L_k, N_k))``
get 0) and the score is ``h = alpha S / 2 + rab / 2`` before the mask.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32
from cutlass.cute.nvgpu import warp

from . import hstu_common as hc
from .block_info import BlockInfo


class HstuFwdSm80(hc.HstuSm80Kernel):
    """Forward kernel. ``__call__(mQ, mK, mV, mCuQ, mCuK, mTile, mFunc, mScal, mWin, mO, stream)``.

    * ``mQ (T_q, H, D)``, ``mK (T_k, H, D)``, ``mV (T_k, H, Dv)``, ``mO (T_q, H, Dv)``.
    * ``mCuQ, mCuK (B+1,) int32``.
    * ``mTile (S, 5) int32``: per CTA row ``[batch, m_block, lo, hi, f0]`` (batch < 0: idle);
      lo/hi/f0 summarize the func mask over the tile's rows (min start, max end, min F0).
    * ``mFunc (1, N, L_f) int32`` (ignored unless ``has_func``).
    * ``mScal (2,) f32 = [alpha / 2, 1 / scaling_seqlen]``; ``mWin (2,) int32 = [left, right]``.
    Grid ``(H, S)``.
    """

    @cute.jit
    def __call__(self, mQ, mK, mV, mCuQ, mCuK, mTile, mFunc, mScal, mWin, mO, stream,
                 mRab=None):
        dt = self.dtype
        sQ_layout = hc.smem_layout_16b(self.bm, max(self.d, self.dv))
        sQ_layout_d = hc.smem_layout_16b(self.bm, self.d)
        sO_layout = hc.smem_layout_16b(self.bm, self.dv)
        sK_layout = hc.smem_layout_16b(self.bn, self.d)
        sV_layout = hc.smem_layout_16b(self.bn, self.dv)

        Smem = hc.smem_struct(dt, sQ=sQ_layout, sK=sK_layout, sV=sV_layout)

        copy_qk = hc.gmem_load_copy(dt, self.num_threads, self.d)
        copy_v = hc.gmem_load_copy(dt, self.num_threads, self.dv)
        copy_o = hc.gmem_store_copy(dt, self.num_threads, self.dv)
        tiled_mma = cute.make_tiled_mma(
            warp.MmaF16BF16Op(dt, Float32, (16, 8, 16)),
            (self.num_warps, 1, 1),
            permutation_mnk=(self.num_warps * 16, 16, 16),
        )
        grid = (cute.size(mQ.shape[1]), cute.size(mTile.shape[0]), 1)
        hc.launch(self.kernel(
            mQ, mK, mV, mCuQ, mCuK, mTile, mFunc, mScal, mWin, mO, mRab,
            sQ_layout, sQ_layout_d, sO_layout, sK_layout, sV_layout,
            copy_qk, copy_v, copy_o, tiled_mma, Smem,
        ), grid, self.num_threads, Smem, stream)

    @cute.kernel
    def kernel(self, mQ, mK, mV, mCuQ, mCuK, mTile, mFunc, mScal, mWin, mO, mRab,
               sQ_layout, sQ_layout_d, sO_layout, sK_layout, sV_layout,
               copy_qk, copy_v, copy_o, tiled_mma, Smem: cutlass.Constexpr):
        tidx, _, _ = cute.arch.thread_idx()
        head, slot, _ = cute.arch.block_idx()
        bm, bn = self.bm, self.bn
        batch = mTile[slot, 0]
        if batch >= 0:
            m_block, seq, m0, m1, left, right, alpha_half, inv_scale = hc.tile_setup(
                mTile, slot, batch, mCuQ, mCuK, mWin, mScal, bm, True)
            q_start, k_start, off = seq.q_start, seq.k_start, seq.off
            seqlen_q, seqlen_k = seq.seqlen_q, seq.seqlen_k

            # ---- KV tile range and the "fully valid" test -------------------------------
            blocks = BlockInfo.create(mTile, slot, m0, m1, seqlen_k, off, left, right, bn,
                                      self.has_func)
            f0, n_max, n_count = blocks.f0, blocks.n_max, blocks.n_count

            # ---- global tiles ----------------------------------------------------------
            mQ_b, mK_b, mV_b, mO_b = hc.head_rows(
                head, (mQ, q_start), (mK, k_start), (mV, k_start), (mO, q_start))
            gQ = cute.local_tile(mQ_b, (bm, self.d), (m_block, 0))
            gK = cute.local_tile(mK_b, (bn, self.d), (None, 0))
            gV = cute.local_tile(mV_b, (bn, self.dv), (None, 0))
            gO = cute.local_tile(mO_b, (bm, self.dv), (m_block, 0))

            st = hc.smem_storage(Smem)
            sQ = st.sQ.get_tensor(sQ_layout_d)
            sK = st.sK.get_tensor(sK_layout)
            sV = st.sV.get_tensor(sV_layout)
            sVt = hc.transpose_view(sV)

            thr_qk = copy_qk.get_slice(tidx)
            thr_v = copy_v.get_slice(tidx)
            tQgQ = thr_qk.partition_S(gQ)
            tQsQ = thr_qk.partition_D(sQ)
            tKgK = thr_qk.partition_S(gK)
            tKsK = thr_qk.partition_D(sK)
            tVgV = thr_v.partition_S(gV)
            tVsV = thr_v.partition_D(sV)
            tQc = thr_qk.partition_S(cute.make_identity_tensor((bm, self.d)))
            tKc = thr_qk.partition_S(cute.make_identity_tensor((bn, self.d)))
            tVc = thr_v.partition_S(cute.make_identity_tensor((bn, self.dv)))

            thr_mma = tiled_mma.get_slice(tidx)
            tSrQ, tSrK = hc.mma_frags(thr_mma, sQ, sK)
            tOrVt = thr_mma.make_fragment_B(thr_mma.partition_B(sVt))
            acc_O = cute.make_rmem_tensor(thr_mma.partition_shape_C((bm, self.dv)), Float32)
            acc_O.fill(0.0)

            ldsm, ldsm_t = hc.ldmatrix_atoms(self.dtype)
            s2r_Q, s2r_K = hc.ldmatrix_slices(tiled_mma, tidx, ldsm, ldsm)
            s2r_V = cute.make_tiled_copy_B(ldsm_t, tiled_mma).get_slice(tidx)
            tSsQ, tSsK = hc.smem_parts(s2r_Q, s2r_K, sQ, sK)
            tOsVt = s2r_V.partition_S(sVt)
            tSrQ_v, tSrK_v, tOrVt_v = s2r_Q.retile(tSrQ), s2r_K.retile(tSrK), s2r_V.retile(tOrVt)

            # per-thread coordinates of the S accumulator
            tScS = hc.acc_mn_view(thr_mma.partition_C(cute.make_identity_tensor((bm, bn))))
            n_rows = cute.size(tScS, mode=[0])

            # per-row mask bounds (window) or func endpoints, held in registers
            row_lo = cute.make_rmem_tensor((n_rows,), Int32)
            row_hi = cute.make_rmem_tensor((n_rows,), Int32)
            func_n = self.func_n if cutlass.const_expr(self.has_func) else 1
            row_f = cute.make_rmem_tensor((n_rows, func_n), Int32)
            for r in cutlass.range_constexpr(n_rows):
                row_lo[r], row_hi[r] = hc.mask_row_bounds(
                    row_f, r, m0 + tScS[r, 0][0], mFunc, q_start, off, left, right,
                    self.has_func, func_n)

            if cutlass.const_expr(self.has_rab):
                rab_nk = mRab.shape[3]
                rab_lim = cutlass.min(seqlen_k, rab_nk)
                rab_h = head if cutlass.const_expr(self.rab_per_head) else 0
                mRab_bh = mRab[cutlass.min(batch, mRab.shape[0] - 1), rab_h, None, None]
                rab_p = cute.make_rmem_tensor((n_rows,), Int32)
                rab_ok = cute.make_rmem_tensor((n_rows,), Int32)
                hc.rab_row_setup(rab_p, rab_ok, tScS, m0, off, rab_lim, rab_nk)

            if n_count > 0:
                hc.load_rows(copy_qk, tQgQ, tQsQ, tQc, seqlen_q - m0)
                n_first = n_max - 1
                hc.load_rows(copy_qk, tKgK[None, None, None, n_first], tKsK, tKc,
                             seqlen_k - n_first * bn)
                cute.arch.cp_async_commit_group()

            for it in cutlass.range(n_count, unroll=1):
                n = n_max - 1 - it
                acc_S = cute.make_rmem_tensor(thr_mma.partition_shape_C((bm, bn)), Float32)
                acc_S.fill(0.0)
                cute.arch.cp_async_wait_group(0)
                cute.arch.barrier()
                hc.load_rows(copy_v, tVgV[None, None, None, n], tVsV, tVc,
                             seqlen_k - n * bn)
                cute.arch.cp_async_commit_group()
                if cutlass.const_expr(self.has_rab):
                    rBias = cute.make_fragment_like(acc_S)
                    hc.rab_load_tile(hc.acc_mn_view(rBias), mRab_bh, rab_p, rab_ok, tScS,
                                     n * bn, rab_lim, rab_nk, 0.5)
                hc.gemm_ss(tiled_mma, acc_S, tSrQ, tSrK, tSsQ, tSsK, s2r_Q, s2r_K,
                           tSrQ_v, tSrK_v)
                if cutlass.const_expr(self.has_rab):
                    for e in cutlass.range_constexpr(cute.size(acc_S)):
                        acc_S[e] = acc_S[e] * alpha_half + rBias[e]
                cute.arch.cp_async_wait_group(0)
                cute.arch.barrier()
                if it + 1 < n_count:
                    hc.load_rows(copy_qk, tKgK[None, None, None, n - 1], tKsK, tKc,
                                 seqlen_k - (n - 1) * bn)
                    cute.arch.cp_async_commit_group()

                # ---- mask (boundary tiles only) -----------------------------------------
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
                acc_S_mn = hc.acc_mn_view(acc_S)
                if full == 0:
                    for r in cutlass.range_constexpr(n_rows):
                        hc.mask_row(acc_S_mn, None, r, tScS, n0, row_f, row_lo[r], row_hi[r],
                                    self.has_func, func_n)

                # ---- P = SiLU(alpha S) = h + h tanh(h), h = alpha S / 2 ------------------
                for e in cutlass.range_constexpr(cute.size(acc_S)):
                    # with rab acc_S already holds h = (alpha S + rab) / 2
                    hval = acc_S[e] if cutlass.const_expr(self.has_rab) else acc_S[e] * alpha_half
                    hval = hc.finite_below(hval)  # SiLU(-inf) -> 0, not NaN
                    acc_S[e] = hval + hval * hc.tanh_approx(hval)
                tOrP = hc.acc_to_a_frag(hc.cvt_frag(acc_S, self.dtype))
                hc.gemm_rs(tiled_mma, acc_O, tOrP, tOrVt, tOsVt, s2r_V, tOrVt_v)

            # ---- epilogue: O / scaling_seqlen -> smem -> gmem ------------------------------
            cute.arch.cp_async_wait_group(0)
            cute.arch.barrier()
            sO = cute.make_tensor(st.sQ.get_tensor(sQ_layout).iterator, sO_layout)
            rO = hc.cvt_frag(acc_O, self.dtype, inv_scale)
            r2s = hc.r2s_copy(self.dtype, tiled_mma).get_slice(tidx)
            cute.copy(r2s, r2s.retile(rO), r2s.partition_D(sO))
            cute.arch.barrier()
            thr_o = copy_o.get_slice(tidx)
            tOsO = thr_o.partition_S(sO)
            tOgO = thr_o.partition_D(gO)
            tOc = thr_o.partition_D(cute.make_identity_tensor((bm, self.dv)))
            tOrO = cute.make_fragment_like(tOsO, self.dtype)
            cute.autovec_copy(tOsO, tOrO)
            hc.store_rows(copy_o, tOrO, tOgO, tOc, seqlen_q - m0)
