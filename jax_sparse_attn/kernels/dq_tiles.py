"""dq from a query-tile workspace of warp-ordered fp32 blocks (CuTe DSL, no jax imports).

The Hopper backwards that add dQ per consumer warp with one bulk reduce-add
(``cp.reduce.async.bulk ... add.f32``) write each ``bm x D`` query tile of an fp32
workspace as ``bm / 16 x D / W`` blocks of ``16 W`` floats, one per (row group ``rg`` of 16
rows, column group ``cg`` of ``W`` columns), block ``c = cg (bm / 16) + rg``. A block holds
a consumer warp's slice of a wgmma accumulator (rows ``16 rg ..``, columns ``W cg ..``) in
register order: float ``4 (32 j + 4 g + q) + 2 h + e`` of the block is row ``16 rg + 8 h +
g``, column ``W cg + 8 j + 2 q + e`` (``j < W / 8``: the accumulator's 8-column groups; lane
``4 g + q``). The warp stores its slice with one ``st.shared.v4.f32`` per 8-column group
(consecutive lanes at consecutive addresses) and adds it to the workspace as one
contiguous ``16 W``-float bulk reduction.

:func:`tile_load`, :func:`tile_to_smem` and :func:`smem_rows_to_gmem` turn one such tile back into rows of
``dq`` in the input dtype (all loads issued first, a row-major shared tile, 16-byte row
stores); :func:`stage_warp_slice` and :func:`bulk_add_warp_slice` are the writing side
(the backward's consumer warps); :class:`BsaDqFromTiles` is the block-sparse backward's reordering kernel
(``hstu_dq_tiles`` the HSTU one).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.memory
from cutlass import Float32, Int32

from .common import (bulk_copy_f32, bulk_reduce_add_f32, bulk_reduce_add_f32_hint,
                     bulk_reduce_add_s32, elem_ptr,
                     f32_of_fixed_bits, fixed_bits_f32, fixed_bits_f32_fadd, red_or_b32,
                     st_shared_v4_f32,
                     wait_at_least)
from .pack_gqa import packed_row

#: fixed-point dQ (``dq_fixed``): a contribution's values times their rows' multipliers stay
#: within 2^28 (the bound of ``ffi.bsa.dq_fixed_multipliers``); a value beyond
#: +-FIXED_LIMIT (or not finite) marks its row
FIXED_LIMIT = float(2**30)

#: ``wait_pairs``: nanoseconds a waiting CTA sleeps between two polls of its pair's count
POLL_SLEEP_NS = 500


def tile_blocks(bm: int, d: int, w: int) -> int:
    """Blocks (= reading warps) of one ``bm x d`` tile of ``w``-column blocks."""
    return (bm // 16) * (d // w)


def smem_row_stride(d: int) -> int:
    """Row stride (elements) of the shared tile: conflict-free pair stores."""
    return d + 8


@cute.jit
def block_smem_ptr(blk, sbase, sbase2, half: cutlass.Constexpr, w: cutlass.Constexpr):
    """Shared-memory fp32 pointer of block ``blk`` of a staged tile: blocks at ``sbase``, or
    (``sbase2`` given) blocks ``< half`` at ``sbase`` and the others at ``sbase2`` (a tile
    staged in two separate buffers, e.g. the Q and dO tiles of a consumed pipeline stage)."""
    addr = sbase.toint() + blk * (64 * w)
    if cutlass.const_expr(sbase2 is not None):
        sel = Int32(blk >= half)
        addr = (sbase.toint() + sel * (sbase2.toint() - sbase.toint())
                + (blk - sel * half) * (64 * w))
    return cute.make_ptr(Float32, addr, cute.AddressSpace.smem, assumed_align=16)


@cute.jit
def stage_warp_slice(acc, sbase, lane, rg, cg0, n_rg: cutlass.Constexpr,
                     w: cutlass.Constexpr, scale=None, sbase2=None, half: cutlass.Constexpr = 0):
    """A warp's slice of a wgmma accumulator (``acc``: its ``(2, 2, N / 8)`` values, rows
    ``16 rg ..``, columns ``w cg0 .. w cg0 + N``) to the fp32 tile of blocks at shared
    ``sbase`` (:func:`block_smem_ptr`), in register order, each value times ``scale`` when
    given. The warp then fences for the async proxy and syncs before
    :func:`bulk_add_warp_slice`."""
    for k4 in cutlass.range_constexpr(cute.size(acc) // 4):
        blk = (cg0 + (8 * k4) // w) * n_rg + rg
        ptr = block_smem_ptr(blk, sbase, sbase2, half, w) + 4 * (32 * ((8 * k4) % w // 8) + lane)
        vals = [acc[4 * k4 + i] for i in range(4)]
        if cutlass.const_expr(scale is not None):
            vals = [x * scale for x in vals]
        st_shared_v4_f32(ptr, vals[0], vals[1], vals[2], vals[3])


@cute.jit
def fixed_point_slice(acc, mult, lane, rg, flags_ptr, emu: cutlass.Constexpr = 0):
    """Fixed-point dQ: a warp's slice of a wgmma accumulator (``acc``, rows ``16 rg ..`` as
    in :func:`stage_warp_slice`) in place to ``round(x * m)`` int32 bits (of every 8 values
    the first ``emu`` by :func:`.common.fixed_bits_f32_fadd` on the FP32 / integer pipes, the
    others by a conversion), ``m = mult[h]``
    for the thread's row ``16 rg + 8 h + lane // 4`` (held in the
    Float32 registers, for :func:`stage_warp_slice` and an ``s32`` bulk reduction). A row
    with a value whose product is outside ``+-FIXED_LIMIT`` or not finite (which the
    multiplier's bound excludes for finite inputs) sets its bit in the two int32 flag words
    at gmem ``flags_ptr`` (rows 0..31, 32..63), so that the row's dq becomes NaN."""
    bad = [Int32(0), Int32(0)]  # rows 16 rg + lane // 4 and that + 8
    for k4 in cutlass.range_constexpr(cute.size(acc) // 4):
        for i in cutlass.range_constexpr(4):
            k = 4 * k4 + i
            y = acc[k] * mult[i // 2]
            ok = Int32(0)
            if y <= FIXED_LIMIT:
                if y >= -FIXED_LIMIT:
                    ok = Int32(1)
            if ok == 0:
                bad[i // 2] = Int32(1)
            if cutlass.const_expr(k % 8 < emu):
                acc[k] = fixed_bits_f32_fadd(y)
            else:
                acc[k] = fixed_bits_f32(y)
    for h in cutlass.range_constexpr(2):
        if bad[h] != 0:
            r = 16 * rg + 8 * h + lane // 4
            red_or_b32(flags_ptr + r // 32, Int32(1) << (r % 32))


@cute.jit
def bulk_add_warp_slice(gtile_ptr, sbase, rg, cg0, n_cg: cutlass.Constexpr,
                        n_rg: cutlass.Constexpr, w: cutlass.Constexpr, sbase2=None,
                        half: cutlass.Constexpr = 0, store: cutlass.Constexpr = False,
                        s32: cutlass.Constexpr = False, policy=None):
    """One bulk reduce-add per block of the warp's slice (blocks ``(cg0 + i) n_rg + rg``,
    ``i < n_cg``) from the staged tile (:func:`block_smem_ptr`) to the same blocks of the
    fp32 tile at gmem ``gtile_ptr`` (one lane issues them; the caller commits the bulk
    group); ``store``: bulk stores instead (the tile's first contribution); ``s32``: int32
    reduce-adds of fixed-point tiles (:func:`fixed_point_slice`); ``policy``: an L2 cache
    policy (:func:`.common.l2_policy`) for the fp32 reduce-adds."""
    for i in cutlass.range_constexpr(n_cg):
        blk = (cg0 + i) * n_rg + rg
        src = block_smem_ptr(blk, sbase, sbase2, half, w)
        if cutlass.const_expr(store):
            bulk_copy_f32(gtile_ptr + blk * (16 * w), src, 64 * w)
        elif cutlass.const_expr(s32):
            bulk_reduce_add_s32(gtile_ptr + blk * (16 * w), src, 64 * w)
        elif cutlass.const_expr(policy is not None):
            bulk_reduce_add_f32_hint(gtile_ptr + blk * (16 * w), src, 64 * w, policy)
        else:
            bulk_reduce_add_f32(gtile_ptr + blk * (16 * w), src, 64 * w)


@cute.jit
def tile_load(tile_ptr, tidx, w: cutlass.Constexpr):
    """Thread ``32 c + lane`` loads its ``w / 8`` 16-byte groups of block ``c`` of the fp32
    tile at gmem ``tile_ptr``: a ``(4, w / 8)`` fp32 register tensor."""
    nj = w // 8
    c = tidx // 32
    lane = tidx % 32
    v = cute.make_rmem_tensor((4, nj), Float32)
    for j in cutlass.range_constexpr(nj):
        src = cute.make_ptr(Float32, (tile_ptr + c * (16 * w) + 4 * (32 * j + lane)).toint(),
                            cute.AddressSpace.gmem, assumed_align=16)
        v[None, j].store(cute.make_tensor(src, cute.make_layout(4)).load())
    return v


@cute.jit
def tile_to_smem(v, sbase, tidx, bm: cutlass.Constexpr, d: cutlass.Constexpr,
                 w: cutlass.Constexpr, dtype: cutlass.Constexpr):
    """The values :func:`tile_load` gave thread ``tidx``, converted to ``dtype``, into the
    row-major ``(bm, d + 8)`` shared tile at ``sbase`` (bf16 / fp16 pairs: rows ``r`` and
    ``r + 8``). The caller syncs the CTA before reading the tile."""
    n_rg = bm // 16
    nj = w // 8
    c = tidx // 32
    lane = tidx % 32
    rs = smem_row_stride(d)
    r = (c % n_rg) * 16 + lane // 4
    col = (c // n_rg) * w + (lane % 4) * 2
    vb = cute.make_rmem_tensor((4, nj), dtype)
    vb.store(v.load().to(dtype))
    pairs = cute.recast_tensor(vb, Int32)  # (2, nj): rows r, r + 8
    for j in cutlass.range_constexpr(nj):
        for h in cutlass.range_constexpr(2):
            dst = cute.make_ptr(Int32, (sbase + (r + 8 * h) * rs + col + 8 * j).toint(),
                                cute.AddressSpace.smem, assumed_align=4)
            cute.make_tensor(dst, cute.make_layout(1))[0] = pairs[h, j]


@cute.jit
def smem_rows_to_gmem(sbase, tidx, n_threads: cutlass.Constexpr, gRows, row0, lim,
                      bm: cutlass.Constexpr, d: cutlass.Constexpr, dtype: cutlass.Constexpr):
    """Rows ``r < lim`` of the ``(bm, d + 8)`` shared tile at ``sbase`` to rows ``row0 + r``
    of the 2-D ``(rows, d)`` tensor ``gRows`` (D contiguous), in 16-byte pieces
    (``n_threads`` divides the tile's pieces)."""
    esize = dtype.width // 8
    per = 16 // esize  # elements per 16-byte piece
    chunks = d // per
    rs = smem_row_stride(d)
    for it in cutlass.range_constexpr(bm * chunks // n_threads):
        k = it * n_threads + tidx
        row = k // chunks
        piece = k % chunks
        if row < lim:
            s_ptr = cute.make_ptr(dtype, (sbase + row * rs + piece * per).toint(),
                                  cute.AddressSpace.smem, assumed_align=16)
            g_ptr = cute.make_ptr(dtype, elem_ptr(gRows, (row0 + row, piece * per)).toint(),
                                  cute.AddressSpace.gmem, assumed_align=16)
            cute.make_tensor(g_ptr, cute.make_layout(per)).store(
                cute.make_tensor(s_ptr, cute.make_layout(per)).load())


class BsaDqFromTiles:
    """dq ``(B, S_q, H_q, D)`` (either physical layout, D contiguous) in the input dtype from
    the block-sparse backward's workspace ``(B, H_q, ceil(S_q / 64) slots, 64 D)`` fp32 of
    64-row query tiles in ``w``-column blocks, ``slots`` consecutive accumulator tiles per
    query tile (summed in slot order): one CTA of ``32 * tile_blocks(64, D, w)`` threads per
    (query tile, head, batch) writes the tile's rows below ``S_q``. With ``mSem`` (int32
    ``(B, H_q, ceil(S_q / 64) slots)``, the deterministic backward's semaphores, which count
    the contributions to each accumulator tile; a workspace that was not zeroed) an
    accumulator tile whose semaphore is 0 holds no data and counts as zeros. ``pack > 1``
    (packed GQA, ``r = pack``): the workspace is ``(B, H_kv, ceil(S_q r / 64) slots, 64 D)``
    of packed rows, and packed row ``p`` of KV head ``g`` goes to position ``p // r`` of query
    head ``g r + p % r`` (``pack_gqa.packed_row``)."""

    BM = 64

    def __init__(self, dtype, head_dim: int, block_cols: int, pdl: bool = False,
                 slots: int = 1, pack: int = 1, wait_pairs: bool = False,
                 fixed: bool = False):
        self.pdl = pdl
        # the workspace holds fixed-point int32 sums (dq_fixed): each row's are converted
        # with its inverse multiplier (mMult[b, h, t, row, 1]); rows flagged in mFlags[b, h,
        # t, :]
        # (a contribution out of the bound or not finite) become NaN
        self.fixed = fixed and slots == 1 and pack == 1
        # with pdl, unpacked: each CTA waits until its (batch, KV head) pair's count of
        # completed backward CTAs (mDone[P + pair], P pairs) reaches the runtime n_wait (the
        # backward's KV blocks per pair), instead of for the backward's grid at its start;
        # the grid's last CTA waits for that grid at its end
        self.wait_pairs = wait_pairs and pdl and pack == 1
        self.pack = pack
        if slots < 1:
            raise ValueError(f"dq tiles: slots={slots} must be >= 1")
        self.slots = slots
        if head_dim % block_cols or block_cols % 8 or block_cols > 64:
            raise NotImplementedError(
                f"dq tiles: head_dim {head_dim} with {block_cols}-column blocks")
        self.dtype = dtype
        self.d = head_dim
        self.w = block_cols
        self.num_threads = 32 * tile_blocks(self.BM, head_dim, block_cols)

    @cute.jit
    def __call__(self, mWs, mdQ, stream, mSem=None, mDone=None, n_wait=None, mMult=None,
                 mFlags=None):
        n_elems = self.BM * smem_row_stride(self.d)

        @cute.struct
        class Smem:
            tile: cute.struct.Align[cute.struct.MemRange[self.dtype, n_elems], 128]

        self.kernel(mWs, mdQ, mSem, mDone, n_wait, mMult, mFlags, Smem).launch(
            grid=(cute.size(mWs.shape[2]) // self.slots, cute.size(mWs.shape[1]),
                  cute.size(mWs.shape[0])),
            block=[self.num_threads, 1, 1], smem=Smem.size_in_bytes(), stream=stream,
            use_pdl=self.pdl)

    @cute.kernel
    def kernel(self, mWs, mdQ, mSem, mDone, n_wait, mMult, mFlags, Smem: cutlass.Constexpr):
        tidx, _, _ = cute.arch.thread_idx()
        t, head, batch = cute.arch.block_idx()
        if cutlass.const_expr(self.wait_pairs):
            # this tile's (batch, KV head) pair: every backward CTA of it has completed its
            # dQ additions (relaxed polls with a sleep between them, which neither invalidate
            # L1 nor take issue slots from a backward CTA on the same SM, then one fence; the
            # generic loads below after an async-proxy fence)
            if tidx == 0:
                n_pairs = mDone.shape[0] // 2
                heads_kv = n_pairs // mWs.shape[0]
                pair = batch * heads_kv + head // (mWs.shape[1] // heads_kv)
                wait_at_least(elem_ptr(mDone, (n_pairs + pair,)), Int32(n_wait),
                              relaxed=True, sleep_ns=POLL_SLEEP_NS)
                cute.arch.fence_proxy("async.global")
            cute.arch.barrier()
        elif cutlass.const_expr(self.pdl):
            # programmatic dependent launch: wait for the backward's grid
            cute.arch.griddepcontrol_wait()
        st = cutlass.memory.SmemAllocator().allocate(Smem)
        sbase = st.tile.data_ptr()
        v = tile_load(elem_ptr(mWs, (batch, head, t * self.slots, 0)), tidx, self.w)
        # all slots' loads first, then the sum in slot order
        vs = [tile_load(elem_ptr(mWs, (batch, head, t * self.slots + p, 0)), tidx, self.w)
              for p in range(1, self.slots)]
        if cutlass.const_expr(mSem is not None):
            # a workspace that was not zeroed: an accumulator tile without contributions
            # (semaphore 0) holds garbage and counts as zeros
            if Int32(mSem[batch, head, t * self.slots]) == 0:
                v.fill(0.0)
            for p in cutlass.range_constexpr(1, self.slots):
                if Int32(mSem[batch, head, t * self.slots + p]) > 0:
                    v.store(v.load() + vs[p - 1].load())
        else:
            for vp in vs:
                v.store(v.load() + vp.load())
        if cutlass.const_expr(self.fixed):
            self._from_fixed(v, mMult, mFlags, batch, head, t, tidx)
        tile_to_smem(v, sbase, tidx, self.BM, self.d, self.w, self.dtype)
        cute.arch.barrier()
        row0 = t * self.BM
        if cutlass.const_expr(self.pack > 1):
            self._packed_rows_to_gmem(sbase, tidx, mdQ, batch, head, row0,
                                      mdQ.shape[1] * self.pack - row0)
        else:
            smem_rows_to_gmem(sbase, tidx, self.num_threads, mdQ[batch, None, head, None],
                              row0, mdQ.shape[1] - row0, self.BM, self.d, self.dtype)
        if cutlass.const_expr(self.wait_pairs):
            # complete only after the backward grid, as if launched after it: what follows
            # this launch in the stream may read everything the backward wrote. One CTA (the
            # last in launch order) waits: griddepcontrol.wait blocks until that whole grid
            # has completed, so a wait in every CTA would keep each CTA on its SM after its
            # tile until the backward's end, and only as many tiles as fit on the free SMs
            # at once could convert while the backward's last wave runs
            n_t, n_h, n_b = cute.arch.grid_dim()
            if t + n_t * (head + n_h * batch) == n_t * n_h * n_b - 1:
                cute.arch.griddepcontrol_wait()

    @cute.jit
    def _from_fixed(self, v, mMult, mFlags, batch, head, t, tidx):
        """``fixed``: this thread's values of tile ``t`` (int32 bits from :func:`tile_load`,
        rows ``r`` and ``r + 8`` as in :func:`tile_to_smem`) to float32 times the row's
        inverse multiplier; a row flagged by a contribution becomes NaN."""
        n_rg = self.BM // 16
        c = tidx // 32
        lane = tidx % 32
        r = (c % n_rg) * 16 + lane // 4
        nan = Float32(float("nan"))
        for h in cutlass.range_constexpr(2):
            row = r + 8 * h
            inv = Float32(mMult[batch, head, t, row, 1])
            flag = (Int32(mFlags[batch, head, t, row // 32]) >> (row % 32)) & 1
            for j in cutlass.range_constexpr(self.w // 8):
                for e in cutlass.range_constexpr(2):
                    x = f32_of_fixed_bits(v[2 * h + e, j], inv)
                    if flag != 0:
                        x = nan
                    v[2 * h + e, j] = x

    @cute.jit
    def _packed_rows_to_gmem(self, sbase, tidx, mdQ, batch, head_kv, row0, lim):
        """:func:`smem_rows_to_gmem` for packed rows: shared-tile row ``i < lim`` (packed row
        ``row0 + i`` of KV head ``head_kv``) to the dq row of its (position, query head)."""
        dtype, d = self.dtype, self.d
        per = 16 // (dtype.width // 8)  # elements per 16-byte piece
        chunks = d // per
        rs = smem_row_stride(d)
        for it in cutlass.range_constexpr(self.BM * chunks // self.num_threads):
            k = it * self.num_threads + tidx
            row = k // chunks
            piece = k % chunks
            if row < lim:
                s, h = packed_row(row0 + row, head_kv, self.pack)
                s_ptr = cute.make_ptr(dtype, (sbase + row * rs + piece * per).toint(),
                                      cute.AddressSpace.smem, assumed_align=16)
                g_ptr = cute.make_ptr(dtype, elem_ptr(mdQ, (batch, s, h, piece * per)).toint(),
                                      cute.AddressSpace.gmem, assumed_align=16)
                cute.make_tensor(g_ptr, cute.make_layout(per)).store(
                    cute.make_tensor(s_ptr, cute.make_layout(per)).load())


__all__ = ["FIXED_LIMIT", "BsaDqFromTiles", "block_smem_ptr", "bulk_add_warp_slice",
           "fixed_point_slice", "smem_rows_to_gmem", "smem_row_stride", "stage_warp_slice",
           "tile_blocks", "tile_load", "tile_to_smem"]
