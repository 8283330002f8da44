"""Block-sparse attention forward for Hopper (sm_90a): warpgroup MMA (wgmma) CuTe DSL kernel.

Same contract and semantics as :mod:`bsa_fwd_sm80` (see there for the tensor modes); the
difference is the math engine:

* One CTA per (query block m, query head h, batch b) with ``blk // 64`` consumer
  warpgroups (64 query rows each); a KV step is one listed KV block (N = blk keys).
* ``S = Q K^T`` is one ``wgmma`` chain with both operands in shared memory (Q and K
  K-major, 128-byte swizzle); ``O += P V`` is a ``wgmma`` chain with P taken straight from
  the score registers (converted to 16 bit, no shared-memory round trip) and V read
  MN-major from shared memory, so V is never transposed.
* K and V of the listed blocks are gathered with ``cp.async`` into a 2-stage ring: the
  next listed block streams in while the current one is multiplied (a
  ``fence.proxy.async`` makes the generic-proxy copies visible to the tensor cores).
* Online softmax in base 2 on the fp32 accumulators (quad shuffles for row max / sum),
  masking only for KV blocks whose valid length ``min(block_sizes, S_kv - n*blk)`` is
  below blk; empty rows give ``out = 0`` and ``lse = -inf``.
* ``causal`` (static): the token-level causal mask inside the listed blocks (bottom-right
  aligned: key ``j`` visible from query ``i`` iff ``j <= i + S_kv - S_q``). The K/V rows a
  block loads are also capped at the keys the query block's last row sees (the rest are
  zero-filled); a block crossing the diagonal gets the per-row limit
  (``mask.KeyLimitMask.apply_causal``), a block at or below it no mask, and a block entirely
  above it loads no rows and is fully masked (its GEMMs run and add nothing).

Split-KV (``kv_splits = S > 1``, a compile-time option; ``S = 1`` compiles none of this): one
CTA per (query block, split, query head, batch), grid ``(N_q S, H_q, B)``; split ``s`` visits
the chunk ``[s c, min((s + 1) c, n))`` of the row's active list, ``c = ceil(n / S)``
(``block_info.kv_split_chunk``), and writes its fp32 output normalised by its own softmax
denominator to ``mO (S, B, H_q, S_q, D)`` and its natural-log LSE to ``mLSE (S, B, H_q, S_q)``
(zeros and ``-inf`` without keys); ``bsa_combine`` merges the splits.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.cute.nvgpu import warpgroup
from cutlass.tensor_utils import LayoutEnum

from .bsa_common import (fwd_copy_partitions, fwd_gmem_tiles, fwd_grid, fwd_tile_coords,
                         kv_block_rows, mask_keys_from, online_softmax_step, row_sum_inv,
                         softmax_rows, store_split_partial)
from .common import (acc_layout_as_a, acc_mn_view_wg, gmem_load_copy, launch, load_rows,
                     smem_storage, smem_struct)
from .pack_gqa import packed_row, row_tile_view
from .mask import KeyLimitMask


class BsaFwdSm90:
    def __init__(self, dtype, head_dim: int, block_size: int, has_block_sizes: bool,
                 pack_gqa: int = 1, causal: bool = False, kv_splits: int = 1):
        self.dtype = dtype
        # pack_gqa: r = H_q / H_kv (1: off): a CTA owns one block of blk packed query rows
        # (blk / r positions x the r query heads of one KV head; kernels/pack_gqa.py)
        self.pack = pack_gqa
        if pack_gqa > 1 and (causal or kv_splits > 1):
            raise NotImplementedError(
                "pack_gqa with causal or kv_splits > 1 is not implemented by this kernel")
        self.causal = causal
        self.hd = head_dim
        self.blk = block_size
        self.num_wg = block_size // 64
        self.num_threads = 128 * self.num_wg
        self.has_sizes = has_block_sizes
        self.kv_stages = 2
        self.kv_splits = kv_splits

    def _entry(self, j0, j):
        """List entry of step ``j`` (split-KV: of the split's chunk starting at ``j0``)."""
        return j if self.kv_splits == 1 else j0 + j

    @cute.jit
    def __call__(self, mQ, mK, mV, mIdx, mNums, mSizes, mScale, mO, mLSE, stream):
        blk, hd = self.blk, self.hd
        K = cute.nvgpu.OperandMajorMode.K
        MN = cute.nvgpu.OperandMajorMode.MN
        qk_mma = sm90_utils.make_trivial_tiled_mma(
            self.dtype, self.dtype, K, K, cutlass.Float32, (self.num_wg, 1, 1), (64, blk))
        pv_mma = sm90_utils.make_trivial_tiled_mma(
            self.dtype, self.dtype, K, MN, cutlass.Float32, (self.num_wg, 1, 1), (64, hd),
            warpgroup.OperandSource.RMEM)
        qk_tiler = (blk, blk, hd)
        pv_tiler = (blk, hd, blk)
        sQ_layout = sm90_utils.make_smem_layout_a(LayoutEnum.ROW_MAJOR, qk_tiler, self.dtype, 1)
        sK_layout = sm90_utils.make_smem_layout_b(LayoutEnum.ROW_MAJOR, qk_tiler, self.dtype, self.kv_stages)
        sV_layout = sm90_utils.make_smem_layout_b(LayoutEnum.COL_MAJOR, pv_tiler, self.dtype, self.kv_stages)

        SharedStorage = smem_struct(self.dtype, sQ=sQ_layout, sK=sK_layout, sV=sV_layout)

        gmem_copy_in = gmem_load_copy(self.dtype, self.num_threads, hd)
        grid = fwd_grid(mQ, blk)
        if cutlass.const_expr(self.pack > 1):
            grid = (cute.ceil_div(mQ.shape[1] * self.pack, blk), cute.size(mK.shape[2]),
                    cute.size(mQ.shape[0]))
        if cutlass.const_expr(self.kv_splits > 1):
            grid = (grid[0] * self.kv_splits, grid[1], grid[2])
        launch(self.kernel(
            mQ, mK, mV, mIdx, mNums, mSizes, mScale, mO, mLSE,
            sQ_layout, sK_layout, sV_layout, gmem_copy_in, qk_mma, pv_mma, SharedStorage,
        ), grid, self.num_threads, SharedStorage, stream)

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
        sK_layout: cute.ComposedLayout,
        sV_layout: cute.ComposedLayout,
        gmem_copy_in: cute.TiledCopy,
        qk_mma: cute.TiledMma,
        pv_mma: cute.TiledMma,
        SharedStorage: cutlass.Constexpr,
    ):
        blk, hd = self.blk, self.hd
        tidx, _, _ = cute.arch.thread_idx()
        (m_block, head, batch, seqlen_q, seqlen_k, head_kv, softmax_scale, scale_log2,
         num_blocks, split, j0) = fwd_tile_coords(mQ, mK, mScale, mNums, self.kv_splits)
        if cutlass.const_expr(self.pack > 1):
            # head is the KV head; rows are the S_q r packed rows
            head_kv = head
            seqlen_q = seqlen_q * self.pack

        storage = smem_storage(SharedStorage)
        sQ = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)  # (blk, hd, 1)
        sK = storage.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)  # (blk, hd, st)
        sV = storage.sV.get_tensor(sV_layout.outer, swizzle=sV_layout.inner)  # (hd, blk, st)
        # (keys, hd, stage) view of the MN-major V buffer for the row copies
        sV_rows = cute.composition(
            sV, cute.make_layout((blk, hd, self.kv_stages), stride=(hd, 1, blk * hd)))

        gQ, gK, gV = fwd_gmem_tiles(mQ, mK, mV, batch, head, head_kv, m_block, blk, hd)
        tQgQ, tQsQ, tKgK, tKsK, tVgV, tVsV, tCc = fwd_copy_partitions(
            gmem_copy_in, tidx, gQ, sQ[None, None, 0], gK, sK, gV, sV_rows, blk, hd)

        thr_qk = qk_mma.get_slice(tidx)
        thr_pv = pv_mma.get_slice(tidx)
        tSrQ = thr_qk.make_fragment_A(thr_qk.partition_A(sQ))
        tSrK = thr_qk.make_fragment_B(thr_qk.partition_B(sK))
        tOrV = thr_pv.make_fragment_B(thr_pv.partition_B(sV))
        acc_O = thr_pv.make_fragment_C(thr_pv.partition_shape_C((blk, hd)))
        acc_O.fill(0.0)
        acc_S = thr_qk.make_fragment_C(thr_qk.partition_shape_C((blk, blk)))

        tScS_mn = acc_mn_view_wg(thr_qk.partition_C(cute.make_identity_tensor((blk, blk))))
        n_rows = cute.size(tScS_mn, mode=[0])
        row_max, row_sum = softmax_rows(n_rows)

        key_end = None
        if cutlass.const_expr(self.causal):
            # one past the last key this query block's last row sees
            key_end = cutlass.min((m_block + 1) * blk, seqlen_q) + seqlen_k - seqlen_q

        # Prologue: Q, then the first listed K/V block into stage 0.
        if cutlass.const_expr(self.pack > 1):
            self._load_q_packed(mQ, gmem_copy_in, tidx, tQsQ, tCc, batch, head, m_block,
                                seqlen_q)
        else:
            load_rows(gmem_copy_in, tQgQ, tQsQ, tCc, seqlen_q - m_block * blk)
        if num_blocks > 0:
            n0 = mIdx[batch, head, m_block, self._entry(j0, 0)]
            rows0 = kv_block_rows(mSizes, batch, head, n0, seqlen_k, blk, self.has_sizes)
            if cutlass.const_expr(self.causal):
                rows0 = cutlass.min(rows0, key_end - n0 * blk)
            load_rows(gmem_copy_in, tKgK[None, None, None, n0], tKsK[None, None, None, 0], tCc,
                       rows0)
            load_rows(gmem_copy_in, tVgV[None, None, None, n0], tVsV[None, None, None, 0], tCc,
                       rows0)
        cute.arch.cp_async_commit_group()

        for j in cutlass.range(num_blocks, unroll=1):
            stage = j % 2
            n_block = mIdx[batch, head, m_block, self._entry(j0, j)]
            # valid keys of this block: [0, limit); the K/V copies zero-filled the rest
            limit = cutlass.min(
                kv_block_rows(mSizes, batch, head, n_block, seqlen_k, blk, self.has_sizes), blk)
            cute.arch.barrier()  # every warpgroup is done with stage 1 - stage
            if j + 1 < num_blocks:
                n_next = mIdx[batch, head, m_block, self._entry(j0, j + 1)]
                rows_next = kv_block_rows(mSizes, batch, head, n_next, seqlen_k, blk,
                                          self.has_sizes)
                if cutlass.const_expr(self.causal):
                    rows_next = cutlass.min(rows_next, key_end - n_next * blk)
                load_rows(gmem_copy_in, tKgK[None, None, None, n_next],
                           tKsK[None, None, None, 1 - stage], tCc, rows_next)
                load_rows(gmem_copy_in, tVgV[None, None, None, n_next],
                           tVsV[None, None, None, 1 - stage], tCc, rows_next)
            cute.arch.cp_async_commit_group()
            cute.arch.cp_async_wait_group(1)
            cute.arch.fence_proxy("async.shared", space="cta")
            cute.arch.barrier()

            # S = Q K^T
            warpgroup.fence()
            for k in cutlass.range_constexpr(cute.size(tSrQ, mode=[2])):
                qk_mma.set(warpgroup.Field.ACCUMULATE, k != 0)
                cute.gemm(qk_mma, acc_S, tSrQ[None, None, k, 0], tSrK[None, None, k, stage], acc_S)
            warpgroup.commit_group()
            warpgroup.wait_group(0)

            acc_S_mn = acc_mn_view_wg(acc_S)
            if cutlass.const_expr(self.causal):
                # ---- causal: keys past the block's last row's diagonal are not keys of
                # the block; rows of a diagonal-crossing block get their own limit
                limit = cutlass.min(limit, key_end - n_block * blk)
                row_lim0 = m_block * blk + seqlen_k - seqlen_q + 1 - n_block * blk
                if cutlass.min(limit, row_lim0) < blk:
                    KeyLimitMask(tScS_mn).apply_causal(acc_S_mn, limit, row_lim0)
            else:
                if limit < blk:
                    mask_keys_from(acc_S_mn, tScS_mn, limit)
            online_softmax_step(acc_S_mn, acc_mn_view_wg(acc_O), row_max, row_sum, scale_log2)

            # P (16 bit) straight from the score registers as the A operand of O += P V
            tOrP = cute.make_rmem_tensor(
                acc_layout_as_a(acc_S.layout, pv_mma.tv_layout_A.shape[1]), self.dtype)
            tOrP_as_acc = cute.make_tensor(tOrP.iterator, acc_S.layout)
            tOrP_as_acc.store(acc_S.load().to(self.dtype))
            warpgroup.fence()
            pv_mma.set(warpgroup.Field.ACCUMULATE, True)
            for k in cutlass.range_constexpr(cute.size(tOrP, mode=[2])):
                cute.gemm(pv_mma, acc_O, tOrP[None, None, k], tOrV[None, None, k, stage], acc_O)
            warpgroup.commit_group()
            warpgroup.wait_group(0)

        cute.arch.cp_async_wait_group(0)

        # Epilogue: normalize, write LSE and O straight from registers (row-predicated).
        acc_O_mn = acc_mn_view_wg(acc_O)
        tOcO_mn = acc_mn_view_wg(thr_pv.partition_C(cute.make_identity_tensor((blk, hd))))
        if cutlass.const_expr(self.kv_splits > 1):
            # split-KV: the split's fp32 partial and LSE (zeros and -inf without keys)
            store_split_partial(mO, mLSE, split, batch, head, acc_O_mn, tOcO_mn, row_max,
                                row_sum, softmax_scale, m_block, seqlen_q, tidx, blk, n_rows)
        else:
            for r in cutlass.range_constexpr(n_rows):
                l, empty, inv = row_sum_inv(row_sum[r])
                lse = -cutlass.Float32.inf
                if not empty:
                    lse = row_max[r] * softmax_scale + cute.math.log(l, fastmath=False)
                row = m_block * blk + tOcO_mn[r, 0][0]
                if row < seqlen_q:
                    # the row's (position, query head): itself, or a packed row's
                    s_row, h_row = row, head
                    if cutlass.const_expr(self.pack > 1):
                        s_row, h_row = packed_row(row, head, self.pack)
                    if tidx % 4 == 0:
                        mLSE[batch, h_row, s_row] = lse
                    for c in cutlass.range_constexpr(cute.size(tOcO_mn, mode=[1])):
                        mO[batch, s_row, h_row, tOcO_mn[r, c][1]] = (acc_O_mn[r, c] * inv).to(self.dtype)

    @cute.jit
    def _load_q_packed(self, mQ, gmem_copy_in, tidx, tQsQ, tCc, batch, head_kv, m_block,
                       n_rows):
        """cp.async of the CTA's blk packed Q rows, each from its (position, query head) row
        of ``mQ``; rows at or past ``n_rows`` (``S_q r``) zero-filled."""
        thr_copy = gmem_copy_in.get_slice(tidx)
        for r in cutlass.range_constexpr(cute.size(tQsQ.shape[1])):
            row = tCc[0, r, 0][0]
            p = m_block * self.blk + row
            if p < n_rows:
                s, h = packed_row(p, head_kv, self.pack)
                tg = thr_copy.partition_S(row_tile_view(mQ, batch, s, h, self.blk, self.hd))
                cute.copy(gmem_copy_in, tg[None, r, None], tQsQ[None, r, None])
            else:
                tQsQ[None, r, None].fill(0)
