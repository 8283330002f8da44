"""Block-sparse attention backward preprocessing kernel (CuTe DSL, no jax imports).

One launch computes, for every query row (b, s, h),

    delta[b, h, s] = sum_d dO[b, s, h, d] * O[b, s, h, d]        (fp32)

and zero-fills the fp32 dQ workspace that the backward kernels then add into (so no
separate memset is needed; without ``mdQacc``, delta only; with ``zero_elems``, only the
workspace's first ``zero_elems`` elements, the backward zeroing the rest itself). The workspace is passed flat
(1-D, any length divisible by 4, 16-byte aligned): the row-major accumulator and the
query-tile workspace are zeroed alike, by 16-byte stores in a grid-stride loop over the
delta launch's threads. Tensors O and dO are the logical ``(B, S, H, D)`` views of either
layout (``bhsd`` buffers are presented that way by the adapter); D is contiguous. ``D / 8``
threads share a row: each loads 8 contiguous 16-bit elements of O and dO (one 128-bit load
each), multiplies in fp32 and the partial sums are combined with butterfly shuffles inside
the row's lane group. Plain loads/stores only, so it runs on any SM80+ GPU (used on
sm_90a).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from .common import elem_ptr

VEC = 8  # 16-bit elements per thread (128 bits)


class BsaPreprocess:
    def __init__(self, dtype, head_dim: int, pdl: bool = False, wait: bool = True,
                 zero_elems: int = 0, rows_per_thread: int = 1):
        self.dtype = dtype
        # > 0: only the workspace's first zero_elems elements (a multiple of 4) are zeroed
        self.zero_elems = zero_elems
        self.pdl = pdl
        # pdl without the wait: launched right after a grid that waited for everything
        # before it and then let this one launch (the deterministic backward's order kernel,
        # ffi.bsa._bwd_det_overlap_entry), so nothing this grid reads is still being written
        self.wait = wait
        self.tpr = head_dim // VEC  # threads per row
        self.num_threads = 128
        self.rows_per_cta = self.num_threads // self.tpr
        self.log2_tpr = self.tpr.bit_length() - 1
        # a CTA takes rows_per_thread * rows_per_cta consecutive rows; each thread issues the
        # loads of its rows_per_thread rows before it reduces any of them
        self.rpt = rows_per_thread

    @cute.jit
    def __call__(self, mO, mdO, mDelta, mdQacc, stream):
        """``mdQacc``: the flat fp32 dQ workspace to zero, or None (delta only)."""
        total = mO.shape[0] * mO.shape[1] * mO.shape[2]
        grid = (cute.ceil_div(total, self.rows_per_cta * self.rpt), 1, 1)
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
            if cutlass.const_expr(self.wait):
                cute.arch.griddepcontrol_wait()
        if cutlass.const_expr(self.rpt > 1):
            self._delta_rows(mO, mdO, mDelta, mdQacc, bidx, tidx)
        else:
            n_b, n_s, n_h = mO.shape[0], mO.shape[1], mO.shape[2]
            total = n_b * n_s * n_h
            row = bidx * self.rows_per_cta + tidx // self.tpr
            c = tidx % self.tpr
            ok = row < total
            if cutlass.const_expr(mdQacc is not None):
                self._zero(mdQacc, Int32(bidx), Int32(tidx), cute.arch.grid_dim()[0])
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
            # reduce over the row's lane group (aligned, power-of-two size); all lanes shuffle
            for i in cutlass.range_constexpr(self.log2_tpr):
                acc = acc + cute.arch.shuffle_sync_bfly(acc, offset=self.tpr >> (i + 1))
            if ok and c == 0:
                mDelta[b, h, s] = acc

    @cute.jit
    def _delta_rows(self, mO, mdO, mDelta, mdQacc, bidx, tidx):
        """``rows_per_thread`` > 1: the CTA's ``rows_per_thread * rows_per_cta`` consecutive
        rows; each thread issues the loads of its rows before it reduces any of them."""
        n_b, n_s, n_h = mO.shape[0], mO.shape[1], mO.shape[2]
        total = n_b * n_s * n_h
        c = tidx % self.tpr
        if cutlass.const_expr(mdQacc is not None):
            self._zero(mdQacc, Int32(bidx), Int32(tidx), cute.arch.grid_dim()[0])
        # every row's loads first (rows_per_thread of them), then the products and sums
        rows, oks, fOs, fdOs = [], [], [], []
        for j in cutlass.range_constexpr(self.rpt):
            row = (bidx * self.rpt + j) * self.rows_per_cta + tidx // self.tpr
            ok = row < total
            rowc = cutlass.min(row, total - 1)  # clamped so that every lane takes part below
            h = rowc % n_h
            s = (rowc // n_h) % n_s
            b = rowc // (n_h * n_s)
            rO = cute.make_rmem_tensor((VEC,), self.dtype)
            rdO = cute.make_rmem_tensor((VEC,), self.dtype)
            if ok:
                gO = cute.local_tile(mO[b, s, h, None], (VEC,), (c,))
                gdO = cute.local_tile(mdO[b, s, h, None], (VEC,), (c,))
                cute.autovec_copy(gO, rO)
                cute.autovec_copy(gdO, rdO)
            rows.append((b, s, h))
            oks.append(ok)
            fOs.append(rO)
            fdOs.append(rdO)
        for j in cutlass.range_constexpr(self.rpt):
            acc = cutlass.Float32(0.0)
            if oks[j]:
                fO = fOs[j].load().to(cutlass.Float32)
                fdO = fdOs[j].load().to(cutlass.Float32)
                for i in cutlass.range_constexpr(VEC):
                    acc = acc + fO[i] * fdO[i]
            # reduce over the row's lane group (aligned, power-of-two size); all lanes shuffle
            for i in cutlass.range_constexpr(self.log2_tpr):
                acc = acc + cute.arch.shuffle_sync_bfly(acc, offset=self.tpr >> (i + 1))
            if oks[j] and c == 0:
                b, s, h = rows[j]
                mDelta[b, h, s] = acc

    @cute.jit
    def _zero(self, mZero, cta, tid, n_cta):
        """Zero the flat fp32 ``mZero``: 16-byte stores, grid-stride over all threads."""
        zero = cute.make_rmem_tensor(4, Float32)
        zero.fill(0.0)
        n_vec = Int32(mZero.shape[0]) // 4
        if cutlass.const_expr(self.zero_elems > 0):
            n_vec = cutlass.min(n_vec, self.zero_elems // 4)
        for i in cutlass.range(cta * self.num_threads + tid, n_vec,
                               Int32(n_cta) * self.num_threads, unroll=2):
            g = cute.make_ptr(Float32, elem_ptr(mZero, (i * 4,)).toint(),
                              cute.AddressSpace.gmem, assumed_align=16)
            cute.make_tensor(g, cute.make_layout(4)).store(zero.load())
