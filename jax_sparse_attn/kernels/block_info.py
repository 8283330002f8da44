"""Which KV tiles a Q tile visits (no jax imports).

``BlockInfo`` (the HSTU forward's range form): for the query rows ``[m0, m1)`` of one sequence
it gives the visible key columns ``[j_lo, j_hi)`` from the window ``(left, right)`` (diagonal
offset ``off = L_k - L_q``), or from the per-tile summary of a ``func`` interval mask that the
host precomputed into the tile schedule (``mTile[slot, 2:5]`` = min interval start, max
interval end, min F0), and the KV tiles ``[n_min, n_max)`` of width ``bn`` that cover them.
Tiles are visited from ``n_max - 1`` down to ``n_min`` (the tile holding the sequence end, the
only one that can be partial, comes first).

``BlockList`` (the block-sparse forward's list form) has the same ``n_count`` / ``kv_tile(it)``
interface: query block ``m`` of (batch ``b``, query head ``h``) visits the KV blocks
``q2k_block_index[b, h, m, :n_count]``, ``n_count = q2k_block_nums[b, h, m]`` clamped to
``[0, K_max]`` (0 when there are no keys) and every index clamped to ``[0, N_kv - 1]``, so no
metadata value makes a load leave the K/V tensors. ``valid_keys(n)`` is the number of leading
keys of block ``n`` that exist and count: ``min(L_k - n bn, bn)``, also capped by
``block_sizes[b, h, n]`` when given (at least 0). With the causal mask (``key_end`` given:
``min((m + 1) bm, L_q) + L_k - L_q``, one past the last key the block's last query row sees)
it is also capped by ``key_end - n bn``: the keys past it are masked for every row of the
query block, so the V rows there are zero-filled like a partial block's tail (0 for a block
entirely above the diagonal).

``BlockListSplit`` (the split-KV forward's form): split ``s`` of ``kv_splits`` of a
``BlockList`` visits the contiguous chunk ``[s c, min((s + 1) c, n))`` of its active list, ``c =
ceil(n / kv_splits)`` (``kv_split_chunk``; empty for the splits past the end), with the same
``kv_tile`` / ``valid_keys`` (entry ``it`` of the chunk is entry ``s c + it`` of the list).

``QTileRange`` (the KV-major backward's form): the query tiles of width ``bm`` that can see
the keys ``[n0, n0 + bn)`` of one sequence: ``[m_min, m_min + m_count)`` from the window, or
every query tile with a per-tile test against the host's func summary of canonical query
tile ``qt`` (``mQTiles[qt] = [min interval start, max interval end, min F0]``, ``qt =
mQStart[batch] + m``). ``tile_state(m)`` = (whether tile ``m`` sees any key of the KV tile,
whether every (query, key) pair of the two tiles is visible under the window / func mask);
the sequence ends need no per-element mask in the backward (rows past them are zero-filled).
"""

from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Int32


@dataclass(frozen=True)
class BlockInfo:
    j_lo: object
    j_hi: object
    f0: object
    n_min: object
    n_max: object
    n_count: object

    def kv_tile(self, it):
        """The KV tile visited in iteration ``it`` (``0 <= it < n_count``)."""
        return self.n_max - 1 - it

    @staticmethod
    @cute.jit
    def create(mTile, slot, m0, m1, seqlen_k, off, left, right, bn: cutlass.Constexpr,
               has_func: cutlass.Constexpr):
        j_lo = Int32(0)
        j_hi = Int32(seqlen_k)  # exclusive
        f0 = Int32(0)
        if cutlass.const_expr(has_func):
            j_lo = cutlass.max(Int32(mTile[slot, 2]), Int32(0))
            j_hi = cutlass.min(Int32(mTile[slot, 3]), seqlen_k)
            f0 = cutlass.min(Int32(mTile[slot, 4]), seqlen_k)
        else:
            if left >= 0:
                j_lo = cutlass.max(m0 + off - left, Int32(0))
            if right >= 0:
                j_hi = cutlass.min(m1 - 1 + off + right + 1, seqlen_k)
        n_min = j_lo // bn
        n_max = n_min
        if j_hi > j_lo:
            n_max = (j_hi + bn - 1) // bn
        return BlockInfo(j_lo, j_hi, f0, n_min, n_max, n_max - n_min)


@dataclass(frozen=True)
class BlockList:
    mIdx: object
    mSizes: object
    batch: object
    head: object
    m_block: object
    n_last: object
    seqlen_k: object
    n_count: object
    bn: int
    has_sizes: bool
    key_end: object = None  # causal: one past the last key the query block sees

    def kv_tile(self, it):
        """The KV block visited in iteration ``it`` (``0 <= it < n_count``)."""
        n = Int32(self.mIdx[self.batch, self.head, self.m_block, it])
        return cutlass.min(cutlass.max(n, Int32(0)), self.n_last)

    def valid_keys(self, n):
        """Keys of block ``n`` that take part (the rest are masked and, for V, zeroed)."""
        lim = cutlass.min(self.seqlen_k - n * self.bn, Int32(self.bn))
        if cutlass.const_expr(self.has_sizes):
            lim = cutlass.min(lim, Int32(self.mSizes[self.batch, self.head, n]))
        if cutlass.const_expr(self.key_end is not None):
            lim = cutlass.min(lim, self.key_end - n * self.bn)
        return cutlass.max(lim, Int32(0))

    def clamp(self, n):
        """A raw ``q2k_block_index`` entry clamped as :meth:`kv_tile` clamps it."""
        return cutlass.min(cutlass.max(Int32(n), Int32(0)), self.n_last)

    @staticmethod
    @cute.jit
    def create(mIdx, mNums, mSizes, batch, head, m_block, seqlen_k, bn: cutlass.Constexpr,
               has_sizes: cutlass.Constexpr, key_end=None, nums=None):
        """``nums``: the raw ``q2k_block_nums`` entry of the block when the caller has
        loaded it already (else it is loaded here)."""
        n_kv = (seqlen_k + bn - 1) // bn
        k_max = Int32(mIdx.shape[3])
        if cutlass.const_expr(nums is None):
            nums = mNums[batch, head, m_block]
        cnt = cutlass.min(cutlass.max(Int32(nums), Int32(0)), k_max)
        if n_kv <= 0:
            cnt = Int32(0)
        return BlockList(mIdx, mSizes, batch, head, m_block, n_kv - 1, seqlen_k, cnt, bn,
                         has_sizes, key_end)


@cute.jit
def kv_split_chunk(n, split, kv_splits: cutlass.Constexpr):
    """``(first entry, entries)`` of split ``split`` of a list of ``n`` active entries cut
    into ``kv_splits`` contiguous chunks of ``c = ceil(n / kv_splits)`` entries: ``[split c,
    min((split + 1) c, n))`` (the reference's ``metadata.kv_split_ids``); ``(n, 0)`` past the
    end."""
    chunk = (n + (kv_splits - 1)) // kv_splits
    lo = cutlass.min(split * chunk, n)
    hi = cutlass.min(lo + chunk, n)
    return lo, hi - lo


@dataclass(frozen=True)
class BlockListSplit:
    """Split ``split`` of ``kv_splits`` of the ``BlockList`` ``base`` (``kv_split_chunk``):
    ``n_count`` entries from entry ``it0``; other attributes are the base list's."""

    base: object
    it0: object
    n_count: object

    def kv_tile(self, it):
        """The KV block of iteration ``it`` (``0 <= it < n_count``): entry ``it0 + it``."""
        return self.base.kv_tile(self.it0 + it)

    def valid_keys(self, n):
        return self.base.valid_keys(n)

    def __getattr__(self, name):
        # only called for names the split does not define (never for its own fields)
        if name in ("base", "it0", "n_count") or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.base, name)

    @staticmethod
    @cute.jit
    def create(base, split, kv_splits: cutlass.Constexpr):
        it0, count = kv_split_chunk(base.n_count, split, kv_splits)
        return BlockListSplit(base, it0, count)


@dataclass(frozen=True)
class BlockPairs:
    """A ``BlockList`` walked two entries per step: step ``it`` holds entries ``2 it`` and
    ``2 it + 1`` (an odd count's last step only the first). ``n_count`` is the number of
    steps and ``kv_tile(it)`` the step itself (a K / V stage holds a step's two blocks);
    :meth:`blocks` gives its blocks; other attributes are the base list's."""

    base: object
    n_count: object

    def kv_tile(self, it):
        return it

    def blocks(self, it):
        """``(first block, second block, 1 where the step has a second block else 0)`` of
        step ``it`` (without one, the second block is the first)."""
        second = cutlass.min(self.base.n_count - 1 - 2 * it, Int32(1))
        return self.base.kv_tile(2 * it), self.base.kv_tile(2 * it + second), second

    def valid_keys(self, n):
        return self.base.valid_keys(n)

    def __getattr__(self, name):
        # only called for names the pairs do not define (never for their own fields)
        if name in ("base", "n_count") or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.base, name)

    @staticmethod
    def create(base):
        return BlockPairs(base, (base.n_count + 1) // 2)


@dataclass(frozen=True)
class QTileRange:
    m_min: object
    m_count: object
    n0: object
    seqlen_q: object
    seqlen_k: object
    off: object
    qt_base: object
    bm: int
    bn: int
    has_func: bool

    @staticmethod
    @cute.jit
    def create(mQStart, batch, n0, seqlen_q, seqlen_k, off, left, right,
               bm: cutlass.Constexpr, bn: cutlass.Constexpr, has_func: cutlass.Constexpr):
        n1 = cutlass.min(n0 + bn, seqlen_k)
        i_lo = Int32(0)
        i_hi = Int32(seqlen_q)  # exclusive
        qt_base = Int32(0)
        if cutlass.const_expr(has_func):
            qt_base = Int32(mQStart[batch])
        else:
            if right >= 0:
                i_lo = cutlass.max(n0 - right - off, Int32(0))
            if left >= 0:
                i_hi = cutlass.min(n1 - 1 + left - off + 1, seqlen_q)
        m_min = i_lo // bm
        m_max = m_min
        if i_hi > i_lo:
            m_max = (i_hi + bm - 1) // bm
        return QTileRange(m_min, m_max - m_min, n0, seqlen_q, seqlen_k, off, qt_base, bm, bn,
                          has_func)

    @cute.jit
    def m_block(self, it, descending: cutlass.Constexpr = False):
        """The query tile of step ``it`` of the walk: ``m_min + it``, or from the last tile
        down with ``descending`` (the deterministic backward's walk)."""
        if cutlass.const_expr(descending):
            return self.m_min + self.m_count - 1 - it
        return self.m_min + it

    @cute.jit
    def covers(self, mQTiles, m_block, left, right):
        """Int32 1 if this KV tile adds to query tile ``m_block`` (in its range and active),
        else 0. For a fixed query tile the KV tiles that cover it form a contiguous range
        (window: both ends of the range are non-decreasing in the KV tile; func: the KV
        tiles overlapping ``[lo, hi)``), which the ordered dQ additions of the
        deterministic backward rely on."""
        in_range = Int32(m_block >= self.m_min) * Int32(m_block < self.m_min + self.m_count)
        active, _ = self.tile_state(mQTiles, cutlass.max(m_block, Int32(0)), left, right)
        return in_range * active

    @cute.jit
    def tile_state(self, mQTiles, m_block, left, right):
        """``(active, full)`` (Int32 0/1) of query tile ``m_block``."""
        active = Int32(1)
        full = Int32(1)
        if cutlass.const_expr(self.has_func):
            qt = self.qt_base + m_block
            lo = cutlass.max(Int32(mQTiles[qt, 0]), Int32(0))
            hi = cutlass.min(Int32(mQTiles[qt, 1]), self.seqlen_k)
            f0 = Int32(mQTiles[qt, 2])
            active = Int32(lo < self.n0 + self.bn) * Int32(hi > self.n0) * Int32(hi > lo)
            full = Int32(self.n0 + self.bn <= f0)
        else:
            m0 = m_block * self.bm
            m1 = cutlass.min(m0 + self.bm, self.seqlen_q)
            if left >= 0:
                if self.n0 < m1 - 1 + self.off - left:
                    full = Int32(0)
            if right >= 0:
                if self.n0 + self.bn - 1 > m0 + self.off + right:
                    full = Int32(0)
        return active, full
