"""Small CuTe DSL helpers shared by the block-sparse attention kernels (no jax imports).

Everything here is layout algebra or warp-level arithmetic used by both the forward and
the backward SM80-style (``mma.sync``) kernels:

* ``smem_layout(dtype, rows, cols)``: a swizzled shared-memory layout for a row-major
  ``(rows, cols)`` tile of 16-bit elements that ``ldmatrix`` reads without bank conflicts.
* ``gmem_load_copy`` / ``gmem_store_copy``: 128-bit tiled gmem copies (``cp.async`` in,
  vectorized stores out) whose thread layout matches the ``smem_layout`` swizzle width.
* ``issue_q_do_rows(...)``: the backward's cp.async of one Q/dO row tile (zero past S_q).
* ``bwd_tile_coords(...)``: the backward CTA's tile/head/batch coordinates and sizes.
* ``bwd_entry_rows(...)``: query head and first row of a backward step's K->Q entry.
* ``transpose_view(t)``: the ``(cols, rows)`` view of a ``(rows, cols)`` smem tensor.
* ``acc_mn_view(acc)``: view an ``mma.sync`` accumulator fragment ``((2, 2), MMA_M, MMA_N)``
  as ``(rows, cols)`` of this thread's values.
* ``acc_to_a_operand(t)``: reinterpret an accumulator-shaped fragment (already converted to
  16 bit) as an A-operand fragment of the m16n8k16 MMA (FlashAttention-2's register reuse).
* ``quad_allreduce_max/sum``: reduce over the 4 lanes that share an accumulator row.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass.cute.nvgpu import cpasync

from .common import load_rows

LOG2_E = 1.4426950408889634074


def smem_layout(dtype, rows: int, cols: int):
    """Swizzled smem layout for a row-major ``(rows, cols)`` 16-bit tile (cols % 32 == 0)."""
    del dtype  # 16-bit types only
    kblock = 64 if cols % 64 == 0 else 32
    bits = 3 if kblock == 64 else 2
    atom = cute.make_composed_layout(
        cute.make_swizzle(bits, 3, 3), 0, cute.make_layout((8, kblock), stride=(kblock, 1))
    )
    return cute.tile_to_shape(atom, (rows, cols), (0, 1))


def copy_threads_per_row(cols: int, elems_per_copy: int) -> int:
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


def transpose_view(t: cute.Tensor) -> cute.Tensor:
    """``(cols, rows)`` view of a ``(rows, cols)`` tensor without moving data."""
    rows = cute.size(t, mode=[0])
    cols = cute.size(t, mode=[1])
    return cute.composition(t, cute.make_layout((cols, rows), stride=(rows, 1)))


def acc_mn_view(acc: cute.Tensor) -> cute.Tensor:
    """View an accumulator ``((2, 2), MMA_M, MMA_N)`` as ``((2, MMA_M), (2, MMA_N))``."""
    cm = cute.make_layout(acc.layout.shape)
    mn = cute.make_layout(
        ((cm.shape[0][1], cm.shape[1]), (cm.shape[0][0], cm.shape[2])),
        stride=((cm.stride[0][1], cm.stride[1]), (cm.stride[0][0], cm.stride[2])),
    )
    return cute.make_tensor(acc.iterator, cute.composition(acc.layout, mn))


def acc_to_a_operand(t: cute.Tensor) -> cute.Tensor:
    """``((2, 2), MMA_M, MMA_N)`` accumulator-shaped fragment -> A fragment of m16n8k16.

    Two neighbouring n8 accumulator tiles form the k16 A tile:
    ``(4, MMA_M, MMA_N)`` -> ``((4, 2), MMA_M, MMA_N / 2)``.
    """
    d = cute.logical_divide(t.layout, (None, None, 2))
    view = cute.make_layout(
        ((d.shape[0], d.shape[2][0]), d.shape[1], d.shape[2][1]),
        stride=((d.stride[0], d.stride[2][0]), d.stride[1], d.stride[2][1]),
    )
    return cute.make_tensor(t.iterator, view)


@cute.jit
def quad_allreduce_max(val: cutlass.Float32) -> cutlass.Float32:
    val = cute.arch.fmax(val, cute.arch.shuffle_sync_bfly(val, offset=2, mask=-1, mask_and_clamp=31))
    val = cute.arch.fmax(val, cute.arch.shuffle_sync_bfly(val, offset=1, mask=-1, mask_and_clamp=31))
    return val


@cute.jit
def quad_allreduce_sum(val: cutlass.Float32) -> cutlass.Float32:
    val = val + cute.arch.shuffle_sync_bfly(val, offset=2, mask=-1, mask_and_clamp=31)
    val = val + cute.arch.shuffle_sync_bfly(val, offset=1, mask=-1, mask_and_clamp=31)
    return val


@cute.jit
def gemm_ss(
    tiled_mma: cute.TiledMma,
    acc: cute.Tensor,
    tCrA: cute.Tensor,
    tCrB: cute.Tensor,
    tCsA: cute.Tensor,
    tCsB: cute.Tensor,
    copy_A: cute.TiledCopy,
    copy_B: cute.TiledCopy,
):
    """acc += A @ B^T with both operands in smem, ldmatrix one k-slice ahead of the MMA."""
    tCrA_v = copy_A.retile(tCrA)
    tCrB_v = copy_B.retile(tCrB)
    nk = cute.size(tCsA.shape[2])
    cute.copy(copy_A, tCsA[None, None, 0], tCrA_v[None, None, 0])
    cute.copy(copy_B, tCsB[None, None, 0], tCrB_v[None, None, 0])
    for k in cutlass.range_constexpr(nk):
        if cutlass.const_expr(k + 1 < nk):
            cute.copy(copy_A, tCsA[None, None, k + 1], tCrA_v[None, None, k + 1])
            cute.copy(copy_B, tCsB[None, None, k + 1], tCrB_v[None, None, k + 1])
        cute.gemm(tiled_mma, acc, tCrA[None, None, k], tCrB[None, None, k], acc)


@cute.jit
def gemm_rs(
    tiled_mma: cute.TiledMma,
    acc: cute.Tensor,
    tCrA: cute.Tensor,
    tCrB: cute.Tensor,
    tCsB: cute.Tensor,
    copy_B: cute.TiledCopy,
):
    """acc += A @ B^T with A already in registers and B in smem."""
    tCrB_v = copy_B.retile(tCrB)
    nk = cute.size(tCrA.shape[2])
    cute.copy(copy_B, tCsB[None, None, 0], tCrB_v[None, None, 0])
    for k in cutlass.range_constexpr(nk):
        if cutlass.const_expr(k + 1 < nk):
            cute.copy(copy_B, tCsB[None, None, k + 1], tCrB_v[None, None, k + 1])
        cute.gemm(tiled_mma, acc, tCrA[None, None, k], tCrB[None, None, k], acc)


def smem_layout_staged(dtype, rows: int, cols: int, stages: int):
    """``(rows, cols, stages)`` version of :func:`smem_layout` (one swizzled tile per stage)."""
    del dtype
    kblock = 64 if cols % 64 == 0 else 32
    bits = 3 if kblock == 64 else 2
    atom = cute.make_composed_layout(
        cute.make_swizzle(bits, 3, 3), 0, cute.make_layout((8, kblock), stride=(kblock, 1))
    )
    return cute.tile_to_shape(atom, (rows, cols, stages), (0, 1, 2))


def transpose_view_staged(t: cute.Tensor) -> cute.Tensor:
    """``(cols, rows, stages)`` view of a ``(rows, cols, stages)`` tensor."""
    rows = cute.size(t, mode=[0])
    cols = cute.size(t, mode=[1])
    stages = cute.size(t, mode=[2])
    return cute.composition(
        t, cute.make_layout((cols, rows, stages), stride=(rows, 1, rows * cols))
    )


@cute.jit
def issue_q_do_rows(mQ, mdO, ent, t, n_q_blocks, head_kv, group, batch, seqlen_q,
                    gmem_copy_in, thr_copy, tCc, tQsQ, tdOsdO, stage,
                    blk: cutlass.Constexpr, sub: cutlass.Constexpr, hd: cutlass.Constexpr,
                    tile: cutlass.Constexpr):
    """Backward step ``t`` of KV-visiting entry ``ent`` (= ``h_in_group * n_q_blocks +
    m_block``): cp.async its ``tile`` Q and dO rows into smem stage ``stage``, zero past S_q."""
    head, q0 = bwd_entry_rows(ent, t, n_q_blocks, head_kv, group, blk, sub, tile)
    q_tile = q0 // tile
    gQ = cute.local_tile(mQ[batch, None, head, None], (tile, hd), (q_tile, 0))
    gdO = cute.local_tile(mdO[batch, None, head, None], (tile, hd), (q_tile, 0))
    load_rows(gmem_copy_in, thr_copy.partition_S(gQ), tQsQ[None, None, None, stage], tCc, seqlen_q - q0)
    load_rows(gmem_copy_in, thr_copy.partition_S(gdO), tdOsdO[None, None, None, stage], tCc, seqlen_q - q0)


def bwd_entry_rows(ent, t, n_q_blocks, head_kv, group, blk: int, sub: int, tile: int):
    """Query head and first query row of backward step ``t`` of K->Q entry ``ent``
    (``= h_in_group * n_q_blocks + m_block``; step ``t`` covers sub-tile ``t % sub`` of the
    query block), traced inline: ``(head_kv * group + h_in_group, m_block * blk + (t % sub) *
    tile)``."""
    h_in_group = ent // n_q_blocks
    m_block = ent - h_in_group * n_q_blocks
    return head_kv * group + h_in_group, m_block * blk + (t % sub) * tile


def bwd_tile_coords(mQ, mK, mScale, blk: int, sub: int, tile: int):
    """Coordinates and sizes of a backward CTA (grid ``(n_tiles, H_kv, B)``, one ``tile``-key
    tile of a ``blk``-key block, ``sub = blk // tile`` tiles per block), traced inline.

    Returns ``(n_tile, head_kv, batch, seqlen_q, seqlen_k, num_heads_kv, group, n_q_blocks,
    n_kv_blocks, n_block, tile_off, softmax_scale, scale_log2)`` with ``group = H_q // H_kv``,
    ``n_block`` the KV block of the tile, ``tile_off`` its first key inside the block and
    ``scale_log2 = softmax_scale * log2(e)``.
    """
    n_tile, head_kv, batch = cute.arch.block_idx()
    seqlen_q = mQ.shape[1]
    seqlen_k = mK.shape[1]
    num_heads_kv = mK.shape[2]
    group = mQ.shape[2] // num_heads_kv
    n_q_blocks = (seqlen_q + blk - 1) // blk
    n_kv_blocks = (seqlen_k + blk - 1) // blk
    n_block = n_tile // sub
    tile_off = (n_tile % sub) * tile
    softmax_scale = mScale[0]
    scale_log2 = softmax_scale * LOG2_E
    return (n_tile, head_kv, batch, seqlen_q, seqlen_k, num_heads_kv, group, n_q_blocks,
            n_kv_blocks, n_block, tile_off, softmax_scale, scale_log2)
