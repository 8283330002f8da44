"""dq from the query-tile workspace of the sm90 HSTU backward (CuTe DSL, no jax imports).

With ``dq_tile`` the backward (``hstu_bwd_sm90``) adds each consumer warp's dQ accumulator
slice, in register order, with one bulk reduce-add to an fp32 workspace ``(query tile
slots, H, bm * D)``: slot ``q_start[b] + t`` is canonical query tile ``t`` of sequence ``b``,
and its ``bm * D`` floats are 8 blocks of 1024, one per consumer warp ``c`` (warpgroup
``c // 4``, warp ``w = c % 4``), where float ``4 (32 j + 4 g + q) + 2 h + e`` of block ``c`` is
row ``16 w + 8 h + g``, column ``8 j + 2 q + e`` of the warpgroup's ``64 x 64`` part of the
tile (the m64n64 wgmma accumulator layout). The warpgroups split the head dim at ``bm = 64``
(columns ``64 wg ..``) and the rows at ``bm = 128`` (rows ``64 wg ..``).

This kernel writes ``dq (T, H, D)`` in the input dtype from it, every row exactly once:
one CTA of 256 threads per (slot, head); thread ``32 c + lane`` reads the 16-byte groups
``4 (32 j + lane)`` of block ``c`` (consecutive threads, consecutive addresses) and stores
the two bf16 / fp16 pairs of rows ``r`` and ``r + 8`` that each holds, for the rows inside
the slot's sequence (token ``cu_q[b] + t bm + r``). Slots past the last sequence's tiles do
nothing. ``cu_q`` / ``q_start`` are the sanitised offsets with the pseudo-sequence (every
token belongs to one sequence) and the first slot of every sequence, as the backward's
schedule builds them.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from .common import elem_ptr


class HstuDqFromTiles:
    def __init__(self, dtype, block_m: int, head_dim: int):
        if block_m * head_dim != 8192:
            raise NotImplementedError(
                f"hstu_dq_tiles: block_m * head_dim = {block_m} * {head_dim} is not 8192")
        self.dtype = dtype
        self.bm = block_m
        self.d = head_dim

    @cute.jit
    def __call__(self, mWs, mCuQ, mQStart, mdQ, stream):
        """``mWs`` fp32 ``(slots, H, bm * D)``; ``mCuQ``, ``mQStart`` int32 ``(n + 1,)`` for
        ``n`` sequences (the pseudo-sequence included); ``mdQ`` ``(T, H, D)``."""
        self.kernel(mWs, mCuQ, mQStart, mdQ).launch(
            grid=(cute.size(mWs.shape[0]), cute.size(mWs.shape[1]), 1), block=[256, 1, 1],
            stream=stream)

    @cute.kernel
    def kernel(self, mWs, mCuQ, mQStart, mdQ):
        tidx, _, _ = cute.arch.thread_idx()
        slot, head, _ = cute.arch.block_idx()
        nseq = mCuQ.shape[0] - 1
        if slot < mQStart[nseq]:
            # the sequence of this slot: the last b < nseq with q_start[b] <= slot
            lo = Int32(0)
            hi = Int32(nseq)
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if mQStart[mid] <= slot:
                    lo = mid
                else:
                    hi = mid
            b = lo
            row0 = (slot - mQStart[b]) * self.bm
            lim = mCuQ[b + 1] - mCuQ[b] - row0
            tok0 = mCuQ[b] + row0
            c = tidx // 32
            lane = tidx % 32
            r = (c % 4) * 16 + lane // 4
            col = (lane % 4) * 2
            if cutlass.const_expr(self.bm == 128):
                r += (c // 4) * 64
            else:
                col += (c // 4) * 64
            esize = self.dtype.width // 8
            for j in cutlass.range_constexpr(8):
                src = cute.make_ptr(Float32,
                                    elem_ptr(mWs, (slot, head, c * 1024 + 4 * (32 * j + lane))).toint(),
                                    cute.AddressSpace.gmem, assumed_align=16)
                v = cute.make_rmem_tensor((4,), Float32)
                v.store(cute.make_tensor(src, cute.make_layout(4)).load())
                vb = cute.make_rmem_tensor((4,), self.dtype)
                vb.store(v.load().to(self.dtype))
                pairs = cute.recast_tensor(vb, Int32)
                for h in cutlass.range_constexpr(2):
                    if r + 8 * h < lim:
                        dst = cute.make_ptr(
                            Int32, elem_ptr(mdQ, (tok0 + r + 8 * h, head, col + 8 * j)).toint(),
                            cute.AddressSpace.gmem, assumed_align=2 * esize)
                        cute.make_tensor(dst, cute.make_layout(1))[0] = pairs[h]
