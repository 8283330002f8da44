"""CuTe DSL helpers for the HSTU kernels (no jax imports).

The layout views, GEMM loops and row copies are defined in :mod:`.common` (shared with the
BSA kernels) and re-exported here.

* ``smem_layout_16b(rows, cols)``: swizzled smem layout of a row-major ``(rows, cols)``
  tile of 16-bit elements (``cols % 32 == 0``), bank-conflict free for ``ldmatrix``.
* ``transpose_view(t)``: the ``(cols, rows)`` view of a ``(rows, cols)`` smem tensor.
* ``acc_mn_view(t)``: view an ``mma.sync`` m16n8 accumulator-shaped fragment
  ``((2, 2), MMA_M, MMA_N)`` as ``(rows, cols)`` of this thread's values.
* ``acc_to_a_frag(t)``: reinterpret an accumulator-shaped 16-bit fragment as the A operand
  of the m16n8k16 MMA (register reuse of P in ``O += P V``).
* ``tanh_approx(x)``: one MUFU ``tanh.approx.f32``.
* ``pack_pair``, ``tanh_pair``, ``silu_finish_pair``: ``h + h tanh(h)`` of two values in
  packed 16-bit arithmetic (one ``tanh.approx.{bf16,f16}x2``) in three steps, the last of which
  writes the packed A operand of a 16-bit GEMM.
* ``keep_u32(x)``: an opaque redefinition of ``x`` that keeps a register operand of an
  asynchronous wgmma allocated until its ``wait_group``.
* ``scale_pair(w, scale, bf16)``: a packed 16-bit pair times an fp32 scale, rounded once.
* ``finite_below(x)``: ``max.NaN.f32(x, -FLT_MAX)``: -inf becomes the lowest finite float
  (so ``SiLU(2h) = h + h tanh(h)`` gives its limit 0 instead of ``-inf * 0 = NaN``), NaN
  stays NaN.
* ``elem_ptr(t, i)``: pointer to element ``i`` of tensor ``t`` (for ``red``/atomics).
* ``red_add_v2_f32(ptr, a, b)``: vectorized fp32 reduction into global memory (sm_90+);
  ``red_add_v4_f32_at(addr, a, b, c, d)``: the 16-byte one;
  ``red_add_pair(ptr, a, b, vec)``: the 8-byte one when ``vec``, else two scalar reductions
  (:func:`.common.red_add_2xf32`, sm_8x).
* ``gemm_ss(...)``: ``acc += A B`` with both operands loaded from smem via ``ldmatrix``,
  double-buffered over the K mode.
* ``load_rows(...)`` / ``store_rows(...)``: row-predicated tile copies, re-exported from
  :mod:`.common` (shared with the BSA kernels), like the launch, smem, ``ldmatrix`` and
  fragment-conversion helpers.
* ``HstuSm80Kernel``: the static options of the ``mma.sync`` HSTU kernels (their base class).
* ``runtime_scalars(mWin, mScal)``: the window and scale values of the runtime arrays;
  ``tile_setup(...)``: a CTA's work item (block, sequence, tile rows, runtime values);
  ``head_rows(head, ...)``: per-head views of packed tensors from their sequence start.
* ``mask_row_bounds(...)`` / ``mask_row(...)``: per-row window bounds or func endpoints, and
  the element mask of one accumulator row (forward: S; backward: S and dP).
* ``rab_row_setup(...)`` / ``rab_load_tile(...)``: the relative attention bias rows and tile.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass.cutlass_dsl import T, dsl_user_op

# re-exported: the HSTU kernels use them as hc.*
from .common import (acc_mn_view, acc_to_a_frag, cvt_frag, elem_ptr, gemm_rs,  # noqa: F401
                     gemm_ss, red_add_2xf32, gmem_load_copy, gmem_store_copy, inline_asm, launch,
                     ldmatrix_atoms, ldmatrix_slices, mma_frags, load_rows, r2s_copy,
                     smem_layout_16b, smem_parts, smem_storage, smem_struct, store_p_ds,
                     store_rows, transpose_view)
from .common import ld_acquire_s32, st_release_s32, st_shared_v4_f32, wait_at_least  # noqa: F401
from .seqlen_info import SeqlenInfo, offset_rows


def _f32(x, loc, ip):
    return cutlass.Float32(x).ir_value(loc=loc, ip=ip)


@dsl_user_op
def tanh_approx(x, *, loc=None, ip=None):
    return cutlass.Float32(
        inline_asm(T.f32(), [_f32(x, loc, ip)], "tanh.approx.f32 $0, $1;", "=f,f", False,
                   loc, ip))


FLT_LOWEST = -3.4028234663852886e38


@dsl_user_op
def finite_below(x, lowest=FLT_LOWEST, *, loc=None, ip=None):
    """``max.NaN.f32 x, lowest`` (one instruction; NaN propagates, -inf is clamped; ``lowest``
    defaults to -FLT_MAX)."""
    return cutlass.Float32(
        inline_asm(T.f32(), [_f32(x, loc, ip), _f32(lowest, loc, ip)],
                   "max.NaN.f32 $0, $1, $2;", "=f,f,f", False, loc, ip))


@dsl_user_op
def scale_pair(w, scale, bf16: bool, *, loc=None, ip=None):
    """A packed pair of 16-bit values (``uint32``, bf16 or fp16) times an fp32 ``scale``:
    both halves widened to fp32, multiplied, rounded back to the 16-bit type once
    (``cvt.rn``)."""
    t = "bf16" if bf16 else "f16"
    return cutlass.Uint32(
        inline_asm(T.i32(), [cutlass.Uint32(w).ir_value(loc=loc, ip=ip), _f32(scale, loc, ip)],
                   "{\n.reg .b16 lo, hi;\n.reg .f32 a, b;\nmov.b32 {lo, hi}, $1;\n"
                   f"cvt.f32.{t} a, lo;\ncvt.f32.{t} b, hi;\n"
                   "mul.f32 a, a, $2;\nmul.f32 b, b, $2;\n"
                   f"cvt.rn.{t}x2.f32 $0, b, a;\n}}", "=r,r,f", False, loc, ip))


@dsl_user_op
def red_add_v2_f32(ptr, a, b, *, loc=None, ip=None):
    """``red.global.add.v2.f32 [ptr], {a, b}`` (sm_90; 8-byte aligned ``ptr``)."""
    inline_asm(None, [ptr.toint(loc=loc, ip=ip).ir_value(loc=loc, ip=ip), _f32(a, loc, ip),
                      _f32(b, loc, ip)],
               "red.relaxed.gpu.global.add.v2.f32 [$0], {$1, $2};", "l,f,f", True, loc, ip)


@dsl_user_op
def red_add_f32(ptr, a, *, loc=None, ip=None):
    """``red.global.add.f32 [ptr], a`` (4-byte aligned ``ptr``)."""
    inline_asm(None, [ptr.toint(loc=loc, ip=ip).ir_value(loc=loc, ip=ip), _f32(a, loc, ip)],
               "red.relaxed.gpu.global.add.f32 [$0], $1;", "l,f", True, loc, ip)


@dsl_user_op
def prefetch_l2(addr, *, loc=None, ip=None):
    """``prefetch.global.L2 [addr]``: bring the 128-byte line holding global address ``addr``
    (an integer) into the L2 cache; no register result, so the issuing thread never waits."""
    inline_asm(None, [cutlass.Int64(addr).ir_value(loc=loc, ip=ip)], "prefetch.global.L2 [$0];",
               "l", True, loc, ip)


@dsl_user_op
def red_add_v4_f32_at(addr, a, b, c, d, *, loc=None, ip=None):
    """``red.global.add.v4.f32 [addr], {a, b, c, d}`` (sm_90; ``addr``: a 16-byte aligned
    global address as an integer)."""
    inline_asm(None, [cutlass.Int64(addr).ir_value(loc=loc, ip=ip), _f32(a, loc, ip),
                      _f32(b, loc, ip), _f32(c, loc, ip), _f32(d, loc, ip)],
               "red.relaxed.gpu.global.add.v4.f32 [$0], {$1, $2, $3, $4};", "l,f,f,f,f", True,
               loc, ip)


def red_add_pair(ptr, a, b, vec: bool):
    """fp32 ``ptr[0] += a, ptr[1] += b`` (8-byte aligned ``ptr``): one vector reduction when
    ``vec`` (sm_90+), else two scalar ones (sm_8x)."""
    if vec:
        red_add_v2_f32(ptr, a, b)
    else:
        red_add_2xf32(ptr, a, b)


# ---- ordered dQ additions (deterministic backward) -------------------------------------
# One int32 semaphore per (canonical query tile, head) in an XLA-owned zero-initialised
# workspace holds 1 + the KV tile index of the last CTA that added its dQ contribution to
# that query tile. The contributors of a query tile are a contiguous range of KV tiles
# (block_info.QTileRange.covers), added in ascending KV tile order: the CTA of KV tile n
# waits until the semaphore reaches n when tile n - 1 contributes (else it is the first),
# adds, and stores n + 1 with release semantics.
# (the wait / publish primitives are common.ld_acquire_s32, st_release_s32, wait_at_least)


class HstuSm80Kernel:
    """Compile-time settings of the ``mma.sync`` HSTU kernels: element type, head dims, tile
    sizes, warps, func mask (``has_func``, ``func_n`` endpoints per row) and the relative
    attention bias (``has_rab``, ``rab_per_head``)."""

    def __init__(self, dtype, head_dim, head_dim_v, block_m, block_n, num_warps, has_func,
                 func_n, has_rab=False, rab_per_head=False):
        self.dtype = dtype
        self.d = head_dim
        self.dv = head_dim_v
        self.bm = block_m
        self.bn = block_n
        self.num_warps = num_warps
        self.num_threads = num_warps * 32
        self.has_func = has_func
        self.func_n = func_n
        self.has_rab = has_rab
        self.rab_per_head = rab_per_head


def runtime_scalars(mWin, mScal):
    """``(left, right, alpha / 2, 1 / scaling_seqlen)`` from the kernels' runtime arrays
    ``mWin = [left, right]`` and ``mScal = [alpha / 2, 1 / scaling_seqlen]``."""
    return mWin[0], mWin[1], mScal[0], mScal[1]


def tile_setup(mTiles, slot, batch, mCuQ, mCuK, mWin, mScal, size: int, q_rows: bool):
    """A CTA's work item, traced inline: ``(block, seq, start, end, left, right, alpha / 2,
    1 / scaling_seqlen)`` with ``block = mTiles[slot, 1]``, ``seq`` the :class:`SeqlenInfo` of
    sequence ``batch``, ``[start, end)`` the rows of the ``size``-row tile ``block`` of its
    queries (``q_rows``) or keys, and the runtime values of :func:`runtime_scalars`."""
    block = mTiles[slot, 1]
    seq = SeqlenInfo.create(batch, mCuQ, mCuK)
    start = block * size
    end = cutlass.min(start + size, seq.seqlen_q if q_rows else seq.seqlen_k)
    return (block, seq, start, end) + runtime_scalars(mWin, mScal)


def head_rows(head, *tensor_starts):
    """Per-head sequence views, traced inline: for each ``(m, start)``, head ``head`` of the
    ``(T, H, D)`` tensor ``m`` with its rows shifted so that row 0 is ``start``."""
    return tuple(offset_rows(m[None, head, None], start) for m, start in tensor_starts)


BIG = 1 << 30


@cute.jit
def mask_row_bounds(row_f, r, i, mFunc, q_start, off, left, right,
                    has_func: cutlass.Constexpr, func_n: cutlass.Constexpr):
    """Mask bounds of sequence row ``i`` (accumulator row ``r``): with a func mask its
    endpoints go to ``row_f[r, :]`` (returns ``(0, 0)``), else returns the window's visible
    key columns ``[lo, hi]`` (``-BIG`` / ``BIG`` where unbounded)."""
    lo = cutlass.Int32(0)
    hi = cutlass.Int32(0)
    if cutlass.const_expr(has_func):
        for t in cutlass.range_constexpr(func_n):
            row_f[r, t] = mFunc[0, t, q_start + i]
    else:
        lo = -BIG if left < 0 else i + off - left
        hi = BIG if right < 0 else i + off + right
    return lo, hi


@cute.jit
def mask_row(acc_mn, acc2_mn, r, tScS, n0, row_f, lo, hi, has_func: cutlass.Constexpr,
             func_n: cutlass.Constexpr):
    """Zero the masked columns of row ``r`` of the score tile ``acc_mn`` (and of ``acc2_mn``
    unless None) whose first key is ``n0``: visible are ``j < row_f[r, 0]`` or
    ``row_f[r, 2t+1] <= j < row_f[r, 2t+2]`` (func mask), else ``lo <= j <= hi``."""
    for c in cutlass.range_constexpr(cute.size(tScS, mode=[1])):
        j = n0 + tScS[0, c][1]
        valid = cutlass.Boolean(False)
        if cutlass.const_expr(has_func):
            valid = j < row_f[r, 0]
            for t in cutlass.range_constexpr((func_n - 1) // 2):
                valid = valid | ((j >= row_f[r, 2 * t + 1]) & (j < row_f[r, 2 * t + 2]))
        else:
            valid = (j >= lo) & (j <= hi)
        acc_mn[r, c] = acc_mn[r, c] if valid else cutlass.Float32(0.0)
        if cutlass.const_expr(acc2_mn is not None):
            acc2_mn[r, c] = acc2_mn[r, c] if valid else cutlass.Float32(0.0)


@dsl_user_op
def pack_pair(h0, h1, bf16: bool, *, loc=None, ip=None):
    """``cvt.rn.{bf16,f16}x2.f32``: two fp32 values packed (``h0`` in the low half) as a
    ``Uint32``. Side-effecting, so that it stays where it is written (see
    :func:`silu_finish_pair`)."""
    t = "bf16x2" if bf16 else "f16x2"
    return cutlass.Uint32(
        inline_asm(T.i32(), [_f32(h0, loc, ip), _f32(h1, loc, ip)], f"cvt.rn.{t}.f32 $0, $2, $1;",
                   "=r,f,f", True, loc, ip))


@dsl_user_op
def tanh_pair(hh, bf16: bool, *, loc=None, ip=None):
    """``tanh.approx.{bf16,f16}x2`` of a packed pair (one MUFU op for two values);
    side-effecting (see :func:`silu_finish_pair`)."""
    t = "bf16x2" if bf16 else "f16x2"
    return cutlass.Uint32(
        inline_asm(T.i32(), [cutlass.Uint32(hh).ir_value(loc=loc, ip=ip)],
                   f"tanh.approx.{t} $0, $1;", "=r,r", True, loc, ip))


@dsl_user_op
def silu_finish_pair(hh, th, bf16: bool, *, loc=None, ip=None):
    """``fma.rn.{bf16,f16}x2 hh * th + hh``: the packed SiLU pair ``h + h tanh(h)`` from
    :func:`pack_pair` and :func:`tanh_pair`. The three steps are side-effecting so that the
    pack and the tanh stay where they are written (inside the window of the PV GEMM of the
    previous tile, which reads the previous P) and this step, which writes the new P, after
    that GEMM's wait: a new P written while the GEMM that reads the old one runs makes ptxas
    serialize the wgmma (C7513)."""
    t = "bf16x2" if bf16 else "f16x2"
    return cutlass.Uint32(
        inline_asm(T.i32(), [cutlass.Uint32(hh).ir_value(loc=loc, ip=ip),
                             cutlass.Uint32(th).ir_value(loc=loc, ip=ip)],
                   f"fma.rn.{t} $0, $1, $2, $1;", "=r,r,r", True, loc, ip))


@dsl_user_op
def tanh_f16_pair(h0, h1, *, loc=None, ip=None):
    """``tanh`` of two fp32 values with one MUFU op: ``cvt.rn.f16x2.f32`` then
    ``tanh.approx.f16x2``; the packed fp16 results (``h0``'s in the low half) as a
    ``Uint32`` (unpack with :func:`f16_half`). Inputs past the fp16 range become +-inf, whose
    tanh is +-1."""
    asm = ("{\n.reg .b32 hh;\n"
           "cvt.rn.f16x2.f32 hh, $2, $1;\n"
           "tanh.approx.f16x2 $0, hh;\n"
           "}")
    return cutlass.Uint32(
        inline_asm(T.i32(), [_f32(h0, loc, ip), _f32(h1, loc, ip)], asm, "=r,f,f", False,
                   loc, ip))


@dsl_user_op
def f16_half(x, hi: bool, *, loc=None, ip=None):
    """The low (``hi`` False) or high fp16 half of the packed ``x`` as fp32."""
    half = "hi" if hi else "lo"
    asm = ("{\n.reg .f16 lo, hi;\n"
           "mov.b32 {lo, hi}, $1;\n"
           f"cvt.f32.f16 $0, {half};\n"
           "}")
    return cutlass.Float32(
        inline_asm(T.f32(), [cutlass.Uint32(x).ir_value(loc=loc, ip=ip)], asm, "=f,r", False,
                   loc, ip))


@dsl_user_op
def keep_u32(x, *, loc=None, ip=None):
    """An empty side-effecting use and redefinition of ``x``: placed after the
    ``wgmma.wait_group`` of a GEMM that read ``x`` from registers, it keeps the compiler from
    reusing ``x``'s registers while the asynchronous GEMM may still read them."""
    return cutlass.Uint32(
        inline_asm(T.i32(), [cutlass.Uint32(x).ir_value(loc=loc, ip=ip)], "", "=r,0", True,
                   loc, ip))


# ---- relative attention bias (rab) --------------------------------------------------------
# rab is (B, H_rab, N_k, N_k) in gmem; row p = i + L_k - L_q of sequence b, column j = key.
# Rows with p outside [0, lim) and columns j >= lim, lim = min(L_k, N_k), get bias 0 and
# read only a clamped (in-bounds) address, whatever the metadata.


@cute.jit
def rab_row_setup(row_p, row_ok, tScS, row0, off, lim, n_k):
    """Per accumulator row ``r`` of this thread: clamped rab row ``row_p[r]`` and whether
    the row has a bias (``row_ok[r]``); ``row0`` is the tile's first query row."""
    for r in cutlass.range_constexpr(cute.size(row_p)):
        p = row0 + tScS[r, 0][0] + off
        row_ok[r] = cutlass.Int32((p >= 0) & (p < lim))
        row_p[r] = cutlass.max(cutlass.min(p, n_k - 1), 0)


@cute.jit
def rab_load_tile(bias_mn, mRab_bh, row_p, row_ok, tScS, col0, lim, n_k, scale):
    """``bias_mn[r, c] = scale * rab[row_p[r], col0 + col(c)]`` (fp32) where the row and
    column have a bias, else 0 (the load address is always clamped into the tensor)."""
    for r in cutlass.range_constexpr(cute.size(bias_mn, mode=[0])):
        for c in cutlass.range_constexpr(cute.size(bias_mn, mode=[1])):
            j = col0 + tScS[0, c][1]
            x = mRab_bh[row_p[r], cutlass.min(j, n_k - 1)].to(cutlass.Float32)
            ok = (row_ok[r] != 0) & (j < lim)
            bias_mn[r, c] = x * scale if ok else cutlass.Float32(0.0)
