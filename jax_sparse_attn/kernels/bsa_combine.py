"""Split-KV combine of the block-sparse attention forward (CuTe DSL, no jax imports).

Inputs: the fp32 partials of the split forward (``bsa_fwd_sm90`` / ``bsa_fwd_sm90_ws`` with
``kv_splits = S > 1``): ``mOp (S, B, H, S_q, D)``, each split's output normalised by its own
softmax denominator, and ``mLp (S, B, H, S_q)``, its natural-log LSE (``-inf``: the split has
no key for the row). Outputs: ``mO`` (logical ``(B, S_q, H, D)`` in the caller's layout, the
input dtype) and ``mLSE (B, H, S_q)`` fp32 natural log:

    m = max_s lse_s,  w_s = exp(lse_s - m),  lse = m + ln(sum_s w_s),
    out = sum_s w_s o_s / sum_s w_s,

the sums taken in split order ``s = 0, 1, ...`` (fixed: bitwise reproducible). Splits with
``lse_s = -inf`` are skipped (their partial is never read, so garbage there cannot reach the
result); a row whose splits are all empty gets ``out = 0`` and ``lse = -inf`` (no NaN). A NaN
LSE is not skipped and propagates. The split count is a runtime extent (``mLp.shape[0]``).

``D / 4`` threads share a row: each reads 4 contiguous fp32 values of every non-empty split
(one 128-bit load), accumulates in fp32 and stores 4 converted values; every thread of the
row reads the row's ``S`` LSE values (the same addresses, served by L1). Rows are numbered
``(b H + h) S_q + s_q``, so the partial rows a CTA reads are contiguous. Plain loads/stores
only.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32

VEC = 4  # fp32 elements per thread (128 bits)
LOG2_E = 1.4426950408889634074


class BsaCombine:
    def __init__(self, dtype, head_dim: int):
        if head_dim % VEC or head_dim // VEC > 128:
            raise NotImplementedError(
                f"bsa_combine needs head_dim a multiple of {VEC} and at most {128 * VEC}, "
                f"got {head_dim}")
        self.dtype = dtype
        self.d = head_dim
        self.tpr = head_dim // VEC  # threads per row
        self.num_threads = 128
        self.rows_per_cta = self.num_threads // self.tpr

    @cute.jit
    def __call__(self, mOp, mLp, mO, mLSE, stream):
        total = mLp.shape[1] * mLp.shape[2] * mLp.shape[3]
        grid = (cute.ceil_div(total, self.rows_per_cta), 1, 1)
        self.kernel(mOp, mLp, mO, mLSE).launch(
            grid=grid, block=[self.num_threads, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, mOp: cute.Tensor, mLp: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        n_splits, n_b, n_h, n_s = mLp.shape[0], mLp.shape[1], mLp.shape[2], mLp.shape[3]
        total = n_b * n_h * n_s
        row = bidx * self.rows_per_cta + tidx // self.tpr
        c = tidx % self.tpr
        if row < total:
            s_q = row % n_s
            h = (row // n_s) % n_h
            b = row // (n_s * n_h)
            m = -Float32.inf
            for sp in cutlass.range(n_splits, unroll=1):
                m = cute.arch.fmax(m, Float32(mLp[sp, b, h, s_q]))
            m_safe = Float32(0.0) if m == -Float32.inf else m
            m_log2 = m_safe * LOG2_E
            w_sum = Float32(0.0)
            acc = cute.make_rmem_tensor((VEC,), Float32)
            acc.fill(0.0)
            rP = cute.make_rmem_tensor((VEC,), Float32)
            for sp in cutlass.range(n_splits, unroll=1):
                lse_s = Float32(mLp[sp, b, h, s_q])
                if lse_s != -Float32.inf:
                    w = cute.math.exp2(lse_s * LOG2_E - m_log2, fastmath=True)
                    w_sum = w_sum + w
                    cute.autovec_copy(
                        cute.local_tile(mOp[sp, b, h, s_q, None], (VEC,), (c,)), rP)
                    acc.store(acc.load() + rP.load() * w)
            empty = w_sum == 0.0
            inv = Float32(0.0) if empty else cute.arch.rcp_approx(w_sum)
            rO = cute.make_rmem_tensor((VEC,), self.dtype)
            rO.store((acc.load() * inv).to(self.dtype))
            cute.autovec_copy(rO, cute.local_tile(mO[b, s_q, h, None], (VEC,), (c,)))
            if c == 0:
                lse = -Float32.inf
                if not empty:
                    lse = m_safe + cute.math.log(w_sum, fastmath=False)
                mLSE[b, h, s_q] = lse
