"""Block-sparse attention forward for SM90 on the warp-specialized TMA + wgmma mainloop
(``impl="sm90ws"``).

Contract and semantics are those of :mod:`bsa_fwd_sm80` (tensor modes
``q, k, v, out: (B, S, H, D)`` in the caller's physical layout, ``q2k_block_index (B, H_q, N_q,
K_max)``, ``q2k_block_nums (B, H_q, N_q)``, optional ``block_sizes (B, H_q, N_kv)``, ``lse
(B, H_q, S_q)`` fp32 natural log). The TMA producer, pipelines, persistent loop, mainloop
and smem epilogue are those of ``attn_fwd_sm90_ws.AttnFwdSm90Ws`` (shared with the HSTU
forward :mod:`hstu_fwd_sm90_ws`, whose docstring describes them); this class supplies the
block-sparse variation points:

* KV tiles (``block_info.BlockList``): query block ``m`` visits the KV blocks listed in the
  active prefix of its row, one KV tile per listed block (``tile_n = sparse_block_size``); the
  producer reads the same list and TMA-loads only those K/V blocks. Counts are clamped to
  ``[0, K_max]`` and indices to ``[0, N_kv - 1]``.
* Loads: TMA boxes over ``(S, D, H, B)`` views of q / k / v (the batch is its own TMA mode, so
  a box that crosses ``S`` is zero-filled by the hardware and never reads the next batch).
  A V block with fewer valid keys than ``tile_n`` (``block_sizes``) is copied by the producer
  warp with cp.async, rows past the valid count zero-filled (``0 * NaN`` is NaN), fenced for
  the async proxy, then published with a plain arrival on the full barrier.
* Score plug point: key columns at or past the block's valid count become ``-inf``
  (``mask.KeyLimitMask``, a select), then the online softmax (``softmax.OnlineSoftmax``).
  ``causal`` (static): the valid count is also capped at the keys the query block's last row
  sees (``BlockList`` ``key_end``; the V rows past it are zero-filled), and a block that
  crosses the diagonal of a warpgroup's rows gets the per-row causal limit
  (``KeyLimitMask.apply_causal``); blocks at or below it need no mask, a block entirely above
  it is fully masked with zero V (it costs its GEMMs and contributes nothing). With
  ``pack_gqa`` a packed row's causal limit is that of its position (row // r).
  With ``overlap`` the PV GEMM of block ``j - 1`` runs while block ``j``'s softmax is
  computed; the O accumulator is rescaled after that GEMM completes.
* Epilogue: ``O / l`` in 16 bit into the warpgroup's shared-memory tile in the
  128-byte-swizzled operand layout, written by TMA tensor stores that the warpgroup does not
  wait for (``tma_o``, the default; packed GQA rows with ``tma_o_packed``, also the default:
  5-D boxes of the packed view, each packed row to its own (position, query head) row;
  split-KV partials: fp32 stores from registers; ``tma_o=False`` or packed rows without
  ``tma_o_packed``: row-predicated 128-bit stores from swizzled shared memory);
  ``lse = scale m + ln l``; a row with no visible key gets ``O = 0`` and ``lse = -inf``;
  rows past ``S_q`` are never written (TMA clips the box at the tensor's end).

CTA shapes: ``sparse_block_size = 128``: 384 threads (producer warpgroup + two consumer
warpgroups of 64 query rows, sharing each K/V load, ping-pong), one CTA per SM.
``sparse_block_size = 64``: 256 threads (producer warpgroup + one consumer warpgroup owning a
64-row query block), two CTAs per SM, or three with ``three_ctas`` (75 KiB of shared memory
and 136 consumer registers each; the caller sets it at D = 64). ``k_single`` (with
``three_ctas``, D = 128): three CTAs per SM of 64 KiB of buffers each (one Q buffer that O
is staged in, one K buffer, two V buffers) and a one-warp producer after the consumer
warpgroup (160 threads, no ``setmaxnreg``); with ``self_load`` no producer (128 threads:
warp 0 of the consumer warpgroup issues the TMA loads, ``attn_fwd_sm90_ws.SelfLoader``).
``half_items`` (a measurement shape at ``sparse_block_size = 128``): 256 threads, one
consumer warpgroup owning a 64-row half of a query block (both halves read the block's one
list), one CTA per SM; ``half_items = 2``: two such CTAs per SM, each with one Q buffer that
O is staged in, one K and two V stages (112 KiB of buffers at D = 128).
``pair_step`` (a measurement shape at ``sparse_block_size = 64``, D = 128): the consumer
walks its list two entries per step (``_pair_mainloop``: 64 x 128 score tiles over two
consecutive 64-row K / V ring stages), the producer issuing a step's two K tiles before its
two V tiles. ``kv_warps``: two producer warps, warp 0 issuing Q and the K tiles, warp 1 the
V tiles.
Work items (query block, query head, batch) are walked by a persistent scheduler: ``head_major`` (default) ``tile_scheduler.HeadMajorScheduler``
(batch, KV head, query block, query head of the group fastest: the CTAs running at one time
share one KV head's K/V in L2, and the heads of a GQA group read the same K/V blocks
together), else ``StaticLptScheduler`` (query block, then head fastest: the CTAs running at
one time span every head, whose K/V together can exceed L2).
Implemented for D in {64, 128}; other head dims use the mma.sync kernel (``bsa_fwd_sm80``).

Split-KV (``kv_splits = S > 1``, a compile-time option; ``S = 1`` compiles none of this): the
work items are (query block, split, query head), a row's ``S * H_q`` items consecutive with
the heads of one split adjacent; split ``s`` visits the chunk ``[s c, min((s + 1) c, n))`` of
its row's active list, ``c = ceil(n / S)`` (``block_info.BlockListSplit``). ``mO`` / ``mLSE``
are then the fp32 partials ``(S, B, H_q, S_q, D)`` / ``(S, B, H_q, S_q)``: the split's output
normalised by its own softmax denominator, stored from registers, and its natural-log LSE; a
split without keys stores zeros and ``-inf``. ``bsa_combine`` merges them.

Packed GQA (``pack_gqa = r > 1``, static; ``r = H_q / H_kv`` divides 64): a work item is a
block of packed query rows of one KV head, packed row ``p`` of KV head ``g`` being position
``p // r`` of query head ``g r + p % r`` (``pack_gqa.packed_row``), so the ``r`` heads of a
group share each K/V load. The metadata are indexed by (batch, KV head, packed block) ``(B,
H_kv, ceil(S_q r / bm), K_max)``; Q is loaded with one 5-D TMA box per 64-row slice
(``pack_gqa.pack_rows_view``); each packed row ``< S_q r`` is stored to its own (position,
query head) row of ``out`` / ``lse`` (``_store_o_packed``). With ``kv_splits > 1`` the work
items are (packed block, split, KV head) and split ``s`` visits chunk ``s`` of the packed
row's list as above; ``_epilogue_split`` stores each packed row's fp32 partial and LSE to
the (position, query head) row of the unpacked partials ``(S, B, H_q, S_q, D)`` / ``(S, B,
H_q, S_q)``, so the combine kernel is the unpacked one."""

from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.cute.nvgpu import OperandMajorMode, cpasync, warpgroup
from cutlass.tensor_utils import LayoutEnum

from .attn_fwd_sm90_ws import SMEM_LIMIT, AttnFwdSm90Ws, WorkItem, smem_plan
from .common import transpose_view_staged
from .block_info import BlockList, BlockListSplit, BlockPairs
from .common import (L2_EVICT_LAST, acc_layout_as_a, acc_mn_view_wg, elem_ptr,
                     gmem_store_copy, ld_relaxed_f32, st_release_s32, stage_acc_swz, swz_piece_ptr, tma_view, wait_at_least)
from .mask import KeyLimitMask
from .pack_gqa import pack_rows_view, packed_row, row_tile_view
from .softmax import OnlineSoftmax
from .pipeline import PairTurns
from .tile_scheduler import HeadMajorScheduler, StaticLptScheduler, WayScheduler

# two CTAs per SM: 228 KiB of shared memory per SM less 1 KiB reserved per CTA
SMEM_LIMIT_2CTA = 113 * 1024
# three CTAs per SM (blk 64, ``three_ctas``): a third of it, less 1 KiB
SMEM_LIMIT_3CTA = 75 * 1024


def bsa_ws_smem_plan(d: int, bm: int, bn: int, limit: int, max_stages: int = 4,
                     q_stages: int = 2, alias_first: bool = False):
    """(K/V stages, Q stages, whether O's smem buffer aliases Q's) within ``limit`` bytes
    (``attn_fwd_sm90_ws.smem_plan`` with ``D_v = D``; the struct is exactly the buffers
    plus the mbarriers padded to 1 KiB, so ``limit`` may be met to the byte)."""
    try:
        return smem_plan(d, d, bm, bn, limit, max_stages, q_stages, alias_first=alias_first,
                         reserve=1024)
    except ValueError:
        raise ValueError(
            f"no shared-memory plan for head_dim={d}, sparse_block_size={bn}") from None


def bsa_ws_oinq_plan(d: int, bm: int, bn: int, limit: int, max_stages: int = 4):
    """(V stages, K stages) within ``limit`` bytes where O is staged in the work item's own
    Q buffer (two Q buffers, no O buffer): the most K/V pairs (at least 2), then what is
    left as further V stages (the V ring is the one whose stage is held longest: a V tile
    frees after its PV GEMM, which lags the S GEMM of the next tile)."""
    tile = bn * d * 2
    avail = limit - 1024 - 2 * bm * d * 2
    pairs = min(max_stages, avail // (2 * tile))
    if pairs < 2:
        raise NotImplementedError(
            f"bsa_fwd_sm90_ws: no shared-memory plan with O in the Q buffer at "
            f"head_dim={d}, sparse_block_size={bn}")
    return min(max_stages, pairs + (avail - pairs * 2 * tile) // tile), pairs


@dataclass(frozen=True)
class _Tile:
    """A consumer warpgroup's context for one work item (its 64 rows from ``mw0``)."""

    mw0: object
    mask: object
    smax: object
    seqlen_q: object
    mO: object
    mLSE: object
    split: object = None  # split-KV: this item's split
    tma_o: object = None  # the O store's TMA atom (``tma_o``)
    tma_tO: object = None  # and its coordinate view (S, D, H, B)


class BsaFwdSm90Ws(AttnFwdSm90Ws):
    def __init__(self, dtype, head_dim: int, block_size: int, has_block_sizes: bool,
                 num_sms: int, overlap: bool = True, pingpong: bool = True,
                 max_stages: int = 4, q_stages: int = 2, pack_gqa: int = 1,
                 causal: bool = False, kv_splits: int = 1, head_major: bool = True,
                 lazy_rescale: bool = False, three_ctas: bool = False,
                 o_alias_first: bool = False, cross_item: int = 0, v_lag: bool = False,
                 split_wait: bool = False, pdl: bool = False, q_regs: bool = False,
                 meta_prefetch: bool = False, q_ahead: bool = False, epi_vec: bool = False,
                 stream_k: bool = False, tma_o: bool = False, tma_o_packed: bool = False,
                 k_single: bool = False, self_load: bool = False, pair_items: bool = False,
                 l2_hint: int = 0, o_in_q: bool = False, o_early: bool = False,
                 tree_sum: bool = False, skip_load: int = 0, half_items: int = 0,
                 s_n64: bool = False, no_softmax: bool = False, mix_pv: int = 0,
                 k_deep: bool = False, pair_step: int = 0, kv_warps: bool = False,
                 pair_box: bool = False, wg_release: bool = False):
        self.pdl = pdl
        # K / V stages released by one arrival of each consumer warpgroup's first warp
        # (after its wgmma wait) instead of one per consumer warp; the self-loading
        # consumer waits on those empty barriers itself and keeps the per-warp arrivals
        if wg_release and self_load:
            raise NotImplementedError("bsa_fwd_sm90_ws: wg_release needs a producer warp "
                                      "(not with self_load)")
        self.wg_release = wg_release
        # blk 64 lists walked two entries per step into K / V stages of 128 rows (each
        # stage's halves loaded by one 64-row TMA box each, under one barrier), 64 x 128
        # score tiles from one S GEMM: one Q buffer that O is staged in, one K and two V
        # stages (half2's shared memory)
        if pair_box and (pair_step or not (
                block_size == 64 and head_dim == 128 and overlap and kv_splits == 1
                and pack_gqa == 1 and not (pair_items or stream_k or three_ctas or k_single
                                           or self_load or cross_item or q_regs or mix_pv
                                           or o_early or half_items or o_in_q or s_n64
                                           or kv_warps or v_lag or meta_prefetch or q_ahead
                                           or skip_load))):
            raise NotImplementedError(
                "bsa_fwd_sm90_ws: pair_box needs sparse_block_size=64, head_dim=128, overlap, "
                "kv_splits=1 and pack_gqa=1, without pair_step, pair_items, stream_k, "
                "three_ctas, k_single, self_load, cross_item, q_regs, mix_pv, o_early, "
                "half_items, o_in_q, s_n64, kv_warps, v_lag, meta_prefetch, q_ahead or "
                "skip_load")
        self.pair_box = pair_box
        # two producer warps: warp 0 issues Q and the K tiles, warp 1 the V tiles (a K load
        # never waits behind a V stage)
        if kv_warps and (pair_items or k_single or self_load or v_lag or meta_prefetch
                         or q_ahead or stream_k or skip_load):
            raise NotImplementedError(
                "bsa_fwd_sm90_ws: kv_warps needs the producer warpgroup's plain loop: not "
                "with pair_items, k_single, self_load, v_lag, meta_prefetch, q_ahead, "
                "stream_k or skip_load")
        self.kv_warps = kv_warps
        # blk 64 walked two listed blocks per step (``_pair_mainloop``; the producer issues
        # a step's two K tiles, then its two V tiles): 1 with the shared-memory plan of the
        # other options (at least two K and two V stages), 2 / 3 / 4 with one Q buffer that
        # O is staged in and two K, four V / three K, three V / four K, two V stages
        if pair_step and not (block_size == 64 and head_dim == 128 and overlap
                              and not (pair_items or stream_k or three_ctas or k_single
                                       or self_load or cross_item or q_regs or mix_pv
                                       or o_early or half_items)):
            raise NotImplementedError(
                "bsa_fwd_sm90_ws: pair_step needs sparse_block_size=64, head_dim=128 and "
                "overlap, without pair_items, stream_k, three_ctas, k_single, self_load, "
                "cross_item, q_regs, mix_pv, o_early or half_items")
        if pair_step > 1 and o_in_q:
            raise NotImplementedError(
                "bsa_fwd_sm90_ws: pair_step 2, 3 and 4 stage O without o_in_q")
        self.pair_step = pair_step
        # K steps of the PV GEMM issued between those of the next S GEMM, in its wgmma group
        # (AttnFwdSm90Ws._issue_mixed; 0 off)
        self.mix_pv = mix_pv
        # a timing ablation (wrong results): the score tiles skip the online-softmax step
        # (P = the masked scores, correction factors 1)
        self.no_softmax = no_softmax
        # an ablation at sparse_block_size 128: S = Q K^T as two 64-column GEMMs
        # (AttnFwdSm90Ws._s_n64)
        self.s_n64 = s_n64
        # sparse_block_size 128 walked by 64-row work items (one consumer warpgroup, one
        # CTA per SM, both halves of a query block reading its one block list): 64 x 128
        # score tiles with the K / V traffic per row of 64-row query blocks
        if half_items and not (block_size == 128 and kv_splits == 1 and pack_gqa == 1
                               and not (pair_items or stream_k or three_ctas or k_single
                                        or cross_item)):
            raise NotImplementedError(
                "bsa_fwd_sm90_ws: half_items needs sparse_block_size=128, kv_splits=1 and "
                "pack_gqa=1, without pair_items, stream_k, three_ctas, k_single or cross_item")
        if half_items == 2 and (o_in_q or head_dim != 128):
            raise NotImplementedError(
                "bsa_fwd_sm90_ws: half_items=2 needs head_dim=128, without o_in_q")
        self.half_items = half_items
        # query tiles (work items) per block-list row
        self.rows_per_list = 2 if half_items else 1
        # timing ablation (wrong results): the producer skips the K / V loads of every
        # skip_load-th tile it issues (AttnFwdSm90Ws._issue_kv); 0 off
        self.skip_load = skip_load
        # the online softmax adds a thread's probabilities of a row pairwise (softmax.py)
        self.tree_sum = tree_sum
        # the overlapped mainloop rescales O for tile j - 1 under the S GEMM of tile j
        # (AttnFwdSm90Ws._o_early)
        self.o_early = o_early and overlap
        # the epilogue stages O (for its TMA stores) in the work item's own Q buffer, free
        # once the item's S GEMMs are done; the Q stage is released at the CTA's next item
        # with work, after the store has read it; the O buffer's bytes become V stages
        if o_in_q and (q_stages < 2 or k_single or pair_items or stream_k or cross_item
                       or o_alias_first or kv_splits != 1 or not tma_o or pack_gqa != 1):
            raise NotImplementedError(
                "bsa_fwd_sm90_ws: o_in_q needs q_stages=2, tma_o, kv_splits=1 and "
                "pack_gqa=1, without k_single, pair_items, stream_k, cross_item or "
                "o_alias_first")
        self.o_in_q = o_in_q
        # the L2 policies of the TMA copies (AttnFwdSm90Ws._l2; common.L2_HINT_*)
        self.l2_hint = l2_hint
        # blk 64: two consumer warpgroups per CTA, each with work items of its own (its own
        # 64-row query block and block list, Q / K / V rings and producer warp), taking
        # turns at their GEMMs (AttnFwdSm90Ws._pair)
        if pair_items and not (block_size == 64 and kv_splits == 1 and pack_gqa == 1
                               and not (three_ctas or k_single or self_load or stream_k
                                        or cross_item or meta_prefetch or q_ahead
                                        or o_alias_first)):
            raise NotImplementedError(
                "bsa_fwd_sm90_ws: pair_items needs sparse_block_size=64, kv_splits=1 and "
                "pack_gqa=1, without three_ctas, k_single, self_load, stream_k, cross_item, "
                "meta_prefetch, q_ahead or o_alias_first")
        self.pair_items = pair_items
        # no producer warp: the consumer warpgroup's warp 0 issues the loads (k_single only)
        if self_load and not (k_single and overlap and kv_splits == 1 and pack_gqa == 1
                              and not (stream_k or cross_item or meta_prefetch or q_ahead)):
            raise NotImplementedError(
                "bsa_fwd_sm90_ws: self_load needs k_single and overlap, without kv_splits, "
                "pack_gqa, stream_k, cross_item, meta_prefetch or q_ahead")
        self.self_load = self_load
        # the last work items' blocks split evenly over the CTAs (``_sk_range``); partials
        # of the split items go through ``mWs`` / ``mFlags``
        if stream_k and (kv_splits != 1 or pack_gqa != 1 or cross_item or meta_prefetch
                         or q_ahead):
            raise NotImplementedError(
                "bsa_fwd_sm90_ws: stream_k needs kv_splits=1, pack_gqa=1 and none of "
                "cross_item, meta_prefetch, q_ahead")
        self.stream_k = stream_k
        # the epilogue's O staging as packed pair stores into a row-swizzled tile, copied
        # out in 16-byte pieces (AttnFwdSm90Ws._epi_vec; packed rows: _store_o_packed)
        self.epi_vec = epi_vec
        # the producer and the consumers load the next work item's listed-block count (the
        # producer also its first list entry) while the current item runs
        self.meta_prefetch = meta_prefetch or q_ahead
        # the producer issues the next work item's Q during the current item (after its
        # first K / V stages) instead of at the next item's start (needs two Q buffers)
        # (not with v_lag: its producer loop issues no next-item Q, so it runs as mpre there)
        self.q_ahead = q_ahead and kv_splits == 1 and q_stages >= 2 and not v_lag
        self.split_wait = split_wait
        if block_size not in (64, 128) or head_dim not in (64, 128):
            raise NotImplementedError(
                f"bsa_fwd_sm90_ws implements head_dim in (64, 128) and sparse_block_size in "
                f"(64, 128), got head_dim={head_dim}, sparse_block_size={block_size}")
        self.dtype = dtype
        self.d = head_dim
        self.dv = head_dim
        # rows of a block of the lists; of a K / V tile (a stage; two blocks with pair_box)
        self.list_bn = block_size
        self.bn = 2 * block_size if pair_box else block_size
        self.wg_m = 64
        self.num_wg = 2 if pair_items else 1 if half_items else block_size // 64
        # rows of a work item's query tile
        self.bm = 64 if pair_items else 64 * self.num_wg
        self.has_sizes = has_block_sizes
        self.causal = causal
        self.overlap = overlap
        self.pingpong = pingpong and self.num_wg == 2
        self.ctas_per_sm = 1 if self.num_wg == 2 or half_items == 1 else 2
        if three_ctas:
            if self.num_wg != 1:
                raise NotImplementedError("three CTAs per SM need sparse_block_size=64")
            self.ctas_per_sm = 3
        limit = {1: SMEM_LIMIT, 2: SMEM_LIMIT_2CTA, 3: SMEM_LIMIT_3CTA}[self.ctas_per_sm]
        if pair_items:
            # each warpgroup's ring set gets what one of two CTAs per SM would (the turn
            # flags take the second KiB of the mbarrier block)
            limit = SMEM_LIMIT_2CTA
        if k_single:
            # one K buffer and two V buffers (K tile j + 1 loads once the S GEMM of tile j
            # has completed), one Q buffer that O is staged in: 64 KiB at D = 128, so that
            # three CTAs share an SM
            if self.ctas_per_sm != 3:
                raise NotImplementedError("bsa_fwd_sm90_ws: k_single needs three_ctas")
            need = (self.bm * head_dim + 3 * block_size * head_dim) * 2 + 1024
            if need > limit:
                raise NotImplementedError(
                    f"bsa_fwd_sm90_ws: k_single does not fit at head_dim={head_dim}")
            self.stages, self.k_stages, self.q_stages, self.o_alias_q = 2, 1, 1, True
        elif half_items == 2:
            # one Q buffer that O is staged in, one K and two V stages of 128 rows: 112 KiB
            # and the mbarriers' KiB at D = 128
            self.stages, self.k_stages, self.q_stages, self.o_alias_q = 2, 1, 1, True
        elif pair_box:
            # one Q buffer that O is staged in, one K and two V stages of 128 rows (112 KiB
            # and the mbarriers' KiB at D = 128)
            self.stages, self.k_stages, self.q_stages, self.o_alias_q = 2, 1, 1, True
        elif pair_step > 1:
            # one Q buffer that O is staged in, six K / V stages of 64 rows (half2's 112 KiB)
            self.k_stages = pair_step
            self.stages, self.q_stages, self.o_alias_q = 6 - pair_step, 1, True
        elif o_in_q:
            self.stages, self.k_stages = bsa_ws_oinq_plan(head_dim, self.bm, block_size, limit,
                                                          max_stages)
            if k_deep:
                # the stages beyond the K / V pairs go to the K ring (K tiles load further
                # ahead of their S GEMMs where the producer issues K ahead of V: v_lag)
                self.stages, self.k_stages = self.k_stages, self.stages
            self.q_stages, self.o_alias_q = 2, True
        else:
            self.stages, self.q_stages, self.o_alias_q = bsa_ws_smem_plan(
                head_dim, self.bm, block_size, limit, max_stages, q_stages, o_alias_first)
            self.k_stages = self.stages
            if pair_items and self.o_alias_q:
                raise NotImplementedError(
                    f"bsa_fwd_sm90_ws: pair_items has no shared-memory plan at "
                    f"head_dim={head_dim} with q_stages={q_stages}")
        if pair_step and (self.k_stages < 2 or self.stages < 2):
            # a step holds two K and two V stages
            raise NotImplementedError(
                f"bsa_fwd_sm90_ws: pair_step needs two K and two V stages, the plan has "
                f"{self.k_stages} and {self.stages}")
        # the next item's Q goes to the other Q buffer: none where the plan has one
        # (not with pair_step, whose producer loop issues no next-item Q either)
        self.q_ahead = self.q_ahead and self.q_stages >= 2 and not pair_step
        self.num_sms = num_sms
        # O written by TMA tensor stores from its own staging buffer (AttnFwdSm90Ws._tma_o;
        # the 16-bit output; packed rows only with ``tma_o_packed``: the boxes of the packed
        # Q view, (D, r, 64 / r))
        self.tma_o = (tma_o and kv_splits == 1 and (not self.o_alias_q or self.o_in_q)
                      and (pack_gqa == 1 or tma_o_packed))
        # chained work items (``AttnFwdSm90Ws._consume_items``): needs the overlapped
        # mainloop and the next item's Q in its own buffer
        # (``cross_item``: 0 off, 1 on, 2 on with the last PV GEMM issued before the next
        # item's first S GEMM and the epilogue while that one runs)
        self.cross_item = (bool(cross_item) and overlap and self.q_stages >= 2
                           and not self.o_alias_q)
        self.cross_epi_first = self.cross_item and cross_item == 2
        # Q as the register operand of S = Q K^T (AttnFwdSm90Ws._q_regs; not with chained
        # items, whose next Q slice is read from shared memory)
        self.q_regs = q_regs and not self.cross_item
        # the producer issues V tile j after K tile j + 1 (the PV GEMM lags the S GEMM)
        self.v_lag = v_lag
        self.kv_splits = kv_splits
        self.head_major = head_major
        # lazy_rescale: rows keep a stale max up to 2^8 below the true one (softmax.py)
        self.rescale_threshold = 8.0 if lazy_rescale else None
        self.num_threads = 128 * (1 + self.num_wg)
        # k_single: the producer is one warp (warp 4) after the consumer warpgroup (160
        # threads; 128 with self_load, which has none), no setmaxnreg: ptxas bounds the
        # registers by the launch's three CTAs per SM (min_blocks_per_mp)
        self.warp_producer = k_single
        if k_single:
            self.num_threads = 128 * self.num_wg + (0 if self_load else 32)
        # register budget per CTA: 65536 / ctas_per_sm = 128 * (producer + num_wg * consumer)
        self.regs_producer = 24
        self.regs_consumer = 240 if self.num_wg == 2 else 232
        if self.ctas_per_sm == 3:
            # 80 registers per thread at launch (65536 / 768, multiple of 8): the producer
            # warpgroup's 56 spare registers go to the consumer warpgroup
            self.regs_consumer = 136
        # pack_gqa: r = H_q / H_kv query heads per work item (1: off); r divides the 64-row
        # warpgroup tile, so a Q slice is one (D, r, 64 / r) TMA box
        if 64 % pack_gqa:
            raise NotImplementedError(
                f"bsa_fwd_sm90_ws packs GQA groups of a size dividing 64, got {pack_gqa}")
        self.pack = pack_gqa

    @staticmethod
    def can_implement(dtype, head_dim: int, block_size: int) -> bool:
        return (dtype in (cutlass.Float16, cutlass.BFloat16) and head_dim in (64, 128)
                and block_size in (64, 128))

    def sk_slots(self) -> int:
        """CTA slots of the persistent grid: the leading extent of the stream-K partials."""
        return self.num_sms * self.ctas_per_sm

    def sk_floats(self) -> int:
        """fp32 values of the stream-K partial workspace ``mWs``: per CTA slot and consumer
        warpgroup, each thread's O accumulator (``wg_m * D / 128`` values) and its two rows'
        running max and sum."""
        return self.sk_slots() * self.num_wg * 128 * (self.wg_m * self.dv // 128 + 4)

    @cute.jit
    def __call__(self, mQ, mK, mV, mIdx, mNums, mSizes, mScale, mO, mLSE, stream, mWs=None,
                 mFlags=None):
        d = self.d
        mma_qk, mma_qk0, mma_pv, sQ_layout, sK_layout, sV_layout, sO_layout = (
            self._mmas_and_layouts())
        # TMA views: Q, K as (S, D, H, B) (D contiguous), V as (D, S, H, B) (MN-major B operand)
        tQ, tK, tV = tma_view(mQ, d), tma_view(mK, d), tma_view(mV, d, d_first=True)
        B = mQ.shape[0]
        S_q = mQ.shape[1]
        H_q = mQ.shape[2]
        if cutlass.const_expr(self.pack > 1):
            # work items are (packed block, KV head, batch); Q rows are packed rows
            tQ = pack_rows_view(tQ, self.pack, 0, 2)
            S_q = S_q * self.pack
            H_q = mK.shape[2]
        tma_q, tma_tQ, tma_k, tma_tK, tma_v, tma_tV = self._tma_atoms(
            tQ, tK, tV, sQ_layout, sK_layout, sV_layout)
        tma_o = tma_tO = None
        if cutlass.const_expr(self.tma_o):
            tO = tma_view(mO, d)
            if cutlass.const_expr(self.pack > 1):
                tO = pack_rows_view(tO, self.pack, 0, 2)
            tma_o, tma_tO = cpasync.make_tiled_tma_atom(
                cpasync.CopyBulkTensorTileS2GOp(), tO, cute.slice_(sO_layout, (None, None, 0)),
                (self.wg_m, d))
        Smem = self._smem_struct(sQ_layout, sK_layout, sV_layout, sO_layout)
        n_q_blocks = (S_q + self.bm - 1) // self.bm
        n_work = B * n_q_blocks * H_q
        if cutlass.const_expr(self.kv_splits > 1):
            n_work = n_work * self.kv_splits
        n_cta_work = n_work
        if cutlass.const_expr(self.pair_items):
            # two items at a time per CTA (one per consumer warpgroup)
            n_cta_work = (n_work + 1) // 2
        grid = StaticLptScheduler.grid(n_cta_work, self.num_sms * self.ctas_per_sm)
        self.kernel(
            tma_q, tma_tQ, tma_k, tma_tK, tma_v, tma_tV, mV, mIdx, mNums, mSizes, mScale, mO,
            mLSE, sQ_layout, sK_layout, sV_layout, sO_layout, mma_qk, mma_qk0, mma_pv, Smem,
            mWs, mFlags, tma_o, tma_tO,
        ).launch(grid=grid, block=[self.num_threads, 1, 1], smem=Smem.size_in_bytes(),
                 stream=stream, min_blocks_per_mp=self.ctas_per_sm, use_pdl=self.pdl,
                 # two CTAs per SM need the largest shared-memory carveout (percent)
                 preferred_smem_carveout=100 if self.ctas_per_sm > 1 else None)

    @cute.jit
    def _work(self, sched, t, n_q_blocks, mIdx, mNums, mSizes, seqlen_k, seqlen_q=None,
              n_heads=None, nums=None):
        """(batch, query head, query block, its BlockList) of work item ``t`` (packed: KV
        head and packed block; ``seqlen_q``: causal only); split-KV: the split's part of the
        list (``BlockListSplit``) and the split, last. ``nums``: the item's raw
        ``q2k_block_nums`` entry, loaded earlier (``_item_meta``)."""
        slot, head = sched.coords(t)
        split = None
        if cutlass.const_expr(self.kv_splits > 1):
            split = head // n_heads
            head = head - split * n_heads
        batch = slot // n_q_blocks
        m_block = slot - batch * n_q_blocks
        row = m_block // self.rows_per_list  # the item's block-list row
        if cutlass.const_expr(self.causal and self.pack > 1):
            # ---- causal, packed rows (``seqlen_q`` = S_q r): the last row's position is
            # (last packed row) // r
            key_end = ((cutlass.min((m_block + 1) * self.bm, seqlen_q) - 1) // self.pack + 1
                       + seqlen_k - seqlen_q // self.pack)
            blist = BlockList.create(mIdx, mNums, mSizes, batch, head, row, seqlen_k,
                                     self.list_bn, self.has_sizes, key_end, nums)
        elif cutlass.const_expr(self.causal):
            # ---- causal: one past the last key the query block's last row sees
            key_end = cutlass.min((m_block + 1) * self.bm, seqlen_q) + seqlen_k - seqlen_q
            blist = BlockList.create(mIdx, mNums, mSizes, batch, head, row, seqlen_k,
                                     self.list_bn, self.has_sizes, key_end, nums)
        else:
            blist = BlockList.create(mIdx, mNums, mSizes, batch, head, row, seqlen_k,
                                     self.list_bn, self.has_sizes, None, nums)
        if cutlass.const_expr(self.kv_splits > 1):
            return batch, head, m_block, BlockListSplit.create(blist, split, self.kv_splits), split
        if cutlass.const_expr(self.pair_box):
            blist = BlockPairs.create(blist)
        return batch, head, m_block, blist

    @cute.jit
    def _item_meta(self, sched, t, n_q_blocks, mIdx, mNums, n_heads):
        """Work item ``min(t, last)``'s raw ``q2k_block_nums`` entry and first
        ``q2k_block_index`` entry (its list position 0; 0 where ``K_max`` is 0), the loads
        issued here and their values used an item later (``meta_prefetch``)."""
        t = cutlass.min(t, sched.n_work - 1)
        slot, head = sched.coords(t)
        if cutlass.const_expr(self.kv_splits > 1):
            head = head - (head // n_heads) * n_heads
        batch = slot // n_q_blocks
        m_block = slot - batch * n_q_blocks
        row = m_block // self.rows_per_list
        first = Int32(0)
        if Int32(mIdx.shape[3]) > 0:
            first = Int32(mIdx[batch, head, row, 0])
        return Int32(mNums[batch, head, row]), first

    @cute.kernel
    def kernel(self, tma_q, tma_tQ, tma_k, tma_tK, tma_v, tma_tV, mV, mIdx, mNums, mSizes,
               mScale, mO, mLSE, sQ_layout, sK_layout, sV_layout, sO_layout, mma_qk, mma_qk0,
               mma_pv, Smem: cutlass.Constexpr, mWs, mFlags, tma_o, tma_tO):
        tidx, _, _ = cute.arch.thread_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg_idx = warp // 4
        bm, wgm = self.bm, self.wg_m
        if cutlass.const_expr(self.kv_splits > 1):
            # fp32 partials: mLSE is (S, B, H_q, S_q)
            n_batch = mLSE.shape[1]
            seqlen_q = mLSE.shape[3]
            n_heads = mLSE.shape[2]
        else:
            n_batch = mO.shape[0]
            seqlen_q = mO.shape[1]
            n_heads = mO.shape[2]
        seqlen_k = mV.shape[1]
        group = n_heads // mV.shape[2]
        if cutlass.const_expr(self.pack > 1):
            # (packed block, KV head, batch) items over S_q r packed rows
            seqlen_q = seqlen_q * self.pack
            n_heads = mV.shape[2]
            group = 1
        n_q_blocks = (seqlen_q + bm - 1) // bm
        # split-KV: "heads" of the schedule are (split, head) pairs, split-major
        n_hs = n_heads
        if cutlass.const_expr(self.kv_splits > 1):
            n_hs = n_heads * self.kv_splits
        if cutlass.const_expr(self.head_major):
            sched = HeadMajorScheduler(n_hs, n_batch * n_q_blocks * n_hs, n_hs // n_heads * group,
                                       group, n_q_blocks, n_heads // group)
        else:
            sched = StaticLptScheduler(n_hs, n_batch * n_q_blocks * n_hs)
        ring = None
        if cutlass.const_expr(self.pair_items):
            # producer warp w (w < 2) and consumer warpgroup w share ring set w and walk item
            # stream w of the CTA (warps 2 and 3 load nothing)
            ring = wg_idx - 1
            if wg_idx == 0:
                ring = warp % 2
            sched = WayScheduler(sched, ring, 2)
        st, pipe_q, pipe_k, pipe_v, sQ, sK, sV, q_bytes, k_bytes, v_bytes = (
            self._smem_and_pipes(Smem, sQ_layout, sK_layout, sV_layout, tma_q, tma_k, tma_v,
                                 warp, ring))

        prod_wg = 1 if self.warp_producer else 0
        loads = warp == 4 * prod_wg
        if cutlass.const_expr(self.pair_items or self.kv_warps):
            loads = warp < 2
        if wg_idx == prod_wg:
            # ================================ producer ================================
            if cutlass.const_expr(not self.warp_producer):
                cute.arch.setmaxregister_decrease(self.regs_producer)
            if loads:
                lane, sV_rows, c_q, c_kv, t = self._producer_warp_start(sV, sched)
                if cutlass.const_expr(self.meta_prefetch):
                    # the next item's count and first entry load while this item's K / V
                    # loads go out
                    nums, first = self._item_meta(sched, t, n_q_blocks, mIdx, mNums, n_heads)
                    # q_ahead: 1 while the current item's Q still has to be issued
                    q_mine = Int32(1)
                    while sched.valid(t):
                        t_next = sched.next(t)
                        nums_next, first_next = self._item_meta(sched, t_next, n_q_blocks,
                                                                mIdx, mNums, n_heads)
                        batch, head, m_block, blist = self._work(
                            sched, t, n_q_blocks, mIdx, mNums, mSizes, seqlen_k, seqlen_q,
                            n_heads, nums)[:4]
                        work = WorkItem(blist, head, mV, batch=batch, head_kv=head // group)
                        first_entry = None
                        if cutlass.const_expr(self.kv_splits == 1):
                            first_entry = first
                        if cutlass.const_expr(self.q_ahead):
                            nbatch, nhead, nm_block, nblist = self._work(
                                sched, cutlass.min(t_next, sched.n_work - 1), n_q_blocks, mIdx,
                                mNums, mSizes, seqlen_k, seqlen_q, n_heads, nums_next)[:4]
                            nwork = WorkItem(nblist, nhead, mV, batch=nbatch,
                                             head_kv=nhead // group)
                            # the next item's Q goes out during this one when both have
                            # blocks (an item without blocks has no Q)
                            go = Int32(0)
                            if sched.valid(t_next):
                                if nblist.n_count > 0:
                                    if blist.n_count > 0:
                                        go = Int32(1)
                            c_q, c_kv = self._produce(
                                work, m_block, tma_q, tma_tQ, tma_k, tma_tK, tma_v, tma_tV, sQ,
                                sK, sV, sV_rows, pipe_q, pipe_k, pipe_v, q_bytes, k_bytes,
                                v_bytes, c_q, c_kv, lane, first_entry, q_mine,
                                (nwork, nm_block, go))
                            q_mine = 1 - go
                        else:
                            c_q, c_kv = self._produce(
                                work, m_block, tma_q, tma_tQ, tma_k, tma_tK, tma_v, tma_tV, sQ,
                                sK, sV, sV_rows, pipe_q, pipe_k, pipe_v, q_bytes, k_bytes,
                                v_bytes, c_q, c_kv, lane, first_entry)
                        nums = nums_next
                        first = first_next
                        t = t_next
                else:
                    n_rr = sched.n_work
                    if cutlass.const_expr(self.stream_k):
                        n_rr = self._sk_split_point(sched)
                    while t < n_rr:
                        batch, head, m_block, blist = self._work(
                            sched, t, n_q_blocks, mIdx, mNums, mSizes, seqlen_k, seqlen_q,
                            n_heads)[:4]
                        head_kv = head // group
                        work = WorkItem(blist, head, mV, batch=batch, head_kv=head_kv)
                        role = None
                        if cutlass.const_expr(self.kv_warps):
                            # warp 0: Q and K (role 1), warp 1: V (role 2)
                            role = warp + 1
                        c_q, c_kv = self._produce(
                            work, m_block, tma_q, tma_tQ, tma_k, tma_tK, tma_v, tma_tV, sQ, sK,
                            sV, sV_rows, pipe_q, pipe_k, pipe_v, q_bytes, k_bytes, v_bytes, c_q,
                            c_kv, lane, role=role)
                        t = sched.next(t)
                    if cutlass.const_expr(self.stream_k):
                        # the tail's pieces (after the round-robin items, so the metadata
                        # loads of _sk_range overlap the consumers' last items)
                        n_pieces, t0, t_step, lo0, hi_last = self._sk_range(
                            sched, n_rr, n_q_blocks, mIdx, mNums, mSizes, seqlen_k, seqlen_q,
                            n_heads)
                        for p in cutlass.range(n_pieces, unroll=1):
                            lo, hi = self._sk_bounds(p, n_pieces, lo0, hi_last)
                            batch, head, m_block, blist = self._work(
                                sched, t0 + p * t_step, n_q_blocks, mIdx, mNums, mSizes,
                                seqlen_k, seqlen_q, n_heads)[:4]
                            piece = BlockListSplit(blist, lo, cutlass.min(hi, blist.n_count) - lo)
                            work = WorkItem(piece, head, mV, batch=batch, head_kv=head // group)
                            c_q, c_kv = self._produce(
                                work, m_block, tma_q, tma_tQ, tma_k, tma_tK, tma_v, tma_tV, sQ,
                                sK, sV, sV_rows, pipe_q, pipe_k, pipe_v, q_bytes, k_bytes,
                                v_bytes, c_q, c_kv, lane)
        else:
            # ================================ consumers ===============================
            wg, wtid, turns = self._consumer_start(wg_idx, tidx)
            if cutlass.const_expr(self.pair_items):
                turns = PairTurns(self.pingpong, st.turn.data_ptr(),
                                  st.turn.data_ptr() + 2 + (tidx - 128), wtid)
            softmax_scale = Float32(mScale[0])
            thr_mma_qk, thr_mma_pv, tSrQ, tSrK, tOrV, tSc = self._consumer_fragments(
                mma_qk, mma_qk0, mma_pv, sQ, sK, sV, wtid)
            tScS = acc_mn_view_wg(tSc)
            if cutlass.const_expr(self.pair_box):
                # the key masks apply per 64-column half (_pair_p)
                tScS = self._half_coords(wtid)
            mask = KeyLimitMask(tScS)
            smax = OnlineSoftmax.create(cute.size(tScS, mode=[0]), softmax_scale,
                                        self.rescale_threshold, self.tree_sum)
            # o_in_q: the warpgroup's slice of Q buffer 0 (``_consume`` offsets it to the item's)
            sO = self._o_buffer(st, sO_layout, wg)

            turns.start(wg)
            smaxes = (smax, smax)
            if cutlass.const_expr(self.cross_item):
                # the next item's first score tile needs its own softmax state
                smaxes = (smax, OnlineSoftmax.create(cute.size(tScS, mode=[0]), softmax_scale,
                                                     self.rescale_threshold, self.tree_sum))
            ctx = (sched, n_q_blocks, mIdx, mNums, mSizes, seqlen_k, seqlen_q, n_heads, mV,
                   mask, smaxes, mO, mLSE, wg, tma_o, tma_tO)
            if cutlass.const_expr(self.cross_item):
                self._consume_items(sched, sched.n_work, ctx, mma_qk, mma_qk0, mma_pv,
                                    thr_mma_qk, thr_mma_pv, tSrQ, tSrK, tOrV, pipe_q, pipe_k,
                                    pipe_v, sO, turns, wg, wtid)
            elif cutlass.const_expr(self.meta_prefetch):
                # the next item's count loads while this item runs
                c_q, c_kv, t = self._loop_start(sched)
                nums = self._item_meta(sched, t, n_q_blocks, mIdx, mNums, n_heads)[0]
                while sched.valid(t):
                    t_next = sched.next(t)
                    nums_next = self._item_meta(sched, t_next, n_q_blocks, mIdx, mNums,
                                                n_heads)[0]
                    work, tile, _ = self._decode(t, ctx, 0, nums)
                    c_kv, c_q = self._consume(
                        work, tile, mma_qk, mma_qk0, mma_pv, thr_mma_qk, thr_mma_pv, tSrQ,
                        tSrK, tOrV, pipe_q, pipe_k, pipe_v, c_q, c_kv, sO, turns, wg, wtid)
                    nums = nums_next
                    t = t_next
            else:
                c_q, c_kv, t = self._loop_start(sched)
                n_rr = sched.n_work
                if cutlass.const_expr(self.stream_k):
                    n_rr = self._sk_split_point(sched)
                if cutlass.const_expr(self.self_load):
                    # this warpgroup issues its own loads (warp 0)
                    sV_rows = transpose_view_staged(sV)
                    lane = cute.arch.lane_idx()
                    is_loader = warp == 0
                while t < n_rr:
                    if cutlass.const_expr(self.self_load):
                        batch, head, m_block, blist = self._work(
                            sched, t, n_q_blocks, mIdx, mNums, mSizes, seqlen_k, seqlen_q,
                            n_heads)[:4]
                        work = WorkItem(blist, head, mV, batch=batch, head_kv=head // group)
                        tile = _Tile(m_block * self.bm, mask, smax, seqlen_q, mO, mLSE, None,
                                     tma_o, tma_tO)
                        ld = self._self_loader(work, m_block, is_loader, tma_q, tma_tQ, tma_k,
                                               tma_tK, tma_v, tma_tV, sQ, sK, sV, sV_rows,
                                               pipe_q, pipe_k, pipe_v, q_bytes, k_bytes,
                                               v_bytes, lane)
                        c_kv, c_q = self._consume(
                            work, tile, mma_qk, mma_qk0, mma_pv, thr_mma_qk, thr_mma_pv, tSrQ,
                            tSrK, tOrV, pipe_q, pipe_k, pipe_v, c_q, c_kv, sO, turns, wg, wtid,
                            loader=ld)
                    else:
                        work, tile, _ = self._decode(t, ctx, 0)
                        c_kv, c_q = self._consume(
                            work, tile, mma_qk, mma_qk0, mma_pv, thr_mma_qk, thr_mma_pv, tSrQ,
                            tSrK, tOrV, pipe_q, pipe_k, pipe_v, c_q, c_kv, sO, turns, wg, wtid)
                    t = sched.next(t)
                if cutlass.const_expr(self.stream_k):
                    n_pieces, t0, t_step, lo0, hi_last = self._sk_range(
                        sched, n_rr, n_q_blocks, mIdx, mNums, mSizes, seqlen_k, seqlen_q,
                        n_heads, 4)
                    for p in cutlass.range(n_pieces, unroll=1):
                        lo, hi = self._sk_bounds(p, n_pieces, lo0, hi_last)
                        work, tile, n_full = self._decode(t0 + p * t_step, ctx, 0)
                        piece = BlockListSplit(work.kv, lo, cutlass.min(hi, n_full) - lo)
                        c_kv, c_q = self._consume(
                            WorkItem(piece, work.head, mV, batch=work.batch), tile, mma_qk,
                            mma_qk0, mma_pv, thr_mma_qk, thr_mma_pv, tSrQ, tSrK, tOrV, pipe_q,
                            pipe_k, pipe_v, c_q, c_kv, sO, turns, wg, wtid,
                            (n_full, lo, hi, mWs, mFlags))
            if cutlass.const_expr(self.pair_items):
                # the other warpgroup may still take turns
                turns.finish(wg)
            # the last O store has read shared memory before the CTA exits
            self._tma_o_drain(wtid)

    @cute.jit
    def _decode(self, t, ctx, which: cutlass.Constexpr, nums=None):
        """Item ``t``'s work, tile context (with softmax state ``which``; chained items,
        ``_consume_items``: 0 or 1) and listed-block count; ``nums``: its raw
        ``q2k_block_nums`` entry, loaded earlier."""
        (sched, n_q_blocks, mIdx, mNums, mSizes, seqlen_k, seqlen_q, n_heads, mV, mask, smaxes,
         mO, mLSE, wg, tma_o, tma_tO) = ctx
        item = self._work(sched, t, n_q_blocks, mIdx, mNums, mSizes, seqlen_k, seqlen_q,
                          n_heads, nums)
        batch, head, m_block, blist = item[:4]
        split = None
        if cutlass.const_expr(self.kv_splits > 1):
            split = item[4]
        tile = _Tile(m_block * self.bm + self._wg_row0(wg), mask, smaxes[which], seqlen_q, mO,
                     mLSE, split, tma_o, tma_tO)
        return WorkItem(blist, head, mV, batch=batch), tile, blist.n_count

    # ------------------------------------------------ stream-K tail (``stream_k``)
    @cute.jit
    def _sk_split_point(self, sched):
        """Items ``[0, n)`` go round robin (CTA ``c``: ``c, c + G, ...``); the rest, the last
        whole wave and the partial one after it, are the tail of ``_sk_range``. ``n`` is every
        item when they fill whole waves or fewer than two."""
        gdim, _, _ = cute.arch.grid_dim()
        g = Int32(gdim)
        n = sched.n_work
        if n >= 2 * g:
            if n % g != 0:
                n = (n // g - 1) * g
        return n

    @cute.jit
    def _sk_range(self, sched, n_dp, n_q_blocks, mIdx, mNums, mSizes, seqlen_k, seqlen_q,
                  n_heads, unroll: cutlass.Constexpr = 1):
        """This CTA's pieces of the tail items ``[n_dp, n_work)``: ``(n_pieces, t0, t_step,
        lo0, hi_last)``, piece ``p`` being entries ``[lo, hi)`` of item ``t0 + p t_step``'s
        list (``_sk_bounds``). When every tail item lists the same ``k >= 2`` blocks, the
        tail's ``W = (n_work - n_dp) k`` blocks are cut into ``G`` contiguous ranges (CTA
        ``c``: ``[c q + min(c, r), ...)`` with ``W = q G + r``), each at least ``k`` long
        (the tail holds more than ``G`` items), so an item is split between two consecutive
        CTAs at most. Otherwise the tail goes on round robin (whole items, as without
        ``stream_k``). Each warp computes this on its own from ``q2k_block_nums``; ``unroll``
        count loads in flight (the consumers, which wait for it; the producer warp, ahead of
        them and short of registers, loads one at a time)."""
        gdim, _, _ = cute.arch.grid_dim()
        bidx, _, _ = cute.arch.block_idx()
        g = Int32(gdim)
        c = Int32(bidx)
        n_work = sched.n_work
        lane = cute.arch.lane_idx()
        kmin = Int32(1 << 30)
        kmax = Int32(-1)
        # lane-strided over the tail
        n_iter = cutlass.max((n_work - n_dp - lane + 31) // 32, Int32(0))
        for it in cutlass.range(n_iter, unroll=unroll):
            cnt = self._work(sched, n_dp + lane + it * 32, n_q_blocks, mIdx, mNums, mSizes,
                             seqlen_k, seqlen_q, n_heads)[3].n_count
            kmin = cutlass.min(kmin, cnt)
            kmax = cutlass.max(kmax, cnt)
        for sh in cutlass.range_constexpr(5):
            kmin = cutlass.min(kmin, cute.arch.shuffle_sync_bfly(kmin, offset=16 >> sh))
            kmax = cutlass.max(kmax, cute.arch.shuffle_sync_bfly(kmax, offset=16 >> sh))
        # round robin: whole items c + n_dp, c + n_dp + G, ...
        t0 = n_dp + c
        t_step = g
        n_pieces = cutlass.max((n_work - t0 + g - 1) // g, Int32(0))
        lo0 = Int32(0)
        hi_last = Int32(1 << 30)
        if n_dp < n_work:
            if kmin == kmax:
                if kmin >= 2:
                    if kmin <= (1 << 20):
                        k = kmin
                        w = (n_work - n_dp) * k
                        q = w // g
                        r = w - q * g
                        s0 = c * q + cutlass.min(c, r)
                        s1 = s0 + q
                        if c < r:
                            s1 = s1 + 1
                        i0 = s0 // k
                        i1 = (s1 - 1) // k
                        t0 = n_dp + i0
                        t_step = Int32(1)
                        n_pieces = i1 - i0 + 1
                        lo0 = s0 - i0 * k
                        hi_last = s1 - i1 * k
        return n_pieces, t0, t_step, lo0, hi_last

    @cute.jit
    def _sk_bounds(self, p, n_pieces, lo0, hi_last):
        """List entries ``[lo, hi)`` of piece ``p`` (``hi`` past the count: the whole rest)."""
        lo = Int32(0)
        hi = Int32(1 << 30)
        if p == 0:
            lo = lo0
        if p == n_pieces - 1:
            hi = hi_last
        return lo, hi

    @cute.jit
    def _finish_piece(self, acc_O, work, tile, thr_mma_pv, sO, wg, wtid, piece):
        """The end of ``_consume`` for entries ``[lo, min(hi, n_full))`` of an item's list
        (``piece = (n_full, lo, hi, mWs, mFlags)``): a piece that does not start the list
        (``lo > 0``) leaves its unnormalized O and softmax state in this CTA's slot of
        ``mWs`` and raises its flag; one that starts it but ends early (``hi < n_full``) adds
        the next CTA's partial (``_sk_take``) before the epilogue."""
        n_full, lo, hi, mWs, mFlags = piece
        bidx, _, _ = cute.arch.block_idx()
        slot = Int32(bidx)
        if lo > 0:
            self._sk_put(acc_O, tile.smax, mWs, mFlags, slot, wg, wtid)
        else:
            if hi < n_full:
                self._sk_take(acc_O, tile.smax, mWs, mFlags, slot + 1, wg, wtid)
            self._epilogue(acc_O, work, tile, thr_mma_pv, sO, wg, wtid, n_full > 0)

    def _sk_base(self, slot, wg, wtid):
        """This thread's first value in ``mWs`` for CTA slot ``slot``: values ``j`` of a thread
        are 128 apart (coalesced per warp)."""
        per = self.wg_m * self.dv // 128 + 4
        return (slot * self.num_wg + wg) * (per * 128) + wtid

    @cute.jit
    def _sk_put(self, acc_O, smax, mWs, mFlags, slot, wg, wtid):
        """The warpgroup's partial (unnormalized O, per-row running max and lane-partial sum)
        into its slot, then its flag raised with a release after a warpgroup barrier."""
        base = self._sk_base(slot, wg, wtid)
        n_acc = cute.size(acc_O)
        n_rows = cute.size(smax.row_max)
        for j in cutlass.range_constexpr(n_acc):
            mWs[base + j * 128] = acc_O[j]
        for r in cutlass.range_constexpr(n_rows):
            mWs[base + (n_acc + r) * 128] = smax.row_max[r]
            mWs[base + (n_acc + n_rows + r) * 128] = smax.row_sum[r]
        cute.arch.barrier(barrier_id=self._wg_bar(wg), number_of_threads=128)
        if wtid == 0:
            st_release_s32(elem_ptr(mFlags, (slot * self.num_wg + wg,)), Int32(1))

    @cute.jit
    def _sk_take(self, acc_O, smax, mWs, mFlags, slot, wg, wtid):
        """Wait for slot ``slot``'s flag, then merge its partial into this warpgroup's O and
        softmax state (both to the larger running max; a row without keys in either stays
        empty)."""
        if wtid == 0:
            wait_at_least(elem_ptr(mFlags, (slot * self.num_wg + wg,)), Int32(1))
        cute.arch.barrier(barrier_id=self._wg_bar(wg), number_of_threads=128)
        base = self._sk_base(slot, wg, wtid)
        n_acc = cute.size(acc_O)
        n_rows = cute.size(smax.row_max)
        part = cute.make_fragment_like(acc_O)
        for j in cutlass.range_constexpr(n_acc):
            part[j] = ld_relaxed_f32(elem_ptr(mWs, (base + j * 128,)))
        acc_mn = acc_mn_view_wg(acc_O)
        part_mn = acc_mn_view_wg(part)
        sl2 = smax.scale_log2
        for r in cutlass.range_constexpr(n_rows):
            m2 = ld_relaxed_f32(elem_ptr(mWs, (base + (n_acc + r) * 128,)))
            l2 = ld_relaxed_f32(elem_ptr(mWs, (base + (n_acc + n_rows + r) * 128,)))
            m1 = smax.row_max[r]
            m = cute.arch.fmax(m1, m2)
            m_safe = 0.0 if m == -Float32.inf else m
            c1 = cute.math.exp2(m1 * sl2 - m_safe * sl2, fastmath=True)
            c2 = cute.math.exp2(m2 * sl2 - m_safe * sl2, fastmath=True)
            smax.row_max[r] = m
            smax.row_sum[r] = smax.row_sum[r] * c1 + l2 * c2
            acc_mn[r, None] = acc_mn[r, None].load() * c1 + part_mn[r, None].load() * c2

    @cute.jit
    def _handoff(self, tile, next_tile):
        """The next item's running max and sum become the current softmax state."""
        tile.smax.row_max.store(next_tile.smax.row_max.load())
        tile.smax.row_sum.store(next_tile.smax.row_sum.load())

    # ------------------------------------------------- two listed blocks per step
    def _mainloop(self, *args, **kw):
        """The shared mainloop (``AttnFwdSm90Ws._mainloop``), or with ``pair_step`` the walk
        of two listed blocks per step (``_pair_mainloop``, same arguments)."""
        if self.pair_step:
            return self._pair_mainloop(*args, **kw)
        return AttnFwdSm90Ws._mainloop(self, *args, **kw)

    def _pair_layouts(self):
        """(the register shape of a 64 x 128 score tile, the layout of one 64-column half
        of it): the tile's registers are its two halves' in turn, each half the
        accumulator of one 64-column GEMM."""
        wgm, bn = self.wg_m, self.list_bn
        mma128 = sm90_utils.make_trivial_tiled_mma(
            self.dtype, self.dtype, OperandMajorMode.K, OperandMajorMode.K, Float32, (1, 1, 1),
            (wgm, 2 * bn), warpgroup.OperandSource.SMEM)
        mma64 = sm90_utils.make_trivial_tiled_mma(
            self.dtype, self.dtype, OperandMajorMode.K, OperandMajorMode.K, Float32, (1, 1, 1),
            (wgm, bn), warpgroup.OperandSource.SMEM)
        s_shape = mma128.get_slice(0).partition_shape_C((wgm, 2 * bn))
        half = cute.make_layout(mma64.get_slice(0).partition_shape_C((wgm, bn)))
        return s_shape, half

    @cute.jit
    def _pair_half(self, acc_S, half, h: cutlass.Constexpr):
        """Half ``h`` (its 64 columns) of the 64 x 128 score tile ``acc_S``."""
        return cute.make_tensor(acc_S.iterator + h * cute.size(half), half)

    @cute.jit
    def _pair_qk(self, mma_qk, mma_qk0, tSrQ, tSrK, pipe_k, c, c2, acc_S, half):
        """Wait for K tiles ``c`` and ``c2``, then issue ``S = Q [K_c; K_c2]^T`` as two
        64-column GEMMs in one group (``c2 = c`` where the step has one block: its second
        half is then masked)."""
        pipe_k.consumer_wait(c)
        pipe_k.consumer_wait(c2)
        warpgroup.fence()
        for h in cutlass.range_constexpr(2):
            acc_h = self._pair_half(acc_S, half, h)
            stage = pipe_k.stage(c) if h == 0 else pipe_k.stage(c2)
            for k in cutlass.range_constexpr(cute.size(tSrQ, mode=[2])):
                cute.gemm(mma_qk0 if k == 0 else mma_qk, acc_h, tSrQ[None, None, k],
                          tSrK[None, None, k, stage], acc_h)
        warpgroup.commit_group()

    @cute.jit
    def _pair_pv(self, mma_pv, tOrP, tOrV, pipe_v, c, c2, acc_O):
        """Wait for V tiles ``c`` and ``c2``, then issue ``O += P [V_c; V_c2]``: the first
        half of P's K steps over V tile ``c``, the second over ``c2`` (``c2 = c`` where the
        step has one block: that half of P is 0)."""
        pipe_v.consumer_wait(c)
        pipe_v.consumer_wait(c2)
        warpgroup.fence()
        n_k = cute.size(tOrP, mode=[2])
        per = n_k // 2
        for k in cutlass.range_constexpr(n_k):
            stage = pipe_v.stage(c) if k < per else pipe_v.stage(c2)
            cute.gemm(mma_pv, acc_O, tOrP[None, None, k], tOrV[None, None, k % per, stage],
                      acc_O)
        warpgroup.commit_group()

    @cute.jit
    def _pair_release(self, pipe, c, second):
        """Release stage ``c`` of ``pipe`` and, where the step had a second block
        (``second`` 1), stage ``c + 1``."""
        pipe.consumer_release(c)
        if second > 0:
            pipe.consumer_release(c + 1)

    @cute.jit
    def _pair_pre(self, work, tile, rows, it0):
        """The step from list entry ``it0``: (1 where it has a second block else 0, the two
        blocks' ``_tile_pre`` values; an absent second block's valid count is 0)."""
        second = cutlass.min(work.n_count - 1 - it0, Int32(1))
        p0 = self._tile_pre(work, tile, rows, it0)
        p1 = self._tile_pre(work, tile, rows, it0 + second)
        if cutlass.const_expr(self.causal):
            p1 = (p1[0] * second, p1[1])
        else:
            p1 = p1 * second
        return second, p0, p1

    @cute.jit
    def _pair_p(self, acc_S, tile, state, pre, half):
        """Each half's key mask, then the online-softmax step over the 128 columns -> the
        16-bit P fragment."""
        corr = state[0]
        for h in cutlass.range_constexpr(2):
            acc_mn = acc_mn_view_wg(self._pair_half(acc_S, half, h))
            lim = pre[1 + h]
            if cutlass.const_expr(self.causal):
                key_lim, row_lim0 = lim
                if cutlass.min(key_lim, row_lim0) < self.list_bn:
                    tile.mask.apply_causal(acc_mn, key_lim, row_lim0, self.pack)
            else:
                if lim < self.list_bn:
                    tile.mask.apply(acc_mn, lim)
        if cutlass.const_expr(self.no_softmax):
            corr.fill(1.0)
        else:
            tile.smax.step(acc_mn_view_wg(acc_S), corr)
        rP = cute.make_fragment_like(acc_S, self.dtype)
        rP.store(acc_S.load().to(self.dtype))
        return rP

    @cute.jit
    def _pair_mainloop(self, mma_qk, mma_qk0, mma_pv, thr_mma_qk, tSrQ, tSrK, tOrV, acc_O,
                       pipe_k, pipe_v, c_kv, work, tile, rows, turns, wg, loader=None):
        """The overlapped mainloop over steps of two listed blocks (entries ``2 s`` and
        ``2 s + 1``, K / V ring slots ``c_kv + 2 s`` and ``+ 1``; the producer loads one
        block per slot, a step's two K tiles before its two V tiles): step ``s`` issues ``S_s`` (64 x 128) and
        the PV GEMM of step ``s - 1`` (128 K steps over its two V tiles), waits for
        ``S_s``, computes ``P_s`` while the PV GEMM runs, then waits for it and rescales O.
        An odd count's last step has one block: its second half reads the first block's
        K / V tiles again, with every key of that half masked (P = 0 there)."""
        s_shape, half = self._pair_layouts()
        a_vals = mma_pv.tv_layout_A.shape[1]
        state = self._tile_state(acc_O, tile)
        n = work.n_count
        steps = (n + 1) // 2
        acc_S = cute.make_rmem_tensor(s_shape, Float32)
        pre = self._pair_pre(work, tile, rows, Int32(0))
        self._pair_qk(mma_qk, mma_qk0, tSrQ, tSrK, pipe_k, c_kv, c_kv + pre[0], acc_S, half)
        warpgroup.wait_group(0)
        self._pair_release(pipe_k, c_kv, pre[0])
        rP = self._pair_p(acc_S, tile, state, pre, half)
        tOrP = cute.make_tensor(rP.iterator, acc_layout_as_a(rP.layout, a_vals))
        for s in cutlass.range(1, steps, unroll=1):
            c_new = c_kv + 2 * s
            acc_S2 = cute.make_rmem_tensor(s_shape, Float32)
            pre2 = self._pair_pre(work, tile, rows, 2 * s)
            self._pair_qk(mma_qk, mma_qk0, tSrQ, tSrK, pipe_k, c_new, c_new + pre2[0], acc_S2,
                          half)
            # step s - 1 had two blocks (only the last step may have one)
            self._pair_pv(mma_pv, tOrP, tOrV, pipe_v, c_new - 2, c_new - 1, acc_O)
            warpgroup.wait_group(1)
            self._pair_release(pipe_k, c_new, pre2[0])
            rP2 = self._pair_p(acc_S2, tile, state, pre2, half)
            if cutlass.const_expr(self.split_wait):
                # V tile c_new - 1 is still held, so this check passes at once; its wait
                # loop ends the basic block and keeps ptxas's wgmma wait below the score tile
                pipe_v.consumer_wait(c_new - 1)
            warpgroup.wait_group(0)
            self._keep_p(rP)
            pipe_v.consumer_release(c_new - 2)
            pipe_v.consumer_release(c_new - 1)
            self._pv_done(acc_O, state)
            self._p_into(rP, rP2)
        c_last = c_kv + 2 * (steps - 1)
        second = cutlass.min(n - 1 - 2 * (steps - 1), Int32(1))
        self._pair_pv(mma_pv, tOrP, tOrV, pipe_v, c_last, c_last + second, acc_O)
        warpgroup.wait_group(0)
        self._pair_release(pipe_v, c_last, second)
        return c_kv + n

    def _half_coords(self, wtid):
        """``pair_box``: the (row, column) coordinates of a thread's values of one 64-column
        half of the 64 x 128 score tile (those of a 64-column GEMM's accumulator; the
        second half's registers hold the same coordinates 64 columns further)."""
        mma64 = sm90_utils.make_trivial_tiled_mma(
            self.dtype, self.dtype, OperandMajorMode.K, OperandMajorMode.K, Float32, (1, 1, 1),
            (self.wg_m, self.list_bn), warpgroup.OperandSource.SMEM)
        return acc_mn_view_wg(mma64.get_slice(wtid).partition_C(
            cute.make_identity_tensor((self.wg_m, self.list_bn))))

    def _tma_atoms(self, tQ, tK, tV, sQ_layout, sK_layout, sV_layout):
        """``AttnFwdSm90Ws._tma_atoms``; with ``pair_box`` the K / V boxes are one 64-row
        block (half a stage)."""
        if not self.pair_box:
            return AttnFwdSm90Ws._tma_atoms(self, tQ, tK, tV, sQ_layout, sK_layout, sV_layout)
        wgm, d, dv, bn = self.wg_m, self.d, self.dv, self.list_bn
        g2s = cpasync.CopyBulkTensorTileG2SOp()
        k_half = sm90_utils.make_smem_layout_b(LayoutEnum.ROW_MAJOR, (wgm, bn, d), self.dtype, 1)
        v_half = sm90_utils.make_smem_layout_b(LayoutEnum.COL_MAJOR, (wgm, dv, bn), self.dtype, 1)
        tma_q, tma_tQ = cpasync.make_tiled_tma_atom(
            g2s, tQ, cute.slice_(sQ_layout, (None, None, 0)), (wgm, d))
        tma_k, tma_tK = cpasync.make_tiled_tma_atom(
            g2s, tK, cute.slice_(k_half, (None, None, 0)), (bn, d))
        tma_v, tma_tV = cpasync.make_tiled_tma_atom(
            g2s, tV, cute.slice_(v_half, (None, None, 0)), (dv, bn))
        return tma_q, tma_tQ, tma_k, tma_tK, tma_v, tma_tV

    @cute.jit
    def _kv_partitions(self, work, tma_k, tma_tK, sK, tma_v, tma_tV, sV):
        """``AttnFwdSm90Ws._kv_partitions``; with ``pair_box`` per half of a stage: ``(tKs,
        tKg, tVs, tVg)`` with ``tKs`` / ``tVs`` pairs (the stages' first and second 64-row
        halves) and ``tKg`` / ``tVg`` over the 64-row blocks of the views."""
        if cutlass.const_expr(not self.pair_box):
            return AttnFwdSm90Ws._kv_partitions(self, work, tma_k, tma_tK, sK, tma_v, tma_tV,
                                                sV)
        bn, d, dv = self.list_bn, self.d, self.dv
        gK = cute.local_tile(self._k_tile(tma_tK, work), (bn, d), (None, 0))
        gV = cute.local_tile(self._v_tile(tma_tV, work), (dv, bn), (0, None))
        sKd = cute.flat_divide(sK, (bn, d))  # (64, D, 2, 1, stages)
        sVd = cute.flat_divide(sV, (dv, bn))  # (Dv, 64, 1, 2, stages)
        tKs0, tKg = self._box_partition(tma_k, sKd[None, None, 0, 0, None], gK)
        tKs1 = self._box_partition(tma_k, sKd[None, None, 1, 0, None], gK)[0]
        tVs0, tVg = self._box_partition(tma_v, sVd[None, None, 0, 0, None], gV)
        tVs1 = self._box_partition(tma_v, sVd[None, None, 0, 1, None], gV)[0]
        return (tKs0, tKs1), tKg, (tVs0, tVs1), tVg

    @staticmethod
    def _box_partition(atom, s_part, g):
        """TMA partition ``(smem, gmem)`` of the (rows, cols, stages) shared-memory part
        ``s_part`` and the tiled view ``g``, one box of ``atom`` per tile."""
        return cpasync.tma_partition(atom, 0, cute.make_layout(1), cute.group_modes(s_part, 0, 2),
                                     cute.group_modes(g, 0, 2))

    def _issue_kv(self, *args):
        """``AttnFwdSm90Ws._issue_kv``, or with ``pair_box`` the loads of one step's two blocks
        (``_issue_kv_box``, same arguments)."""
        if self.pair_box:
            return self._issue_kv_box(*args)
        return AttnFwdSm90Ws._issue_kv(self, *args)

    @cute.jit
    def _issue_kv_box(self, work, step, nk, tma_k, tKg, tKs, tma_v, tVg, tVs, sV_rows, pipe_k,
                      pipe_v, k_bytes, v_bytes, c, lane):
        """Step ``step``'s two blocks into stage ``c`` of the K and V rings, the first into
        the stages' first 64 rows and the second into the others, under one full barrier
        per ring: K by TMA (a step without a second block leaves that half as it was: its
        keys are masked); V by TMA, or, where ``_v_limit`` says a box would read rows it
        must not (and for a step without a second block), the zero-filling row copy, done
        before the barrier's arrival."""
        n0, n1, second = work.kv.blocks(step)
        s = pipe_k.stage(c)
        pipe_k.producer_acquire(c)
        pipe_k.producer_expect_tx(c, (k_bytes // 2) * (1 + second))
        cute.copy(tma_k, tKg[None, n0], tKs[0][None, s], tma_bar_ptr=pipe_k.full_ptr(c),
                  **self._l2(L2_EVICT_LAST))
        if second > 0:
            cute.copy(tma_k, tKg[None, n1], tKs[1][None, s], tma_bar_ptr=pipe_k.full_ptr(c),
                      **self._l2(L2_EVICT_LAST))
        sv = pipe_v.stage(c)
        pipe_v.producer_acquire(c)
        lim0, ok0 = self._v_limit(work, n0)
        lim1, ok1 = self._v_limit(work, n1)
        lim1 = lim1 * second
        use0 = Int32(1) if ok0 else Int32(0)
        use1 = Int32(1) if ok1 else Int32(0)
        use1 = use1 * second
        halves = cute.flat_divide(sV_rows, (self.list_bn, self.dv))  # (64, Dv, 2, 1, stages)
        if use0 == 0:
            self._load_v_rows(work, n0, lim0, halves[None, None, 0, 0, None], sv, lane)
        if use1 == 0:
            self._load_v_rows(work, n1, lim1, halves[None, None, 1, 0, None], sv, lane)
        pipe_v.producer_expect_tx(c, (v_bytes // 2) * (use0 + use1))
        if use0 > 0:
            cute.copy(tma_v, tVg[None, n0], tVs[0][None, sv], tma_bar_ptr=pipe_v.full_ptr(c),
                      **self._l2(L2_EVICT_LAST))
        if use1 > 0:
            cute.copy(tma_v, tVg[None, n1], tVs[1][None, sv], tma_bar_ptr=pipe_v.full_ptr(c),
                      **self._l2(L2_EVICT_LAST))

    # ------------------------------------------------- variation points (AttnFwdSm90Ws)
    def _q_tile(self, tma_tQ, work):
        return tma_tQ[None, None, work.head, work.batch]

    def _k_tile(self, tma_tK, work):
        return tma_tK[None, None, work.head_kv, work.batch]

    def _v_tile(self, tma_tV, work):
        return tma_tV[None, None, work.head_kv, work.batch]

    def _v_limit(self, work, n):
        """Valid keys of block ``n``; a box crossing S is zero-filled by TMA, so only
        block_sizes partial blocks inside S need the zero-filling copy."""
        limit = work.kv.valid_keys(n)
        bn = self.list_bn
        return limit, limit >= cutlass.min(Int32(bn), work.kv.seqlen_k - n * bn)

    @cute.jit
    def _load_v_rows(self, work, n, limit, sV_rows, stage, lane):
        """One warp: V rows [n bn, n bn + limit) by cp.async, zeros in the rest of the tile."""
        gV = cute.local_tile(work.mV[work.batch, None, work.head_kv, None],
                             (self.list_bn, self.d), (n, 0))
        self._copy_v_rows(gV, limit, sV_rows, stage, lane)

    def _work_start(self, tile):
        tile.smax.reset()

    def _work_rows(self, work, tile):
        return None

    @cute.jit
    def _tile_state(self, acc_O, tile):
        """The online softmax's per-row correction factors, the row view of O, the softmax."""
        corr = cute.make_rmem_tensor((cute.size(tile.mask.tScS, mode=[0]),), Float32)
        return corr, acc_mn_view_wg(acc_O), tile.smax

    def _tile_pre(self, work, tile, rows, it):
        """The valid key count of iteration ``it``'s block (metadata loads issued before the
        QK GEMM is waited on); causal: with the tile's ``row_lim0`` (``mask.KeyLimitMask``).
        ``pair_box``: ``(second, first block's, second block's)`` of step ``it`` (the second
        block's count 0 where the step has none)."""
        if self.pair_box:
            n0, n1, second = work.kv.blocks(it)
            p0 = self._block_pre(work, tile, n0)
            p1 = self._block_pre(work, tile, n1)
            if self.causal:
                return second, p0, (p1[0] * second, p1[1])
            return second, p0, p1 * second
        return self._block_pre(work, tile, work.kv.kv_tile(it))

    def _block_pre(self, work, tile, n):
        """``_tile_pre`` of block ``n``."""
        if self.causal:
            if self.pack > 1:
                # packed rows: tile.mw0 (a multiple of 64, so of r) is position mw0 / r and
                # tile.seqlen_q is S_q r
                row_lim0 = (tile.mw0 // self.pack + work.kv.seqlen_k
                            - tile.seqlen_q // self.pack + 1 - n * self.list_bn)
            else:
                row_lim0 = tile.mw0 + work.kv.seqlen_k - tile.seqlen_q + 1 - n * self.list_bn
            return work.kv.valid_keys(n), row_lim0
        return work.kv.valid_keys(n)

    @cute.jit
    def _tile_p(self, acc_S, work, tile, rows, state, pre, it):
        """Key mask and online-softmax step of a score tile -> the 16-bit P fragment;
        without ``overlap`` O is rescaled here (its PV GEMM has completed)."""
        if cutlass.const_expr(self.pair_box):
            return self._pair_p(acc_S, tile, state, pre, self._pair_layouts()[1])
        corr, acc_O_mn, _ = state
        self._score_tile(acc_S, pre, tile.mask, tile.smax, corr)
        if cutlass.const_expr(not self.overlap):
            tile.smax.rescale(acc_O_mn, corr)
        rP = cute.make_fragment_like(acc_S, self.dtype)
        rP.store(acc_S.load().to(self.dtype))
        return rP

    @cute.jit
    def _pv_done(self, acc_O, state):
        """O holds P_{j-1} V_{j-1} now: bring it to block j's running max."""
        corr, acc_O_mn, smax = state
        smax.rescale(acc_O_mn, corr)

    @cute.jit
    def _score_tile(self, acc_S, limit, mask, smax, corr):
        """Mask the keys past the block's valid count ``limit``, then the online-softmax
        step. The caller reads ``limit`` (metadata loads) before it waits for the GEMM, so
        their latency hides behind it."""
        acc_mn = acc_mn_view_wg(acc_S)
        if cutlass.const_expr(self.causal):
            # ---- causal: ``limit`` is (valid count, row_lim0); only diagonal-crossing or
            # partial blocks are masked
            key_lim, row_lim0 = limit
            if cutlass.min(key_lim, row_lim0) < self.bn:
                mask.apply_causal(acc_mn, key_lim, row_lim0, self.pack)
        else:
            if limit < self.bn:
                mask.apply(acc_mn, limit)
        if cutlass.const_expr(self.no_softmax):
            corr.fill(1.0)
        else:
            smax.step(acc_mn, corr)

    @cute.jit
    def _epilogue(self, acc_O, work, tile, thr_mma_pv, sO, wg, wtid, has_work):
        """``O / l`` -> 16 bit -> smem (swizzled) -> TMA tensor stores (``tma_o``) or 128-bit
        stores of rows ``< S_q``; LSE (``lse = -inf`` and ``O = 0``, from registers, for a
        work item without listed blocks). Split-KV: the
        split's fp32 partial ``O / l`` and LSE (``_epilogue_split``)."""
        if cutlass.const_expr(self.kv_splits > 1):
            self._epilogue_split(acc_O, work, tile, thr_mma_pv, wtid)
        else:
            self._epilogue_out(acc_O, work, tile, thr_mma_pv, sO, wg, wtid, has_work)

    @cute.jit
    def _epilogue_split(self, acc_O, work, tile, thr_mma_pv, wtid):
        """Split-KV: ``O / l`` of this warpgroup's rows ``< S_q`` in fp32 from registers into
        ``mO[split, b, h]`` and their LSE into ``mLSE[split, b, h]`` (a split without keys:
        ``O = 0`` from the zero-filled accumulator, ``lse = -inf``). Packed rows (``pack_gqa``;
        ``work.head`` is the KV head, rows ``mw0 + i < S_q r``): each row into the row
        ``mO[split, b, h, s]`` / ``mLSE[split, b, h, s]`` of its (position ``s``, query head
        ``h``) (``pack_gqa.packed_row``). No shared memory: an item without KV tiles must
        not touch the Q buffer the producer may be refilling."""
        wgm, d = self.wg_m, self.d
        mw0 = tile.mw0
        lim = tile.seqlen_q - mw0
        acc_O_mn = acc_mn_view_wg(acc_O)
        tOcO_mn = acc_mn_view_wg(thr_mma_pv.partition_C(cute.make_identity_tensor((wgm, d))))
        if cutlass.const_expr(self.pack == 1):
            mLSE_s = tile.mLSE[tile.split, work.batch, work.head, None]
        for r in cutlass.range_constexpr(cute.size(acc_O_mn, mode=[0])):
            inv, lse = tile.smax.finalize(r)
            row = tOcO_mn[r, 0][0]
            if row < lim:
                if cutlass.const_expr(self.pack > 1):
                    s, h = packed_row(mw0 + row, work.head, self.pack)
                    if wtid % 4 == 0:
                        tile.mLSE[tile.split, work.batch, h, s] = lse
                    # a (wgm, d) view whose every row is global row (s, h): the
                    # accumulator's partition of it addresses this thread's columns of it
                    gRow = cute.make_tensor(
                        tile.mO[tile.split, work.batch, h, s, None].iterator,
                        cute.make_layout((wgm, d), stride=(0, 1)))
                    tRow = acc_mn_view_wg(thr_mma_pv.partition_C(gRow))
                    for c in cutlass.range_constexpr(cute.size(acc_O_mn, mode=[1])):
                        tRow[r, c] = acc_O_mn[r, c] * inv
                else:
                    if wtid % 4 == 0:
                        mLSE_s[mw0 + row] = lse
            if cutlass.const_expr(self.pack == 1):
                acc_O_mn[r, None] = acc_O_mn[r, None].load() * inv
        if cutlass.const_expr(self.pack == 1):
            gP = cute.local_tile(tile.mO[tile.split, work.batch, work.head, None, None],
                                 (wgm, d), (mw0 // wgm, 0))
            tPg = thr_mma_pv.partition_C(gP)
            tPc = thr_mma_pv.partition_C(cute.make_identity_tensor((wgm, d)))
            for e in cutlass.range_constexpr(cute.size(acc_O)):
                if tPc[e][0] < lim:
                    tPg[e] = acc_O[e]

    @cute.jit
    def _epilogue_out(self, acc_O, work, tile, thr_mma_pv, sO, wg, wtid, has_work):
        wgm, d = self.wg_m, self.d
        mw0 = tile.mw0
        lim = tile.seqlen_q - mw0
        acc_O_mn = acc_mn_view_wg(acc_O)
        tOcO_mn = acc_mn_view_wg(thr_mma_pv.partition_C(cute.make_identity_tensor((wgm, d))))
        for r in cutlass.range_constexpr(cute.size(acc_O_mn, mode=[0])):
            inv, lse = tile.smax.finalize(r)
            row = tOcO_mn[r, 0][0]
            if row < lim:
                if wtid % 4 == 0:
                    if cutlass.const_expr(self.pack > 1):
                        s, h = packed_row(mw0 + row, work.head, self.pack)
                        tile.mLSE[work.batch, h, s] = lse
                    else:
                        tile.mLSE[work.batch, work.head, mw0 + row] = lse
            acc_O_mn[r, None] = acc_O_mn[r, None].load() * inv
        if cutlass.const_expr(self.tma_o):
            if has_work:
                # packed rows: work.head is the KV head and the view's rows the packed rows
                gO = cute.local_tile(tile.tma_tO[None, None, work.head, work.batch], (wgm, d),
                                     (None, 0))
                self._store_o_tma(acc_O, None, thr_mma_pv, sO, tile.tma_o, gO, mw0 // wgm, wg,
                                  wtid)
            elif cutlass.const_expr(self.pack > 1):
                self._store_o_packed(acc_O, thr_mma_pv, self._plain_o(sO), tile.mO, work, mw0,
                                     tile.seqlen_q, wg, wtid, False)
            else:
                self._store_o(acc_O, None, thr_mma_pv, self._plain_o(sO),
                              tile.mO[work.batch, None, work.head, None], mw0, tile.seqlen_q,
                              wg, wtid, False)
        elif cutlass.const_expr(self.pack > 1):
            self._store_o_packed(acc_O, thr_mma_pv, sO, tile.mO, work, mw0, tile.seqlen_q, wg,
                                 wtid, has_work)
        else:
            self._store_o(acc_O, None, thr_mma_pv, sO,
                          tile.mO[work.batch, None, work.head, None], mw0, tile.seqlen_q, wg,
                          wtid, has_work)

    @cute.jit
    def _store_o_packed(self, acc_O, thr_mma_pv, sO, mO, work, mw0, n_rows, wg, wtid,
                        has_work):
        """``_store_o`` for packed rows: 16 bit -> smem -> 128-bit stores of this warpgroup's
        packed rows ``mw0 + i < n_rows`` (``S_q r``), each to its own (position, query head)
        row of ``mO`` (B, S, H, D); an item without KV tiles stores zeros from registers.
        With ``epi_vec`` the tile is staged by ``common.stage_acc_swz`` and read back in
        16-byte pieces, consecutive threads on consecutive pieces of a row."""
        wgm, dv = self.wg_m, self.dv
        bar_id = 3 + wg
        lim = n_rows - mw0
        if has_work:
            if cutlass.const_expr(self._epi_vec()):
                stage_acc_swz(acc_O, thr_mma_pv.partition_C(cute.make_identity_tensor((wgm, dv))),
                              sO.iterator, dv, self.dtype == cutlass.BFloat16)
            else:
                rO = cute.make_fragment_like(acc_O, self.dtype)
                rO.store(acc_O.load().to(self.dtype))
                cute.autovec_copy(rO, thr_mma_pv.partition_C(sO))
            cute.arch.barrier(barrier_id=bar_id, number_of_threads=128)
        if cutlass.const_expr(self._epi_vec()):
            if has_work:
                per = 16 // (self.dtype.width // 8)
                chunks = dv // per
                for it in cutlass.range_constexpr(wgm * chunks // 128):
                    k = it * 128 + wtid
                    row = k // chunks
                    piece = k % chunks
                    if row < lim:
                        s, h = packed_row(mw0 + row, work.head, self.pack)
                        g_ptr = cute.make_ptr(
                            self.dtype, elem_ptr(mO, (work.batch, s, h, piece * per)).toint(),
                            cute.AddressSpace.gmem, assumed_align=16)
                        cute.make_tensor(g_ptr, cute.make_layout(per)).store(
                            cute.make_tensor(swz_piece_ptr(sO.iterator, row, piece, dv,
                                                           self.dtype),
                                             cute.make_layout(per)).load())
            else:
                self._rows_packed(sO, mO, work, mw0, lim, wtid, False)
        else:
            self._rows_packed(sO, mO, work, mw0, lim, wtid, has_work)
        if has_work:
            # every thread's smem reads are done before the buffer is written again
            cute.arch.barrier(barrier_id=bar_id, number_of_threads=128)

    @cute.jit
    def _rows_packed(self, sO, mO, work, mw0, lim, wtid, from_smem):
        """This warpgroup's packed rows ``mw0 + i`` with ``i < lim`` to their (position, query
        head) rows of ``mO`` in 128-bit stores: from the element-copy staging ``sO`` where
        ``from_smem``, else zeros."""
        wgm, dv = self.wg_m, self.dv
        copy_o = gmem_store_copy(self.dtype, 128, dv)
        thr = copy_o.get_slice(wtid)
        tOs = thr.partition_S(sO)
        tOc = thr.partition_S(cute.make_identity_tensor((wgm, dv)))
        for r in cutlass.range_constexpr(cute.size(tOs.shape[1])):
            row = tOc[0, r, 0][0]
            if row < lim:
                s, h = packed_row(mw0 + row, work.head, self.pack)
                tOg = thr.partition_D(row_tile_view(mO, work.batch, s, h, wgm, dv))
                rr = cute.make_fragment_like(tOs[None, r, None])
                if from_smem:
                    cute.autovec_copy(tOs[None, r, None], rr)
                else:
                    rr.fill(0)
                cute.copy(copy_o, rr, tOg[None, r, None])
