"""mbarrier pipelines and warpgroup turn-taking for the warp-specialized SM90 kernels
(no jax imports).

``SmemPipeline``: ``stages`` shared-memory buffers, each with a "full" and an "empty" mbarrier.
Stage and phase come from a running count ``c`` of buffers handed over so far
(``stage = c % stages``, ``phase = (c // stages) & 1``), so the kernels keep plain ``Int32``
counters as loop state.

* producer (one warp): ``producer_acquire(c)`` waits until stage ``c`` is empty;
  ``producer_expect_tx(c, bytes)`` is the producer's one arrival on the full barrier, with the
  byte count its TMA copies will complete; ``producer_arrive(c)`` is a plain arrival (the warp
  wrote the buffer with ordinary / cp.async stores, completed and fenced them first).
* consumers: ``consumer_wait(c)`` waits until stage ``c`` is full; ``consumer_release(c)``:
  one lane of each consumer warp arrives on the empty barrier (init count = consumer warps),
  or with ``wg_release`` one lane of the first warp of each consumer warpgroup (init count =
  consumer warpgroups). ``wg_release`` is for stages that the consumers read only through
  wgmma and release after a ``wgmma.wait_group`` that covers those reads: a warpgroup MMA
  completes for all four warps of the warpgroup at once, so the first warp's wait implies the
  others' (the release of FlashAttention-3's and CUTLASS's cluster-free TMA pipelines).

The full barrier of a stage is initialised with count 1 (the producer), the empty barrier with
the number of consumer warps (warpgroups with ``wg_release``). A producer's first pass over the stages waits on parity 1 of the
empty barriers, which a freshly initialised mbarrier reports as complete.

``WarpgroupTurns``: two (or three) consumer warpgroups issue their tensor-core work in turns
(ping-pong; cyclic with three) through one named barrier of 256 threads per warpgroup:
``wait(wg)`` = ``bar.sync`` on the warpgroup's own barrier, ``pass_turn(wg)`` = ``bar.arrive``
on the next one's; warpgroup 0 holds the first turn (``start``).

``PairTurns``: the turns of two consumer warpgroups that work on different work items (so
they take different numbers of turns): a warpgroup that has finished its items hands the
turn over once more and marks itself done, and the other one then stops taking turns.
"""

from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute

from .common import atom_add_s32, ld_shared_s32, st_shared_s32


@dataclass(frozen=True)
class SmemPipeline:
    full: object  # pointer to `stages` full mbarriers, followed by `stages` empty ones
    stages: int
    consumer_warps: int
    # first buffer of this pipeline's stages where several pipelines share one buffer array
    # (``stage`` adds it; the barriers are this pipeline's own); None: 0
    offset: object = None
    # one arrival per consumer warpgroup (its first warp's) on the empty barrier instead of
    # one per consumer warp
    wg_release: bool = False

    @property
    def empty(self):
        return self.full + self.stages

    @staticmethod
    def num_barriers(stages: int) -> int:
        return 2 * stages

    def init(self):
        """Run by one warp before the CTA-wide barrier that publishes the mbarriers."""
        with cute.arch.elect_one():
            for s in range(self.stages):
                cute.arch.mbarrier_init(self.full + s, 1)
                cute.arch.mbarrier_init(self.empty + s, self._release_count())

    def _release_count(self) -> int:
        if self.wg_release:
            if self.consumer_warps % 4:
                raise ValueError("SmemPipeline: wg_release needs whole consumer warpgroups")
            return self.consumer_warps // 4
        return self.consumer_warps

    def slot(self, c):
        """The barrier pair of buffer ``c`` (``c % stages``)."""
        return c % self.stages

    def stage(self, c):
        """The buffer of running count ``c`` in the (shared) buffer array."""
        if self.offset is None:
            return self.slot(c)
        return self.offset + self.slot(c)

    def phase(self, c):
        return (c // self.stages) & 1

    def full_ptr(self, c):
        return self.full + self.slot(c)

    def producer_acquire(self, c):
        cute.arch.mbarrier_wait(self.empty + self.slot(c), self.phase(c) ^ 1)

    def producer_expect_tx(self, c, nbytes: int):
        with cute.arch.elect_one():
            cute.arch.mbarrier_arrive_and_expect_tx(self.full + self.slot(c), nbytes)

    def producer_arrive(self, c):
        with cute.arch.elect_one():
            cute.arch.mbarrier_arrive(self.full + self.slot(c))

    def consumer_wait(self, c):
        cute.arch.mbarrier_wait(self.full + self.slot(c), self.phase(c))

    def consumer_test(self, c):
        """Whether stage ``c`` is full, without waiting (``mbarrier.test_wait``: where it
        returns True the stage's contents are visible as after ``consumer_wait``)."""
        return cute.arch.mbarrier_test_wait(self.full + self.slot(c), self.phase(c))

    @cute.jit
    def consumer_release(self, c):
        if cutlass.const_expr(self.wg_release):
            if cute.arch.make_warp_uniform(cute.arch.warp_idx()) % 4 == 0:
                with cute.arch.elect_one():
                    cute.arch.mbarrier_arrive(self.empty + self.slot(c))
        else:
            with cute.arch.elect_one():
                cute.arch.mbarrier_arrive(self.empty + self.slot(c))


@dataclass(frozen=True)
class WarpgroupTurns:
    """Turn order of ``count`` consumer warpgroups (ping-pong with two): warpgroup ``wg``
    waits on named barrier ``bar_base + wg`` and passes the turn to ``wg + 1`` (cyclic);
    each barrier joins the waiting and the passing warpgroup (``num_threads``)."""

    enabled: bool
    bar_base: int = 1
    num_threads: int = 256
    count: int = 2

    @cute.jit
    def start(self, wg):
        if cutlass.const_expr(self.enabled):
            if wg == 0:
                cute.arch.barrier_arrive(barrier_id=self.bar_base,
                                         number_of_threads=self.num_threads)

    @cute.jit
    def wait(self, wg):
        if cutlass.const_expr(self.enabled):
            cute.arch.barrier(barrier_id=self.bar_base + wg, number_of_threads=self.num_threads)

    @cute.jit
    def pass_turn(self, wg):
        if cutlass.const_expr(self.enabled):
            if cutlass.const_expr(self.count == 2):
                cute.arch.barrier_arrive(barrier_id=self.bar_base + 1 - wg,
                                         number_of_threads=self.num_threads)
            else:
                nxt = wg + 1
                if nxt == self.count:
                    nxt = 0
                cute.arch.barrier_arrive(barrier_id=self.bar_base + nxt,
                                         number_of_threads=self.num_threads)


@dataclass(frozen=True)
class PairTurns:
    """Turn order of two consumer warpgroups with work items of their own (ping-pong over
    different items, so over different numbers of turns), through named barriers
    ``bar_base + wg`` of 256 threads as :class:`WarpgroupTurns`.

    One warpgroup holds the turn at a time (between its ``bar.sync`` and its ``bar.arrive``
    on the other's barrier), and the shared-memory flags change only while the writer holds
    it, so whoever holds the turn reads them stable. ``done`` (two int32, zeroed before
    the CTA barrier that publishes the mbarriers): warpgroup ``wg`` sets ``done[wg]`` in
    :meth:`finish`, after its last item, once it holds the turn again, and hands the turn
    over a last time unless the other is done as well. ``mine``: this thread's int32 slot,
    1 while the other warpgroup takes turns; a warpgroup clears it when, holding the turn,
    it finds the other done, and from then on neither waits nor passes. (Every interleaving
    of up to four turns each is checked on a model in ``tests/test_pair_turns_model.py``.)

    The protocol needs every :meth:`wait` followed by exactly one :meth:`pass_turn` of the
    same warpgroup (a code path that waits without passing, or passes without waiting,
    leaves an arrival pending or a warpgroup waiting for ever), and :meth:`finish` once,
    after the warpgroup's last turn."""

    enabled: bool
    done: object  # shared-memory int32 pointer: done[0], done[1]
    mine: object  # this thread's shared-memory int32 slot
    wtid: object  # the thread's index in its warpgroup
    bar_base: int = 1
    num_threads: int = 256

    @cute.jit
    def start(self, wg):
        if cutlass.const_expr(self.enabled):
            st_shared_s32(self.mine, 1)
            # warpgroup 0 holds the first turn, as in WarpgroupTurns
            WarpgroupTurns(True, self.bar_base, self.num_threads).start(wg)

    @cute.jit
    def wait(self, wg):
        if cutlass.const_expr(self.enabled):
            if ld_shared_s32(self.mine) != 0:
                cute.arch.barrier(barrier_id=self.bar_base + wg,
                                  number_of_threads=self.num_threads)
                if ld_shared_s32(self.done + (1 - wg)) != 0:
                    st_shared_s32(self.mine, 0)

    @cute.jit
    def pass_turn(self, wg):
        if cutlass.const_expr(self.enabled):
            if ld_shared_s32(self.mine) != 0:
                cute.arch.barrier_arrive(barrier_id=self.bar_base + 1 - wg,
                                         number_of_threads=self.num_threads)

    @cute.jit
    def finish(self, wg):
        """After the warpgroup's last work item: take the turn, mark this warpgroup done and
        hand the turn over unless the other warpgroup is done too (which then waits for no
        turn any more)."""
        if cutlass.const_expr(self.enabled):
            if ld_shared_s32(self.mine) != 0:
                cute.arch.barrier(barrier_id=self.bar_base + wg,
                                  number_of_threads=self.num_threads)
                if self.wtid == 0:
                    st_shared_s32(self.done + wg, 1)
                if ld_shared_s32(self.done + (1 - wg)) == 0:
                    cute.arch.barrier_arrive(barrier_id=self.bar_base + 1 - wg,
                                             number_of_threads=self.num_threads)


@cute.jit
def fetch_item(counter_ptr, lane):
    """Dynamic deal of a persistent grid, producer warp: its CTA's next work item (lane 0's
    atomic add on the zeroed int32 at global ``counter_ptr``, broadcast to the warp, plus
    the grid size: the items below it are the CTAs' first, ``block_idx.x``)."""
    v = cutlass.Int32(0)
    if lane == 0:
        v = atom_add_s32(counter_ptr, 1)
    gdim, _, _ = cute.arch.grid_dim()
    return cute.arch.shuffle_sync(v, 0) + cutlass.Int32(gdim)


@cute.jit
def publish_item(pipe_t: SmemPipeline, slots, c_t, t):
    """Item ring, producer warp: item ``t`` into ring slot ``c_t`` (an int32 per 8-byte slot
    at shared ``slots``) once its readers freed it; the full barrier's arrival (release)
    publishes the store."""
    pipe_t.producer_acquire(c_t)
    with cute.arch.elect_one():
        st_shared_s32(slots + pipe_t.stage(c_t), t)
        cute.arch.mbarrier_arrive(pipe_t.full_ptr(c_t))


@cute.jit
def take_item(pipe_t: SmemPipeline, slots, c_t):
    """Item ring, a reading warp: the item of ring slot ``c_t`` (each reading warp arrives
    on the slot's empty barrier once its lanes have read it)."""
    pipe_t.consumer_wait(c_t)
    t = cute.arch.make_warp_uniform(ld_shared_s32(slots + pipe_t.stage(c_t)))
    cute.arch.sync_warp()
    pipe_t.consumer_release(c_t)
    return t


__all__ = ["PairTurns", "SmemPipeline", "WarpgroupTurns", "fetch_item", "publish_item",
           "take_item"]
