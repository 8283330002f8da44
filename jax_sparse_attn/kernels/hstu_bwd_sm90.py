"""HSTU attention backward for SM90: warp-specialized TMA + wgmma kernel (``impl="sm90"``).

Same contract, schedule and semantics as ``hstu_bwd_sm80`` (read its docstring): one CTA per
(KV tile of ``bn = 128`` keys, head), dK and dV in fp32 registers while the CTA walks the
query tiles that can see its keys (``block_info.QTileRange``), dQ added into an XLA-owned
fp32 workspace: per warp with one bulk reduce-add into a query-tile workspace (``dq_tile``,
reordered into dq by ``hstu_dq_tiles``) or with ``red.global.add.v2.f32`` into a ``(T, H,
D)`` one. Head dims ``D = D_v`` in {64, 128, 256} (the public layer routes other
configurations to sm80); a relative attention bias at D <= 128 (``has_rab``, below).

CTA = 3 warpgroups (384 threads):

* warpgroup 0 (producer, ``setmaxnreg`` down to 24 registers): warp 0 loads the K and V
  tiles once and then, for every visible query tile, the Q and dO tiles into a 2-stage
  shared-memory ring (``pipeline.SmemPipeline``), with TMA (``cp.async.bulk.tensor``). A tile
  that crosses its sequence's end is instead copied row by row with cp.async and its rows
  past the end are zero-filled (a TMA box would read the next sequence's rows, which may hold
  anything): with zero rows, P and dS vanish there, so only window / func edges need a mask.
* warpgroups 1 and 2 (consumers, ``setmaxnreg`` up to 240): warpgroup ``w`` owns keys
  ``[64 w, 64 w + 64)`` of the KV tile. All products use the transposed (key-major)
  orientation, so P and dS come out of the score GEMMs as the register A operand of the dK /
  dV GEMMs::

      S^T  = K Q^T,   dP^T = V dO^T                          (wgmma, smem x smem)
      h = (alpha / 2) S^T, t = tanh(h):  P^T = h + h t,  sigma = (1 + t) / 2
      dS^T = dP^T * alpha / scaling_seqlen * sigma (1 + h (1 - t))
           (= sigma + P^T (1 - sigma), the SiLU derivative, in 4 FMAs)
      (masked pairs: P^T, dS^T selected to 0, ``mask.HstuMaskKeyMajor``)
      dV  += P^T dO,   dK += dS^T Q                          (wgmma, registers x smem)
      dQ   = dS K                                            (wgmma, smem x smem)

  With 64-query tiles the SiLU of S^T runs while the dP^T GEMM does (two wgmma groups). dS^T
  goes (``stmatrix``) to a double-buffered shared tile (query-major, read as the MN-major A
  operand of dQ = dS K); a named barrier of the two consumer warpgroups publishes both key
  halves. Issue order: dV, barrier, dQ, dK; the dQ reductions run under the dK GEMM. The dQ
  GEMM is split between the warpgroups along the head dim (``bm = 64`` at D = 128) or along
  the query rows (``bm = 128`` at D = 64), so each dQ element is added once per KV tile.
  The K tile serves as the K-major A operand of S^T and as the MN-major B operand of dQ (for
  16-bit types the 128-byte-swizzled K-major tile of a row-major ``(keys, D)`` block is
  bit-identical to the MN-major tile of its transpose); likewise Q and dO.
* D = 256 (``split_d``, 64 x 64 tiles): dK and dV of 64 keys x 256 columns would take 256
  fp32 registers per thread of one warpgroup, so both consumer warpgroups work on all 64 keys
  and each owns half of the head dim of dK, dV and dQ. S^T and dP^T are split along the
  query columns (warpgroup ``w``: queries ``[32 w, 32 w + 32)``, m64n32 wgmmas); P^T and
  dS^T both go to double-buffered query-major shared tiles, and after the barrier dV and dK
  read them as K-major A operands from shared memory (the same bytes, a K-major view). dQ is
  reduced with ``red`` or, with ``dq_tile``, staged per warp (16 x 128 fp32) in the step's
  Q / dO stage once both warpgroups' GEMMs have read it (named barrier 4 of the 256 consumer
  threads) and added with two bulk reduce-adds of 16 x 64.
* epilogue: dK and dV / scaling_seqlen converted in registers and stored to key rows
  ``< L_k``.

Relative attention bias (``has_rab``, D <= 128; ``mRab (B, H_rab, N_k, N_k)`` fp32 or 16-bit,
``rab_per_head`` when ``H_rab = H``; ``mdRab`` as ``hstu_bwd_sm80`` takes it): after issuing
the S^T and dP^T GEMMs each consumer thread loads the bias elements of its accumulator
fragment, one scalar load each (adjacent values are adjacent queries, bias rows ``N_k``
apart; addresses clamped into ``rab[b, h % H_rab]``), and the score pass forms ``h = (alpha
S^T + rab^T) / 2`` (0 bias where the bias row ``p = i + L_k - L_q`` or the key lies outside
``[0, min(L_k, N_k))``) and ``g = dP^T SiLU'(2 h) / scaling_seqlen``; after the mask (a
select) ``g`` is d rab (``_store_drab``: direct stores with ``drab_per_head``, else 16-byte
``red.global.add.v4.f32`` into the shared fp32 workspace after a shuffle transpose,
``_red_drab_v4``) and ``dS^T = alpha g``. With ``rab_fast`` (64-query tiles) a step whose
bias rows and keys all lie below ``min(L_k, N_k)`` (``_rab_inside``, a uniform branch) loads
and stores through the thread's partition of the tile (``_rab_tile``: one base address, then
constant offsets) without clamps or selects, and with ``drab_scalar`` adds d rab with one
scalar ``red.add`` per value; other steps take the clamped path, which zeroes the values
without a bias right after their loads. With ``rab_prefetch`` producer warp 0 issues
``prefetch.global.L2`` for a step's bias rows when it loads that step's Q / dO
(``_rab_prefetch``; ``drab_prefetch``: the shared workspace's rows too; ``rab_pf_ahead``:
one step earlier). Without
``has_rab`` none of this is traced.

The host launches the KV tiles longest work first (``metadata.hstu_bwd_schedule`` with the
window). With ``head_major`` the grid is (KV tile slots, heads): the CTAs of one head launch
together (longest first within it), so the CTAs resident at a time read Q / dO and add dQ of
one head, a working set that stays in L2 (with the heads of a slot consecutive, the resident
CTAs span every sequence and head, and at long sequences Q, dO and dQ overflow L2).

Deterministic mode (``deterministic``, with ``mdQSem``: int32 ``(query tile slots, H)``,
zero-initialised by XLA): the dQ contributions of the KV tiles that cover a query tile are
added in ascending KV tile order, so every dQ element gets the same fp32 additions in the
same order on every run. Warp 1 of the producer warpgroup (otherwise idle) walks the same
query tiles as the consumers; for each it waits (lane 0, acquire loads) until the
semaphore of (query tile, head) reaches ``n`` when KV tile ``n - 1`` also covers the tile
(``QTileRange.covers``), then arrives on named barrier 2; the consumers sync on it before
their ``red.global.add`` of that tile and arrive on named barrier 3 after them; warp 1 syncs
on barrier 3 and publishes ``n + 1`` (``fence.acq_rel.gpu`` + store). The spin overlaps the
consumers' GEMMs. In this mode every CTA walks its query tiles from the last one down: the
CTA of KV tile ``n - 1`` (whose query-tile range ends no later and which launches no later)
then reaches each shared query tile no later than the CTA of tile ``n``, so a CTA rarely
waits and never has to outlive its predecessor (with an ascending walk under a causal mask
every CTA would end with the longest one of its sequence, the shared last query tile). Deadlock freedom: a CTA only waits for the CTA of KV tile ``n - 1`` of
the same sequence and head, which the schedule launches at a lower linear block index
(``hstu_bwd_schedule(..., deterministic=True)`` keeps KV tiles of a sequence in ascending
order), and a non-persistent grid dispatches blocks in increasing linear index (as
FlashAttention-2/3's deterministic backwards assume), so the lowest unfinished block never
waits. dQ is then reduced with ``red`` or, with ``dq_tile``, each warp's bulk reduce-add is
issued after barrier 2 and waited for (complete, not only read) before barrier 3 (``dq_bulk``
is off). With ``det_writer`` (and ``dq_tile``) warp 1 issues the additions itself, as
FlashAttention-3's dQ writer warp does: the consumers stage their slices, arrive on barrier 2
and go on with the next query tile; warp 1 waits for the semaphore, syncs on barrier 2, adds
the staged tile (8 bulk reduce-adds of 4 KB), waits until they have read it and arrives on
barrier 5 (on which the consumers sync before they stage their next tile), then waits until
they are complete and publishes (at D = 256, ``dq_alias``: the consumers stage in the step's Q
/ dO stage and warp 1 adds every warp's two blocks and releases the stage to the producer
once they are read). The consumers then wait for a slow predecessor only when warp 1 is a
whole tile behind.

``wg_skip`` (D = 128): a consumer warpgroup whose 64 keys the mask hides from every row of a
query tile, or that lie past ``L_k`` (``_wg_hidden``), runs the step without its S^T, dP^T,
dV and dK GEMMs and score function: zeros as its half of dS^T, its half of dQ as usual. The
step is one method (``_step``) with a Constexpr ``skip``, and the walk branches between its
two copies, each ending with no wgmma in flight (a branch inside the step leaves a wgmma
group in flight on one path only, and the full step got much slower).

``dq_writer`` (not deterministic, with ``dq_tile`` or ``dq_alias``): warp 1 is the same
writer without the semaphore: it adds each step's staged dQ, hands the staging buffer (and
with ``dq_alias`` the Q / dO stage) back once the additions have read it, so no consumer warp
waits for the reads of its own bulk copies.

Workspace without zeroing: ``det_store`` (deterministic, with the writer): the KV tile
first in a query tile's order (``QTileRange.covers`` of the previous KV tile is 0) stores the
tile with bulk copies instead of adding it. ``dq_claim`` (with ``dq_writer``; ``mdQSem``
int32 ``(slots, H, 2)``, zero-initialised): the writer claims the query tile with an atomic
add on ``[slot, head, 0]``; the first claimer stores, waits until the store is complete and
publishes ``[slot, head, 1] = 1`` (release); a later claimer waits for that flag (acquire)
before its bulk reduce-adds. The first claimer publishes without waiting for anything
else, so the waits cannot form a cycle. In both modes a waiting writer issues
``fence.proxy.async.global`` after its acquire: the acquire orders generic-proxy accesses,
and the bulk reduce-adds that follow are async-proxy ones. In both modes a tile nobody wrote keeps its counter
at 0 and ``kernels/hstu_dq_tiles.py`` writes zeros for it.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.memory
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Float32, Int32
from cutlass.cute.nvgpu import OperandMajorMode, cpasync, warpgroup

from . import hstu_common as hc
from . import kv_major_bwd as kvb
from .block_info import QTileRange
from .common import (acc_layout_as_a, acc_mn_view_wg, atom_add_acq_rel_s32, atom_add_s32,
                     bulk_copy_f32, bulk_reduce_add_f32, elem_ptr, gmem_load_copy,
                     kv_major_bwd_operands, ld_shared_s32, st_shared_s32, tma_view)
from .dq_tiles import (bulk_add_warp_slice, smem_rows_to_gmem, stage_warp_slice, tile_load,
                       tile_to_smem)
from .mask import HstuMaskKeyMajor
from .pipeline import SmemPipeline
from .seqlen_info import SeqlenInfo, offset_rows

#: head dims (D = D_v) of this kernel
SM90_BWD_HEAD_DIMS = (64, 128, 256)
#: lower clamp of h = (alpha / 2) s in the score function and its derivative
H_LOWEST = -1.0e30
#: row stride (floats) of the dq_bulk staging: rows 0-3 of a warp's stores fill the 32 banks
DQ_STRIDE = 72


def bwd_sm90_tiles(head_dim: int):
    """(query rows, keys) per tile: 128 x 128 at D = 64, 64 x 128 at D = 128, 64 x 64 at
    D = 256."""
    if head_dim > 128:
        return 64, 64
    return (128 if head_dim <= 64 else 64), 128


class _StepCtx:
    """The loop-invariant values of a consumer warpgroup's walk that ``HstuBwdSm90._step``
    reads (a plain holder of trace-time values)."""

    def __init__(self, **values):
        self.__dict__.update(values)


class HstuBwdSm90:
    """``__call__`` takes the arguments of ``HstuBwdSm80.__call__``; rab and d rab as the
    keywords ``mRab``, ``mdRab`` (``has_rab``)."""

    def __init__(self, dtype, head_dim, has_func, func_n, dq_bulk=False, deterministic=False,
                 dq_vec4=False, head_major=False, dq_tile=False, pdl=False,
                 det_writer=False, dq_writer=False, split_wait=False, epi_pairs=False,
                 det_store=False, dq_claim=False, convert_rows=0, wg_skip=False,
                 epi_smem=False, uniform_frags=True, wg_hand=False, has_rab=False,
                 rab_per_head=False, rab_fast=False, rab_prefetch=False,
                 drab_prefetch=False, drab_scalar=False, rab_pf_ahead=False,
                 rab_fast_wide=False, q_probe=False):
        self.pdl = pdl
        # the consumers' shared-memory GEMM operands partitioned with a warp-uniform thread
        # index (kernels.common.kv_major_bwd_operands)
        self.uniform_frags = uniform_frags
        if head_dim not in SM90_BWD_HEAD_DIMS:
            raise NotImplementedError(
                f"hstu_bwd_sm90: head_dim={head_dim} is not one of {SM90_BWD_HEAD_DIMS}")
        self.dtype = dtype
        self.d = head_dim
        self.bm, self.bn = bwd_sm90_tiles(head_dim)
        # D = 256 (split_d): dK and dV of 64 keys x D do not fit one warpgroup's registers, so
        # both warpgroups take all 64 keys and half of the head dim each; S^T / dP^T are split
        # along the query columns, P^T and dS^T go through shared memory (the A operand of
        # dV / dK from smem)
        self.split_d = head_dim > 128
        self.has_func = has_func
        self.func_n = func_n
        self.q_stages = 2
        # dQ = dS K: warpgroups split the query rows (bm = 128) or the head dim (bm = 64)
        self.dq_split_m = self.bm == 128
        # SiLU / SiLU' of S^T while the dP^T GEMM runs (needs registers for both: 64-query tiles)
        self.overlap_sdp = self.bm == 64
        # with overlap_sdp: the Q / dO stage's full barrier re-checked before the dP^T wait
        # (a basic block boundary that keeps ptxas from hoisting the wait above the SiLU)
        self.split_wait = split_wait and self.overlap_sdp
        # dK / dV stored as packed pairs of adjacent columns (4-byte stores)
        self.epi_pairs = epi_pairs
        # dQ: red.global.add.v2.f32 from registers, or (dq_bulk) staged in shared memory per
        # warpgroup (64 rows x 64 columns, row stride DQ_STRIDE floats) and added with one
        # bulk reduce-add per row
        self.dq_bulk = dq_bulk and not deterministic and not self.split_d
        # dQ tile workspace (dq_tile): each consumer warp stores its 16 x 64 accumulator slice
        # in register order (thread-interleaved 16-byte stores, conflict-free) and one lane
        # adds the warp's 4 KB with a single bulk reduce-add to the query tile's block of the
        # workspace (query tile slots, H, bm * D), whose order the host undoes
        # (``dq_tile_order``)
        self.dq_tile = dq_tile and not self.split_d and not self.dq_bulk
        # D = 256 with dq_tile (dq_alias): no room for a staging tile, so once both
        # warpgroups' GEMMs of a step are done each consumer warp stages its 16 x 128 slice
        # in the step's consumed Q / dO stage (the tile's 16 blocks of 16 x 64 floats,
        # ``dq_tiles.stage_warp_slice``: 8 in the Q buffer, 8 in the dO buffer) and adds its
        # two blocks with bulk reduce-adds; the stage goes back to the producer once their
        # reads are done
        self.dq_alias = dq_tile and self.split_d and not self.dq_bulk
        # with the dQ staging tile (not dq_alias): after its staging stores a consumer
        # computes the next step's Q / dO stage index and tests that stage's full barrier
        # without waiting (SmemPipeline.consumer_test); the next step skips its wait where
        # the test passed
        self.q_probe = q_probe and self.dq_tile
        self.deterministic = deterministic
        # deterministic with dq_tile: warp 1 issues the staged tile's bulk reductions itself
        # once the semaphore allows (the consumers stage and go on; _dq_order_warp)
        self.det_writer = det_writer and deterministic and (self.dq_tile or self.dq_alias)
        # not deterministic, with dq_tile or dq_alias: warp 1 issues every step's bulk
        # reductions of the staged dQ (the consumers stage and go on instead of waiting for
        # the bulk reads of their slices; with dq_alias warp 1 also hands the stage back)
        self.dq_writer = dq_writer and not deterministic and (self.dq_tile or self.dq_alias)
        # warp 1 adds the staged dQ tiles (either mode)
        self.writer = self.det_writer or self.dq_writer
        # with det_writer: the first KV tile in a query tile's order stores its dQ instead of
        # adding it, so the workspace needs no zeroing (query tiles no KV tile covers keep
        # their semaphore at 0, and the reordering kernel writes zeros for them)
        self.det_store = det_store and self.det_writer
        # with dq_writer (not deterministic): the writer claims each query tile (atomic add
        # on ``mdQSem[slot, head, 0]``); the first claimer stores its dQ and, once the store
        # is complete, publishes ``mdQSem[slot, head, 1] = 1``; later claimers wait for that
        # before they add; so the workspace needs no zeroing (unclaimed tiles: the
        # reordering kernel writes zeros)
        self.dq_claim = dq_claim and self.dq_writer
        # convert_rows > 0 (not deterministic, dq_tile at D <= 128): the last CTA of a
        # (sequence, KV head) to finish (a counter per pair, ``mCnt``) writes that
        # sequence's dq in the input dtype from the workspace when the sequence has at most
        # convert_rows queries (``mdQout``); the reordering kernel skips those sequences
        self.convert_rows = (convert_rows if not deterministic and self.dq_tile
                             and not self.dq_bulk else 0)
        # blocks of the dq tile workspace (16 x 64 floats each, kernels/dq_tiles.py order)
        self.dq_blocks = (self.bm // 16) * (head_dim // 64)
        # red: one red.global.add.v4.f32 per 4 values (lane pairs swap halves) instead of
        # one .v2 per 2
        self.dq_vec4 = dq_vec4 and not self.dq_bulk
        # grid (KV tile slots, heads) instead of (heads, slots): consecutive CTAs take the KV
        # tiles of one head (with the schedule in canonical order: of one sequence and head)
        self.head_major = head_major
        # a consumer warpgroup whose 64 keys the mask hides from every query of a step (or
        # that lie past L_k) skips the step's S^T, dP^T, dV and dK GEMMs and its score
        # function; it writes zeros as its half of dS^T and takes part in dQ = dS K as
        # usual (D = 128: the warpgroups own key halves of 64-query tiles; at D = 64 the
        # second path costs ptxas spills, and the 128-query tiles see both halves on the
        # causal diagonal)
        self.wg_skip = wg_skip and not self.split_d and self.bm == 64
        # epilogue through shared memory (the consumed Q / dO stages and dS tiles): packed
        # conflict-free pairs into two (bn, D + 8) tiles, then coalesced 16-byte row pieces
        # (kv_major_bwd.store_dk_dv_smem); D <= 128 (the warpgroups own key halves)
        self.epi_smem = epi_smem and not self.split_d
        # dq_writer with the staging tile (not dq_claim): warp 1 takes each consumer
        # warpgroup's half of the staged tile (its four 4 KB chunks) on that warpgroup's own
        # named barriers (staged: 2 / 11, handed back: 5 / 10, 128 + 32 threads), so a
        # warpgroup never waits for the other one's dQ at the staging barriers
        self.wg_hand = wg_hand and self.dq_writer and self.dq_tile and not self.dq_claim
        # relative attention bias (D <= 128): rab (B, H_rab, N_k, N_k) read per thread in the
        # accumulator layout, d rab written from g = dS^T / alpha (see _scores)
        self.has_rab = has_rab
        self.rab_per_head = rab_per_head
        # d rab with one writer per element: per-head rab, or (deterministic) the per-head
        # fp32 workspace; else fp32 red.add into the shared (B, 1, N_k, N_k_pad) workspace
        self.drab_per_head = rab_per_head or deterministic
        if has_rab and self.split_d:
            raise NotImplementedError("hstu_bwd_sm90: rab at head_dim > 128")
        # rab_fast: a step whose tile lies inside the sequence's bias (every query row and key
        # below lim, see _rab_view) loads its bias and writes d rab without clamps or range
        # selects, through the thread's partition of the tile; other steps as before
        # (64-query tiles only: with 128 the fast path's 64 loads per thread make ptxas spill;
        # rab_fast_wide: 128-query tiles too)
        self.rab_fast = rab_fast and has_rab and (self.bm == 64 or rab_fast_wide)
        # rab_prefetch: producer warp 0 issues L2 prefetches of a step's bias rows when it
        # loads the step's Q / dO (about one step ahead of the consumers' loads);
        # drab_prefetch: the same for the rows of the shared fp32 d rab workspace (H_rab = 1)
        self.rab_prefetch = rab_prefetch and has_rab
        self.drab_prefetch = drab_prefetch and has_rab and not self.drab_per_head
        # rab_pf_ahead: the prefetches of a step issued one step earlier (after the previous
        # step's Q / dO loads)
        self.rab_pf_ahead = rab_pf_ahead and (self.rab_prefetch or self.drab_prefetch)
        # drab_scalar (with rab_fast, shared workspace): a step inside the bias adds each
        # value with its own red.add (no lane transpose)
        self.drab_scalar = drab_scalar and self.rab_fast and not self.drab_per_head
        self.num_threads = 384
        self.regs_producer = 24
        self.regs_consumer = 240

    @cute.jit
    def __call__(self, mdO, mQ, mK, mV, mCuQ, mCuK, mKVTile, mQStart, mQTiles, mFunc, mScal,
                 mWin, mdQacc, mdK, mdV, stream, mdQSem=None, mdQout=None, mCnt=None,
                 mRab=None, mdRab=None):
        dt = self.dtype
        bm, bn, d = self.bm, self.bn, self.d
        Kmaj = OperandMajorMode.K
        MN = OperandMajorMode.MN
        if cutlass.const_expr(self.split_d):
            # S^T, dP^T: (bn = 64 keys) x (bm queries); warpgroup w: query columns bm/2 w..
            mma_s = sm90_utils.make_trivial_tiled_mma(dt, dt, Kmaj, Kmaj, Float32, (1, 2, 1),
                                                      (64, bm // 2))
            # dV, dK: (bn keys) x D, warpgroup w: columns D/2 w..; A (P^T, dS^T) from smem
            mma_kv = sm90_utils.make_trivial_tiled_mma(dt, dt, Kmaj, MN, Float32, (1, 2, 1),
                                                       (64, d // 2))
        else:
            # S^T, dP^T: (bn keys) x (bm queries), reduction over D; warpgroup w: keys 64w..
            mma_s = sm90_utils.make_trivial_tiled_mma(dt, dt, Kmaj, Kmaj, Float32, (2, 1, 1),
                                                      (64, bm))
            # dV, dK: (bn keys) x D, reduction over the bm queries, A (P^T, dS^T) from registers
            mma_kv = sm90_utils.make_trivial_tiled_mma(dt, dt, Kmaj, MN, Float32, (2, 1, 1),
                                                       (64, d), warpgroup.OperandSource.RMEM)
        # dQ: (bm queries) x D, reduction over the bn keys
        if cutlass.const_expr(self.dq_split_m):
            mma_dq = sm90_utils.make_trivial_tiled_mma(dt, dt, MN, MN, Float32, (2, 1, 1), (64, d))
        else:
            mma_dq = sm90_utils.make_trivial_tiled_mma(dt, dt, MN, MN, Float32, (1, 2, 1),
                                                       (64, d // 2))
        sK_layout, sK_mn_layout, sQ_layout, sQ_mn_layout, sdS_layout = kvb.layouts(
            dt, bn, bm, d, self.q_stages, 2)
        # split_d: the K-major (bn, bm) view of the query-major dS / P^T tiles (A of dK / dV)
        sdS_k_layout = kvb.ds_kmajor_layout(dt, bn, bm, d, 2)
        p_elems = cute.cosize(sdS_layout) if cutlass.const_expr(self.split_d) else 0
        if cutlass.const_expr(self.epi_smem):
            # the epilogue's two (bn, D + 8) tiles take the Q / dO stages and the dS tiles
            kvb.check_epi_smem_fit("hstu_bwd_sm90", bn, d, sQ_layout, sdS_layout)

        # TMA views (T, D, H) with D contiguous
        tQ, tdO, tK, tV = tma_view(mQ, d), tma_view(mdO, d), tma_view(mK, d), tma_view(mV, d)
        g2s = cpasync.CopyBulkTensorTileG2SOp()
        sQ_one = cute.slice_(sQ_layout, (None, None, 0))
        sK_one = cute.slice_(sK_layout, (None, None, 0))
        tma_q, tma_tQ = cpasync.make_tiled_tma_atom(g2s, tQ, sQ_one, (bm, d))
        tma_do, tma_tdO = cpasync.make_tiled_tma_atom(g2s, tdO, sQ_one, (bm, d))
        tma_k, tma_tK = cpasync.make_tiled_tma_atom(g2s, tK, sK_one, (bn, d))
        tma_v, tma_tV = cpasync.make_tiled_tma_atom(g2s, tV, sK_one, (bn, d))

        n_mbar = SmemPipeline.num_barriers(self.q_stages) + SmemPipeline.num_barriers(1)
        dq_elems = 2 * 64 * DQ_STRIDE if cutlass.const_expr(self.dq_bulk) else 0
        if cutlass.const_expr(self.dq_tile):
            dq_elems = bm * d

        @cute.struct
        class Smem:
            mbar: cute.struct.MemRange[cutlass.Int64, n_mbar]
            sK: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sK_layout)], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sK_layout)], 1024]
            sQ: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sQ_layout)], 1024]
            sdO: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sQ_layout)], 1024]
            sdS: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sdS_layout)], 1024]
            sP: cute.struct.Align[cute.struct.MemRange[dt, p_elems], 1024]
            sdQ: cute.struct.Align[cute.struct.MemRange[Float32, dq_elems], 128]

        grid = (cute.size(mK.shape[1]), cute.size(mKVTile.shape[0]), 1)
        if cutlass.const_expr(self.head_major):
            grid = (cute.size(mKVTile.shape[0]), cute.size(mK.shape[1]), 1)
        self.kernel(
            tma_q, tma_tQ, tma_do, tma_tdO, tma_k, tma_tK, tma_v, tma_tV,
            mQ, mdO, mK, mV, mCuQ, mCuK, mKVTile, mQStart, mQTiles, mFunc, mScal, mWin,
            mdQacc, mdK, mdV, mdQSem, mdQout, mCnt, mRab, mdRab, sK_layout, sK_mn_layout,
            sQ_layout, sQ_mn_layout, sdS_layout, sdS_k_layout, mma_s, mma_kv, mma_dq, Smem,
        ).launch(grid=grid, block=[self.num_threads, 1, 1], smem=Smem.size_in_bytes(),
                 stream=stream, min_blocks_per_mp=1, use_pdl=self.pdl)

    # ------------------------------------------------------------------------------------
    @cute.jit
    def _load_rows(self, mX, head, start, tile, rows: cutlass.Constexpr, limit, sX, lane):
        """One warp: rows ``[tile rows, tile rows + limit)`` of the sequence starting at
        ``start`` by cp.async into ``sX`` (rows, D), zeros in the tile's other rows."""
        copy = gmem_load_copy(self.dtype, 32, self.d)
        gX = cute.local_tile(offset_rows(mX[None, head, None], start), (rows, self.d), (tile, 0))
        thr = copy.get_slice(lane)
        tg = thr.partition_S(gX)
        ts = thr.partition_D(sX)
        tc = thr.partition_S(cute.make_identity_tensor((rows, self.d)))
        for r in cutlass.range(cute.size(ts.shape[1]), unroll=1):
            if tc[0, r, 0][0] < limit:
                cute.copy(copy, tg[None, r, None], ts[None, r, None])
            else:
                ts[None, r, None].fill(0)

    def _tma_tiles(self, tma, tma_tX, head, start, rows: int, sX):
        """TMA partitions ``(smem side, gmem side)`` of head ``head`` of the sequence whose
        first row is ``start``: gmem side indexed by the ``rows``-row tile of the sequence,
        smem side by the stage of ``sX`` (rows, D, stages)."""
        gX = cute.local_tile(offset_rows(tma_tX[None, None, head], start), (rows, self.d),
                             (None, 0))
        return cpasync.tma_partition(tma, 0, cute.make_layout(1), cute.group_modes(sX, 0, 2),
                                     cute.group_modes(gX, 0, 2))

    @cute.jit
    def _silu_grad(self, s, alpha_half, half_ds):
        """``(P, G)`` of one score ``s``: with ``h = (alpha / 2) s``, ``t = tanh(h)`` (one MUFU
        op), ``P = SiLU(alpha s) = h + h t`` and ``G = alpha / scaling_seqlen * SiLU'(alpha s)
        = 2 half_ds * sigma (1 + h (1 - t))``, ``sigma = (1 + t) / 2`` (4 FMAs). ``h`` is
        clamped below at -1e30 (NaN kept): the limits P = G = 0 of a saturated tanh stay
        finite (``h (1 - t)`` must not overflow), -inf scores included."""
        hval = hc.finite_below(s * alpha_half, H_LOWEST)
        tv = hc.tanh_approx(hval)
        p = hval + hval * tv
        a = hval - hval * tv
        sg = half_ds + half_ds * tv
        return p, sg + sg * a

    @cute.jit
    def _silu_grad_h(self, h, half_g):
        """``(P, G)`` of :meth:`_silu_grad` from ``h`` itself (with rab: ``h = (alpha s +
        rab) / 2``), ``G = 2 half_g * SiLU'(2 h)`` (``half_g = 1 / (2 scaling_seqlen)``: g,
        alpha left out)."""
        hval = hc.finite_below(h, H_LOWEST)
        tv = hc.tanh_approx(hval)
        p = hval + hval * tv
        a = hval - hval * tv
        sg = half_g + half_g * tv
        return p, sg + sg * a

    @cute.jit
    def _scores(self, mma_s, acc_S, acc_dP, tSrK, tSrV, tSrQ, tSrdO, s, c, tP, tP_acc, tdS_acc,
                alpha_half, half_ds, ds_scale, full, mask, n0, m0, seq, left, right, mFunc,
                pipe_q, rab=None):
        """One step's score tiles: issues ``S^T`` and ``dP^T`` (Q / dO stage ``s``), computes
        P^T (into ``tP``) and dS^T (``acc_dP``, then ``tdS_acc`` in the input dtype), masked
        where the tile is not ``full``. With rab (``rab``: :meth:`_rab_view`) the bias
        loads are issued after the GEMMs, ``h = (alpha S^T + rab^T) / 2``, and ``g = M dP^T
        SiLU'(2 h) / scaling_seqlen`` (masked: 0) goes to d rab before ``dS^T = alpha g``.
        Returns ``mma_s`` (rebound by the caller)."""
        mma_s = kvb.issue_s_dp(mma_s, acc_S, acc_dP, tSrK, tSrV, tSrQ, tSrdO, s)
        rB = None
        if cutlass.const_expr(self.has_rab):
            rab = self._rab_view(rab.ctx, rab.head, rab.batch, seq, m0, rab.thr_s, alpha_half)
            rB = self._rab_load(rab, n0)
        if cutlass.const_expr(self.overlap_sdp):
            # S^T is done; the dP^T GEMM runs while P^T (16 bit) and the factor
            # dS^T / dP^T (fp32, in acc_S's registers) are computed
            warpgroup.wait_group(1)
            for e2 in cutlass.range_constexpr(cute.size(acc_S) // 2):
                pp = cute.make_rmem_tensor((2,), Float32)
                for u in cutlass.range_constexpr(2):
                    e = 2 * e2 + u
                    if cutlass.const_expr(self.has_rab):
                        # (with rab the factor is g / dP^T: alpha comes after d rab)
                        pp[u], acc_S[e] = self._silu_grad_h(
                            self._biased_h(acc_S[e], alpha_half, rB, rab, n0, e),
                            rab.half_g)
                    else:
                        pp[u], acc_S[e] = self._silu_grad(acc_S[e], alpha_half,
                                                          half_ds)
                # values 2k, 2k + 1 (adjacent columns) are adjacent registers:
                # one packed conversion
                off = cute.crd2idx(2 * e2, acc_S.layout)
                cute.make_tensor(tP.iterator + off, cute.make_layout(2)).store(
                    pp.load().to(self.dtype))
            if cutlass.const_expr(self.split_wait):
                # the step's Q / dO stage is still held, so this check
                # of its full barrier passes at once; its wait loop ends
                # the basic block, and ptxas keeps the dP^T wait below
                # the SiLU instead of hoisting it above most of it
                pipe_q.consumer_wait(c)
            warpgroup.wait_group(0)
            for e in cutlass.range_constexpr(cute.size(acc_S)):
                acc_dP[e] = acc_dP[e] * acc_S[e]
        else:
            # both GEMMs done; P^T and dS^T in place (fewer live registers;
            # this form of SiLU' leaves ptxas without spills here)
            warpgroup.wait_group(0)
            for e in cutlass.range_constexpr(cute.size(acc_S)):
                if cutlass.const_expr(self.has_rab):
                    hval = hc.finite_below(self._biased_h(acc_S[e], alpha_half, rB, rab, n0,
                                                          e))
                else:
                    hval = hc.finite_below(acc_S[e] * alpha_half)  # SiLU(-inf)=0
                tv = hc.tanh_approx(hval)
                p = hval + hval * tv
                sig = 0.5 + 0.5 * tv
                acc_S[e] = p
                if cutlass.const_expr(self.has_rab):
                    # g (alpha comes after d rab)
                    acc_dP[e] = acc_dP[e] * (rab.half_g * 2.0) * (sig + p * (1.0 - sig))
                else:
                    acc_dP[e] = acc_dP[e] * ds_scale * (sig + p * (1.0 - sig))
            tP_acc.store(acc_S.load().to(self.dtype))
        if full == 0:
            # select, never multiply: masked pairs give P^T = dS^T = 0
            mask.apply(acc_mn_view_wg(tP_acc), acc_mn_view_wg(acc_dP), n0, m0,
                       seq, left, right, mFunc)
        if cutlass.const_expr(self.has_rab):
            self._store_drab(acc_dP, rab, n0)
            for e in cutlass.range_constexpr(cute.size(acc_dP)):
                acc_dP[e] = acc_dP[e] * rab.alpha
        tdS_acc.store(acc_dP.load().to(self.dtype))
        return mma_s

    # ------------------------------------------------------------- relative attention bias
    @cute.jit
    def _rab_view(self, rctx, head, batch, seq, m0, thr_s, alpha_half):
        """The bias of one step: ``rab[b, head % H_rab]`` and d rab's ``[b, head]`` (per head)
        or ``[b, 0]`` views (``b``: ``batch`` clamped into rab's batch extent); query ``m0 +
        i`` reads bias row ``p = row_off + i`` (``row_off = m0 + L_k - L_q``), keys and bias
        rows below ``lim = min(L_k, N_k)`` have a bias; ``tSc``: this thread's (key, query)
        tile coordinates; ``half_g`` (``rctx``) and ``alpha``."""
        mRab = rctx.mRab
        n_k = mRab.shape[3]
        b = cutlass.min(batch, mRab.shape[0] - 1)
        h = head if cutlass.const_expr(self.rab_per_head) else 0
        hd = head if cutlass.const_expr(self.drab_per_head) else 0
        return _StepCtx(rab=mRab[b, h, None, None], drab=rctx.mdRab[b, hd, None, None],
                        row_off=m0 + seq.off, lim=cutlass.min(seq.seqlen_k, n_k), n_k=n_k,
                        thr_s=thr_s,
                        tSc=thr_s.partition_C(cute.make_identity_tensor((self.bn, self.bm))),
                        half_g=rctx.half_g, alpha=alpha_half * 2.0)

    @cute.jit
    def _rab_load(self, rab, n0):
        """Issue the global loads of this thread's bias elements of the step (rab's dtype, one
        register fragment in the accumulator layout). Adjacent accumulator values are
        adjacent queries, i.e. bias rows ``N_k`` apart: one scalar load each. Addresses are
        clamped into ``rab[b, h]``; :meth:`_biased_h` drops what lies outside (with
        ``rab_fast``: steps inside the bias load without clamps, other steps zero what lies
        outside here)."""
        n_k = rab.n_k
        rB = cute.make_rmem_tensor(rab.tSc.shape, rab.rab.element_type)
        if cutlass.const_expr(self.rab_fast):
            if self._rab_inside(rab, n0):
                tSg = self._rab_tile(rab.rab, rab, n0)
                for e in cutlass.range_constexpr(cute.size(rB)):
                    rB[e] = tSg[e]
            else:
                # clamped loads; values without a bias zeroed here, so _biased_h adds rB as is
                for e in cutlass.range_constexpr(cute.size(rB)):
                    p = cutlass.max(cutlass.min(rab.row_off + rab.tSc[e][1], n_k - 1), 0)
                    j = cutlass.min(n0 + rab.tSc[e][0], n_k - 1)
                    rB[e] = rab.rab[p, j]
                for e in cutlass.range_constexpr(cute.size(rB)):
                    if not self._rab_ok(rab, n0, e):
                        rB[e] = rB.element_type(0.0)
        else:
            for e in cutlass.range_constexpr(cute.size(rB)):
                p = cutlass.max(cutlass.min(rab.row_off + rab.tSc[e][1], n_k - 1), 0)
                j = cutlass.min(n0 + rab.tSc[e][0], n_k - 1)
                rB[e] = rab.rab[p, j]
        return rB

    @cute.jit
    def _rab_inside(self, rab, n0):
        """Whether every (query row, key) of the step's tile has a bias: bias rows
        ``row_off .. row_off + bm - 1`` and keys ``n0 .. n0 + bn - 1`` all in ``[0, lim)``."""
        return ((rab.row_off >= 0) & (rab.row_off + self.bm <= rab.lim)
                & (n0 + self.bn <= rab.lim))

    @cute.jit
    def _rab_tile(self, mX, rab, n0):
        """This thread's accumulator-layout partition of the step's (keys, queries) tile of
        the (bias rows, keys) matrix ``mX`` (rab or d rab of one head): element ``(key,
        query)`` at ``mX[row_off + query, n0 + key]``. Only for steps inside the bias."""
        base = elem_ptr(mX, (rab.row_off, n0))
        tile = cute.make_tensor(base, cute.make_layout(
            (self.bn, self.bm), stride=(1, mX.layout.stride[0])))
        return rab.thr_s.partition_C(tile)

    @cute.jit
    def _rab_prefetch(self, mRab, mdRab, batch, head, seq, m0, n0, lane):
        """L2 prefetches (producer warp) of the bias rows of the step at query ``m0`` (rows
        ``m0 + L_k - L_q ..`` below ``lim``, keys ``n0 .. n0 + bn - 1`` clamped below
        ``lim``; rab_prefetch) and of the same rows of the shared d rab workspace
        (drab_prefetch)."""
        n_k = mRab.shape[3]
        b = cutlass.min(batch, mRab.shape[0] - 1)
        lim = cutlass.min(seq.seqlen_k, n_k)
        row_off = m0 + seq.off
        j_hi = cutlass.min(n0 + self.bn, lim) - 1
        if cutlass.const_expr(self.rab_prefetch):
            h = head if cutlass.const_expr(self.rab_per_head) else 0
            self._prefetch_rows(mRab[b, h, None, None], row_off, lim, n0, j_hi, lane,
                                mRab.element_type.width // 8)
        if cutlass.const_expr(self.drab_prefetch):
            self._prefetch_rows(mdRab[b, 0, None, None], row_off, lim, n0, j_hi, lane, 4)

    @cute.jit
    def _prefetch_rows(self, mX, row_off, lim, n0, j_hi, lane, es: cutlass.Constexpr):
        """Prefetch rows ``row_off .. row_off + bm - 1`` (those in ``[0, lim)``) of ``mX``
        (elements of ``es`` bytes), keys ``n0 .. j_hi``: per row one address every 128 bytes
        plus one more (a row need not start on a line), the lanes of the warp taking the
        (row, line) pairs in turn."""
        step = 128 // es
        per = self.bn // step + 1
        for k in cutlass.range_constexpr((self.bm * per + 31) // 32):
            idx = k * 32 + lane
            i = idx // per
            p = row_off + i
            if (p >= 0) & (p < lim) & (i < self.bm):
                j = cutlass.min(n0 + (idx - i * per) * step, j_hi)
                hc.prefetch_l2(elem_ptr(mX, (p, j)).toint())

    @cute.jit
    def _rab_ok(self, rab, n0, e):
        """Whether accumulator value ``e`` (key ``n0 + key``, bias row ``p``) has a bias:
        ``0 <= p < lim`` and ``key < lim``."""
        p = rab.row_off + rab.tSc[e][1]
        return (p >= 0) & (p < rab.lim) & (n0 + rab.tSc[e][0] < rab.lim)

    @cute.jit
    def _biased_h(self, s, alpha_half, rB, rab, n0, e):
        """``h = (alpha s + rab) / 2`` of accumulator value ``e`` (a select: the bias is 0
        where :meth:`_rab_ok` is false, whatever the clamped load read; with ``rab_fast``
        :meth:`_rab_load` has zeroed those values already, so no select)."""
        bias = rB[e].to(Float32) * Float32(0.5)
        if cutlass.const_expr(self.rab_fast):
            # (_rab_load zeroed the values without a bias)
            return s * alpha_half + bias
        return s * alpha_half + (bias if self._rab_ok(rab, n0, e) else Float32(0.0))

    @cute.jit
    def _store_drab(self, g, rab, n0):
        """d rab of this thread's values ``g`` (masked ones 0) at the elements that have a
        bias: direct stores (one writer per element: ``drab_per_head``), else fp32
        ``red.add`` (the heads of ``H_rab = 1`` add into one workspace)."""
        mdRab = rab.drab
        tSc = rab.tSc
        row_off = rab.row_off
        lim = rab.lim
        if cutlass.const_expr(self.drab_per_head):
            if cutlass.const_expr(self.rab_fast):
                if self._rab_inside(rab, n0):
                    tSd = self._rab_tile(mdRab, rab, n0)
                    for e in cutlass.range_constexpr(cute.size(g)):
                        tSd[e] = g[e].to(mdRab.element_type)
                else:
                    self._store_drab_checked(g, mdRab, tSc, row_off, lim, n0)
            else:
                self._store_drab_checked(g, mdRab, tSc, row_off, lim, n0)
        elif cutlass.const_expr(self.rab_fast):
            if self._rab_inside(rab, n0):
                if cutlass.const_expr(self.drab_scalar):
                    tSd = self._rab_tile(mdRab, rab, n0)
                    for e in cutlass.range_constexpr(cute.size(g)):
                        hc.red_add_f32(elem_ptr(tSd, e), g[e])
                else:
                    self._red_drab_v4(g, mdRab, tSc, row_off, lim, n0, True)
            else:
                self._red_drab_v4(g, mdRab, tSc, row_off, lim, n0, False)
        else:
            self._red_drab_v4(g, mdRab, tSc, row_off, lim, n0, False)

    @cute.jit
    def _store_drab_checked(self, g, mdRab, tSc, row_off, lim, n0):
        """d rab stores of the values that have a bias (one writer per element)."""
        for e in cutlass.range_constexpr(cute.size(g)):
            p = row_off + tSc[e][1]
            j = n0 + tSc[e][0]
            if (p >= 0) & (p < lim) & (j < lim):
                mdRab[p, j] = g[e].to(mdRab.element_type)

    @cute.jit
    def _red_drab_v4(self, g, mdRab, tSc, row_off, lim, n0, inside: cutlass.Constexpr):
        """``d rab += g`` into the shared fp32 workspace (``H_rab = 1``; rows of ``N_k_pad``, a
        multiple of 4, 16-byte aligned) with one 16-byte ``red.add`` per four values.

        In the wgmma accumulator layout lane ``l`` of a warp holds key rows ``l / 4`` and
        ``l / 4 + 8`` and query columns ``2 (l % 4) + 8 i + {0, 1}``, so the lanes ``l``, ``l ^
        4``, ``l ^ 8``, ``l ^ 12`` (``q = (l / 4) % 4``) hold four consecutive keys of the same
        columns. For each group of four columns (values ``8 t + 2 r + {0, 1, 4, 5}``) the four
        lanes transpose their 4 x 4 block with two butterfly rounds (lane distances 8, then 4;
        two shuffles each): lane ``q`` then holds the four keys of column ``q``, contiguous in
        d rab's row ``p``. Values without a bias (``p`` or the key outside ``[0, lim)``) are
        zeroed before the exchange, so the four-key add is exact where a key of the four lies
        past ``lim`` (it adds 0 inside the padded row); the add is skipped where ``p`` is
        outside ``[0, lim)`` or the first key is at ``lim`` or later. ``inside``: the step's
        tile lies inside the bias (:meth:`_rab_inside`), so no value is zeroed or skipped."""
        q = (cute.arch.lane_idx() >> 2) & 3
        odd1 = (q & 2) != 0
        odd0 = (q & 1) != 0
        for r in cutlass.range_constexpr(2):
            for t in cutlass.range_constexpr(cute.size(g) // 8):
                es = (8 * t + 2 * r, 8 * t + 2 * r + 1, 8 * t + 2 * r + 4, 8 * t + 2 * r + 5)
                a = cute.make_rmem_tensor((4,), Float32)
                for k in cutlass.range_constexpr(4):
                    e = es[k]
                    if cutlass.const_expr(inside):
                        a[k] = g[e]
                    else:
                        p = row_off + tSc[e][1]
                        ok = (p >= 0) & (p < lim) & (n0 + tSc[e][0] < lim)
                        a[k] = g[e] if ok else Float32(0.0)
                # lanes q, q ^ 2 (lane distance 8) swap their off-diagonal 2 x 2 blocks, then
                # lanes q, q ^ 1 (distance 4) the off-diagonal values of each 2 x 2 block
                for pairs, dist, odd in ((((0, 2), (1, 3)), 8, odd1),
                                         (((0, 1), (2, 3)), 4, odd0)):
                    for lo, hi in pairs:
                        x = cute.arch.shuffle_sync_bfly(a[lo] if odd else a[hi], offset=dist)
                        if odd:
                            a[lo] = x
                        else:
                            a[hi] = x
                # this lane's column es[q] and the first of its four keys
                if cutlass.const_expr(inside):
                    # (values e, e + 1, e + 4, e + 5: columns c, c + 1, c + 8, c + 9)
                    p = row_off + tSc[es[0]][1] + (q & 1) + ((q >> 1) << 3)
                    j0 = n0 + tSc[es[0]][0] - q
                    hc.red_add_v4_f32_at(elem_ptr(mdRab, (p, j0)).toint(), a[0], a[1], a[2],
                                         a[3])
                else:
                    col = tSc[es[0]][1]
                    if q == 1:
                        col = tSc[es[1]][1]
                    if q == 2:
                        col = tSc[es[2]][1]
                    if q == 3:
                        col = tSc[es[3]][1]
                    p = row_off + col
                    j0 = n0 + tSc[es[0]][0] - q
                    if (p >= 0) & (p < lim) & (j0 < lim):
                        hc.red_add_v4_f32_at(elem_ptr(mdRab, (p, j0)).toint(), a[0], a[1],
                                             a[2], a[3])

    @cute.jit
    def _step(self, skip: cutlass.Constexpr, ctx, c, m_block, full, head, mma_s, mma_dq,
              q_ready, q_stg):
        """One query tile of a consumer warpgroup's walk (Q / dO stage of step ``c``): the
        score GEMMs and function, dV, dS^T to shared memory, dQ and dK, the dQ reduction, the
        stage's release. ``skip``: this warpgroup's keys are hidden from the whole tile (see
        :meth:`_wg_hidden`): no S^T, dP^T, dV or dK GEMM and no score function; zeros as its
        half of dS^T, its half of dQ = dS K as usual. Both variants end with no wgmma in
        flight, so the caller's branch between them leaves the full step's code as it is
        without one. ``ctx``: the walk's loop-invariant values. ``q_ready`` / ``q_stg``
        (``q_probe``): whether the previous step found this step's stage full, and its
        index. Returns ``(mma_s, mma_dq, q_ready, q_stg)`` (rebound by the caller), the last
        two for the next step."""
        a_vals = ctx.a_vals
        acc_dK = ctx.acc_dK
        acc_dV = ctx.acc_dV
        alpha_half = ctx.alpha_half
        batch = ctx.batch
        bm = ctx.bm
        ctid = ctx.ctid
        d = ctx.d
        dq_gcol = ctx.dq_gcol
        dq_grow = ctx.dq_grow
        dq_sptr = ctx.dq_sptr
        ds_scale = ctx.ds_scale
        half_ds = ctx.half_ds
        lane = ctx.lane
        left = ctx.left
        mFunc = ctx.mFunc
        mQStart = ctx.mQStart
        mask = ctx.mask
        mdQacc = ctx.mdQacc
        mma_kv = ctx.mma_kv
        n0 = ctx.n0
        pipe_q = ctx.pipe_q
        r2s_dS = ctx.r2s_dS
        right = ctx.right
        s_shape = ctx.s_shape
        seq = ctx.seq
        st = ctx.st
        tKrQ = ctx.tKrQ
        tKrdS = ctx.tKrdS
        tPsP = ctx.tPsP
        tQrK = ctx.tQrK
        tQrdS = ctx.tQrdS
        tSrK = ctx.tSrK
        tSrQ = ctx.tSrQ
        tSrV = ctx.tSrV
        tSrdO = ctx.tSrdO
        tVrP = ctx.tVrP
        tVrdO = ctx.tVrdO
        tdQc = ctx.tdQc
        tdQs = ctx.tdQs
        tdSsdS = ctx.tdSsdS
        thr_dq = ctx.thr_dq
        thr_s = ctx.thr_s
        warp = ctx.warp
        m0 = m_block * bm
        s = q_stg if self.q_probe else pipe_q.stage(c)
        buf = c % 2
        acc_S = thr_s.make_fragment_C(s_shape)
        acc_dP = thr_s.make_fragment_C(s_shape)
        if cutlass.const_expr(self.split_d):
            tP = cute.make_rmem_tensor(acc_S.layout, self.dtype)
            tP_acc = tP
            tdS = cute.make_rmem_tensor(acc_dP.layout, self.dtype)
            tdS_acc = tdS
        else:
            tP = cute.make_rmem_tensor(
                acc_layout_as_a(acc_S.layout, a_vals), self.dtype)
            tP_acc = cute.make_tensor(tP.iterator, acc_S.layout)
            tdS = cute.make_rmem_tensor(
                acc_layout_as_a(acc_dP.layout, a_vals), self.dtype)
            tdS_acc = cute.make_tensor(tdS.iterator, acc_dP.layout)
        if cutlass.const_expr(self.q_probe):
            if q_ready == 0:
                pipe_q.consumer_wait(c)
        else:
            pipe_q.consumer_wait(c)
        if cutlass.const_expr(skip):
            # this warpgroup's keys are hidden from the whole tile: its
            # half of dS^T is zero, dV and dK get nothing
            acc_dP.fill(0.0)
            tdS_acc.store(acc_dP.load().to(self.dtype))
        else:
            rab = None
            if cutlass.const_expr(self.has_rab):
                rab = _StepCtx(ctx=ctx.rab, head=head, batch=batch, thr_s=thr_s)
            mma_s = self._scores(mma_s, acc_S, acc_dP, tSrK, tSrV, tSrQ,
                                 tSrdO, s, c, tP, tP_acc, tdS_acc,
                                 alpha_half, half_ds, ds_scale, full,
                                 mask, n0, m0, seq, left, right, mFunc,
                                 pipe_q, rab)

        # dS^T -> smem buffer `buf` (stmatrix: rows of 8 consecutive queries)
        cute.copy(r2s_dS, r2s_dS.retile(tdS_acc), tdSsdS[None, None, None, buf])

        if cutlass.const_expr(self.split_d):
            # P^T -> smem; both warpgroups' halves of P^T and dS^T are
            # published, then dV += P^T dO (smem x smem)
            cute.copy(r2s_dS, r2s_dS.retile(tP_acc),
                      tPsP[None, None, None, buf])
            cute.arch.fence_proxy("async.shared", space="cta")
            cute.arch.barrier(barrier_id=1, number_of_threads=256)
            kvb.issue_dv(mma_kv, acc_dV, tVrP[None, None, None, buf], tVrdO,
                         s)
            tdS_a = tKrdS[None, None, None, buf]
        else:
            # dV += P^T dO (registers x smem) while the dS^T halves are
            # published
            if cutlass.const_expr(not skip):
                kvb.issue_dv(mma_kv, acc_dV, tP, tVrdO, s)
            # both warpgroups' dS^T halves are in smem (generic -> async)
            cute.arch.fence_proxy("async.shared", space="cta")
            cute.arch.barrier(barrier_id=1, number_of_threads=256)
            tdS_a = tdS
        # dQ = dS K, then dK += dS^T Q (its own group: the dQ reductions below
        # are issued while it runs)
        acc_dQ = thr_dq.make_fragment_C(thr_dq.partition_shape_C((bm, d)))
        if cutlass.const_expr(skip):
            mma_dq = kvb.issue_dq(mma_dq, acc_dQ, tQrdS, tQrK, buf)
            warpgroup.wait_group(0)
        else:
            mma_dq = kvb.issue_dq_dk(mma_dq, mma_kv, acc_dQ, acc_dK, tQrdS,
                                     tQrK, tdS_a, tKrQ, buf, s)
            warpgroup.wait_group(1)

        lim = seq.seqlen_q - m0
        if cutlass.const_expr(self.deterministic and not self.dq_tile
                              and not self.dq_alias):
            # warp 1: the earlier KV tiles' additions to this tile are done
            cute.arch.barrier(barrier_id=2, number_of_threads=288)
        if cutlass.const_expr(self.dq_alias):
            # D = 256: stage this step's slices in its Q and dO tiles once
            # both warpgroups' GEMMs (dK reads Q) have read them; the
            # warp's rows 16 w .., its warpgroup's 128 columns = blocks
            # 4 (2 wg + i) + w, i < 2
            a_lane = cute.arch.lane_idx()
            a_w = (warp - 4) % 4
            a_cg0 = 2 * ((warp - 4) // 4)
            warpgroup.wait_group(0)
            cute.arch.barrier(barrier_id=4, number_of_threads=256)
            if cutlass.const_expr(self.writer):
                # warp 1 has read the previous step's staged slices (so
                # its barrier 2 of that step has completed)
                if c > 0:
                    cute.arch.barrier(barrier_id=5, number_of_threads=288)
            a_q, a_do = kvb.stage_as_f32(st, s, bm, d)
            stage_warp_slice(acc_dQ, a_q, a_lane, a_w, a_cg0, 4, 64,
                             sbase2=a_do, half=self.dq_blocks // 2)
            cute.arch.fence_proxy("async.shared", space="cta")
            cute.arch.sync_warp()
            if cutlass.const_expr(self.writer):
                # warp 1 adds the staged slices and releases the stage
                cute.arch.barrier_arrive(barrier_id=2, number_of_threads=288)
            else:
                if cutlass.const_expr(self.deterministic):
                    # warp 1: the earlier KV tiles' additions are done
                    cute.arch.barrier(barrier_id=2, number_of_threads=288)
                if a_lane == 0:
                    bulk_add_warp_slice(
                        elem_ptr(mdQacc, (Int32(mQStart[batch]) + m_block,
                                          head, 0)),
                        a_q, a_w, a_cg0, 2, 4, 64, sbase2=a_do,
                        half=self.dq_blocks // 2)
                    cute.arch.cp_async_bulk_commit_group()
                    # deterministic: complete before warp 1 publishes;
                    # else read before the stage goes back to the
                    # producer
                    cute.arch.cp_async_bulk_wait_group(
                        0, read=not self.deterministic)
                cute.arch.sync_warp()
                if cutlass.const_expr(self.deterministic):
                    cute.arch.barrier_arrive(barrier_id=3,
                                             number_of_threads=288)
        elif cutlass.const_expr(self.dq_tile):
            # consumer warp i (0..7) owns floats [1024 i, 1024 i + 1024)
            # of the tile: its lane l stores values 4 k .. 4 k + 3 at
            # float 4 (32 k + l)
            t_lane = cute.arch.lane_idx()
            t_chunk = warp - 4
            t_sbase = st.sdQ.data_ptr() + t_chunk * 1024
            t_sptr = t_sbase + t_lane * 4
            if cutlass.const_expr(self.wg_hand):
                # warp 1 is done with this warpgroup's half of the
                # previous tile's staged dQ
                if c > 0:
                    kvb.wg_bar((warp - 4) // 4, 5, 10, False)
            elif cutlass.const_expr(self.writer):
                # warp 1 is done with the previous tile's staged dQ
                if c > 0:
                    cute.arch.barrier(barrier_id=5, number_of_threads=288)
            else:
                # the previous tile's bulk read of this warp's slice is
                # done
                if t_lane == 0:
                    cute.arch.cp_async_bulk_wait_group(0, read=True)
                cute.arch.sync_warp()
            for k4 in cutlass.range_constexpr(cute.size(acc_dQ) // 4):
                hc.st_shared_v4_f32(t_sptr + 128 * k4, acc_dQ[4 * k4],
                                    acc_dQ[4 * k4 + 1], acc_dQ[4 * k4 + 2],
                                    acc_dQ[4 * k4 + 3])
            if cutlass.const_expr(self.q_probe):
                # the next step's stage, tested while the stores drain
                q_stg = pipe_q.stage(c + 1)
                q_ready = Int32(pipe_q.consumer_test(c + 1))
            cute.arch.fence_proxy("async.shared", space="cta")
            cute.arch.sync_warp()
            if cutlass.const_expr(self.wg_hand):
                # this warpgroup's half is staged: warp 1 adds it
                kvb.wg_bar((warp - 4) // 4, 2, 11, True)
            elif cutlass.const_expr(self.writer):
                # warp 1 waits for its turn and adds the staged tile
                cute.arch.barrier_arrive(barrier_id=2, number_of_threads=288)
            elif cutlass.const_expr(self.deterministic):
                # warp 1: the earlier KV tiles' additions are done
                cute.arch.barrier(barrier_id=2, number_of_threads=288)
            if cutlass.const_expr(not self.writer):
                if t_lane == 0:
                    # all rows of the tile: rows past L_q hold zeros
                    # (zero Q / dO rows) and their slot rows are never
                    # read
                    bulk_reduce_add_f32(
                        elem_ptr(mdQacc, (Int32(mQStart[batch]) + m_block,
                                          head, t_chunk * 1024)),
                        t_sbase, 4096)
                    cute.arch.cp_async_bulk_commit_group()
                    if cutlass.const_expr(self.deterministic):
                        # the addition is complete before warp 1
                        # publishes
                        cute.arch.cp_async_bulk_wait_group(0, read=False)
                if cutlass.const_expr(self.deterministic):
                    cute.arch.sync_warp()
                    cute.arch.barrier_arrive(barrier_id=3,
                                             number_of_threads=288)
        elif cutlass.const_expr(self.dq_bulk):
            # the previous tile's bulk reads of this warp's rows are done
            cute.arch.cp_async_bulk_wait_group(0, read=True)
            cute.arch.sync_warp()
            cute.autovec_copy(acc_dQ, tdQs)
            cute.arch.fence_proxy("async.shared", space="cta")
            cute.arch.sync_warp()
            if lane < 16:
                if dq_grow < lim:
                    bulk_reduce_add_f32(
                        elem_ptr(mdQacc, (seq.q_start + m0 + dq_grow, head,
                                          dq_gcol)),
                        dq_sptr, 64 * 4)
            cute.arch.cp_async_bulk_commit_group()
        else:
            # dQ rows < L_q -> fp32 workspace (values 2k, 2k+1: adjacent
            # columns)
            gdQ = cute.local_tile(
                offset_rows(mdQacc[None, head, None], seq.q_start), (bm, d),
                (m_block, 0))
            tdQg = thr_dq.partition_C(gdQ)
            if cutlass.const_expr(self.dq_vec4):
                kvb.red_add_rows_v4(acc_dQ, tdQg, tdQc, lim)
            else:
                kvb.red_add_rows(acc_dQ, tdQg, tdQc, lim)
            if cutlass.const_expr(self.deterministic):
                cute.arch.barrier_arrive(barrier_id=3, number_of_threads=288)
        warpgroup.wait_group(0)
        if cutlass.const_expr(not self.split_d):
            kvb.keep_regs(tP, tdS)
        if cutlass.const_expr(not (self.writer and self.dq_alias)):
            # (the writer with dq_alias: warp 1 releases the stage that
            # holds the staged dQ slices)
            pipe_q.consumer_release(c)
        return mma_s, mma_dq, q_ready, q_stg

    @cute.jit
    def _wg_hidden(self, wg, n0, m0, seq, left, right):
        """Whether the mask hides keys ``[n0 + 64 wg, n0 + 64 wg + 64)`` from every query row
        ``[m0, m0 + bm)`` (window masks: key ``j`` is seen by row ``i`` when ``i + off - left
        <= j <= i + off + right``, an end unbounded where negative), or they all lie past
        ``L_k``; with a func mask only the latter."""
        k_lo = n0 + 64 * wg
        hidden = k_lo >= seq.seqlen_k
        if cutlass.const_expr(not self.has_func):
            if right >= 0:
                hidden = hidden | (k_lo > m0 + (self.bm - 1) + seq.off + right)
            if left >= 0:
                hidden = hidden | (k_lo + 63 < m0 + seq.off - left)
        return hidden

    @cute.jit
    def _fence_rows(self):
        """Complete this warp's cp.async copies and zero-fill stores and make them visible
        to the async proxy (wgmma)."""
        cute.arch.cp_async_commit_group()
        cute.arch.cp_async_wait_group(0)
        cute.arch.fence_proxy("async.shared", space="cta")
        cute.arch.sync_warp()

    @cute.jit
    def _dq_tile_out(self, st, pipe_q, c, gtile, store: cutlass.Constexpr):
        """Lane 0 of the writer warp: the staged dQ tile of step ``c`` to the workspace tile
        at ``gtile`` with bulk reduce-adds, or (``store``) bulk stores; the caller commits
        the bulk group. The staging tile: 8 blocks of 4 KB; ``dq_alias``: each consumer
        warp's two 16 x 64 blocks in the step's Q / dO stage."""
        bm, d = self.bm, self.d
        if cutlass.const_expr(self.dq_alias):
            a_q, a_do = kvb.stage_as_f32(st, pipe_q.stage(c), bm, d)
            for wi in cutlass.range_constexpr(8):
                # consumer warp wi: rows 16 (wi % 4) .., warpgroup wi // 4's 128 columns
                bulk_add_warp_slice(gtile, a_q, wi % 4, 2 * (wi // 4), 2, 4, 64, sbase2=a_do,
                                    half=self.dq_blocks // 2, store=store)
        else:
            sdQ = st.sdQ.data_ptr()
            for chunk in cutlass.range_constexpr(8):
                if cutlass.const_expr(store):
                    bulk_copy_f32(gtile + chunk * 1024, sdQ + chunk * 1024, 4096)
                else:
                    bulk_reduce_add_f32(gtile + chunk * 1024, sdQ + chunk * 1024, 4096)

    @cute.jit
    def _convert_dq(self, st, ctid, batch, head_kv, group, seq, mQStart, mdQacc, mdQSem,
                    mdQout, mCnt):
        """Consumer threads (``ctid`` 0..255), after the epilogue: count this CTA as finished
        for (``batch``, ``head_kv``); the last of the sequence's KV tiles writes the
        sequence's dq rows of every query head of the group in the input dtype from the
        workspace, as ``kernels/hstu_dq_tiles.py`` does (``dq_claim``: tiles nobody claimed
        as zeros), when the sequence has at most ``convert_rows`` queries."""
        bm, bn, d = self.bm, self.bn, self.d
        # this CTA's dQ additions are complete (each consumer warp waited for its own bulk
        # groups after the step loop; the writer warp waits for its own and arrives)
        nthr = 288 if cutlass.const_expr(self.writer) else 256
        cute.arch.barrier(barrier_id=6, number_of_threads=nthr)
        flag = cute.make_ptr(Int32, st.sdQ.data_ptr().toint(), cute.AddressSpace.smem,
                             assumed_align=16)
        if ctid == 0:
            st_shared_s32(flag, atom_add_acq_rel_s32(elem_ptr(mCnt, (batch, head_kv)), 1))
        cute.arch.barrier(barrier_id=7, number_of_threads=256)
        done = ld_shared_s32(flag)
        n_kv = (seq.seqlen_k + bn - 1) // bn
        if done == n_kv - 1:
            if seq.seqlen_q <= self.convert_rows:
                # (the acquire: thread 0's fence after its atomic, then the CTA barrier)
                sbase = cute.make_ptr(self.dtype, st.sdQ.data_ptr().toint(),
                                      cute.AddressSpace.smem, assumed_align=16)
                qt0 = Int32(mQStart[batch])
                n_t = (seq.seqlen_q + bm - 1) // bm
                for g in cutlass.range(group, unroll=1):
                    head = head_kv * group + g
                    for t in cutlass.range(n_t, unroll=1):
                        v = tile_load(elem_ptr(mdQacc, (qt0 + t, head, 0)), ctid, 64)
                        if cutlass.const_expr(self.dq_claim):
                            if mdQSem[qt0 + t, head, 0] == 0:
                                v.fill(0.0)  # nobody claimed (covered) this tile
                        # the previous tile's shared rows (or the flag) are read
                        cute.arch.barrier(barrier_id=7, number_of_threads=256)
                        tile_to_smem(v, sbase, ctid, bm, d, 64, self.dtype)
                        cute.arch.barrier(barrier_id=7, number_of_threads=256)
                        smem_rows_to_gmem(sbase, ctid, 256, mdQout[None, head, None],
                                          seq.q_start + t * bm, seq.seqlen_q - t * bm, bm, d,
                                          self.dtype)

    @cute.jit
    def _dq_order_warp(self, mCuQ, mCuK, mKVTile, mQStart, mQTiles, mdQSem, slot, head_kv,
                       batch, left, right, group, mdQacc, st, pipe_q):
        """Warp 1 in deterministic mode or with ``dq_writer``, over the consumers' steps in
        their order (the query heads of the group, then the visible query tiles).

        Deterministic: per query tile, wait for the previous KV tile's additions, let the
        consumers add (barrier 2), wait for their additions (barrier 3) and publish this KV
        tile's (see the module docstring). With ``det_writer`` or ``dq_writer`` (the writer):
        (deterministic: wait for the previous KV tile's additions,) wait until the consumers
        have staged the step's dQ (barrier 2, the consumers arrive), add the staged tile
        (the staging tile: 8 bulk reduce-adds of 4 KB into ``mdQacc``; ``dq_alias``: each
        consumer warp's two 16 x 64 blocks in the step's Q / dO stage), and once the
        additions have read it hand the staging buffer back: with ``dq_alias`` the stage to
        the producer (one arrival per consumer warp on its empty barrier), and to the
        consumers (barrier 5: they sync on it before they stage their next step);
        deterministic: publish once the additions are complete."""
        bm, bn, d = self.bm, self.bn, self.d
        lane = cute.arch.lane_idx()
        n_block = Int32(mKVTile[slot, 1])
        seq = SeqlenInfo.create(batch, mCuQ, mCuK)
        n0 = n_block * bn
        qr = QTileRange.create(mQStart, batch, n0, seq.seqlen_q, seq.seqlen_k, seq.off,
                               left, right, bm, bn, self.has_func)
        qp = None
        if cutlass.const_expr(self.deterministic):
            # the previous KV tile of this sequence (n_block > 0)
            qp = QTileRange.create(mQStart, batch, n0 - bn, seq.seqlen_q, seq.seqlen_k,
                                   seq.off, left, right, bm, bn, self.has_func)
        qt0 = Int32(mQStart[batch])
        c = Int32(0)
        for g in cutlass.range(group, unroll=1):
            head = head_kv * group + g
            for it in cutlass.range(qr.m_count, unroll=1):
                m_block = qr.m_block(it, self.deterministic)
                active, full = qr.tile_state(mQTiles, m_block, left, right)
                if active != 0:
                    sem = None
                    # (det_store) no earlier KV tile covers this query tile, (dq_claim) this
                    # KV tile claimed the query tile first: lane 0 stores
                    first = Int32(1)
                    if cutlass.const_expr(self.deterministic):
                        sem = elem_ptr(mdQSem, (qt0 + m_block, head))
                        if lane == 0:
                            if n_block > 0:
                                if qp.covers(mQTiles, m_block, left, right) != 0:
                                    first = Int32(0)
                                    hc.wait_at_least(sem, n_block)
                                    if cutlass.const_expr(self.det_store):
                                        # the acquired stores, before this thread's
                                        # async-proxy additions to the same addresses
                                        cute.arch.fence_proxy("async.global")
                        cute.arch.sync_warp()
                    if cutlass.const_expr(self.wg_hand):
                        # each warpgroup's half: staged and fenced (barrier 2 / 11), added,
                        # handed back once the additions have read it (barrier 5 / 10)
                        gtile = elem_ptr(mdQacc, (qt0 + m_block, head, 0))
                        sdQ = st.sdQ.data_ptr()

                        def add_half(w, gtile=gtile, sdQ=sdQ):
                            # warpgroup w's four consumer warps' 4 KB chunks
                            for chunk in range(4 * w, 4 * w + 4):
                                bulk_reduce_add_f32(gtile + chunk * 1024, sdQ + chunk * 1024,
                                                    4096)

                        kvb.writer_take_halves(lane, add_half)
                        c += 1
                    elif cutlass.const_expr(self.writer):
                        # every consumer warp's slice of the step is staged and fenced
                        cute.arch.barrier(barrier_id=2, number_of_threads=288)
                        if lane == 0:
                            gtile = elem_ptr(mdQacc, (qt0 + m_block, head, 0))
                            if cutlass.const_expr(self.dq_claim):
                                if atom_add_s32(elem_ptr(mdQSem, (qt0 + m_block, head, 0)),
                                                1) != 0:
                                    first = Int32(0)
                                    # the first claimer's store is complete
                                    hc.wait_at_least(
                                        elem_ptr(mdQSem, (qt0 + m_block, head, 1)), 1)
                                    cute.arch.fence_proxy("async.global")
                            if cutlass.const_expr(self.det_store or self.dq_claim):
                                if first != 0:
                                    self._dq_tile_out(st, pipe_q, c, gtile, True)
                                else:
                                    self._dq_tile_out(st, pipe_q, c, gtile, False)
                            else:
                                self._dq_tile_out(st, pipe_q, c, gtile, False)
                            cute.arch.cp_async_bulk_commit_group()
                            cute.arch.cp_async_bulk_wait_group(0, read=True)
                        cute.arch.sync_warp()
                        if cutlass.const_expr(self.dq_alias):
                            # the stage goes back to the producer (the consumers did not
                            # release it): one arrival per consumer warp
                            with cute.arch.elect_one():
                                for _ in cutlass.range_constexpr(8):
                                    cute.arch.mbarrier_arrive(pipe_q.empty + pipe_q.stage(c))
                        # the staged tile is read: its buffer is free again
                        cute.arch.barrier_arrive(barrier_id=5, number_of_threads=288)
                        if cutlass.const_expr(self.deterministic):
                            if lane == 0:
                                # complete (not only read) before the publication
                                cute.arch.cp_async_bulk_wait_group(0, read=False)
                                hc.st_release_s32(sem, n_block + 1)
                            cute.arch.sync_warp()
                        if cutlass.const_expr(self.dq_claim):
                            if lane == 0:
                                if first != 0:
                                    # the store complete (not only read) before the
                                    # publication
                                    cute.arch.cp_async_bulk_wait_group(0, read=False)
                                    hc.st_release_s32(
                                        elem_ptr(mdQSem, (qt0 + m_block, head, 1)), 1)
                            cute.arch.sync_warp()
                        c += 1
                    else:
                        cute.arch.barrier_arrive(barrier_id=2, number_of_threads=288)
                        cute.arch.barrier(barrier_id=3, number_of_threads=288)
                        if lane == 0:
                            hc.st_release_s32(sem, n_block + 1)
                        cute.arch.sync_warp()
        if cutlass.const_expr(self.convert_rows > 0):
            # every addition complete before the consumers count this CTA as finished
            if lane == 0:
                cute.arch.cp_async_bulk_wait_group(0, read=False)
            cute.arch.sync_warp()
            cute.arch.barrier_arrive(barrier_id=6, number_of_threads=288)

    @cute.kernel
    def kernel(self, tma_q, tma_tQ, tma_do, tma_tdO, tma_k, tma_tK, tma_v, tma_tV,
               mQ, mdO, mK, mV, mCuQ, mCuK, mKVTile, mQStart, mQTiles, mFunc, mScal, mWin,
               mdQacc, mdK, mdV, mdQSem, mdQout, mCnt, mRab, mdRab, sK_layout, sK_mn_layout,
               sQ_layout, sQ_mn_layout, sdS_layout, sdS_k_layout, mma_s, mma_kv, mma_dq,
               Smem: cutlass.Constexpr):
        tidx, _, _ = cute.arch.thread_idx()
        head_kv, slot, _ = cute.arch.block_idx()
        if cutlass.const_expr(self.head_major):
            slot, head_kv, _ = cute.arch.block_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg_idx = warp // 4
        bm, bn, d = self.bm, self.bn, self.d
        # GQA/MQA: this CTA owns KV head head_kv and walks its group of query heads (the
        # deterministic mode takes no GQA: the public layer routes it to the reference)
        group = mQ.shape[1] // mK.shape[1]

        smem = cutlass.memory.SmemAllocator()
        st = smem.allocate(Smem)
        mbar = st.mbar.data_ptr()
        pipe_q = SmemPipeline(mbar, self.q_stages, 8)
        pipe_kv = SmemPipeline(mbar + SmemPipeline.num_barriers(self.q_stages), 1, 8)
        if warp == 0:
            pipe_q.init()
            pipe_kv.init()
            cpasync.prefetch_descriptor(tma_q)
            cpasync.prefetch_descriptor(tma_do)
            cpasync.prefetch_descriptor(tma_k)
            cpasync.prefetch_descriptor(tma_v)
        cute.arch.mbarrier_init_fence()
        cute.arch.barrier()
        if cutlass.const_expr(self.pdl):
            # programmatic dependent launch: wait for the previous grid (see attn_fwd_sm90_ws)
            cute.arch.griddepcontrol_wait()

        # (bn, D, 1), (bm, D, stages), (bm, bn, 2); MN-major aliases (D, bn, 1), (D, bm, stages)
        sK, sV, sQ, sdO, sdS, sK_mn, sQ_mn, sdO_mn = kvb.smem_views(
            st, sK_layout, sK_mn_layout, sQ_layout, sQ_mn_layout, sdS_layout)

        batch = Int32(mKVTile[slot, 0])
        left = Int32(mWin[0])
        right = Int32(mWin[1])

        if wg_idx == 0:
            # ================================ producer ================================
            cute.arch.setmaxregister_decrease(self.regs_producer)
            if warp == 0:
                if batch >= 0:
                    lane = cute.arch.lane_idx()
                    n_block = Int32(mKVTile[slot, 1])
                    seq = SeqlenInfo.create(batch, mCuQ, mCuK)
                    n0 = n_block * bn
                    qr = QTileRange.create(mQStart, batch, n0, seq.seqlen_q, seq.seqlen_k,
                                           seq.off, left, right, bm, bn, self.has_func)
                    kv_left = seq.seqlen_k - n0
                    if kv_left >= bn:
                        kv_bytes = cute.size_in_bytes(self.dtype, cute.slice_(sK_layout, (None, None, 0)))
                        pipe_kv.producer_expect_tx(0, 2 * kv_bytes)
                        tKs, tKg = self._tma_tiles(tma_k, tma_tK, head_kv, seq.k_start, bn, sK)
                        cute.copy(tma_k, tKg[None, n_block], tKs[None, 0],
                                  tma_bar_ptr=pipe_kv.full_ptr(0))
                        tVs, tVg = self._tma_tiles(tma_v, tma_tV, head_kv, seq.k_start, bn, sV)
                        cute.copy(tma_v, tVg[None, n_block], tVs[None, 0],
                                  tma_bar_ptr=pipe_kv.full_ptr(0))
                    else:
                        self._load_rows(mK, head_kv, seq.k_start, n_block, bn, kv_left,
                                        sK[None, None, 0], lane)
                        self._load_rows(mV, head_kv, seq.k_start, n_block, bn, kv_left,
                                        sV[None, None, 0], lane)
                        self._fence_rows()
                        pipe_kv.producer_arrive(0)

                    q_bytes = cute.size_in_bytes(self.dtype, cute.slice_(sQ_layout, (None, None, 0)))
                    c = Int32(0)
                    for g in cutlass.range(group, unroll=1):
                        head = head_kv * group + g
                        tQs, tQg = self._tma_tiles(tma_q, tma_tQ, head, seq.q_start, bm, sQ)
                        tdOs, tdOg = self._tma_tiles(tma_do, tma_tdO, head, seq.q_start, bm, sdO)
                        for it in cutlass.range(qr.m_count, unroll=1):
                            m_block = qr.m_block(it, self.deterministic)
                            active, full = qr.tile_state(mQTiles, m_block, left, right)
                            if cutlass.const_expr(self.rab_pf_ahead):
                                if it == 0:
                                    self._rab_prefetch(mRab, mdRab, batch, head, seq,
                                                       m_block * bm, n0, lane)
                            if active != 0:
                                pipe_q.producer_acquire(c)
                                s = pipe_q.stage(c)
                                q_left = seq.seqlen_q - m_block * bm
                                if q_left >= bm:
                                    pipe_q.producer_expect_tx(c, 2 * q_bytes)
                                    cute.copy(tma_q, tQg[None, m_block], tQs[None, s],
                                              tma_bar_ptr=pipe_q.full_ptr(c))
                                    cute.copy(tma_do, tdOg[None, m_block], tdOs[None, s],
                                              tma_bar_ptr=pipe_q.full_ptr(c))
                                else:
                                    self._load_rows(mQ, head, seq.q_start, m_block, bm, q_left,
                                                    sQ[None, None, s], lane)
                                    self._load_rows(mdO, head, seq.q_start, m_block, bm, q_left,
                                                    sdO[None, None, s], lane)
                                    self._fence_rows()
                                    pipe_q.producer_arrive(c)
                                if cutlass.const_expr((self.rab_prefetch or self.drab_prefetch)
                                                      and not self.rab_pf_ahead):
                                    self._rab_prefetch(mRab, mdRab, batch, head, seq,
                                                       m_block * bm, n0, lane)
                                c += 1
                            if cutlass.const_expr(self.rab_pf_ahead):
                                # the next step's rows (this step's: one step earlier)
                                if it + 1 < qr.m_count:
                                    self._rab_prefetch(
                                        mRab, mdRab, batch, head, seq,
                                        qr.m_block(it + 1, self.deterministic) * bm, n0, lane)
            if cutlass.const_expr(self.deterministic or self.dq_writer):
                if warp == 1:
                    if batch >= 0:
                        self._dq_order_warp(mCuQ, mCuK, mKVTile, mQStart, mQTiles, mdQSem,
                                            slot, head_kv, batch, left, right, group, mdQacc,
                                            st, pipe_q)
        else:
            # ================================ consumers ===============================
            cute.arch.setmaxregister_increase(self.regs_consumer)
            if batch >= 0:
                ctid = tidx - 128
                n_block = Int32(mKVTile[slot, 1])
                seq = SeqlenInfo.create(batch, mCuQ, mCuK)
                n0 = n_block * bn
                qr = QTileRange.create(mQStart, batch, n0, seq.seqlen_q, seq.seqlen_k, seq.off,
                                       left, right, bm, bn, self.has_func)
                alpha_half = Float32(mScal[0])
                inv_scale = Float32(mScal[1])
                half_ds = alpha_half * inv_scale  # (alpha / scaling_seqlen) / 2
                ds_scale = half_ds * 2.0

                ((thr_s, thr_kv, thr_dq), (tSrK, tSrV, tSrQ, tSrdO, tVrdO, tKrQ, tQrdS, tQrK),
                 (acc_dK, acc_dV)) = kv_major_bwd_operands(
                    mma_s, mma_kv, mma_dq, ctid, sK, sV, sQ, sdO, sQ_mn, sdO_mn, sdS, sK_mn,
                    (bn, d), uniform_frags=self.uniform_frags)
                mma_kv.set(warpgroup.Field.ACCUMULATE, True)  # dV, dK accumulate
                tScS = acc_mn_view_wg(thr_s.partition_C(cute.make_identity_tensor((bn, bm))))
                mask = HstuMaskKeyMajor(self.has_func, self.func_n if self.has_func else 1,
                                        tScS)
                tdQc = thr_dq.partition_C(cute.make_identity_tensor((bm, d)))
                # (defined below only where the configuration uses them)
                tdQs = lane = dq_sptr = dq_grow = dq_gcol = None
                tPsP = tVrP = tKrdS = None
                if cutlass.const_expr(self.dq_bulk):
                    # (bm, D) view of the two warpgroups' 64 x 64 staging regions
                    if cutlass.const_expr(self.dq_split_m):
                        dq_lay = cute.make_layout(((64, 2), d), stride=((DQ_STRIDE, 64 * DQ_STRIDE), 1))
                    else:
                        dq_lay = cute.make_layout((bm, (64, 2)), stride=(DQ_STRIDE, (1, 64 * DQ_STRIDE)))
                    tdQs = thr_dq.partition_C(cute.make_tensor(st.sdQ.data_ptr(), dq_lay))
                    wg = ctid // 128
                    lane = ctid % 32
                    # warp i of a warpgroup holds rows 16 i .. 16 i + 15 of its region
                    dq_row = ((ctid % 128) // 32) * 16 + lane
                    dq_sptr = st.sdQ.data_ptr() + wg * (64 * DQ_STRIDE) + dq_row * DQ_STRIDE
                    dq_grow = dq_row + (wg * 64 if cutlass.const_expr(self.dq_split_m) else 0)
                    dq_gcol = 0 if cutlass.const_expr(self.dq_split_m) else wg * 64
                r2s_dS, tdSsdS = kvb.ds_store_copy(mma_s, sdS, bn, bm, 2, self.dtype, ctid)
                if cutlass.const_expr(self.split_d):
                    # P^T tiles (query-major like dS) and the K-major A operands of dV / dK
                    sP = st.sP.get_tensor(sdS_layout.outer, swizzle=sdS_layout.inner)
                    _, tPsP = kvb.ds_store_copy(mma_s, sP, bn, bm, 2, self.dtype, ctid)
                    sP_k = st.sP.get_tensor(sdS_k_layout.outer, swizzle=sdS_k_layout.inner)
                    sdS_k = st.sdS.get_tensor(sdS_k_layout.outer, swizzle=sdS_k_layout.inner)
                    tVrP = thr_kv.make_fragment_A(thr_kv.partition_A(sP_k))
                    tKrdS = thr_kv.make_fragment_A(thr_kv.partition_A(sdS_k))
                a_vals = mma_kv.tv_layout_A.shape[1]
                s_shape = thr_s.partition_shape_C((bn, bm))

                # the walk's loop-invariant values, for _step
                ctx = _StepCtx(a_vals=a_vals, acc_dK=acc_dK, acc_dV=acc_dV, alpha_half=alpha_half,
                               batch=batch, bm=bm, ctid=ctid, d=d, dq_gcol=dq_gcol,
                               dq_grow=dq_grow, dq_sptr=dq_sptr, ds_scale=ds_scale,
                               half_ds=half_ds, lane=lane, left=left, mFunc=mFunc, mQStart=mQStart,
                               mask=mask, mdQacc=mdQacc, mma_kv=mma_kv, n0=n0, pipe_q=pipe_q,
                               r2s_dS=r2s_dS, right=right, s_shape=s_shape, seq=seq, st=st,
                               tKrQ=tKrQ, tKrdS=tKrdS, tPsP=tPsP, tQrK=tQrK, tQrdS=tQrdS,
                               tSrK=tSrK, tSrQ=tSrQ, tSrV=tSrV, tSrdO=tSrdO, tVrP=tVrP,
                               tVrdO=tVrdO, tdQc=tdQc, tdQs=tdQs, tdSsdS=tdSsdS, thr_dq=thr_dq,
                               thr_s=thr_s, warp=warp, rab=None)
                if cutlass.const_expr(self.has_rab):
                    # rab, d rab and g's factor inv_scale / 2 (each step's views: _rab_view)
                    ctx.rab = _StepCtx(mRab=mRab, mdRab=mdRab, half_g=inv_scale * 0.5)
                pipe_kv.consumer_wait(0)
                c = Int32(0)
                # q_probe: whether stage c was found full by the previous step, and its index
                q_ready = Int32(0)
                q_stg = pipe_q.stage(c)
                for g in cutlass.range(group, unroll=1):
                    # the query heads of this KV head, one after the other: dK / dV sum the
                    # group in a fixed order
                    head = head_kv * group + g
                    for it in cutlass.range(qr.m_count, unroll=1):
                        m_block = qr.m_block(it, self.deterministic)
                        active, full = qr.tile_state(mQTiles, m_block, left, right)
                        if active != 0:
                            if cutlass.const_expr(self.wg_skip):
                                if self._wg_hidden(ctid // 128, n0, m_block * bm, seq, left,
                                                   right):
                                    mma_s, mma_dq, q_ready, q_stg = self._step(
                                        True, ctx, c, m_block, full, head, mma_s, mma_dq,
                                        q_ready, q_stg)
                                else:
                                    mma_s, mma_dq, q_ready, q_stg = self._step(
                                        False, ctx, c, m_block, full, head, mma_s, mma_dq,
                                        q_ready, q_stg)
                            else:
                                mma_s, mma_dq, q_ready, q_stg = self._step(
                                    False, ctx, c, m_block, full, head, mma_s, mma_dq,
                                    q_ready, q_stg)
                            c += 1

                if cutlass.const_expr(self.wg_hand):
                    # warp 1's last hand-back of this warpgroup's half
                    if c > 0:
                        kvb.wg_bar(ctid // 128, 5, 10, False)
                elif cutlass.const_expr(self.writer):
                    # warp 1's last hand-back of the staging tile (one per tile)
                    if c > 0:
                        cute.arch.barrier(barrier_id=5, number_of_threads=288)
                if cutlass.const_expr(self.dq_bulk or self.dq_tile or self.dq_alias):
                    cute.arch.cp_async_bulk_wait_group(0, read=False)
                # ---- epilogue: dK, dV / scaling_seqlen -> key rows < L_k ----------------
                if cutlass.const_expr(self.epi_smem):
                    # both warpgroups' last GEMMs (dK read the Q stage, dQ the dS tile) are
                    # done: the Q / dO stages and the dS tiles (contiguous) take the two
                    # (bn, D + 8) staging tiles
                    cute.arch.barrier(barrier_id=1, number_of_threads=256)
                    s_epi = st.sQ.data_ptr()
                    kvb.store_dk_dv_smem(
                        acc_dK, acc_dV, thr_kv, bn, d, s_epi, s_epi + bn * (d + 8), ctid,
                        offset_rows(mdK[None, head_kv, None], seq.k_start + n0),
                        offset_rows(mdV[None, head_kv, None], seq.k_start + n0),
                        seq.seqlen_k - n0, inv_scale, self.dtype)
                else:
                    kvb.store_dk_dv(acc_dK, acc_dV, thr_kv, bn, d,
                                    offset_rows(mdK[None, head_kv, None], seq.k_start + n0),
                                    offset_rows(mdV[None, head_kv, None], seq.k_start + n0),
                                    seq.seqlen_k - n0, inv_scale, self.dtype, self.epi_pairs)
                if cutlass.const_expr(self.convert_rows > 0):
                    self._convert_dq(st, ctid, batch, head_kv, group, seq, mQStart, mdQacc,
                                     mdQSem, mdQout, mCnt)
