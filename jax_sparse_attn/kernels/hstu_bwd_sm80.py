"""HSTU attention backward, warp-level ``mma.sync`` (SM80 atoms; runs on sm_80+ incl. SM90).

One CTA per (KV tile, head): dK and dV stay in fp32 registers while the CTA walks the
query tiles that can see its keys (``block_info.QTileRange``: block-level skipping from the
window or the func summary). Per query tile (Q and dO double-buffered in smem with cp.async)::

    S  = Q K^T            dP = dO V^T                      (mma.sync, ldmatrix)
    P  = M * SiLU(alpha S)        with h = alpha S / 2, t = tanh(h): P = h + h t
    dS = M * dP * alpha/scaling * SiLU'(alpha S),  SiLU' = sig + P (1 - sig), sig = (1+t)/2
    dV += P^T dO    dK += dS^T Q    (P, dS through smem, read transposed by ldmatrix.trans)
    dQ += dS K      (fp32 ``red.global.add`` into an XLA-owned workspace, rows < L_q)

Tiles: ``block_m`` query rows x ``block_n`` keys, ``num_warps`` warps in a (wm, wn) grid
with wm = min(4, block_m / 16) warps along the rows; the adapter picks the tiles that fit
the target's shared memory per block (docs/support.md).

dV gets the 1/scaling_seqlen factor once in the epilogue. Out-of-range rows of Q, dO, K
and V are zero-filled in smem, which makes P and dS vanish there without masks; only
tiles crossing a window/func boundary run the per-element mask.
dK, dV are deterministic; dQ (atomics) is not bitwise deterministic.

dQ uses per-thread ``red.global.add.v2.f32`` (``vec_red``, sm_90+; on sm_8x two scalar
``red.global.add.f32``) rather than the staged bulk reductions of
``bsa_bwd_sm90``: with 64 x 128 tiles the dQ traffic per FLOP is half the block-sparse
kernel's and the 8 warps hide the reductions (docs/performance.md compares the two).

Relative attention bias (``has_rab``; ``mRab (B, H_rab, N_k, N_k)``): the bias tile is read
per thread from gmem (``hc.rab_load_tile``, 0 outside ``p, j in [0, min(L_k, N_k))``) and
``h = (alpha S + rab) / 2``. Its gradient uses the dS tile before the alpha factor:
``g = M * dP * SiLU'(h) / scaling``, ``d rab[p, j] = g`` and ``dS = alpha g``. Each
``(b, h, p, j)`` comes from exactly one (KV tile, head) CTA, so with ``H_rab = H``
(``rab_per_head``) ``mdRab`` (rab's dtype, zero-initialised by XLA) gets direct stores
(deterministic); with ``H_rab = 1`` the heads' CTAs add into an fp32 workspace
``(B, 1, N_k, N_k_pad)`` (``N_k_pad`` a multiple of 4) with ``red.global.add.v2.f32`` (column pairs
2t, 2t+1 of the accumulator; not bitwise deterministic), cast by XLA afterwards.

Deterministic mode (``deterministic``, with ``mdQSem``: int32 ``(query tile slots, H)``
zero-initialised by XLA; the ordered additions of ``hstu_common``): before its first dQ
reduction into query tile ``m`` the CTA of KV tile ``n`` waits (thread 0, acquire loads,
then a CTA barrier) until the semaphore of (``m``, head) reaches ``n`` when KV tile
``n - 1`` covers ``m`` too (``QTileRange.covers``: the same query-tile range and func test
as this kernel's walk); after the tile's closing barrier thread 0 publishes ``n + 1``. The
canonical launch order puts KV tile ``n - 1`` of a sequence at a lower linear block index,
so with in-order block dispatch the lowest unfinished block never waits (no deadlock). The
CTA walks its query tiles from the last one down in this mode, so KV tile ``n - 1`` reaches
a shared query tile no later than tile ``n`` (see ``hstu_bwd_sm90``).
``drab`` with ``H_rab = 1`` then goes per head into ``mdRab (B, H, N_k, N_k)`` fp32 by direct
stores (XLA sums the heads), so every backward output is bitwise reproducible.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32
from cutlass.cute.nvgpu import warp

from . import hstu_common as hc
from .block_info import QTileRange


class HstuBwdSm80(hc.HstuSm80Kernel):
    """Backward kernel.

    ``__call__(mdO, mQ, mK, mV, mCuQ, mCuK, mKVTile, mQStart, mQTiles, mFunc, mScal, mWin,
    mdQacc, mdK, mdV, stream)``; ``mKVTile (S, 2) = [batch, n_block]`` (batch < 0: idle),
    ``mQStart (B+1,)`` first canonical q-tile index per batch, ``mQTiles (NQ, 3)`` func
    summary per canonical q tile. Grid ``(H, S)``.
    """

    def __init__(self, dtype, head_dim, head_dim_v, block_m, block_n, num_warps, has_func,
                 func_n, has_rab=False, rab_per_head=False, deterministic=False, vec_red=True):
        super().__init__(dtype, head_dim, head_dim_v, block_m, block_n, num_warps, has_func,
                         func_n, has_rab, rab_per_head)
        self.dq_chunk = min(head_dim, 128)
        self.deterministic = deterministic
        # drab with one writer per element: per-head rab, or per-head workspace (deterministic)
        self.drab_per_head = rab_per_head or deterministic
        # fp32 pair reductions (dQ, shared d rab): red.global.add.v2.f32 (sm_90+) or two
        # scalar red.global.add.f32 (sm_8x)
        self.vec_red = vec_red

    @cute.jit
    def __call__(self, mdO, mQ, mK, mV, mCuQ, mCuK, mKVTile, mQStart, mQTiles, mFunc, mScal,
                 mWin, mdQacc, mdK, mdV, stream, mRab=None, mdRab=None, mdQSem=None):
        dt = self.dtype
        bm, bn = self.bm, self.bn
        sQ_layout = hc.smem_layout_16b(bm, self.d, 2)
        sdO_layout = hc.smem_layout_16b(bm, self.dv, 2)
        sK_layout = hc.smem_layout_16b(bn, self.d)
        sV_layout = hc.smem_layout_16b(bn, self.dv)
        sPdS_layout = hc.smem_layout_16b(bm, bn)

        Smem = hc.smem_struct(dt, sK=sK_layout, sV=sV_layout, sQ=sQ_layout,
                                  sdO=sdO_layout, sP=sPdS_layout, sdS=sPdS_layout)

        copy_d = hc.gmem_load_copy(dt, self.num_threads, self.d)
        copy_dv = hc.gmem_load_copy(dt, self.num_threads, self.dv)
        store_d = hc.gmem_store_copy(dt, self.num_threads, self.d)
        store_dv = hc.gmem_store_copy(dt, self.num_threads, self.dv)
        # warps along the query rows: 4 (64-row tiles), 2 for 32-row tiles (small smem)
        wm = min(4, bm // 16)
        wn = self.num_warps // wm
        atom = warp.MmaF16BF16Op(dt, Float32, (16, 8, 16))
        mma_sdp = cute.make_tiled_mma(atom, (wm, wn, 1), permutation_mnk=(wm * 16, wn * 16, 16))
        mma_dkv = cute.make_tiled_mma(atom, (wm, wn, 1), permutation_mnk=(wm * 16, wn * 16, 16))
        mma_dq = cute.make_tiled_mma(atom, (wm, wn, 1), permutation_mnk=(wm * 16, wn * 16, 16))
        grid = (cute.size(mQ.shape[1]), cute.size(mKVTile.shape[0]), 1)
        hc.launch(self.kernel(
            mdO, mQ, mK, mV, mCuQ, mCuK, mKVTile, mQStart, mQTiles, mFunc, mScal, mWin,
            mdQacc, mdK, mdV, mRab, mdRab, mdQSem,
            sQ_layout, sdO_layout, sK_layout, sV_layout, sPdS_layout,
            copy_d, copy_dv, store_d, store_dv, mma_sdp, mma_dkv, mma_dq, Smem,
        ), grid, self.num_threads, Smem, stream)

    @cute.jit
    def _store_drab(self, g_mn, mdRab_bh, row_p, row_ok, tScS, col0, lim):
        """d rab of this thread's tile elements: direct stores (one writer per element,
        ``rab_per_head``) or fp32 ``red.add.v2`` of adjacent column pairs (H_rab = 1)."""
        for r in cutlass.range_constexpr(cute.size(g_mn, mode=[0])):
            for c in cutlass.range_constexpr(cute.size(g_mn, mode=[1])):
                j = col0 + tScS[0, c][1]
                if cutlass.const_expr(self.drab_per_head):
                    if (row_ok[r] != 0) & (j < lim):
                        mdRab_bh[row_p[r], j] = g_mn[r, c].to(mdRab_bh.element_type)
                elif cutlass.const_expr(c % 2 == 0):
                    # columns j, j + 1 (j even; the workspace rows are padded to even length)
                    if (row_ok[r] != 0) & (j < lim):
                        hc.red_add_pair(hc.elem_ptr(mdRab_bh, (row_p[r], j)), g_mn[r, c],
                                        g_mn[r, c + 1], self.vec_red)

    @cute.kernel
    def kernel(self, mdO, mQ, mK, mV, mCuQ, mCuK, mKVTile, mQStart, mQTiles, mFunc, mScal,
               mWin, mdQacc, mdK, mdV, mRab, mdRab, mdQSem,
               sQ_layout, sdO_layout, sK_layout, sV_layout, sPdS_layout,
               copy_d, copy_dv, store_d, store_dv, mma_sdp, mma_dkv, mma_dq,
               Smem: cutlass.Constexpr):
        tidx, _, _ = cute.arch.thread_idx()
        head, slot, _ = cute.arch.block_idx()
        bm, bn = self.bm, self.bn
        batch = mKVTile[slot, 0]
        if batch >= 0:
            n_block, seq, n0, _, left, right, alpha_half, inv_scale = hc.tile_setup(
                mKVTile, slot, batch, mCuQ, mCuK, mWin, mScal, bn, False)
            q_start, k_start, off = seq.q_start, seq.k_start, seq.off
            seqlen_q, seqlen_k = seq.seqlen_q, seq.seqlen_k
            ds_scale = alpha_half * 2.0 * inv_scale

            qr = QTileRange.create(mQStart, batch, n0, seqlen_q, seqlen_k, off, left, right,
                                   bm, bn, self.has_func)
            m_min, m_count = qr.m_min, qr.m_count

            mQ_b, mdO_b, mdQ_b, mK_b, mV_b, mdK_b, mdV_b = hc.head_rows(
                head, (mQ, q_start), (mdO, q_start), (mdQacc, q_start), (mK, k_start),
                (mV, k_start), (mdK, k_start), (mdV, k_start))
            gQ = cute.local_tile(mQ_b, (bm, self.d), (None, 0))
            gdO = cute.local_tile(mdO_b, (bm, self.dv), (None, 0))
            gK = cute.local_tile(mK_b, (bn, self.d), (n_block, 0))
            gV = cute.local_tile(mV_b, (bn, self.dv), (n_block, 0))
            gdK = cute.local_tile(mdK_b, (bn, self.d), (n_block, 0))
            gdV = cute.local_tile(mdV_b, (bn, self.dv), (n_block, 0))

            st = hc.smem_storage(Smem)
            sQ = st.sQ.get_tensor(sQ_layout)
            sdO = st.sdO.get_tensor(sdO_layout)
            sK = st.sK.get_tensor(sK_layout)
            sV = st.sV.get_tensor(sV_layout)
            sP = st.sP.get_tensor(sPdS_layout)
            sdS = st.sdS.get_tensor(sPdS_layout)
            sKt = hc.transpose_view(sK)
            sPt = hc.transpose_view(sP)
            sdSt = hc.transpose_view(sdS)

            thr_d = copy_d.get_slice(tidx)
            thr_dv = copy_dv.get_slice(tidx)
            tQgQ = thr_d.partition_S(gQ)
            tQsQ = thr_d.partition_D(sQ)
            tdOgdO = thr_dv.partition_S(gdO)
            tdOsdO = thr_dv.partition_D(sdO)
            tKgK = thr_d.partition_S(gK)
            tKsK = thr_d.partition_D(sK)
            tVgV = thr_dv.partition_S(gV)
            tVsV = thr_dv.partition_D(sV)
            tQc = thr_d.partition_S(cute.make_identity_tensor((bm, self.d)))
            tdOc = thr_dv.partition_S(cute.make_identity_tensor((bm, self.dv)))
            tKc = thr_d.partition_S(cute.make_identity_tensor((bn, self.d)))
            tVc = thr_dv.partition_S(cute.make_identity_tensor((bn, self.dv)))

            ldsm, ldsm_t = hc.ldmatrix_atoms(self.dtype)

            # S = Q K^T, dP = dO V^T
            thr_sdp = mma_sdp.get_slice(tidx)
            s2r_A_sdp, s2r_B_sdp = hc.ldmatrix_slices(mma_sdp, tidx, ldsm, ldsm)
            tSrQ, tSrK = hc.mma_frags(thr_sdp, sQ[None, None, 0], sK)
            tdPrdO, tdPrV = hc.mma_frags(thr_sdp, sdO[None, None, 0], sV)
            tSsQ, tSsK = hc.smem_parts(s2r_A_sdp, s2r_B_sdp, sQ, sK)
            tdPsdO, tdPsV = hc.smem_parts(s2r_A_sdp, s2r_B_sdp, sdO, sV)
            tSrQ_v, tSrK_v = s2r_A_sdp.retile(tSrQ), s2r_B_sdp.retile(tSrK)
            tdPrdO_v, tdPrV_v = s2r_A_sdp.retile(tdPrdO), s2r_B_sdp.retile(tdPrV)

            # dV += P^T dO, dK += dS^T Q
            thr_dkv = mma_dkv.get_slice(tidx)
            s2r_A_dkv, s2r_B_dkv = hc.ldmatrix_slices(mma_dkv, tidx, ldsm_t, ldsm_t)
            sQt = hc.transpose_view(sQ[None, None, 0])
            sdOt = hc.transpose_view(sdO[None, None, 0])
            tdVrPt, tdVrdOt = hc.mma_frags(thr_dkv, sPt, sdOt)
            tdKrdSt, tdKrQt = hc.mma_frags(thr_dkv, sdSt, sQt)
            tdVsPt, tdKsdSt = s2r_A_dkv.partition_S(sPt), s2r_A_dkv.partition_S(sdSt)
            tdVrPt_v, tdVrdOt_v = s2r_A_dkv.retile(tdVrPt), s2r_B_dkv.retile(tdVrdOt)
            tdKrdSt_v, tdKrQt_v = s2r_A_dkv.retile(tdKrdSt), s2r_B_dkv.retile(tdKrQt)
            acc_dK = cute.make_rmem_tensor(thr_dkv.partition_shape_C((bn, self.d)), Float32)
            acc_dV = cute.make_rmem_tensor(thr_dkv.partition_shape_C((bn, self.dv)), Float32)
            acc_dK.fill(0.0)
            acc_dV.fill(0.0)

            # dQ = dS K (in column chunks of dq_chunk)
            dqc = self.dq_chunk
            thr_dq = mma_dq.get_slice(tidx)
            s2r_A_dq, s2r_B_dq = hc.ldmatrix_slices(mma_dq, tidx, ldsm, ldsm_t)
            sKt_c0 = cute.local_tile(sKt, (dqc, bn), (0, 0))
            tdQrdS, tdQrKt = hc.mma_frags(thr_dq, sdS, sKt_c0)
            tdQsdS = s2r_A_dq.partition_S(sdS)
            tdQrdS_v, tdQrKt_v = s2r_A_dq.retile(tdQrdS), s2r_B_dq.retile(tdQrKt)
            tdQc = thr_dq.partition_C(cute.make_identity_tensor((bm, dqc)))

            # register -> smem copies of P and dS
            r2s = hc.r2s_copy(self.dtype, mma_sdp).get_slice(tidx)
            tPsP = r2s.partition_D(sP)
            tdSsdS = r2s.partition_D(sdS)

            tScS = hc.acc_mn_view(thr_sdp.partition_C(cute.make_identity_tensor((bm, bn))))
            n_rows = cute.size(tScS, mode=[0])
            func_n = self.func_n if cutlass.const_expr(self.has_func) else 1
            row_f = cute.make_rmem_tensor((n_rows, func_n), Int32)

            if cutlass.const_expr(self.has_rab):
                rab_nk = mRab.shape[3]
                rab_lim = cutlass.min(seqlen_k, rab_nk)
                rab_b = cutlass.min(batch, mRab.shape[0] - 1)
                rab_h = head if cutlass.const_expr(self.rab_per_head) else 0
                mRab_bh = mRab[rab_b, rab_h, None, None]
                mdRab_bh = mdRab[rab_b, head if cutlass.const_expr(self.drab_per_head) else 0,
                                 None, None]
                rab_p = cute.make_rmem_tensor((n_rows,), Int32)
                rab_ok = cute.make_rmem_tensor((n_rows,), Int32)
                alpha = alpha_half * 2.0

            if cutlass.const_expr(self.deterministic):
                # the previous KV tile of this sequence (read when n_block > 0)
                qp = QTileRange.create(mQStart, batch, n0 - bn, seqlen_q, seqlen_k, off, left,
                                       right, bm, bn, self.has_func)
                qt0 = Int32(mQStart[batch])  # semaphore row of query tile 0

            # query tiles ascending, or (deterministic) from the last one down (see the
            # module docstring)
            m_step = -1 if cutlass.const_expr(self.deterministic) else 1
            m_first = m_min + m_count - 1 if cutlass.const_expr(self.deterministic) else m_min
            if m_count > 0:
                hc.load_rows(copy_d, tKgK, tKsK, tKc, seqlen_k - n0)
                hc.load_rows(copy_dv, tVgV, tVsV, tVc, seqlen_k - n0)
                hc.load_rows(copy_d, tQgQ[None, None, None, m_first], tQsQ[None, None, None, 0],
                             tQc, seqlen_q - m_first * bm)
                hc.load_rows(copy_dv, tdOgdO[None, None, None, m_first],
                             tdOsdO[None, None, None, 0], tdOc, seqlen_q - m_first * bm)
                cute.arch.cp_async_commit_group()

            for it in cutlass.range(m_count, unroll=1):
                m_block = m_first + m_step * it
                stage = it % 2
                if it + 1 < m_count:
                    mn = m_block + m_step
                    hc.load_rows(copy_d, tQgQ[None, None, None, mn],
                                 tQsQ[None, None, None, 1 - stage], tQc, seqlen_q - mn * bm)
                    hc.load_rows(copy_dv, tdOgdO[None, None, None, mn],
                                 tdOsdO[None, None, None, 1 - stage], tdOc,
                                 seqlen_q - mn * bm)
                cute.arch.cp_async_commit_group()
                cute.arch.cp_async_wait_group(1)
                cute.arch.barrier()

                m0 = m_block * bm
                active, full = qr.tile_state(mQTiles, m_block, left, right)
                if active != 0:
                    acc_S = cute.make_rmem_tensor(thr_sdp.partition_shape_C((bm, bn)), Float32)
                    acc_dP = cute.make_rmem_tensor(thr_sdp.partition_shape_C((bm, bn)), Float32)
                    acc_S.fill(0.0)
                    acc_dP.fill(0.0)
                    if cutlass.const_expr(self.has_rab):
                        hc.rab_row_setup(rab_p, rab_ok, tScS, m0, off, rab_lim, rab_nk)
                        rBias = cute.make_fragment_like(acc_S)
                        hc.rab_load_tile(hc.acc_mn_view(rBias), mRab_bh, rab_p, rab_ok, tScS,
                                         n0, rab_lim, rab_nk, 0.5)
                    hc.gemm_ss(mma_sdp, acc_S, tSrQ, tSrK, tSsQ[None, None, None, stage], tSsK,
                               s2r_A_sdp, s2r_B_sdp, tSrQ_v, tSrK_v)
                    hc.gemm_ss(mma_sdp, acc_dP, tdPrdO, tdPrV, tdPsdO[None, None, None, stage],
                               tdPsV, s2r_A_sdp, s2r_B_sdp, tdPrdO_v, tdPrV_v)
                    # P and dS
                    for e in cutlass.range_constexpr(cute.size(acc_S)):
                        hval = acc_S[e] * alpha_half
                        if cutlass.const_expr(self.has_rab):
                            hval = hval + rBias[e]
                        hval = hc.finite_below(hval)  # SiLU(-inf) -> 0, not NaN
                        tv = hc.tanh_approx(hval)
                        p = hval + hval * tv
                        sig = 0.5 + 0.5 * tv
                        acc_S[e] = p
                        if cutlass.const_expr(self.has_rab):
                            # g = dP SiLU'(h) / scaling (= d rab); dS = alpha g below
                            acc_dP[e] = acc_dP[e] * inv_scale * (sig + p * (1.0 - sig))
                        else:
                            acc_dP[e] = acc_dP[e] * ds_scale * (sig + p * (1.0 - sig))
                    if full == 0:
                        acc_S_mn = hc.acc_mn_view(acc_S)
                        acc_dP_mn = hc.acc_mn_view(acc_dP)
                        for r in cutlass.range_constexpr(n_rows):
                            lo_r, hi_r = hc.mask_row_bounds(
                                row_f, r, m0 + tScS[r, 0][0], mFunc, q_start, off, left,
                                right, self.has_func, func_n)
                            hc.mask_row(acc_S_mn, acc_dP_mn, r, tScS, n0, row_f, lo_r, hi_r,
                                        self.has_func, func_n)
                    if cutlass.const_expr(self.has_rab):
                        self._store_drab(hc.acc_mn_view(acc_dP), mdRab_bh, rab_p, rab_ok, tScS,
                                         n0, rab_lim)
                        for e in cutlass.range_constexpr(cute.size(acc_dP)):
                            acc_dP[e] = acc_dP[e] * alpha
                    hc.store_p_ds(r2s, r2s, acc_S, acc_dP, tPsP, tdSsdS, self.dtype)

                    # dV += P^T dO ; dK += dS^T Q
                    sdOt_s = hc.transpose_view(sdO[None, None, stage])
                    sQt_s = hc.transpose_view(sQ[None, None, stage])
                    hc.gemm_ss(mma_dkv, acc_dV, tdVrPt, tdVrdOt, tdVsPt,
                               s2r_B_dkv.partition_S(sdOt_s), s2r_A_dkv, s2r_B_dkv,
                               tdVrPt_v, tdVrdOt_v)
                    hc.gemm_ss(mma_dkv, acc_dK, tdKrdSt, tdKrQt, tdKsdSt,
                               s2r_B_dkv.partition_S(sQt_s), s2r_A_dkv, s2r_B_dkv,
                               tdKrdSt_v, tdKrQt_v)

                    # dQ += dS K  (fp32 atomics, rows < L_q)
                    for cidx in cutlass.range_constexpr(self.d // dqc):
                        acc_dQ = cute.make_rmem_tensor(thr_dq.partition_shape_C((bm, dqc)),
                                                       Float32)
                        acc_dQ.fill(0.0)
                        sKt_c = cute.local_tile(sKt, (dqc, bn), (cidx, 0))
                        hc.gemm_ss(mma_dq, acc_dQ, tdQrdS, tdQrKt, tdQsdS,
                                   s2r_B_dq.partition_S(sKt_c), s2r_A_dq, s2r_B_dq,
                                   tdQrdS_v, tdQrKt_v)
                        if cutlass.const_expr(self.deterministic and cidx == 0):
                            # the earlier KV tiles' additions to this query tile are done
                            if tidx == 0:
                                if n_block > 0:
                                    if qp.covers(mQTiles, m_block, left, right) != 0:
                                        hc.wait_at_least(
                                            hc.elem_ptr(mdQSem, (qt0 + m_block, head)),
                                            n_block)
                            cute.arch.barrier()
                        gdQ = cute.local_tile(mdQ_b, (bm, dqc), (m_block, cidx))
                        tdQg = thr_dq.partition_C(gdQ)
                        # accumulator values (2k, 2k+1) are adjacent columns of one row
                        for e2 in cutlass.range_constexpr(cute.size(acc_dQ) // 2):
                            if tdQc[2 * e2][0] < seqlen_q - m0:
                                hc.red_add_pair(hc.elem_ptr(tdQg, 2 * e2), acc_dQ[2 * e2],
                                                acc_dQ[2 * e2 + 1], self.vec_red)
                cute.arch.barrier()
                if cutlass.const_expr(self.deterministic):
                    # every thread's additions to this tile precede the barrier above
                    if active != 0:
                        if tidx == 0:
                            hc.st_release_s32(hc.elem_ptr(mdQSem, (qt0 + m_block, head)),
                                              n_block + 1)

            # ---- epilogue: dK, dV -> smem -> gmem ----------------------------------------
            cute.arch.cp_async_wait_group(0)
            cute.arch.barrier()
            rdV = hc.cvt_frag(acc_dV, self.dtype, inv_scale)
            rdK = hc.cvt_frag(acc_dK, self.dtype)
            r2s_kv = hc.r2s_copy(self.dtype, mma_dkv).get_slice(tidx)
            cute.copy(r2s_kv, r2s_kv.retile(rdK), r2s_kv.partition_D(sK))
            cute.copy(r2s_kv, r2s_kv.retile(rdV), r2s_kv.partition_D(sV))
            cute.arch.barrier()
            thr_sd = store_d.get_slice(tidx)
            thr_sdv = store_dv.get_slice(tidx)
            tdKs = thr_sd.partition_S(sK)
            tdKr = cute.make_fragment_like(tdKs, self.dtype)
            cute.autovec_copy(tdKs, tdKr)
            tdVs = thr_sdv.partition_S(sV)
            tdVr = cute.make_fragment_like(tdVs, self.dtype)
            cute.autovec_copy(tdVs, tdVr)
            hc.store_rows(store_d, tdKr, thr_sd.partition_D(gdK),
                          thr_sd.partition_D(cute.make_identity_tensor((bn, self.d))),
                          seqlen_k - n0)
            hc.store_rows(store_dv, tdVr, thr_sdv.partition_D(gdV),
                          thr_sdv.partition_D(cute.make_identity_tensor((bn, self.dv))),
                          seqlen_k - n0)
