"""Block-sparse attention backward (dK, dV, dQ), warp-level ``mma.sync`` (SM80+) CuTe DSL.

One CTA (8 warps) per (64-key tile t, KV head g, batch b); a sparse KV block of blk keys is
``blk // 64`` tiles. The CTA keeps its tile's K and V in shared memory and dK, dV in fp32
registers, and walks the K->Q transposed list (CSR, built on the device by the adapter)
of the KV block that holds the tile: entry ``e = h_in_group * N_q + m`` means query head
``g * G + h_in_group`` listed this KV block for query block m. For every 64-query sub-tile
of that query block (``blk // 64`` of them, those past ``S_q`` skipped):

    S  = Q K^T,   P  = exp2(S * scale * log2 e - lse * log2 e)   (0 on masked keys/rows)
    dP = dO V^T,  dS = P * (dP - delta)
    dV += P^T dO, dK += dS^T Q,  dQ_accum[rows] += scale * dS K   (fp32 atomicAdd)

(dQ pairs of neighbouring columns: one 8-byte vector atomic on sm_90+, ``vec_red``; two
scalar ``red.global.add.f32`` on sm_8x, which has no vector float atomics.)

Keys of the tile at or past ``min(block_sizes[b, h, n], S_kv - n*blk)`` (per query head, so
GQA heads with different partial sizes are exact) and query rows past ``S_q`` give P = 0
(rows past S_q read lse = +inf). The epilogue writes ``dK * scale`` and ``dV`` (zero for
tiles nobody listed) in the input dtype; dK/dV are deterministic, dQ is accumulated with
atomics (order-dependent fp32 rounding).

Logical modes: q/do/dq_accum ``(B, S_q, H_q, D)``, k/v/dk/dv ``(B, S_kv, H_kv, D)``,
lse/delta ``(B, H_q, S_q)`` fp32, offsets ``(B*H_kv*N_kv + 1,)``, entries ``(E,)`` int32,
sizes ``(B, H_q, N_kv)`` int32 or None, scale ``(1,)`` fp32.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass.cute.nvgpu import warp

from .bsa_common import (LOG2_E, bwd_entry_rows, bwd_load_kv_tile, bwd_tile_coords,
                         issue_q_do_rows)
from .common import (acc_mn_view, cvt_frag, elem_ptr, gemm_ss, gmem_load_copy, gmem_store_copy,
                     launch, ldmatrix_atoms, ldmatrix_slices, mma_frags, r2s_copy, red_add_2xf32,
                     smem_layout_16b, smem_parts, smem_storage, smem_struct, store_p_ds,
                     transpose_view, transpose_view_staged)

TILE = 64  # keys per CTA tile and queries per inner step


class BsaBwdSm80:
    """Compile-time settings: element type, head dim (D = D_v), sparse block size, whether
    per-block valid sizes are given and the minimum-CTAs-per-SM launch hint."""

    def __init__(self, dtype, head_dim: int, block_size: int, has_block_sizes: bool,
                 min_blocks: int = 1, vec_red: bool = True, q_stages: int = 2):
        self.dtype = dtype
        self.hd = head_dim
        self.blk = block_size
        self.sub = block_size // TILE
        self.num_threads = 256  # 8 warps
        self.has_sizes = has_block_sizes
        self.min_blocks = min_blocks
        # dQ pairs: one 8-byte vector atomic (sm_90+) or two scalar red.global.add.f32 (sm_8x)
        self.vec_red = vec_red
        # Q/dO smem stages: 2 (the next step's rows load while this step computes) or 1 (the
        # rows load at the start of their step: 32 KiB less at D = 128, for 99 KiB GPUs)
        self.q_stages = q_stages

    def _mma(self):
        return cute.make_tiled_mma(
            warp.MmaF16BF16Op(self.dtype, cutlass.Float32, (16, 8, 16)),
            (4, 2, 1),
            permutation_mnk=(64, 32, 16),
        )

    @cute.jit
    def __call__(self, mQ, mK, mV, mdO, mLSE, mDelta, mOffsets, mEntries, mSizes, mScale,
                 mdQacc, mdK, mdV, stream):
        hd = self.hd
        s_qd = smem_layout_16b(TILE, hd)
        s_qd_st = smem_layout_16b(TILE, hd, self.q_stages)
        s_pp = smem_layout_16b(TILE, TILE)

        SharedStorage = smem_struct(self.dtype, sQ=s_qd_st, sdO=s_qd_st, sK=s_qd,
                                                sV=s_qd, sP=s_pp, sdS=s_pp)

        gmem_copy_in = gmem_load_copy(self.dtype, self.num_threads, hd)
        gmem_copy_out = gmem_store_copy(self.dtype, self.num_threads, hd)
        n_tiles = cute.ceil_div(mK.shape[1], TILE)
        grid = (n_tiles, cute.size(mK.shape[2]), cute.size(mK.shape[0]))
        launch(self.kernel(
            mQ, mK, mV, mdO, mLSE, mDelta, mOffsets, mEntries, mSizes, mScale, mdQacc, mdK, mdV,
            s_qd, s_qd_st, s_pp, gmem_copy_in, gmem_copy_out, SharedStorage,
        ), grid, self.num_threads, SharedStorage, stream,
               min_blocks_per_mp=self.min_blocks, preferred_smem_carveout=100)

    @cute.jit
    def _issue_q_do(self, mQ, mdO, mEntries, e_begin, t, n_q_blocks, head_kv, group, batch,
                    seqlen_q, gmem_copy_in, thr_copy, tCc, tQsQ, tdOsdO, stage):
        """cp.async the Q and dO rows of step t into smem stage ``stage`` (zero past S_q)."""
        ent = mEntries[e_begin + t // self.sub]
        issue_q_do_rows(mQ, mdO, ent, t, n_q_blocks, head_kv, group, batch, seqlen_q,
                        gmem_copy_in, thr_copy, tCc, tQsQ, tdOsdO, stage,
                        self.blk, self.sub, self.hd, TILE)

    @cute.kernel
    def kernel(
        self,
        mQ: cute.Tensor,
        mK: cute.Tensor,
        mV: cute.Tensor,
        mdO: cute.Tensor,
        mLSE: cute.Tensor,
        mDelta: cute.Tensor,
        mOffsets: cute.Tensor,
        mEntries: cute.Tensor,
        mSizes,
        mScale: cute.Tensor,
        mdQacc: cute.Tensor,
        mdK: cute.Tensor,
        mdV: cute.Tensor,
        s_qd: cute.ComposedLayout,
        s_qd_st: cute.ComposedLayout,
        s_pp: cute.ComposedLayout,
        gmem_copy_in: cute.TiledCopy,
        gmem_copy_out: cute.TiledCopy,
        SharedStorage: cutlass.Constexpr,
    ):
        hd, blk = self.hd, self.blk
        tidx, _, _ = cute.arch.thread_idx()
        (n_tile, head_kv, batch, seqlen_q, seqlen_k, num_heads_kv, group, n_q_blocks,
         n_kv_blocks, n_block, tile_off, softmax_scale, scale_log2) = bwd_tile_coords(
            mQ, mK, mScale, blk, self.sub, TILE)

        storage = smem_storage(SharedStorage)
        sQ = storage.sQ.get_tensor(s_qd_st)  # (TILE, hd, 2): double-buffered
        sdO = storage.sdO.get_tensor(s_qd_st)
        sK = storage.sK.get_tensor(s_qd)
        sV = storage.sV.get_tensor(s_qd)
        sP = storage.sP.get_tensor(s_pp)
        sdS = storage.sdS.get_tensor(s_pp)
        sQt = transpose_view_staged(sQ)
        sdOt = transpose_view_staged(sdO)
        sKt = transpose_view(sK)
        sPt = transpose_view(sP)
        sdSt = transpose_view(sdS)

        # tQsQ, tdOsdO: (CPY, M, K, stage)
        thr_copy, tCc, kv_left, tQsQ, tdOsdO = bwd_load_kv_tile(
            gmem_copy_in, tidx, mK, mV, sK, sV, sQ, sdO, mSizes, batch, head_kv, group, n_tile,
            n_block, tile_off, seqlen_k, TILE, hd, self.has_sizes)

        mma_sdp = self._mma()
        mma_dkv = self._mma()
        mma_dq = self._mma()
        thr_sdp = mma_sdp.get_slice(tidx)
        thr_dkv = mma_dkv.get_slice(tidx)
        thr_dq = mma_dq.get_slice(tidx)

        acc_dK = cute.make_rmem_tensor(thr_dkv.partition_shape_C((TILE, hd)), cutlass.Float32)
        acc_dV = cute.make_rmem_tensor(thr_dkv.partition_shape_C((TILE, hd)), cutlass.Float32)
        acc_dK.fill(0.0)
        acc_dV.fill(0.0)

        # MMA operand fragments (register homes; the smem partitions carry the stage mode)
        tSrQ, tSrK = mma_frags(thr_sdp, sQ[None, None, 0], sK)
        tdPrdO, tdPrV = mma_frags(thr_sdp, sdO[None, None, 0], sV)
        tdVrPt, tdVrdOt = mma_frags(thr_dkv, sPt, sdOt[None, None, 0])
        tdKrdSt, tdKrQt = mma_frags(thr_dkv, sdSt, sQt[None, None, 0])
        tdQrdS, tdQrKt = mma_frags(thr_dq, sdS, sKt)

        ldm, ldm_t = ldmatrix_atoms(self.dtype)
        s2r_sdp_A, s2r_sdp_B = ldmatrix_slices(mma_sdp, tidx, ldm, ldm)
        s2r_dkv_A, s2r_dkv_B = ldmatrix_slices(mma_dkv, tidx, ldm_t, ldm_t)
        s2r_dq_A, s2r_dq_B = ldmatrix_slices(mma_dq, tidx, ldm, ldm_t)
        tSsQ, tSsK = smem_parts(s2r_sdp_A, s2r_sdp_B, sQ, sK)
        tdPsdO, tdPsV = smem_parts(s2r_sdp_A, s2r_sdp_B, sdO, sV)
        tdVsPt, tdVsdOt = smem_parts(s2r_dkv_A, s2r_dkv_B, sPt, sdOt)
        tdKsdSt, tdKsQt = smem_parts(s2r_dkv_A, s2r_dkv_B, sdSt, sQt)
        tdQsdS, tdQsKt = smem_parts(s2r_dq_A, s2r_dq_B, sdS, sKt)

        r2s = r2s_copy(self.dtype, mma_sdp)
        r2s_thr = r2s.get_slice(tidx)
        tPsP = r2s_thr.partition_D(sP)
        tdSsdS = r2s_thr.partition_D(sdS)

        tScS_mn = acc_mn_view(thr_sdp.partition_C(cute.make_identity_tensor((TILE, TILE))))
        n_rows = cute.size(tScS_mn, mode=[0])
        n_cols = cute.size(tScS_mn, mode=[1])
        tdQcdQ = thr_dq.partition_C(cute.make_identity_tensor((TILE, hd)))

        row_id = (batch * num_heads_kv + head_kv) * n_kv_blocks + n_block
        e_begin = mOffsets[row_id]
        n_steps = (mOffsets[row_id + 1] - e_begin) * self.sub

        # Step t handles entry e_begin + t // sub, query sub-tile t % sub, smem stage t % 2
        # (q_stages = 1: stage 0, loaded at the start of the step when the step computes).
        # Q/dO of step t+1 are fetched (cp.async) while step t computes.
        if cutlass.const_expr(self.q_stages == 2):
            if n_steps > 0:
                self._issue_q_do(mQ, mdO, mEntries, e_begin, 0, n_q_blocks, head_kv, group,
                                 batch, seqlen_q, gmem_copy_in, thr_copy, tCc, tQsQ, tdOsdO, 0)
        cute.arch.cp_async_commit_group()
        for t in cutlass.range(n_steps, unroll=1):
            if cutlass.const_expr(self.q_stages == 2):
                stage = t % 2
            else:
                stage = 0
            ent = mEntries[e_begin + t // self.sub]
            head, q0 = bwd_entry_rows(ent, t, n_q_blocks, head_kv, group, blk, self.sub, TILE)
            q_tile = q0 // TILE
            limit = cutlass.min(kv_left, TILE)
            if cutlass.const_expr(self.has_sizes):
                limit = cutlass.min(limit, mSizes[batch, head, n_block] - tile_off)

            cute.arch.barrier()  # step t-1 is done with stage (t+1)%2, sP and sdS
            if cutlass.const_expr(self.q_stages == 2):
                if t + 1 < n_steps:
                    self._issue_q_do(mQ, mdO, mEntries, e_begin, t + 1, n_q_blocks, head_kv,
                                     group, batch, seqlen_q, gmem_copy_in, thr_copy, tCc, tQsQ,
                                     tdOsdO, 1 - stage)
                cute.arch.cp_async_commit_group()

            if limit > 0 and q0 < seqlen_q:
                # per-row lse (log2 domain) and delta of this thread's rows
                lse2 = cute.make_rmem_tensor(n_rows, cutlass.Float32)
                dlt = cute.make_rmem_tensor(n_rows, cutlass.Float32)
                for r in cutlass.range_constexpr(n_rows):
                    row = q0 + tScS_mn[r, 0][0]
                    lse2[r] = cutlass.Float32.inf
                    dlt[r] = 0.0
                    if row < seqlen_q:
                        lse2[r] = mLSE[batch, head, row] * LOG2_E
                        dlt[r] = mDelta[batch, head, row]

                if cutlass.const_expr(self.q_stages == 1):
                    # this step's rows into the one stage (step t-1 is done reading it)
                    self._issue_q_do(mQ, mdO, mEntries, e_begin, t, n_q_blocks, head_kv, group,
                                     batch, seqlen_q, gmem_copy_in, thr_copy, tCc, tQsQ,
                                     tdOsdO, 0)
                    cute.arch.cp_async_commit_group()
                cute.arch.cp_async_wait_group(self.q_stages - 1)
                cute.arch.barrier()

                acc_S = cute.make_rmem_tensor(thr_sdp.partition_shape_C((TILE, TILE)), cutlass.Float32)
                acc_S.fill(0.0)
                gemm_ss(mma_sdp, acc_S, tSrQ, tSrK, tSsQ[None, None, None, stage], tSsK,
                        s2r_sdp_A, s2r_sdp_B)
                acc_dP = cute.make_rmem_tensor(thr_sdp.partition_shape_C((TILE, TILE)), cutlass.Float32)
                acc_dP.fill(0.0)
                gemm_ss(mma_sdp, acc_dP, tdPrdO, tdPrV, tdPsdO[None, None, None, stage], tdPsV,
                        s2r_sdp_A, s2r_sdp_B)

                S_mn = acc_mn_view(acc_S)
                dP_mn = acc_mn_view(acc_dP)
                for r in cutlass.range_constexpr(n_rows):
                    p_row = cute.math.exp2(S_mn[r, None].load() * scale_log2 - lse2[r], fastmath=True)
                    S_mn[r, None] = p_row
                    dP_mn[r, None] = p_row * (dP_mn[r, None].load() - dlt[r])
                if limit < TILE:
                    for r in cutlass.range_constexpr(n_rows):
                        for c in cutlass.range_constexpr(n_cols):
                            if tScS_mn[0, c][1] >= limit:
                                S_mn[r, c] = 0.0
                                dP_mn[r, c] = 0.0

                store_p_ds(r2s, r2s_thr, acc_S, acc_dP, tPsP, tdSsdS, self.dtype)

                gemm_ss(mma_dkv, acc_dV, tdVrPt, tdVrdOt, tdVsPt, tdVsdOt[None, None, None, stage],
                        s2r_dkv_A, s2r_dkv_B)
                gemm_ss(mma_dkv, acc_dK, tdKrdSt, tdKrQt, tdKsdSt, tdKsQt[None, None, None, stage],
                        s2r_dkv_A, s2r_dkv_B)

                acc_dQ = cute.make_rmem_tensor(thr_dq.partition_shape_C((TILE, hd)), cutlass.Float32)
                acc_dQ.fill(0.0)
                gemm_ss(mma_dq, acc_dQ, tdQrdS, tdQrKt, tdQsdS, tdQsKt, s2r_dq_A, s2r_dq_B)
                gdQ = cute.local_tile(mdQacc[batch, None, head, None], (TILE, hd), (q_tile, 0))
                tdQgdQ = thr_dq.partition_C(gdQ)
                # consecutive fragment values (2i, 2i+1) are neighbouring columns: one
                # 8-byte vector atomic (red.global.add.v2.f32) per pair
                pair = cute.make_rmem_tensor(2, cutlass.Float32)
                for i in cutlass.range_constexpr(cute.size(acc_dQ) // 2):
                    if q0 + tdQcdQ[2 * i][0] < seqlen_q:
                        pair[0] = acc_dQ[2 * i] * softmax_scale
                        pair[1] = acc_dQ[2 * i + 1] * softmax_scale
                        ptr = elem_ptr(tdQgdQ, 2 * i)
                        if cutlass.const_expr(self.vec_red):
                            cute.arch.atomic_add(ptr, pair.load().ir_value())
                        else:
                            red_add_2xf32(ptr, pair[0], pair[1])
            else:
                cute.arch.cp_async_wait_group(self.q_stages - 1)

        # Epilogue: dK * scale and dV, through smem (sK / sV reused), row-predicated.
        cute.arch.cp_async_wait_group(0)
        cute.arch.barrier()
        acc_dK.store(acc_dK.load() * softmax_scale)
        r2s_kv = r2s_copy(self.dtype, mma_dkv)
        r2s_kv_thr = r2s_kv.get_slice(tidx)
        rdK = cvt_frag(acc_dK, self.dtype)
        rdV = cvt_frag(acc_dV, self.dtype)
        cute.copy(r2s_kv, r2s_kv_thr.retile(rdK), r2s_kv_thr.partition_D(sK))
        cute.copy(r2s_kv, r2s_kv_thr.retile(rdV), r2s_kv_thr.partition_D(sV))
        cute.arch.barrier()
        out_thr = gmem_copy_out.get_slice(tidx)
        gdK = cute.local_tile(mdK[batch, None, head_kv, None], (TILE, hd), (n_tile, 0))
        gdV = cute.local_tile(mdV[batch, None, head_kv, None], (TILE, hd), (n_tile, 0))
        tdKgdK = out_thr.partition_D(gdK)
        tdVgdV = out_thr.partition_D(gdV)
        rK = cute.make_fragment_like(tdKgdK, self.dtype)
        rV = cute.make_fragment_like(tdVgdV, self.dtype)
        cute.copy(gmem_copy_out, out_thr.partition_S(sK), rK)
        cute.copy(gmem_copy_out, out_thr.partition_S(sV), rV)
        tOc = out_thr.partition_D(cute.make_identity_tensor((TILE, hd)))
        for r in cutlass.range_constexpr(cute.size(tdKgdK.shape[1])):
            if tOc[0, r, 0][0] < kv_left:
                cute.copy(gmem_copy_out, rK[None, r, None], tdKgdK[None, r, None])
                cute.copy(gmem_copy_out, rV[None, r, None], tdVgdV[None, r, None])
