"""Persistent tile scheduler of the SM90 attention kernels (no jax imports).

``StaticLptScheduler``: the grid has ``G`` CTAs (at most the SM count); work item ``t`` of
``n_work = n_slots * H`` is (schedule row ``t // H``, head ``t % H``), and CTA ``c`` takes items
``c, c + G, c + 2G, ...``. The host sorts the schedule rows longest-processing-time first
(descending number of visible keys), so each CTA starts with the heaviest remaining tiles and the
short ones fill the tail (LPT order). Producer and consumer warps walk the same sequence
independently, so no tile index has to be passed between them.
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
