"""Block-sparse attention backward for SM90: warp-specialized TMA + wgmma kernel
(``bsa_bwd_impl="sm90ws"``).

Contract and semantics are those of :mod:`bsa_bwd_sm90` (tensor modes ``q, k, v, do, dq_acc,
dk, dv: (B, S, H, D)`` in the caller's physical layout, ``lse`` / ``delta`` fp32 ``(B, H_q,
S_q)``, the K->Q CSR lists ``offsets`` / ``entries`` of ``metadata.build_kq_csr`` with entry
``h_in_group * N_q + m_block``, optional ``block_sizes (B, H_q, N_kv)``); the work split
differs: one CTA per (KV block of ``blk`` keys, KV head, batch), the whole block at once.

CTA = one producer warpgroup + ``blk / 64`` consumer warpgroups (blk 128: 384 threads, one
CTA per SM; blk 64: 256 threads, two CTAs per SM):

* producer (``setmaxnreg`` down to 24 registers; persistent: 40), warp 0: TMA of the block's K and V once
  (rows past ``S_kv`` are zero-filled by the hardware; a block that ``block_sizes`` cuts for
  every query head of the GQA group is copied row by row with cp.async, its other rows
  zero-filled, so no NaN / Inf garbage reaches ``dQ = dS K``), then, for every 64-row query
  tile of every entry of the block's K->Q list (blk 128: two tiles per entry, a tile at or
  past ``S_q`` skipped), the tile's lse and delta (cp.async, +inf / 0 past ``S_q``) and its Q
  and dO tiles (TMA; rows past ``S_q`` zero-filled) into a ``q_stages`` mbarrier ring (the
  most stages that fit: 3 at blk 128 / D 128); each lane's cp.async copies are tracked by the
  stage's full barrier (``cp.async.mbarrier.arrive``), so the producer never waits for them.
* consumers (``setmaxnreg`` up to 240 / 232): warpgroup ``w`` owns keys ``[64 w, 64 w + 64)``
  and keeps their dK, dV in fp32 registers. Key-major products, as in ``bsa_bwd_sm90``::

      S^T = K Q^T,  dP^T = V dO^T                              (wgmma, smem x smem)
      P^T = exp2(S^T scale log2 e - lse log2 e)                (while dP^T runs)
      dS^T = softmax_scale * P^T (dP^T - delta)                 (keys past the block's valid
                                                                count: P^T, dS^T select 0)
      dV += P^T dO,  dK += dS^T Q                               (wgmma, registers x smem)
      dQ  = dS K                                                (wgmma, smem x smem)

  dS^T goes to shared memory with ``stmatrix`` (query-major; double-buffered at blk 128),
  a named barrier publishes both warpgroups' key halves, then dQ (blk 128: the warpgroups
  split the head dim) and dK issue as two wgmma groups. dQ, with ``dq_tile`` (the
  default): each consumer warp stores its accumulator slice in register order to a shared
  staging tile (``dq_tiles.stage_warp_slice``) and one lane adds it to the query tile's
  blocks of the fp32 workspace ``(B, H_q, ceil(S_q / 64), 64 D)`` with one
  ``cp.reduce.async.bulk ... add.f32`` per block, while the dK GEMM runs; the warp waits
  for its previous bulk reads before it stages again. With ``dq_alias`` (blk 64 / D 128,
  where two CTAs per SM leave no room for the staging tile) the slices go to the step's
  own Q and dO tiles instead: after the dK GEMM and a barrier of the consumer warps, and
  each warp waits for its bulk reads before it releases the stage to the producer. With
  ``dq_late`` (set wherever ``dq_alias`` is, unless ``bsa_bwd_ws=dqearly``) the dK GEMM
  is issued alone and dQ = dS K only once the dV / dK GEMMs have completed, so the dQ
  accumulator is not live next to P^T, dS^T and the in-flight dV / dK GEMMs (at blk 64 /
  D 128 the dQ-first order does not fit the registers: ptxas serializes the wgmma).
  With ``dv_wait`` (``bsa_bwd_ws=dvwait``) the dQ-first order waits for the dV GEMM between
  the dQ and dK issues. With ``dk_lag`` (``bsa_bwd_ws=dklag``, blk 128) a step's dK GEMM is
  issued in the next step of the same KV block, right after that step's S^T / dP^T GEMMs:
  the tensor pipe runs it while the consumers compute P^T and dS^T. The step's dS^T
  fragment is kept in registers of its own and its Q / dO stage is released once that dK
  GEMM has completed; the last step's dK is issued after the block's last step.
  With ``s_ahead`` (``bsa_bwd_ws=sahead``, blk 128) the first 64-row step of a list entry
  ends without waiting for its dK GEMM: the second step issues its S^T / dP^T GEMMs behind
  it, its S^T wait covers that dK, and it then releases the first step's Q / dO stage. The
  first step is static (the first 64 rows of a listed query block are always below
  ``S_q``); where the second is skipped, the wait and the release follow the skipped step,
  so no GEMM is in flight across the loop over the entries.
  With ``q_probe`` (the blk 128 default with ``wg_hand``) a consumer, once it has issued its
  dQ staging stores, computes the next step's stage index and tests that stage's full
  barrier without waiting (``SmemPipeline.consumer_test``); the next step starts without
  the wait where the test passed. ``ent_ahead`` (opt-in) splits the next list entry there
  as well; ``ex2_emu`` (opt-in) takes part of P^T's exponentials as an FMA-pipe polynomial
  (``common.exp2_poly3``).
  With ``dq_lag`` (the blk 128 default with ``wg_hand``) warpgroup 0 computes its half of
  step ``c``'s dQ in step ``c + 1`` (the block's last after its last step) from dS^T buffer
  ``c % 2``, warpgroup 1 its half in the step: warpgroup 0 syncs barrier 6 (warpgroup 1's
  half of step ``c - 1`` stored) before it stores its half of step ``c`` and arrives on
  barrier 1; warpgroup 1 syncs barrier 1 before it stores its half, arrives on barrier 6 and
  syncs its own barrier 9 before its dQ GEMM. The syncs before the stores also keep a buffer
  until both dQ GEMMs of the step held there have read it
  (``tests/test_barrier_protocols.py`` checks the protocol). The writer warp takes
  warpgroup 1's half of a step before warpgroup 0's.
  ``kernels/dq_tiles.py`` reorders the workspace into dq. With ``dq_alt`` (blk 128, the dQ
  writer warp and the staging tile) the warpgroups take turns instead: at step ``c``
  warpgroup ``c % 2`` waits for both dS^T halves, computes the whole ``64 x D`` dQ tile over
  all 128 keys (after its dV / dK GEMMs have completed) and stages it for the writer, while
  the other warpgroup only arrives on that step's dS barrier and goes on to its next step. Without ``dq_tile`` the dQ rows
  ``< S_q`` are added to a row-major ``(B, S_q, H_q, D)`` workspace with
  ``red.global.add.v2.f32`` while the dK GEMM runs.
* epilogue: dK, dV straight from registers to the key rows ``< S_kv``.

Without ``lpt`` the CTAs run in grid order (KV block fastest, then KV head, batch): the CTAs
running at one time work on one or two KV heads, whose Q / dO / lse / delta stay in L2.
With ``lpt`` the ``offsets`` input is followed by a permutation of the K->Q rows
(``metadata.kq_lpt_order``) and CTA ``i`` (in launch order) takes row ``order[i]``: the
host's default order sorts each (batch, KV head)'s rows longest list first and keeps the
pairs in grid order (``lpt_chain``), so the last CTAs of each pair are its shortest; the
order over all rows (longest first across pairs) is measured slower on the H200
(docs/bsa.md).

``softmax_scale`` is folded into dS^T before its 16-bit conversion, so neither dK nor dQ
needs a final scale. dK / dV are bitwise deterministic (one CTA sums its list in list order);
by default dQ's fp32 additions are not ordered.

Deterministic mode (``deterministic``; extra inputs ``mRank``, int32 like ``entries``: the
place of each entry among the contributions to its query row, ``metadata.build_kq_csr(...,
with_ranks=True)``, and ``mdQSem``, int32 ``(B, H_q, N_q *
blk / 64 * dq_slots)`` zero-initialised by XLA: one counter per 64-row query tile and
accumulator slot): the dQ
contributions to a query tile are added in ascending KV block order, so every dQ element
gets the same fp32 additions in the same order on every run (the order is the ranks':
ascending KV block, or by launch group of ``G`` CTAs, then by the position of the query
tile in each CTA's walk; docs/bsa.md). Warp 1 of the producer
warpgroup (otherwise idle) walks the CTA's list like the consumers; per query tile its lane
0 waits (acquire loads; ``relaxed_poll``: relaxed loads, then one ``fence.acq_rel.gpu``)
until the tile's counter reaches the entry's rank, arrives on named
barrier 2 (the consumers sync on it before their dQ additions), syncs on barrier 3
(the consumers arrive after their reductions; with ``dq_tile`` once their bulk reduce-adds
are complete) and publishes ``rank + 1`` (``fence.acq_rel.gpu``
+ store): FlashAttention-2/3's ``dq_semaphore`` technique with the rank in place of the KV
tile index. Deadlock freedom: in KV block order a CTA waits only for CTAs of lower KV blocks
of the same (batch, KV head), which have lower linear block indices (grid order, ``lpt``
off), and a non-persistent grid dispatches blocks in increasing linear index, so the lowest
unfinished block never waits; in launch-group order it also waits for CTAs of its own
group, along waits that decrease (position in the walk, KV block), so a group whose CTAs
are resident together always progresses. With ``det_writer`` (and ``dq_tile``) warp 1 also
issues the additions, as FlashAttention-3's dQ writer warp does: the consumers stage a step's
slices, arrive on named barrier 2 and go on with the next step; warp 1 waits for the
semaphore, syncs on barrier 2, adds the staged tile (one bulk reduce-add per block), hands
the buffer back once the additions have read it (named barrier 5, on which the consumers
sync before they stage the next step; with ``dq_alias`` it also releases the step's Q / dO
stage to the producer), and publishes once they are complete. With ``det_store`` the
first contribution to an accumulator tile (turn 0) is a bulk store instead of a reduce-add,
so the workspace is not zeroed; a tile nobody wrote keeps its semaphore at 0, and the
reordering kernel writes zeros for it. With ``dq_slots = P > 1`` each
query tile has ``P`` accumulator tiles in the workspace (``(B, H_q, N_t P, 64 D)``, tile ``t``
slot ``p`` at ``t P + p``) and ``P`` semaphores (``mdQSem`` ``(B, H_q, N_t P)``): the
contribution of rank ``r`` is added to slot ``r % P`` once the slot's semaphore reaches
``r // P``, so it waits for rank ``r - P`` only and ``P`` publications of a tile are in flight
at once; ``kernels/dq_tiles.py`` sums the slots in slot order. Each slot's additions and
their sum have a fixed order, so dQ stays bitwise reproducible; the ranks a contribution
waits for are a subset of those it waits for at ``P = 1``, so the deadlock argument carries
over. The consumers then wait for a slow
predecessor only when the writer is a whole step behind. ``decouple`` is off in this mode (each query tile gets one addition per
KV block). ``dq_writer`` (not deterministic, with ``dq_tile``): warp 1 is the same writer
without the semaphore and the ranks, so no consumer warp waits for the reads of its own bulk
copies.

``zero_lag = L > 0`` (static; with ``dq_writer``, unpacked rows, not with ``dq_claim`` or
an ``lpt`` order over all pairs): the fp32 workspace is zeroed just ahead of its use instead of all at once
before the launch. The CTAs of the ``(batch, KV head)`` pair ``c = b H_kv + g`` (the grid's
``N_kv`` KV blocks of it, launched after those of every pair before it) each zero one
``N_kv``-th of the workspace of pair ``c + L`` (its ``G`` query heads' tiles, contiguous):
warp 1, before its first addition, with 16-byte stores, then each lane ``fence.proxy.async``
and ``fence.acq_rel.gpu`` and lane 0 adds 1 to pair ``c + L``'s int32 counter (``mdQSem``, ``(B H_kv,)``, zeroed by
XLA) with a fenced atomic. Before its first addition, warp 1 of a CTA of pair ``c >= L``
waits (acquire loads) until its pair's counter is ``N_kv`` and fences the generic proxy
against the async proxy of its bulk reduce-adds; the first ``L`` pairs' workspace is zeroed
by the preprocessing launch. The wait is for CTAs launched at least ``L N_kv`` positions
before it, which by then have started (they are ahead in the launch order and none waits for
a later one), so it cannot deadlock.

``tail_conv`` (static; with ``dq_writer``, unpacked rows, not with ``dq_claim``): every CTA
executes ``griddepcontrol.launch_dependents`` as it starts, so the dq reordering that the
same call launches next (``dq_tiles.BsaDqFromTiles`` with ``wait_pairs``) may start once the
last CTA of this grid has started, on the SMs the last wave leaves free; warp 1, after its
last bulk
reduce-add has completed (``cp.async.bulk.wait_group 0``), fences the async proxy and adds
1 to its pair's completed-CTA counter (``mdQSem[P + pair]``, ``P = B H_kv`` pairs) with a
fenced atomic. The reordering's CTA of a query tile waits for its pair's count to reach
``N_kv`` (so it reads only complete tiles); its last CTA waits for this grid at its end.

``dq_fixed`` (static; with ``dq_writer``, not ``dq_alt``, ``dq_claim``, ``decouple`` or
``pack_gqa``): the deterministic backward without an order. The producer loads each row's
power-of-two multiplier (``mdQMult[b, h, t, row, 0]``, from a bound on the row's
contributions) with its lse and delta; the consumers convert the step's dQ accumulators to
``round(x * m)`` int32 (held in the fp32 registers) before they stage them, and set a row's
bit in ``mdQFlags[b, h, t, :]`` where a value is not finite or beyond ``2^30``; the writer
warp adds the staged tile with int32 bulk reductions. Integer sums do not depend on the
order of their terms, so dq (reordered and converted back by ``dq_tiles.BsaDqFromTiles``
with ``fixed``) is bitwise reproducible with the default mode's launch and CTA order.

``pack_gqa = r > 1`` (static; with ``dq_tile``, not deterministic): the K->Q entries are packed
blocks (the group is 1) of the KV head's ``S_q r`` packed rows, packed row ``p`` being
position ``p // r`` of query head ``g r + p % r`` (``pack_gqa.packed_row``). Q / dO of a step's
64 packed rows come in one 5-D TMA box each (``pack_gqa.pack_rows_view``), lse / delta per
packed row from its (query head, position), and dQ goes to a tile workspace of packed rows
``(B, H_kv, ceil(S_q r / 64), 64 D)`` (``dq_tiles.BsaDqFromTiles`` with ``pack``); with
``causal`` a packed row's limit is its position's.

``causal`` (static; not with ``order_stream``): the token-level causal mask inside the listed
blocks (key ``j`` visible from query ``i`` iff ``j <= i + S_kv - S_q``). The producer warp
first reduces over the CTA's entries the keys some query row of an entry sees (to the
diagonal of its query block's last row, within that head's ``block_sizes``) and, where that
is fewer than the block's rows, loads K / V row by row with the rows past it zero-filled
(so NaN there never reaches ``dQ = dS K``); a step crossing the diagonal
(``n0 - (S_kv - S_q) - q0 + bn - 1 > 0``) selects 0 into P^T and dS^T where key row ``r``
is not visible from query column ``c`` (``c < qlo0 + r``); a step below it is unmasked.

``order_stream`` (deterministic; ``mProgress``, int32, one counter per CSR row): the entries
and ranks are written by ``kernels/bsa_det_order.py`` (``publish``) while this kernel runs,
launched right before it in the same call. The producer warp and warp 1 read an entry only
once the row's counter (acquire loads, polled again only when the entries read so far are
used up) exceeds its index, and read entries and ranks with ``ld.relaxed.gpu`` (past L1);
the consumers read an entry after the wait for its first Q / dO stage, which the producer
loaded after the entry was published. With ``pdl`` the kernel does not wait for the order
kernel at its start (that one has waited for every earlier grid before letting this one
launch) but at its end; with ``stream_after_pre`` (the preprocessing launched in between)
it waits for the preprocessing at its start.

``persist = G`` (static; blk 128 with ``tail_conv``, not causal, ``zero_lag``, ``dq_alt``,
``dq_alias`` or ``decouple``): a grid of ``G`` CTAs (one per SM) walks the K->Q rows as work
items. The producer warp takes item ``block_idx.x`` first, then one per atomic add on the
int32 ``mdQSem[2 P]`` (zeroed; ``P`` pairs) once an item's loads are issued (with ``lpt``
item ``i`` is row ``order[i]``), and publishes each row through a two-slot mbarrier ring
that the consumer warps and warp 1 read (-1 ends the walk). Per item it issues the first
``persist_kv_at`` Q / dO stages (at most ``q_stages - 1``), then acquires the single-stage
K / V pipeline (count = the item's index; an empty item only acquires and arrives) and
loads K / V, then the rest; with ``persist_kv_l2`` it prefetches the next item's K / V to
L2 when it takes it. The Q / dO ring's count, the dS buffers' and warp 1's hand-backs run
on across items; warp 1 counts each item on its pair (``tail_conv``). The consumers zero
dK / dV per item and, after its steps, stage them in the K / V tiles and the dS tiles
(``sdSp``, right after V in this mode; the Q / dO ring holds the next item's stages), then
release K / V; with register stores (``epi_smem`` off) they release K / V first. Registers:
producer 40, consumers 232 (the CTA's 384 x 168).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.memory
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Float32, Int32
from cutlass._mlir.dialects import nvvm as _nvvm
from cutlass.cutlass_dsl import dsl_user_op
from cutlass.cute.nvgpu import OperandMajorMode, cpasync, warpgroup

from . import kv_major_bwd as kvb
from .bsa_common import LOG2_E, bwd_kv_tile_rows
from .common import (L2_EVICT_FIRST, L2_EVICT_LAST, L2_EVICT_NORMAL, L2_HINT_NORMAL,
                     acc_layout_as_a, acc_mn_view_wg,
                     atom_add_acq_rel_s32, atom_add_s32, clock_ordered, elem_ptr, exp2_poly3,
                     fence_acq_rel_gpu,
                     gmem_load_copy, kv_major_bwd_operands, l2_copy_kw, l2_policy,
                     ld_acquire_s32, ld_relaxed_f32, ld_relaxed_s32, ld_shared_s32,
                     st_release_s32, st_shared_s32, tma_view, wait_at_least)
from .dq_tiles import bulk_add_warp_slice, fixed_point_slice, stage_warp_slice
from .pack_gqa import pack_rows_view, packed_row
from .pipeline import SmemPipeline, fetch_item, publish_item, take_item
from .seqlen_info import offset_rows

#: the last of the 16 int32 a ``stamps`` diagnostic writes over a dK row (``_write_stamps``)
STAMP_MARK = 0x5A17C0DE

#: query rows per step (one wgmma N / M extent)
TILE_M = 64
#: ``dq_claim``: added to a query tile's flag once its first contribution (a bulk store) is
#: complete; the flag also counts the claims (one per contribution), which stay below it
CLAIM_STORED = 1 << 24
#: shared memory per CTA: one CTA per SM at blk 128, two at blk 64 (228 KiB per SM less
#: 1 KiB reserved per CTA)
SMEM_LIMIT = {1: 227 * 1024, 2: 113 * 1024}


def bwd_ws_smem_bytes(head_dim: int, block_size: int, stages: int,
                      dq_tile: bool = False, ld_kinds: int = 2) -> int:
    """Shared memory of the kernel: K, V, ``stages`` x (Q, dO and ``ld_kinds`` fp32 values
    per row: lse, delta and with the fixed-point dQ the row's multiplier), the dS tiles (two
    buffers at blk 128) and with ``dq_tile`` the fp32 dQ staging tile. The mbarriers (at
    most 128 bytes with at most four stages) and the per-row values come first, padded to the
    1 KiB alignment of the tiles."""
    ds_bufs = 2 if block_size == 128 else 1
    head = -(-(128 + stages * ld_kinds * TILE_M * 4) // 1024) * 1024
    return (head + 2 * block_size * head_dim * 2 + stages * 2 * TILE_M * head_dim * 2
            + ds_bufs * TILE_M * block_size * 2 + (TILE_M * head_dim * 4 if dq_tile else 0))


def bwd_ws_q_stages(head_dim: int, block_size: int, max_stages: int = 4,
                    dq_tile: bool = False, ld_kinds: int = 2) -> int | None:
    """The most Q / dO stages (2..``max_stages``) whose shared memory fits the CTA's share
    (None: none fits)."""
    limit = SMEM_LIMIT[1 if block_size == 128 else 2]
    for st in range(max_stages, 1, -1):
        if bwd_ws_smem_bytes(head_dim, block_size, st, dq_tile, ld_kinds) <= limit:
            return st
    return None


def bwd_ws_dq_tile_fits(head_dim: int, block_size: int) -> bool:
    """Whether the dQ staging tile fits next to two Q / dO stages (not at blk 64 / D 128,
    where two CTAs share an SM)."""
    return bwd_ws_q_stages(head_dim, block_size, dq_tile=True) is not None


def bwd_ws_dq_block_cols(head_dim: int, block_size: int) -> int:
    """Columns of one block of the dQ tile workspace (``kernels/dq_tiles.py``): a consumer
    warp's accumulator columns (blk 128: the warpgroups split the head dim), at most 64."""
    return min(64, head_dim // (block_size // 64))


@dsl_user_op
def cp_async_mbarrier_arrive(mbar_ptr, *, loc=None, ip=None):
    """``cp.async.mbarrier.arrive.shared::cta.b64``: the mbarrier's pending arrivals grow by
    one now and shrink by one when this thread's earlier cp.async copies have completed (so
    its phase cannot complete before they have)."""
    _nvvm.cp_async_mbarrier_arrive(mbar_ptr.to_llvm_ptr(loc=loc, ip=ip), noinc=False,
                                   loc=loc, ip=ip)


class BsaBwdSm90Ws:
    """``__call__`` takes the arguments of ``BsaBwdSm90.__call__``."""

    def __init__(self, dtype, head_dim: int, block_size: int, has_block_sizes: bool,
                 max_stages: int = 4, ld_wait: bool = False, lpt: bool = False,
                 decouple: bool = False, deterministic: bool = False, dq_tile: bool = False,
                 dq_alias: bool = False, pdl: bool = False, det_writer: bool = False,
                 dq_late: bool = False, dq_writer: bool = False, lse_early: bool = False,
                 split_wait: bool = False, epi_pairs: bool = False, epi_smem: bool = False,
                 dq_alt: bool = False, dq_slots: int = 1, relaxed_poll: bool = False,
                 order_stream: bool = False, stream_after_pre: bool = False,
                 det_store: bool = False, causal: bool = False, pack_gqa: int = 1,
                 dq_claim: bool = False, zero_lag: int = 0, tail_conv: bool = False,
                 lpt_chain: bool = False, persist: int = 0, persist_kv_at: int = -1,
                 persist_kv_l2: bool = True, dq_fixed: bool = False, l2_hint: int = 0,
                 uniform_frags: bool = True, wg_hand: bool = False, ld_scaled: bool = False,
                 dv_wait: bool = False, dk_lag: bool = False, s_ahead: bool = False,
                 stamps: tuple = (), red_v4: bool = False, fast_div: bool = False,
                 q_probe: bool = False, ent_ahead: bool = False, ex2_emu: int = 0,
                 dq_lag: bool = False, wg_uniform: bool = False, fix_emu: int = 0,
                 buckets: bool = False):
        self.pdl = pdl
        # of every 8 score columns of a thread, the first ex2_emu take exp2 as a polynomial
        # on the FMA pipes (``common.exp2_poly3``) instead of the MUFU unit
        self.ex2_emu = ex2_emu
        # with q_probe and fast_div: the next list entry's query head, block (and with
        # block_sizes its valid key count) are computed at the first step's stage test
        # instead of at the entry's start
        self.ent_ahead = ent_ahead
        # with wg_hand (the configuration leaves it off with dk_lag, s_ahead and persist):
        # after staging its dQ slice a consumer tests
        # whether the next step's Q / dO stage is full and computes that stage's index, so
        # that the next step skips the wait (and the index) where the test passed
        self.q_probe = q_probe
        # the consumers split a list entry into query head and block with a precomputed
        # multiplier (cute.FastDivmodDivisorV2) instead of an integer division
        self.fast_div = fast_div
        # without dq_tile: the dQ rows added with one red.global.add.v4.f32 per 4 values
        # (two lanes swap a pair) instead of one .v2 per 2
        self.red_v4 = red_v4
        # diagnostic: the consumer steps whose running counts are listed print the SM clock at
        # fixed points of the step (``_stamp``; thread 0 of each consumer warpgroup of CTAs
        # 0..15)
        self.stamps = tuple(stamps)
        # the second 64-row step of a list entry issues its S^T / dP^T GEMMs while the first
        # step's dK GEMM may still run (module doc): blk 128 on the default dQ path only
        if s_ahead and (block_size != 128 or deterministic or dq_alias or dq_alt or decouple
                        or dv_wait or persist or dk_lag or split_wait or dq_late):
            raise ValueError("s_ahead needs blk 128 and the default dQ path (not "
                             "deterministic, dq_alias, dq_alt, decouple, dv_wait, persist, "
                             "dk_lag, split_wait or dq_late)")
        self.s_ahead = s_ahead
        # a step's dK GEMM is issued in the next step, after its S^T / dP^T GEMMs (module
        # doc): blk 128 on the default dQ path only
        if dk_lag and (block_size != 128 or deterministic or dq_alias or dq_alt or decouple
                       or dv_wait or persist):
            raise ValueError("dk_lag needs blk 128 and the default dQ path (not deterministic, "
                             "dq_alias, dq_alt, decouple, dv_wait or persist)")
        self.dk_lag = dk_lag
        # where dQ and dK are issued together: the dK GEMM is issued once the dV GEMM has
        # completed (dQ issued, wait, dK issued) instead of right after dQ
        self.dv_wait = dv_wait
        # the lse input is in the log2 domain (lse log2 e) and delta is scaled by
        # softmax_scale, so a step's P^T takes one FFMA per score and its dS^T one FFMA and
        # one FMUL: P^T (dP^T softmax_scale - delta softmax_scale)
        self.ld_scaled = ld_scaled
        # the consumers' shared-memory GEMM operands partitioned with a warp-uniform thread
        # index (their warpgroup's first thread), so that the wgmma descriptors are uniform
        # registers (kernels.common.kv_major_bwd_operands)
        self.uniform_frags = uniform_frags
        # the L2 policies (_l2; common.L2_HINT_*): with L2_HINT_SPLIT K / V evict_first, Q /
        # dO and the writer warp's dQ bulk reductions evict_last
        self.l2_hint = l2_hint
        # pack_gqa: r = H_q / H_kv query heads per KV head (1: off). The K->Q entries are
        # packed blocks (the group is 1), a step is 64 packed rows (64 / r positions x r query
        # heads; pack_gqa.packed_row), Q / dO come in 5-D TMA boxes (pack_rows_view), lse /
        # delta per packed row, and the dQ tile workspace is (B, H_kv, packed tiles, 64 D)
        self.pack = pack_gqa
        if pack_gqa > 1 and (64 % pack_gqa or deterministic or not dq_tile):
            raise NotImplementedError(
                f"bsa_bwd_sm90_ws: pack_gqa={pack_gqa} needs r dividing 64, the dQ tile "
                f"workspace and no deterministic")
        # the token-level causal mask inside the listed blocks (key j visible from query i
        # iff j <= i + S_kv - S_q): per-step select of P^T / dS^T, K / V rows past the last
        # key any entry's queries see zero-filled
        self.causal = causal
        if causal and order_stream:
            raise NotImplementedError("bsa_bwd_sm90_ws: causal with order_stream")
        # deterministic: the entries and ranks are produced while this kernel runs (by
        # kernels/bsa_det_order.py launched just before it, see _entry_ready)
        self.order_stream = order_stream and deterministic
        # order_stream with the preprocessing launched between the order kernel and this
        # kernel: this one waits for the preprocessing (its previous grid) at its start
        self.stream_after_pre = stream_after_pre and self.order_stream
        # deterministic: the semaphore polled with relaxed loads and one acquire fence
        self.relaxed_poll = relaxed_poll
        # dK / dV stored as packed pairs of adjacent columns (4-byte stores)
        self.epi_pairs = epi_pairs
        # epilogue through shared memory (the consumed Q / dO stages and dS tiles): packed
        # conflict-free pairs into two (bn, D + 8) tiles, then coalesced 16-byte row pieces
        # (kv_major_bwd.store_dk_dv_smem)
        self.epi_smem = epi_smem
        # P^T computed before the dP^T wait, which starts its own basic block
        self.split_wait = split_wait
        # the step's lse read from shared memory before its GEMMs are issued (else under them)
        self.lse_early = lse_early
        if head_dim not in (64, 128) or block_size not in (64, 128):
            raise NotImplementedError(
                f"bsa_bwd_sm90_ws implements head_dim in (64, 128) and sparse_block_size in "
                f"(64, 128), got head_dim={head_dim}, sparse_block_size={block_size}")
        self.dtype = dtype
        self.d = head_dim
        self.bn = block_size
        self.bm = TILE_M
        self.sub = block_size // TILE_M
        self.num_wg = block_size // 64
        self.has_sizes = has_block_sizes
        self.ds_bufs = 2 if self.num_wg == 2 else 1
        self.num_threads = 128 * (1 + self.num_wg)
        self.ctas_per_sm = 1 if self.num_wg == 2 else 2
        # dQ into the query-tile workspace (kernels/dq_tiles.py): each consumer warp stages its
        # accumulator slice in shared memory and adds it with one bulk reduction per block
        if dq_tile and decouple and self.num_wg == 2 and not deterministic:
            raise NotImplementedError("bsa_bwd_sm90_ws: dq_tile with decouple")
        self.dq_tile = dq_tile
        # dq_alias: the slices are staged in the step's consumed Q / dO tiles (no staging tile:
        # the consumers sync before staging and release the stage once the bulk reads are done)
        self.dq_alias = dq_alias and self.dq_tile
        # dq_alias: dK first, dQ = dS K only once the dV / dK GEMMs have completed (the dQ
        # accumulator is not live next to P^T, dS^T and the in-flight dV / dK: fewer
        # registers at the peak, so ptxas need not serialize the wgmma)
        self.dq_late = dq_late and self.dq_alias
        self.dq_w = bwd_ws_dq_block_cols(head_dim, block_size)
        self.ld_wait = ld_wait
        self.deterministic = deterministic
        # deterministic with dq_tile: warp 1 issues the staged tile's bulk reductions itself
        # once the semaphore allows (the consumers stage and go on; see _dq_writer_warp)
        self.det_writer = det_writer and deterministic and self.dq_tile
        # not deterministic, with dq_tile: warp 1 issues every step's bulk reductions of the
        # staged dQ (the consumers stage and go on instead of waiting for the bulk reads of
        # their slices; with dq_alias warp 1 also hands the stage back)
        self.dq_writer = dq_writer and not deterministic and self.dq_tile
        # warp 1 adds the staged dQ tiles (either mode)
        self.writer = self.det_writer or self.dq_writer
        # with the dQ writer (not deterministic, not dq_alt / dq_claim): each step's dQ
        # converted by the consumers to int32 fixed point (times its row's multiplier
        # mdQMult[b, h, t, row, 0], rows out of the bound flagged in mdQFlags) and added with
        # int32 bulk reductions, whose sum does not depend on their order: a bitwise
        # reproducible dQ without ordering the additions
        self.dq_fixed = (dq_fixed and self.dq_writer and not dq_alt and not dq_claim
                         and not decouple and pack_gqa == 1)
        # per-row values of a Q / dO stage in shared memory: lse, delta (and with dq_fixed
        # the row's multiplier, loaded by the producer with them)
        self.ld_kinds = 3 if self.dq_fixed else 2
        self.q_stages = bwd_ws_q_stages(head_dim, block_size, max_stages,
                                        self.dq_tile and not self.dq_alias, self.ld_kinds)
        if self.q_stages is None:
            raise NotImplementedError(
                f"bsa_bwd_sm90_ws: no shared-memory plan for head_dim={head_dim}, "
                f"sparse_block_size={block_size}, dq_tile={dq_tile}, "
                f"dq_fixed={self.dq_fixed}")
        # deterministic with the writer: each query tile has ``dq_slots`` fp32 accumulators
        # (workspace tiles ``t * dq_slots + p``); the contribution of rank ``r`` goes to slot
        # ``r % dq_slots`` and waits for rank ``r - dq_slots`` only (the tile's semaphore of
        # that slot counts ``r // dq_slots``); the reordering kernel sums the slots in order
        if dq_slots < 1:
            raise ValueError(f"bsa_bwd_sm90_ws: dq_slots={dq_slots} must be >= 1")
        if dq_slots > 1 and not self.det_writer:
            raise NotImplementedError(
                f"bsa_bwd_sm90_ws: dq_slots={dq_slots} needs the deterministic dQ writer warp")
        self.dq_slots = dq_slots
        # det_writer: the first contribution to each accumulator tile (turn 0, i.e. rank <
        # dq_slots) is a bulk store, so the workspace needs no zeroing (a tile nobody wrote
        # keeps its semaphore at 0; the reordering kernel writes zeros for it)
        self.det_store = det_store and self.det_writer
        # dq_writer (not deterministic): the first contribution to each query tile is
        # claimed with an atomic add on the tile's int32 flag (``mdQSem``, zeroed) and
        # stored; the others wait until the store is complete (flag >= CLAIM_STORED) and
        # add. The workspace needs no zeroing; the reordering kernel writes zeros for a tile
        # whose flag is 0. Unpacked rows only (the packed reordering reads no flags).
        self.dq_claim = dq_claim and self.dq_writer and pack_gqa == 1
        # the ordered dQ additions need the grid's launch order (lower KV blocks first)
        self.lpt = lpt and not deterministic
        # the workspace of the (batch, KV head) pair c + zero_lag zeroed by pair c's writer
        # warps (the launch order: pairs one after the other, so not with an lpt order
        # over all pairs; lpt_chain's order keeps each pair's CTAs together)
        self.zero_lag = (zero_lag if self.dq_writer and pack_gqa == 1
                         and (lpt_chain or not self.lpt) and not self.dq_claim else 0)
        # every CTA lets the dq reordering launch when it starts, and its writer warp counts
        # the CTA's completed dQ additions on its pair's counter (mdQSem[P + pair])
        self.tail_conv = tail_conv and self.dq_writer and pack_gqa == 1 and not self.dq_claim
        # blk 128: each consumer warpgroup adds the dQ of its own 64 keys (no barrier between
        # the warpgroups; twice the dQ reductions)
        self.decouple = decouple and self.num_wg == 2 and not deterministic
        # blk 128 with the dQ writer and the staging tile: the consumer warpgroups take turns
        # (step c: warpgroup c % 2) computing the step's whole dQ tile (m64, n = D, k = bn);
        # the other warpgroup only arrives on the step's dS barrier (ids 1 / 6 by step
        # parity) and goes on. Barriers 2 and 5 then count the computing warpgroup and warp 1.
        self.dq_alt = (dq_alt and self.num_wg == 2 and self.dq_writer and not self.dq_alias
                       and not self.decouple)
        # blk 128 with the dQ writer (not deterministic) and the staging tile: the writer
        # takes each consumer warpgroup's staged half on its own (barriers 2 / 11: staged,
        # 5 / 10: handed back, 128 + 32 threads each) instead of the whole tile (barriers 2
        # and 5 over both warpgroups), so a warpgroup waits only for the writer's reads of
        # its own half, never for the other warpgroup
        self.wg_hand = (wg_hand and self.num_wg == 2 and self.dq_writer and not self.dq_alias
                        and not self.dq_alt and not self.dq_claim and not self.decouple)
        # a persistent grid of ``persist`` CTAs (blk 128: one per SM) walking the K->Q rows
        # as work items, dealt dynamically (in the lpt order when given); with the dQ
        # writer's tail_conv (its zeroed counters hold the item counter), not causal, not
        # with dq_alt / decouple / zero_lag
        self.persist = (persist if self.num_wg == 2 and self.tail_conv and not self.dq_alias
                        and not self.dq_alt and not self.decouple and not self.zero_lag
                        and not causal else 0)
        # persistent: an item's K / V are loaded once its first ``persist_kv_at`` Q / dO
        # stages are issued (-1: ``q_stages - 1``; the previous item frees K / V last)
        self.persist_kv_at = (self.q_stages - 1 if persist_kv_at < 0
                              else min(persist_kv_at, self.q_stages - 1))
        # setmaxnreg moves registers within the CTA's launch allocation (384 x 168 = 64512 at
        # blk 128): 24 x 128 + 240 x 256, or persistent (whose producer warp walks the items
        # and spills at 24) 40 x 128 + 232 x 256
        self.regs_producer = 40 if self.persist else 24
        # with wg_hand (not persist, dk_lag, s_ahead or dv_wait): warpgroup 0 computes its
        # half of dQ one step late (step c's dQ half in step c + 1, the block's last after its
        # last step), from the other dS^T buffer; warpgroup 1 computes its half in the step.
        # Barrier 1 (warpgroup 0 arrives once its dS^T half of step c is stored, warpgroup 1
        # syncs before storing its own) and barrier 6 (warpgroup 1 arrives once its half is
        # stored, warpgroup 0 syncs before storing its next one) replace the dS^T barrier
        # over both, and barrier 9 syncs warpgroup 1 alone before its dQ GEMM: neither
        # warpgroup waits for the other's dS^T of the same step, so they can run up to a step
        # apart
        self.dq_lag = (dq_lag and self.wg_hand and not self.persist and not self.dk_lag
                       and not self.s_ahead and not self.dv_wait and not self.dq_late)
        # the consumers' warpgroup index from the warp-uniform warp index (ptxas then keeps
        # the values derived from it in uniform registers), else from the thread index
        self.wg_uniform = wg_uniform
        # with dq_fixed: of every 8 dQ values of a thread, the first fix_emu are converted to
        # fixed point on the FP32 / integer pipes (common.fixed_bits_f32_fadd), the others by
        # cvt.rni (the conversion unit, which also runs the exponentials)
        self.fix_emu = fix_emu if dq_fixed else 0
        # persistent: the next item's K / V prefetched to L2 once the item is taken
        self.persist_kv_l2 = persist_kv_l2 and bool(self.persist)
        # 65536 registers per SM: 384 threads x 168 at launch (blk 128), 2 x 256 x 128 (blk 64)
        self.regs_consumer = 240 if self.num_wg == 2 and not self.persist else 232
        # the CTAs take work items (metadata.kq_bucket_items, after the offsets) instead of
        # KV blocks: a long K->Q list split in buckets, each bucket's dK / dV partial stored
        # to its fp32 slot (mPart) and summed in bucket order by the bucket that completes
        # its row's count (mdQSem[2 P + row], zeroed); not persistent, not on the ordered
        # deterministic path, unpacked rows, without lpt (the items are in their own order)
        self.buckets = (buckets and not self.persist and not deterministic and self.pack == 1
                        and self.tail_conv and not self.stamps)
        if self.buckets:
            self.lpt = False

    @cute.jit
    def __call__(self, mQ, mK, mV, mdO, mLSE, mDelta, mOffsets, mEntries, mSizes, mScale,
                 mdQacc, mdK, mdV, stream, mRank=None, mdQSem=None, mProgress=None,
                 mdQMult=None, mdQFlags=None, mPart=None, n_items=None):
        dt = self.dtype
        bm, bn, d, nwg = self.bm, self.bn, self.d, self.num_wg
        Kmaj = OperandMajorMode.K
        MN = OperandMajorMode.MN
        # S^T, dP^T: (bn keys) x (bm queries), reduction over D; warpgroup w: keys 64 w ..
        mma_s = sm90_utils.make_trivial_tiled_mma(dt, dt, Kmaj, Kmaj, Float32, (nwg, 1, 1),
                                                  (64, bm))
        # dV, dK: (bn keys) x D, reduction over the bm queries, A (P^T, dS^T) from registers
        mma_kv = sm90_utils.make_trivial_tiled_mma(dt, dt, Kmaj, MN, Float32, (nwg, 1, 1),
                                                   (64, d), warpgroup.OperandSource.RMEM)
        # dQ: (bm queries) x D, reduction over the bn keys; two warpgroups split the head dim
        dq_split = 1 if self.decouple or self.dq_alt else nwg
        mma_dq = sm90_utils.make_trivial_tiled_mma(dt, dt, MN, MN, Float32, (1, dq_split, 1),
                                                   (64, d // dq_split))
        sK_layout, sK_mn_layout, sQ_layout, sQ_mn_layout, sdS_layout = kvb.layouts(
            dt, bn, bm, d, self.q_stages, self.ds_bufs)

        # TMA views (S, D, H, B) with D contiguous; boxes of bm (Q, dO) / bn (K, V) rows
        tQ, tdO, tK, tV = tma_view(mQ, d), tma_view(mdO, d), tma_view(mK, d), tma_view(mV, d)
        if cutlass.const_expr(self.pack > 1):
            # packed rows ((r, S), D, H_kv, B): a box of bm packed rows is (D, r, bm / r)
            tQ = pack_rows_view(tQ, self.pack, 0, 2)
            tdO = pack_rows_view(tdO, self.pack, 0, 2)
        g2s = cpasync.CopyBulkTensorTileG2SOp()
        sQ_one = cute.slice_(sQ_layout, (None, None, 0))
        sK_one = cute.slice_(sK_layout, (None, None, 0))
        tma_q, tma_tQ = cpasync.make_tiled_tma_atom(g2s, tQ, sQ_one, (bm, d))
        tma_do, tma_tdO = cpasync.make_tiled_tma_atom(g2s, tdO, sQ_one, (bm, d))
        tma_k, tma_tK = cpasync.make_tiled_tma_atom(g2s, tK, sK_one, (bn, d))
        tma_v, tma_tV = cpasync.make_tiled_tma_atom(g2s, tV, sK_one, (bn, d))

        n_mbar = SmemPipeline.num_barriers(self.q_stages) + SmemPipeline.num_barriers(1)
        if cutlass.const_expr(self.persist):
            # the work-item ring: two stages' barriers and two 8-byte slots
            n_mbar += SmemPipeline.num_barriers(2) + 2
        ds_size = cute.cosize(sdS_layout)

        @cute.struct
        class Smem:
            mbar: cute.struct.MemRange[cutlass.Int64, n_mbar]
            # buckets: the count a bucket's atomic add returned, for the whole CTA (with the
            # at most 10 mbarriers of a grid that is not persistent, within the 128 bytes
            # before the per-row values that bwd_ws_smem_bytes counts)
            sFlag: cute.struct.MemRange[Int32, 4 if self.buckets else 0]
            # per stage and row: lse, delta (dq_fixed: and the row's dQ multiplier)
            sLD: cute.struct.Align[cute.struct.MemRange[
                Float32, self.ld_kinds * bm * self.q_stages], 128]
            sK: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sK_layout)], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sK_layout)], 1024]
            # persistent: the dS tiles follow K / V (the epilogue stages dK / dV there)
            sdSp: cute.struct.Align[cute.struct.MemRange[dt, ds_size if self.persist else 0],
                                    1024]
            sQ: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sQ_layout)], 1024]
            sdO: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sQ_layout)], 1024]
            sdS: cute.struct.Align[cute.struct.MemRange[dt, 0 if self.persist else ds_size],
                                   1024]
            sdQ: cute.struct.Align[cute.struct.MemRange[
                Float32, bm * d if self.dq_tile and not self.dq_alias else 0], 128]

        if cutlass.const_expr(self.epi_smem and self.persist):
            # the epilogue's two (bn, D + 8) tiles take the K / V tiles and the dS tiles
            kvb.check_epi_smem_fit("bsa_bwd_sm90_ws", bn, d, sK_layout, sdS_layout)
        elif cutlass.const_expr(self.epi_smem):
            # the epilogue's two (bn, D + 8) tiles take the Q / dO stages and the dS tiles
            kvb.check_epi_smem_fit("bsa_bwd_sm90_ws", bn, d, sQ_layout, sdS_layout)
        if cutlass.const_expr(Smem.size_in_bytes() > SMEM_LIMIT[self.ctas_per_sm]):
            raise NotImplementedError(
                f"bsa_bwd_sm90_ws: {Smem.size_in_bytes()} bytes of shared memory exceed the "
                f"plan's {SMEM_LIMIT[self.ctas_per_sm]} (head_dim={d}, sparse_block_size={bn})")
        n_kv_blocks = (mK.shape[1] + bn - 1) // bn
        grid = (n_kv_blocks, cute.size(mK.shape[2]), cute.size(mK.shape[0]))
        if cutlass.const_expr(self.persist):
            grid = (self.persist, 1, 1)
        if cutlass.const_expr(self.buckets):
            grid = (n_items, cute.size(mK.shape[2]), cute.size(mK.shape[0]))
        self.kernel(
            tma_q, tma_tQ, tma_do, tma_tdO, tma_k, tma_tK, tma_v, tma_tV,
            mQ, mK, mV, mLSE, mDelta, mOffsets, mEntries, mSizes, mScale, mdQacc, mdK, mdV,
            mRank, mdQSem, mProgress, mdQMult, mdQFlags, mPart, sK_layout, sK_mn_layout,
            sQ_layout, sQ_mn_layout, sdS_layout, mma_s, mma_kv, mma_dq, Smem,
        ).launch(grid=grid, block=[self.num_threads, 1, 1], smem=Smem.size_in_bytes(),
                 stream=stream, min_blocks_per_mp=self.ctas_per_sm, use_pdl=self.pdl,
                 preferred_smem_carveout=100 if self.ctas_per_sm > 1 else None)

    # ------------------------------------------------------------------------------------
    @cute.jit
    def _load_rows(self, mX, batch, head, n_block, limit, sX, lane):
        """One warp: rows ``< limit`` of block ``n_block`` (``bn`` rows) of ``mX[batch, :,
        head, :]`` by cp.async into ``sX`` (bn, D), zeros in the block's other rows."""
        copy = gmem_load_copy(self.dtype, 32, self.d)
        gX = cute.local_tile(mX[batch, None, head, None], (self.bn, self.d), (n_block, 0))
        thr = copy.get_slice(lane)
        tg = thr.partition_S(gX)
        ts = thr.partition_D(sX)
        tc = thr.partition_S(cute.make_identity_tensor((self.bn, self.d)))
        for r in cutlass.range(cute.size(ts.shape[1]), unroll=1):
            if tc[0, r, 0][0] < limit:
                cute.copy(copy, tg[None, r, None], ts[None, r, None])
            else:
                ts[None, r, None].fill(0)

    @cute.jit
    def _load_lse_delta(self, mLSE, mDelta, batch, head, q0, seqlen_q, sLD, stage, lane,
                        mdQMult=None, tile=None):
        """One warp: the lse and delta of query rows ``[q0, q0 + bm)`` into ``sLD[:, 0 / 1,
        stage]`` (cp.async, 4 bytes each; +inf / 0 past ``S_q``, so P^T = dS^T = 0 there).
        ``pack_gqa``: packed rows of KV head ``head``, each from its (query head, position).
        ``dq_fixed``: also the rows' dQ multipliers (query tile ``tile``) into ``sLD[:, 2,
        stage]`` (the array covers the rows past ``S_q``)."""
        atom = cute.make_copy_atom(cpasync.CopyG2SOp(), Float32, num_bits_per_copy=32)
        for j in cutlass.range_constexpr(self.bm // 32):
            r = lane + 32 * j
            if cutlass.const_expr(self.dq_fixed):
                cute.copy(atom, cute.make_tensor(elem_ptr(mdQMult, (batch, head, tile, r, 0)),
                                                 cute.make_layout(1)),
                          cute.make_tensor(elem_ptr(sLD, (r, 2, stage)), cute.make_layout(1)))
            q = q0 + r
            dl = cute.make_tensor(elem_ptr(sLD, (r, 0, stage)), cute.make_layout(1))
            dd = cute.make_tensor(elem_ptr(sLD, (r, 1, stage)), cute.make_layout(1))
            if q < seqlen_q:
                h = head
                if cutlass.const_expr(self.pack > 1):
                    q, h = packed_row(q, head, self.pack)
                cute.copy(atom, cute.make_tensor(elem_ptr(mLSE, (batch, h, q)),
                                                 cute.make_layout(1)), dl)
                cute.copy(atom, cute.make_tensor(elem_ptr(mDelta, (batch, h, q)),
                                                 cute.make_layout(1)), dd)
            else:
                dl[0] = Float32.inf
                dd[0] = Float32(0.0)

    @cute.jit
    def _fence_rows(self):
        """Complete this warp's cp.async copies and zero-fill stores and make them visible
        to the async proxy (wgmma) and to the consumers."""
        cute.arch.cp_async_commit_group()
        cute.arch.cp_async_wait_group(0)
        cute.arch.fence_proxy("async.shared", space="cta")
        cute.arch.sync_warp()

    @cute.jit
    def _alt_step(self, mma_kv, mma_dq, acc_dK, tdS, tKrQ, tP, tQrdS, tQrK, thr_dq, st, stg,
                  buf, c, wg, warp):
        """``dq_alt``: the rest of step ``c`` after the dV GEMM's issue. Warpgroup ``c % 2``
        waits for both dS^T halves (barrier 1 at even steps, 6 at odd ones: the other
        warpgroup may reach the next step's dS barrier before this one has synced on this
        step's), issues dK,
        then ``dQ = dS K`` over all keys and D once dK / dV are complete, and stages it for
        the writer warp (barrier 5: the writer is done with the previous tile; barrier 2: this
        one is staged). The other warpgroup arrives on the dS barrier and issues dK only.
        Both end with no wgmma in flight."""
        bm, d = self.bm, self.d
        mine = (c % 2) == wg
        if mine:
            if c % 2 == 0:
                cute.arch.barrier(barrier_id=1, number_of_threads=256)
            else:
                cute.arch.barrier(barrier_id=6, number_of_threads=256)
        else:
            if c % 2 == 0:
                cute.arch.barrier_arrive(barrier_id=1, number_of_threads=256)
            else:
                cute.arch.barrier_arrive(barrier_id=6, number_of_threads=256)
        kvb.issue_dk(mma_kv, acc_dK, tdS, tKrQ, stg)
        warpgroup.wait_group(0)
        kvb.keep_regs(tP, tdS)
        if mine:
            acc_dQ = thr_dq.make_fragment_C(thr_dq.partition_shape_C((bm, d)))
            mma_dq = kvb.issue_dq(mma_dq, acc_dQ, tQrdS, tQrK, buf)
            warpgroup.wait_group(0)
            if c > 0:
                # the writer warp is done with the previous step's staged tile
                cute.arch.barrier(barrier_id=5, number_of_threads=128 + 32)
            stage_warp_slice(acc_dQ, st.sdQ.data_ptr(), cute.arch.lane_idx(), (warp - 4) % 4,
                             0, 4, self.dq_w)
            cute.arch.fence_proxy("async.shared", space="cta")
            cute.arch.sync_warp()
            cute.arch.barrier_arrive(barrier_id=2, number_of_threads=128 + 32)
        return mma_dq

    @cute.jit
    def _entry_ready(self, mProgress, row_id, e, avail):
        """``order_stream``: the published prefix length of CSR row ``row_id`` once it
        exceeds ``e`` (acquire loads by every lane of the warp; ``avail``: the last value
        read, so a row's published prefix is polled for only once it is used up). The
        entries and ranks below it are then read past L1 (``ld.relaxed.gpu``)."""
        v = avail
        if e >= avail:
            ptr = mProgress.iterator + row_id
            v = ld_acquire_s32(ptr)
            while v <= e:
                v = ld_acquire_s32(ptr)
        return v

    @cute.jit
    def _causal_kv_rows(self, mEntries, mSizes, e_begin, n_ent, n_q_blocks, seqlen_q, seqlen_k,
                        batch, head_kv, group, n_block, lane):
        """One warp (causal): the rows of KV block ``n_block`` that some query row of its K->Q
        entries sees, the largest over the entries (query block ``m`` of head ``h``) of
        ``min((m + 1) bn, S_q) + S_kv - S_q - n0``, each capped by ``block_sizes[b, h, n]``
        when given (a strided scan by the lanes, then warp shuffles; may be <= 0)."""
        bn = self.bn
        cap = Int32(-1)
        for e in cutlass.range(lane, n_ent, 32, unroll=1):
            ent = Int32(mEntries[e_begin + e])
            h_in_group = ent // n_q_blocks
            m = ent - h_in_group * n_q_blocks
            if cutlass.const_expr(self.pack > 1):
                # packed rows (seqlen_q = S_q r): the last row's position is its index // r
                rows = ((cutlass.min((m + 1) * bn, seqlen_q) - 1) // self.pack + 1 + seqlen_k
                        - seqlen_q // self.pack - n_block * bn)
            else:
                rows = (cutlass.min((m + 1) * bn, seqlen_q) + seqlen_k - seqlen_q
                        - n_block * bn)
            if cutlass.const_expr(self.has_sizes):
                rows = cutlass.min(rows, mSizes[batch, head_kv * group + h_in_group, n_block])
            cap = cutlass.max(cap, rows)
        for sh in cutlass.range_constexpr(5):
            cap = cutlass.max(cap, cute.arch.shuffle_sync_bfly(cap, offset=16 >> sh))
        return cap

    @cute.jit
    def _mask_p_ds(self, S_mn, dP_mn, tScS, limit, qlo0):
        """Select 0 into P^T (and dS^T when ``dP_mn`` is given) for the keys (rows) at or past
        ``limit`` and, with ``causal``, for the (key ``r``, query ``c``) pairs with
        ``c < qlo0 + r`` (packed rows: ``c // r_pack < qlo0 + r``; never multiply: those
        scores may be NaN)."""
        for r in cutlass.range_constexpr(cute.size(tScS, mode=[0])):
            kr = tScS[r, 0][0]
            key_ok = kr < limit
            for cc in cutlass.range_constexpr(cute.size(tScS, mode=[1])):
                ok = key_ok
                if cutlass.const_expr(self.causal and self.pack > 1):
                    # packed rows: query column c is position q0 / r + c // r
                    ok = key_ok & (tScS[0, cc][1] // self.pack >= qlo0 + kr)
                elif cutlass.const_expr(self.causal):
                    ok = key_ok & (tScS[0, cc][1] >= qlo0 + kr)
                S_mn[r, cc] = S_mn[r, cc] if ok else Float32(0.0)
                if cutlass.const_expr(dP_mn is not None):
                    dP_mn[r, cc] = dP_mn[r, cc] if ok else Float32(0.0)

    def _l2(self, priority):
        """The ``cache_policy`` keyword of a TMA load under ``l2_hint``
        (:func:`.common.l2_copy_kw`)."""
        return l2_copy_kw(self.l2_hint, priority)

    def _l2_reduce_policy(self, store):
        """The L2 policy of the writer warp's fp32 dQ bulk reduce-adds under ``l2_hint``
        (None: the plain instruction; bulk stores and int32 reductions keep it)."""
        if not self.l2_hint or store or self.dq_fixed:
            return None
        return l2_policy(L2_EVICT_NORMAL if self.l2_hint == L2_HINT_NORMAL else L2_EVICT_LAST)

    @cute.jit
    def _bulk_tile(self, gtile, sdQ, sdQ2, n_cg: cutlass.Constexpr, store: cutlass.Constexpr):
        """One lane of the writer warp: the staged dQ tile to the workspace tile at
        ``gtile``, one bulk reduce-add (``store``: bulk store) per block of every consumer
        warp's slice (the caller commits the bulk group)."""
        for wi in cutlass.range_constexpr(4 * self.num_wg):
            # consumer warp wi: rows 16 (wi % 4) .., warpgroup wi // 4's columns
            bulk_add_warp_slice(gtile, sdQ, wi % 4, (wi // 4) * n_cg, n_cg, 4, self.dq_w,
                                sbase2=sdQ2, half=2 * self.d // self.dq_w, store=store,
                                s32=self.dq_fixed,
                                policy=self._l2_reduce_policy(store))

    @cute.jit
    def _zero_ahead(self, mdQacc, mCount, batch, head_kv, num_heads_kv, group, n_block,
                    n_kv_blocks):
        """``zero_lag``: warp 1 zeroes this CTA's share of the workspace of the pair
        ``zero_lag`` after its own, then counts it on that pair's counter."""
        lane = cute.arch.lane_idx()
        target = batch * num_heads_kv + head_kv + self.zero_lag
        if target < mdQacc.shape[0] * num_heads_kv:
            tb = target // num_heads_kv
            tg = target - tb * num_heads_kv
            # the pair's G query heads' tiles: contiguous, a multiple of 4 elements (64 D
            # per tile)
            n_vec = (group * mdQacc.shape[2] * mdQacc.shape[3]) // 4
            per = (n_vec + n_kv_blocks - 1) // n_kv_blocks
            v0 = n_block * per
            v1 = cutlass.min(v0 + per, n_vec)
            base = elem_ptr(mdQacc, (tb, tg * group, 0, 0)).toint()
            zero = cute.make_rmem_tensor(4, Float32)
            zero.fill(0.0)
            for i in cutlass.range(v0 + lane, v1, 32, unroll=4):
                g = cute.make_ptr(Float32, base + cutlass.Int64(i) * 16,
                                  cute.AddressSpace.gmem, assumed_align=16)
                cute.make_tensor(g, cute.make_layout(4)).store(zero.load())
            # each lane's stores (ordered for the async proxy of the later bulk additions as
            # well), then (fenced, cumulative over the warp's synchronized lanes) the count
            cute.arch.fence_proxy("async.global")
            fence_acq_rel_gpu()
            cute.arch.sync_warp()
            if lane == 0:
                atom_add_acq_rel_s32(elem_ptr(mCount, (target,)), 1)
            cute.arch.sync_warp()

    @cute.jit
    def _count_done(self, mCount, batch, head_kv, num_heads_kv, n_batch):
        """``tail_conv``: once this CTA's bulk dQ additions are complete (not only read),
        warp 1 counts the CTA on its pair's completed-CTA counter (``mCount[P + pair]``,
        ``P`` pairs) after an async-proxy fence and with a fenced atomic."""
        lane = cute.arch.lane_idx()
        if lane == 0:
            cute.arch.cp_async_bulk_wait_group(0, read=False)
            cute.arch.fence_proxy("async.global")
            n_pairs = n_batch * num_heads_kv
            atom_add_acq_rel_s32(elem_ptr(mCount, (n_pairs + batch * num_heads_kv + head_kv,)),
                                 1)
        cute.arch.sync_warp()

    @cute.jit
    def _zeroed_wait(self, mCount, batch, head_kv, num_heads_kv, n_kv_blocks):
        """``zero_lag``: warp 1 waits until every CTA of the pair ``zero_lag`` before its own
        has zeroed its share of this pair's workspace (the first pairs: zeroed before the
        launch), then orders those stores before its bulk reduce-adds."""
        lane = cute.arch.lane_idx()
        pair = batch * num_heads_kv + head_kv
        if pair >= self.zero_lag:
            if lane == 0:
                wait_at_least(elem_ptr(mCount, (pair,)), n_kv_blocks)
                # the acquired generic-proxy stores, before this thread's async-proxy
                # additions to the same addresses
                cute.arch.fence_proxy("async.global")
            cute.arch.sync_warp()

    @cute.jit
    def _dq_order_warp(self, mEntries, mRank, mdQSem, e_begin, n_ent, n_q_blocks, seqlen_q,
                       head_kv, group, batch, mdQacc=None, st=None, pipe_q=None,
                       mProgress=None, row_id=None):
        """Warp 1 in deterministic mode or with ``dq_writer``. Deterministic: per query
        tile of the list, wait for the earlier KV blocks' dQ additions, let the consumers add
        (barrier 2), wait for their additions (barrier 3) and publish this block's (see the
        module docstring).

        With ``det_writer`` or ``dq_writer`` (the writer): per query tile (the consumers'
        steps, in their order; deterministic: wait for the earlier contributions), wait until the consumers have staged the step's dQ slices
        (barrier 2, the consumers arrive), add the whole staged tile with one bulk reduce-add
        per block into ``mdQacc``; once the additions have read it, hand the staging buffer
        back: with ``dq_alias`` the step's Q / dO stage of ``pipe_q`` to the producer (one
        arrival per consumer warp on its empty barrier), and to the consumers (barrier 5:
        they sync on it before they stage the next step); deterministic: once they are
        complete, publish."""
        lane = cute.arch.lane_idx()
        bm, d, nwg = self.bm, self.d, self.num_wg
        n_sync = 128 * (1 if self.dq_alt else nwg) + 32
        n_cg = d // nwg // self.dq_w  # blocks per consumer warp
        c = Int32(0)
        avail = Int32(0)
        for e in cutlass.range(n_ent, unroll=1):
            ent = Int32(0)
            rank = None
            if cutlass.const_expr(self.order_stream):
                avail = self._entry_ready(mProgress, row_id, e, avail)
                ent = ld_relaxed_s32(mEntries.iterator + (e_begin + e))
                rank = ld_relaxed_s32(mRank.iterator + (e_begin + e))
            else:
                ent = Int32(mEntries[e_begin + e])
                if cutlass.const_expr(self.deterministic):
                    rank = Int32(mRank[e_begin + e])
            h_in_group = ent // n_q_blocks
            m_block = ent - h_in_group * n_q_blocks
            head = head_kv * group + h_in_group
            for s in cutlass.range_constexpr(self.sub):
                if m_block * self.bn + s * bm < seqlen_q:
                    sem = None
                    # this contribution's accumulator tile of the workspace (its slot) and
                    # its place among the slot's contributions
                    t_ws = m_block * self.sub + s
                    turn = rank
                    if cutlass.const_expr(self.dq_slots > 1):
                        t_ws = t_ws * self.dq_slots + rank % self.dq_slots
                        turn = rank // self.dq_slots
                    if cutlass.const_expr(self.deterministic):
                        sem = elem_ptr(mdQSem, (batch, head, t_ws))
                        if lane == 0:
                            wait_at_least(sem, turn, self.relaxed_poll)
                        cute.arch.sync_warp()
                    first = Int32(0)
                    if cutlass.const_expr(self.dq_claim):
                        sem = elem_ptr(mdQSem, (batch, head, t_ws))
                    if cutlass.const_expr(self.wg_hand):
                        # each warpgroup's half: staged and fenced (barrier 2 / 11), added,
                        # handed back once the additions have read it (barrier 5 / 10)
                        gtile = elem_ptr(mdQacc, (batch, head, t_ws, 0))
                        sdQ = st.sdQ.data_ptr()

                        def add_half(w, gtile=gtile, sdQ=sdQ, n_cg=n_cg):
                            # warpgroup w's four consumer warps' blocks
                            for wi in range(4):
                                bulk_add_warp_slice(gtile, sdQ, wi, w * n_cg, n_cg, 4,
                                                    self.dq_w, s32=self.dq_fixed,
                                                    policy=self._l2_reduce_policy(False))

                        # (dq_lag: warpgroup 0 stages a step's half one step late)
                        kvb.writer_take_halves(lane, add_half,
                                               (1, 0) if self.dq_lag else (0, 1))
                        c += 1
                    elif cutlass.const_expr(self.writer):
                        # every consumer warp's slice of this step is staged and fenced
                        cute.arch.barrier(barrier_id=2, number_of_threads=n_sync)
                        sdQ = st.sdQ.data_ptr()
                        sdQ2 = None
                        if cutlass.const_expr(self.dq_alias):
                            sdQ, sdQ2 = kvb.stage_as_f32(st, pipe_q.stage(c), bm, d)
                        if lane == 0:
                            gtile = elem_ptr(mdQacc, (batch, head, t_ws, 0))
                            if cutlass.const_expr(self.det_store):
                                if turn == 0:
                                    # the accumulator tile's first contribution: stores
                                    self._bulk_tile(gtile, sdQ, sdQ2, n_cg, True)
                                else:
                                    self._bulk_tile(gtile, sdQ, sdQ2, n_cg, False)
                            elif cutlass.const_expr(self.dq_claim):
                                # claimed once the tile is staged: the first claimer stores;
                                # later ones wait until that store is complete, then add
                                if atom_add_s32(sem, 1) == 0:
                                    first = Int32(1)
                                    self._bulk_tile(gtile, sdQ, sdQ2, n_cg, True)
                                else:
                                    wait_at_least(sem, CLAIM_STORED)
                                    # the acquired store, before this thread's async-proxy
                                    # additions to the same addresses
                                    cute.arch.fence_proxy("async.global")
                                    self._bulk_tile(gtile, sdQ, sdQ2, n_cg, False)
                            else:
                                self._bulk_tile(gtile, sdQ, sdQ2, n_cg, False)
                            cute.arch.cp_async_bulk_commit_group()
                            cute.arch.cp_async_bulk_wait_group(0, read=True)
                        cute.arch.sync_warp()
                        # the staged tile is read: its buffer is free again
                        if cutlass.const_expr(self.dq_alias):
                            # the stage goes back to the producer (the consumers did not
                            # release it): one arrival per consumer warp
                            with cute.arch.elect_one():
                                for _ in cutlass.range_constexpr(4 * nwg):
                                    cute.arch.mbarrier_arrive(pipe_q.empty + pipe_q.stage(c))
                        cute.arch.barrier_arrive(barrier_id=5, number_of_threads=n_sync)
                        if cutlass.const_expr(self.deterministic):
                            if lane == 0:
                                # complete (not only read) before the publication
                                cute.arch.cp_async_bulk_wait_group(0, read=False)
                                st_release_s32(sem, turn + 1)
                            cute.arch.sync_warp()
                        if cutlass.const_expr(self.dq_claim):
                            if lane == 0:
                                if first == 1:
                                    # the store complete (not only read), then released
                                    cute.arch.cp_async_bulk_wait_group(0, read=False)
                                    atom_add_acq_rel_s32(sem, CLAIM_STORED)
                            cute.arch.sync_warp()
                        c += 1
                    else:
                        cute.arch.barrier_arrive(barrier_id=2, number_of_threads=n_sync)
                        cute.arch.barrier(barrier_id=3, number_of_threads=n_sync)
                        if lane == 0:
                            st_release_s32(sem, rank + 1)
                        cute.arch.sync_warp()

    @cute.jit
    def _load_kv(self, kvctx, n_block, head_kv, batch, kv_rows, kv_left, lane, j):
        """Producer warp: K and V of KV block ``n_block`` into their tiles, completing the
        K / V pipeline's full barrier of item ``j`` (rows ``< kv_rows`` only, by cp.async,
        where ``kv_rows`` is short of the block; persistent: once the previous item's
        consumers have released the tiles)."""
        tma_k, tma_tK, tma_v, tma_tV, sK, sV, sK_layout, pipe_kv, mK, mV = kvctx
        bn, d = self.bn, self.d
        if cutlass.const_expr(self.persist):
            pipe_kv.producer_acquire(j)
        if kv_rows >= cutlass.min(kv_left, bn):
            kv_bytes = cute.size_in_bytes(self.dtype, cute.slice_(sK_layout, (None, None, 0)))
            pipe_kv.producer_expect_tx(j, 2 * kv_bytes)
            tKs, tKg = self._kv_boxes(tma_k, tma_tK, sK, head_kv, batch)
            cute.copy(tma_k, tKg[None, n_block], tKs[None, 0],
                      tma_bar_ptr=pipe_kv.full_ptr(j), **self._l2(L2_EVICT_FIRST))
            tVs, tVg = self._kv_boxes(tma_v, tma_tV, sV, head_kv, batch)
            cute.copy(tma_v, tVg[None, n_block], tVs[None, 0],
                      tma_bar_ptr=pipe_kv.full_ptr(j), **self._l2(L2_EVICT_FIRST))
        else:
            self._load_rows(mK, batch, head_kv, n_block, kv_rows,
                            sK[None, None, 0], lane)
            self._load_rows(mV, batch, head_kv, n_block, kv_rows,
                            sV[None, None, 0], lane)
            self._fence_rows()
            pipe_kv.producer_arrive(j)

    @cute.jit
    def _kv_boxes(self, tma, tma_t, sX, head_kv, batch):
        """``(smem, gmem)`` TMA partitions of the K or V tile ``sX`` and of the ``(bn, D)``
        blocks of ``head_kv``, ``batch`` (indexed by the KV block)."""
        gX = cute.local_tile(tma_t[None, None, head_kv, batch], (self.bn, self.d), (None, 0))
        return cpasync.tma_partition(tma, 0, cute.make_layout(1), cute.group_modes(sX, 0, 2),
                                     cute.group_modes(gX, 0, 2))

    @cute.jit
    def _prefetch_kv(self, kvctx, n_block, head_kv, batch):
        """Producer warp (persistent): K and V of KV block ``n_block`` into L2 (TMA
        prefetches of the two boxes)."""
        tma_k, tma_tK, tma_v, tma_tV, sK, sV, sK_layout, pipe_kv, mK, mV = kvctx
        _, tKg = self._kv_boxes(tma_k, tma_tK, sK, head_kv, batch)
        _, tVg = self._kv_boxes(tma_v, tma_tV, sV, head_kv, batch)
        with cute.arch.elect_one():
            cute.prefetch(tma_k, tKg[None, n_block])
            cute.prefetch(tma_v, tVg[None, n_block])

    @cute.jit
    def _produce(self, pctx, kvctx, n_block, head_kv, batch, row_id, e_begin, n_ent, kv_left,
                 j, c):
        """Producer warp 0, one KV block (work item ``j``): its K / V, then the lse, delta,
        Q and dO of every step of its K->Q list into the Q / dO ring from running count
        ``c``; returns the count after the item. Persistent: K / V are loaded after the
        item's first ``persist_kv_at`` stages, and an empty item only passes the K / V
        pipeline's barriers, so every item takes one turn of it."""
        (tma_q, tma_tQ, tma_do, tma_tdO, sQ, sdO, sQ_layout, sLD, pipe_q, pipe_kv, mLSE, mDelta,
         mEntries, mSizes, mProgress, seqlen_q, seqlen_k, group, n_q_blocks, mdQMult) = pctx
        bm, bn, d = self.bm, self.bn, self.d
        if n_ent > 0:
            lane = cute.arch.lane_idx()
            # rows of the block that are keys for some query head of the group
            kv_rows = bwd_kv_tile_rows(mSizes, batch, head_kv, group, n_block, 0,
                                       kv_left, self.has_sizes)
            if cutlass.const_expr(self.causal):
                # ... and that some query row of the block's entries sees
                kv_rows = cutlass.min(kv_rows, self._causal_kv_rows(
                    mEntries, mSizes, e_begin, n_ent, n_q_blocks, seqlen_q, seqlen_k,
                    batch, head_kv, group, n_block, lane))
            if cutlass.const_expr(not self.persist):
                self._load_kv(kvctx, n_block, head_kv, batch, kv_rows, kv_left, lane, 0)
            q_bytes = cute.size_in_bytes(self.dtype, cute.slice_(sQ_layout, (None, None, 0)))
            c0 = c
            avail = Int32(0)
            for e in cutlass.range(n_ent, unroll=1):
                ent = Int32(0)
                if cutlass.const_expr(self.order_stream):
                    avail = self._entry_ready(mProgress, row_id, e, avail)
                    ent = ld_relaxed_s32(mEntries.iterator + (e_begin + e))
                else:
                    ent = Int32(mEntries[e_begin + e])
                h_in_group = ent // n_q_blocks
                m_block = ent - h_in_group * n_q_blocks
                head = head_kv * group + h_in_group
                gQ = cute.local_tile(tma_tQ[None, None, head, batch], (bm, d), (None, 0))
                tQs, tQg = cpasync.tma_partition(
                    tma_q, 0, cute.make_layout(1), cute.group_modes(sQ, 0, 2),
                    cute.group_modes(gQ, 0, 2))
                gdO = cute.local_tile(tma_tdO[None, None, head, batch], (bm, d), (None, 0))
                tdOs, tdOg = cpasync.tma_partition(
                    tma_do, 0, cute.make_layout(1), cute.group_modes(sdO, 0, 2),
                    cute.group_modes(gdO, 0, 2))
                for s in cutlass.range_constexpr(self.sub):
                    q0 = m_block * bn + s * bm
                    if q0 < seqlen_q:
                        if cutlass.const_expr(self.persist):
                            # the item's K / V once its first stages are issued (the
                            # previous item's epilogue frees the K / V tiles last)
                            if c - c0 == self.persist_kv_at:
                                self._load_kv(kvctx, n_block, head_kv, batch, kv_rows,
                                              kv_left, lane, j)
                        pipe_q.producer_acquire(c)
                        stg = pipe_q.stage(c)
                        self._load_lse_delta(mLSE, mDelta, batch, head, q0, seqlen_q,
                                             sLD, stg, lane, mdQMult, m_block * self.sub + s)
                        if cutlass.const_expr(self.ld_wait):
                            cute.arch.cp_async_commit_group()
                            cute.arch.cp_async_wait_group(0)
                        else:
                            # the stage's phase also waits for these copies
                            cp_async_mbarrier_arrive(pipe_q.full_ptr(c))
                        # every lane's copies (and +inf / 0 stores) precede the arrival
                        cute.arch.sync_warp()
                        pipe_q.producer_expect_tx(c, 2 * q_bytes)
                        q_tile = m_block * self.sub + s
                        cute.copy(tma_q, tQg[None, q_tile], tQs[None, stg],
                                  tma_bar_ptr=pipe_q.full_ptr(c), **self._l2(L2_EVICT_LAST))
                        cute.copy(tma_do, tdOg[None, q_tile], tdOs[None, stg],
                                  tma_bar_ptr=pipe_q.full_ptr(c), **self._l2(L2_EVICT_LAST))
                        c += 1
            if cutlass.const_expr(self.persist):
                if c - c0 <= self.persist_kv_at:
                    self._load_kv(kvctx, n_block, head_kv, batch, kv_rows, kv_left, lane, j)
        else:
            if cutlass.const_expr(self.persist):
                pipe_kv.producer_acquire(j)
                pipe_kv.producer_arrive(j)
        return c

    @cute.jit
    def _split_entry(self, ent, q_div, n_q_blocks, mSizes, batch, head_kv, group, n_block,
                     kv_left):
        """``ent_ahead``: list entry ``ent`` as (query head in the group, query block, the
        block's valid keys for that head)."""
        h = ent // q_div
        lim = kv_left
        if cutlass.const_expr(self.has_sizes):
            lim = cutlass.min(lim, mSizes[batch, head_kv * group + h, n_block])
        return h, ent - h * n_q_blocks, lim

    @cute.jit
    def _stamp(self, tv, i: cutlass.Constexpr):
        """Diagnostic (``stamps``): the SM clock at point ``i`` of the step."""
        if cutlass.const_expr(len(self.stamps) > 0):
            tv[i] = clock_ordered()

    @cute.jit
    def _keep_stamps(self, tv, tkeep, c):
        """Diagnostic (``stamps``): step ``c``'s readings kept for ``_write_stamps`` (14, the
        end of the step before it), the first step's start (``tkeep[15]``) and step ``c``'s
        reading before its stage wait (``tkeep[16]``)."""
        if cutlass.const_expr(len(self.stamps) > 0):
            if c == self.stamps[0]:
                for i in cutlass.range_constexpr(15):
                    tkeep[i] = tv[i]
                tkeep[16] = tv[16]
            if c == 0:
                tkeep[15] = tv[0]

    @cute.jit
    def _write_stamps(self, tv, tcta, wg, ctid, mdK, batch, n0, head_kv, kv_left, c):
        """Diagnostic (``stamps``), after the epilogue: thread 0 of consumer warpgroup ``wg``
        overwrites the first 32 values of dK rows ``n0 + wg`` and ``n0 + 2 + wg`` of its
        block with 16 int32 each (a function call such as ``printf`` in the kernel makes
        ptxas serialize every wgmma, C7510). Row ``n0 + wg``: the kept step's readings 1..13
        less reading 0, reading 0, reading 0 less the previous step's end (0 for the first
        step) and the marker ``STAMP_MARK``; row ``n0 + 2 + wg``: the consumer's start, the
        first step's start, the end of the last step, the end of the epilogue (``tcta``,
        clock readings), the number of steps, the kept step's wait for its Q / dO stage
        (reading 0 less the reading before the wait), zeros, the marker. The call's gradients are
        not valid."""
        if cutlass.const_expr(len(self.stamps) > 0):
            # every consumer thread's epilogue stores are ordered before the overwrite
            cute.arch.barrier(barrier_id=7, number_of_threads=128 * self.num_wg)
            if (ctid % 128 == 0) & (tv[0] != 0) & (wg + 2 < kv_left):
                row = cute.make_tensor(
                    cute.recast_ptr(elem_ptr(mdK, (batch, n0 + wg, head_kv, 0)), dtype=Int32),
                    cute.make_layout(16))
                for i in cutlass.range_constexpr(1, 14):
                    row[i - 1] = tv[i] - tv[0]
                row[13] = tv[0]
                row[14] = tv[0] - tv[14]
                if self.stamps[0] == 0:
                    row[14] = Int32(0)
                row[15] = Int32(STAMP_MARK)
                cta = cute.make_tensor(
                    cute.recast_ptr(elem_ptr(mdK, (batch, n0 + 2 + wg, head_kv, 0)),
                                    dtype=Int32), cute.make_layout(16))
                cta[0] = tcta[0]
                cta[1] = tv[15]
                cta[2] = tcta[1]
                cta[3] = tcta[2]
                cta[4] = c
                cta[5] = tv[0] - tv[16]
                for i in cutlass.range_constexpr(6, 15):
                    cta[i] = Int32(0)
                cta[15] = Int32(STAMP_MARK)

    @cute.jit
    def _consume_steps(self, cctx, n_block, head_kv, batch, row_id, e_begin, n_ent, n0, kv_left,
                       j, c, tkeep=None):
        """Consumer warpgroups, one KV block (work item ``j``): every step of its K->Q list
        from running count ``c`` of the Q / dO ring (dK, dV accumulate in ``acc_dK`` /
        ``acc_dV``); returns the count after the item."""
        (mEntries, mSizes, mProgress, mdQacc, mma_s, mma_kv, mma_dq, thr_s, thr_dq, tSrK, tSrV,
         tSrQ, tSrdO, tVrdO, tKrQ, tQrdS, tQrK, acc_dK, acc_dV, tScS, n_rows, n_cols, tdQc,
         r2s_dS, tdSsdS, a_vals, s_shape, softmax_scale, scale_log2, sLD, st, pipe_q, pipe_kv,
         wg, warp, seqlen_q, seqlen_k, group, n_q_blocks, mdQMult, mdQFlags) = cctx
        bm, bn, d, nwg = self.bm, self.bn, self.d, self.num_wg
        # the list entries are loaded one entry ahead (register carried), so the global
        # load of entry e + 1 runs under entry e's steps
        ent_nxt = Int32(0)
        if n_ent > 0:
            if cutlass.const_expr(not self.order_stream):
                ent_nxt = Int32(mEntries[e_begin])
            if cutlass.const_expr(not self.persist):
                pipe_kv.consumer_wait(0)
        if cutlass.const_expr(self.persist):
            # every item takes a turn of the K / V pipeline (an empty one too)
            pipe_kv.consumer_wait(j)
        # dk_lag: the previous step's dS^T fragment, its ring count and whether there is one
        lag_dS = None
        lag_c = Int32(0)
        lag_on = Int32(0)
        if cutlass.const_expr(self.dk_lag):
            lag_dS = cute.make_rmem_tensor(
                acc_layout_as_a(thr_s.make_fragment_C(s_shape).layout, a_vals), self.dtype)
        # fast_div: the divisor of the entries' split into query head and block
        q_div = None
        if cutlass.const_expr(self.fast_div):
            q_div = cute.fast_divmod_create_divisor_v2(n_q_blocks)
        # stamps: the clock readings of the current step
        tv = None
        if cutlass.const_expr(len(self.stamps) > 0):
            tv = cute.make_rmem_tensor(17, Int32)
        # q_probe: whether stage ``c`` was found full by the previous step, and its index
        q_ready = Int32(0)
        q_stg = pipe_q.stage(c)
        # ent_ahead: the next entry's query head in the group, query block and key limit
        h_nx = Int32(0)
        m_nx = Int32(0)
        lim_nx = kv_left
        if cutlass.const_expr(self.ent_ahead):
            h_nx, m_nx, lim_nx = self._split_entry(ent_nxt, q_div, n_q_blocks, mSizes, batch,
                                                   head_kv, group, n_block, kv_left)
        # dq_lag with the fixed-point dQ: the previous step's row multipliers, query tile and
        # head (warpgroup 0 converts that step's dQ half in the next step)
        lag_m0 = Float32(0.0)
        lag_m1 = Float32(0.0)
        lag_tile = Int32(0)
        lag_head = Int32(0)
        for e in cutlass.range(n_ent, unroll=1):
            ent = ent_nxt
            if cutlass.const_expr(self.order_stream):
                # the producer loaded this entry's first stage once the entry was
                # published: after that stage's wait (repeated below, a no-op) the entry
                # is visible here (read past L1)
                pipe_q.consumer_wait(c)
                ent = ld_relaxed_s32(mEntries.iterator + (e_begin + e))
            else:
                ent_nxt = Int32(mEntries[e_begin + cutlass.min(e + 1, n_ent - 1)])
            h_in_group = Int32(0)
            m_block = Int32(0)
            # keys of the block for this query head
            limit = kv_left
            if cutlass.const_expr(self.ent_ahead):
                h_in_group, m_block, limit = h_nx, m_nx, lim_nx
            else:
                if cutlass.const_expr(self.fast_div):
                    h_in_group = ent // q_div
                else:
                    h_in_group = ent // n_q_blocks
                m_block = ent - h_in_group * n_q_blocks
                if cutlass.const_expr(self.has_sizes):
                    limit = cutlass.min(limit, mSizes[batch, head_kv * group + h_in_group,
                                                      n_block])
            head = head_kv * group + h_in_group
            # s_ahead: the first step's dS^T, read by its dK GEMM until the second step's
            # S^T wait
            tdS0 = None
            if cutlass.const_expr(self.s_ahead):
                tdS0 = cute.make_rmem_tensor(
                    acc_layout_as_a(thr_s.make_fragment_C(s_shape).layout, a_vals),
                    self.dtype)
            for s in cutlass.range_constexpr(self.sub):
                q0 = m_block * bn + s * bm
                # s_ahead: the first step's dK GEMM may be in flight at this step's start
                early = self.s_ahead and s > 0
                run = q0 < seqlen_q
                if cutlass.const_expr(self.s_ahead and s == 0):
                    # a static step: the first step's dK GEMM is in flight at its end, and
                    # ptxas serializes every wgmma where a GEMM is in flight across the
                    # end of a branch region that it was issued in
                    run = True
                if run:
                    stg = q_stg if self.q_probe else pipe_q.stage(c)
                    buf = c % self.ds_bufs
                    # whether the step needs the select: keys past the valid count, or
                    # (causal) a key past some query's diagonal: key r is visible from
                    # the query columns c >= qlo0 + r
                    qlo0 = Int32(0)
                    masked = limit < bn
                    if cutlass.const_expr(self.causal):
                        if cutlass.const_expr(self.pack > 1):
                            # packed rows: column c is position q0 / r + c // r (q0 a
                            # multiple of 64, so of r)
                            qlo0 = (n0 - (seqlen_k - seqlen_q // self.pack)
                                    - q0 // self.pack)
                        else:
                            qlo0 = n0 - (seqlen_k - seqlen_q) - q0
                        masked = (limit < bn) | (qlo0 + bn - 1 > 0)
                    acc_S = thr_s.make_fragment_C(s_shape)
                    acc_dP = thr_s.make_fragment_C(s_shape)
                    # stamps: before the wait for the step's Q / dO stage
                    self._stamp(tv, 16)
                    if cutlass.const_expr(self.q_probe):
                        if q_ready == 0:
                            pipe_q.consumer_wait(c)
                    else:
                        pipe_q.consumer_wait(c)
                    if cutlass.const_expr(len(self.stamps) > 0):
                        # the end of the previous step
                        tv[14] = tv[13]
                    self._stamp(tv, 0)
                    # per-query (column) lse, read before the GEMMs are issued and
                    # brought to the log2 domain after the S^T GEMM's wait
                    lse2 = cute.make_rmem_tensor(n_cols, Float32)
                    if cutlass.const_expr(self.lse_early):
                        for cc in cutlass.range_constexpr(n_cols):
                            lse2[cc] = sLD[tScS[0, cc][1], 0, stg]
                    mma_s = kvb.issue_s_dp(mma_s, acc_S, acc_dP, tSrK, tSrV, tSrQ, tSrdO,
                                           stg)
                    self._stamp(tv, 1)
                    if cutlass.const_expr(self.dk_lag):
                        # the previous step's dK GEMM: a third group in every step, empty in
                        # the block's first (each branch commits its own, so that ptxas
                        # closes the dK group at its last wgmma)
                        if lag_on != 0:
                            warpgroup.fence()
                            kvb.issue_dk_ops(mma_kv, acc_dK, lag_dS, tKrQ, pipe_q.stage(lag_c))
                            warpgroup.commit_group()
                        else:
                            warpgroup.commit_group()
                    if cutlass.const_expr(not self.lse_early):
                        # read under the GEMMs
                        for cc in cutlass.range_constexpr(n_cols):
                            lse2[cc] = sLD[tScS[0, cc][1], 0, stg]
                            if cutlass.const_expr(not self.ld_scaled):
                                lse2[cc] = lse2[cc] * LOG2_E
                    S_mn = acc_mn_view_wg(acc_S)
                    dP_mn = acc_mn_view_wg(acc_dP)
                    warpgroup.wait_group(2 if self.dk_lag else 1)
                    self._stamp(tv, 2)
                    if cutlass.const_expr(early):
                        # the wait covered the first step's dK GEMM: its dS^T registers and
                        # its Q / dO stage are free
                        kvb.keep_regs(tdS0)
                        pipe_q.consumer_release(c - 1)
                    if cutlass.const_expr(self.lse_early and not self.ld_scaled):
                        for cc in cutlass.range_constexpr(n_cols):
                            lse2[cc] = lse2[cc] * LOG2_E
                    # P^T while the dP^T GEMM runs
                    for r in cutlass.range_constexpr(n_rows):
                        for cc in cutlass.range_constexpr(n_cols):
                            if cutlass.const_expr(cc % 8 < self.ex2_emu):
                                # off the MUFU unit, which both warpgroups' P^T share
                                S_mn[r, cc] = exp2_poly3(S_mn[r, cc] * scale_log2 - lse2[cc])
                            else:
                                S_mn[r, cc] = cute.math.exp2(
                                    S_mn[r, cc] * scale_log2 - lse2[cc], fastmath=True)
                    self._stamp(tv, 3)
                    dlt = cute.make_rmem_tensor(n_cols, Float32)
                    for cc in cutlass.range_constexpr(n_cols):
                        dlt[cc] = sLD[tScS[0, cc][1], 1, stg]
                    tP = cute.make_rmem_tensor(acc_layout_as_a(acc_S.layout, a_vals),
                                               self.dtype)
                    if cutlass.const_expr(self.split_wait):
                        # P^T masked and converted before the dP^T wait; the step's Q / dO
                        # stage is still held, so this check of its full barrier passes at
                        # once, and its wait loop ends the basic block: ptxas keeps the
                        # wait below P^T instead of hoisting it above the exp2s
                        if masked:
                            self._mask_p_ds(S_mn, None, tScS, limit, qlo0)
                        cute.make_tensor(tP.iterator, acc_S.layout).store(
                            acc_S.load().to(self.dtype))
                        pipe_q.consumer_wait(c)
                    warpgroup.wait_group(1 if self.dk_lag else 0)
                    self._stamp(tv, 4)
                    for r in cutlass.range_constexpr(n_rows):
                        for cc in cutlass.range_constexpr(n_cols):
                            if cutlass.const_expr(self.ld_scaled):
                                dP_mn[r, cc] = S_mn[r, cc] * (dP_mn[r, cc] * softmax_scale
                                                              - dlt[cc])
                            else:
                                dP_mn[r, cc] = ((S_mn[r, cc] * softmax_scale)
                                                * (dP_mn[r, cc] - dlt[cc]))
                    if masked:
                        # keys past the block's valid count (causal: or past a query's
                        # diagonal): select, never multiply (their dP^T may be NaN)
                        if cutlass.const_expr(self.split_wait):
                            for r in cutlass.range_constexpr(n_rows):
                                kr = tScS[r, 0][0]
                                key_ok = kr < limit
                                for cc in cutlass.range_constexpr(n_cols):
                                    ok = key_ok
                                    if cutlass.const_expr(self.causal and self.pack > 1):
                                        ok = key_ok & (
                                            tScS[0, cc][1] // self.pack >= qlo0 + kr)
                                    elif cutlass.const_expr(self.causal):
                                        ok = key_ok & (tScS[0, cc][1] >= qlo0 + kr)
                                    dP_mn[r, cc] = dP_mn[r, cc] if ok else Float32(0.0)
                        else:
                            self._mask_p_ds(S_mn, dP_mn, tScS, limit, qlo0)
                    if cutlass.const_expr(not self.split_wait):
                        cute.make_tensor(tP.iterator, acc_S.layout).store(
                            acc_S.load().to(self.dtype))
                    tdS = tdS0
                    if cutlass.const_expr(not (self.s_ahead and s == 0)):
                        tdS = cute.make_rmem_tensor(acc_layout_as_a(acc_dP.layout, a_vals),
                                                    self.dtype)
                    tdS_acc = cute.make_tensor(tdS.iterator, acc_dP.layout)
                    tdS_acc.store(acc_dP.load().to(self.dtype))
                    if cutlass.const_expr(self.s_ahead and s == 0):
                        # dS^T as values of their own (not recomputed from the accumulator
                        # at the keep after the second step's S^T wait)
                        kvb.keep_regs(tdS)
                    if cutlass.const_expr(self.dq_lag):
                        # buffer `buf` is free: warpgroup 0, once warpgroup 1 stored its
                        # previous half (it read this buffer two steps back before that);
                        # warpgroup 1, once warpgroup 0 stored this step's half (its late dQ
                        # GEMM of two steps back, which read this buffer, completed before)
                        if wg == 0:
                            if c > 0:
                                cute.arch.barrier(barrier_id=6, number_of_threads=256)
                        else:
                            cute.arch.barrier(barrier_id=1, number_of_threads=256)
                    # dS^T -> smem buffer `buf` (stmatrix: rows of 8 consecutive queries)
                    cute.copy(r2s_dS, r2s_dS.retile(tdS_acc), tdSsdS[None, None, None, buf])
                    self._stamp(tv, 5)

                    # dV += P^T dO (registers x smem) while the dS^T halves are published
                    kvb.issue_dv(mma_kv, acc_dV, tP, tVrdO, stg)
                    # every warp's dS^T rows are in smem (generic -> async proxy)
                    cute.arch.fence_proxy("async.shared", space="cta")
                    self._stamp(tv, 6)
                    if cutlass.const_expr(self.dq_alt):
                        mma_dq = self._alt_step(mma_kv, mma_dq, acc_dK, tdS, tKrQ, tP,
                                                tQrdS, tQrK, thr_dq, st, stg, buf, c, wg,
                                                warp)
                    else:
                        if cutlass.const_expr(self.decouple):
                            cute.arch.barrier(barrier_id=1 + wg, number_of_threads=128)
                        elif cutlass.const_expr(self.dq_lag):
                            # the other warpgroup may go on; warpgroup 1's own warps' halves
                            # are in smem before its dQ GEMM reads them (barrier 9: warpgroup
                            # 1's own, as in the epilogue's kv_major_bwd.store_dk_dv_smem)
                            if wg == 0:
                                cute.arch.barrier_arrive(barrier_id=1, number_of_threads=256)
                            else:
                                cute.arch.barrier_arrive(barrier_id=6, number_of_threads=256)
                                cute.arch.barrier(barrier_id=9, number_of_threads=128)
                        else:
                            cute.arch.barrier(barrier_id=1, number_of_threads=128 * nwg)
                        self._stamp(tv, 7)
                        # dQ = dS K, then dK += dS^T Q (its own group: the dQ reductions below
                        # are issued while it runs)
                        acc_dQ = thr_dq.make_fragment_C(thr_dq.partition_shape_C((bm, d)))
                        if cutlass.const_expr(self.decouple):
                            kb = cute.size(tQrdS, mode=[2]) // 2  # k16 blocks per warpgroup
                            if wg == 0:
                                mma_dq = kvb.issue_dq_dk(mma_dq, mma_kv, acc_dQ, acc_dK, tQrdS,
                                                         tQrK, tdS, tKrQ, buf, stg, (0, kb))
                            else:
                                mma_dq = kvb.issue_dq_dk(mma_dq, mma_kv, acc_dQ, acc_dK, tQrdS,
                                                         tQrK, tdS, tKrQ, buf, stg,
                                                         (kb, 2 * kb))
                        elif cutlass.const_expr(self.dq_late):
                            kvb.issue_dk(mma_kv, acc_dK, tdS, tKrQ, stg)
                            warpgroup.wait_group(0)
                            kvb.keep_regs(tP, tdS)
                            mma_dq = kvb.issue_dq(mma_dq, acc_dQ, tQrdS, tQrK, buf)
                        elif cutlass.const_expr(self.dv_wait):
                            mma_dq = kvb.issue_dq(mma_dq, acc_dQ, tQrdS, tQrK, buf)
                            # in flight: dV, dQ; dK once dV has completed
                            warpgroup.wait_group(1)
                            kvb.issue_dk(mma_kv, acc_dK, tdS, tKrQ, stg)
                        elif cutlass.const_expr(self.dk_lag):
                            mma_dq = kvb.issue_dq(mma_dq, acc_dQ, tQrdS, tQrK, buf)
                        elif cutlass.const_expr(self.dq_lag):
                            # warpgroup 0: the previous step's dQ half (the other buffer; in
                            # the block's first step a product of whatever that buffer holds,
                            # never staged)
                            mma_dq = kvb.issue_dq_dk(mma_dq, mma_kv, acc_dQ, acc_dK, tQrdS,
                                                     tQrK, tdS, tKrQ, (c + 1 + wg) % 2, stg)
                        else:
                            mma_dq = kvb.issue_dq_dk(mma_dq, mma_kv, acc_dQ, acc_dK, tQrdS,
                                                     tQrK, tdS, tKrQ, buf, stg)
                        self._stamp(tv, 8)
                        if cutlass.const_expr(self.dk_lag):
                            # the previous step's dK, this step's dV and dQ have completed:
                            # its Q / dO stage goes back to the producer, this step's dS^T
                            # waits for the next step
                            warpgroup.wait_group(0)
                            kvb.keep_regs(lag_dS)
                            if lag_on != 0:
                                pipe_q.consumer_release(lag_c)
                            lag_dS.store(tdS.load())
                            lag_c = c
                            lag_on = Int32(1)
                        else:
                            warpgroup.wait_group(1)
                        self._stamp(tv, 9)

                        if cutlass.const_expr(self.dq_tile):
                            # the warp's slice (rows 16 rg .., the warpgroup's columns) in
                            # register order to the staging tile, then one bulk reduction
                            # per block into query tile q0 / 64 (rows past S_q: zeros)
                            t_lane = cute.arch.lane_idx()
                            t_rg = (warp - 4) % 4
                            t_cols = d // nwg
                            t_cg0 = wg * (t_cols // self.dq_w)
                            t_half = 2 * d // self.dq_w  # blocks per staging buffer (alias)
                            sdQ = None
                            sdQ2 = None
                            if cutlass.const_expr(self.dq_alias):
                                # stage this step's slices in its Q and dO tiles once every
                                # consumer warp's GEMMs have read them
                                warpgroup.wait_group(0)
                                cute.arch.barrier(barrier_id=4, number_of_threads=128 * nwg)
                                sdQ, sdQ2 = kvb.stage_as_f32(st, stg, bm, d)
                            else:
                                sdQ = st.sdQ.data_ptr()
                                if cutlass.const_expr(not self.writer):
                                    # the previous step's bulk reads of this warp's blocks
                                    # are done
                                    if t_lane == 0:
                                        cute.arch.cp_async_bulk_wait_group(0, read=True)
                                    cute.arch.sync_warp()
                            if cutlass.const_expr(self.dq_lag):
                                # the writer warp is done with this warpgroup's half of the
                                # previous staged tile (warpgroup 0 stages one step late)
                                if c > 1 - wg:
                                    kvb.wg_bar(wg, 5, 10, False)
                                self._stamp(tv, 10)
                            elif cutlass.const_expr(self.wg_hand):
                                # the writer warp is done with this warpgroup's half of the
                                # previous step's staged tile
                                if c > 0:
                                    kvb.wg_bar(wg, 5, 10, False)
                                self._stamp(tv, 10)
                            elif cutlass.const_expr(self.writer):
                                # the writer warp is done with the previous step's staged
                                # tile (its buffer, or its Q / dO stage)
                                if c > 0:
                                    cute.arch.barrier(barrier_id=5,
                                                      number_of_threads=128 * nwg + 32)
                            if cutlass.const_expr(self.dq_fixed and self.dq_lag):
                                # warpgroup 0 converts the previous step's half: that step's
                                # multipliers and flag words, kept in registers (its stage
                                # is handed back); both keep this step's for the next
                                fx_r = 16 * t_rg + t_lane // 4
                                fx_m0 = sLD[fx_r, 2, stg]
                                fx_m1 = sLD[fx_r + 8, 2, stg]
                                fx_tile = m_block * self.sub + s
                                fx_head = head
                                if wg == 0:
                                    fx_m0 = lag_m0
                                    fx_m1 = lag_m1
                                    fx_tile = lag_tile
                                    fx_head = lag_head
                                lag_m0 = sLD[fx_r, 2, stg]
                                lag_m1 = sLD[fx_r + 8, 2, stg]
                                lag_tile = m_block * self.sub + s
                                lag_head = head
                                if (wg == 1) | (c > 0):
                                    fixed_point_slice(
                                        acc_dQ, [fx_m0, fx_m1], t_lane, t_rg,
                                        elem_ptr(mdQFlags, (batch, fx_head, fx_tile, 0)),
                                        self.fix_emu)
                            elif cutlass.const_expr(self.dq_fixed):
                                # the multipliers of this thread's two rows (16 rg + lane // 4
                                # and 8 below), loaded with the stage's lse / delta
                                fx_r = 16 * t_rg + t_lane // 4
                                fx_mult = [sLD[fx_r + 8 * h, 2, stg] for h in range(2)]
                                fixed_point_slice(
                                    acc_dQ, fx_mult, t_lane, t_rg,
                                    elem_ptr(mdQFlags, (batch, head, m_block * self.sub + s,
                                                        0)), self.fix_emu)
                            if cutlass.const_expr(self.dq_lag):
                                # (warpgroup 0 stages nothing in the block's first step)
                                if (wg == 1) | (c > 0):
                                    stage_warp_slice(acc_dQ, sdQ, t_lane, t_rg, t_cg0, 4,
                                                     self.dq_w, sbase2=sdQ2, half=t_half)
                            else:
                                stage_warp_slice(acc_dQ, sdQ, t_lane, t_rg, t_cg0, 4,
                                                 self.dq_w, sbase2=sdQ2, half=t_half)
                            if cutlass.const_expr(self.q_probe):
                                # the next step's stage, tested while the stores drain
                                q_stg = pipe_q.stage(c + 1)
                                q_ready = Int32(pipe_q.consumer_test(c + 1))
                            if cutlass.const_expr(self.ent_ahead and s == 0):
                                # the next entry (loaded at this entry's start)
                                h_nx, m_nx, lim_nx = self._split_entry(
                                    ent_nxt, q_div, n_q_blocks, mSizes, batch, head_kv,
                                    group, n_block, kv_left)
                            cute.arch.fence_proxy("async.shared", space="cta")
                            cute.arch.sync_warp()
                            if cutlass.const_expr(self.dq_lag):
                                if (wg == 1) | (c > 0):
                                    kvb.wg_bar(wg, 2, 11, True)
                                self._stamp(tv, 11)
                            elif cutlass.const_expr(self.wg_hand):
                                # this warpgroup's half is staged: the writer adds it
                                kvb.wg_bar(wg, 2, 11, True)
                                self._stamp(tv, 11)
                            elif cutlass.const_expr(self.writer):
                                # the writer warp waits for its turn and adds the tile
                                cute.arch.barrier_arrive(barrier_id=2,
                                                         number_of_threads=128 * nwg + 32)
                            elif cutlass.const_expr(self.deterministic):
                                # warp 1: the lower KV blocks' additions to this tile are done
                                cute.arch.barrier(barrier_id=2,
                                                  number_of_threads=128 * nwg + 32)
                            if cutlass.const_expr(not self.writer):
                                if t_lane == 0:
                                    bulk_add_warp_slice(
                                        elem_ptr(mdQacc, (batch, head, m_block * self.sub + s,
                                                          0)),
                                        sdQ, t_rg, t_cg0, t_cols // self.dq_w, 4, self.dq_w,
                                        sbase2=sdQ2, half=t_half)
                                    cute.arch.cp_async_bulk_commit_group()
                                    if cutlass.const_expr(self.deterministic):
                                        # the addition is complete before warp 1 publishes
                                        cute.arch.cp_async_bulk_wait_group(0, read=False)
                                    elif cutlass.const_expr(self.dq_alias):
                                        # the stage is released after the bulk reads of it
                                        cute.arch.cp_async_bulk_wait_group(0, read=True)
                                if cutlass.const_expr(self.deterministic or self.dq_alias):
                                    cute.arch.sync_warp()
                                if cutlass.const_expr(self.deterministic):
                                    cute.arch.barrier_arrive(barrier_id=3,
                                                             number_of_threads=128 * nwg + 32)
                        else:
                            # dQ rows < S_q -> fp32 workspace (values 2k, 2k + 1: adjacent
                            # columns)
                            gdQ = cute.local_tile(mdQacc[batch, None, head, None], (bm, d),
                                                  (m_block * self.sub + s, 0))
                            tdQg = thr_dq.partition_C(gdQ)
                            if cutlass.const_expr(self.deterministic):
                                # warp 1: the lower KV blocks' additions to this tile are done
                                cute.arch.barrier(barrier_id=2, number_of_threads=128 * nwg + 32)
                            if cutlass.const_expr(self.red_v4):
                                kvb.red_add_rows_v4(acc_dQ, tdQg, tdQc, seqlen_q - q0)
                            else:
                                kvb.red_add_rows(acc_dQ, tdQg, tdQc, seqlen_q - q0)
                            if cutlass.const_expr(self.deterministic):
                                cute.arch.barrier_arrive(barrier_id=3,
                                                         number_of_threads=128 * nwg + 32)
                        ahead = self.s_ahead and s + 1 < self.sub
                        if cutlass.const_expr(ahead):
                            # dV has completed (the wait for dQ); dK may still run into the
                            # second step
                            kvb.keep_regs(tP)
                        elif cutlass.const_expr(not self.dk_lag):
                            # (dk_lag: every GEMM of the step has completed above)
                            warpgroup.wait_group(0)
                        self._stamp(tv, 12)
                        if cutlass.const_expr(not self.dq_late and not self.dk_lag
                                              and not ahead):
                            # (dq_late: kept once the dV / dK GEMMs completed, before dQ)
                            kvb.keep_regs(tP, tdS)
                    if cutlass.const_expr(not (self.writer and self.dq_alias)
                                          and not self.dk_lag
                                          and not (self.s_ahead and s + 1 < self.sub)):
                        # (the writer with dq_alias: the writer warp releases the stage
                        # that holds the staged dQ slices; dk_lag: the next step releases it)
                        pipe_q.consumer_release(c)
                    self._stamp(tv, 13)
                    self._keep_stamps(tv, tkeep, c)
                    c += 1
                if cutlass.const_expr(self.ent_ahead and s == 0):
                    if q0 >= seqlen_q:
                        # (a listed block's first rows are below S_q: not reached)
                        h_nx, m_nx, lim_nx = self._split_entry(
                            ent_nxt, q_div, n_q_blocks, mSizes, batch, head_kv, group,
                            n_block, kv_left)
                if cutlass.const_expr(early):
                    # (after the second step a no-op) without a second step: the first
                    # step's dK GEMM completes, then its stage goes back. The wait is outside
                    # the branch, so that no path leaves the entry with a GEMM in flight
                    warpgroup.wait_group(0)
                    if q0 >= seqlen_q:
                        kvb.keep_regs(tdS0)
                        pipe_q.consumer_release(c - 1)
        if cutlass.const_expr(self.dq_lag):
            if wg == 0:
                if c > 0:
                    # warpgroup 0's half of the last step's dQ, once warpgroup 1 stored its
                    # dS^T half of that step
                    cute.arch.barrier(barrier_id=6, number_of_threads=256)
                    acc_dQ = thr_dq.make_fragment_C(thr_dq.partition_shape_C((bm, d)))
                    mma_dq = kvb.issue_dq(mma_dq, acc_dQ, tQrdS, tQrK, (c + 1) % 2)
                    warpgroup.wait_group(0)
                    t_lane = cute.arch.lane_idx()
                    t_rg = (warp - 4) % 4
                    if cutlass.const_expr(self.dq_fixed):
                        fixed_point_slice(acc_dQ, [lag_m0, lag_m1], t_lane, t_rg,
                                          elem_ptr(mdQFlags, (batch, lag_head, lag_tile, 0)),
                                          self.fix_emu)
                    if c > 1:
                        kvb.wg_bar(wg, 5, 10, False)
                    stage_warp_slice(acc_dQ, st.sdQ.data_ptr(), t_lane, t_rg, 0, 4, self.dq_w,
                                     sbase2=None, half=2 * d // self.dq_w)
                    cute.arch.fence_proxy("async.shared", space="cta")
                    cute.arch.sync_warp()
                    kvb.wg_bar(wg, 2, 11, True)
        if cutlass.const_expr(self.dk_lag):
            # the block's last dK GEMM, then its stage
            if lag_on != 0:
                warpgroup.fence()
                kvb.issue_dk_ops(mma_kv, acc_dK, lag_dS, tKrQ, pipe_q.stage(lag_c))
                warpgroup.commit_group()
                warpgroup.wait_group(0)
                kvb.keep_regs(lag_dS)
                pipe_q.consumer_release(lag_c)
        return c

    @cute.jit
    def _epilogue(self, ectx, n0, kv_left, batch, head_kv, j):
        """Consumer warpgroups: dK (softmax_scale already in dS^T) and dV to the key rows ``<
        S_kv`` of the block at ``n0``. Persistent: the K / V tiles go back to the producer
        (item ``j``) once no warp reads them any more."""
        acc_dK, acc_dV, thr_kv, ctid, mdK, mdV, st, pipe_kv = ectx
        bn, d, nwg = self.bn, self.d, self.num_wg
        if cutlass.const_expr(self.epi_smem):
            # every consumer warpgroup's last GEMMs (dK read the Q stage, dQ the dS tile)
            # and dQ bulk reads are done: the Q / dO stages and the dS tiles (contiguous)
            # take the two (bn, D + 8) staging tiles; persistent: the K / V tiles and the dS
            # tiles (contiguous), since the Q / dO ring holds the next item's first stages
            cute.arch.barrier(barrier_id=7, number_of_threads=128 * nwg)
            s_epi = st.sQ.data_ptr()
            if cutlass.const_expr(self.persist):
                s_epi = st.sK.data_ptr()
            kvb.store_dk_dv_smem(acc_dK, acc_dV, thr_kv, bn, d, s_epi,
                                 s_epi + bn * (d + 8), ctid,
                                 offset_rows(mdK[batch, None, head_kv, None], n0),
                                 offset_rows(mdV[batch, None, head_kv, None], n0), kv_left,
                                 None, self.dtype)
            if cutlass.const_expr(self.persist):
                # this warp's generic accesses of the tiles precede the next item's TMA
                # writes into them
                cute.arch.fence_proxy("async.shared", space="cta")
                cute.arch.sync_warp()
                pipe_kv.consumer_release(j)
        else:
            if cutlass.const_expr(self.persist):
                # this warp's last GEMMs have read K / V
                pipe_kv.consumer_release(j)
            kvb.store_dk_dv(acc_dK, acc_dV, thr_kv, bn, d,
                            offset_rows(mdK[batch, None, head_kv, None], n0),
                            offset_rows(mdV[batch, None, head_kv, None], n0), kv_left,
                            None, self.dtype, self.epi_pairs)

    @cute.jit
    def _bucket_sum(self, acc_dK, acc_dV, mPart, mCount, st, ctid, row_id, used, slot, first,
                    nb, n_pairs):
        """``buckets``, consumer warps: whether this CTA stores the row's dK / dV. An unused
        item stores nothing; an unsplit row's item its own accumulators. A bucket of a split
        row stores its accumulators to its slot of ``mPart`` (fp32 ``(slots, 2 bn D)``,
        value ``e`` of consumer thread ``t`` at ``e T + t``, dV after dK), and the bucket that
        brings the row's counter (``mCount[2 P + row]``, zeroed) to ``nb`` sums the row's
        ``nb`` slots in bucket order into its accumulators (whichever bucket that is, the
        same additions in the same order) and stores them."""
        nthr = 128 * self.num_wg
        n_v = cute.size(acc_dK)
        keep = Int32(used)
        if used != 0:
            if nb > 1:
                for e in cutlass.range_constexpr(n_v):
                    mPart[slot, e * nthr + ctid] = acc_dK[e]
                    mPart[slot, (n_v + e) * nthr + ctid] = acc_dV[e]
                fence_acq_rel_gpu()
                cute.arch.barrier(barrier_id=7, number_of_threads=nthr)
                if ctid == 0:
                    done = atom_add_acq_rel_s32(elem_ptr(mCount, (2 * n_pairs + row_id,)), 1)
                    st_shared_s32(st.sFlag.data_ptr(), done)
                cute.arch.barrier(barrier_id=7, number_of_threads=nthr)
                keep = Int32(ld_shared_s32(st.sFlag.data_ptr()) == nb - 1)
                if keep != 0:
                    fence_acq_rel_gpu()
                    acc_dK.fill(0.0)
                    acc_dV.fill(0.0)
                    for b in cutlass.range(nb, unroll=1):
                        for e in cutlass.range_constexpr(n_v):
                            acc_dK[e] = acc_dK[e] + ld_relaxed_f32(
                                elem_ptr(mPart, (first + b, e * nthr + ctid)))
                            acc_dV[e] = acc_dV[e] + ld_relaxed_f32(
                                elem_ptr(mPart, (first + b, (n_v + e) * nthr + ctid)))
        return keep

    @cute.jit
    def _row_info(self, mOffsets, row_id, n_kv_blocks, num_heads_kv):
        """Persistent: ``(n_block, head_kv, batch, e_begin, n_ent)`` of K->Q row ``row_id``."""
        n_block = row_id % n_kv_blocks
        head_kv = (row_id // n_kv_blocks) % num_heads_kv
        batch = row_id // (n_kv_blocks * num_heads_kv)
        e_begin = Int32(mOffsets[row_id])
        n_ent = Int32(mOffsets[row_id + 1]) - e_begin
        return n_block, head_kv, batch, e_begin, n_ent

    @cute.kernel
    def kernel(self, tma_q, tma_tQ, tma_do, tma_tdO, tma_k, tma_tK, tma_v, tma_tV,
               mQ, mK, mV, mLSE, mDelta, mOffsets, mEntries, mSizes, mScale, mdQacc, mdK, mdV,
               mRank, mdQSem, mProgress, mdQMult, mdQFlags, mPart, sK_layout, sK_mn_layout,
               sQ_layout, sQ_mn_layout, sdS_layout, mma_s, mma_kv, mma_dq,
               Smem: cutlass.Constexpr):
        tidx, _, _ = cute.arch.thread_idx()
        n_block, head_kv, batch = cute.arch.block_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg_idx = warp // 4
        bm, bn, d, nwg = self.bm, self.bn, self.d, self.num_wg
        seqlen_q = mQ.shape[1]
        seqlen_k = mK.shape[1]
        num_heads_kv = mK.shape[2]
        group = mQ.shape[2] // num_heads_kv
        if cutlass.const_expr(self.pack > 1):
            # one KV head's S_q r packed rows; entries are packed block ids
            seqlen_q = seqlen_q * self.pack
            group = 1
        n_q_blocks = (seqlen_q + bn - 1) // bn
        n_kv_blocks = (seqlen_k + bn - 1) // bn
        row_id = (batch * num_heads_kv + head_kv) * n_kv_blocks + n_block
        n_csr_rows = mK.shape[0] * num_heads_kv * n_kv_blocks
        if cutlass.const_expr(self.pdl and (self.stream_after_pre or not self.order_stream)):
            # programmatic dependent launch: no global memory access before the previous
            # grid has completed and flushed its writes
            cute.arch.griddepcontrol_wait()
        if cutlass.const_expr(self.tail_conv):
            # the dq reordering (the next grid) may launch once every CTA of this grid has
            # started: its CTAs take the SMs the last wave leaves free, each waiting for its
            # pair's count (its last CTA also for this grid, at its end)
            cute.arch.griddepcontrol_launch_dependents()
        e_begin = Int32(0)
        n_ent = Int32(0)
        it_used = Int32(1)
        it_slot = Int32(-1)
        it_first = Int32(-1)
        it_nb = Int32(1)
        if cutlass.const_expr(self.buckets):
            # work item n_block of the pair (6 int32 after the R + 1 offsets): its row (-1:
            # unused: block 0's row with no entries, no dK / dV stores), entries, slots
            n_items = cute.arch.grid_dim()[0]
            base = n_csr_rows + 1 + ((batch * num_heads_kv + head_kv) * n_items + n_block) * 6
            it_row = Int32(mOffsets[base])
            e_begin = Int32(mOffsets[base + 1])
            n_ent = Int32(mOffsets[base + 2])
            it_slot = Int32(mOffsets[base + 3])
            it_first = Int32(mOffsets[base + 4])
            it_nb = Int32(mOffsets[base + 5])
            it_used = Int32(it_row >= 0)
            row_id = (batch * num_heads_kv + head_kv) * n_kv_blocks
            if it_row >= 0:
                row_id = it_row
            n_block = row_id % n_kv_blocks
        elif cutlass.const_expr(not self.persist):
            if cutlass.const_expr(self.lpt):
                # CTA `row_id` (in launch order) takes the row_id-th longest K->Q list: the
                # order follows the R + 1 offsets
                row_id = Int32(mOffsets[n_csr_rows + 1 + row_id])
                n_block = row_id % n_kv_blocks
                head_kv = (row_id // n_kv_blocks) % num_heads_kv
                batch = row_id // (n_kv_blocks * num_heads_kv)
            e_begin = Int32(mOffsets[row_id])
            n_ent = Int32(mOffsets[row_id + 1]) - e_begin
        n0 = n_block * bn
        kv_left = seqlen_k - n0

        smem = cutlass.memory.SmemAllocator()
        st = smem.allocate(Smem)
        mbar = st.mbar.data_ptr()
        pipe_q = SmemPipeline(mbar, self.q_stages, 4 * nwg)
        pipe_kv = SmemPipeline(mbar + SmemPipeline.num_barriers(self.q_stages), 1, 4 * nwg)
        pipe_it = None
        slots = None
        if cutlass.const_expr(self.persist):
            # the work items: a ring of two, read by the consumer warps and the writer warp;
            # its int32 slots (8 bytes each) follow its barriers
            it0 = mbar + SmemPipeline.num_barriers(self.q_stages) + SmemPipeline.num_barriers(1)
            pipe_it = SmemPipeline(it0, 2, 4 * nwg + 1)
            slots = it0 + SmemPipeline.num_barriers(2)
        if warp == 0:
            pipe_q.init()
            pipe_kv.init()
            if cutlass.const_expr(self.persist):
                pipe_it.init()
            cpasync.prefetch_descriptor(tma_q)
            cpasync.prefetch_descriptor(tma_do)
            cpasync.prefetch_descriptor(tma_k)
            cpasync.prefetch_descriptor(tma_v)
        cute.arch.mbarrier_init_fence()
        cute.arch.barrier()

        # (bn, D, 1), (bm, D, stages), (bm, bn, bufs); MN-major aliases (D, bn, 1), (D, bm, stages)
        sdS_field = None
        if cutlass.const_expr(self.persist):
            # the dS tiles right after K / V (the persistent epilogue's staging room)
            sdS_field = st.sdSp
        sK, sV, sQ, sdO, sdS, sK_mn, sQ_mn, sdO_mn = kvb.smem_views(
            st, sK_layout, sK_mn_layout, sQ_layout, sQ_mn_layout, sdS_layout, sdS_field)
        # per-stage lse (natural log) and delta of the step's bm query rows: (row, kind, stage)
        sLD = st.sLD.get_tensor(cute.make_layout((bm, self.ld_kinds, self.q_stages),
                                                 stride=(1, bm, self.ld_kinds * bm)))
        kvctx = (tma_k, tma_tK, tma_v, tma_tV, sK, sV, sK_layout, pipe_kv, mK, mV)

        if wg_idx == 0:
            # ================================ producer ================================
            cute.arch.setmaxregister_decrease(self.regs_producer)
            if warp == 0:
                pctx = (tma_q, tma_tQ, tma_do, tma_tdO, sQ, sdO, sQ_layout, sLD, pipe_q, pipe_kv,
                        mLSE, mDelta, mEntries, mSizes, mProgress, seqlen_q, seqlen_k, group,
                        n_q_blocks, mdQMult)
                if cutlass.const_expr(self.persist):
                    # work items in order (lpt: the order's), dealt dynamically: item
                    # block_idx.x first, then one atomic add per item on the counter after
                    # the pairs' (mdQSem[2 P]); -1 ends the walk
                    lane = cute.arch.lane_idx()
                    counter = elem_ptr(mdQSem, (2 * mK.shape[0] * num_heads_kv,))
                    bid, _, _ = cute.arch.block_idx()
                    item = Int32(bid)
                    j = Int32(0)
                    c = Int32(0)
                    while item < n_csr_rows:
                        row_id = item
                        if cutlass.const_expr(self.lpt):
                            row_id = Int32(mOffsets[n_csr_rows + 1 + item])
                        n_block, head_kv, batch, e_begin, n_ent = self._row_info(
                            mOffsets, row_id, n_kv_blocks, num_heads_kv)
                        publish_item(pipe_it, slots, j, row_id)
                        c = self._produce(pctx, kvctx, n_block, head_kv, batch, row_id,
                                          e_begin, n_ent, seqlen_k - n_block * bn, j, c)
                        # taken once this item's loads are issued, so the CTAs that finish
                        # first take the next items
                        item = fetch_item(counter, lane)
                        if cutlass.const_expr(self.persist_kv_l2):
                            # the next item's K / V towards L2 while this one ends (its K / V
                            # load waits for this item's epilogue)
                            if item < n_csr_rows:
                                nrow = item
                                if cutlass.const_expr(self.lpt):
                                    nrow = Int32(mOffsets[n_csr_rows + 1 + item])
                                self._prefetch_kv(kvctx, nrow % n_kv_blocks,
                                                  (nrow // n_kv_blocks) % num_heads_kv,
                                                  nrow // (n_kv_blocks * num_heads_kv))
                        j += 1
                    publish_item(pipe_it, slots, j, Int32(-1))
                else:
                    self._produce(pctx, kvctx, n_block, head_kv, batch, row_id, e_begin, n_ent,
                                  kv_left, 0, Int32(0))
            if cutlass.const_expr(self.persist):
                if warp == 1:
                    j = Int32(0)
                    row_id = take_item(pipe_it, slots, j)
                    while row_id >= 0:
                        n_block, head_kv, batch, e_begin, n_ent = self._row_info(
                            mOffsets, row_id, n_kv_blocks, num_heads_kv)
                        self._dq_order_warp(mEntries, mRank, mdQSem, e_begin, n_ent, n_q_blocks,
                                            seqlen_q, head_kv, group, batch, mdQacc, st, pipe_q,
                                            mProgress, row_id)
                        self._count_done(mdQSem, batch, head_kv, num_heads_kv, mK.shape[0])
                        j += 1
                        row_id = take_item(pipe_it, slots, j)
            elif cutlass.const_expr(self.deterministic or self.dq_writer):
                if warp == 1:
                    if cutlass.const_expr(self.zero_lag > 0):
                        self._zero_ahead(mdQacc, mdQSem, batch, head_kv, num_heads_kv, group,
                                         n_block, n_kv_blocks)
                        self._zeroed_wait(mdQSem, batch, head_kv, num_heads_kv, n_kv_blocks)
                    self._dq_order_warp(mEntries, mRank, mdQSem, e_begin, n_ent, n_q_blocks,
                                        seqlen_q, head_kv, group, batch, mdQacc, st, pipe_q,
                                        mProgress, row_id)
                    if cutlass.const_expr(self.tail_conv):
                        self._count_done(mdQSem, batch, head_kv, num_heads_kv, mK.shape[0])
        else:
            # ================================ consumers ===============================
            cute.arch.setmaxregister_increase(self.regs_consumer)
            ctid = tidx - 128
            softmax_scale = Float32(mScale[0])
            scale_log2 = softmax_scale * LOG2_E

            ((thr_s, thr_kv, thr_dq), (tSrK, tSrV, tSrQ, tSrdO, tVrdO, tKrQ, tQrdS, tQrK),
             (acc_dK, acc_dV)) = kv_major_bwd_operands(
                mma_s, mma_kv, mma_dq, ctid, sK, sV, sQ, sdO, sQ_mn, sdO_mn, sdS, sK_mn, (bn, d),
                uniform_frags=self.uniform_frags)
            mma_kv.set(warpgroup.Field.ACCUMULATE, True)  # dV, dK accumulate
            tScS = acc_mn_view_wg(thr_s.partition_C(cute.make_identity_tensor((bn, bm))))
            n_rows = cute.size(tScS, mode=[0])  # keys of this thread
            n_cols = cute.size(tScS, mode=[1])  # queries of this thread
            if cutlass.const_expr(self.decouple or self.dq_alt):
                # one warpgroup's dQ tile (all of D; decouple: over its own 64 keys)
                thr_dq = mma_dq.get_slice(ctid % 128)
                f_dq = mma_dq.get_slice(0) if cutlass.const_expr(self.uniform_frags) else thr_dq
                tQrdS = f_dq.make_fragment_A(f_dq.partition_A(sdS))
                tQrK = f_dq.make_fragment_B(f_dq.partition_B(sK_mn))
            wg = ctid // 128
            if cutlass.const_expr(self.wg_uniform):
                wg = wg_idx - 1
            tdQc = thr_dq.partition_C(cute.make_identity_tensor((bm, d)))
            r2s_dS, tdSsdS = kvb.ds_store_copy(mma_s, sdS, bn, bm, self.ds_bufs, self.dtype,
                                               ctid)
            a_vals = mma_kv.tv_layout_A.shape[1]
            s_shape = thr_s.partition_shape_C((bn, bm))
            cctx = (mEntries, mSizes, mProgress, mdQacc, mma_s, mma_kv, mma_dq, thr_s, thr_dq,
                    tSrK, tSrV, tSrQ, tSrdO, tVrdO, tKrQ, tQrdS, tQrK, acc_dK, acc_dV, tScS,
                    n_rows, n_cols, tdQc, r2s_dS, tdSsdS, a_vals, s_shape, softmax_scale,
                    scale_log2, sLD, st, pipe_q, pipe_kv, wg, warp, seqlen_q, seqlen_k, group,
                    n_q_blocks, mdQMult, mdQFlags)
            ectx = (acc_dK, acc_dV, thr_kv, ctid, mdK, mdV, st, pipe_kv)
            c = Int32(0)
            if cutlass.const_expr(self.persist):
                j = Int32(0)
                row_id = take_item(pipe_it, slots, j)
                while row_id >= 0:
                    n_block, head_kv, batch, e_begin, n_ent = self._row_info(
                        mOffsets, row_id, n_kv_blocks, num_heads_kv)
                    n0 = n_block * bn
                    acc_dK.fill(0.0)
                    acc_dV.fill(0.0)
                    c = self._consume_steps(cctx, n_block, head_kv, batch, row_id, e_begin,
                                            n_ent, n0, seqlen_k - n0, j, c)
                    self._epilogue(ectx, n0, seqlen_k - n0, batch, head_kv, j)
                    j += 1
                    row_id = take_item(pipe_it, slots, j)
            else:
                tkeep = None
                tcta = None
                if cutlass.const_expr(len(self.stamps) > 0):
                    tkeep = cute.make_rmem_tensor(17, Int32)
                    tkeep[0] = Int32(0)
                    tcta = cute.make_rmem_tensor(4, Int32)
                    tcta[0] = clock_ordered()
                c = self._consume_steps(cctx, n_block, head_kv, batch, row_id, e_begin, n_ent,
                                        n0, kv_left, 0, c, tkeep)
                if cutlass.const_expr(len(self.stamps) > 0):
                    tcta[1] = clock_ordered()

            if cutlass.const_expr(self.dq_alt):
                # the writer warp's last hand-back, to the warpgroup that computed the last
                # step (the other one may get here before that warpgroup's sync of the
                # previous hand-back: it would take that one's place)
                if c > 0 and c % 2 != wg:
                    cute.arch.barrier(barrier_id=5, number_of_threads=128 + 32)
            elif cutlass.const_expr(self.wg_hand):
                # the writer warp's last hand-back of this warpgroup's half
                if c > 0:
                    kvb.wg_bar(wg, 5, 10, False)
            elif cutlass.const_expr(self.writer):
                # the writer warp's last hand-back (one per step)
                if c > 0:
                    cute.arch.barrier(barrier_id=5, number_of_threads=128 * nwg + 32)
            if cutlass.const_expr(self.dq_tile):
                cute.arch.cp_async_bulk_wait_group(0, read=False)  # smem outlives the reads
            if cutlass.const_expr(self.buckets):
                if self._bucket_sum(acc_dK, acc_dV, mPart, mdQSem, st, ctid, row_id, it_used,
                                    it_slot, it_first, it_nb, mK.shape[0] * num_heads_kv) != 0:
                    self._epilogue(ectx, n0, kv_left, batch, head_kv, 0)
            elif cutlass.const_expr(not self.persist):
                self._epilogue(ectx, n0, kv_left, batch, head_kv, 0)
                if cutlass.const_expr(len(self.stamps) > 0):
                    tcta[2] = clock_ordered()
                self._write_stamps(tkeep, tcta, wg, ctid, mdK, batch, n0, head_kv, kv_left, c)
        if cutlass.const_expr(self.pdl and self.order_stream and not self.stream_after_pre):
            # the order kernel (the previous grid) completes before this grid does, so the
            # next grid's wait for this one covers it too
            cute.arch.griddepcontrol_wait()


__all__ = ["BsaBwdSm90Ws"]
