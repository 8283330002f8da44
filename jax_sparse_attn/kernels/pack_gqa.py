"""Packed-GQA row mapping of the block-sparse kernels (``pack_gqa``; no jax imports).

With ``r = H_q / H_kv`` query heads per KV head, packed query row ``p`` of KV head ``g`` is
position ``p // r`` of query head ``g r + p % r`` (cuDNN's packed GQA, FlashAttention's
``pack_gqa``): a tile of packed rows holds ``tile / r`` positions of all ``r`` heads of one
group, so one K/V block load serves the whole group. Two ways to address packed rows:

* :func:`pack_rows_view`: a tensor view whose rows mode becomes the hierarchical mode
  ``(r, S)`` with strides ``(head stride, row stride)`` and whose heads mode becomes the
  ``H / r`` KV heads (stride ``r`` times the head stride). A linear row index ``p`` of that
  mode is ``(p % r, p // r)``. Used for TMA boxes (a box of ``tile`` packed rows is a
  ``(D, r, tile / r)`` box; positions past ``S`` are out of bounds and zero-filled by the
  hardware).
* :func:`packed_row` / :func:`row_tile_view`: the ``(position, query head)`` of one packed row
  and a ``(rows, cols)`` view whose every row is that one row (row stride 0), so that a
  tiled copy's partition of it addresses the row's columns; used by the per-row cp.async
  loads and vector stores (rows are predicated on ``p < S r``).
"""

from __future__ import annotations

import cutlass.cute as cute


def pack_rows_view(m, r: int, rows_mode: int, head_mode: int):
    """``m`` with its ``rows_mode`` (extent S) replaced by the packed rows ``(r, S)`` and its
    ``head_mode`` (extent H) by the ``H / r`` KV heads."""
    shape, stride = list(m.shape), list(m.stride)
    shape[rows_mode] = (r, m.shape[rows_mode])
    stride[rows_mode] = (m.stride[head_mode], m.stride[rows_mode])
    shape[head_mode] = m.shape[head_mode] // r
    stride[head_mode] = m.stride[head_mode] * r
    return cute.make_tensor(m.iterator, cute.make_layout(tuple(shape), stride=tuple(stride)))


def packed_row(p, head_kv, r: int):
    """``(position, query head)`` of packed row ``p`` of KV head ``head_kv`` (traced inline;
    ``r`` static, so the division is a shift for powers of two)."""
    s = p // r
    return s, head_kv * r + (p - s * r)


def row_tile_view(m, batch, s, head, rows: int, cols: int):
    """A ``(rows, cols)`` view of ``m[batch, s, head, :cols]`` (``m``: ``(B, S, H, D)``, D
    contiguous) repeated over the rows (row stride 0)."""
    return cute.make_tensor(m[batch, s, head, None].iterator,
                            cute.make_layout((rows, cols), stride=(0, 1)))
