"""CuTe DSL helpers shared by the HSTU and block-sparse attention kernels (no jax imports).

* ``load_rows(tcopy, tXg, tXs, tXc, limit)``: row-predicated copy of a partitioned
  ``(rows, cols)`` tile (gmem -> smem, e.g. ``cp.async``); rows whose coordinate in the
  identity-tensor partition ``tXc`` is ``>= limit`` are zero-filled instead of read.
* ``store_rows(tcopy, tXr, tXg, tXc, limit)``: the store counterpart (registers -> gmem);
  rows ``>= limit`` are skipped.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute


@cute.jit
def load_rows(tcopy, tXg, tXs, tXc, limit):
    """Copy the rows of a partitioned tile whose row coordinate (from the identity tensor
    partition ``tXc``) is ``< limit``; zero-fill the other rows of the destination ``tXs``."""
    for r in cutlass.range_constexpr(cute.size(tXs.shape[1])):
        if tXc[0, r, 0][0] < limit:
            cute.copy(tcopy, tXg[None, r, None], tXs[None, r, None])
        else:
            tXs[None, r, None].fill(0)


@cute.jit
def store_rows(tcopy, tXr, tXg, tXc, limit):
    """Copy the rows of ``tXr`` whose row coordinate is ``< limit`` to ``tXg``; skip the rest."""
    for r in cutlass.range_constexpr(cute.size(tXr.shape[1])):
        if tXc[0, r, 0][0] < limit:
            cute.copy(tcopy, tXr[None, r, None], tXg[None, r, None])
