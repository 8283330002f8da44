"""Small CuTe DSL helpers shared by the block-sparse attention kernels (no jax imports).

Layout algebra and warp-level arithmetic of the forward and backward kernels (the smem
layouts, accumulator views and ``mma.sync`` GEMM loops shared with HSTU live in
:mod:`.common`):

* ``fwd_tile_coords`` / ``fwd_grid`` / ``fwd_gmem_tiles`` / ``fwd_copy_partitions``: the
  forward CTA's coordinates and sizes, its grid, its Q/K/V gmem tiles and this thread's
  partitions of their row copies (the mma.sync forward, ``bsa_fwd_sm80``).
* ``softmax_rows`` / ``row_sum_inv``: the online softmax's per-row running max and sum
  registers and a row's final denominator and its inverse (``bsa_fwd_sm80``).
* ``issue_q_do_rows(...)``: the backward's cp.async of one Q/dO row tile (zero past S_q).
* ``bwd_tile_coords(...)``: the backward CTA's tile/head/batch coordinates and sizes;
  ``bwd_load_kv_tile(...)``: its K/V tile load (both backward kernels).
* ``bwd_entry_rows(...)``: query head and first row of a backward step's K->Q entry.
* ``quad_allreduce_max/sum``: reduce over the 4 lanes that share an accumulator row.
* ``mask_keys_from`` / ``online_softmax_step``: the forward's key-tail mask and online
  softmax update of one KV block (``bsa_fwd_sm80``).
* ``kv_block_rows`` / ``bwd_kv_tile_rows``: how many leading rows of a KV block (forward)
  or backward KV tile are keys; the K/V copies zero-fill the rest, so a partial block's
  tail (padding, NaN/Inf garbage) is never read into a result.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute

from .block_info import kv_split_chunk
from .common import load_rows

LOG2_E = 1.4426950408889634074


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
def kv_block_rows(mSizes, batch, head, n_block, seqlen_k, blk: cutlass.Constexpr,
                  has_sizes: cutlass.Constexpr):
    """Key rows of KV block ``n_block`` for query head ``head``: ``S_kv - n_block*blk``,
    capped by ``block_sizes[batch, head, n_block]`` when the call has block sizes."""
    rows = seqlen_k - n_block * blk
    if cutlass.const_expr(has_sizes):
        rows = cutlass.min(rows, mSizes[batch, head, n_block])
    return rows


@cute.jit
def bwd_kv_tile_rows(mSizes, batch, head_kv, group, n_block, tile_off, kv_left,
                     has_sizes: cutlass.Constexpr):
    """Rows of the backward's KV tile that are keys for at least one query head of the
    GQA group (``block_sizes`` is per query head): ``kv_left`` capped by the largest
    ``block_sizes[batch, h, n_block] - tile_off`` over the group."""
    rows = kv_left
    if cutlass.const_expr(has_sizes):
        most = cutlass.Int32(0)
        for hg in cutlass.range(group, unroll=1):
            most = cutlass.max(most, mSizes[batch, head_kv * group + hg, n_block] - tile_off)
        rows = cutlass.min(rows, most)
    return rows


@cute.jit
def mask_keys_from(acc_S_mn: cute.Tensor, tScS_mn: cute.Tensor, limit):
    """Scores ``(rows, cols)`` of this thread: key columns at or past ``limit`` (their
    coordinate in the identity partition ``tScS_mn``) become ``-inf``."""
    for r in cutlass.range_constexpr(cute.size(acc_S_mn, mode=[0])):
        for c in cutlass.range_constexpr(cute.size(acc_S_mn, mode=[1])):
            if tScS_mn[0, c][1] >= limit:
                acc_S_mn[r, c] = -cutlass.Float32.inf


@cute.jit
def online_softmax_step(acc_S_mn: cute.Tensor, acc_O_mn: cute.Tensor, row_max: cute.Tensor,
                        row_sum: cute.Tensor, scale_log2: cutlass.Float32):
    """One KV block of the forward's online softmax (base 2), per row of this thread: update
    the running max and sum, rescale the O accumulator, and turn the scores into
    probabilities in place. A row whose max is still ``-inf`` uses 0 as its max (no NaN)."""
    for r in cutlass.range_constexpr(cute.size(acc_S_mn, mode=[0])):
        s_row = acc_S_mn[r, None].load()
        m_cur = quad_allreduce_max(s_row.reduce(cute.ReductionOp.MAX, -cutlass.Float32.inf, 0))
        m_prev = row_max[r]
        m_new = cute.arch.fmax(m_prev, m_cur)
        m_safe = 0.0 if m_new == -cutlass.Float32.inf else m_new
        m_scaled = m_safe * scale_log2
        p_row = cute.math.exp2(s_row * scale_log2 - m_scaled, fastmath=True)
        corr = cute.math.exp2(m_prev * scale_log2 - m_scaled, fastmath=True)
        row_sum[r] = row_sum[r] * corr + p_row.reduce(cute.ReductionOp.ADD, cutlass.Float32.zero, 0)
        row_max[r] = m_new
        acc_O_mn[r, None] = acc_O_mn[r, None].load() * corr
        acc_S_mn[r, None] = p_row


def fwd_gmem_tiles(mQ, mK, mV, batch, head, head_kv, m_block, blk: int, hd: int):
    """The forward CTA's gmem tiles, traced inline: its Q block ``(blk, hd)`` and the K / V
    blocks ``(blk, hd, N_kv)`` of its KV head."""
    gQ = cute.local_tile(mQ[batch, None, head, None], (blk, hd), (m_block, 0))
    gK = cute.local_tile(mK[batch, None, head_kv, None], (blk, hd), (None, 0))
    gV = cute.local_tile(mV[batch, None, head_kv, None], (blk, hd), (None, 0))
    return gQ, gK, gV


def fwd_copy_partitions(gmem_copy_in, tidx, gQ, sQ, gK, sK, gV, sV, blk: int, hd: int):
    """This thread's partitions of the forward's Q/K/V gmem -> smem row copies, traced
    inline: ``(tQgQ, tQsQ, tKgK, tKsK, tVgV, tVsV, tCc)`` (``tCc``: identity coordinates)."""
    thr_copy = gmem_copy_in.get_slice(tidx)
    return (thr_copy.partition_S(gQ), thr_copy.partition_D(sQ), thr_copy.partition_S(gK),
            thr_copy.partition_D(sK), thr_copy.partition_S(gV), thr_copy.partition_D(sV),
            thr_copy.partition_S(cute.make_identity_tensor((blk, hd))))


def fwd_grid(mQ, blk: int):
    """The forward's grid ``(N_q, H_q, B)`` (one CTA per query block and head)."""
    return (cute.ceil_div(mQ.shape[1], blk), cute.size(mQ.shape[2]), cute.size(mQ.shape[0]))


def softmax_rows(n_rows: int):
    """Running row max (``-inf``) and row sum (0) registers of the online softmax."""
    row_max = cute.make_rmem_tensor(n_rows, cutlass.Float32)
    row_sum = cute.make_rmem_tensor(n_rows, cutlass.Float32)
    row_max.fill(-cutlass.Float32.inf)
    row_sum.fill(0.0)
    return row_max, row_sum


@cute.jit
def row_sum_inv(row_sum_r):
    """The row's softmax denominator ``l`` (quad all-reduced), whether the row is empty
    (``l == 0``) and ``1 / l`` (0 for an empty row)."""
    l = quad_allreduce_sum(row_sum_r)
    empty = l == 0.0
    inv = 0.0 if empty else cute.arch.rcp_approx(l)
    return l, empty, inv


@cute.jit
def store_split_partial(mO, mLSE, split, batch, head, acc_O_mn, tOcO_mn, row_max, row_sum,
                        softmax_scale, m_block, seqlen_q, tidx, blk: cutlass.Constexpr,
                        n_rows: cutlass.Constexpr):
    """Split-KV epilogue of the one-CTA-per-item forwards: the split's fp32 ``O / l`` and LSE
    of the CTA's rows ``< S_q`` straight from the accumulator registers (zeros and ``-inf``
    for a split without keys); ``mO`` ``(S, B, H, S_q, D)``, ``mLSE`` ``(S, B, H, S_q)``."""
    mO_s = mO[split, batch, head, None, None]
    mLSE_s = mLSE[split, batch, head, None]
    for r in cutlass.range_constexpr(n_rows):
        l, empty, inv = row_sum_inv(row_sum[r])
        lse = -cutlass.Float32.inf
        if not empty:
            lse = row_max[r] * softmax_scale + cute.math.log(l, fastmath=False)
        row = m_block * blk + tOcO_mn[r, 0][0]
        if row < seqlen_q:
            if tidx % 4 == 0:
                mLSE_s[row] = lse
            for c in cutlass.range_constexpr(cute.size(tOcO_mn, mode=[1])):
                mO_s[row, tOcO_mn[r, c][1]] = acc_O_mn[r, c] * inv


def bwd_load_kv_tile(gmem_copy_in, tidx, mK, mV, sK, sV, sQ, sdO, mSizes, batch, head_kv,
                     group, n_tile, n_block, tile_off, seqlen_k, tile: int, hd: int,
                     has_sizes: bool, row_cap=None):
    """Backward prologue, traced inline: cp.async the CTA's ``tile`` K and V rows into ``sK`` /
    ``sV`` (one commit group; rows that no query head of the GQA group uses as keys are
    zero-filled, never read; with ``row_cap`` also the rows at or past it). Returns ``(thr_copy, tCc, kv_left, tQsQ, tdOsdO)``: this
    thread's slice of ``gmem_copy_in``, its identity partition, the keys left from the
    tile's first row to ``S_kv`` and the partitions of the Q / dO smem stages."""
    thr_copy = gmem_copy_in.get_slice(tidx)
    tCc = thr_copy.partition_S(cute.make_identity_tensor((tile, hd)))
    gK = cute.local_tile(mK[batch, None, head_kv, None], (tile, hd), (n_tile, 0))
    gV = cute.local_tile(mV[batch, None, head_kv, None], (tile, hd), (n_tile, 0))
    kv_left = seqlen_k - n_tile * tile
    kv_rows = bwd_kv_tile_rows(mSizes, batch, head_kv, group, n_block, tile_off, kv_left,
                               has_sizes)
    if row_cap is not None:
        kv_rows = cutlass.min(kv_rows, row_cap)
    load_rows(gmem_copy_in, thr_copy.partition_S(gK), thr_copy.partition_D(sK), tCc, kv_rows)
    load_rows(gmem_copy_in, thr_copy.partition_S(gV), thr_copy.partition_D(sV), tCc, kv_rows)
    cute.arch.cp_async_commit_group()
    return thr_copy, tCc, kv_left, thr_copy.partition_D(sQ), thr_copy.partition_D(sdO)


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


def fwd_tile_coords(mQ, mK, mScale, mNums, kv_splits: int = 1):
    """Coordinates and sizes of a forward CTA (grid ``(N_q, H_q, B)``, one query block;
    split-KV: ``(N_q kv_splits, H_q, B)``, the splits of a block adjacent), traced inline:
    ``(m_block, head, batch, seqlen_q, seqlen_k, head_kv, softmax_scale, scale_log2,
    num_blocks, split, j0)`` with ``head_kv = head // (H_q // H_kv)``, ``scale_log2 =
    softmax_scale * log2(e)`` and ``num_blocks = q2k_block_nums[batch, head, m_block]``;
    split-KV: ``split`` the CTA's split, ``[j0, j0 + num_blocks)`` its chunk of the row's list
    (:func:`~.block_info.kv_split_chunk`); without: ``split = j0 = None``."""
    m_block, head, batch = cute.arch.block_idx()
    if kv_splits > 1:
        m_block = m_block // kv_splits
    seqlen_q = mQ.shape[1]
    seqlen_k = mK.shape[1]
    head_kv = head // (mQ.shape[2] // mK.shape[2])
    softmax_scale = mScale[0]
    scale_log2 = softmax_scale * LOG2_E
    num_blocks = mNums[batch, head, m_block]
    split = None
    j0 = None
    if kv_splits > 1:
        split = cute.arch.block_idx()[0] % kv_splits
        j0, num_blocks = kv_split_chunk(num_blocks, split, kv_splits)
    return (m_block, head, batch, seqlen_q, seqlen_k, head_kv, softmax_scale, scale_log2,
            num_blocks, split, j0)


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
