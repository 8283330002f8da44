"""Block-sparse attention backward for Hopper (sm_90a): warpgroup MMA (wgmma) CuTe DSL kernel.

The default BSA backward for D in {64, 128} (``impl="sm90v2"``; ``JAX_SPARSE_ATTN_BSA_BWD_IMPL``
``sm90`` is the same kernel). Same contract, work split and semantics as :mod:`bsa_bwd_sm80`
(one CTA = one warpgroup, 2 CTAs per SM, per 64-key tile, KV head and batch, walking the
K->Q transposed CSR list of its KV block; Q/dO of the next query sub-tile stream into a
2-stage ``cp.async`` ring while the current one computes; dK/dV in registers, dQ by fp32
reductions), but every product is a ``wgmma``, computed in the transposed ("key-major")
orientation so that the probabilities never need a transpose. The same shared-memory bytes
serve as a K-major operand in one product and an MN-major operand in another (for 16-bit
types the 128-byte-swizzled K-major tile of a row-major ``(rows, D)`` block is
bit-identical to the MN-major tile of its transpose). It replaced a first wgmma backward
(three barriers per step, ``v2`` atomics; 185 vs 196 TFLOP/s at B=1 H=16 S=16384 D=128
blk64 top-32 on the H200) in:

* two CTA barriers per query sub-tile instead of three: the prefetch of the next Q/dO
  sub-tile into the other stage of the ``cp.async`` ring is issued right after the barrier
  that publishes the current one (every thread has left the previous step by then);
* the K->Q CSR entries are software-pipelined two steps ahead in registers, so that no
  dependent global load of an entry sits between the barrier and the next prefetch (or the
  lse/delta loads of the current step);
* dQ goes to the fp32 accumulator with ``red.global.add.v4.f32`` (half the reduction
  instructions of ``v2`` atomics): lanes ``l`` and ``l ^ 1`` of
  the wgmma accumulator hold the two halves of four consecutive columns of rows ``r`` and
  ``r + 8``; one shuffle pair gives the even lane row ``r`` and the odd lane row ``r + 8``
  as 4-vectors;
* with ``overlap_dq`` (``impl="sm90v2"``; ``"sm90v2n"`` turns it off): ``dQ = dS K`` in
  its own wgmma commit group, issued first, so that the dQ reductions run under the dV/dK
  wgmmas (ptxas, D=128: 252 registers, no spills; 250 without the overlap).

Products (key-major orientation):

    S^T  = K Q^T,  dP^T = V dO^T                       (SS)
    P^T  = exp2(S^T * scale * log2 e - lse[q] * log2 e),  dS^T = P^T * (dP^T - delta[q])
    dV  += P^T dO,  dK += dS^T Q                        (RS, from registers)
    dQ   = dS K   (SS, dS^T stored once to smem)      -> red.v4 into the fp32 accumulator
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.memory
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.cute.nvgpu import warpgroup
from cutlass.tensor_utils import LayoutEnum

from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import dsl_user_op

from .bsa_common import LOG2_E, gmem_load_copy, issue_q_do_rows
from .common import load_rows
from .bsa_fwd_sm90 import _acc_layout_as_a, _acc_mn_view_wg

TILE = 64


@dsl_user_op
def red_add_v4_f32(ptr, a, b, c, d, *, loc=None, ip=None):
    """``red.global.add.v4.f32 [ptr], {a, b, c, d}`` (sm_90; 16-byte aligned ``ptr``)."""
    llvm.inline_asm(
        None,
        [ptr.toint(loc=loc, ip=ip).ir_value(loc=loc, ip=ip)]
        + [cutlass.Float32(x).ir_value(loc=loc, ip=ip) for x in (a, b, c, d)],
        "red.relaxed.gpu.global.add.v4.f32 [$0], {$1, $2, $3, $4};",
        "l,f,f,f,f",
        has_side_effects=True,
        is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT,
        loc=loc,
        ip=ip,
    )


class BsaBwdSm90V2:
    def __init__(self, dtype, head_dim: int, block_size: int, has_block_sizes: bool,
                 overlap_dq: bool = False):
        self.dtype = dtype
        self.hd = head_dim
        self.blk = block_size
        self.sub = block_size // TILE
        self.num_threads = 128
        self.has_sizes = has_block_sizes
        self.overlap_dq = overlap_dq

    @staticmethod
    def can_implement(dtype, head_dim: int, block_size: int) -> bool:
        return (dtype in (cutlass.Float16, cutlass.BFloat16) and head_dim in (64, 128)
                and block_size in (64, 128))

    @cute.jit
    def __call__(self, mQ, mK, mV, mdO, mLSE, mDelta, mOffsets, mEntries, mSizes, mScale,
                 mdQacc, mdK, mdV, stream):
        hd = self.hd
        Kmaj = cute.nvgpu.OperandMajorMode.K
        MN = cute.nvgpu.OperandMajorMode.MN
        # S^T / dP^T: (64 keys) x (64 queries), reduction over D
        mma_s = sm90_utils.make_trivial_tiled_mma(
            self.dtype, self.dtype, Kmaj, Kmaj, cutlass.Float32, (1, 1, 1), (TILE, TILE))
        # dV / dK: (64 keys) x D, reduction over 64 queries, A from registers
        mma_kv = sm90_utils.make_trivial_tiled_mma(
            self.dtype, self.dtype, Kmaj, MN, cutlass.Float32, (1, 1, 1), (TILE, hd),
            warpgroup.OperandSource.RMEM)
        # dQ: (64 queries) x D, reduction over 64 keys
        mma_q = sm90_utils.make_trivial_tiled_mma(
            self.dtype, self.dtype, MN, MN, cutlass.Float32, (1, 1, 1), (TILE, hd))
        s_tiler = (TILE, TILE, hd)
        kv_tiler = (TILE, hd, TILE)
        sKV_layout = sm90_utils.make_smem_layout_a(LayoutEnum.ROW_MAJOR, s_tiler, self.dtype, 1)
        sKV_mn_layout = sm90_utils.make_smem_layout_b(LayoutEnum.COL_MAJOR, kv_tiler, self.dtype, 1)
        sQ_layout = sm90_utils.make_smem_layout_b(LayoutEnum.ROW_MAJOR, s_tiler, self.dtype, 2)
        sQ_mn_layout = sm90_utils.make_smem_layout_b(LayoutEnum.COL_MAJOR, kv_tiler, self.dtype, 2)
        sdS_layout = sm90_utils.make_smem_layout_a(LayoutEnum.COL_MAJOR, kv_tiler, self.dtype, 1)

        @cute.struct
        class SharedStorage:
            sQ: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sQ_layout)], 1024]
            sdO: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sQ_layout)], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sKV_layout)], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sKV_layout)], 1024]
            sdS: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sdS_layout)], 1024]

        gmem_copy_in = gmem_load_copy(self.dtype, self.num_threads, hd)
        n_tiles = cute.ceil_div(mK.shape[1], TILE)
        grid = (n_tiles, cute.size(mK.shape[2]), cute.size(mK.shape[0]))
        self.kernel(
            mQ, mK, mV, mdO, mLSE, mDelta, mOffsets, mEntries, mSizes, mScale, mdQacc, mdK, mdV,
            sKV_layout, sKV_mn_layout, sQ_layout, sQ_mn_layout, sdS_layout,
            gmem_copy_in, mma_s, mma_kv, mma_q, SharedStorage,
        ).launch(
            grid=grid,
            block=[self.num_threads, 1, 1],
            smem=SharedStorage.size_in_bytes(),
            stream=stream,
            min_blocks_per_mp=2,
            preferred_smem_carveout=100,
        )

    @cute.jit
    def _issue_q_do(self, mQ, mdO, ent, t, n_q_blocks, head_kv, group, batch,
                    seqlen_q, gmem_copy_in, thr_copy, tCc, tQsQ, tdOsdO, stage):
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
        sKV_layout: cute.ComposedLayout,
        sKV_mn_layout: cute.ComposedLayout,
        sQ_layout: cute.ComposedLayout,
        sQ_mn_layout: cute.ComposedLayout,
        sdS_layout: cute.ComposedLayout,
        gmem_copy_in: cute.TiledCopy,
        mma_s: cute.TiledMma,
        mma_kv: cute.TiledMma,
        mma_q: cute.TiledMma,
        SharedStorage: cutlass.Constexpr,
    ):
        hd, blk = self.hd, self.blk
        tidx, _, _ = cute.arch.thread_idx()
        n_tile, head_kv, batch = cute.arch.block_idx()
        seqlen_q = mQ.shape[1]
        seqlen_k = mK.shape[1]
        num_heads_kv = mK.shape[2]
        group = mQ.shape[2] // num_heads_kv
        n_q_blocks = (seqlen_q + blk - 1) // blk
        n_kv_blocks = (seqlen_k + blk - 1) // blk
        n_block = n_tile // self.sub
        tile_off = (n_tile % self.sub) * TILE
        softmax_scale = mScale[0]
        scale_log2 = softmax_scale * LOG2_E

        smem = cutlass.memory.SmemAllocator()
        storage = smem.allocate(SharedStorage)
        sQ = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)  # (q, d, st)
        sdO = storage.sdO.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        sK = storage.sK.get_tensor(sKV_layout.outer, swizzle=sKV_layout.inner)  # (kv, d, 1)
        sV = storage.sV.get_tensor(sKV_layout.outer, swizzle=sKV_layout.inner)
        # MN-major aliases of the same bytes: (d, q, st) and (d, kv, 1)
        sQ_mn = storage.sQ.get_tensor(sQ_mn_layout.outer, swizzle=sQ_mn_layout.inner)
        sdO_mn = storage.sdO.get_tensor(sQ_mn_layout.outer, swizzle=sQ_mn_layout.inner)
        sK_mn = storage.sK.get_tensor(sKV_mn_layout.outer, swizzle=sKV_mn_layout.inner)
        sdS = storage.sdS.get_tensor(sdS_layout.outer, swizzle=sdS_layout.inner)  # (q, kv, 1)

        thr_copy = gmem_copy_in.get_slice(tidx)
        tCc = thr_copy.partition_S(cute.make_identity_tensor((TILE, hd)))
        gK = cute.local_tile(mK[batch, None, head_kv, None], (TILE, hd), (n_tile, 0))
        gV = cute.local_tile(mV[batch, None, head_kv, None], (TILE, hd), (n_tile, 0))
        kv_left = seqlen_k - n_tile * TILE
        load_rows(gmem_copy_in, thr_copy.partition_S(gK), thr_copy.partition_D(sK[None, None, 0]), tCc, kv_left)
        load_rows(gmem_copy_in, thr_copy.partition_S(gV), thr_copy.partition_D(sV[None, None, 0]), tCc, kv_left)
        cute.arch.cp_async_commit_group()
        tQsQ = thr_copy.partition_D(sQ)
        tdOsdO = thr_copy.partition_D(sdO)

        thr_s = mma_s.get_slice(tidx)
        thr_kv = mma_kv.get_slice(tidx)
        thr_q = mma_q.get_slice(tidx)
        tSrK = thr_s.make_fragment_A(thr_s.partition_A(sK))
        tSrQ = thr_s.make_fragment_B(thr_s.partition_B(sQ))
        tPrV = thr_s.make_fragment_A(thr_s.partition_A(sV))
        tPrdO = thr_s.make_fragment_B(thr_s.partition_B(sdO))
        tVrdO = thr_kv.make_fragment_B(thr_kv.partition_B(sdO_mn))
        tKrQ = thr_kv.make_fragment_B(thr_kv.partition_B(sQ_mn))
        tQrdS = thr_q.make_fragment_A(thr_q.partition_A(sdS))
        tQrK = thr_q.make_fragment_B(thr_q.partition_B(sK_mn))

        acc_dK = thr_kv.make_fragment_C(thr_kv.partition_shape_C((TILE, hd)))
        acc_dV = thr_kv.make_fragment_C(thr_kv.partition_shape_C((TILE, hd)))
        acc_dK.fill(0.0)
        acc_dV.fill(0.0)

        tScS_mn = _acc_mn_view_wg(thr_s.partition_C(cute.make_identity_tensor((TILE, TILE))))
        n_rows = cute.size(tScS_mn, mode=[0])  # keys owned by this thread
        n_cols = cute.size(tScS_mn, mode=[1])  # queries owned by this thread
        tdQcdQ = thr_q.partition_C(cute.make_identity_tensor((TILE, hd)))
        # (kv, q) view of the (q, kv) dS buffer for the element stores
        sdS_t = cute.composition(sdS, cute.make_layout((TILE, TILE), stride=(TILE, 1)))

        row_id = (batch * num_heads_kv + head_kv) * n_kv_blocks + n_block
        e_begin = mOffsets[row_id]
        n_steps = (mOffsets[row_id + 1] - e_begin) * self.sub

        # CSR entries are software-pipelined two steps ahead (register carried), so that no
        # global load of an entry sits between a barrier and the copies / lse loads it feeds
        ent_cur = cutlass.Int32(0)
        ent_nxt = cutlass.Int32(0)
        if n_steps > 0:
            ent_cur = mEntries[e_begin]
            ent_nxt = mEntries[e_begin + cutlass.min(1, n_steps - 1) // self.sub]
            self._issue_q_do(mQ, mdO, ent_cur, 0, n_q_blocks, head_kv, group, batch,
                             seqlen_q, gmem_copy_in, thr_copy, tCc, tQsQ, tdOsdO, 0)
        cute.arch.cp_async_commit_group()
        odd = (tidx % 2) == 1
        for t in cutlass.range(n_steps, unroll=1):
            stage = t % 2
            ent = ent_cur
            h_in_group = ent // n_q_blocks
            m_block = ent - h_in_group * n_q_blocks
            head = head_kv * group + h_in_group
            q0 = m_block * blk + (t % self.sub) * TILE
            q_tile = q0 // TILE
            limit = cutlass.min(kv_left, TILE)
            if cutlass.const_expr(self.has_sizes):
                limit = cutlass.min(limit, mSizes[batch, head, n_block] - tile_off)

            # per-query (column) lse in the log2 domain and delta; the loads are in flight
            # while this thread waits for its copies and the barrier
            lse2 = cute.make_rmem_tensor(n_cols, cutlass.Float32)
            dlt = cute.make_rmem_tensor(n_cols, cutlass.Float32)
            for c in cutlass.range_constexpr(n_cols):
                qrow = q0 + tScS_mn[0, c][1]
                lse2[c] = cutlass.Float32.inf
                dlt[c] = 0.0
                if qrow < seqlen_q:
                    lse2[c] = mLSE[batch, head, qrow] * LOG2_E
                    dlt[c] = mDelta[batch, head, qrow]

            cute.arch.cp_async_wait_group(0)  # this thread's copies of step t (and K/V)
            cute.arch.fence_proxy("async.shared", space="cta")
            # every copy of step t is visible and every thread has left step t-1, so the
            # other ring stage and sdS are free
            cute.arch.barrier()
            if t + 1 < n_steps:
                self._issue_q_do(mQ, mdO, ent_nxt, t + 1, n_q_blocks, head_kv, group,
                                 batch, seqlen_q, gmem_copy_in, thr_copy, tCc, tQsQ, tdOsdO,
                                 1 - stage)
            cute.arch.cp_async_commit_group()
            ent_cur = ent_nxt
            ent_nxt = mEntries[e_begin + cutlass.min(t + 2, n_steps - 1) // self.sub]

            if limit > 0 and q0 < seqlen_q:
                acc_S = thr_s.make_fragment_C(thr_s.partition_shape_C((TILE, TILE)))
                acc_dP = thr_s.make_fragment_C(thr_s.partition_shape_C((TILE, TILE)))
                warpgroup.fence()
                for k in cutlass.range_constexpr(cute.size(tSrK, mode=[2])):
                    mma_s.set(warpgroup.Field.ACCUMULATE, k != 0)
                    cute.gemm(mma_s, acc_S, tSrK[None, None, k, 0], tSrQ[None, None, k, stage], acc_S)
                for k in cutlass.range_constexpr(cute.size(tPrV, mode=[2])):
                    mma_s.set(warpgroup.Field.ACCUMULATE, k != 0)
                    cute.gemm(mma_s, acc_dP, tPrV[None, None, k, 0], tPrdO[None, None, k, stage], acc_dP)
                warpgroup.commit_group()
                warpgroup.wait_group(0)

                S_mn = _acc_mn_view_wg(acc_S)
                dP_mn = _acc_mn_view_wg(acc_dP)
                for r in cutlass.range_constexpr(n_rows):
                    key_ok = tScS_mn[r, 0][0] < limit
                    for c in cutlass.range_constexpr(n_cols):
                        p = cute.math.exp2(S_mn[r, c] * scale_log2 - lse2[c], fastmath=True)
                        p = p if key_ok else cutlass.Float32(0.0)
                        S_mn[r, c] = p
                        dP_mn[r, c] = p * (dP_mn[r, c] - dlt[c])

                tPr = cute.make_rmem_tensor(_acc_layout_as_a(acc_S.layout, mma_kv.tv_layout_A.shape[1]), self.dtype)
                cute.make_tensor(tPr.iterator, acc_S.layout).store(acc_S.load().to(self.dtype))
                tdSr = cute.make_rmem_tensor(_acc_layout_as_a(acc_dP.layout, mma_kv.tv_layout_A.shape[1]), self.dtype)
                tdSr_acc = cute.make_tensor(tdSr.iterator, acc_dP.layout)
                tdSr_acc.store(acc_dP.load().to(self.dtype))
                # dS^T -> smem (read back as the MN-major A operand of dQ = dS K)
                tdSr_mn = _acc_mn_view_wg(tdSr_acc)
                for r in cutlass.range_constexpr(n_rows):
                    for c in cutlass.range_constexpr(n_cols):
                        sdS_t[tScS_mn[r, c]] = tdSr_mn[r, c]
                cute.arch.fence_proxy("async.shared", space="cta")
                cute.arch.barrier()

                acc_dQ = thr_q.make_fragment_C(thr_q.partition_shape_C((TILE, hd)))
                warpgroup.fence()
                if cutlass.const_expr(self.overlap_dq):
                    for k in cutlass.range_constexpr(cute.size(tQrdS, mode=[2])):
                        mma_q.set(warpgroup.Field.ACCUMULATE, k != 0)
                        cute.gemm(mma_q, acc_dQ, tQrdS[None, None, k, 0], tQrK[None, None, k, 0], acc_dQ)
                    warpgroup.commit_group()
                mma_kv.set(warpgroup.Field.ACCUMULATE, True)
                for k in cutlass.range_constexpr(cute.size(tPr, mode=[2])):
                    cute.gemm(mma_kv, acc_dV, tPr[None, None, k], tVrdO[None, None, k, stage], acc_dV)
                for k in cutlass.range_constexpr(cute.size(tdSr, mode=[2])):
                    cute.gemm(mma_kv, acc_dK, tdSr[None, None, k], tKrQ[None, None, k, stage], acc_dK)
                if cutlass.const_expr(not self.overlap_dq):
                    for k in cutlass.range_constexpr(cute.size(tQrdS, mode=[2])):
                        mma_q.set(warpgroup.Field.ACCUMULATE, k != 0)
                        cute.gemm(mma_q, acc_dQ, tQrdS[None, None, k, 0], tQrK[None, None, k, 0], acc_dQ)
                warpgroup.commit_group()
                if cutlass.const_expr(self.overlap_dq):
                    warpgroup.wait_group(1)  # dQ done; dV/dK still running
                else:
                    warpgroup.wait_group(0)

                # dQ -> fp32 accumulator, 4 consecutive columns per red. Value 4j + e of this
                # thread sits at (row r + 8 * (e // 2), col 8j + 2 * (lane % 4) + e % 2): lanes
                # l and l ^ 1 swap halves, the even lane then owns 4 columns of row r and the
                # odd lane the same 4 columns of row r + 8 (its address: two columns left of
                # its own value 4j + 2).
                gdQ = cute.local_tile(mdQacc[batch, None, head, None], (TILE, hd), (q_tile, 0))
                tdQgdQ = thr_q.partition_C(gdQ)
                row8 = cute.crd2idx(2, tdQgdQ.layout) - cute.crd2idx(0, tdQgdQ.layout)
                odd_off = row8 - 2 if odd else row8 * 0
                row_ok = q0 + tdQcdQ[0][0] + (8 if odd else 0) < seqlen_q
                for j in cutlass.range_constexpr(cute.size(acc_dQ) // 4):
                    v0 = acc_dQ[4 * j] * softmax_scale
                    v1 = acc_dQ[4 * j + 1] * softmax_scale
                    v2 = acc_dQ[4 * j + 2] * softmax_scale
                    v3 = acc_dQ[4 * j + 3] * softmax_scale
                    # every lane shuffles (never under a lane-dependent predicate)
                    recv_a = cute.arch.shuffle_sync_bfly(v0 if odd else v2, offset=1)
                    recv_b = cute.arch.shuffle_sync_bfly(v1 if odd else v3, offset=1)
                    if row_ok:
                        ptr = tdQgdQ.iterator + (cute.crd2idx(4 * j, tdQgdQ.layout) + odd_off)
                        red_add_v4_f32(ptr, recv_a if odd else v0, recv_b if odd else v1,
                                       v2 if odd else recv_a, v3 if odd else recv_b)
                if cutlass.const_expr(self.overlap_dq):
                    warpgroup.wait_group(0)

        cute.arch.cp_async_wait_group(0)
        # Epilogue: dK * scale and dV straight from registers, key-row predicated.
        tKc_mn = _acc_mn_view_wg(thr_kv.partition_C(cute.make_identity_tensor((TILE, hd))))
        dK_mn = _acc_mn_view_wg(acc_dK)
        dV_mn = _acc_mn_view_wg(acc_dV)
        for r in cutlass.range_constexpr(cute.size(tKc_mn, mode=[0])):
            row = tKc_mn[r, 0][0]
            if row < kv_left:
                for c in cutlass.range_constexpr(cute.size(tKc_mn, mode=[1])):
                    col = tKc_mn[r, c][1]
                    mdK[batch, n_tile * TILE + row, head_kv, col] = (dK_mn[r, c] * softmax_scale).to(self.dtype)
                    mdV[batch, n_tile * TILE + row, head_kv, col] = dV_mn[r, c].to(self.dtype)
