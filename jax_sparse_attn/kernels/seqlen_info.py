"""Per-sequence lengths and offsets of packed (THD, varlen) tensors (no jax imports).

``SeqlenInfo.create(batch, mCuQ, mCuK)`` reads ``cu_seqlens_q/k[batch : batch + 2]`` and
holds ``q_start``, ``seqlen_q``, ``k_start``, ``seqlen_k`` and ``off = seqlen_k - seqlen_q``
(the bottom-right diagonal offset of causal / local windows when ``L_q != L_k``).
``offset_rows(t, start)`` shifts the row mode of a ``(T, ...)`` tensor (a plain tensor or a
TMA coordinate tensor) so that row 0 is the sequence's first row.
"""

from __future__ import annotations

from dataclasses import dataclass

import cutlass.cute as cute
from cutlass import Int32


@dataclass(frozen=True)
class SeqlenInfo:
    q_start: object
    seqlen_q: object
    k_start: object
    seqlen_k: object
    off: object

    @staticmethod
    @cute.jit
    def create(batch, mCuQ: cute.Tensor, mCuK: cute.Tensor):
        q_start = Int32(mCuQ[batch])
        seqlen_q = Int32(mCuQ[batch + 1]) - q_start
        k_start = Int32(mCuK[batch])
        seqlen_k = Int32(mCuK[batch + 1]) - k_start
        return SeqlenInfo(q_start, seqlen_q, k_start, seqlen_k, seqlen_k - seqlen_q)


def offset_rows(t: cute.Tensor, start) -> cute.Tensor:
    """``t`` with its first mode shifted by ``start`` (row 0 = the sequence's first row)."""
    rank = cute.rank(t)
    return cute.domain_offset((start,) + (0,) * (rank - 1), t)


__all__ = ["SeqlenInfo", "offset_rows"]
