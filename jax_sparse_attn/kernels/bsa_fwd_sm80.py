"""Block-sparse attention forward, warp-level ``mma.sync`` (SM80+) CuTe DSL kernel.

One CTA per (query block m, query head h, batch b); the CTA's rows are the ``blk`` query
tokens of block m (blk = 64: 4 warps, blk = 128: 8 warps, 16 rows per warp). The KV loop
walks the active prefix of ``q2k_block_index[b, h, m, :]`` (length
``q2k_block_nums[b, h, m]``): each step loads exactly one listed KV block of ``blk`` keys
(``cp.async``, rows past ``S_kv`` zero-filled; K of the next listed block is prefetched
while the current block's softmax and P@V run), computes ``S = Q K^T``, masks the columns
past the block's valid length ``min(block_sizes[b, h, n], S_kv - n*blk)`` (only when that
length is below blk), and does the FlashAttention online softmax (base-2 exponentials of
``S * softmax_scale * log2(e)``).

Epilogue: ``out = acc / l`` and ``lse = m * softmax_scale + ln(l)`` (natural log, fp32);
rows with an empty list (l = 0) get ``out = 0`` and ``lse = -inf`` without dividing by 0.

Logical tensor modes seen by the kernel (the adapter maps bhsd/bshd buffers onto these
without copies): q/out ``(B, S_q, H_q, D)``, k/v ``(B, S_kv, H_kv, D)``, index
``(B, H_q, N_q, K_max)``, nums ``(B, H_q, N_q)``, sizes ``(B, H_q, N_kv)`` or None,
scale ``(1,)`` fp32, lse ``(B, H_q, S_q)`` fp32.

Split-KV (``kv_splits = S > 1``, a compile-time option; ``S = 1`` compiles none of this): one
CTA per (query block, split, query head, batch), grid ``(N_q S, H_q, B)``; split ``s`` visits
the chunk ``[s c, min((s + 1) c, n))`` of the row's active list, ``c = ceil(n / S)``
(``block_info.kv_split_chunk``), and writes its fp32 output normalised by its own softmax
denominator from registers to ``mO (S, B, H_q, S_q, D)`` and its LSE to ``mLSE (S, B, H_q,
S_q)`` (zeros and ``-inf`` without keys); ``bsa_combine`` merges the splits.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass.cute.nvgpu import warp

from .bsa_common import (fwd_copy_partitions, fwd_gmem_tiles, fwd_grid, fwd_tile_coords,
                         kv_block_rows, mask_keys_from, online_softmax_step, row_sum_inv,
                         softmax_rows, store_split_partial)
from .common import (acc_mn_view, acc_to_a_frag, cvt_frag, gemm_rs, gemm_ss, gmem_load_copy,
                     gmem_store_copy, launch, ldmatrix_atoms, ldmatrix_slices, mma_frags,
                     smem_parts, load_rows, r2s_copy, smem_layout_16b, smem_storage,
                     smem_struct, transpose_view)


class BsaFwdSm80:
    """Compile-time settings: element type, head dim (D = D_v), sparse block size, whether
    per-block valid sizes are given, whether Q fragments stay in registers (D <= 128 only),
    the minimum-CTAs-per-SM launch hint (0 = none) and ``late_v_wait``: a block's online
    softmax runs before the wait for its V block (V's load hides behind it; the next K
    block's load then starts after the softmax instead of before it); ``warp_rows``: query
    rows per warp (16 or 32; 32 keeps Q in shared memory)."""

    def __init__(self, dtype, head_dim: int, block_size: int, has_block_sizes: bool,
                 q_in_regs: bool = True, min_blocks: int = 0, late_v_wait: bool = False,
                 warp_rows: int = 16, kv_splits: int = 1):
        self.dtype = dtype
        self.hd = head_dim
        self.blk = block_size
        # warp_rows query rows per warp (16 or 32: one or two m16 MMA rows of tiles)
        self.num_warps = block_size // warp_rows
        self.num_threads = self.num_warps * 32
        self.has_sizes = has_block_sizes
        # Q fragments in registers only with 16 rows per warp (32 rows would spill)
        self.q_in_regs = head_dim <= 128 and q_in_regs and warp_rows == 16
        self.min_blocks = min_blocks
        self.late_v_wait = late_v_wait
        self.kv_splits = kv_splits

    def _entry(self, j0, j):
        """List entry of step ``j`` (split-KV: of the split's chunk starting at ``j0``)."""
        return j if self.kv_splits == 1 else j0 + j

    @cute.jit
    def __call__(self, mQ, mK, mV, mIdx, mNums, mSizes, mScale, mO, mLSE, stream):
        blk, hd = self.blk, self.hd
        sQ_layout = smem_layout_16b(blk, hd)
        sKV_layout = smem_layout_16b(blk, hd)

        SharedStorage = smem_struct(self.dtype, sQ=sQ_layout, sK=sKV_layout, sV=sKV_layout)

        gmem_copy_in = gmem_load_copy(self.dtype, self.num_threads, hd)
        gmem_copy_out = gmem_store_copy(self.dtype, self.num_threads, hd)
        tiled_mma = cute.make_tiled_mma(
            warp.MmaF16BF16Op(self.dtype, cutlass.Float32, (16, 8, 16)),
            (self.num_warps, 1, 1),
            permutation_mnk=(self.num_warps * 16, 16, 16),
        )
        grid = fwd_grid(mQ, blk)
        if cutlass.const_expr(self.kv_splits > 1):
            grid = (grid[0] * self.kv_splits, grid[1], grid[2])
        launch(self.kernel(
            mQ, mK, mV, mIdx, mNums, mSizes, mScale, mO, mLSE,
            sQ_layout, sKV_layout, gmem_copy_in, gmem_copy_out, tiled_mma, SharedStorage,
        ), grid, self.num_threads, SharedStorage, stream,
               min_blocks_per_mp=self.min_blocks, preferred_smem_carveout=100)

    @cute.kernel
    def kernel(
        self,
        mQ: cute.Tensor,
        mK: cute.Tensor,
        mV: cute.Tensor,
        mIdx: cute.Tensor,
        mNums: cute.Tensor,
        mSizes,
        mScale: cute.Tensor,
        mO: cute.Tensor,
        mLSE: cute.Tensor,
        sQ_layout: cute.ComposedLayout,
        sKV_layout: cute.ComposedLayout,
        gmem_copy_in: cute.TiledCopy,
        gmem_copy_out: cute.TiledCopy,
        tiled_mma: cute.TiledMma,
        SharedStorage: cutlass.Constexpr,
    ):
        blk, hd = self.blk, self.hd
        tidx, _, _ = cute.arch.thread_idx()
        (m_block, head, batch, seqlen_q, seqlen_k, head_kv, softmax_scale, scale_log2,
         num_blocks, split, j0) = fwd_tile_coords(mQ, mK, mScale, mNums, self.kv_splits)

        gQ, gK, gV = fwd_gmem_tiles(mQ, mK, mV, batch, head, head_kv, m_block, blk, hd)

        storage = smem_storage(SharedStorage)
        sQ = storage.sQ.get_tensor(sQ_layout)
        sK = storage.sK.get_tensor(sKV_layout)
        sV = storage.sV.get_tensor(sKV_layout)
        sVt = transpose_view(sV)

        tQgQ, tQsQ, tKgK, tKsK, tVgV, tVsV, tCc = fwd_copy_partitions(
            gmem_copy_in, tidx, gQ, sQ, gK, sK, gV, sV, blk, hd)

        thr_mma = tiled_mma.get_slice(tidx)
        tSrQ, tSrK = mma_frags(thr_mma, sQ, sK)
        tOrVt = thr_mma.make_fragment_B(thr_mma.partition_B(sVt))
        acc_O = cute.make_rmem_tensor(thr_mma.partition_shape_C((blk, hd)), cutlass.Float32)
        acc_O.fill(0.0)

        ldm, ldm_t = ldmatrix_atoms(self.dtype)
        s2r_Q, s2r_K = ldmatrix_slices(tiled_mma, tidx, ldm, ldm)
        s2r_V = cute.make_tiled_copy_B(ldm_t, tiled_mma).get_slice(tidx)
        tSsQ, tSsK = smem_parts(s2r_Q, s2r_K, sQ, sK)
        tOsVt = s2r_V.partition_S(sVt)

        tScS_mn = acc_mn_view(thr_mma.partition_C(cute.make_identity_tensor((blk, blk))))
        n_rows = cute.size(tScS_mn, mode=[0])
        row_max, row_sum = softmax_rows(n_rows)

        # Prologue: Q and the first listed K block.
        load_rows(gmem_copy_in, tQgQ, tQsQ, tCc, seqlen_q - m_block * blk)
        if cutlass.const_expr(self.q_in_regs):
            cute.arch.cp_async_commit_group()
        if num_blocks > 0:
            n_first = mIdx[batch, head, m_block, self._entry(j0, 0)]
            load_rows(gmem_copy_in, tKgK[None, None, None, n_first], tKsK, tCc,
                      kv_block_rows(mSizes, batch, head, n_first, seqlen_k, blk, self.has_sizes))
        cute.arch.cp_async_commit_group()

        if cutlass.const_expr(self.q_in_regs):
            # Q fragments stay in registers for the whole KV loop
            cute.arch.cp_async_wait_group(1)
            cute.arch.barrier()
            cute.copy(s2r_Q, tSsQ, s2r_Q.retile(tSrQ))

        for j in cutlass.range(num_blocks, unroll=1):
            n_block = mIdx[batch, head, m_block, self._entry(j0, j)]
            # key rows of this block; the K/V copies zero-fill the rest (never read)
            kv_rows = kv_block_rows(mSizes, batch, head, n_block, seqlen_k, blk, self.has_sizes)
            acc_S = cute.make_rmem_tensor(thr_mma.partition_shape_C((blk, blk)), cutlass.Float32)
            acc_S.fill(0.0)
            cute.arch.cp_async_wait_group(0)
            cute.arch.barrier()
            load_rows(gmem_copy_in, tVgV[None, None, None, n_block], tVsV, tCc, kv_rows)
            cute.arch.cp_async_commit_group()
            if cutlass.const_expr(self.q_in_regs):
                gemm_rs(tiled_mma, acc_S, tSrQ, tSrK, tSsK, s2r_K)
            else:
                gemm_ss(tiled_mma, acc_S, tSrQ, tSrK, tSsQ, tSsK, s2r_Q, s2r_K)
            if cutlass.const_expr(not self.late_v_wait):
                self._next_k(gmem_copy_in, tKgK, tKsK, tCc, mIdx, mSizes, batch, head, m_block,
                             j, num_blocks, seqlen_k, j0)

            # Valid keys of this block: [0, limit).
            limit = cutlass.min(kv_rows, blk)
            acc_S_mn = acc_mn_view(acc_S)
            if limit < blk:
                mask_keys_from(acc_S_mn, tScS_mn, limit)
            online_softmax_step(acc_S_mn, acc_mn_view(acc_O), row_max, row_sum, scale_log2)
            if cutlass.const_expr(self.late_v_wait):
                self._next_k(gmem_copy_in, tKgK, tKsK, tCc, mIdx, mSizes, batch, head, m_block,
                             j, num_blocks, seqlen_k, j0)

            gemm_rs(tiled_mma, acc_O, acc_to_a_frag(cvt_frag(acc_S, self.dtype)), tOrVt, tOsVt,
                    s2r_V)

        # Epilogue: normalize, write LSE and O. Empty rows never waited for their Q copy:
        # drain it before sQ is reused as the output staging buffer.
        cute.arch.cp_async_wait_group(0)
        acc_O_mn = acc_mn_view(acc_O)
        tOcO_mn = acc_mn_view(thr_mma.partition_C(cute.make_identity_tensor((blk, hd))))
        if cutlass.const_expr(self.kv_splits > 1):
            self._epilogue_split(acc_O_mn, tOcO_mn, row_max, row_sum, softmax_scale, mO, mLSE,
                                 split, batch, head, m_block, seqlen_q, tidx, n_rows)
        else:
            self._epilogue_out(acc_O, acc_O_mn, tOcO_mn, row_max, row_sum, softmax_scale, mO,
                               mLSE, batch, head, m_block, seqlen_q, tidx, n_rows, sQ,
                               sQ_layout, gmem_copy_out, tiled_mma)

    @cute.jit
    def _epilogue_split(self, acc_O_mn, tOcO_mn, row_max, row_sum, softmax_scale, mO, mLSE,
                        split, batch, head, m_block, seqlen_q, tidx,
                        n_rows: cutlass.Constexpr):
        """Split-KV: the split's fp32 ``O / l`` and LSE of rows ``< S_q`` from registers
        (zeros and ``-inf`` for a split without keys)."""
        store_split_partial(mO, mLSE, split, batch, head, acc_O_mn, tOcO_mn, row_max, row_sum,
                            softmax_scale, m_block, seqlen_q, tidx, self.blk, n_rows)

    @cute.jit
    def _epilogue_out(self, acc_O, acc_O_mn, tOcO_mn, row_max, row_sum, softmax_scale, mO,
                      mLSE, batch, head, m_block, seqlen_q, tidx, n_rows: cutlass.Constexpr,
                      sQ, sQ_layout, gmem_copy_out, tiled_mma):
        blk, hd = self.blk, self.hd
        for r in cutlass.range_constexpr(n_rows):
            l, empty, inv = row_sum_inv(row_sum[r])
            acc_O_mn[r, None] = acc_O_mn[r, None].load() * inv
            lse = -cutlass.Float32.inf
            if not empty:
                lse = row_max[r] * softmax_scale + cute.math.log(l, fastmath=False)
            row = m_block * blk + tOcO_mn[r, 0][0]
            if tidx % 4 == 0:
                if row < seqlen_q:
                    mLSE[batch, head, row] = lse

        rO = cvt_frag(acc_O, self.dtype)
        cute.arch.barrier()  # every warp is done reading sQ / sV
        sO = cute.make_tensor(sQ.iterator, sQ_layout)
        r2s = r2s_copy(self.dtype, tiled_mma)
        r2s_thr = r2s.get_slice(tidx)
        cute.copy(r2s, r2s_thr.retile(rO), r2s_thr.partition_D(sO))
        cute.arch.barrier()
        gO = cute.local_tile(mO[batch, None, head, None], (blk, hd), (m_block, 0))
        out_thr = gmem_copy_out.get_slice(tidx)
        tOsO = out_thr.partition_S(sO)
        tOgO = out_thr.partition_D(gO)
        tOrO = cute.make_fragment_like(tOgO, self.dtype)
        cute.copy(gmem_copy_out, tOsO, tOrO)
        tOc = out_thr.partition_D(cute.make_identity_tensor((blk, hd)))
        for r in cutlass.range_constexpr(cute.size(tOgO.shape[1])):
            if m_block * blk + tOc[0, r, 0][0] < seqlen_q:
                cute.copy(gmem_copy_out, tOrO[None, r, None], tOgO[None, r, None])

    @cute.jit
    def _next_k(self, gmem_copy_in, tKgK, tKsK, tCc, mIdx, mSizes, batch, head, m_block, j,
                num_blocks, seqlen_k, j0=None):
        """Wait for this block's V (every warp is then also done reading sK), then start
        loading the next listed K block into sK (split-KV: ``j0`` is the chunk's first
        entry)."""
        cute.arch.cp_async_wait_group(0)
        cute.arch.barrier()
        if j + 1 < num_blocks:
            n_next = mIdx[batch, head, m_block, self._entry(j0, j + 1)]
            load_rows(gmem_copy_in, tKgK[None, None, None, n_next], tKsK, tCc,
                      kv_block_rows(mSizes, batch, head, n_next, seqlen_k, self.blk,
                                    self.has_sizes))
        cute.arch.cp_async_commit_group()
