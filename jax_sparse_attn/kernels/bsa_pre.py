"""Block-sparse attention backward preprocessing kernel (CuTe DSL, no jax imports).

One launch computes, for every query row (b, s, h),

    delta[b, h, s] = sum_d dO[b, s, h, d] * O[b, s, h, d]        (fp32)

and zero-fills the same row of the fp32 dQ accumulator that the backward kernels then
update with atomics (so no separate memset is needed; without ``mdQacc``, delta only: the
query-tile dQ workspace is zeroed by XLA). Tensors are the logical
``(B, S, H, D)`` views of either layout (``bhsd`` buffers are presented that way by the
adapter); D is contiguous. ``D / 8`` threads share a row: each loads 8 contiguous 16-bit
elements of O and dO (one 128-bit load each), multiplies in fp32 and the partial sums are
combined with butterfly shuffles inside the row's lane group. Plain loads/stores only,
so it runs on any SM80+ GPU (used on sm_90a).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute

VEC = 8  # 16-bit elements per thread (128 bits)


class BsaPreprocess:
    def __init__(self, dtype, head_dim: int, pdl: bool = False):
        self.dtype = dtype
        self.pdl = pdl
        self.tpr = head_dim // VEC  # threads per row
        self.num_threads = 128
        self.rows_per_cta = self.num_threads // self.tpr
        self.log2_tpr = self.tpr.bit_length() - 1

    @cute.jit
    def __call__(self, mO, mdO, mDelta, mdQacc, stream):
        """``mdQacc`` None: delta only (the backward's dQ workspace is zeroed elsewhere)."""
        total = mO.shape[0] * mO.shape[1] * mO.shape[2]
        grid = (cute.ceil_div(total, self.rows_per_cta), 1, 1)
        self.kernel(mO, mdO, mDelta, mdQacc).launch(
            grid=grid, block=[self.num_threads, 1, 1], stream=stream, use_pdl=self.pdl)

    @cute.kernel
    def kernel(self, mO: cute.Tensor, mdO: cute.Tensor, mDelta: cute.Tensor, mdQacc):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        if cutlass.const_expr(self.pdl):
            # programmatic dependent launch: later kernels may launch at once (they wait for
            # this grid before reading delta); this one waits for its predecessor
            cute.arch.griddepcontrol_launch_dependents()
            cute.arch.griddepcontrol_wait()
        n_b, n_s, n_h = mO.shape[0], mO.shape[1], mO.shape[2]
        total = n_b * n_s * n_h
        row = bidx * self.rows_per_cta + tidx // self.tpr
        c = tidx % self.tpr
        ok = row < total
        rowc = cutlass.min(row, total - 1)  # clamped so that every lane takes part below
        h = rowc % n_h
        s = (rowc // n_h) % n_s
        b = rowc // (n_h * n_s)

        acc = cutlass.Float32(0.0)
        if ok:
            gO = cute.local_tile(mO[b, s, h, None], (VEC,), (c,))
            gdO = cute.local_tile(mdO[b, s, h, None], (VEC,), (c,))
            rO = cute.make_rmem_tensor((VEC,), self.dtype)
            rdO = cute.make_rmem_tensor((VEC,), self.dtype)
            cute.autovec_copy(gO, rO)
            cute.autovec_copy(gdO, rdO)
            fO = rO.load().to(cutlass.Float32)
            fdO = rdO.load().to(cutlass.Float32)
            for i in cutlass.range_constexpr(VEC):
                acc = acc + fO[i] * fdO[i]
            if cutlass.const_expr(mdQacc is not None):
                rZ = cute.make_rmem_tensor((VEC,), cutlass.Float32)
                rZ.fill(0.0)
                cute.autovec_copy(rZ, cute.local_tile(mdQacc[b, s, h, None], (VEC,), (c,)))
        # reduce over the row's lane group (aligned, power-of-two size); all lanes shuffle
        for i in cutlass.range_constexpr(self.log2_tpr):
            acc = acc + cute.arch.shuffle_sync_bfly(acc, offset=self.tpr >> (i + 1))
        if ok and c == 0:
            mDelta[b, h, s] = acc
