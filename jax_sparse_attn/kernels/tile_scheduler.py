"""Persistent tile scheduler of the SM90 attention kernels (no jax imports).

``StaticLptScheduler``: the grid has ``G`` CTAs (at most the SM count); work item ``t`` of
``n_work = n_slots * H`` is (schedule row ``t // H``, head ``t % H``), and CTA ``c`` takes items
``c, c + G, c + 2G, ...``. The host sorts the schedule rows longest-processing-time first
(descending number of visible keys), so each CTA starts with the heaviest remaining tiles and the
short ones fill the tail (LPT order). Producer and consumer warps walk the same sequence
independently, so no tile index has to be passed between them.

``SnakeLptScheduler``: the same items, each round of ``G`` dealt in alternating direction
(CTAs ``0 .. G - 1``, then ``G - 1 .. 0``), so that the longest-first order does not give
the same CTAs the heavier item of every round.

``HeadOuterScheduler``: the same walk over items (schedule row ``t % n_rows``, head
``t // n_rows``): every row of one head in the longest-first order, then the next head, so
the CTAs running at one time read one head's K / V (of all sequences) instead of the K / V of
every head of fewer sequences (the HSTU forward's ``headouter`` option).

``HeadMajorScheduler``: the same persistent walk over items ordered (batch, KV head, query
block, inner) with ``inner`` = (split, query head of the KV head's group) fastest. The CTAs
running at one time then cover consecutive query blocks of one or two KV heads, so the K/V
blocks their lists name are read from L2 rather than HBM (the block-sparse forward's K/V of
all heads exceed the L2 cache at long sequences).

``WayScheduler``: one of ``ways`` item streams of each CTA of another scheduler's walk (CTA
``c``'s stream ``w`` takes items ``c ways + w, c ways + w + G ways, ...``), for CTAs whose
consumer warpgroups each run work items of their own: the ``G`` CTAs then walk the items
as ``G ways`` CTAs of one warpgroup would.
"""

from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Int32


@dataclass(frozen=True)
class StaticLptScheduler:
    n_heads: object
    n_work: object

    @staticmethod
    def grid(n_work, num_sms: int):
        """Launch grid: one CTA per SM, fewer when there are fewer work items."""
        return (cutlass.min(n_work, num_sms), 1, 1)

    def first(self):
        bidx, _, _ = cute.arch.block_idx()
        return Int32(bidx)

    def next(self, t):
        gdim, _, _ = cute.arch.grid_dim()
        return t + Int32(gdim)

    def valid(self, t):
        return t < self.n_work

    def coords(self, t):
        """(schedule row, head) of work item ``t``."""
        return t // self.n_heads, t % self.n_heads


@dataclass(frozen=True)
class SnakeLptScheduler(StaticLptScheduler):
    """The items of :class:`StaticLptScheduler` dealt to the CTAs in boustrophedon order:
    round ``k`` (items ``k G .. k G + G - 1``) goes to CTAs ``0 .. G - 1`` when ``k`` is even and
    to ``G - 1 .. 0`` when it is odd. Over a longest-first item list, plain round robin gives
    CTA 0 the heaviest item of every round (its total exceeds CTA ``G - 1``'s by up to the
    heaviest minus the lightest item); alternating the direction pairs each heavy turn with a
    light one."""

    def next(self, t):
        gdim, _, _ = cute.arch.grid_dim()
        c, _, _ = cute.arch.block_idx()
        return snake_next(t, Int32(c), Int32(gdim))


def snake_next(t, cta, g):
    """The item after item ``t`` of CTA ``cta`` of ``g`` in the alternating deal (plain
    integer arithmetic: Python ints or the kernel's ``Int32``). Even round ``k``:
    ``t = k g + cta`` -> ``(k + 1) g + (g - 1 - cta)``; odd: ``t = k g + g - 1 - cta`` ->
    ``(k + 1) g + cta``."""
    odd = (t // g) % 2
    return t + 1 + 2 * (g - 1 - cta) + odd * (4 * cta + 2 - 2 * g)


@dataclass(frozen=True)
class HeadOuterScheduler(StaticLptScheduler):
    """Work item ``t``: schedule row ``t % n_rows``, head index ``t // n_rows`` (every row of
    one head, in the schedule's longest-first order, before the next head), so the CTAs
    running at one time read the K / V of one head (of all sequences) rather than of every
    head of fewer sequences."""

    n_rows: object

    def coords(self, t):
        return t % self.n_rows, t // self.n_rows


@dataclass(frozen=True)
class HeadMajorScheduler(StaticLptScheduler):
    """Work item ``t``: ``inner = t % n_inner`` (``n_inner = splits * group``; split
    ``inner // group``, query head ``kv_head * group + inner % group``), then query block, KV
    head and batch, slowest last. ``coords`` returns the (schedule row, split-major head)
    pair of :class:`StaticLptScheduler` (row = ``batch * n_blocks + block``, head index =
    ``split * H_q + head``), so callers decode items the same way under both orders."""

    n_inner: object
    group: object
    n_blocks: object
    n_kv_heads: object

    def coords(self, t):
        inner = t % self.n_inner
        rest = t // self.n_inner
        block = rest % self.n_blocks
        rest = rest // self.n_blocks
        kv_head = rest % self.n_kv_heads
        batch = rest // self.n_kv_heads
        split = inner // self.group
        head = kv_head * self.group + (inner - split * self.group)
        return batch * self.n_blocks + block, split * (self.n_kv_heads * self.group) + head


@dataclass(frozen=True)
class WayScheduler:
    """Stream ``way`` of ``ways`` of each CTA over the items of ``base`` (whose ``coords``,
    ``valid`` and ``n_work`` it keeps)."""

    base: object
    way: object
    ways: int

    @property
    def n_work(self):
        return self.base.n_work

    def first(self):
        bidx, _, _ = cute.arch.block_idx()
        return Int32(bidx) * self.ways + self.way

    def next(self, t):
        gdim, _, _ = cute.arch.grid_dim()
        return t + Int32(gdim) * self.ways

    def valid(self, t):
        return self.base.valid(t)

    def coords(self, t):
        return self.base.coords(t)
