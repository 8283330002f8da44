"""Pieces of the warp-specialized key-major SM90 backwards (``hstu_bwd_sm90``,
``bsa_bwd_sm90_ws``; no jax imports).

Both kernels give one CTA a KV tile of ``bn`` keys (one consumer warpgroup per 64 keys) and
walk query tiles of ``bm`` rows; every product is a wgmma in the key-major orientation
(``S^T = K Q^T``, ``dP^T = V dO^T``, ``dV += P^T dO``, ``dK += dS^T Q``, ``dQ = dS K``), and
the same shared-memory bytes serve as a K-major operand in one product and an MN-major one in
another. What differs is the score function (SiLU or softmax), which query tiles are walked,
how the loads are issued and how dQ is reduced; this module holds what is the same:

* ``layouts`` / ``smem_views``: the shared-memory layouts of K, V, Q, dO, dS and the
  MN-major aliases of the same bytes;
* ``ds_store_copy``: the ``stmatrix`` copy of the dS^T accumulator into the query-major dS
  tile;
* ``issue_s_dp``, ``issue_dv``, ``issue_dq_dk``: the wgmma groups of one query tile (plain
  functions traced inline; the MMAs whose accumulate field they set are returned and rebound
  by the caller);
* ``red_add_rows`` / ``red_add_rows_v4``: dQ rows below a limit added to an fp32 workspace
  with 8-byte / 16-byte vector ``red``;
* ``keep_regs``: keeps 16-bit A-operand registers allocated until the GEMMs that read them
  have completed;
* ``stage_as_f32``: the fp32 views of a consumed Q / dO stage in which the dQ slices are
  staged (``dq_alias``);
* ``wg_bar`` / ``writer_take_halves``: the per-warpgroup hand-back of the staged dQ between
  the consumer warpgroups and the dQ writer warp (``wg_hand``);
* ``store_dk_dv``: the epilogue's row-predicated dK / dV stores from registers (HSTU; the
  block-sparse kernel indexes its 4-mode outputs directly).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.cute.nvgpu import warpgroup
from cutlass.tensor_utils import LayoutEnum

from . import hstu_common as hc
from .common import acc_mn_view_wg, elem_ptr, st_global_pair16, st_shared_pair16
from .dq_tiles import smem_row_stride, smem_rows_to_gmem


def layouts(dtype, bn: int, bm: int, d: int, q_stages: int, ds_stages: int):
    """``(sK, sK_mn, sQ, sQ_mn, sdS)`` smem layouts: K / V ``(bn, D)`` K-major and its
    MN-major alias ``(D, bn)``; Q / dO ``(bm, D, q_stages)`` and ``(D, bm, q_stages)``; the
    query-major dS tile ``(bm, bn, ds_stages)`` (the MN-major A operand of ``dQ = dS K``)."""
    s_tiler = (bn, bm, d)
    kv_tiler = (bn, d, bm)
    dq_tiler = (bm, d, bn)
    return (sm90_utils.make_smem_layout_a(LayoutEnum.ROW_MAJOR, s_tiler, dtype, 1),
            sm90_utils.make_smem_layout_b(LayoutEnum.COL_MAJOR, dq_tiler, dtype, 1),
            sm90_utils.make_smem_layout_b(LayoutEnum.ROW_MAJOR, s_tiler, dtype, q_stages),
            sm90_utils.make_smem_layout_b(LayoutEnum.COL_MAJOR, kv_tiler, dtype, q_stages),
            sm90_utils.make_smem_layout_a(LayoutEnum.COL_MAJOR, dq_tiler, dtype, ds_stages))


def ds_kmajor_layout(dtype, bn: int, bm: int, d: int, ds_stages: int):
    """The K-major ``(bn, bm, ds_stages)`` layout of the query-major dS tiles of
    :func:`layouts` (the same bytes: the A operand ``dS^T`` / ``P^T`` of ``dK += dS^T Q`` /
    ``dV += P^T dO`` read from shared memory)."""
    return sm90_utils.make_smem_layout_a(LayoutEnum.ROW_MAJOR, (bn, d, bm), dtype, ds_stages)


def smem_views(st, sK_layout, sK_mn_layout, sQ_layout, sQ_mn_layout, sdS_layout,
               sdS_field=None):
    """``(sK, sV, sQ, sdO, sdS, sK_mn, sQ_mn, sdO_mn)`` of a shared-memory struct ``st`` with
    fields ``sK``, ``sV``, ``sQ``, ``sdO``, ``sdS`` (``*_mn``: MN-major views of the same
    bytes; for 16-bit types the 128-byte-swizzled K-major tile of a row-major ``(rows, D)``
    block is bit-identical to the MN-major tile of its transpose). ``sdS_field``: the dS
    tiles' field where it is not ``st.sdS``."""
    if sdS_field is None:
        sdS_field = st.sdS
    return (st.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner),
            st.sV.get_tensor(sK_layout.outer, swizzle=sK_layout.inner),
            st.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner),
            st.sdO.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner),
            sdS_field.get_tensor(sdS_layout.outer, swizzle=sdS_layout.inner),
            st.sK.get_tensor(sK_mn_layout.outer, swizzle=sK_mn_layout.inner),
            st.sQ.get_tensor(sQ_mn_layout.outer, swizzle=sQ_mn_layout.inner),
            st.sdO.get_tensor(sQ_mn_layout.outer, swizzle=sQ_mn_layout.inner))


def ds_store_copy(mma_s, sdS, bn: int, bm: int, stages: int, dtype, tidx):
    """``(r2s, tdSsdS)``: thread ``tidx``'s ``stmatrix`` copy of the ``(bn, bm)`` dS^T
    accumulator of ``mma_s`` and its destination partition of the ``(bm, bn, stages)``
    query-major dS tiles, seen as ``(bn, bm, stages)`` (the accumulator's rows of 8 queries
    are 16 contiguous bytes there: stmatrix without transpose)."""
    sdS_t = cute.composition(sdS, cute.make_layout((bn, bm, stages), stride=(bm, 1, bm * bn)))
    r2s = cute.make_tiled_copy_C(
        cute.make_copy_atom(cute.nvgpu.warp.StMatrix8x8x16bOp(transpose=False, num_matrices=4),
                            dtype), mma_s).get_slice(tidx)
    return r2s, r2s.partition_D(sdS_t)


def issue_s_dp(mma_s, acc_S, acc_dP, tSrK, tSrV, tSrQ, tSrdO, stage):
    """``S^T = K Q^T`` and ``dP^T = V dO^T`` of Q / dO stage ``stage``: two wgmma groups.
    Returns ``mma_s`` (its accumulate field is set here: the caller rebinds it, so that the
    CuTe DSL threads the value through the caller's control flow)."""
    warpgroup.fence()
    for k in range(cute.size(tSrK, mode=[2])):
        mma_s.set(warpgroup.Field.ACCUMULATE, k != 0)
        cute.gemm(mma_s, acc_S, tSrK[None, None, k, 0], tSrQ[None, None, k, stage], acc_S)
    warpgroup.commit_group()
    for k in range(cute.size(tSrV, mode=[2])):
        mma_s.set(warpgroup.Field.ACCUMULATE, k != 0)
        cute.gemm(mma_s, acc_dP, tSrV[None, None, k, 0], tSrdO[None, None, k, stage], acc_dP)
    warpgroup.commit_group()
    return mma_s


def issue_dv(mma_kv, acc_dV, tP, tVrdO, stage):
    """``dV += P^T dO`` (P^T from registers, dO of stage ``stage``): one wgmma group
    (``mma_kv`` accumulates: the caller sets it once, before its loop)."""
    warpgroup.fence()
    for k in range(cute.size(tP, mode=[2])):
        cute.gemm(mma_kv, acc_dV, tP[None, None, k], tVrdO[None, None, k, stage], acc_dV)
    warpgroup.commit_group()


def issue_dq_dk(mma_dq, mma_kv, acc_dQ, acc_dK, tQrdS, tQrK, tdS, tKrQ, buf, stage,
                k_range=None):
    """``dQ = dS K`` (dS tile ``buf``) and ``dK += dS^T Q`` (dS^T from registers, Q of stage
    ``stage``): two wgmma groups, so the dQ reductions can be issued while dK runs. Returns
    ``mma_dq`` (rebound by the caller, as for :func:`issue_s_dp`). ``k_range``: ``(lo, hi)``,
    the k16 blocks (keys) of dQ's reduction to take (default: all)."""
    lo, hi = (0, cute.size(tQrdS, mode=[2])) if k_range is None else k_range
    warpgroup.fence()
    for k in range(lo, hi):
        mma_dq.set(warpgroup.Field.ACCUMULATE, k != lo)
        cute.gemm(mma_dq, acc_dQ, tQrdS[None, None, k, buf], tQrK[None, None, k, 0], acc_dQ)
    warpgroup.commit_group()
    for k in range(cute.size(tdS, mode=[2])):
        cute.gemm(mma_kv, acc_dK, tdS[None, None, k], tKrQ[None, None, k, stage], acc_dK)
    warpgroup.commit_group()
    return mma_dq


def issue_dk(mma_kv, acc_dK, tdS, tKrQ, stage):
    """``dK += dS^T Q`` (dS^T from registers, Q of stage ``stage``): one wgmma group."""
    warpgroup.fence()
    issue_dk_ops(mma_kv, acc_dK, tdS, tKrQ, stage)
    warpgroup.commit_group()


def issue_dk_ops(mma_kv, acc_dK, tdS, tKrQ, stage):
    """The wgmma of ``dK += dS^T Q`` without the fence and the group commit (the caller's)."""
    for k in range(cute.size(tdS, mode=[2])):
        cute.gemm(mma_kv, acc_dK, tdS[None, None, k], tKrQ[None, None, k, stage], acc_dK)


def issue_dq(mma_dq, acc_dQ, tQrdS, tQrK, buf):
    """``dQ = dS K`` (dS tile ``buf``): one wgmma group. Returns ``mma_dq`` (rebound by the
    caller, as for :func:`issue_s_dp`)."""
    warpgroup.fence()
    for k in range(cute.size(tQrdS, mode=[2])):
        mma_dq.set(warpgroup.Field.ACCUMULATE, k != 0)
        cute.gemm(mma_dq, acc_dQ, tQrdS[None, None, k, buf], tQrK[None, None, k, 0], acc_dQ)
    warpgroup.commit_group()
    return mma_dq


@cute.jit
def red_add_rows(acc_dQ, tdQg, tdQc, lim):
    """The dQ accumulator's rows ``< lim`` (row coordinates from ``tdQc``) added to the fp32
    tile ``tdQg`` (its partition of the workspace), values ``2k, 2k + 1`` (adjacent columns)
    with one ``red.global.add.v2.f32``."""
    for e2 in cutlass.range_constexpr(cute.size(acc_dQ) // 2):
        if tdQc[2 * e2][0] < lim:
            hc.red_add_v2_f32(elem_ptr(tdQg, 2 * e2), acc_dQ[2 * e2], acc_dQ[2 * e2 + 1])


@cute.jit
def red_add_rows_v4(acc_dQ, tdQg, tdQc, lim):
    """As :func:`red_add_rows`, with one ``red.global.add.v4.f32`` per 4 values: in a wgmma
    accumulator lanes ``2i`` and ``2i + 1`` hold adjacent column pairs of the same rows ``r``
    and ``r + 8``; they swap one pair (two shuffles), then the even lane adds columns
    ``c .. c + 3`` of row ``r`` and the odd lane those of row ``r + 8`` (half the reduction
    operations of the pairwise form)."""
    odd = (cute.arch.lane_idx() % 2) == 1
    for g in cutlass.range_constexpr(cute.size(acc_dQ) // 4):
        a0 = acc_dQ[4 * g]
        a1 = acc_dQ[4 * g + 1]
        b0 = acc_dQ[4 * g + 2]
        b1 = acc_dQ[4 * g + 3]
        s0 = a0 if odd else b0
        s1 = a1 if odd else b1
        r0 = cute.arch.shuffle_sync_bfly(s0, offset=1)
        r1 = cute.arch.shuffle_sync_bfly(s1, offset=1)
        x0 = r0 if odd else a0
        x1 = r1 if odd else a1
        x2 = b0 if odd else r0
        x3 = b1 if odd else r1
        row = tdQc[4 * g + 2][0] if odd else tdQc[4 * g][0]
        # the odd lane's row r + 8 starts 2 columns (8 bytes) before its own pair
        addr = (elem_ptr(tdQg, 4 * g + 2).toint() - 8) if odd else elem_ptr(tdQg, 4 * g).toint()
        if row < lim:
            hc.red_add_v4_f32_at(addr, x0, x1, x2, x3)


@cute.jit
def wg_bar(wg, id0: cutlass.Constexpr, id1: cutlass.Constexpr, arrive: cutlass.Constexpr):
    """Consumer warpgroup ``wg``'s named barrier with the dQ writer warp (id ``id0`` for
    warpgroup 0, ``id1`` for warpgroup 1; 128 + 32 threads): sync, or ``arrive`` only."""
    if wg == 0:
        if cutlass.const_expr(arrive):
            cute.arch.barrier_arrive(barrier_id=id0, number_of_threads=160)
        else:
            cute.arch.barrier(barrier_id=id0, number_of_threads=160)
    else:
        if cutlass.const_expr(arrive):
            cute.arch.barrier_arrive(barrier_id=id1, number_of_threads=160)
        else:
            cute.arch.barrier(barrier_id=id1, number_of_threads=160)


@cute.jit
def writer_take_halves(lane, add_half: cutlass.Constexpr, order: cutlass.Constexpr = (0, 1)):
    """The dQ writer warp's part of one step of the per-warpgroup hand-back (``wg_bar``):
    for warpgroup ``w`` in ``order`` it syncs on the warpgroup's staged barrier (2 / 11),
    lets lane 0 issue the bulk additions of the warpgroup's half (``add_half(w)``, a Python
    function traced inline), commit them and wait until they have read the staging tile,
    and arrives on the warpgroup's hand-back barrier (5 / 10)."""
    for i in cutlass.range_constexpr(2):
        w = order[i]
        cute.arch.barrier(barrier_id=2 if w == 0 else 11, number_of_threads=160)
        if lane == 0:
            add_half(w)
            cute.arch.cp_async_bulk_commit_group()
            cute.arch.cp_async_bulk_wait_group(0, read=True)
        cute.arch.sync_warp()
        cute.arch.barrier_arrive(barrier_id=5 if w == 0 else 10, number_of_threads=160)


def stage_as_f32(st, stage, bm: int, d: int):
    """``(Q, dO)``: fp32 pointers to the Q and dO tiles of Q / dO stage ``stage`` (``bm x d``
    16-bit values each, so ``bm x d / 2`` floats) of the shared storage ``st``, where the
    ``dq_alias`` kernels stage a step's dQ slices once its GEMMs have read the stage."""
    return (cute.recast_ptr(st.sQ.data_ptr() + stage * (bm * d), dtype=cutlass.Float32),
            cute.recast_ptr(st.sdO.data_ptr() + stage * (bm * d), dtype=cutlass.Float32))


def keep_regs(*frags):
    """Register operands (P^T, dS^T) stay allocated until the GEMMs reading them have
    completed."""
    for t in frags:
        t32 = cute.recast_tensor(t, cutlass.Uint32)
        for e in range(cute.size(t32)):
            t32[e] = hc.keep_u32(t32[e])


@cute.jit
def store_dk_dv(acc_dK, acc_dV, thr_kv, bn: cutlass.Constexpr, d: cutlass.Constexpr, mdK_b,
                mdV_b, kv_left, dv_scale, dtype: cutlass.Constexpr,
                paired: cutlass.Constexpr = False):
    """Epilogue: this thread's dK and dV (times ``dv_scale`` unless None) converted to
    ``dtype`` and stored to the key rows ``< kv_left`` of ``mdK_b`` / ``mdV_b`` ``(rows, D)``.
    ``paired``: accumulator values ``2k, 2k + 1`` (adjacent columns of one row, even first
    column) go out as one packed 4-byte store each (rows with an even element stride)."""
    if cutlass.const_expr(paired):
        tKVc_e = thr_kv.partition_C(cute.make_identity_tensor((bn, d)))
        for e2 in cutlass.range_constexpr(cute.size(acc_dK) // 2):
            row = tKVc_e[2 * e2][0]
            col = tKVc_e[2 * e2][1]
            if row < kv_left:
                st_global_pair16(elem_ptr(mdK_b, (row, col)), acc_dK[2 * e2],
                                 acc_dK[2 * e2 + 1], dtype == cutlass.BFloat16)
                if cutlass.const_expr(dv_scale is None):
                    st_global_pair16(elem_ptr(mdV_b, (row, col)), acc_dV[2 * e2],
                                     acc_dV[2 * e2 + 1], dtype == cutlass.BFloat16)
                else:
                    st_global_pair16(elem_ptr(mdV_b, (row, col)), acc_dV[2 * e2] * dv_scale,
                                     acc_dV[2 * e2 + 1] * dv_scale, dtype == cutlass.BFloat16)
    else:
        tKVc = acc_mn_view_wg(thr_kv.partition_C(cute.make_identity_tensor((bn, d))))
        dK_mn = acc_mn_view_wg(acc_dK)
        dV_mn = acc_mn_view_wg(acc_dV)
        for r in cutlass.range_constexpr(cute.size(tKVc, mode=[0])):
            row = tKVc[r, 0][0]
            if row < kv_left:
                for cc in cutlass.range_constexpr(cute.size(tKVc, mode=[1])):
                    col = tKVc[r, cc][1]
                    mdK_b[row, col] = dK_mn[r, cc].to(dtype)
                    if cutlass.const_expr(dv_scale is None):
                        mdV_b[row, col] = dV_mn[r, cc].to(dtype)
                    else:
                        mdV_b[row, col] = (dV_mn[r, cc] * dv_scale).to(dtype)


def check_epi_smem_fit(kernel: str, bn: int, d: int, sQ_layout, sdS_layout):
    """Trace time: :func:`store_dk_dv_smem`'s two ``(bn, d + 8)`` tiles must fit two tile
    arrays of ``sQ_layout`` (the Q / dO stages, or K / V) and the dS tiles, which lie back to
    back in the kernel's shared storage (sizes multiples of its 1024-byte alignment); raises
    NotImplementedError naming ``kernel``."""
    room = 2 * cute.cosize(sQ_layout) + cute.cosize(sdS_layout)
    if 2 * bn * (d + 8) > room or cute.cosize(sQ_layout) * 2 % 1024 != 0:
        raise NotImplementedError(
            f"{kernel} epi_smem: the staging tiles ({2 * bn * (d + 8)} elements) do not fit "
            f"the Q / dO stages and dS tiles ({room})")


@cute.jit
def store_dk_dv_smem(acc_dK, acc_dV, thr_kv, bn: cutlass.Constexpr, d: cutlass.Constexpr,
                     sK_st, sV_st, ctid, mdK_b, mdV_b, kv_left, dv_scale,
                     dtype: cutlass.Constexpr):
    """Epilogue through shared memory (one or two consumer warpgroups, warpgroup ``w`` owning
    key rows ``[64 w, 64 w + 64)``): this thread's dK and dV (dV times ``dv_scale`` unless
    None) converted to
    ``dtype`` and stored as packed pairs into the ``(bn, d + 8)`` row-major shared tiles at
    ``sK_st`` / ``sV_st`` (conflict-free), then each warpgroup writes its key rows ``<
    kv_left`` of ``mdK_b`` / ``mdV_b`` ``(rows, D)`` in coalesced 16-byte pieces. The caller
    makes sure nothing else reads or writes the two tiles any more. Named barriers 8 and 9
    (one per warpgroup, 128 threads)."""
    rs = smem_row_stride(d)
    bf16 = dtype == cutlass.BFloat16
    tKVc_e = thr_kv.partition_C(cute.make_identity_tensor((bn, d)))
    for e2 in cutlass.range_constexpr(cute.size(acc_dK) // 2):
        row = tKVc_e[2 * e2][0]
        col = tKVc_e[2 * e2][1]
        st_shared_pair16(sK_st + (row * rs + col), acc_dK[2 * e2], acc_dK[2 * e2 + 1], bf16)
        if cutlass.const_expr(dv_scale is None):
            st_shared_pair16(sV_st + (row * rs + col), acc_dV[2 * e2], acc_dV[2 * e2 + 1], bf16)
        else:
            st_shared_pair16(sV_st + (row * rs + col), acc_dV[2 * e2] * dv_scale,
                             acc_dV[2 * e2 + 1] * dv_scale, bf16)
    wg = ctid // 128
    if wg == 0:
        cute.arch.barrier(barrier_id=8, number_of_threads=128)
    else:
        cute.arch.barrier(barrier_id=9, number_of_threads=128)
    r0 = wg * 64
    smem_rows_to_gmem(sK_st + r0 * rs, ctid % 128, 128, mdK_b, r0, kv_left - r0, 64, d, dtype)
    smem_rows_to_gmem(sV_st + r0 * rs, ctid % 128, 128, mdV_b, r0, kv_left - r0, 64, d, dtype)


__all__ = ["check_epi_smem_fit", "ds_kmajor_layout", "ds_store_copy", "issue_dk", "issue_dk_ops",
           "issue_dq", "issue_dq_dk", "issue_dv", "issue_s_dp", "keep_regs", "layouts",
           "red_add_rows", "red_add_rows_v4", "smem_views", "store_dk_dv", "store_dk_dv_smem"]
