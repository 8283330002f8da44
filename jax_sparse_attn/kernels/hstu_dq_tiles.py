"""dq from the query-tile workspace of the sm90 HSTU backward (CuTe DSL, no jax imports).

With ``dq_tile`` the backward (``hstu_bwd_sm90``) adds each consumer warp's dQ accumulator
slice, in register order, with bulk reduce-adds to an fp32 workspace ``(query tile slots,
H, bm * D)``: slot ``q_start[b] + t`` is canonical query tile ``t`` of sequence ``b``, and its
``bm * D`` floats are blocks of 1024 (16 rows x 64 columns, ``kernels/dq_tiles.py``): block
``c = 4 cg + w`` at ``bm = 64`` (rows ``16 w ..``, columns ``64 cg ..``; 8 blocks at D = 128,
16 at D = 256), block ``c = rg`` at ``bm = 128`` (rows ``16 rg ..``, D = 64), where float
``4 (32 j + 4 g + q) + 2 h + e`` of a block is row ``8 h + g``, column ``8 j + 2 q + e`` of it
(the wgmma accumulator layout). D = 128: consumer warp ``c`` (warpgroup ``c // 4``, warp
``c % 4``) adds block ``c``; D = 256: warp ``w`` of warpgroup ``wg`` adds blocks ``4 (2 wg)
+ w`` and ``4 (2 wg + 1) + w``; D = 64: the warpgroups split the rows (``rg = 4 wg + w``).

This kernel writes ``dq (T, H, D)`` in the input dtype from it, every row exactly once:
one CTA of one warp per block (256 threads; 512 at D = 256) per (slot, head) of ``slots +
1`` slots. Thread ``32 c + lane`` loads
the 16-byte groups ``4 (32 j + lane)`` of block ``c`` (consecutive threads, consecutive
addresses; all 8 loads issued before anything else), converts them and writes the bf16 /
fp16 pairs (rows ``r``, ``r + 8``) into a row-major shared tile; then each thread stores
16-byte pieces of the tile's rows that lie inside the slot's sequence (token
``cu_q[b] + t bm + r``). The CTAs of the slots past the last sequence's tiles (at least one:
the extra slot) write zeros to the rows past ``cu_q[n]`` (rows of no sequence), in a
grid-stride loop. ``cu_q`` / ``q_start`` are the sanitised offsets of the ``n`` sequences
(the pseudo-sequence included) and the first slot of every sequence, as the backward's
schedule builds them.

With ``sem`` (the backward's ``det_store`` / ``dq_claim``: the first contribution to a query
tile is stored, the workspace is not zeroed) the backward's int32 ``(slots, H, n)`` counters
come along (``[..., 0]``: the deterministic semaphore, or the claim counter): a (slot, head)
whose counter is still 0 got no contribution, and its rows are written as zeros (whatever
its workspace tile holds).

With ``convert_rows`` > 0 (the backward converted those itself) the CTAs of a slot whose
sequence has keys and at most ``convert_rows`` queries write nothing (``cu_k`` comes along).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.memory
from cutlass import Float32, Int32

from .common import elem_ptr
from .dq_tiles import smem_row_stride, smem_rows_to_gmem, tile_blocks, tile_load, tile_to_smem


class HstuDqFromTiles:
    def __init__(self, dtype, block_m: int, head_dim: int, pdl: bool = False,
                 sem: bool = False, convert_rows: int = 0, rev_heads: bool = False):
        self.pdl = pdl
        # CTA row y takes head H - 1 - y: the heads the backward walked last (its head-major
        # order), whose workspace tiles L2 may still hold, are read first
        self.rev_heads = rev_heads
        # sequences with keys and at most this many queries: written by the backward
        self.convert_rows = convert_rows
        # the semaphores of the deterministic backward tell which tiles got a contribution
        self.sem = sem
        if (block_m, head_dim) not in ((128, 64), (64, 128), (64, 256)):
            raise NotImplementedError(
                f"hstu_dq_tiles: (block_m, head_dim) = ({block_m}, {head_dim}) is not one of "
                "(128, 64), (64, 128), (64, 256)")
        self.dtype = dtype
        self.bm = block_m
        self.d = head_dim
        # one warp per 16 x 64 block of the tile
        self.num_threads = 32 * tile_blocks(block_m, head_dim, 64)

    @cute.jit
    def __call__(self, mWs, mCuQ, mQStart, mdQ, stream, mSem=None, mCuK=None):
        """``mWs`` fp32 ``(slots, H, bm * D)``; ``mCuQ``, ``mQStart`` int32 ``(n + 1,)`` for
        ``n`` sequences (the pseudo-sequence included); ``mdQ`` ``(T, H, D)``; ``mSem`` int32
        ``(slots, H, n)`` (with ``sem``); ``mCuK`` like ``mCuQ`` (with ``convert_rows``)."""

        n_elems = self.bm * smem_row_stride(self.d)

        @cute.struct
        class Smem:
            tile: cute.struct.Align[cute.struct.MemRange[self.dtype, n_elems], 128]

        self.kernel(mWs, mCuQ, mQStart, mdQ, mSem, mCuK, Smem).launch(
            grid=(cute.size(mWs.shape[0]) + 1, cute.size(mWs.shape[1]), 1),
            block=[self.num_threads, 1, 1],
            smem=Smem.size_in_bytes(), stream=stream, use_pdl=self.pdl)

    @cute.jit
    def _load(self, mWs, mSem, slot, head, tidx):
        """This thread's values of workspace tile (slot, head) (zeros with ``sem`` where its
        counter is 0: the tile was never written)."""
        v = tile_load(elem_ptr(mWs, (slot, head, 0)), tidx, 64)
        if cutlass.const_expr(self.sem):
            if mSem[slot, head, 0] == 0:
                v.fill(0.0)
        return v

    @cute.jit
    def _write(self, v, Smem: cutlass.Constexpr, tidx, mdQ, head, row0, lim):
        """The tile's values converted through a row-major shared tile to the rows
        ``row0 ..`` (fewer than ``lim``) of head ``head`` of ``mdQ``."""
        st = cutlass.memory.SmemAllocator().allocate(Smem)
        sbase = st.tile.data_ptr()
        tile_to_smem(v, sbase, tidx, self.bm, self.d, 64, self.dtype)
        cute.arch.barrier()
        smem_rows_to_gmem(sbase, tidx, self.num_threads, mdQ[None, head, None], row0, lim,
                          self.bm, self.d, self.dtype)

    @cute.kernel
    def kernel(self, mWs, mCuQ, mQStart, mdQ, mSem, mCuK, Smem: cutlass.Constexpr):
        tidx, _, _ = cute.arch.thread_idx()
        slot, head, _ = cute.arch.block_idx()
        if cutlass.const_expr(self.rev_heads):
            head = cute.size(mWs.shape[1]) - 1 - head
        bm, d = self.bm, self.d
        esize = self.dtype.width // 8
        chunks = d * esize // 16  # 16-byte pieces per row
        nseq = mCuQ.shape[0] - 1
        if cutlass.const_expr(self.pdl):
            # programmatic dependent launch: wait for the backward's grid
            cute.arch.griddepcontrol_wait()
        total = mQStart[nseq]
        if slot < total:
            v = None
            if cutlass.const_expr(self.convert_rows == 0):
                v = self._load(mWs, mSem, slot, head, tidx)  # loads first
            # the sequence of this slot: the last b < nseq with q_start[b] <= slot
            lo = Int32(0)
            hi = Int32(nseq)
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if mQStart[mid] <= slot:
                    lo = mid
                else:
                    hi = mid
            row0 = (slot - mQStart[lo]) * bm
            if cutlass.const_expr(self.convert_rows == 0):
                self._write(v, Smem, tidx, mdQ, head, mCuQ[lo] + row0,
                            mCuQ[lo + 1] - mCuQ[lo] - row0)
            else:
                skip = Int32(0)
                if mCuQ[lo + 1] - mCuQ[lo] <= self.convert_rows:
                    if mCuK[lo + 1] > mCuK[lo]:
                        skip = Int32(1)  # written by the backward
                if skip == 0:
                    self._write(self._load(mWs, mSem, slot, head, tidx), Smem, tidx, mdQ, head,
                                mCuQ[lo] + row0, mCuQ[lo + 1] - mCuQ[lo] - row0)
        else:
            # rows past cu_q[n] (no sequence): zeros, bm rows per spare CTA and turn
            tail0 = mCuQ[nseq]
            n_rows = mdQ.shape[0] - tail0
            spare = cute.size(mWs.shape[0]) + 1 - total
            zero = cute.make_rmem_tensor((16 // esize,), self.dtype)
            zero.fill(0.0)
            blk = slot - total
            while blk * bm < n_rows:
                for it in cutlass.range_constexpr(bm * chunks // self.num_threads):
                    k = it * self.num_threads + tidx
                    row = blk * bm + k // chunks
                    piece = k % chunks
                    if row < n_rows:
                        g_ptr = cute.make_ptr(
                            self.dtype,
                            elem_ptr(mdQ, (tail0 + row, head, piece * (16 // esize))).toint(),
                            cute.AddressSpace.gmem, assumed_align=16)
                        cute.make_tensor(g_ptr, cute.make_layout(16 // esize)).store(zero.load())
                blk += spare
