"""Block-sparse attention backward for Hopper (sm_90a): warpgroup MMA (wgmma) CuTe DSL kernel.

The BSA backward for D in {64, 128} (switch ``bsa_bwd_impl="sm90"``; ``auto`` runs it for
``pack_gqa`` calls (``causal`` included) with ``bsa_bwd_ws`` ``nopackws`` or ``decouple`` or
``bsa_bwd_dq="rows"``, and at blk 64 / D 128 with ``bsa_bwd_dq="rows"``;
``"sm80"`` selects :mod:`bsa_bwd_sm80`, which also serves D in {32, 256}). Same contract, work
split and semantics as :mod:`bsa_bwd_sm80`: one CTA = one warpgroup (2 CTAs per SM) per
64-key tile, KV head and batch, walking the K->Q transposed CSR list of its KV block; the
Q/dO rows, lse and delta of the next query sub-tile stream into a 2-stage ``cp.async`` ring
while the current one computes; dK/dV stay in registers; dQ is reduced into an fp32
workspace. Every product is a ``wgmma`` in the transposed ("key-major") orientation, so the
probabilities never need a transpose; the same shared-memory bytes serve as a K-major
operand in one product and an MN-major operand in another (for 16-bit types the
128-byte-swizzled K-major tile of a row-major ``(rows, D)`` block is bit-identical to the
MN-major tile of its transpose).

Products (key-major orientation):

    S^T  = K Q^T,  dP^T = V dO^T                       (SS)
    P^T  = exp2(S^T * scale * log2 e - lse[q] * log2 e),  dS^T = P^T * (dP^T - delta[q])
    dV  += P^T dO,  dK += dS^T Q                        (RS, from registers)
    dQ   = dS K   (SS, dS^T stored once to smem)  -> smem staging -> bulk fp32 reduce-add

* dQ: after the step's products, the fp32 dQ tile (scaled by ``softmax_scale``) is staged in
  shared memory that aliases the step's own ring stage (Q, dO, and the dS tile; all read by
  then) and added to the XLA-owned fp32 workspace with ``cp.reduce.async.bulk ... add.f32``
  (the bulk-copy engine, asynchronously), each warp for its own 16 accumulator rows after a
  warp-level sync (no CTA barrier). With ``dq_tile`` (the default) the workspace is
  ``(B, H_q, ceil(S_q / 64), 64 D)`` of 64-row query tiles: each warp stores its slice in
  register order (``dq_tiles.stage_warp_slice``, 16-byte conflict-free stores) and adds it
  with ``D / 64`` bulk reductions of 4 KB; ``kernels/dq_tiles.py`` reorders the workspace
  into dq. Without it (``pack_gqa``: packed rows) the workspace is row-major ``(B, S_q, H_q,
  D)``, rows of ``D + 8`` floats are staged and lanes 0-15 add one row each. Before a stage
  is refilled, the bulk reads of it are awaited.
* lse/delta arrive with the step's Q/dO (4-byte ``cp.async`` into a per-stage smem slot,
  +inf / 0 past S_q) and are read from smem under the S/dP wgmmas, so no global load sits
  after a barrier.

docs/performance.md gives the measured worth of each of these choices and where the time
of this kernel goes.

The K->Q CSR entries are software-pipelined two steps ahead in registers, so no dependent
global load of an entry sits between a barrier and the prefetch it feeds.

``causal`` (static): the token-level causal mask inside the listed blocks (key ``j`` visible
from query ``i`` iff ``j <= i + S_kv - S_q``). The CTA first reduces, over its CSR entries, the keys of
its tile that the entry's query rows see (to the diagonal of the block's last row, within
``block_sizes``) and zero-fills the K/V rows past the largest (no query of any entry sees
them, so NaN there never reaches dQ through ``0 * K``); a step whose 64
queries see none of the tile's keys is skipped like an empty one; a step crossing the
diagonal selects 0 into P and dS (``mask.CausalMaskKeyMajor``), a step below it is unmasked.
Rows with ``lse = -inf`` (no visible key) have every pair masked, so they add nothing and get
``dq = 0``. With ``pack_gqa`` the rule applies to each packed row's position (row // r).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.tensor_utils import LayoutEnum

from .bsa_common import (LOG2_E, bwd_entry_rows, bwd_load_kv_tile, bwd_tile_coords,
                         issue_q_do_rows)
from .common import (acc_layout_as_a, acc_mn_view_wg, bulk_reduce_add_f32, elem_ptr,
                     gmem_load_copy, kv_major_bwd_operands, launch, smem_storage)
from .dq_tiles import bulk_add_warp_slice, stage_warp_slice
from .pack_gqa import packed_row, row_tile_view
from .mask import CausalMaskKeyMajor

TILE = 64


def _restage(layout: cute.ComposedLayout, num_stages: int, stage_stride: int) -> cute.ComposedLayout:
    """The one-stage smem layout ``layout`` with a stage mode of ``stage_stride`` elements."""
    outer = cute.append(cute.select(layout.outer, mode=[0, 1]),
                        cute.make_layout(num_stages, stride=stage_stride))
    return cute.make_composed_layout(layout.inner, 0, outer)


class BsaBwdSm90:
    def __init__(self, dtype, head_dim: int, block_size: int, has_block_sizes: bool,
                 pack_gqa: int = 1, causal: bool = False, dq_tile: bool = False):
        self.dtype = dtype
        # dQ into the query-tile workspace (kernels/dq_tiles.py): (B, H_q, ceil(S_q / 64),
        # 64 D) fp32, each warp's 16 x D slice added with D / 64 bulk reductions of 4 KB;
        # else row-major (B, S_q, H_q, D) with one bulk reduction per row
        if dq_tile and pack_gqa > 1:
            raise NotImplementedError("the dQ tile workspace with pack_gqa is not implemented")
        self.dq_tile = dq_tile
        # pack_gqa: r = H_q / H_kv (1: off). The K->Q lists then hold packed query blocks
        # (entries m, one per block: the group is 1), a step is 64 packed rows (64 / r
        # positions x r query heads) and Q, dO, lse, delta, dQ rows are addressed through the
        # packed mapping (kernels/pack_gqa.py); dK/dV sum over the whole group by construction
        self.pack = pack_gqa
        self.causal = causal
        self.hd = head_dim
        self.blk = block_size
        self.sub = block_size // TILE
        self.num_threads = 128
        self.has_sizes = has_block_sizes
        # smem ring [Q0 dO0 dS Q1 dO1] (elements of dtype) and the fp32 dQ staging row stride
        self.q_elems = TILE * head_dim
        self.ring_elems = 4 * self.q_elems + TILE * TILE
        self.dq_stride = head_dim + 8

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
        sdS_layout = sm90_utils.make_smem_layout_a(LayoutEnum.COL_MAJOR, kv_tiler, self.dtype, 1)
        # one ring [Q0 dO0 dS Q1 dO1]: stage s of Q/dO (+ the dS tile) is contiguous and, once
        # the step's products are done, holds that step's fp32 dQ rows for the bulk reduction
        q_elems = self.q_elems
        stage_stride = 2 * q_elems + TILE * TILE
        sQ_layout = _restage(sm90_utils.make_smem_layout_b(LayoutEnum.ROW_MAJOR, s_tiler, self.dtype, 1), 2, stage_stride)
        sQ_mn_layout = _restage(sm90_utils.make_smem_layout_b(LayoutEnum.COL_MAJOR, kv_tiler, self.dtype, 1), 2, stage_stride)

        @cute.struct
        class SharedStorage:
            ring: cute.struct.Align[cute.struct.MemRange[self.dtype, self.ring_elems], 1024]
            sLD: cute.struct.Align[cute.struct.MemRange[cutlass.Float32, 2 * 2 * TILE], 128]
            sK: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sKV_layout)], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sKV_layout)], 1024]

        gmem_copy_in = gmem_load_copy(self.dtype, self.num_threads, hd)
        n_tiles = cute.ceil_div(mK.shape[1], TILE)
        grid = (n_tiles, cute.size(mK.shape[2]), cute.size(mK.shape[0]))
        launch(self.kernel(
            mQ, mK, mV, mdO, mLSE, mDelta, mOffsets, mEntries, mSizes, mScale, mdQacc, mdK, mdV,
            sKV_layout, sKV_mn_layout, sQ_layout, sQ_mn_layout, sdS_layout,
            gmem_copy_in, mma_s, mma_kv, mma_q, SharedStorage,
        ), grid, self.num_threads, SharedStorage, stream,
               min_blocks_per_mp=2, preferred_smem_carveout=100)

    @cute.jit
    def _issue_q_do(self, mQ, mdO, ent, t, n_q_blocks, head_kv, group, batch,
                    seqlen_q, gmem_copy_in, thr_copy, tCc, tQsQ, tdOsdO, stage):
        if cutlass.const_expr(self.pack > 1):
            self._issue_q_do_packed(mQ, mdO, ent, t, n_q_blocks, head_kv, group, batch,
                                    seqlen_q, gmem_copy_in, thr_copy, tCc, tQsQ, tdOsdO, stage)
        else:
            issue_q_do_rows(mQ, mdO, ent, t, n_q_blocks, head_kv, group, batch, seqlen_q,
                            gmem_copy_in, thr_copy, tCc, tQsQ, tdOsdO, stage,
                            self.blk, self.sub, self.hd, TILE)

    @cute.jit
    def _issue_q_do_packed(self, mQ, mdO, ent, t, n_q_blocks, head_kv, group, batch,
                           n_rows, gmem_copy_in, thr_copy, tCc, tQsQ, tdOsdO, stage):
        """cp.async of step ``t``'s 64 packed Q and dO rows, each from its (position, query
        head) row; rows at or past ``n_rows`` (``S_q r``) zero-filled."""
        _, q0 = bwd_entry_rows(ent, t, n_q_blocks, head_kv, group, self.blk, self.sub, TILE)
        for r in cutlass.range_constexpr(cute.size(tQsQ.shape[1])):
            p = q0 + tCc[0, r, 0][0]
            if p < n_rows:
                s, h = packed_row(p, head_kv, self.pack)
                tq = thr_copy.partition_S(row_tile_view(mQ, batch, s, h, TILE, self.hd))
                tdo = thr_copy.partition_S(row_tile_view(mdO, batch, s, h, TILE, self.hd))
                cute.copy(gmem_copy_in, tq[None, r, None], tQsQ[None, r, None, stage])
                cute.copy(gmem_copy_in, tdo[None, r, None], tdOsdO[None, r, None, stage])
            else:
                tQsQ[None, r, None, stage].fill(0)
                tdOsdO[None, r, None, stage].fill(0)

    @cute.jit
    def _issue_lse_delta(self, mLSE, mDelta, ent, t, n_q_blocks, head_kv, group, batch,
                         seqlen_q, tidx, sLD, stage):
        """cp.async (4 bytes per thread) the lse (threads 0-63) or delta (64-127) of the 64
        query rows of step ``t`` of entry ``ent`` into ``sLD[:, kind, stage]``; rows past
        S_q get lse = +inf (so P = 0) and delta = 0."""
        head, q0 = bwd_entry_rows(ent, t, n_q_blocks, head_kv, group, self.blk, self.sub, TILE)
        row = tidx % TILE
        kind = tidx // TILE
        qrow = q0 + row
        dst = cute.make_tensor(sLD.iterator + (row + kind * TILE + stage * 2 * TILE), cute.make_layout(1))
        if qrow < seqlen_q:
            atom = cute.make_copy_atom(cpasync.CopyG2SOp(), cutlass.Float32, num_bits_per_copy=32)
            # the row's (query head, position): itself, or a packed row's
            h_row, s_row = head, qrow
            if cutlass.const_expr(self.pack > 1):
                s_row, h_row = packed_row(qrow, head_kv, self.pack)
            if kind == 0:
                src = cute.make_tensor(elem_ptr(mLSE, (batch, h_row, s_row)), cute.make_layout(1))
                cute.copy(atom, src, dst)
            else:
                src = cute.make_tensor(elem_ptr(mDelta, (batch, h_row, s_row)), cute.make_layout(1))
                cute.copy(atom, src, dst)
        else:
            dst[0] = cutlass.Float32.inf if kind == 0 else cutlass.Float32(0.0)

    @cute.jit
    def _p_ds_key_limit(self, S_mn, dP_mn, tScS_mn, lse2, dlt, limit, scale_log2,
                        n_rows: cutlass.Constexpr, n_cols: cutlass.Constexpr):
        """P and dS in place for key rows below ``limit``, 0 (a select: dP of a non-key may
        be NaN) for the others."""
        for r in cutlass.range_constexpr(n_rows):
            key_ok = tScS_mn[r, 0][0] < limit
            for c in cutlass.range_constexpr(n_cols):
                p = cute.math.exp2(S_mn[r, c] * scale_log2 - lse2[c], fastmath=True)
                ds = p * (dP_mn[r, c] - dlt[c])
                S_mn[r, c] = p if key_ok else cutlass.Float32(0.0)
                dP_mn[r, c] = ds if key_ok else cutlass.Float32(0.0)

    @cute.jit
    def _causal_row_cap(self, mEntries, mSizes, e_begin, n_entries, n_q_blocks, seqlen_q,
                        seqlen_k, batch, head_kv, group, n_block, tile_off, n0, tidx, sLD):
        """Causal: rows of this K/V tile (first key ``n0``) that some query row of its CSR
        entries sees: the largest over the entries (query block ``m`` of head ``h``) of
        ``min((m + 1) blk, S_q) + S_kv - S_q - n0``, capped by ``block_sizes[b, h, n] -
        tile_off`` when given. A strided scan, warp shuffles, then one CTA barrier through
        four Int32 slots of sLD's stage 1 (no copy writes it before step 0's barrier)."""
        cap = cutlass.Int32(-1)
        for e in cutlass.range(tidx, n_entries, self.num_threads, unroll=1):
            ent = mEntries[e_begin + e]
            h_in_group = ent // n_q_blocks
            m = ent - h_in_group * n_q_blocks
            if cutlass.const_expr(self.pack > 1):
                # packed rows (seqlen_q = S_q r): the last row's position is its index // r
                rows = ((cutlass.min((m + 1) * self.blk, seqlen_q) - 1) // self.pack + 1
                        + seqlen_k - seqlen_q // self.pack - n0)
            else:
                rows = cutlass.min((m + 1) * self.blk, seqlen_q) + seqlen_k - seqlen_q - n0
            if cutlass.const_expr(self.has_sizes):
                rows = cutlass.min(rows, mSizes[batch, head_kv * group + h_in_group, n_block]
                                   - tile_off)
            cap = cutlass.max(cap, rows)
        for sh in cutlass.range_constexpr(5):
            cap = cutlass.max(cap, cute.arch.shuffle_sync_bfly(cap, offset=16 >> sh))
        slots = cute.make_tensor(cute.recast_ptr(sLD.iterator + 2 * TILE, dtype=cutlass.Int32),
                                 cute.make_layout(4))
        if tidx % 32 == 0:
            slots[tidx // 32] = cap
        cute.arch.barrier()
        return cutlass.max(cutlass.max(slots[0], slots[1]), cutlass.max(slots[2], slots[3]))

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
        (n_tile, head_kv, batch, seqlen_q, seqlen_k, num_heads_kv, group, n_q_blocks,
         n_kv_blocks, n_block, tile_off, softmax_scale, scale_log2) = bwd_tile_coords(
            mQ, mK, mScale, blk, self.sub, TILE)
        if cutlass.const_expr(self.pack > 1):
            # one KV head's S_q r packed rows in N_qp packed blocks; entries are block ids
            seqlen_q = seqlen_q * self.pack
            group = 1
            n_q_blocks = (seqlen_q + blk - 1) // blk

        storage = smem_storage(SharedStorage)
        sK = storage.sK.get_tensor(sKV_layout.outer, swizzle=sKV_layout.inner)  # (kv, d, 1)
        sV = storage.sV.get_tensor(sKV_layout.outer, swizzle=sKV_layout.inner)
        sK_mn = storage.sK.get_tensor(sKV_mn_layout.outer, swizzle=sKV_mn_layout.inner)
        q_elems = self.q_elems
        ring = storage.ring.data_ptr()
        sQ = cute.make_tensor(cute.recast_ptr(ring, sQ_layout.inner), sQ_layout.outer)  # (q, d, st)
        sdO = cute.make_tensor(cute.recast_ptr(ring + q_elems, sQ_layout.inner), sQ_layout.outer)
        # MN-major aliases of the same bytes: (d, q, st) and (d, kv, 1)
        sQ_mn = cute.make_tensor(cute.recast_ptr(ring, sQ_mn_layout.inner), sQ_mn_layout.outer)
        sdO_mn = cute.make_tensor(cute.recast_ptr(ring + q_elems, sQ_mn_layout.inner), sQ_mn_layout.outer)
        sdS = cute.make_tensor(cute.recast_ptr(ring + 2 * q_elems, sdS_layout.inner), sdS_layout.outer)  # (q, kv, 1)
        # per-stage lse (natural log) and delta of the step's 64 query rows: (row, kind, stage)
        sLD = storage.sLD.get_tensor(cute.make_layout((TILE, 2, 2), stride=(1, TILE, 2 * TILE)))

        row_cap = None
        if cutlass.const_expr(self.causal):
            row_id0 = (batch * num_heads_kv + head_kv) * n_kv_blocks + n_block
            row_cap = self._causal_row_cap(
                mEntries, mSizes, mOffsets[row_id0], mOffsets[row_id0 + 1] - mOffsets[row_id0],
                n_q_blocks, seqlen_q, seqlen_k, batch, head_kv, group, n_block, tile_off,
                n_tile * TILE, tidx, sLD)
        thr_copy, tCc, kv_left, tQsQ, tdOsdO = bwd_load_kv_tile(
            gmem_copy_in, tidx, mK, mV, sK[None, None, 0], sV[None, None, 0], sQ, sdO, mSizes,
            batch, head_kv, group, n_tile, n_block, tile_off, seqlen_k, TILE, hd,
            self.has_sizes, row_cap)

        ((thr_s, thr_kv, thr_q), (tSrK, tPrV, tSrQ, tPrdO, tVrdO, tKrQ, tQrdS, tQrK),
         (acc_dK, acc_dV)) = kv_major_bwd_operands(
            mma_s, mma_kv, mma_q, tidx, sK, sV, sQ, sdO, sQ_mn, sdO_mn, sdS, sK_mn, (TILE, hd))

        tScS_mn = acc_mn_view_wg(thr_s.partition_C(cute.make_identity_tensor((TILE, TILE))))
        n_rows = cute.size(tScS_mn, mode=[0])  # keys owned by this thread
        n_cols = cute.size(tScS_mn, mode=[1])  # queries owned by this thread
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
            self._issue_lse_delta(mLSE, mDelta, ent_cur, 0, n_q_blocks, head_kv, group,
                                  batch, seqlen_q, tidx, sLD, 0)
        cute.arch.cp_async_commit_group()
        dq_stride = self.dq_stride  # fp32 dQ staging row stride (floats)
        # element offset of stage 1's dQ staging: it ends where the ring ends
        stg1_off = self.ring_elems - 2 * TILE * dq_stride
        if cutlass.const_expr(self.dq_tile):
            stg1_off = self.ring_elems - 2 * TILE * hd
        for t in cutlass.range(n_steps, unroll=1):
            stage = t % 2
            ent = ent_cur
            head, q0 = bwd_entry_rows(ent, t, n_q_blocks, head_kv, group, blk, self.sub, TILE)
            q_tile = q0 // TILE
            limit = cutlass.min(kv_left, TILE)
            if cutlass.const_expr(self.has_sizes):
                limit = cutlass.min(limit, mSizes[batch, head, n_block] - tile_off)
            qlo0 = None
            if cutlass.const_expr(self.causal and self.pack > 1):
                # ---- causal, packed rows (seqlen_q = S_q r, q0 a multiple of 64, so of r):
                # column c is position q0 / r + c // r; key row kr is visible from the
                # columns with c // r >= qlo0 + kr
                off = seqlen_k - seqlen_q // self.pack
                limit = cutlass.min(limit, (cutlass.min(q0 + TILE, seqlen_q) - 1) // self.pack
                                    + 1 + off - n_tile * TILE)
                qlo0 = n_tile * TILE - off - q0 // self.pack
            elif cutlass.const_expr(self.causal):
                # ---- causal: keys of the tile that some query of the step sees (none:
                # the step is skipped); key row r is visible from query columns >= qlo0 + r
                off = seqlen_k - seqlen_q
                limit = cutlass.min(limit, cutlass.min(q0 + TILE, seqlen_q) + off - n_tile * TILE)
                qlo0 = n_tile * TILE - off - q0

            cute.arch.cp_async_wait_group(0)  # this thread's copies of step t (and K/V)
            # the bulk dQ reduction of step t-1 has read its smem rows (other stage, dS)
            cute.arch.cp_async_bulk_wait_group(0, read=True)
            cute.arch.fence_proxy("async.shared", space="cta")
            # every copy of step t is visible and every thread has left step t-1, so the
            # other ring stage and sdS are free
            cute.arch.barrier()
            if t + 1 < n_steps:
                self._issue_q_do(mQ, mdO, ent_nxt, t + 1, n_q_blocks, head_kv, group,
                                 batch, seqlen_q, gmem_copy_in, thr_copy, tCc, tQsQ, tdOsdO,
                                 1 - stage)
                self._issue_lse_delta(mLSE, mDelta, ent_nxt, t + 1, n_q_blocks, head_kv,
                                      group, batch, seqlen_q, tidx, sLD, 1 - stage)
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
                # per-query (column) lse in the log2 domain and delta, read under the wgmmas
                lse2 = cute.make_rmem_tensor(n_cols, cutlass.Float32)
                dlt = cute.make_rmem_tensor(n_cols, cutlass.Float32)
                for c in cutlass.range_constexpr(n_cols):
                    qc = tScS_mn[0, c][1]
                    lse2[c] = sLD[qc, 0, stage] * LOG2_E
                    dlt[c] = sLD[qc, 1, stage]
                warpgroup.wait_group(0)

                S_mn = acc_mn_view_wg(acc_S)
                dP_mn = acc_mn_view_wg(acc_dP)
                if cutlass.const_expr(self.causal):
                    if qlo0 + TILE - 1 > 0:
                        # ---- causal: the step crosses the diagonal
                        for r in cutlass.range_constexpr(n_rows):
                            for c in cutlass.range_constexpr(n_cols):
                                p = cute.math.exp2(S_mn[r, c] * scale_log2 - lse2[c],
                                                   fastmath=True)
                                dP_mn[r, c] = p * (dP_mn[r, c] - dlt[c])
                                S_mn[r, c] = p
                        CausalMaskKeyMajor(tScS_mn).apply(S_mn, dP_mn, limit, qlo0, self.pack)
                    else:
                        self._p_ds_key_limit(S_mn, dP_mn, tScS_mn, lse2, dlt, limit,
                                             scale_log2, n_rows, n_cols)
                else:
                    self._p_ds_key_limit(S_mn, dP_mn, tScS_mn, lse2, dlt, limit, scale_log2,
                                         n_rows, n_cols)

                tPr = cute.make_rmem_tensor(acc_layout_as_a(acc_S.layout, mma_kv.tv_layout_A.shape[1]), self.dtype)
                cute.make_tensor(tPr.iterator, acc_S.layout).store(acc_S.load().to(self.dtype))
                tdSr = cute.make_rmem_tensor(acc_layout_as_a(acc_dP.layout, mma_kv.tv_layout_A.shape[1]), self.dtype)
                tdSr_acc = cute.make_tensor(tdSr.iterator, acc_dP.layout)
                tdSr_acc.store(acc_dP.load().to(self.dtype))
                # dS^T -> smem (read back as the MN-major A operand of dQ = dS K)
                tdSr_mn = acc_mn_view_wg(tdSr_acc)
                for r in cutlass.range_constexpr(n_rows):
                    for c in cutlass.range_constexpr(n_cols):
                        sdS_t[tScS_mn[r, c]] = tdSr_mn[r, c]
                cute.arch.fence_proxy("async.shared", space="cta")
                cute.arch.barrier()

                acc_dQ = thr_q.make_fragment_C(thr_q.partition_shape_C((TILE, hd)))
                warpgroup.fence()
                for k in cutlass.range_constexpr(cute.size(tQrdS, mode=[2])):
                    mma_q.set(warpgroup.Field.ACCUMULATE, k != 0)
                    cute.gemm(mma_q, acc_dQ, tQrdS[None, None, k, 0], tQrK[None, None, k, 0], acc_dQ)
                warpgroup.commit_group()
                mma_kv.set(warpgroup.Field.ACCUMULATE, True)
                for k in cutlass.range_constexpr(cute.size(tPr, mode=[2])):
                    cute.gemm(mma_kv, acc_dV, tPr[None, None, k], tVrdO[None, None, k, stage], acc_dV)
                for k in cutlass.range_constexpr(cute.size(tdSr, mode=[2])):
                    cute.gemm(mma_kv, acc_dK, tdSr[None, None, k], tKrQ[None, None, k, stage], acc_dK)
                warpgroup.commit_group()
                warpgroup.wait_group(0)
                # every warp's products have read Q/dO/dS of this stage: reuse it for dQ
                cute.arch.barrier()
                stg = cute.recast_ptr(ring + stage * stg1_off, dtype=cutlass.Float32)
                lane = tidx % 32
                if cutlass.const_expr(self.dq_tile):
                    # warp w: rows 16 w .. 16 w + 15, blocks w + 4 cg of the tile (register
                    # order); lane 0 adds them with one 4 KB bulk reduction each (rows past
                    # S_q hold zeros: zero-filled Q / dO rows, lse = +inf)
                    warp = tidx // 32
                    stage_warp_slice(acc_dQ, stg, lane, warp, 0, 4, 64, softmax_scale)
                    cute.arch.fence_proxy("async.shared", space="cta")
                    cute.arch.sync_warp()
                    if lane == 0:
                        bulk_add_warp_slice(elem_ptr(mdQacc, (batch, head, q_tile, 0)), stg,
                                            warp, 0, hd // 64, 4, 64)
                else:
                    sdQ = cute.make_tensor(stg, cute.make_layout((TILE, hd), stride=(dq_stride, 1)))
                    tdQsdQ = thr_q.partition_C(sdQ)
                    for i in cutlass.range_constexpr(cute.size(acc_dQ)):
                        tdQsdQ[i] = acc_dQ[i] * softmax_scale
                    cute.arch.fence_proxy("async.shared", space="cta")
                    cute.arch.sync_warp()
                    gdQ = cute.local_tile(mdQacc[batch, None, head, None], (TILE, hd), (q_tile, 0))
                    # warp w holds rows 16w..16w+15 of the dQ tile: once its lanes' stores are
                    # fenced for the async proxy and the warp has synced, lanes 0-15 issue one
                    # bulk reduce-add of one row each
                    dq_row = (tidx // 32) * 16 + lane
                    if lane < 16:
                        if q0 + dq_row < seqlen_q:
                            if cutlass.const_expr(self.pack > 1):
                                s_dq, h_dq = packed_row(q0 + dq_row, head_kv, self.pack)
                                bulk_reduce_add_f32(
                                    elem_ptr(mdQacc, (batch, s_dq, h_dq, 0)),
                                    stg + dq_row * dq_stride, hd * 4)
                            else:
                                bulk_reduce_add_f32(
                                    elem_ptr(gdQ, (dq_row, 0)),
                                    stg + dq_row * dq_stride, hd * 4)
                cute.arch.cp_async_bulk_commit_group()

        cute.arch.cp_async_wait_group(0)
        cute.arch.cp_async_bulk_wait_group(0, read=False)  # smem must outlive the bulk reads
        # Epilogue: dK * scale and dV straight from registers, key-row predicated.
        tKc_mn = acc_mn_view_wg(thr_kv.partition_C(cute.make_identity_tensor((TILE, hd))))
        dK_mn = acc_mn_view_wg(acc_dK)
        dV_mn = acc_mn_view_wg(acc_dV)
        for r in cutlass.range_constexpr(cute.size(tKc_mn, mode=[0])):
            row = tKc_mn[r, 0][0]
            if row < kv_left:
                for c in cutlass.range_constexpr(cute.size(tKc_mn, mode=[1])):
                    col = tKc_mn[r, c][1]
                    mdK[batch, n_tile * TILE + row, head_kv, col] = (dK_mn[r, c] * softmax_scale).to(self.dtype)
                    mdV[batch, n_tile * TILE + row, head_kv, col] = dV_mn[r, c].to(self.dtype)
