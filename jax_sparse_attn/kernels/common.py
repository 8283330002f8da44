"""CuTe DSL helpers shared by the HSTU and block-sparse attention kernels (no jax imports).

* ``load_rows(tcopy, tXg, tXs, tXc, limit)``: row-predicated copy of a partitioned
  ``(rows, cols)`` tile (gmem -> smem, e.g. ``cp.async``); rows whose coordinate in the
  identity-tensor partition ``tXc`` is ``>= limit`` are zero-filled instead of read.
* ``store_rows(tcopy, tXr, tXg, tXc, limit)``: the store counterpart (registers -> gmem);
  rows ``>= limit`` are skipped.
* ``elem_ptr(t, coord)``: pointer to element ``coord`` of tensor ``t`` (for ``red``/bulk ops).
* ``acc_mn_view_wg(acc)`` / ``acc_layout_as_a(c, a_vals)``: a warpgroup-MMA (wgmma)
  accumulator viewed as ``(rows, cols)``, and the register layout of a 16-bit A operand
  built from an accumulator layout (RS wgmma from the score registers).
* ``bulk_reduce_add_f32(gptr, sptr, nbytes)``: asynchronous fp32 reduce-add of a
  shared-memory row into global memory on the bulk-copy engine (sm_90): the dQ reduction
  of the block-sparse backward (``bsa_bwd_sm90``).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import dsl_user_op


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


@dsl_user_op
def elem_ptr(t, coord, *, loc=None, ip=None):
    """Pointer to element ``coord`` of tensor ``t``."""
    return t.iterator + cute.crd2idx(coord, t.layout, loc=loc, ip=ip)


def acc_mn_view_wg(acc: cute.Tensor) -> cute.Tensor:
    """View a wgmma accumulator ``((2, 2, N/8), MMA_M, MMA_N)`` as ``(rows, cols)``."""
    cm = cute.make_layout(acc.layout.shape)
    s, d = cm.shape, cm.stride
    mn = cute.make_layout(
        ((s[0][1], s[1]), (s[0][0], s[0][2], s[2])),
        stride=((d[0][1], d[1]), (d[0][0], d[0][2], d[2])),
    )
    return cute.make_tensor(acc.iterator, cute.composition(acc.layout, mn))


def acc_layout_as_a(c: cute.Layout, a_vals) -> cute.Layout:
    """Register layout of a 16-bit A operand (RS wgmma) built from accumulator layout ``c``.

    The accumulator of a 64xN wgmma holds, per thread, ``(2, 2, N/8)`` values; the A operand
    of one k16 slice holds ``(2, 2, 2)``: pairs of n8 groups form one k16 slice.
    """
    return cute.make_layout(
        (a_vals, c.shape[1], (c.shape[2], cute.size(c, mode=[0]) // cute.size(a_vals))),
        stride=(c.stride[0], c.stride[1], (c.stride[2], cute.size(a_vals, mode=[2]) * c.stride[0][2])),
    )


@dsl_user_op
def bulk_reduce_add_f32(gptr, sptr, nbytes: int, *, loc=None, ip=None):
    """``cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32``: add ``nbytes``
    (a multiple of 16) of fp32 from shared memory ``sptr`` to global ``gptr`` (both 16-byte
    aligned), asynchronously, in this thread's bulk group."""
    llvm.inline_asm(
        None,
        [gptr.toint(loc=loc, ip=ip).ir_value(loc=loc, ip=ip),
         sptr.toint(loc=loc, ip=ip).ir_value(loc=loc, ip=ip)],
        f"cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [$0], [$1], {nbytes};",
        "l,r",
        has_side_effects=True,
        is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT,
        loc=loc,
        ip=ip,
    )
