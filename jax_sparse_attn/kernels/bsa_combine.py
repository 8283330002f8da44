"""Split-KV combine of the block-sparse attention forward (CuTe DSL, no jax imports).

Inputs: the fp32 partials of the split forward (``bsa_fwd_sm90_ws`` / ``bsa_fwd_sm80`` with
``kv_splits = S > 1``): ``mOp (S, B, H, S_q, D)``, each split's output normalised by its own
softmax denominator, and ``mLp (S, B, H, S_q)``, its natural-log LSE (``-inf``: the split has
no key for the row). Outputs: ``mO`` (logical ``(B, S_q, H, D)`` in the caller's layout, the
input dtype) and ``mLSE (B, H, S_q)`` fp32 natural log:

    m = max_s lse_s,  w_s = exp(lse_s - m),  lse = m + ln(sum_s w_s),
    out = sum_s w_s o_s / sum_s w_s,

the sums taken in split order ``s = 0, 1, ...`` (fixed: bitwise reproducible). A split with
``lse_s = -inf`` has weight 0 (the split forward writes zeros as its partial); a row whose
splits are all empty gets ``out = 0`` and ``lse = -inf`` (no NaN). A NaN LSE propagates.

``D / 4`` threads share a row: each reads 4 contiguous fp32 values of every split (one 128-bit
load), accumulates in fp32 and stores 4 converted values; every thread of the row reads the
row's ``S`` LSE values (the same addresses, served by L1). Rows are numbered ``(b H + h) S_q +
s_q``, so the partial rows a CTA reads are contiguous. Plain loads/stores only.

With a compile-time split count ``kv_splits <= UNROLL_MAX`` the split loops are unrolled and
every load of a row is issued before the first is used (the loads are L2 latency bound
otherwise); else the split count is the runtime extent ``mLp.shape[0]`` and splits with
``lse_s = -inf`` are skipped without reading their partial.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32

VEC = 4  # fp32 elements per thread (128 bits)
UNROLL_MAX = 16  # most splits of the unrolled variant (its partials: 4 * kv_splits registers)
LOG2_E = 1.4426950408889634074


class BsaCombine:
    def __init__(self, dtype, head_dim: int, kv_splits: int = 0):
        if head_dim % VEC or head_dim // VEC > 128:
            raise NotImplementedError(
                f"bsa_combine needs head_dim a multiple of {VEC} and at most {128 * VEC}, "
                f"got {head_dim}")
        self.dtype = dtype
        self.d = head_dim
        self.tpr = head_dim // VEC  # threads per row
        self.num_threads = 128
        self.rows_per_cta = self.num_threads // self.tpr
        # compile-time split count of the unrolled variant (0: runtime count)
        self.kv_splits = kv_splits if 0 < kv_splits <= UNROLL_MAX else 0

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
            if cutlass.const_expr(self.kv_splits > 0):
                self._combine_unrolled(mOp, mLp, mO, mLSE, b, h, s_q, c)
            else:
                self._combine_loop(mOp, mLp, mO, mLSE, b, h, s_q, c, n_splits)

    @cute.jit
    def _combine_unrolled(self, mOp, mLp, mO, mLSE, b, h, s_q, c):
        """One row part, ``kv_splits`` known: all LSE and partial loads first, then the
        merge (an empty split: weight exp(-inf) = 0 times its zero partial)."""
        n = self.kv_splits
        lse_v = cute.make_rmem_tensor((n,), Float32)
        parts = cute.make_rmem_tensor(cute.make_layout((n, VEC), stride=(VEC, 1)), Float32)
        for sp in cutlass.range_constexpr(n):
            lse_v[sp] = Float32(mLp[sp, b, h, s_q])
        for sp in cutlass.range_constexpr(n):
            cute.autovec_copy(cute.local_tile(mOp[sp, b, h, s_q, None], (VEC,), (c,)),
                              parts[sp, None])
        m = -Float32.inf
        for sp in cutlass.range_constexpr(n):
            m = cute.arch.fmax(m, lse_v[sp])
        m_safe = Float32(0.0) if m == -Float32.inf else m
        m_log2 = m_safe * LOG2_E
        w_sum = Float32(0.0)
        acc = cute.make_rmem_tensor((VEC,), Float32)
        acc.fill(0.0)
        for sp in cutlass.range_constexpr(n):
            w = cute.math.exp2(lse_v[sp] * LOG2_E - m_log2, fastmath=True)
            w_sum = w_sum + w
            acc.store(acc.load() + parts[sp, None].load() * w)
        self._store(mO, mLSE, b, h, s_q, c, acc, w_sum, m_safe)

    @cute.jit
    def _combine_loop(self, mOp, mLp, mO, mLSE, b, h, s_q, c, n_splits):
        """One row part, runtime split count: splits with ``lse_s = -inf`` are skipped."""
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
        self._store(mO, mLSE, b, h, s_q, c, acc, w_sum, m_safe)

    @cute.jit
    def _store(self, mO, mLSE, b, h, s_q, c, acc, w_sum, m_safe):
        """``out = acc / w_sum`` in the output dtype and (one thread per row) ``lse = m +
        ln(w_sum)``; 0 and ``-inf`` where ``w_sum = 0``."""
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
