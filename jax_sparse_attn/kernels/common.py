"""CuTe DSL helpers shared by the HSTU and block-sparse attention kernels (no jax imports).

* ``launch(kernel, grid, num_threads, storage_type, stream, **options)``, ``smem_storage``:
  the kernels' launch and their shared-memory struct; ``smem_struct(dtype, **layouts)``: a
  struct of aligned 16-bit buffers.
* ``swizzle_atom_16b`` / ``smem_layout_16b(rows, cols[, stages])``: swizzled smem layouts of
  row-major 16-bit tiles; ``copy_threads_per_row``, ``gmem_load_copy`` (``cp.async``) /
  ``gmem_store_copy``: the matching 128-bit tiled gmem copies.
* ``transpose_view`` / ``transpose_view_staged``, ``acc_mn_view``, ``acc_to_a_frag``: views of smem tiles and
  ``mma.sync`` accumulator fragments; ``gemm_ss`` / ``gemm_rs``: ``ldmatrix``-pipelined
  ``mma.sync`` GEMM loops over K; ``ldmatrix_atoms``, ``ldmatrix_slices``, ``mma_frags``,
  ``smem_parts``, ``r2s_copy``, ``cvt_frag``, ``store_p_ds``: the ``ldmatrix`` atoms and
  copies, operand fragments and smem partitions, register -> smem copies and fragment
  conversions of the ``mma.sync`` kernels.

* ``load_rows(tcopy, tXg, tXs, tXc, limit)``: row-predicated copy of a partitioned
  ``(rows, cols)`` tile (gmem -> smem, e.g. ``cp.async``); rows whose coordinate in the
  identity-tensor partition ``tXc`` is ``>= limit`` are zero-filled instead of read.
* ``store_rows(tcopy, tXr, tXg, tXc, limit)``: the store counterpart (registers -> gmem);
  rows ``>= limit`` are skipped.
* ``elem_ptr(t, coord)``: pointer to element ``coord`` of tensor ``t`` (for ``red``/bulk ops).
* ``tma_view(m, d[, d_first])``: a ``(..., rows, heads, D)`` tensor (THD or BSHD) as the
  ``(rows, D, heads, ...)`` or ``(D, rows, heads, ...)`` view that the TMA atoms tile.
* ``kv_major_bwd_operands(...)``: thread slices, smem operand fragments and dK/dV
  accumulators of the wgmma GEMMs of a KV-major attention backward (``bsa_bwd_sm90``,
  ``hstu_bwd_sm90``).
* ``acc_mn_view_wg(acc)`` / ``acc_layout_as_a(c, a_vals)``: a warpgroup-MMA (wgmma)
  accumulator viewed as ``(rows, cols)``, and the register layout of a 16-bit A operand
  built from an accumulator layout (RS wgmma from the score registers).
* ``bulk_reduce_add_f32(gptr, sptr, nbytes)``: asynchronous fp32 reduce-add of a
  shared-memory row into global memory on the bulk-copy engine (sm_90): the dQ reduction
  of the block-sparse backward (``bsa_bwd_sm90``); ``st_shared_v4_f32(sptr, a, b, c, d)``:
  one 16-byte shared-memory store of four fp32 (the dQ staging of the query-tile
  workspaces, ``dq_tiles``).
* ``l2_policy(priority)``: an L2 eviction policy for TMA copies and bulk operations;
  ``l2_copy_kw(enabled, priority)``: a TMA copy's keyword for one;
  ``bulk_reduce_add_f32_hint``: the fp32 bulk reduce-add with one.
* ``red_add_2xf32(ptr, a, b)``: ``ptr[0] += a; ptr[1] += b`` as two scalar
  ``red.global.add.f32`` (every arch from sm_70; the portable form of the 8-byte vector
  ``red.global.add.v2.f32``, which needs sm_90 or later).
* ``ld_acquire_s32`` / ``st_release_s32`` / ``wait_at_least``: an int32 counter in global
  memory that one thread waits on and publishes (the ordered dQ additions of the
  deterministic backwards); ``ld_relaxed_s32`` / ``fence_acq_rel_gpu``: the relaxed poll
  and its one fence (``wait_at_least(..., relaxed=True)``).
* ``exp2_poly3(x)``: ``2**x`` on the FMA and integer pipes instead of the MUFU unit (a
  degree-3 polynomial of the fraction and the exponent added to the bits; relative error
  1.02e-4, 0 below -126.5, +inf from 127.5, NaN stays NaN): part of a tile's exponentials moved
  off the MUFU unit where two warpgroups' exponentials collide on it.
* ``inline_asm(...)``: one PTX statement as inline assembly (the helpers' building block).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.memory
from cutlass._mlir.dialects import llvm
from cutlass.cute.nvgpu import cpasync, warp
from cutlass.cutlass_dsl import T, dsl_user_op


def launch(kernel, grid, num_threads: int, storage_type, stream, **options):
    """Launch ``kernel`` (a ``@cute.kernel`` call) on ``grid`` with ``num_threads`` threads per
    CTA and the dynamic shared memory of the ``@cute.struct`` ``storage_type`` on ``stream``;
    ``options``: further launch options (``min_blocks_per_mp``, ``preferred_smem_carveout``)."""
    kernel.launch(grid=grid, block=[num_threads, 1, 1], smem=storage_type.size_in_bytes(),
                  stream=stream, **options)


def smem_storage(storage_type):
    """The CTA's shared memory as an instance of the ``@cute.struct`` ``storage_type``."""
    return cutlass.memory.SmemAllocator().allocate(storage_type)


def smem_struct(dtype, **buffers):
    """A ``@cute.struct`` of shared-memory buffers of ``dtype``, each 1024-byte aligned: one
    member per keyword, in keyword order, sized by the given smem layout (its cosize)."""
    members = {name: cute.struct.Align[cute.struct.MemRange[dtype, cute.cosize(layout)], 1024]
               for name, layout in buffers.items()}
    return cute.struct(type("SharedStorage", (), {"__annotations__": members}))


def swizzle_atom_16b(cols: int):
    """The swizzled ``(8, 64)`` (``cols % 64 == 0``) or ``(8, 32)`` smem atom of row-major
    16-bit tiles, bank-conflict free for ``ldmatrix`` and the 128-bit copies."""
    kblock = 64 if cols % 64 == 0 else 32
    bits = 3 if kblock == 64 else 2
    return cute.make_composed_layout(
        cute.make_swizzle(bits, 3, 3), 0, cute.make_layout((8, kblock), stride=(kblock, 1))
    )


def smem_layout_16b(rows: int, cols: int, stages: int | None = None):
    """Swizzled smem layout of a row-major ``(rows, cols)`` 16-bit tile (``cols % 32 == 0``),
    or ``(rows, cols, stages)`` with one such tile per stage."""
    if stages is None:
        return cute.tile_to_shape(swizzle_atom_16b(cols), (rows, cols), (0, 1))
    return cute.tile_to_shape(swizzle_atom_16b(cols), (rows, cols, stages), (0, 1, 2))


def copy_threads_per_row(cols: int, elems_per_copy: int = 8) -> int:
    """Threads per row of the tiled gmem<->smem copies that match ``swizzle_atom_16b``
    (``elems_per_copy`` 16-bit elements per copy: 8 for 128-bit copies)."""
    kblock = 64 if cols % 64 == 0 else 32
    return kblock // elems_per_copy


def _gmem_thr_val_layouts(dtype, num_threads: int, cols: int, copy_bits: int):
    """Thread/value layouts of a 128-bit-vectorized copy of a row-major ``(rows, cols)`` tile."""
    elems = copy_bits // dtype.width
    tpr = copy_threads_per_row(cols, elems)
    thr_layout = cute.make_layout((num_threads // tpr, tpr), stride=(tpr, 1))
    val_layout = cute.make_layout((1, elems))
    return thr_layout, val_layout


def gmem_load_copy(dtype, num_threads: int, cols: int, copy_bits: int = 128):
    """Tiled ``cp.async`` (global -> shared, L2-only caching) copy of ``(rows, cols)`` tiles."""
    thr_layout, val_layout = _gmem_thr_val_layouts(dtype, num_threads, cols, copy_bits)
    return cute.make_tiled_copy_tv(
        cute.make_copy_atom(
            cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL),
            dtype,
            num_bits_per_copy=copy_bits,
        ),
        thr_layout,
        val_layout,
    )


def gmem_store_copy(dtype, num_threads: int, cols: int, copy_bits: int = 128):
    """Tiled vectorized register -> global copy with the thread layout of :func:`gmem_load_copy`."""
    thr_layout, val_layout = _gmem_thr_val_layouts(dtype, num_threads, cols, copy_bits)
    return cute.make_tiled_copy_tv(
        cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), dtype, num_bits_per_copy=copy_bits),
        thr_layout,
        val_layout,
    )


def transpose_view(t):
    """``(cols, rows)`` view of a ``(rows, cols)`` tensor (no data movement)."""
    rows, cols = cute.size(t, mode=[0]), cute.size(t, mode=[1])
    return cute.composition(t, cute.make_layout((cols, rows), stride=(rows, 1)))


def transpose_view_staged(t: cute.Tensor) -> cute.Tensor:
    """``(cols, rows, stages)`` view of a ``(rows, cols, stages)`` tensor."""
    rows = cute.size(t, mode=[0])
    cols = cute.size(t, mode=[1])
    stages = cute.size(t, mode=[2])
    return cute.composition(
        t, cute.make_layout((cols, rows, stages), stride=(rows, 1, rows * cols))
    )


def acc_mn_view(t):
    """``mma.sync`` accumulator ``((2, 2), MMA_M, MMA_N)`` -> ``((2, MMA_M), (2, MMA_N))``:
    the ``(rows, cols)`` view of this thread's values."""
    lay = cute.make_layout(t.layout.shape)
    mn = cute.make_layout(
        ((lay.shape[0][1], lay.shape[1]), (lay.shape[0][0], lay.shape[2])),
        stride=((lay.stride[0][1], lay.stride[1]), (lay.stride[0][0], lay.stride[2])),
    )
    return cute.make_tensor(t.iterator, cute.composition(t.layout, mn))


def acc_to_a_frag(t):
    """``(4, MMA_M, MMA_N)`` accumulator-shaped 16-bit fragment -> the m16n8k16 A fragment
    ``((4, 2), MMA_M, MMA_N / 2)`` (two neighbouring n8 tiles form one k16 tile)."""
    div = cute.logical_divide(t.layout, (None, None, 2))
    lay = cute.make_layout(
        ((div.shape[0], div.shape[2][0]), div.shape[1], div.shape[2][1]),
        stride=((div.stride[0], div.stride[2][0]), div.stride[1], div.stride[2][1]),
    )
    return cute.make_tensor(t.iterator, lay)


def ldmatrix_atoms(dtype):
    """The ``ldmatrix.x4`` copy atoms of 16-bit smem tiles: ``(plain, transposed)``."""
    return (cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=False, num_matrices=4), dtype),
            cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=True, num_matrices=4), dtype))


def ldmatrix_slices(tiled_mma, tidx, atom_A, atom_B):
    """This thread's slices of the ``ldmatrix`` smem -> register copies of ``tiled_mma``'s A
    and B operands (copy atoms ``atom_A`` / ``atom_B``)."""
    return (cute.make_tiled_copy_A(atom_A, tiled_mma).get_slice(tidx),
            cute.make_tiled_copy_B(atom_B, tiled_mma).get_slice(tidx))


def mma_frags(thr_mma, sA, sB):
    """Register fragments of the A and B operands of the MMA slice ``thr_mma`` for the smem
    tiles ``sA`` / ``sB`` (one stage)."""
    return (thr_mma.make_fragment_A(thr_mma.partition_A(sA)),
            thr_mma.make_fragment_B(thr_mma.partition_B(sB)))


def smem_parts(s2r_A, s2r_B, sA, sB):
    """This thread's source partitions of the smem tiles ``sA`` / ``sB`` for the ``ldmatrix``
    slices ``s2r_A`` / ``s2r_B``."""
    return s2r_A.partition_S(sA), s2r_B.partition_S(sB)


def r2s_copy(dtype, tiled_mma):
    """Tiled register -> smem copy of ``tiled_mma``'s accumulator-shaped fragments."""
    return cute.make_tiled_copy_C(cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), dtype),
                                  tiled_mma)


def cvt_frag(acc, dtype, scale=None):
    """``acc`` (times ``scale`` when given) converted into a new ``dtype`` register fragment."""
    r = cute.make_fragment_like(acc, dtype)
    r.store((acc.load() if scale is None else acc.load() * scale).to(dtype))
    return r


def store_p_ds(r2s, r2s_thr, acc_S, acc_dP, tPsP, tdSsdS, dtype):
    """The backward's P and dS tiles (fp32 accumulators) as ``dtype`` into smem (through the
    copy ``r2s`` and its thread slice ``r2s_thr``), then a CTA barrier."""
    rP = cvt_frag(acc_S, dtype)
    rdS = cvt_frag(acc_dP, dtype)
    cute.copy(r2s, r2s_thr.retile(rP), tPsP)
    cute.copy(r2s, r2s_thr.retile(rdS), tdSsdS)
    cute.arch.barrier()


@cute.jit
def gemm_ss(tiled_mma, acc, tCrA, tCrB, tCsA, tCsB, s2r_A, s2r_B, tCrA_view=None,
            tCrB_view=None):
    """``acc += A @ B`` with A, B loaded smem->registers by ``ldmatrix`` one K slice ahead of
    the MMA. ``tCr*_view``: the register fragments retiled for the copies (default:
    ``s2r_*.retile(tCr*)``)."""
    if cutlass.const_expr(tCrA_view is None):
        tCrA_view = s2r_A.retile(tCrA)
    if cutlass.const_expr(tCrB_view is None):
        tCrB_view = s2r_B.retile(tCrB)
    nk = cute.size(tCsA.shape[2])
    cute.copy(s2r_A, tCsA[None, None, 0], tCrA_view[None, None, 0])
    cute.copy(s2r_B, tCsB[None, None, 0], tCrB_view[None, None, 0])
    for k in cutlass.range_constexpr(nk):
        if cutlass.const_expr(k + 1 < nk):
            cute.copy(s2r_A, tCsA[None, None, k + 1], tCrA_view[None, None, k + 1])
            cute.copy(s2r_B, tCsB[None, None, k + 1], tCrB_view[None, None, k + 1])
        cute.gemm(tiled_mma, acc, tCrA[None, None, k], tCrB[None, None, k], acc)


@cute.jit
def gemm_rs(tiled_mma, acc, tCrA, tCrB, tCsB, s2r_B, tCrB_view=None):
    """``acc += A @ B`` with A already in registers and B loaded from smem one K slice ahead
    (``tCrB_view`` as in :func:`gemm_ss`)."""
    if cutlass.const_expr(tCrB_view is None):
        tCrB_view = s2r_B.retile(tCrB)
    nk = cute.size(tCsB.shape[2])
    cute.copy(s2r_B, tCsB[None, None, 0], tCrB_view[None, None, 0])
    for k in cutlass.range_constexpr(nk):
        if cutlass.const_expr(k + 1 < nk):
            cute.copy(s2r_B, tCsB[None, None, k + 1], tCrB_view[None, None, k + 1])
        cute.gemm(tiled_mma, acc, tCrA[None, None, k], tCrB[None, None, k], acc)


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


@cute.jit
def stage_acc_swz(acc, coords, sbase, d: cutlass.Constexpr, bf16: cutlass.Constexpr,
                  scale=None):
    """A thread's wgmma accumulator ``acc`` (fp32; ``coords``: the (row, column) of each
    value, columns in adjacent pairs) into the row-major ``(rows, d)`` 16-bit shared tile at
    ``sbase`` (``d`` a multiple of 32), each value times ``scale`` when given, as packed
    4-byte pair stores. The tile's 16-byte chunks are XOR-swizzled by row (chunk ``c`` of
    row ``r`` at chunk ``c ^ (r % m)``, ``m = min(d / 8, 8)``), so from ``d = 64`` on the
    eight rows a warp writes per store land in eight different chunks of their 128-byte
    window (no bank conflicts; two-way at ``d = 32``); read it back with
    :func:`swz_rows_to_gmem`."""
    mask = min(d // 8, 8) - 1
    for e2 in cutlass.range_constexpr(cute.size(acc) // 2):
        row = coords[2 * e2][0]
        col = coords[2 * e2][1]
        off = row * d + ((((col >> 3) ^ (row & mask)) << 3) | (col & 7))
        lo, hi = acc[2 * e2], acc[2 * e2 + 1]
        if cutlass.const_expr(scale is not None):
            lo, hi = lo * scale, hi * scale
        st_shared_pair16(sbase + off, lo, hi, bf16)


@cute.jit
def stage_acc_sw128(acc, coords, sbase, rows: cutlass.Constexpr, d: cutlass.Constexpr,
                    bf16: cutlass.Constexpr, scale=None):
    """A thread's wgmma accumulator ``acc`` (fp32; ``coords``: the (row, column) of each
    value, columns in adjacent pairs) into the 16-bit ``(rows, d)`` shared tile at ``sbase``
    in the layout of a K-major wgmma operand with the 128-byte swizzle (``d`` a multiple of
    64): 64-column panels one after the other, each row-major with 128-byte rows whose
    16-byte chunk ``c`` is stored at chunk ``c ^ (row % 8)`` -- the layout a TMA tensor store
    with the 128-byte swizzle reads (boxes of ``(rows, 64)``). Each value times ``scale``
    when given, as packed 4-byte pair stores; the eight rows a warp writes per store land in
    eight different chunks (no bank conflicts)."""
    for e2 in cutlass.range_constexpr(cute.size(acc) // 2):
        row = coords[2 * e2][0]
        col = coords[2 * e2][1]
        off = ((col >> 6) * (rows * 64) + row * 64
               + (((((col >> 3) & 7) ^ (row & 7)) << 3) | (col & 7)))
        lo, hi = acc[2 * e2], acc[2 * e2 + 1]
        if cutlass.const_expr(scale is not None):
            lo, hi = lo * scale, hi * scale
        st_shared_pair16(sbase + off, lo, hi, bf16)


@cute.jit
def swz_piece_ptr(sbase, row, piece, d: cutlass.Constexpr, dtype: cutlass.Constexpr):
    """Shared pointer of 16-byte piece ``piece`` of row ``row`` of a tile written by
    :func:`stage_acc_swz`."""
    per = 16 // (dtype.width // 8)
    off = row * d + ((piece ^ (row & (min(d // per, 8) - 1))) * per)
    return cute.make_ptr(dtype, (sbase + off).toint(), cute.AddressSpace.smem, assumed_align=16)


@cute.jit
def swz_rows_to_gmem(sbase, tidx, n_threads: cutlass.Constexpr, gRows, row0, lim,
                     bm: cutlass.Constexpr, d: cutlass.Constexpr, dtype: cutlass.Constexpr):
    """Rows ``r < lim`` of the ``(bm, d)`` tile of :func:`stage_acc_swz` at ``sbase`` to rows
    ``row0 + r`` of the 2-D ``(rows, d)`` tensor ``gRows`` (D contiguous) in 16-byte pieces,
    consecutive threads on consecutive pieces (``n_threads`` divides the tile's pieces)."""
    per = 16 // (dtype.width // 8)
    chunks = d // per
    for it in cutlass.range_constexpr(bm * chunks // n_threads):
        k = it * n_threads + tidx
        row = k // chunks
        piece = k % chunks
        if row < lim:
            g_ptr = cute.make_ptr(dtype, elem_ptr(gRows, (row0 + row, piece * per)).toint(),
                                  cute.AddressSpace.gmem, assumed_align=16)
            cute.make_tensor(g_ptr, cute.make_layout(per)).store(
                cute.make_tensor(swz_piece_ptr(sbase, row, piece, d, dtype),
                                 cute.make_layout(per)).load())


def tma_view(m, d: int, d_first: bool = False):
    """``m`` of shape ``(..., rows, heads, D)`` (THD or BSHD; D contiguous, extent ``d``) as
    ``(rows, d, heads, ...)`` (tiles of rows: the K-major operands) or, with ``d_first``,
    ``(d, rows, heads, ...)`` (the MN-major B operand), the leading (batch) modes last."""
    n = len(m.shape)
    rows = (m.shape[n - 3], m.stride[n - 3])
    heads = (m.shape[n - 2], m.stride[n - 2])
    modes = ((d, 1), rows) if d_first else (rows, (d, 1))
    modes += (heads,) + tuple((m.shape[i], m.stride[i]) for i in range(n - 3))
    return cute.make_tensor(m.iterator, cute.make_layout(
        tuple(e for e, _ in modes), stride=tuple(s for _, s in modes)))


def kv_major_bwd_operands(mma_s, mma_kv, mma_dq, tidx, sK, sV, sQ, sdO, sQ_mn, sdO_mn, sdS,
                          sK_mn, kv_shape, uniform_frags: bool = False):
    """Per-thread wgmma operands of a KV-major backward (one CTA per KV tile), three groups:
    the slices ``(thr_s, thr_kv, thr_dq)`` of thread ``tidx``; the smem fragments
    ``(tSrK, tSrV, tSrQ, tSrdO)`` of ``S^T = K Q^T`` and ``dP^T = V dO^T``, ``(tVrdO, tKrQ)``
    (MN-major B of ``dV += P^T dO`` and ``dK += dS^T Q``; A comes from registers) and
    ``(tQrdS, tQrK)`` of ``dQ = dS K`` (``*_mn``: MN-major views of the same smem); the
    zeroed fp32 accumulators ``(acc_dK, acc_dV)`` of shape ``kv_shape``."""
    thr_s = mma_s.get_slice(tidx)
    thr_kv = mma_kv.get_slice(tidx)
    thr_dq = mma_dq.get_slice(tidx)
    # the shared-memory operands of a warpgroup MMA are the same for its 128 threads:
    # ``uniform_frags`` partitions them with the warpgroup's first thread, a warp-uniform
    # value, so that their descriptors are uniform-datapath arithmetic (else every
    # descriptor is computed per thread and moved to a uniform register before its GEMM)
    fs, fkv, fdq = thr_s, thr_kv, thr_dq
    if uniform_frags:
        wg0 = cute.arch.make_warp_uniform(tidx // 128) * 128
        fs, fkv, fdq = mma_s.get_slice(wg0), mma_kv.get_slice(wg0), mma_dq.get_slice(wg0)
    frags = (fs.make_fragment_A(fs.partition_A(sK)),
             fs.make_fragment_A(fs.partition_A(sV)),
             fs.make_fragment_B(fs.partition_B(sQ)),
             fs.make_fragment_B(fs.partition_B(sdO)),
             fkv.make_fragment_B(fkv.partition_B(sdO_mn)),
             fkv.make_fragment_B(fkv.partition_B(sQ_mn)),
             fdq.make_fragment_A(fdq.partition_A(sdS)),
             fdq.make_fragment_B(fdq.partition_B(sK_mn)))
    acc_dK = thr_kv.make_fragment_C(thr_kv.partition_shape_C(kv_shape))
    acc_dV = thr_kv.make_fragment_C(thr_kv.partition_shape_C(kv_shape))
    acc_dK.fill(0.0)
    acc_dV.fill(0.0)
    return (thr_s, thr_kv, thr_dq), frags, (acc_dK, acc_dV)


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


def inline_asm(result_type, operands, asm: str, constraints: str, side_effects: bool, loc, ip):
    """One PTX ``asm`` statement (AT&T dialect, no stack alignment) on the MLIR values
    ``operands``; ``result_type`` None for a statement without result. The building block
    of the single-instruction helpers here and in :mod:`.hstu_common`."""
    return llvm.inline_asm(
        result_type,
        operands,
        asm,
        constraints,
        has_side_effects=side_effects,
        is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT,
        loc=loc,
        ip=ip,
    )


@dsl_user_op
def clock_ordered(*, loc=None, ip=None):
    """The SM clock (``%clock``) as a side-effecting ``asm`` with a memory clobber: unlike
    ``cute.arch.clock`` it is neither moved across memory operations and other side effects
    nor recomputed where its value is used (diagnostics that time parts of a kernel)."""
    return cutlass.Int32(inline_asm(T.i32(), [], "mov.u32 $0, %clock;", "=r,~{memory}", True,
                                     loc, ip))


def _bulk_shared_to_global(instr, gptr, sptr, nbytes, loc, ip):
    """``instr [gptr], [sptr], nbytes;``: a bulk operation from shared to global memory."""
    inline_asm(
        None,
        [gptr.toint(loc=loc, ip=ip).ir_value(loc=loc, ip=ip),
         sptr.toint(loc=loc, ip=ip).ir_value(loc=loc, ip=ip)],
        f"{instr} [$0], [$1], {nbytes};", "l,r", True, loc, ip)


@dsl_user_op
def bulk_reduce_add_f32(gptr, sptr, nbytes: int, *, loc=None, ip=None):
    """``cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32``: add ``nbytes``
    (a multiple of 16) of fp32 from shared memory ``sptr`` to global ``gptr`` (both 16-byte
    aligned), asynchronously, in this thread's bulk group."""
    _bulk_shared_to_global("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32",
                           gptr, sptr, nbytes, loc, ip)


#: the L2 eviction priorities of :func:`l2_policy` (``createpolicy.fractional`` with
#: fraction 1.0)
L2_EVICT_FIRST = "evict_first"
L2_EVICT_LAST = "evict_last"
L2_EVICT_NORMAL = "evict_normal"


@dsl_user_op
def l2_policy(priority: str, *, loc=None, ip=None):
    """An L2 cache policy (``createpolicy.fractional.L2::<priority>.b64``, fraction 1.0) for
    the ``cache_policy`` of a TMA copy or the policy operand of the ``L2::cache_hint`` bulk
    operations: ``"evict_first"`` for data read or written once, ``"evict_last"`` for data
    that other CTAs read again, ``"evict_normal"`` (PTX ISA, "createpolicy")."""
    if priority not in (L2_EVICT_FIRST, L2_EVICT_LAST, L2_EVICT_NORMAL):
        raise ValueError(f"priority must be {L2_EVICT_FIRST!r}, {L2_EVICT_LAST!r} or "
                         f"{L2_EVICT_NORMAL!r}, got {priority!r}")
    return cutlass.Int64(inline_asm(
        T.i64(), [], f"createpolicy.fractional.L2::{priority}.b64 $0, 1.0;", "=l", False,
        loc, ip))


#: the L2 policy modes of the kernels' ``l2_hint``: none (the TMA copies' default operand),
#: a priority per tensor, ``evict_normal`` everywhere
L2_HINT_OFF, L2_HINT_SPLIT, L2_HINT_NORMAL = 0, 1, 2


def l2_copy_kw(mode: int, priority: str) -> dict:
    """The keyword arguments of a TMA ``cute.copy`` under the L2 policy ``mode``:
    :data:`L2_HINT_SPLIT` the policy of ``priority`` (:func:`l2_policy`),
    :data:`L2_HINT_NORMAL` ``evict_normal``, :data:`L2_HINT_OFF` none (the copy's default
    operand)."""
    if mode == L2_HINT_SPLIT:
        return {"cache_policy": l2_policy(priority)}
    if mode == L2_HINT_NORMAL:
        return {"cache_policy": l2_policy(L2_EVICT_NORMAL)}
    return {}


@dsl_user_op
def bulk_reduce_add_f32_hint(gptr, sptr, nbytes: int, policy, *, loc=None, ip=None):
    """:func:`bulk_reduce_add_f32` with an L2 cache policy (:func:`l2_policy`):
    ``cp.reduce.async.bulk.global.shared::cta.bulk_group.L2::cache_hint.add.f32``."""
    inline_asm(
        None,
        [gptr.toint(loc=loc, ip=ip).ir_value(loc=loc, ip=ip),
         sptr.toint(loc=loc, ip=ip).ir_value(loc=loc, ip=ip),
         cutlass.Int64(policy).ir_value(loc=loc, ip=ip)],
        "cp.reduce.async.bulk.global.shared::cta.bulk_group.L2::cache_hint.add.f32 "
        f"[$0], [$1], {nbytes}, $2;", "l,r,l", True, loc, ip)


@dsl_user_op
def bulk_reduce_add_s32(gptr, sptr, nbytes: int, *, loc=None, ip=None):
    """``cp.reduce.async.bulk.global.shared::cta.bulk_group.add.s32``: the int32 counterpart
    of :func:`bulk_reduce_add_f32` (integer additions: the sum does not depend on their
    order)."""
    _bulk_shared_to_global("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.s32",
                           gptr, sptr, nbytes, loc, ip)


#: ``exp2_poly3``: 2**f = 1 + f (C1 + f (C2 + f C3)) on [-0.5, 0.5], least relative error
#: (max 1.02e-4, fp32 evaluation), as fp32 bit patterns
_EXP2_C = (0x3F317AFD, 0x3E7805F4, 0x3D6150B7)


@dsl_user_op
def exp2_poly3(x, *, loc=None, ip=None):
    """``2**x`` without the MUFU unit (10 instructions: FMNMX x2, FADD x3, FFMA x3, IMAD,
    FMUL). ``x`` is clamped to [-127, 128] (NaN kept), split into the nearest integer ``j``
    (the 1.5 * 2**23 rounding) and ``f`` in [-0.5, 0.5]; the polynomial of ``f`` is scaled by
    the float whose bits are ``(j << 23) + bits(1.0)``: 0 for ``j = -127`` (``x`` below
    -126.5, where ``2**x`` is below the normal range), +inf for ``j = 128`` (``x`` from
    127.5). Relative error at most 1.02e-4 in between (MUFU ``ex2.approx``: 2**-22)."""
    c1, c2, c3 = (f"0f{c:08X}" for c in _EXP2_C)
    return cutlass.Float32(inline_asm(
        T.f32(), [cutlass.Float32(x).ir_value(loc=loc, ip=ip)],
        "{\n.reg .f32 xc, t, j, f, p, s;\n.reg .b32 tb, sb;\n"
        "max.NaN.f32 xc, $1, 0fC2FE0000;\nmin.NaN.f32 xc, xc, 0f43000000;\n"
        "add.rn.f32 t, xc, 0f4B400000;\nsub.rn.f32 j, t, 0f4B400000;\n"
        "sub.rn.f32 f, xc, j;\n"
        f"fma.rn.f32 p, f, {c3}, {c2};\nfma.rn.f32 p, p, f, {c1};\n"
        "fma.rn.f32 p, p, f, 0f3F800000;\n"
        "mov.b32 tb, t;\nmad.lo.s32 sb, tb, 8388608, 1065353216;\nmov.b32 s, sb;\n"
        "mul.rn.f32 $0, p, s;\n}", "=f,f", False, loc, ip))


@dsl_user_op
def fixed_bits_f32(y, *, loc=None, ip=None):
    """``round(y)`` as int32 (``cvt.rni.sat.s32.f32``: to nearest even, saturated, NaN to
    0), returned as a Float32 holding those 32 bits (for the fp32 staging paths)."""
    return cutlass.Float32(inline_asm(
        T.f32(), [cutlass.Float32(y).ir_value(loc=loc, ip=ip)],
        "{\n.reg .s32 i;\ncvt.rni.sat.s32.f32 i, $1;\nmov.b32 $0, i;\n}", "=f,f", False,
        loc, ip))


#: the magic addends of :func:`fixed_bits_f32_fadd`: 1.5 * 2^31 (a sum in [2^31, 2^32] has
#: steps of 2^8) and 1.5 * 2^23 (steps of 1), and the constant their bit patterns leave in
#: ``(bits(t) << 8) + bits(t2)``: ``(0x4F400000 << 8) + 0x4B400000`` modulo 2^32
FIXED_MAGIC_HI = 0x4F400000
FIXED_MAGIC_LO = 0x4B400000
FIXED_MAGIC_BIAS = ((FIXED_MAGIC_HI << 8) + FIXED_MAGIC_LO) % (1 << 32)


@dsl_user_op
def fixed_bits_f32_fadd(y, *, loc=None, ip=None):
    """:func:`fixed_bits_f32` on the FP32 and integer pipes (four ``add.rn.f32``, a shift-add
    and an add) instead of a conversion: for ``|y| <= 2^30`` bitwise the same (round to
    nearest even), elsewhere and for NaN a wrapped value instead of the saturated one.
    ``t = y + 1.5 * 2^31`` rounds ``y`` to a multiple ``h`` of 2^8 (``t`` in [2^31, 2^32],
    where the bit pattern counts steps of 2^8), ``r = y - (t - 1.5 * 2^31)`` is exact
    (``|r| <= 2^7``), ``t2 = r + 1.5 * 2^23`` rounds it to an integer; the result is
    ``256 (bits(t) - bits(1.5 * 2^31)) + bits(t2) - bits(1.5 * 2^23)``."""
    return cutlass.Float32(inline_asm(
        T.f32(), [cutlass.Float32(y).ir_value(loc=loc, ip=ip)],
        "{\n.reg .f32 t, h, r, u;\n.reg .b32 a, b, c;\n"
        f"add.rn.f32 t, $1, 0f{FIXED_MAGIC_HI:08X};\n"
        f"sub.rn.f32 h, t, 0f{FIXED_MAGIC_HI:08X};\n"
        "sub.rn.f32 r, $1, h;\n"
        f"add.rn.f32 u, r, 0f{FIXED_MAGIC_LO:08X};\n"
        "mov.b32 a, t;\nmov.b32 b, u;\n"
        "shl.b32 a, a, 8;\nadd.u32 c, a, b;\n"
        f"sub.u32 c, c, {FIXED_MAGIC_BIAS};\n"
        "mov.b32 $0, c;\n}", "=f,f", False, loc, ip))


@dsl_user_op
def f32_of_fixed_bits(x, inv, *, loc=None, ip=None):
    """The inverse of :func:`fixed_bits_f32`: the int32 held in the bits of Float32 ``x``,
    converted to float32 and times ``inv`` (a power of two: exact up to the conversion's
    rounding)."""
    return cutlass.Float32(inline_asm(
        T.f32(), [cutlass.Float32(x).ir_value(loc=loc, ip=ip),
                  cutlass.Float32(inv).ir_value(loc=loc, ip=ip)],
        "{\n.reg .s32 i;\n.reg .f32 y;\nmov.b32 i, $1;\ncvt.rn.f32.s32 y, i;\n"
        "mul.rn.f32 $0, y, $2;\n}", "=f,f,f", False, loc, ip))


@dsl_user_op
def red_or_b32(ptr, val, *, loc=None, ip=None):
    """``red.relaxed.gpu.global.or.b32 [ptr], val``."""
    inline_asm(None, [ptr.toint(loc=loc, ip=ip).ir_value(loc=loc, ip=ip),
                      cutlass.Int32(val).ir_value(loc=loc, ip=ip)],
               "red.relaxed.gpu.global.or.b32 [$0], $1;", "l,r", True, loc, ip)


@dsl_user_op
def bulk_copy_f32(gptr, sptr, nbytes: int, *, loc=None, ip=None):
    """``cp.async.bulk.global.shared::cta.bulk_group``: store ``nbytes`` (a multiple of 16)
    from shared memory ``sptr`` to global ``gptr`` (both 16-byte aligned), asynchronously,
    in this thread's bulk group (the plain-store counterpart of :func:`bulk_reduce_add_f32`)."""
    _bulk_shared_to_global("cp.async.bulk.global.shared::cta.bulk_group", gptr, sptr, nbytes,
                           loc, ip)


@dsl_user_op
def st_shared_v4_f32(sptr, a, b, c, d, *, loc=None, ip=None):
    """``st.shared.v4.f32 [sptr], {a, b, c, d}`` (``sptr``: a 16-byte aligned shared-memory
    pointer)."""
    vals = [cutlass.Float32(x).ir_value(loc=loc, ip=ip) for x in (a, b, c, d)]
    inline_asm(None, [sptr.toint(loc=loc, ip=ip).ir_value(loc=loc, ip=ip), *vals],
               "st.shared.v4.f32 [$0], {$1, $2, $3, $4};", "r,f,f,f,f", True, loc, ip)


@dsl_user_op
def red_add_2xf32(ptr, a, b, *, loc=None, ip=None):
    """``red.global.add.f32 [ptr], a; red.global.add.f32 [ptr + 4], b``: the fp32 pair
    reduction of :func:`red_add_v2_f32 <jax_sparse_attn.kernels.hstu_common.red_add_v2_f32>`
    without the vector form (sm_8x has no ``red.global.add.v2.f32``)."""
    inline_asm(None, [ptr.toint(loc=loc, ip=ip).ir_value(loc=loc, ip=ip),
                      cutlass.Float32(a).ir_value(loc=loc, ip=ip),
                      cutlass.Float32(b).ir_value(loc=loc, ip=ip)],
               "red.relaxed.gpu.global.add.f32 [$0], $1;\n\t"
               "red.relaxed.gpu.global.add.f32 [$0+4], $2;", "l,f,f", True, loc, ip)


@dsl_user_op
def atom_add_s32(ptr, val, *, loc=None, ip=None):
    """``atom.relaxed.gpu.global.add.s32``: add ``val`` to the int32 at global ``ptr``;
    returns the old value."""
    return cutlass.Int32(
        inline_asm(T.i32(), [ptr.toint(loc=loc, ip=ip).ir_value(loc=loc, ip=ip),
                             cutlass.Int32(val).ir_value(loc=loc, ip=ip)],
                   "atom.relaxed.gpu.global.add.s32 $0, [$1], $2;", "=r,l,r", True, loc, ip))


@dsl_user_op
def atom_add_acq_rel_s32(ptr, val, *, loc=None, ip=None):
    """``fence.acq_rel.gpu``, ``atom.relaxed.gpu.global.add.s32``, ``fence.acq_rel.gpu``: add
    ``val`` to the int32 at global ``ptr`` after every memory operation that happens before
    (the first fence is cumulative: those of the other threads of a preceding CTA barrier
    too) and before every one that follows; returns the old value."""
    return cutlass.Int32(
        inline_asm(T.i32(), [ptr.toint(loc=loc, ip=ip).ir_value(loc=loc, ip=ip),
                             cutlass.Int32(val).ir_value(loc=loc, ip=ip)],
                   "fence.acq_rel.gpu;\n\tatom.relaxed.gpu.global.add.s32 $0, [$1], $2;"
                   "\n\tfence.acq_rel.gpu;", "=r,l,r", True, loc, ip))


def _st_pair16(space: str, addr_constraint: str, ptr, lo, hi, bf16: bool, loc, ip):
    """``lo``, ``hi`` (fp32) rounded to bf16 / fp16 and stored as one packed 4-byte
    ``st.<space>.b32`` at ``ptr`` (``lo`` at the lower address)."""
    kind = "bf16x2" if bf16 else "f16x2"
    asm = ("{\n.reg .b32 p;\n"
           f"cvt.rn.{kind}.f32 p, $2, $1;\n"
           f"st.{space}.b32 [$0], p;\n}}")
    inline_asm(None, [ptr.toint(loc=loc, ip=ip).ir_value(loc=loc, ip=ip),
                      cutlass.Float32(lo).ir_value(loc=loc, ip=ip),
                      cutlass.Float32(hi).ir_value(loc=loc, ip=ip)],
               asm, addr_constraint + ",f,f", True, loc, ip)


@dsl_user_op
def st_global_pair16(ptr, lo, hi, bf16: bool, *, loc=None, ip=None):
    """``lo``, ``hi`` (fp32) rounded to bf16 (``bf16``) or fp16 and stored as one packed
    4-byte ``st.global.b32`` at ``ptr`` (``lo`` at the lower address; ``ptr`` 4-byte
    aligned)."""
    _st_pair16("global", "l", ptr, lo, hi, bf16, loc, ip)


@dsl_user_op
def st_shared_pair16(sptr, lo, hi, bf16: bool, *, loc=None, ip=None):
    """As :func:`st_global_pair16`, to shared-memory ``sptr``."""
    _st_pair16("shared", "r", sptr, lo, hi, bf16, loc, ip)


@dsl_user_op
def st_shared_s32(sptr, val, *, loc=None, ip=None):
    """``st.shared.b32 [sptr], val``."""
    inline_asm(None, [sptr.toint(loc=loc, ip=ip).ir_value(loc=loc, ip=ip),
                      cutlass.Int32(val).ir_value(loc=loc, ip=ip)],
               "st.shared.b32 [$0], $1;", "r,r", True, loc, ip)


@dsl_user_op
def ld_shared_s32(sptr, *, loc=None, ip=None):
    """``ld.shared.b32``: the int32 at shared-memory ``sptr``."""
    return cutlass.Int32(
        inline_asm(T.i32(), [sptr.toint(loc=loc, ip=ip).ir_value(loc=loc, ip=ip)],
                   "ld.shared.b32 $0, [$1];", "=r,r", True, loc, ip))


# ---- ordered additions (deterministic backwards): an int32 counter in global memory that
# one thread waits on (acquire loads) and publishes (release) ----


@dsl_user_op
def ld_acquire_s32(ptr, *, loc=None, ip=None):
    """``ld.acquire.gpu.global.b32``: load the int32 at global ``ptr`` with acquire
    semantics at GPU scope."""
    return cutlass.Int32(
        inline_asm(T.i32(), [ptr.toint(loc=loc, ip=ip).ir_value(loc=loc, ip=ip)],
                   "ld.acquire.gpu.global.b32 $0, [$1];", "=r,l", True, loc, ip))


@dsl_user_op
def st_release_s32(ptr, val, *, loc=None, ip=None):
    """``fence.acq_rel.gpu`` then ``st.relaxed.gpu.global.b32``: publish ``val`` at global
    ``ptr`` after every memory operation that happens before this one (those of the other
    threads of a preceding CTA barrier included: the fence is cumulative)."""
    inline_asm(None, [ptr.toint(loc=loc, ip=ip).ir_value(loc=loc, ip=ip),
                      cutlass.Int32(val).ir_value(loc=loc, ip=ip)],
               "fence.acq_rel.gpu;\n\tst.relaxed.gpu.global.b32 [$0], $1;", "l,r", True,
               loc, ip)


@dsl_user_op
def st_relaxed_s32(ptr, val, *, loc=None, ip=None):
    """``st.relaxed.gpu.global.b32``: store ``val`` at global ``ptr`` (coherent at GPU scope;
    ordered after earlier writes only by a fence before it)."""
    inline_asm(None, [ptr.toint(loc=loc, ip=ip).ir_value(loc=loc, ip=ip),
                      cutlass.Int32(val).ir_value(loc=loc, ip=ip)],
               "st.relaxed.gpu.global.b32 [$0], $1;", "l,r", True, loc, ip)


@dsl_user_op
def ld_relaxed_s32(ptr, *, loc=None, ip=None):
    """``ld.relaxed.gpu.global.b32``: load the int32 at global ``ptr`` (coherent at GPU
    scope, no ordering of later accesses: follow it with :func:`fence_acq_rel_gpu`)."""
    return cutlass.Int32(
        inline_asm(T.i32(), [ptr.toint(loc=loc, ip=ip).ir_value(loc=loc, ip=ip)],
                   "ld.relaxed.gpu.global.b32 $0, [$1];", "=r,l", True, loc, ip))


@dsl_user_op
def ld_relaxed_f32(ptr, *, loc=None, ip=None):
    """``ld.relaxed.gpu.global.f32``: load the fp32 at global ``ptr`` coherently at GPU scope
    (not from a stale L1 line; data another CTA published with a release that this thread
    or a CTA barrier after an acquire ordered before)."""
    return cutlass.Float32(
        inline_asm(T.f32(), [ptr.toint(loc=loc, ip=ip).ir_value(loc=loc, ip=ip)],
                   "ld.relaxed.gpu.global.f32 $0, [$1];", "=f,l", True, loc, ip))


@dsl_user_op
def fence_acq_rel_gpu(*, loc=None, ip=None):
    """``fence.acq_rel.gpu``."""
    inline_asm(None, [], "fence.acq_rel.gpu;", "", True, loc, ip)


@dsl_user_op
def nanosleep(ns: int, *, loc=None, ip=None):
    """``nanosleep.u32 ns`` (a hint: the warp sleeps up to about ``ns`` nanoseconds)."""
    inline_asm(None, [], f"nanosleep.u32 {int(ns)};", "", True, loc, ip)


@cute.jit
def wait_at_least(ptr, target, relaxed: cutlass.Constexpr = False,
                  sleep_ns: cutlass.Constexpr = 0):
    """Spin (one thread) until the int32 at ``ptr`` is >= ``target``: acquire loads, or
    (``relaxed``) relaxed loads and one ``fence.acq_rel.gpu`` after the last one (with the
    publisher's fence and relaxed store, the same synchronization; the polls then need no
    L1 invalidation each). ``sleep_ns`` > 0 (with ``relaxed``): a ``nanosleep`` before each
    poll after the first, for a wait that may be long and shares the SM with other work."""
    if cutlass.const_expr(relaxed):
        v = ld_relaxed_s32(ptr)
        while v < target:
            if cutlass.const_expr(sleep_ns > 0):
                nanosleep(sleep_ns)
            v = ld_relaxed_s32(ptr)
        fence_acq_rel_gpu()
    else:
        v = ld_acquire_s32(ptr)
        while v < target:
            v = ld_acquire_s32(ptr)
