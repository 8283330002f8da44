"""Warp-specialized SM90 attention forward shared by the HSTU and the block-sparse forwards
(no jax imports): TMA producer warpgroup, wgmma consumer warpgroups, shared-memory pipelines,
persistent work loop, smem-staged epilogue.

``AttnFwdSm90Ws`` is the tiled attention; a kernel class (``hstu_fwd_sm90_ws.HstuFwdSm90Ws``,
``bsa_fwd_sm90_ws.BsaFwdSm90Ws``) derives from it, owns its ``__call__`` (TMA views of its
tensor layout, grid) and ``kernel`` (its arguments, the decoding of a work item) and supplies
the variation points (FA4's ``flash_attn/cute`` structure):

* which KV tiles a Q tile visits: the work item ``work`` (``work.n_count``,
  ``work.kv_tile(it)``) and the producer's views ``_q_tile`` / ``_k_tile`` / ``_v_tile`` of
  its TMA coordinate tensors, ``_kv_coord(work, n)`` (the index of KV tile ``n`` in the K / V
  views: ``n``, or its page with a page table), ``_v_limit(work, n)`` (valid rows of V tile ``n``, and whether
  the TMA box may load it) and ``_load_v_rows`` (the producer warp's zero-filling copy of a
  partial V tile, via ``_copy_v_rows``);
* what happens to a score tile: ``_tile_state`` (per-mainloop registers), ``_tile_pre``
  (per-tile loads issued before the QK GEMM is waited on), ``_tile_p`` (mask + score function
  -> the 16-bit P fragment, or what ``_p_final`` / ``_p_into`` turn into it once the PV GEMM
  reading the previous P has completed), ``_pv_done`` (after the PV GEMM of the previous tile completed),
  ``_work_start`` / ``_work_rows`` (per work item, before the mainloop);
* the epilogue ``_epilogue`` (``_store_o``: 16 bit -> swizzled smem -> row-predicated 128-bit
  stores; ``_store_o_tma``: 16 bit -> the 128-byte-swizzled operand layout in smem -> TMA
  tensor stores the warpgroup does not wait for, where a kernel sets ``tma_o``).

Attributes a kernel class sets: ``dtype``, ``d``, ``dv``, ``wg_m`` (64), ``bn``, ``num_wg``
(consumer warpgroups), ``stages`` (and ``k_stages`` where the K ring has fewer),
``q_stages``, ``o_alias_q``, ``overlap``, ``pingpong``,
``v_lag`` (the producer issues V tile ``j`` after K tile ``j + 1``), ``cross_item`` and
``cross_epi_first`` (chained work items, ``_consume_items``), optionally ``o_early`` (O
rescaled for tile ``j - 1`` under the S GEMM of tile ``j``, ``_o_early``), ``warp_producer``
(the producer is one warp after the consumer warpgroups and no registers move between
them, ``_consumer_start``), and the measurement options ``skip_load`` (N > 0: every N-th K / V
tile's loads skipped, ``_issue_kv``; a timing ablation), ``s_n64`` (``_s_n64``), ``mix_pv``
(``_issue_mixed``) and ``pair_step`` (the producer issues steps of two K tiles, then their
two V tiles, for a kernel whose consumer takes two tiles per step).
"""

# no ``from __future__ import annotations``: ``cute.struct`` reads its field annotations as
# types
from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
import cutlass.memory
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Float32, Int32
from cutlass.cute.nvgpu import OperandMajorMode, cpasync, warpgroup
from cutlass.tensor_utils import LayoutEnum

from . import hstu_common as hc
from .common import (L2_EVICT_FIRST, L2_EVICT_LAST, acc_layout_as_a, gmem_load_copy,
                     gmem_store_copy, l2_copy_kw, ldmatrix_atoms, smem_layout_16b,
                     st_shared_s32, stage_acc_sw128, stage_acc_swz, swz_rows_to_gmem,
                     transpose_view_staged)
from .pipeline import SmemPipeline, WarpgroupTurns

SMEM_LIMIT = 227 * 1024


def smem_plan(d: int, dv: int, bm: int, bn: int, limit: int, max_stages: int = 4,
              q_stages: int = 2, alias_first: bool = False, reserve: int = 1024 + 256):
    """(K/V stages, Q stages, whether O's smem buffer aliases Q's) within ``limit`` bytes for
    ``bm`` query rows and ``bn``-key tiles: a double-buffered Q (the next item's Q loads
    during this item's mainloop) with its own O buffer first, then one Q stage, then O in
    Q's buffer (only when ``dv <= d``); for each, the most K/V stages (at least 2).
    ``alias_first``: O in the single Q buffer first (the most K/V stages). ``reserve``: bytes
    besides the buffers (the mbarriers, padded to the 1024-byte alignment of Q)."""
    o = bm * dv * 2
    plans = [(qs, False) for qs in range(q_stages, 0, -1)] + [(1, True)]
    if alias_first:
        plans = [(1, True)] + plans
    for qs, alias in plans:
        if alias and dv > d:
            continue
        for stages in range(max_stages, 1, -1):
            total = (qs * bm * d * 2 + stages * bn * (d + dv) * 2 + (0 if alias else o)
                     + reserve)
            if total <= limit:
                return stages, qs, alias
    raise ValueError(f"no shared-memory plan for head_dim={d}, head_dim_v={dv}, block_n={bn}")


class QRegs:
    """With ``q_regs``: what a consumer thread copies its Q slice into registers with (the
    ``ldmatrix`` slice ``s2r`` of the S MMA's A operand, its partition ``tQs`` of ``sQ``) and
    makes the register operand of (``thr_mma``, ``sQ``)."""

    def __init__(self, s2r, tQs, thr_mma, sQ):
        self.s2r, self.tQs, self.thr_mma, self.sQ = s2r, tQs, thr_mma, sQ


class KHalves:
    """With ``s_n64`` (an ablation at ``bn`` 128): ``S = Q K^T`` issued as two 64-column
    GEMMs, one per row half of the K tile: their tiled MMAs (``mma``, ``mma0`` the
    overwriting first slice), the two halves' B fragments and the layout of a half's
    accumulator (the 64 x 128 accumulator's registers are the two halves' in turn)."""

    def __init__(self, mma, mma0, halves, acc_layout):
        self.mma, self.mma0, self.halves, self.acc_layout = mma, mma0, halves, acc_layout


@dataclass(frozen=True)
class WorkItem:
    """One work item (a Q tile of one (batch or sequence, head)): ``kv`` says which KV tiles
    it visits (``block_info.BlockInfo`` range or ``BlockList``: ``n_count``, ``kv_tile``);
    the other fields locate it in its kernel's tensors (None where a kernel has no use)."""

    kv: object
    head: object
    mV: object
    seq: object = None
    batch: object = None
    head_kv: object = None
    # paged KV (a kernel with a page table): (page_ids, first page slot, page slots)
    pages: object = None

    @property
    def n_count(self):
        return self.kv.n_count

    def kv_tile(self, it):
        return self.kv.kv_tile(it)


@dataclass(frozen=True)
class SelfLoader:
    """A consumer warpgroup's own loads of one work item (kernels without a producer warp,
    ``self_load``): warp ``0`` of the warpgroup (``is_loader``) issues the TMA of the item's
    Q and of its K / V tiles into the rings as the warpgroup frees their stages."""

    work: object  # the item (with head_kv)
    m_block: object
    is_loader: object  # Boolean: this thread's warp issues the loads
    tma_q: object
    tQg: object
    tQs: object
    tma_k: object
    tKg: object
    tKs: object
    tma_v: object
    tVg: object
    tVs: object
    sV_rows: object
    pipe_q: object
    pipe_k: object
    pipe_v: object
    q_bytes: object
    k_bytes: object
    v_bytes: object
    lane: object


class AttnFwdSm90Ws:
    # ------------------------------------------------------------------ host-side setup
    def _mmas_and_layouts(self):
        """The three tiled MMAs (``S = Q K^T``, its first K slice that overwrites the
        accumulator, ``O += P V`` with P from registers) and the smem layouts of Q
        (``num_wg * q_stages`` 64-row slices), K, V (``stages``) and one warpgroup's O."""
        dt = self.dtype
        wgm, bn, d, dv = self.wg_m, self.bn, self.d, self.dv
        qk_tiler = (wgm, bn, d)
        pv_tiler = (wgm, dv, bn)
        # q_regs: Q is the register operand of S = Q K^T (loaded once per work item)
        q_src = (warpgroup.OperandSource.RMEM if self._q_regs() else
                 warpgroup.OperandSource.SMEM)
        mma_qk = sm90_utils.make_trivial_tiled_mma(
            dt, dt, OperandMajorMode.K, OperandMajorMode.K, Float32, (1, 1, 1), (wgm, bn),
            q_src)
        # the first K slice of S = Q K^T overwrites the accumulator (no zero fill)
        mma_qk0 = sm90_utils.make_trivial_tiled_mma(
            dt, dt, OperandMajorMode.K, OperandMajorMode.K, Float32, (1, 1, 1), (wgm, bn),
            q_src)
        mma_pv = sm90_utils.make_trivial_tiled_mma(
            dt, dt, OperandMajorMode.K, OperandMajorMode.MN, Float32, (1, 1, 1), (wgm, dv),
            warpgroup.OperandSource.RMEM)
        sQ_layout = sm90_utils.make_smem_layout_a(LayoutEnum.ROW_MAJOR, qk_tiler, dt,
                                                  self.num_wg * self.q_stages)
        sK_layout = sm90_utils.make_smem_layout_b(LayoutEnum.ROW_MAJOR, qk_tiler, dt,
                                                  self._k_stages() * self._rings())
        sV_layout = sm90_utils.make_smem_layout_b(LayoutEnum.COL_MAJOR, pv_tiler, dt,
                                                  self.stages * self._rings())
        sO_layout = smem_layout_16b(wgm, dv)
        if cutlass.const_expr(self._tma_o()):
            # O leaves by TMA: the 128-byte-swizzled K-major layout of one 64-row slice
            sO_layout = sm90_utils.make_smem_layout_a(LayoutEnum.ROW_MAJOR, (wgm, bn, dv), dt, 1)
        return mma_qk, mma_qk0, mma_pv, sQ_layout, sK_layout, sV_layout, sO_layout

    def _k_stages(self):
        """Stages of the K ring (``k_stages`` where a kernel sets one, else ``stages``, the
        V ring's): both rings advance on the same running count of KV tiles."""
        return getattr(self, "k_stages", self.stages)

    def _pair(self):
        """Whether each of the two consumer warpgroups runs work items of its own
        (``pair_items``): its own 64-row query tile and KV tiles, through its own Q / K / V
        rings fed by its own producer warp (warp ``wg`` of the producer warpgroup), the
        warpgroups taking turns at their GEMMs (``pipeline.PairTurns``)."""
        return bool(getattr(self, "pair_items", False))

    def _rings(self):
        """Sets of Q / K / V rings: one per consumer warpgroup with ``pair_items``, else one
        shared by the consumer warpgroups."""
        return 2 if self._pair() else 1

    def _q_slices(self):
        """64-row Q slices of one work item (one per consumer warpgroup sharing it)."""
        return 1 if self._pair() else self.num_wg

    def _q_slice(self, s, wg):
        """Index in ``sQ`` of warpgroup ``wg``'s Q slice in Q buffer ``s`` (a Q pipeline's
        ``stage``, which with ``pair_items`` already selects the warpgroup's own buffers)."""
        if cutlass.const_expr(self._pair()):
            return s
        return self.num_wg * s + wg

    def _wg_row0(self, wg):
        """First row of warpgroup ``wg``'s 64 rows in its work item's query tile."""
        if cutlass.const_expr(self._pair()):
            return 0
        return wg * self.wg_m

    def _tma_atoms(self, tQ, tK, tV, sQ_layout, sK_layout, sV_layout):
        """TMA load atoms and coordinate tensors of the views ``tQ``, ``tK`` (rows, D, ...)
        and ``tV`` (Dv, rows, ...): boxes of one 64-row Q slice, one K tile, one V tile."""
        wgm, bn, d, dv = self.wg_m, self.bn, self.d, self.dv
        g2s = cpasync.CopyBulkTensorTileG2SOp()
        tma_q, tma_tQ = cpasync.make_tiled_tma_atom(
            g2s, tQ, cute.slice_(sQ_layout, (None, None, 0)), (wgm, d))
        tma_k, tma_tK = cpasync.make_tiled_tma_atom(
            g2s, tK, cute.slice_(sK_layout, (None, None, 0)), (bn, d))
        tma_v, tma_tV = cpasync.make_tiled_tma_atom(
            g2s, tV, cute.slice_(sV_layout, (None, None, 0)), (dv, bn))
        return tma_q, tma_tQ, tma_k, tma_tK, tma_v, tma_tV

    def _smem_struct(self, sQ_layout, sK_layout, sV_layout, sO_layout):
        """Shared memory: the pipelines' mbarriers, Q, K, V and (unless O aliases Q) one O
        buffer per consumer warpgroup."""
        dt = self.dtype
        n_mbar = self._rings() * self._mbar_per_ring()
        o_elems = 0 if cutlass.const_expr(self.o_alias_q) else cute.cosize(sO_layout) * self.num_wg
        n_ring = getattr(self, "item_ring", 0)
        if cutlass.const_expr(self._pair()):
            # the warpgroups' turn flags (``pipeline.PairTurns``): done[2], one slot per
            # consumer thread
            @cute.struct
            class SmemPair:
                mbar: cute.struct.MemRange[cutlass.Int64, n_mbar]
                turn: cute.struct.MemRange[Int32, 2 + 128 * self.num_wg]
                sQ: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sQ_layout)], 1024]
                sK: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sK_layout)], 1024]
                sV: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sV_layout)], 1024]
                sO: cute.struct.Align[cute.struct.MemRange[dt, o_elems], 1024]

            return SmemPair
        if n_ring:
            # a kernel's item ring (dynamic deal): 2 mbarriers and one 8-byte slot per stage
            @cute.struct
            class SmemRing:
                mbar: cute.struct.MemRange[cutlass.Int64, n_mbar]
                ring: cute.struct.MemRange[cutlass.Int64, 3 * n_ring]
                sQ: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sQ_layout)], 1024]
                sK: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sK_layout)], 1024]
                sV: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sV_layout)], 1024]
                sO: cute.struct.Align[cute.struct.MemRange[dt, o_elems], 1024]

            return SmemRing

        @cute.struct
        class Smem:
            mbar: cute.struct.MemRange[cutlass.Int64, n_mbar]
            sQ: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sQ_layout)], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sK_layout)], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sV_layout)], 1024]
            sO: cute.struct.Align[cute.struct.MemRange[dt, o_elems], 1024]

        return Smem

    # ------------------------------------------------------------------ kernel pieces
    def _mbar_per_ring(self):
        """mbarriers of one set of Q / K / V rings."""
        return (SmemPipeline.num_barriers(self.q_stages)
                + SmemPipeline.num_barriers(self._k_stages())
                + SmemPipeline.num_barriers(self.stages))

    def _ring_pipes(self, mbar, ring=None):
        """The Q, K, V pipelines of ring set ``ring`` (None: the one set, shared by the
        consumer warpgroups; with ``pair_items`` each set has one consumer warpgroup and
        the buffers from ``ring`` times a set's stages)."""
        nq = 2 * self.q_stages
        nk = 2 * self._k_stages()
        wgr = self._wg_release()
        if cutlass.const_expr(ring is None):
            pipe_q = SmemPipeline(mbar, self.q_stages, 4 * self.num_wg)
            pipe_k = SmemPipeline(mbar + nq, self._k_stages(), 4 * self.num_wg, wg_release=wgr)
            pipe_v = SmemPipeline(mbar + nq + nk, self.stages, 4 * self.num_wg, wg_release=wgr)
            return pipe_q, pipe_k, pipe_v
        base = mbar + ring * self._mbar_per_ring()
        return (SmemPipeline(base, self.q_stages, 4, ring * self.q_stages),
                SmemPipeline(base + nq, self._k_stages(), 4, ring * self._k_stages(),
                             wg_release=wgr),
                SmemPipeline(base + nq + nk, self.stages, 4, ring * self.stages,
                             wg_release=wgr))

    def _wg_release(self):
        """Whether the K / V stages are released by one arrival per consumer warpgroup (a
        kernel's ``wg_release``; ``pipeline.SmemPipeline``) instead of one per warp."""
        return bool(getattr(self, "wg_release", False))

    @cute.jit
    def _smem_and_pipes(self, Smem, sQ_layout, sK_layout, sV_layout, tma_q, tma_k, tma_v,
                        warp, ring=None):
        """Allocate shared memory, initialise the Q / K / V pipelines (warp 0; then a CTA
        barrier) and return ``(storage, pipe_q, pipe_k, pipe_v, sQ, sK, sV, q_bytes,
        k_bytes, v_bytes)``. ``ring`` (with ``pair_items``): the ring set of the calling
        thread's warpgroup (consumers) or warp (producer)."""
        smem = cutlass.memory.SmemAllocator()
        st = smem.allocate(Smem)
        mbar = st.mbar.data_ptr()
        pipe_q, pipe_k, pipe_v = self._ring_pipes(mbar, ring)
        if warp == 0:
            if cutlass.const_expr(self._pair()):
                for r in cutlass.range_constexpr(self._rings()):
                    rq, rk, rv = self._ring_pipes(mbar, r)
                    rq.init()
                    rk.init()
                    rv.init()
                # the warpgroups' turn flags start cleared
                with cute.arch.elect_one():
                    st_shared_s32(st.turn.data_ptr(), 0)
                    st_shared_s32(st.turn.data_ptr() + 1, 0)
            else:
                pipe_q.init()
                pipe_k.init()
                pipe_v.init()
            cpasync.prefetch_descriptor(tma_q)
            cpasync.prefetch_descriptor(tma_k)
            cpasync.prefetch_descriptor(tma_v)
        cute.arch.mbarrier_init_fence()
        cute.arch.barrier()
        if cutlass.const_expr(self.pdl):
            # programmatic dependent launch: no global memory access before the previous
            # grid has completed and flushed its writes
            cute.arch.griddepcontrol_wait()

        sQ = st.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)  # (64, D, nwg Qstages)
        sK = st.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)  # (BN, D, S)
        sV = st.sV.get_tensor(sV_layout.outer, swizzle=sV_layout.inner)  # (Dv, BN, S)
        q_bytes = (cute.size_in_bytes(self.dtype, cute.slice_(sQ_layout, (None, None, 0)))
                   * self._q_slices())
        k_bytes = cute.size_in_bytes(self.dtype, cute.slice_(sK_layout, (None, None, 0)))
        v_bytes = cute.size_in_bytes(self.dtype, cute.slice_(sV_layout, (None, None, 0)))
        return st, pipe_q, pipe_k, pipe_v, sQ, sK, sV, q_bytes, k_bytes, v_bytes

    def _loop_start(self, sched):
        """Pipeline counters ``(c_q, c_kv)`` and the first work item of this CTA."""
        return Int32(0), Int32(0), sched.first()

    def _producer_warp_start(self, sV, sched):
        """The producer warp's lane, V's row view ``(BN, Dv, stages)`` (for the zero-filling
        copy), the pipeline counters and the first work item."""
        lane = cute.arch.lane_idx()
        sV_rows = transpose_view_staged(sV)
        return (lane, sV_rows) + self._loop_start(sched)

    def _consumer_start(self, wg_idx, tidx):
        """A consumer warpgroup takes its register budget; returns its index, the thread's
        index in it and the ping-pong turns."""
        if cutlass.const_expr(getattr(self, "warp_producer", False)):
            # the consumer warpgroups come first and the producer is one warp after them
            # (no register moves)
            return wg_idx, tidx % 128, WarpgroupTurns(self.pingpong, count=self.num_wg)
        cute.arch.setmaxregister_increase(self.regs_consumer)
        return wg_idx - 1, tidx % 128, WarpgroupTurns(self.pingpong, count=self.num_wg)

    def _wg_bar(self, wg):
        """The named barrier of consumer warpgroup ``wg`` alone (epilogue, Q scaling): after
        the turn barriers ``1 .. num_wg``, at least 3."""
        return max(3, 1 + self.num_wg) + wg

    @cute.jit
    def _produce(self, work, m_block, tma_q, tma_tQ, tma_k, tma_tK, tma_v, tma_tV, sQ, sK, sV,
                 sV_rows, pipe_q, pipe_k, pipe_v, q_bytes, k_bytes, v_bytes, c_q, c_kv, lane,
                 first_entry=None, q_mine=None, q_next=None, kv_extra=None, role=None):
        """Producer warp, one work item: TMA of its ``num_wg`` Q slices, then of the K and V
        tiles it visits (a partial V tile: the zero-filling copy ``_load_v_rows``).
        ``first_entry`` (block-list kernels): the raw list entry of iteration 0, loaded
        earlier; each iteration then loads the next iteration's entry before it waits for
        free K / V stages. Q issued ahead (with ``first_entry``): ``q_mine`` (Int32) 0 when
        the previous item has already issued this item's Q; ``q_next = (work, m_block,
        go)``: the next item's Q is issued after this item's K / V tile
        ``min(stages, n) - 1`` when ``go`` is 1 (its buffer is then free, as the previous
        item's last K / V tiles are). ``kv_extra`` (the range walk only): the kernel's
        ``_kv_extra_issue`` runs with it after each K / V tile's loads. ``role`` (Int32;
        None: both): 1 this warp issues Q and the K tiles only, 2 the V tiles only (two
        producer warps, ``kv_warps``; the plain and the ``pair_step`` loops)."""
        wgm, d = self.wg_m, self.d
        if work.n_count > 0:
            prefetch = None
            if cutlass.const_expr(self._kv_prefetch()):
                # the first KV tile's table entry loads while Q is acquired and loaded
                prefetch = self._kv_entry(work, work.kv_tile(0))
            gQ = cute.local_tile(self._q_tile(tma_tQ, work), (wgm, d), (None, 0))
            tQs, tQg = cpasync.tma_partition(
                tma_q, 0, cute.make_layout(1), cute.group_modes(sQ, 0, 2),
                cute.group_modes(gQ, 0, 2))
            tKs, tKg, tVs, tVg = self._kv_partitions(work, tma_k, tma_tK, sK, tma_v, tma_tV,
                                                     sV)
            if cutlass.const_expr(role is not None):
                if role != 2:
                    self._issue_q(tma_q, tQg, tQs, m_block, pipe_q, q_bytes, c_q)
                    c_q += 1
            elif cutlass.const_expr(q_mine is None):
                self._issue_q(tma_q, tQg, tQs, m_block, pipe_q, q_bytes, c_q)
                c_q += 1
            else:
                if q_mine != 0:
                    self._issue_q(tma_q, tQg, tQs, m_block, pipe_q, q_bytes, c_q)
                    c_q += 1
            if cutlass.const_expr(self._kv_prefetch()):
                c_kv = self._produce_kv_prefetched(
                    work, prefetch, tma_k, tKg, tKs, tma_v, tVg, tVs, sV_rows, pipe_k, pipe_v,
                    k_bytes, v_bytes, c_kv, lane)
            elif cutlass.const_expr(getattr(self, "pair_step", 0)):
                # steps of two KV tiles (a kernel's ``pair_step``): the two K tiles, then the
                # two V tiles, so that a step's K tiles wait only for the S GEMM that frees
                # their stages, not for the V stages a later PV GEMM frees
                last = work.n_count - 1
                for s in cutlass.range((work.n_count + 1) // 2, unroll=1):
                    it = 2 * s
                    second = cutlass.min(last - it, Int32(1))
                    n0 = work.kv_tile(it)
                    n1 = work.kv_tile(it + second)
                    nk0 = self._kv_coord(work, n0)
                    nk1 = self._kv_coord(work, n1)
                    if self._issues(role, 1):
                        self._issue_k(n0, nk0, tma_k, tKg, tKs, pipe_k, k_bytes, c_kv)
                        if second > 0:
                            self._issue_k(n1, nk1, tma_k, tKg, tKs, pipe_k, k_bytes, c_kv + 1)
                    if self._issues(role, 2):
                        self._issue_v(work, n0, nk0, tma_v, tVg, tVs, sV_rows, pipe_v,
                                      v_bytes, c_kv, lane)
                        if second > 0:
                            self._issue_v(work, n1, nk1, tma_v, tVg, tVs, sV_rows, pipe_v,
                                          v_bytes, c_kv + 1, lane)
                    c_kv += 1 + second
            elif cutlass.const_expr(self.v_lag):
                # V one tile behind K: K tile j goes out once its stage is free (its S GEMM
                # j - stages has completed) without waiting for V tile j's stage, which
                # frees a tile later (the PV GEMM lags the S GEMM by one tile)
                n_prev = Int32(0)
                nk_prev = Int32(0)
                for it in cutlass.range(work.n_count, unroll=1):
                    n = work.kv_tile(it)
                    nk = self._kv_coord(work, n)
                    self._issue_k(n, nk, tma_k, tKg, tKs, pipe_k, k_bytes, c_kv)
                    if it > 0:
                        self._issue_v(work, n_prev, nk_prev, tma_v, tVg, tVs, sV_rows, pipe_v,
                                      v_bytes, c_kv - 1, lane)
                    n_prev = n
                    nk_prev = nk
                    c_kv += 1
                self._issue_v(work, n_prev, nk_prev, tma_v, tVg, tVs, sV_rows, pipe_v,
                              v_bytes, c_kv - 1, lane)
            elif cutlass.const_expr(first_entry is not None):
                cur = work.kv.clamp(first_entry)
                last = work.n_count - 1
                q_at = cutlass.min(Int32(self.stages), work.n_count) - 1
                for it in cutlass.range(work.n_count, unroll=1):
                    n = cur
                    cur = work.kv_tile(cutlass.min(it + 1, last))
                    nk = self._kv_coord(work, n)
                    self._issue_kv(work, n, nk, tma_k, tKg, tKs, tma_v, tVg, tVs, sV_rows,
                                   pipe_k, pipe_v, k_bytes, v_bytes, c_kv, lane)
                    c_kv += 1
                    if cutlass.const_expr(q_next is not None):
                        nwork, nm_block, go = q_next
                        if it == q_at:
                            if go != 0:
                                gQn = cute.local_tile(self._q_tile(tma_tQ, nwork), (wgm, d),
                                                      (None, 0))
                                tQsn, tQgn = cpasync.tma_partition(
                                    tma_q, 0, cute.make_layout(1), cute.group_modes(sQ, 0, 2),
                                    cute.group_modes(gQn, 0, 2))
                                self._issue_q(tma_q, tQgn, tQsn, nm_block, pipe_q, q_bytes, c_q)
                                c_q += 1
            elif cutlass.const_expr(role is not None):
                for it in cutlass.range(work.n_count, unroll=1):
                    n = work.kv_tile(it)
                    nk = self._kv_coord(work, n)
                    if role == 1:
                        self._issue_k(n, nk, tma_k, tKg, tKs, pipe_k, k_bytes, c_kv)
                    else:
                        self._issue_v(work, n, nk, tma_v, tVg, tVs, sV_rows, pipe_v, v_bytes,
                                      c_kv, lane)
                    c_kv += 1
            else:
                for it in cutlass.range(work.n_count, unroll=1):
                    n = work.kv_tile(it)
                    nk = self._kv_coord(work, n)  # the tile's index in the K / V TMA views
                    self._issue_kv(work, n, nk, tma_k, tKg, tKs, tma_v, tVg, tVs, sV_rows,
                                   pipe_k, pipe_v, k_bytes, v_bytes, c_kv, lane)
                    if cutlass.const_expr(kv_extra is not None):
                        self._kv_extra_issue(kv_extra, work, m_block, n, lane)
                    c_kv += 1
        return c_q, c_kv

    @cute.jit
    def _kv_partitions(self, work, tma_k, tma_tK, sK, tma_v, tma_tV, sV):
        """The producer's TMA partitions ``(tKs, tKg, tVs, tVg)`` of the K / V stages and of
        the work item's K / V views, one box per KV tile (a kernel whose stages take several
        boxes returns them per part)."""
        bn, d, dv = self.bn, self.d, self.dv
        gK = cute.local_tile(self._k_tile(tma_tK, work), (bn, d), (None, 0))
        tKs, tKg = cpasync.tma_partition(
            tma_k, 0, cute.make_layout(1), cute.group_modes(sK, 0, 2),
            cute.group_modes(gK, 0, 2))
        gV = cute.local_tile(self._v_tile(tma_tV, work), (dv, bn), (0, None))
        tVs, tVg = cpasync.tma_partition(
            tma_v, 0, cute.make_layout(1), cute.group_modes(sV, 0, 2),
            cute.group_modes(gV, 0, 2))
        return tKs, tKg, tVs, tVg

    def _issues(self, role, which: int):
        """Whether the producer warp of ``role`` (None: the one warp) issues the loads of
        ``which`` (1: K, 2: V): True, or the Boolean ``role == which``."""
        if role is None:
            return True
        return role == which

    def _self_loader(self, work, m_block, is_loader, tma_q, tma_tQ, tma_k, tma_tK, tma_v,
                     tma_tV, sQ, sK, sV, sV_rows, pipe_q, pipe_k, pipe_v, q_bytes, k_bytes,
                     v_bytes, lane):
        """The ``SelfLoader`` of work item ``work`` (query block ``m_block``): the TMA
        partitions of its Q, K and V views."""
        wgm, bn, d, dv = self.wg_m, self.bn, self.d, self.dv
        gQ = cute.local_tile(self._q_tile(tma_tQ, work), (wgm, d), (None, 0))
        tQs, tQg = cpasync.tma_partition(tma_q, 0, cute.make_layout(1),
                                         cute.group_modes(sQ, 0, 2), cute.group_modes(gQ, 0, 2))
        gK = cute.local_tile(self._k_tile(tma_tK, work), (bn, d), (None, 0))
        tKs, tKg = cpasync.tma_partition(tma_k, 0, cute.make_layout(1),
                                         cute.group_modes(sK, 0, 2), cute.group_modes(gK, 0, 2))
        gV = cute.local_tile(self._v_tile(tma_tV, work), (dv, bn), (0, None))
        tVs, tVg = cpasync.tma_partition(tma_v, 0, cute.make_layout(1),
                                         cute.group_modes(sV, 0, 2), cute.group_modes(gV, 0, 2))
        return SelfLoader(work, m_block, is_loader, tma_q, tQg, tQs, tma_k, tKg, tKs, tma_v,
                          tVg, tVs, sV_rows, pipe_q, pipe_k, pipe_v, q_bytes, k_bytes, v_bytes,
                          lane)

    @cute.jit
    def _self_load_item(self, ld, c_q, c_kv):
        """The loader warp: the item's Q, K tile 0 and V tiles 0 and 1 (the V ring's two
        stages; the item has at least one tile)."""
        if ld.is_loader:
            self._issue_q(ld.tma_q, ld.tQg, ld.tQs, ld.m_block, ld.pipe_q, ld.q_bytes, c_q)
            n0 = ld.work.kv_tile(0)
            self._self_load_k(ld, n0, c_kv)
            self._self_load_v(ld, n0, c_kv)
            if ld.work.n_count > 1:
                self._self_load_v(ld, ld.work.kv_tile(1), c_kv + 1)

    @cute.jit
    def _self_load_k(self, ld, n, c):
        """The loader warp: K tile ``n`` into slot ``c`` of the K ring."""
        if ld.is_loader:
            self._issue_k(n, self._kv_coord(ld.work, n), ld.tma_k, ld.tKg, ld.tKs, ld.pipe_k,
                          ld.k_bytes, c)

    @cute.jit
    def _self_load_v(self, ld, n, c):
        """The loader warp: V tile ``n`` into slot ``c`` of the V ring."""
        if ld.is_loader:
            self._issue_v(ld.work, n, self._kv_coord(ld.work, n), ld.tma_v, ld.tVg, ld.tVs,
                          ld.sV_rows, ld.pipe_v, ld.v_bytes, c, ld.lane)

    @cute.jit
    def _issue_q(self, tma_q, tQg, tQs, m_block, pipe_q, q_bytes, c_q):
        """TMA of query tile ``m_block``'s Q slices (``num_wg``; with ``pair_items`` one)
        into stage ``c_q`` of the Q ring."""
        nwg = self._q_slices()
        pipe_q.producer_acquire(c_q)
        pipe_q.producer_expect_tx(c_q, q_bytes)
        sq = pipe_q.stage(c_q)
        for w in cutlass.range_constexpr(nwg):
            cute.copy(tma_q, tQg[None, nwg * m_block + w], tQs[None, nwg * sq + w],
                      tma_bar_ptr=pipe_q.full_ptr(c_q), **self._l2(self._q_priority()))

    @cute.jit
    def _produce_kv_prefetched(self, work, prefetch, tma_k, tKg, tKs, tma_v, tVg, tVs,
                               sV_rows, pipe_k, pipe_v, k_bytes, v_bytes, c_kv, lane):
        """The K / V loop of ``_produce`` with the KV tiles' table entries (``_kv_entry``)
        loaded one tile ahead: iteration ``it`` issues the load of tile ``it + 1``'s entry before it waits
        for the free K / V stages, and its TMA coordinates come from the entry loaded one
        iteration earlier (``prefetch``: tile 0's)."""
        cur = prefetch
        last = work.n_count - 1
        for it in cutlass.range(work.n_count, unroll=1):
            n = work.kv_tile(it)
            entry = cur
            cur = self._kv_entry(work, work.kv_tile(cutlass.min(it + 1, last)))
            nk = self._kv_coord_of(work, n, entry)
            self._issue_kv(work, n, nk, tma_k, tKg, tKs, tma_v, tVg, tVs, sV_rows, pipe_k,
                           pipe_v, k_bytes, v_bytes, c_kv, lane)
            c_kv += 1
        return c_kv

    @cute.jit
    def _issue_kv(self, work, n, nk, tma_k, tKg, tKs, tma_v, tVg, tVs, sV_rows, pipe_k,
                  pipe_v, k_bytes, v_bytes, c_kv, lane):
        """Load KV tile ``n`` (index ``nk`` in the K / V TMA views) into stage ``c_kv`` of the
        K and V rings: K by TMA; V by TMA, or row by row (``_load_v_rows``) where
        ``_v_limit`` says a TMA box would read rows it must not. A kernel's ``skip_load``
        (N > 0, a timing ablation) leaves the stages of every N-th tile as they were: the
        full barriers get a plain arrive, the consumers read the stages' old contents."""
        skip = getattr(self, "skip_load", 0)
        if cutlass.const_expr(skip > 0):
            if c_kv % skip == skip - 1:
                pipe_k.producer_acquire(c_kv)
                pipe_k.producer_arrive(c_kv)
                pipe_v.producer_acquire(c_kv)
                pipe_v.producer_arrive(c_kv)
            else:
                self._issue_k(n, nk, tma_k, tKg, tKs, pipe_k, k_bytes, c_kv)
                self._issue_v(work, n, nk, tma_v, tVg, tVs, sV_rows, pipe_v, v_bytes, c_kv,
                              lane)
        else:
            self._issue_k(n, nk, tma_k, tKg, tKs, pipe_k, k_bytes, c_kv)
            self._issue_v(work, n, nk, tma_v, tVg, tVs, sV_rows, pipe_v, v_bytes, c_kv, lane)

    @cute.jit
    def _issue_k(self, n, nk, tma_k, tKg, tKs, pipe_k, k_bytes, c):
        """TMA of K tile ``n`` (index ``nk`` of the view) into stage ``c`` of the K ring."""
        pipe_k.producer_acquire(c)
        pipe_k.producer_expect_tx(c, k_bytes)
        cute.copy(tma_k, tKg[None, nk], tKs[None, pipe_k.stage(c)],
                  tma_bar_ptr=pipe_k.full_ptr(c), **self._l2(L2_EVICT_LAST))

    @cute.jit
    def _issue_v(self, work, n, nk, tma_v, tVg, tVs, sV_rows, pipe_v, v_bytes, c, lane):
        """V tile ``n`` into stage ``c`` of the V ring: TMA, or the zero-filling row copy
        where ``_v_limit`` says a box would read rows it must not."""
        s = pipe_v.stage(c)
        pipe_v.producer_acquire(c)
        limit, tma_ok = self._v_limit(work, n)
        if tma_ok:
            pipe_v.producer_expect_tx(c, v_bytes)
            cute.copy(tma_v, tVg[None, nk], tVs[None, s], tma_bar_ptr=pipe_v.full_ptr(c),
                      **self._l2(L2_EVICT_LAST))
        else:
            self._load_v_rows(work, n, limit, sV_rows, s, lane)
            pipe_v.producer_arrive(c)

    def _kv_prefetch(self):
        """Whether the producer loads the KV tiles' table entries one tile ahead
        (``_produce_kv_prefetched``; a kernel with a per-tile table lookup may say so)."""
        return False

    def _kv_entry(self, work, n):
        """The table entry that KV tile ``n``'s coordinate is made of (kernels that prefetch:
        issues the load)."""
        return n

    def _kv_coord_of(self, work, n, entry):
        """KV tile ``n``'s index in the K / V TMA views from its table entry ``entry``."""
        return entry

    def _kv_coord(self, work, n):
        """The index in the K / V TMA views of the work item's KV tile ``n`` (``n`` itself;
        a paged kernel maps it through its page table)."""
        return n

    @cute.jit
    def _copy_v_rows(self, gV, limit, sV_rows, stage, lane):
        """One warp: rows ``< limit`` of the V tile ``gV`` (rows, Dv) by cp.async into stage
        ``stage`` of ``sV_rows``, zeros in the other rows."""
        copy_v = gmem_load_copy(self.dtype, 32, self.dv)
        thr = copy_v.get_slice(lane)
        tg = thr.partition_S(gV)
        ts = thr.partition_D(sV_rows[None, None, stage])
        tc = thr.partition_S(cute.make_identity_tensor((cute.size(gV, mode=[0]), self.dv)))
        for r in cutlass.range(cute.size(ts.shape[1]), unroll=1):
            if tc[0, r, 0][0] < limit:
                cute.copy(copy_v, tg[None, r, None], ts[None, r, None])
            else:
                ts[None, r, None].fill(0)
        cute.arch.cp_async_commit_group()
        cute.arch.cp_async_wait_group(0)
        # cp.async / zero-fill stores (generic proxy) -> visible to wgmma (async proxy)
        cute.arch.fence_proxy("async.shared", space="cta")
        cute.arch.sync_warp()

    @cute.jit
    def _consumer_fragments(self, mma_qk, mma_qk0, mma_pv, sQ, sK, sV, wtid):
        """Consumer warpgroup: MMA accumulate modes, thread slices, the smem operand
        fragments of Q, K, V and the (row, col) identity partition of a score tile."""
        mma_qk.set(warpgroup.Field.ACCUMULATE, True)
        mma_qk0.set(warpgroup.Field.ACCUMULATE, False)
        mma_pv.set(warpgroup.Field.ACCUMULATE, True)
        thr_mma_qk = mma_qk.get_slice(wtid)
        thr_mma_pv = mma_pv.get_slice(wtid)
        if cutlass.const_expr(self._q_regs()):
            # Q slices are copied into a register operand per work item (_q_operand)
            s2r = cute.make_tiled_copy_A(ldmatrix_atoms(self.dtype)[0], mma_qk).get_slice(wtid)
            tSrQ = QRegs(s2r, s2r.partition_S(sQ), thr_mma_qk, sQ)
        else:
            tSrQ = thr_mma_qk.make_fragment_A(thr_mma_qk.partition_A(sQ))
        tSrK = thr_mma_qk.make_fragment_B(thr_mma_qk.partition_B(sK))
        if cutlass.const_expr(self._s_n64()):
            mma64 = sm90_utils.make_trivial_tiled_mma(
                self.dtype, self.dtype, OperandMajorMode.K, OperandMajorMode.K, Float32,
                (1, 1, 1), (self.wg_m, 64), warpgroup.OperandSource.SMEM)
            mma640 = sm90_utils.make_trivial_tiled_mma(
                self.dtype, self.dtype, OperandMajorMode.K, OperandMajorMode.K, Float32,
                (1, 1, 1), (self.wg_m, 64), warpgroup.OperandSource.SMEM)
            mma64.set(warpgroup.Field.ACCUMULATE, True)
            mma640.set(warpgroup.Field.ACCUMULATE, False)
            thr64 = mma64.get_slice(wtid)
            sKd = cute.flat_divide(sK, (64, self.d))  # (64, D, 2, 1, stages)
            halves = [thr64.make_fragment_B(thr64.partition_B(sKd[None, None, h, 0, None]))
                      for h in range(2)]
            acc64 = cute.make_rmem_tensor(thr64.partition_shape_C((self.wg_m, 64)), Float32)
            tSrK = KHalves(mma64, mma640, halves, acc64.layout)
        tOrV = thr_mma_pv.make_fragment_B(thr_mma_pv.partition_B(sV))
        tSc = thr_mma_qk.partition_C(cute.make_identity_tensor((self.wg_m, self.bn)))
        return thr_mma_qk, thr_mma_pv, tSrQ, tSrK, tOrV, tSc

    def _l2(self, priority):
        """The ``cache_policy`` keyword of a TMA copy under the kernel's ``l2_hint``
        (:func:`.common.l2_copy_kw`): with ``L2_HINT_SPLIT`` the policy of ``priority`` (O
        ``evict_first``, written once; K and V ``evict_last``, read again by the other
        query tiles of their head; Q as :meth:`_q_priority` says)."""
        return l2_copy_kw(getattr(self, "l2_hint", 0), priority)

    def _q_priority(self):
        """The L2 priority of the Q loads: ``evict_first`` where one work item reads each
        query tile; ``evict_last`` where several do (split-KV: one item per split; a
        stream-K tail: the CTAs that share an item)."""
        if getattr(self, "kv_splits", 1) > 1 or getattr(self, "stream_k", False):
            return L2_EVICT_LAST
        return L2_EVICT_FIRST

    def _q_regs(self):
        """Whether Q is the register operand of ``S = Q K^T`` (a kernel's ``q_regs``): the
        consumer warpgroup copies its Q slice into registers once per work item
        (``ldmatrix``) and its S GEMMs read only K from shared memory."""
        return bool(getattr(self, "q_regs", False))

    @cute.jit
    def _q_operand(self, tSrQ, q_slice):
        """The A operand of the work item's S GEMMs: Q slice ``q_slice`` of ``sQ`` (its
        smem descriptors; with ``q_regs`` a register copy made here)."""
        if cutlass.const_expr(self._q_regs()):
            rQ = tSrQ.thr_mma.make_fragment_A(
                tSrQ.thr_mma.partition_A(tSrQ.sQ[None, None, 0]))
            cute.copy(tSrQ.s2r, tSrQ.tQs[None, None, None, q_slice], tSrQ.s2r.retile(rQ))
            return rQ
        else:
            return tSrQ[None, None, None, q_slice]

    def _q_ready(self, tile, q_slice, wg, wtid):
        """Called by a consumer warpgroup once its Q slice ``q_slice`` of ``sQ`` has arrived,
        before the item's first QK GEMM (a kernel may rewrite the slice there; it must
        make the writes visible to the async proxy and synchronise the warpgroup)."""

    @cute.jit
    def _o_buffer(self, st, sO_layout, wg):
        """This warpgroup's O staging buffer: its own buffer, or its part of sQ."""
        o_base = st.sQ.data_ptr() + wg * (self.wg_m * self.d)
        if cutlass.const_expr(not self.o_alias_q):
            o_base = st.sO.data_ptr() + wg * cute.cosize(sO_layout)
        if cutlass.const_expr(self._epi_vec() and not self._tma_o()):
            # the epilogue addresses the buffer itself (common.stage_acc_swz): a plain
            # row-major view of the same bytes
            return cute.make_tensor(o_base, cute.make_layout((self.wg_m, self.dv),
                                                             stride=(self.dv, 1)))
        return cute.make_tensor(cute.recast_ptr(o_base, sO_layout.inner), sO_layout.outer)

    def _o_in_q(self):
        """Whether the epilogue stages O in the work item's own Q slice (two Q buffers),
        whose stage ``_release_o_stage`` frees at the next item with work."""
        return getattr(self, "o_in_q", False)

    @cute.jit
    def _release_o_stage(self, pipe_q, c, wtid):
        """With ``_o_in_q``: release Q stage ``c`` once the TMA store of the O staged in it
        has read it (thread 0 of the warpgroup issued that store; its warp arrives after
        it has waited)."""
        if wtid == 0:
            cute.arch.cp_async_bulk_wait_group(0, read=True)
        cute.arch.sync_warp()
        pipe_q.consumer_release(c)

    def _tma_o(self):
        """Whether the epilogue stages O in the 128-byte-swizzled layout of ``sO`` and one
        thread of the warpgroup writes it with TMA tensor stores (``_store_o_tma``)."""
        return getattr(self, "tma_o", False)

    def _epi_vec(self):
        """Whether the epilogue stages O with packed pair stores into a row-swizzled tile
        and copies it out in 16-byte pieces (``common.stage_acc_swz``) rather than through
        the swizzled ``sO`` layout's element copies."""
        return getattr(self, "epi_vec", False)

    @cute.jit
    def _consume(self, work, tile, mma_qk, mma_qk0, mma_pv, thr_mma_qk, thr_mma_pv, tSrQ,
                 tSrK, tOrV, pipe_q, pipe_k, pipe_v, c_q, c_kv, sO, turns, wg, wtid,
                 piece=None, loader=None):
        """Consumer warpgroup, one work item: mainloop over its KV tiles, then the epilogue
        (also for an item without KV tiles); returns the pipeline counters ``(c_kv, c_q)``
        (in the order the item updates them). ``piece``: the item is part of a split one,
        finished by ``_finish_piece(..., piece)`` instead of the epilogue. ``loader``: the
        warpgroup issues the item's loads itself (``SelfLoader``)."""
        acc_O = cute.make_rmem_tensor(thr_mma_pv.partition_shape_C((self.wg_m, self.dv)),
                                      Float32)
        acc_O.fill(0.0)
        self._work_start(tile)
        if work.n_count > 0:
            rows = self._work_rows(work, tile)
            if cutlass.const_expr(loader is not None):
                self._self_load_item(loader, c_q, c_kv)
            if cutlass.const_expr(self._o_in_q()):
                if c_q > 0:
                    self._release_o_stage(pipe_q, c_q - 1, wtid)
            pipe_q.consumer_wait(c_q)
            self._q_ready(tile, self._q_slice(pipe_q.stage(c_q), wg), wg, wtid)
            c_kv = self._mainloop(
                mma_qk, mma_qk0, mma_pv, thr_mma_qk,
                self._q_operand(tSrQ, self._q_slice(pipe_q.stage(c_q), wg)), tSrK,
                tOrV, acc_O, pipe_k, pipe_v, c_kv, work, tile, rows, turns, wg, loader)
            if cutlass.const_expr(not self.o_alias_q):
                pipe_q.consumer_release(c_q)
        if cutlass.const_expr(self._o_in_q()):
            # O is staged in this item's Q slice (``sO``: the warpgroup's slice of Q
            # buffer 0, whose layout each Q buffer repeats ``num_wg * wg_m * d`` elements on)
            sO = cute.make_tensor(
                sO.iterator + pipe_q.stage(c_q) * (self.num_wg * self.wg_m * self.d), sO.layout)
        if cutlass.const_expr(piece is None):
            self._epilogue(acc_O, work, tile, thr_mma_pv, sO, wg, wtid, work.n_count > 0)
        else:
            self._finish_piece(acc_O, work, tile, thr_mma_pv, sO, wg, wtid, piece)
        if work.n_count > 0:
            if cutlass.const_expr(self.o_alias_q and not self._o_in_q()):
                # generic accesses of the aliased Q buffer before the next TMA write
                cute.arch.fence_proxy("async.shared", space="cta")
                pipe_q.consumer_release(c_q)
            c_q += 1
        return c_kv, c_q

    @cute.jit
    def _consume_items(self, sched, n_work, ctx, mma_qk, mma_qk0, mma_pv, thr_mma_qk,
                       thr_mma_pv, tSrQ, tSrK, tOrV, pipe_q, pipe_k, pipe_v, sO, turns, wg,
                       wtid):
        """Consumer warpgroup, every work item of its CTA with the items chained
        (``cross_item``): the turn that issues the last PV GEMM of an item also issues the
        next item's first ``S = Q K^T`` (its Q is already loaded: ``q_stages = 2``), the
        next item's first score tile is computed while that PV GEMM runs, and this item's
        epilogue follows (overlapping the other warpgroup's GEMMs). So an item boundary
        costs a mainloop step plus the epilogue, not a GEMM latency and an unoverlapped
        score tile as well.

        ``self._decode(t, ctx, which)`` gives item ``t``'s ``(work, tile, n)``: ``n`` its KV
        tile count, ``-1`` for an item the consumers skip; ``which`` (0 / 1) picks the
        per-row state the tile context carries (the current item's, the next item's), and
        ``self._handoff(tile, next_tile)`` moves the next item's into the current one."""
        wgm, bn, nwg = self.wg_m, self.bn, self.num_wg
        s_shape = thr_mma_qk.partition_shape_C((wgm, bn))
        a_vals = mma_pv.tv_layout_A.shape[1]
        acc_O = cute.make_rmem_tensor(thr_mma_pv.partition_shape_C((wgm, self.dv)), Float32)
        rP = cute.make_rmem_tensor(s_shape, self.dtype)
        tOrP = cute.make_tensor(rP.iterator, acc_layout_as_a(rP.layout, a_vals))
        c_q, c_kv, t = self._loop_start(sched)
        # 1: this item's first score tile is already in rP (and its row state in state 0)
        pending = Int32(0)
        while sched.valid(t):
            work, tile, n = self._decode(t, ctx, 0)
            t_next = sched.next(t)
            if n > 0:
                rows = self._work_rows(work, tile)
                state = self._tile_state(acc_O, tile)
                tQ = tSrQ[None, None, None, nwg * pipe_q.stage(c_q) + wg]
                # the next item (decoded at a valid index, chained only when it has KV
                # tiles); its metadata loads are issued here so that their latency hides
                # behind this item's mainloop
                nwork, ntile, n_next = self._decode(cutlass.min(t_next, n_work - 1), ctx, 1)
                nrows = self._work_rows(nwork, ntile)
                pre2 = None
                if cutlass.const_expr(self._early_pre()):
                    pre2 = self._tile_pre(nwork, ntile, nrows, 0)
                chain = Int32(0)
                if sched.valid(t_next):
                    if n_next > 0:
                        chain = Int32(1)
                if pending == 0:
                    acc_O.fill(0.0)
                    self._work_start(tile)
                    pipe_q.consumer_wait(c_q)
                    acc_S = cute.make_rmem_tensor(s_shape, Float32)
                    pre = self._tile_pre(work, tile, rows, 0)
                    self._issue_qk(mma_qk, mma_qk0, tQ, tSrK, pipe_k, c_kv, acc_S, turns, wg)
                    turns.pass_turn(wg)
                    warpgroup.wait_group(0)
                    pipe_k.consumer_release(c_kv)
                    self._p_into(rP, self._tile_p(acc_S, work, tile, rows, state, pre, 0))
                self._overlap_steps(mma_qk, mma_qk0, mma_pv, tQ, tSrK, tOrV, tOrP, rP, acc_O,
                                    pipe_k, pipe_v, c_kv, work, tile, rows, state, turns, wg,
                                    s_shape)
                c_last = c_kv + n - 1
                if chain == 1:
                    nstate = self._tile_state(acc_O, ntile)
                    self._work_start(ntile)
                    pipe_q.consumer_wait(c_q + 1)
                    tQn = tSrQ[None, None, None, nwg * pipe_q.stage(c_q + 1) + wg]
                    acc_S2 = cute.make_rmem_tensor(s_shape, Float32)
                    if cutlass.const_expr(not self._early_pre()):
                        pre2 = self._tile_pre(nwork, ntile, nrows, 0)
                    if cutlass.const_expr(self.cross_epi_first):
                        # PV first: the epilogue runs while the next item's S GEMM does
                        self._issue_pv(mma_pv, tOrP, tOrV, pipe_v, c_last, acc_O, turns, wg,
                                       True)
                        pipe_k.consumer_wait(c_last + 1)
                        warpgroup.fence()
                        self._qk(mma_qk, mma_qk0, tQn, tSrK, pipe_k.stage(c_last + 1), acc_S2)
                        warpgroup.commit_group()
                        turns.pass_turn(wg)
                        warpgroup.wait_group(1)
                        self._keep_p(rP)
                        pipe_v.consumer_release(c_last)
                        self._epilogue(acc_O, work, tile, thr_mma_pv, sO, wg, wtid, True)
                        warpgroup.wait_group(0)
                        pipe_k.consumer_release(c_last + 1)
                        pipe_q.consumer_release(c_q)
                        rP2 = self._tile_p(acc_S2, nwork, ntile, nrows, nstate, pre2, 0)
                    else:
                        self._issue_qk(mma_qk, mma_qk0, tQn, tSrK, pipe_k, c_last + 1, acc_S2,
                                       turns, wg)
                        self._issue_pv(mma_pv, tOrP, tOrV, pipe_v, c_last, acc_O, turns, wg,
                                       False)
                        turns.pass_turn(wg)
                        warpgroup.wait_group(1)
                        pipe_k.consumer_release(c_last + 1)
                        # every S GEMM reading this item's Q has completed
                        pipe_q.consumer_release(c_q)
                        rP2 = self._tile_p(acc_S2, nwork, ntile, nrows, nstate, pre2, 0)
                        warpgroup.wait_group(0)
                        self._keep_p(rP)
                        pipe_v.consumer_release(c_last)
                        self._epilogue(acc_O, work, tile, thr_mma_pv, sO, wg, wtid, True)
                    self._handoff(tile, ntile)
                    self._p_into(rP, rP2)
                    acc_O.fill(0.0)
                    pending = Int32(1)
                else:
                    self._issue_pv(mma_pv, tOrP, tOrV, pipe_v, c_last, acc_O, turns, wg, True)
                    turns.pass_turn(wg)
                    warpgroup.wait_group(0)
                    pipe_v.consumer_release(c_last)
                    pipe_q.consumer_release(c_q)
                    self._epilogue(acc_O, work, tile, thr_mma_pv, sO, wg, wtid, True)
                    pending = Int32(0)
                c_kv = c_kv + n
                c_q = c_q + 1
            else:
                if n == 0:
                    acc_O.fill(0.0)
                    self._work_start(tile)
                    self._epilogue(acc_O, work, tile, thr_mma_pv, sO, wg, wtid, False)
            t = t_next

    def _early_pre(self):
        """Chained items: whether the next item's first ``_tile_pre`` (its loads) is issued
        at the start of the current item (cheap per-tile values) rather than just before
        its GEMM (values that take many registers)."""
        return True

    def _handoff(self, tile, next_tile):
        """Chained items: the next item's per-row state (``_decode`` slot 1) becomes the
        current one's (slot 0). Kernels without per-row state: nothing."""

    # ------------------------------------------------------------------ mainloop
    @cute.jit
    def _qk(self, mma_qk, mma_qk0, tSrQ, tSrK, stage, acc_S):
        if cutlass.const_expr(isinstance(tSrK, KHalves)):
            n_half = cute.size(tSrK.acc_layout)
            for h in cutlass.range_constexpr(2):
                acc_h = cute.make_tensor(acc_S.iterator + h * n_half, tSrK.acc_layout)
                for k in cutlass.range_constexpr(cute.size(tSrQ, mode=[2])):
                    cute.gemm(tSrK.mma0 if k == 0 else tSrK.mma, acc_h, tSrQ[None, None, k],
                              tSrK.halves[h][None, None, k, stage], acc_h)
        else:
            for k in cutlass.range_constexpr(cute.size(tSrQ, mode=[2])):
                cute.gemm(mma_qk0 if k == 0 else mma_qk, acc_S, tSrQ[None, None, k],
                          tSrK[None, None, k, stage], acc_S)

    def _s_n64(self):
        """Whether ``S = Q K^T`` runs as two 64-column GEMMs over the K tile's row halves (a
        kernel's ``s_n64``, an ablation at ``bn`` 128 with Q in shared memory)."""
        return (bool(getattr(self, "s_n64", False)) and self.bn == 128
                and not self._q_regs())

    @cute.jit
    def _pv(self, mma_pv, tOrP, tOrV, stage, acc_O):
        for k in cutlass.range_constexpr(cute.size(tOrP, mode=[2])):
            cute.gemm(mma_pv, acc_O, tOrP[None, None, k], tOrV[None, None, k, stage], acc_O)

    @cute.jit
    def _issue_qk(self, mma_qk, mma_qk0, tSrQ, tSrK, pipe_k, c, acc_S, turns, wg):
        """Wait for K tile ``c``, then (in this warpgroup's turn) issue ``S = Q K^T``."""
        pipe_k.consumer_wait(c)
        turns.wait(wg)
        warpgroup.fence()
        self._qk(mma_qk, mma_qk0, tSrQ, tSrK, pipe_k.stage(c), acc_S)
        warpgroup.commit_group()

    @cute.jit
    def _issue_pv(self, mma_pv, tOrP, tOrV, pipe_v, c, acc_O, turns, wg,
                  take_turn: cutlass.Constexpr):
        """Wait for V tile ``c`` (and with ``take_turn`` for this warpgroup's turn), then
        issue ``O += P V``."""
        pipe_v.consumer_wait(c)
        if cutlass.const_expr(take_turn):
            turns.wait(wg)
        warpgroup.fence()
        self._pv(mma_pv, tOrP, tOrV, pipe_v.stage(c), acc_O)
        warpgroup.commit_group()

    @cute.jit
    def _mainloop(self, mma_qk, mma_qk0, mma_pv, thr_mma_qk, tSrQ, tSrK, tOrV, acc_O, pipe_k,
                  pipe_v, c_kv, work, tile, rows, turns, wg, loader=None):
        wgm, bn = self.wg_m, self.bn
        s_shape = thr_mma_qk.partition_shape_C((wgm, bn))
        a_vals = mma_pv.tv_layout_A.shape[1]
        state = self._tile_state(acc_O, tile)
        if cutlass.const_expr(self.overlap):
            # prologue: S_0, P_0
            acc_S = cute.make_rmem_tensor(s_shape, Float32)
            pre = self._tile_pre(work, tile, rows, 0)
            self._issue_qk(mma_qk, mma_qk0, tSrQ, tSrK, pipe_k, c_kv, acc_S, turns, wg)
            turns.pass_turn(wg)
            warpgroup.wait_group(0)
            pipe_k.consumer_release(c_kv)
            if cutlass.const_expr(loader is not None):
                # the K ring's one stage is free: K tile 1
                if work.n_count > 1:
                    self._self_load_k(loader, work.kv_tile(1), c_kv + 1)
            rP = self._p_final(self._tile_p(acc_S, work, tile, rows, state, pre, 0))
            tOrP = cute.make_tensor(rP.iterator, acc_layout_as_a(rP.layout, a_vals))
            self._overlap_steps(mma_qk, mma_qk0, mma_pv, tSrQ, tSrK, tOrV, tOrP, rP, acc_O,
                                pipe_k, pipe_v, c_kv, work, tile, rows, state, turns, wg,
                                s_shape, loader)
            c_last = c_kv + work.n_count - 1
            if cutlass.const_expr(self._o_early()):
                # O (the sum over tiles 0 .. n - 2) to the last tile's running max
                self._pv_done(acc_O, state)
            self._issue_pv(mma_pv, tOrP, tOrV, pipe_v, c_last, acc_O, turns, wg, True)
            turns.pass_turn(wg)
            warpgroup.wait_group(0)
            pipe_v.consumer_release(c_last)
        else:
            for it in cutlass.range(work.n_count, unroll=1):
                c = c_kv + it
                acc_S = cute.make_rmem_tensor(s_shape, Float32)
                pre = self._tile_pre(work, tile, rows, it)
                self._issue_qk(mma_qk, mma_qk0, tSrQ, tSrK, pipe_k, c, acc_S, turns, wg)
                turns.pass_turn(wg)
                warpgroup.wait_group(0)
                pipe_k.consumer_release(c)
                rP = self._p_final(self._tile_p(acc_S, work, tile, rows, state, pre, it))
                tOrP = cute.make_tensor(rP.iterator, acc_layout_as_a(rP.layout, a_vals))
                self._issue_pv(mma_pv, tOrP, tOrV, pipe_v, c, acc_O, turns, wg, True)
                turns.pass_turn(wg)
                warpgroup.wait_group(0)
                pipe_v.consumer_release(c)
        return c_kv + work.n_count

    def _mix_pv(self):
        """K steps of the PV GEMM of tile ``j - 1`` that the overlapped mainloop issues
        between the K steps of ``S_j``, in its wgmma group (a kernel's ``mix_pv``; 0: the
        two GEMMs one after the other, in two groups): ``_issue_mixed``."""
        if self._o_early() or self._s_n64() or self._q_regs():
            return 0
        return int(getattr(self, "mix_pv", 0))

    @cute.jit
    def _issue_mixed(self, mma_qk, mma_qk0, mma_pv, tSrQ, tSrK, tOrP, tOrV, pipe_k, pipe_v,
                     c, acc_S, acc_O, turns, wg):
        """Wait for K tile ``c`` and V tile ``c - 1``, then (in this warpgroup's turn) issue
        ``S_c = Q K_c^T`` with the first ``min(_mix_pv(), D / 16, bn / 16)`` K steps of
        ``O += P V_{c-1}`` between its K steps (one after each) as one wgmma group, and the PV GEMM's other K steps as a second group
        (empty where all are in the first): ``wait_group(1)`` then waits for the first."""
        n_mix = self._mix_pv()
        pipe_k.consumer_wait(c)
        pipe_v.consumer_wait(c - 1)
        turns.wait(wg)
        warpgroup.fence()
        sk = pipe_k.stage(c)
        sv = pipe_v.stage(c - 1)
        n_qk = cute.size(tSrQ, mode=[2])
        n_pv = cute.size(tOrP, mode=[2])
        # PV K steps issued among the S GEMM's (one after each of its first n_in K steps)
        n_in = min(n_mix, n_qk, n_pv)
        for k in cutlass.range_constexpr(n_qk):
            cute.gemm(mma_qk0 if k == 0 else mma_qk, acc_S, tSrQ[None, None, k],
                      tSrK[None, None, k, sk], acc_S)
            if cutlass.const_expr(k < n_in):
                cute.gemm(mma_pv, acc_O, tOrP[None, None, k], tOrV[None, None, k, sv], acc_O)
        warpgroup.commit_group()
        for k in cutlass.range_constexpr(n_in, n_pv):
            cute.gemm(mma_pv, acc_O, tOrP[None, None, k], tOrV[None, None, k, sv], acc_O)
        warpgroup.commit_group()

    def _o_early(self):
        """Whether the overlapped mainloop brings O to tile ``j - 1``'s running max (the
        ``_pv_done`` of tile ``j - 1``) after issuing ``S_j``, under that GEMM, instead of
        right after the PV GEMM of tile ``j - 2`` has completed (a kernel's ``o_early``;
        the chained items of ``cross_item`` keep the late form)."""
        return bool(getattr(self, "o_early", False)) and not getattr(self, "cross_item", 0)

    def _p_final(self, p):
        """The 16-bit P fragment of what ``_tile_p`` returned (``p`` itself; a kernel whose
        ``_tile_p`` leaves the last step of P for after the wait of the PV GEMM that reads
        the previous P finishes it here)."""
        return p

    @cute.jit
    def _p_into(self, rP, p):
        """``rP`` <- the P fragment of ``p`` (what ``_tile_p`` returned), after the PV GEMM
        that read ``rP`` has completed."""
        rP.store(p.load())

    @cute.jit
    def _keep_p(self, rP):
        """P stays allocated until the PV GEMM that reads it from registers has completed
        (call after that GEMM's ``wait_group``)."""
        rP32 = cute.recast_tensor(rP, cutlass.Uint32)
        for e in cutlass.range_constexpr(cute.size(rP32)):
            rP32[e] = hc.keep_u32(rP32[e])

    @cute.jit
    def _overlap_steps(self, mma_qk, mma_qk0, mma_pv, tSrQ, tSrK, tOrV, tOrP, rP, acc_O, pipe_k,
                       pipe_v, c_kv, work, tile, rows, state, turns, wg, s_shape,
                       loader=None):
        """Iterations ``1 .. n_count - 1`` of the overlapped mainloop: issue ``S_j = Q K_j^T``
        and ``O += P_{j-1} V_{j-1}`` in one turn, wait for ``S_j`` only (with ``mix_pv``:
        for ``S_j`` and the PV GEMM's K steps issued among its own, ``_issue_mixed``), compute ``P_j`` while
        the PV GEMM runs, then wait for it and bring O to tile ``j``'s state (``_pv_done``).
        ``rP`` holds ``P_{j-1}`` on entry (``tOrP`` is its A-operand view) and ``P_{n-1}`` on
        exit; K / V tile ``j`` is pipeline slot ``c_kv + j``. ``loader``: step ``j`` issues
        K tile ``j + 1`` once K tile ``j`` is released and V tile ``j + 1`` once V tile
        ``j - 1`` is (one K stage, two V stages); the tile's list entry is read a step
        ahead."""
        if cutlass.const_expr(loader is not None):
            last = work.n_count - 1
            n_next = work.kv_tile(cutlass.min(Int32(2), last))
        for it in cutlass.range(1, work.n_count, unroll=1):
            if cutlass.const_expr(loader is not None):
                n_load = n_next
                n_next = work.kv_tile(cutlass.min(it + 2, last))
            c_new = c_kv + it
            acc_S2 = cute.make_rmem_tensor(s_shape, Float32)
            pre2 = self._tile_pre(work, tile, rows, it)
            if cutlass.const_expr(self._mix_pv() > 0):
                self._issue_mixed(mma_qk, mma_qk0, mma_pv, tSrQ, tSrK, tOrP, tOrV, pipe_k,
                                  pipe_v, c_new, acc_S2, acc_O, turns, wg)
            else:
                self._issue_qk(mma_qk, mma_qk0, tSrQ, tSrK, pipe_k, c_new, acc_S2, turns, wg)
                if cutlass.const_expr(self._o_early()):
                    # O (the sum over tiles 0 .. j - 2, complete: its PV GEMM was waited on
                    # in step j - 1) to tile j - 1's running max while S_j runs; P_{j-1}
                    # V_{j-1} then adds to it
                    self._pv_done(acc_O, state)
                self._issue_pv(mma_pv, tOrP, tOrV, pipe_v, c_new - 1, acc_O, turns, wg, False)
            turns.pass_turn(wg)
            warpgroup.wait_group(1)
            pipe_k.consumer_release(c_new)
            if cutlass.const_expr(loader is not None):
                if it < last:
                    self._self_load_k(loader, n_load, c_new + 1)
            rP2 = self._tile_p(acc_S2, work, tile, rows, state, pre2, it)
            if cutlass.const_expr(self.split_wait):
                # V tile j - 1 is still held (released below), so this check of its full
                # barrier passes at once; its wait loop ends the basic block, and ptxas,
                # which places a wgmma wait at the top of its block, keeps the wait below
                # the score tile instead of hoisting it above (serializing that tile with
                # the PV GEMM)
                pipe_v.consumer_wait(c_new - 1)
            warpgroup.wait_group(0)
            self._keep_p(rP)
            pipe_v.consumer_release(c_new - 1)
            if cutlass.const_expr(loader is not None):
                if it < last:
                    self._self_load_v(loader, n_load, c_new + 1)
            if cutlass.const_expr(not self._o_early()):
                self._pv_done(acc_O, state)
            self._p_into(rP, rP2)

    # ------------------------------------------------------------------ epilogue
    @cute.jit
    def _store_o_tma(self, acc_O, inv_scale, thr_mma_pv, sO, tma_o, gO, m64, wg, wtid):
        """``O`` (times ``inv_scale`` unless None) -> 16 bit -> this warpgroup's ``sO`` (the
        128-byte-swizzled layout, ``common.stage_acc_sw128``) -> TMA tensor stores (one box
        per 64 columns) of the 64-row slice ``m64`` of ``gO`` ((64, Dv, slices) tiles of the
        TMA view), issued by thread 0 of the warpgroup as one bulk group; TMA drops the rows past the tensor's end. The store
        reads ``sO`` asynchronously: the next call first waits (thread 0) for that read,
        and ``_tma_o_drain`` waits for the last one before the CTA exits."""
        wgm, dv = self.wg_m, self.dv
        bar_id = self._wg_bar(wg)
        self._tma_o_wait(wg, wtid)
        stage_acc_sw128(acc_O, thr_mma_pv.partition_C(cute.make_identity_tensor((wgm, dv))),
                        self._plain_o(sO).iterator, wgm, dv,
                        self.dtype == cutlass.BFloat16, inv_scale)
        # the generic-proxy writes of sO before the TMA (async proxy) reads it
        cute.arch.fence_proxy("async.shared", space="cta")
        cute.arch.barrier(barrier_id=bar_id, number_of_threads=128)
        if wtid == 0:
            tOs, tOg = cpasync.tma_partition(tma_o, 0, cute.make_layout(1),
                                             cute.group_modes(sO, 0, 2),
                                             cute.group_modes(gO, 0, 2))
            cute.copy(tma_o, tOs[None, 0], tOg[None, m64], **self._l2(L2_EVICT_FIRST))
            cute.arch.cp_async_bulk_commit_group()

    @cute.jit
    def _tma_o_wait(self, wg, wtid):
        """Before this warpgroup writes its O staging tile: thread 0 waits until its last TMA
        store has read the tile, then the warpgroup meets at its named barrier."""
        if wtid == 0:
            cute.arch.cp_async_bulk_wait_group(0, read=True)
        cute.arch.barrier(barrier_id=self._wg_bar(wg), number_of_threads=128)

    def _plain_o(self, sO):
        """The bytes of the TMA-staged ``sO`` as a plain row-major (64, Dv) tensor (the
        staging code applies the swizzle itself; the zero stores use only its shape)."""
        ptr = cute.make_ptr(self.dtype, sO.iterator.toint(), cute.AddressSpace.smem,
                            assumed_align=1024)
        return cute.make_tensor(ptr, cute.make_layout((self.wg_m, self.dv),
                                                      stride=(self.dv, 1)))

    @cute.jit
    def _tma_o_drain(self, wtid):
        """With ``_tma_o``: thread 0 of a consumer warpgroup waits until its last O store has
        read shared memory (before the CTA exits)."""
        if cutlass.const_expr(self._tma_o()):
            if wtid == 0:
                cute.arch.cp_async_bulk_wait_group(0, read=True)

    @cute.jit
    def _store_o(self, acc_O, inv_scale, thr_mma_pv, sO, mO_rows, mw0, seqlen_q, wg, wtid,
                 has_work):
        """``O`` (times ``inv_scale`` unless None) -> 16 bit -> smem (swizzled) -> 128-bit
        stores of this warpgroup's rows ``< seqlen_q`` of ``mO_rows`` (rows, Dv).

        A work item without KV tiles (``has_work`` false) stores zeros straight from
        registers: it must not touch shared memory, which may alias the Q buffer the
        producer is already refilling for the next item.
        """
        wgm, dv = self.wg_m, self.dv
        bar_id = self._wg_bar(wg)
        copy_o = gmem_store_copy(self.dtype, 128, dv)
        thr = copy_o.get_slice(wtid)
        gO = cute.local_tile(mO_rows, (wgm, dv), (mw0 // wgm, 0))
        tOs = thr.partition_S(sO)
        tOg = thr.partition_D(gO)
        tOc = thr.partition_S(cute.make_identity_tensor((wgm, dv)))
        lim = seqlen_q - mw0
        if has_work:
            if cutlass.const_expr(self._epi_vec()):
                stage_acc_swz(acc_O, thr_mma_pv.partition_C(cute.make_identity_tensor((wgm, dv))),
                              sO.iterator, dv, self.dtype == cutlass.BFloat16, inv_scale)
                cute.arch.barrier(barrier_id=bar_id, number_of_threads=128)
                swz_rows_to_gmem(sO.iterator, wtid, 128, mO_rows, mw0, lim, wgm, dv,
                                 self.dtype)
            else:
                rO = cute.make_fragment_like(acc_O, self.dtype)
                if cutlass.const_expr(inv_scale is None):
                    rO.store(acc_O.load().to(self.dtype))
                else:
                    rO.store((acc_O.load() * inv_scale).to(self.dtype))
                cute.autovec_copy(rO, thr_mma_pv.partition_C(sO))
                cute.arch.barrier(barrier_id=bar_id, number_of_threads=128)
                for r in cutlass.range_constexpr(cute.size(tOs.shape[1])):
                    if tOc[0, r, 0][0] < lim:
                        rr = cute.make_fragment_like(tOs[None, r, None])
                        cute.autovec_copy(tOs[None, r, None], rr)
                        cute.copy(copy_o, rr, tOg[None, r, None])
            # every thread's smem reads are done before the buffer is written again
            cute.arch.barrier(barrier_id=bar_id, number_of_threads=128)
        else:
            for r in cutlass.range_constexpr(cute.size(tOs.shape[1])):
                if tOc[0, r, 0][0] < lim:
                    rr = cute.make_fragment_like(tOs[None, r, None])
                    rr.fill(0)
                    cute.copy(copy_o, rr, tOg[None, r, None])


__all__ = ["AttnFwdSm90Ws", "SMEM_LIMIT", "WorkItem", "smem_plan"]
