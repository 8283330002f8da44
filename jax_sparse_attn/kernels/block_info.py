"""Which KV tiles a Q tile visits (no jax imports).

``BlockInfo`` (the HSTU forward's range form): for the query rows ``[m0, m1)`` of one sequence
it gives the visible key columns ``[j_lo, j_hi)`` from the window ``(left, right)`` (diagonal
offset ``off = L_k - L_q``), or from the per-tile summary of a ``func`` interval mask that the
host precomputed into the tile schedule (``mTile[slot, 2:5]`` = min interval start, max
interval end, min F0), and the KV tiles ``[n_min, n_max)`` of width ``bn`` that cover them.
Tiles are visited from ``n_max - 1`` down to ``n_min`` (the tile holding the sequence end, the
only one that can be partial, comes first).

A block-sparse forward supplies a different ``BlockInfo`` (a list of KV tiles per Q tile)
with the same ``n_count`` / ``kv_tile(it)`` interface.
"""

from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Int32


@dataclass(frozen=True)
class BlockInfo:
    j_lo: object
    j_hi: object
    f0: object
    n_min: object
    n_max: object
    n_count: object

    def kv_tile(self, it):
        """The KV tile visited in iteration ``it`` (``0 <= it < n_count``)."""
        return self.n_max - 1 - it

    @staticmethod
    @cute.jit
    def create(mTile, slot, m0, m1, seqlen_k, off, left, right, bn: cutlass.Constexpr,
               has_func: cutlass.Constexpr):
        j_lo = Int32(0)
        j_hi = Int32(seqlen_k)  # exclusive
        f0 = Int32(0)
        if cutlass.const_expr(has_func):
            j_lo = cutlass.max(Int32(mTile[slot, 2]), Int32(0))
            j_hi = cutlass.min(Int32(mTile[slot, 3]), seqlen_k)
            f0 = cutlass.min(Int32(mTile[slot, 4]), seqlen_k)
        else:
            if left >= 0:
                j_lo = cutlass.max(m0 + off - left, Int32(0))
            if right >= 0:
                j_hi = cutlass.min(m1 - 1 + off + right + 1, seqlen_k)
        n_min = j_lo // bn
        n_max = n_min
        if j_hi > j_lo:
            n_max = (j_hi + bn - 1) // bn
        return BlockInfo(j_lo, j_hi, f0, n_min, n_max, n_max - n_min)
