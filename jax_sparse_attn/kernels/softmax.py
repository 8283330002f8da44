"""Online softmax of the SM90 block-sparse forward (the score plug point; no jax imports).

Per query row of this thread (a row's values are spread over the 4 lanes of a quad), the
running max ``m`` of the raw scores and the running (lane-partial) sum ``l`` of
``exp(softmax_scale (s - m))``, both fp32, evaluated in base 2 (``exp2`` of
``s * scale * log2(e) - m * scale * log2(e)``).

* ``step(acc_S_mn, corr)``: one score tile -> probabilities in place; updates ``m``/``l`` and
  stores the correction ``exp(scale (m_old - m_new))`` per row in ``corr`` (the caller rescales
  the O accumulator with ``rescale`` once the PV GEMM that still adds into it has completed).
  A row whose max is still ``-inf`` (every key masked so far) uses 0 as its max, so
  ``-inf - (-inf)`` never turns into NaN.
* ``rescale_threshold`` (static, log2 units; ``None``: the max follows every tile): a row
  keeps its running max until a tile's max exceeds it by more than ``threshold / (scale
  log2 e)``, so most tiles after the first few leave ``corr = 1`` and ``rescale`` skips the O
  multiply for a warp none of whose rows moved (a warp vote). Probabilities are then at most
  ``2^threshold`` instead of 1 (exact in fp32 and 16-bit P); ``m`` and ``l`` stay consistent,
  so ``finalize`` is unchanged (the lazy rescaling of FlashAttention-4).
* ``tree_sum`` (static): a thread's part of a row's sum of probabilities is added pairwise
  (depth ``log2`` of its length) instead of in one chain.
* ``finalize(r)``: ``(1 / l, lse)`` of row ``r`` with ``lse = scale m + ln l`` (natural log),
  and ``(0, -inf)`` for a row without any visible key (``l = 0``).
"""

from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Float32

from .bsa_common import LOG2_E, quad_allreduce_max, quad_allreduce_sum


def _pairwise_sum(vals):
    """Sum of the trace-time list ``vals`` as a balanced tree of additions (plain Python,
    unrolled while tracing)."""
    if len(vals) == 1:
        return vals[0]
    half = len(vals) // 2
    return _pairwise_sum(vals[:half]) + _pairwise_sum(vals[half:])


@dataclass(frozen=True)
class OnlineSoftmax:
    row_max: object
    row_sum: object
    softmax_scale: object
    scale_log2: object
    rescale_threshold: object = None
    tree_sum: bool = False

    @staticmethod
    def create(n_rows: int, softmax_scale, rescale_threshold=None, tree_sum=False):
        row_max = cute.make_rmem_tensor((n_rows,), Float32)
        row_sum = cute.make_rmem_tensor((n_rows,), Float32)
        return OnlineSoftmax(row_max, row_sum, softmax_scale, softmax_scale * LOG2_E,
                             rescale_threshold, tree_sum)

    def reset(self):
        self.row_max.fill(-Float32.inf)
        self.row_sum.fill(0.0)

    @cute.jit
    def step(self, acc_S_mn, corr):
        for r in cutlass.range_constexpr(cute.size(acc_S_mn, mode=[0])):
            s_row = acc_S_mn[r, None].load()
            m_cur = quad_allreduce_max(s_row.reduce(cute.ReductionOp.MAX, -Float32.inf, 0))
            m_prev = self.row_max[r]
            m_new = cute.arch.fmax(m_prev, m_cur)
            if cutlass.const_expr(self.rescale_threshold is not None):
                # keep the stale max unless the new one is far above it (NaN when both are
                # -inf: kept; +inf when only the old one is: moved)
                grow = (m_new - m_prev) * self.scale_log2
                m_new = m_new if grow > Float32(self.rescale_threshold) else m_prev
            m_safe = 0.0 if m_new == -Float32.inf else m_new
            m_scaled = m_safe * self.scale_log2
            p_row = cute.math.exp2(s_row * self.scale_log2 - m_scaled, fastmath=True)
            c = cute.math.exp2(m_prev * self.scale_log2 - m_scaled, fastmath=True)
            if cutlass.const_expr(self.tree_sum):
                # pairwise sum of the thread's part of the row: depth log2(n), not n
                acc_S_mn[r, None] = p_row
                psum = _pairwise_sum([acc_S_mn[r, j]
                                      for j in range(cute.size(acc_S_mn, mode=[1]))])
                self.row_sum[r] = self.row_sum[r] * c + psum
            else:
                self.row_sum[r] = self.row_sum[r] * c + p_row.reduce(cute.ReductionOp.ADD,
                                                                     Float32.zero, 0)
                acc_S_mn[r, None] = p_row
            self.row_max[r] = m_new
            corr[r] = c

    @cute.jit
    def rescale(self, acc_O_mn, corr):
        if cutlass.const_expr(self.rescale_threshold is None):
            self._rescale(acc_O_mn, corr)
        else:
            moved = corr[0] != Float32(1.0)
            for r in cutlass.range_constexpr(1, cute.size(acc_O_mn, mode=[0])):
                moved = moved | (corr[r] != Float32(1.0))
            if cute.arch.vote_any_sync(moved):
                self._rescale(acc_O_mn, corr)

    @cute.jit
    def _rescale(self, acc_O_mn, corr):
        for r in cutlass.range_constexpr(cute.size(acc_O_mn, mode=[0])):
            acc_O_mn[r, None] = acc_O_mn[r, None].load() * corr[r]

    @cute.jit
    def finalize(self, r: cutlass.Constexpr):
        l = quad_allreduce_sum(self.row_sum[r])
        empty = l == 0.0
        inv = 0.0 if empty else cute.arch.rcp_approx(l)
        lse = -Float32.inf
        if not empty:
            lse = self.row_max[r] * self.softmax_scale + cute.math.log(l, fastmath=False)
        return inv, lse


__all__ = ["OnlineSoftmax"]
