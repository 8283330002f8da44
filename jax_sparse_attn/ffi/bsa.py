"""cutlass_call adapters for the block-sparse attention (BSA) CuTe DSL kernels.

Contract (docs/design.md): ``bsa_fwd`` / ``bsa_bwd`` take and return ``jax.Array``s, are
traceable under ``jax.jit``, contain no ``custom_vjp`` and do no value validation. The
public layer has already normalized the metadata
(:func:`jax_sparse_attn.metadata.normalize_bsa_metadata`): ``q2k_block_nums`` is int32
``(B, H_q, N_q)`` and ``block_sizes`` is ``None`` or int32 ``(B, H_q, N_kv)``.

Tensors stay in the caller's layout: the kernels see logical ``(B, S, H, D)`` modes and
``bhsd`` buffers are presented that way through ``TensorSpec(mode=(0, 2, 1, 3))`` (no
transpose). ``softmax_scale`` travels as a ``(1,)`` float32 device array, never as a
compile key; compile keys are the frozen ``BsaFwdConfig`` / ``BsaBwdConfig`` /
``BsaPreConfig`` dataclasses, which the public layer derives once per call and keeps in
its :class:`~jax_sparse_attn.config.BSAConfig`.

Kernels (``jax_sparse_attn/kernels``):

* D in {64, 128}: ``bsa_fwd_sm90_ws`` (``bsa_fwd_impl`` ``"auto"`` / ``"sm90ws"``: the
  warp-specialized TMA + wgmma mainloop, TMA producer warp, persistent grid; the switch
  ``bsa_fwd_ws`` (tuning / ablation) sets its variants) / ``bsa_bwd_sm90`` (warpgroup MMA)
  by default, both sm_90a;
* D in {32, 256}: ``bsa_fwd_sm80`` / ``bsa_bwd_sm80`` (warp-level ``mma.sync``, also run on
  sm_90a). The switches ``bsa_fwd_impl`` / ``bsa_bwd_impl`` = ``"sm80"`` of
  :class:`jax_sparse_attn.config.Switches` force the ``mma.sync`` kernels for every D
  (:func:`fwd_config` / :func:`bwd_config` put the choice in the compile key).

Split-KV (``kv_splits``, resolved by :func:`resolve_kv_splits` into ``BsaFwdConfig.kv_splits``;
every forward): the forward writes per split fp32 partial outputs and LSEs into two
XLA-owned outputs ``(S, B, H_q, S_q, D)`` / ``(S, B, H_q, S_q)``, then the combine kernel
(``kernels/bsa_combine.py``, compile key ``BsaCombineConfig``) merges them into ``out`` and
``lse`` (:func:`_bsa_fwd_split`). ``kv_splits = 1`` runs the forward of before.

Backward structure (all launches on XLA's stream, all buffers XLA-owned):

1. The preprocessing kernel (``kernels/bsa_pre.py``, default; the switch
   ``bsa_pre_impl="xla"`` uses an XLA fusion instead): ``delta = rowsum(dO * O)`` in fp32 and a zero-initialised
   fp32 ``dq`` accumulator (same physical layout as q) in one launch; the dK/dV/dQ kernel
   then updates the accumulator in place (``input_output_aliases``).
2. The K->Q transposed block lists (CSR) built on the device from the forward metadata
   each call (:func:`jax_sparse_attn.metadata.build_kq_csr`, XLA fusions; with the switch
   ``bsa_kq_impl`` ``"items"`` (the default) or ``"kernel"`` the Hopper backwards' lists
   come from one launch of ``kernels/bsa_kq_lists.py``, :func:`kq_lists`, which with
   ``"items"`` also computes the sm90ws bucket split's work items).
3. One dK/dV/dQ kernel: a CTA per (64-key tile, KV head, batch) walks the (query head in
   the GQA group, query block) entries that listed its KV block, keeps dK/dV in
   registers and adds each dQ tile to the fp32 accumulator (``sm90``: bulk
   ``cp.reduce.async.bulk .add.f32`` of shared-memory rows; ``sm80``: ``atomicAdd``).
   (``sm90ws``: a CTA per whole KV block, ``red.global.add.v2.f32``). Determinism: dK and
   dV are bitwise deterministic (fixed entry order, no atomics); by default dQ is not (the
   order of the fp32 additions varies from run to run). ``deterministic=True``
   (:func:`_bsa_bwd_deterministic`, sm90ws only) orders them: each K->Q entry carries the
   rank of its KV block in its query row, and zeroed int32 semaphores per 64-row query
   tile (one per fp32 accumulator of the tile, :func:`det_slots_of`) let the contributions
   in, in rank order. In the schedule order the ranks come from the order kernel
   (:func:`det_schedule_order`), launched before the backward, or with ``bsa_bwd_ws``
   ``detstream`` in the backward's own call (:func:`_bsa_bwd_det_stream`; ``detoverlap``:
   the preprocessing too), the backward reading each entry as it is published.
4. ``dq = dq_accum.astype(q.dtype)`` (XLA).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp

from .. import _platform, metadata
from ..config import BSA_DET_ORDER_FLAGS

SUPPORTED_HEAD_DIMS = (32, 64, 128, 256)
SUPPORTED_BLOCK_SIZES = (64, 128)
_DTYPES = ("float16", "bfloat16")
#: head dims of the wgmma (sm90) kernels; other head dims use the mma.sync (sm80) kernels
_SM90_HEAD_DIMS = (64, 128)


@dataclasses.dataclass(frozen=True)
class BsaFwdConfig:
    """Compile key of the BSA forward. ``impl``: "sm90ws" (warp-specialized TMA + wgmma
    kernel, D in {64, 128}) or "sm80" (mma.sync kernel); ``q_in_regs`` / ``min_blocks`` /
    ``late_v_wait`` / ``warp_rows`` only apply to sm80, the ``ws_*`` fields and ``num_sms``
    only to sm90ws."""

    dtype: str
    head_dim: int
    block_size: int
    has_block_sizes: bool
    impl: str
    q_in_regs: bool = True
    min_blocks: int = 0
    late_v_wait: bool = False
    warp_rows: int = 16
    # "sm90ws" only: intra-warpgroup GEMM overlap, ping-pong (blk 128), Q stages, most K/V
    # stages, SMs of the persistent grid
    ws_overlap: bool = True
    ws_pingpong: bool = True
    ws_q_stages: int = 2
    ws_max_stages: int = 4
    # work items (batch, KV head, query block, head of the group), else query block major
    ws_head_major: bool = True
    # the online softmax rescales O only when a row max grows by more than 2^8 (else: always)
    ws_lazy_rescale: bool = False
    # three CTAs per SM instead of two (blk 64 at D 64, where their shared memory fits)
    ws_three_ctas: bool = False
    # O staged in the single Q buffer first (more K/V stages)
    ws_o_alias: bool = False
    # O staged in the work item's own Q buffer (two Q buffers), the O buffer's bytes as
    # further V stages (the default at D 128, "oinq" / "nooinq" on / off; with the TMA O
    # stores, without split-KV or pack_gqa)
    ws_o_in_q: bool = False
    # the overlapped mainloop rescales O for tile j - 1 after issuing S_j, under that GEMM,
    # instead of after the PV GEMM of tile j - 2 has completed ("oearly"; not with chained
    # items or nooverlap)
    ws_o_early: bool = False
    # the online softmax adds a thread's probabilities of a row pairwise ("sumtree")
    ws_tree_sum: bool = False
    # the metadata clamped by XLA before the kernel, as the other forwards need ("xlaclamp";
    # the sm90ws kernel clamps every value it reads itself)
    ws_xla_clamp: bool = False
    # each query block's active list sorted into ascending block order by XLA before the
    # kernel, so that the work items running at once read nearby K / V blocks ("sortlists")
    ws_sort_lists: bool = False
    # timing ablation, wrong results: the producer skips the K / V loads of every N-th tile
    # it issues ("skipload=N"; 0 off)
    ws_skip_load: int = 0
    # sparse_block_size 128 walked by 64-row work items, one consumer warpgroup per CTA: 1
    # one CTA per SM ("half"), 2 two CTAs per SM with one Q buffer that O is staged in, one
    # K and two V stages ("half2"); 0 off
    ws_half_items: int = 0
    # S = Q K^T as two 64-column GEMMs at sparse_block_size 128 ("sn64", an ablation)
    ws_s_n64: bool = False
    # the deeper K ring: with O in the Q buffer the stage that the plan adds goes to K, not
    # V ("kdeep"; the producer issues K ahead of V only with "vlag")
    ws_k_deep: bool = False
    # blk 64 (D 128) walked two listed blocks per step, 64 x 128 score tiles: 1 with O in
    # the Q buffer (two K, three V stages; "pairstep"), 2 / 3 / 4 with one Q buffer that O is
    # staged in and two K, four V / three K, three V / four K, two V stages ("pairstep4",
    # "pairstepk3", "pairstepk4"); 0 off
    ws_pair_step: int = 0
    # two producer warps, one issuing Q and K, the other V ("kvwarps"; the plain producer
    # loop only: not with vlag, mpre, qahead, pairwg, ctas3k1, selfload, streamk, skipload)
    ws_kv_warps: bool = False
    # blk 64 (D 128) lists walked two entries per step into 128-row K / V stages, each
    # stage's halves one 64-row TMA box each under one barrier, one S GEMM of 64 x 128
    # ("pairbox"; one Q buffer, one K and two V stages)
    ws_pair_box: bool = False
    # K / V stages freed by one arrival per consumer warpgroup instead of one per consumer
    # warp ("wgrelease"; not with selfload)
    ws_wg_release: bool = False
    # timing ablation, wrong results: no online-softmax step on the score tiles ("nosm")
    ws_no_softmax: bool = False
    # K steps of the PV GEMM interleaved with the next S GEMM's, in its wgmma group ("mix=N";
    # 0 off)
    ws_mix_pv: int = 0
    # consecutive work items of a CTA chained (next item's first S = QK^T issued with this
    # item's last PV GEMM, the epilogue after it; 2: the epilogue during that S GEMM; 0: off,
    # the default: slower on the H200)
    ws_cross: int = 0
    # the producer issues V tile j after K tile j + 1 ("vlag")
    ws_v_lag: bool = False
    # the V tile's full barrier re-checked before the wait of the PV GEMM (the default at
    # blk 64 with D 128; "splitwait" / "nosplitwait" force it on / off)
    ws_split_wait: bool = False
    # Q as the register operand of S = Q K^T, copied from shared memory once per work item
    # ("qregs")
    ws_q_regs: bool = False
    # the next work item's list count (and, in the producer, first entry) loaded during the
    # current item ("mpre")
    ws_meta_prefetch: bool = False
    # the next work item's Q issued by the producer during the current item ("qahead")
    ws_q_ahead: bool = False
    # the epilogue's O staged with packed pair stores into a row-swizzled tile (off with
    # "noepivec": the element copies of the swizzled layout)
    ws_epi_vec: bool = True
    # the items past the last whole wave but one split into equal ranges of listed blocks,
    # one per CTA ("streamk"); the call then has the fp32 partial workspace and flags
    ws_stream_k: bool = False
    # O written by TMA tensor stores from the epilogue's staging tile (without split-KV or
    # "oalias"; packed rows only with ws_tma_o_packed; off with "notmao")
    ws_tma_o: bool = True
    # packed GQA rows by TMA stores too (off with "notmaopack" or "notmao")
    ws_tma_o_packed: bool = True
    # blk 64 D 128: three CTAs per SM with one K buffer, two V buffers and O staged in the
    # single Q buffer ("ctas3k1"; ws_three_ctas is then set too)
    ws_k_single: bool = False
    # with ws_k_single: no producer warp, the consumer warpgroup issues its loads ("selfload")
    ws_self_load: bool = False
    # blk 64: two consumer warpgroups per CTA with work items of their own, taking turns at
    # their GEMMs ("pairwg")
    ws_pair_wg: bool = False
    # the L2 policies of the TMA copies (kernels.common.L2_HINT_*): 1 ("l2hint") Q loads
    # (evict_last with split-KV or stream-K, whose items share a query tile) and O stores
    # evict_first, K / V loads evict_last; 2 ("l2normal") evict_normal everywhere; 0 the
    # copies' default operand
    ws_l2_hint: int = 0
    num_sms: int = 0
    arch: str = ""  # the target arch (CuTe DSL name) the key was chosen for
    # pack_gqa: query heads per KV head r of the packed rows (1: not packed; sm90ws only)
    pack_gqa: int = 1
    # split-KV: work items (query block, split, head), fp32 partial outputs merged by the
    # combine kernel; 1 = no split (the kernels compile without it)
    kv_splits: int = 1
    # the token-level causal mask inside the listed blocks ("sm90ws" only)
    causal: bool = False
    # "sm90ws" only: programmatic dependent launch (Switches.pdl)
    pdl: bool = False


@dataclasses.dataclass(frozen=True)
class BsaBwdConfig:
    """Compile key of the BSA dK/dV/dQ kernel (``min_blocks`` only applies to sm80)."""

    dtype: str
    head_dim: int
    block_size: int
    has_block_sizes: bool
    impl: str
    min_blocks: int = 0
    arch: str = ""  # the target arch (CuTe DSL name)
    # sm80: dQ pairs added with one vector atomic (sm_90+), else with two scalar
    # red.global.add.f32 (sm_8x; _platform.vec_red)
    vec_red: bool = True
    # sm80: Q/dO shared-memory stages (2: prefetch of the next step; 1 where 2 do not fit)
    q_stages: int = 2
    # pack_gqa: query heads per KV head r of the packed rows (1: not packed; sm90ws and sm90)
    pack_gqa: int = 1
    # the token-level causal mask inside the listed blocks ("sm90", "sm90ws")
    causal: bool = False
    # "sm90ws" only: most Q / dO stages (the shared-memory plan takes the most that fit),
    # and whether the producer waits for each step's lse / delta copies (ablation)
    ws_max_stages: int = 4
    ws_ld_wait: bool = False
    # "sm90ws" only: CTAs walk the KV blocks longest K->Q list first (else in grid order);
    # with ws_lpt_chain longest first within each (batch, KV head), the chains in order
    # ("hlpt", the default where lists are not split in buckets; "lpt" over all chains,
    # "nolpt" grid order)
    ws_lpt: bool = False
    ws_lpt_chain: bool = False
    # "sm90ws" only, blk 128: each consumer warpgroup adds the dQ of its own keys
    ws_decouple: bool = False
    # bitwise reproducible dQ: the additions to each query tile in ascending KV block order
    # (rank per K->Q entry, semaphore workspace; "sm90ws" only), and the launch groups of the
    # order (metadata.build_kq_csr's rank_group; 0: ascending KV block order)
    deterministic: bool = False
    det_group: int = 0
    # deterministic with the schedule order (det_schedule_window; 0: det_group's order):
    # the window of metadata.kq_schedule_order_reference, CTAs the GPU holds (held_ctas)
    det_window: int = 0
    # the schedule-order kernel: its fewer serialized shared-memory operations per
    # sub-round ("ordfast") and the entries a proposal scan checks at once ("ordscan=N");
    # the same order either way
    det_order_fast: bool = False
    det_order_scan: int = 4
    held_ctas: int = 0
    # the window is the default's (no bsa_bwd_ws order option): the schedule order runs
    # only where the measurements favour it (one query head per KV head) and fits, and
    # falls back to det_group's order without a warning elsewhere
    det_sched_auto: bool = False
    # deterministic with det_writer: fp32 accumulators per 64-row query tile (workspace tile
    # t * det_slots + p; the contribution of rank r goes to r % det_slots) and semaphores;
    # 0: chosen per call (det_slots_of)
    det_slots: int = 1
    # deterministic: the semaphore polled with relaxed loads, one acquire fence ("relaxpoll")
    det_relaxed_poll: bool = False
    # deterministic in the schedule order: the order kernel and the backward launched by one
    # call, the backward reading each entry once the order kernel has published it
    # ("detstream"; with pdl the two kernels run side by side)
    det_stream: bool = False
    # det_stream: the preprocessing launch joins the call, between the order kernel and the
    # backward, and runs alongside the order kernel ("detoverlap")
    det_overlap: bool = False
    # "sm90" / "sm90ws": dQ added per consumer warp with bulk reductions into a workspace of
    # 64-row query tiles (B, H_q, ceil(S_q / 64), 64 D) fp32, reordered into dq by
    # kernels/dq_tiles.py (else a row-major (B, S_q, H_q, D) fp32 workspace)
    dq_tile: bool = False
    # "sm90ws" with dq_tile: the dQ slices staged in the step's consumed Q / dO tiles
    ws_dq_alias: bool = False
    # "sm90ws" with ws_dq_alias: dK first, dQ once the dV / dK GEMMs have completed
    ws_dq_late: bool = False
    # "sm90ws": the step's lse read from shared memory before its GEMMs are issued (off:
    # "lselate", read under them)
    ws_lse_early: bool = True
    # "sm90ws": P^T masked and converted before the dP^T wait, the Q / dO stage's full
    # barrier re-checked right before that wait ("splitwait")
    ws_split_wait: bool = False
    # "sm90ws": dK / dV stored as packed pairs of adjacent columns (off: "epi16")
    ws_epi_pairs: bool = False
    # "sm90ws": dK / dV staged in shared memory (packed pairs) and written in coalesced
    # 16-byte row pieces (off: "epiregs" or "epi16")
    ws_epi_smem: bool = False
    # "sm90ws", blk 128 with the dQ writer warp and the staging tile: the consumer
    # warpgroups take turns computing a step's whole dQ ("dqalt")
    ws_dq_alt: bool = False
    # "sm90ws" only: programmatic dependent launch (Switches.pdl) of the backward and of
    # its dQ reordering kernel
    pdl: bool = False
    # "sm90ws", deterministic with dq_tile: the ordering warp issues each query tile's bulk
    # reductions (Switches.det_writer)
    det_writer: bool = False
    # "sm90ws", not deterministic, with dq_tile: warp 1 issues every step's bulk reductions
    # of the staged dQ (Switches.dq_writer)
    dq_writer: bool = False
    # deterministic with det_writer: the first contribution to each accumulator tile is a
    # bulk store, so the workspace is not zeroed (off: "detzero")
    det_store: bool = False
    # "sm90ws" with dq_writer, unpacked rows: the first contribution to each query tile is
    # claimed with an atomic on a zeroed int32 flag per tile and stored, the others wait for
    # that store and add, so the workspace is not zeroed ("dqclaim", opt-in)
    dq_claim: bool = False
    # "sm90ws" with dq_writer, unpacked rows, not lpt / dq_claim: the workspace of (batch,
    # KV head) pair c + zero_lag is zeroed by the writer warps of pair c's CTAs, one slice
    # each, counted on a zeroed int32 per pair; the preprocessing launch zeroes the first
    # zero_lag pairs' ("zerolag", opt-in; 0: off)
    zero_lag: int = 0
    # "sm90ws" with dq_writer, unpacked rows, pdl: every CTA lets the dq reordering launch
    # when it starts and counts its pair's completed dQ additions; the reordering's CTAs
    # (launched with PDL) wait for their pair's count (the default; off: "notailconv")
    tail_conv: bool = False
    # "sm90ws" blk 128 with tail_conv, not causal / zero_lag / dq_alt / decouple: a
    # persistent grid of this many CTAs (the SM count) dealing the K->Q rows as work items
    # ("persist", opt-in; 0: one CTA per row)
    ws_persist: int = 0
    # ws_persist: the Q / dO stages of an item issued before its K / V ("persistkv=N";
    # -1: the kernel's q_stages - 1)
    ws_persist_kv_at: int = -1
    # ws_persist: the next item's K / V prefetched to L2 when the item is taken (off:
    # "nokvpf")
    ws_persist_kv_l2: bool = True
    # deterministic=True as 32-bit fixed-point dQ ("detfixed"): the default mode's kernels
    # (tail_conv) with each contribution converted to int32 by a per-query-row multiplier
    # and added with int32 bulk reductions, whose sum does not depend on their order
    dq_fixed: bool = False
    # "sm90ws": the L2 policies (kernels.common.L2_HINT_*): 1 ("l2hint") K / V loads
    # evict_first (read by this CTA only), Q / dO loads and the dQ bulk reductions
    # evict_last (read and added to by the other KV blocks listing the query block); 2
    # ("l2normal") evict_normal on all of them; 0 the default operands
    ws_l2_hint: int = 0
    # "sm90ws": the consumers' shared-memory wgmma operands partitioned with their
    # warpgroup's first thread (uniform descriptors; off: "thrfrags", per-thread)
    ws_uniform_frags: bool = True
    # "sm90ws" blk 128 with the dQ writer warp and the staging tile, not deterministic: the
    # writer hands each consumer warpgroup its half of the staging tile on its own
    # (off: "nowghand", one barrier pair over both warpgroups)
    ws_wg_hand: bool = False
    # "sm90ws", not deterministic: the kernel takes lse log2 e and delta softmax_scale
    # ("ldscale"), scaled by XLA before the call
    ws_ld_scaled: bool = False
    # "sm90ws" where dQ and dK are issued together (not dqalias, decouple or dqalt): each
    # step waits for the dV GEMM between the dQ and dK issues ("dvwait")
    ws_dv_wait: bool = False
    # "sm90ws" blk 128 on the default dQ path (not deterministic, dqalias, decouple, dqalt,
    # dvwait or persist): a step's dK GEMM is issued in the next step after its S^T / dP^T
    # GEMMs ("dklag")
    ws_dk_lag: bool = False
    # "sm90ws" blk 128 on the default dQ path (as ws_dk_lag, and not dklag or splitwait): the
    # first 64-row step of a list entry ends without waiting for its dK GEMM, the second
    # issues its S^T / dP^T GEMMs behind it ("sahead")
    ws_s_ahead: bool = False
    # diagnostic ("stamp=N"): the consumer step of running count N prints the SM clock at
    # fixed points of the step (after the block's epilogue)
    ws_stamps: tuple = ()
    # "sm90ws" with the row-major dQ workspace (bsa_bwd_dq="rows"): the dQ rows added with
    # red.global.add.v4.f32 ("redv4")
    ws_red_v4: bool = False
    # "sm90ws": the consumers split list entries with a precomputed multiplier (default;
    # "nofdiv": an integer division; so does "sahead", which spills with the multiplier)
    ws_fast_div: bool = True
    # "sm90ws" with ws_wg_hand (not ws_dk_lag, ws_s_ahead or persist): a consumer tests the next
    # step's Q / dO stage after staging its dQ slice, and the next step skips its wait where
    # the test passed (default there; "noqprobe" waits at every step's start)
    ws_q_probe: bool = False
    # with ws_q_probe and ws_fast_div: the next list entry is split at the first step's
    # stage test instead of at the entry's start ("entahead"; measured slower)
    ws_ent_ahead: bool = False
    # "sm90ws": of every 8 score columns of a consumer thread, this many take exp2 as a
    # polynomial on the FMA pipes instead of the MUFU unit ("ex2emu=N")
    ws_ex2_emu: int = 0
    # "sm90ws" with ws_wg_hand (not ws_dk_lag, ws_s_ahead, ws_dv_wait or persist): warpgroup 0
    # computes its half of a step's dQ one step late, so the two consumer warpgroups do not
    # meet at a dS^T barrier every step (default there; "nodqlag": both halves in the step)
    ws_dq_lag: bool = False
    # "sm90ws": the consumers' warpgroup index from the warp-uniform warp index (default
    # there, not with ws_s_ahead, where ptxas then spills; "nowguni": from the thread index)
    ws_wg_uniform: bool = False
    # with dq_fixed: of every 8 dQ values of a thread, this many converted to fixed point by
    # float additions instead of cvt ("fixemu=N")
    ws_fix_emu: int = 0
    # with dq_fixed: the multipliers' Euclidean norms of dO and V rows in one pass (the
    # largest value and the sum of squares side by side; the default there, "nomult1p":
    # two passes)
    fix_mult_one_pass: bool = False
    # "sm90ws" with tail_conv, not persist, zero_lag, pack_gqa or the ordered deterministic
    # path: K->Q lists of more than this many entries split across CTAs in buckets
    # (metadata.kq_bucket_items; "buckets=N"; -1, the default there: N from the lists'
    # static shape, "autobuckets"; 0: one CTA per KV block, "nobuckets")
    ws_buckets: int = 0
    # with ws_buckets: at most this many extra work items per (batch, KV head) pair
    # ("bucketx=M"; 0: as many as the pair's entries over the bucket size can need, or
    # with "autobuckets" as many as four lists of every query block of the group need)
    ws_bucket_extra: int = 0


def fwd_smem_bytes(head_dim, block_size) -> int:
    """Dynamic shared memory of ``bsa_fwd_sm80``: Q, K, V tiles of ``block_size`` rows."""
    return 3 * -(-2 * block_size * head_dim // 1024) * 1024


def bwd_smem_bytes(head_dim, q_stages=2) -> int:
    """Dynamic shared memory of ``bsa_bwd_sm80``: K, V (64 rows), ``q_stages`` buffers of Q
    and dO and the 64 x 64 P, dS tiles."""
    return 2 * 1024 * (-(-2 * 64 * head_dim // 1024) * (1 + q_stages) + 8)


def bwd_q_stages(head_dim, limit) -> int | None:
    """Q/dO stages of ``bsa_bwd_sm80`` within ``limit`` bytes: 2 when they fit, else 1, else
    None."""
    return next((st for st in (2, 1) if bwd_smem_bytes(head_dim, st) <= limit), None)


def smem_unsupported_reason(head_dim, block_size, passes=("fwd", "bwd"), switches=None):
    """``None`` when the portable kernels of ``passes`` fit the target's shared memory per
    block, else why not (naming the GPU, the need and the limit)."""
    limit = _platform.smem_limit(switches=switches)
    for pas, name, need in (("fwd", "forward", fwd_smem_bytes(head_dim, block_size)),
                            ("bwd", "backward", bwd_smem_bytes(head_dim, q_stages=1))):
        if pas in passes and need > limit:
            blk = f", sparse_block_size={block_size}" if name == "forward" else ""
            return (f"the portable (mma.sync) BSA {name} at head_dim={head_dim}{blk} needs "
                    f"{need / 1024:g} KiB of shared memory per block; "
                    f"{_platform.smem_limit_text(switches)}")
    return None


@dataclasses.dataclass(frozen=True)
class BsaPreConfig:
    """Compile key of the backward preprocessing kernel (``pdl``: programmatic dependent
    launch, Hopper family only; ``zero_ws``: the launch also zeroes the fp32 dQ workspace,
    else XLA does; ``zero_elems`` > 0: only its first ``zero_elems`` elements, the
    backward's writer warps zero the rest (``zero_lag``); ``rows_per_thread``: rows whose
    loads each thread issues at once)."""

    dtype: str
    head_dim: int
    pdl: bool = False
    zero_ws: bool = True
    zero_elems: int = 0
    rows_per_thread: int = 1  # rows whose loads each thread issues together ("kernel4": 4)


def l2_hint_mode(opts) -> int:
    """The L2 policy mode (``kernels.common.L2_HINT_*``) of a tuning switch's options:
    ``l2hint`` 1 (an eviction priority per tensor), ``l2normal`` 2 (``evict_normal``
    everywhere), else 0 (the TMA copies' default operand)."""
    return 1 if "l2hint" in opts else 2 if "l2normal" in opts else 0


def _impl(want: str, head_dim: int, block_size: int | None = None) -> str:
    """The kernel a switch value selects for a call: ``auto`` is ``sm90ws`` (the backward
    resolves its own ``auto`` first, :func:`bwd_impl_choice`); ``sm90ws`` (forward and
    backward) / ``sm90`` (backward) take D in {64, 128}, other D run ``sm80``."""
    if want == "auto":
        want = "sm90ws"
    return want if want in ("sm90", "sm90ws") and head_dim in _SM90_HEAD_DIMS else "sm80"


def bsa_ws_options(opts) -> dict:
    """The sm90ws BSA forward's options from a validated ``Switches.bsa_fwd_ws`` tuple:
    ``overlap`` (PV GEMM of block j-1 in flight during block j's softmax), ``pingpong``
    (blk 128: the two consumer warpgroups issue their GEMMs in turns), ``q_stages`` (2: the
    next item's Q loads during this item's mainloop), ``max_stages`` (most K/V stages),
    ``head_major`` (work items KV head major, the concurrent CTAs sharing one head's K/V in
    L2; ``headinner``: query block major, heads fastest), ``lazy_rescale`` (``lazyrescale``: O
    rescaled only when a row max grows by more than 2^8; default: at every block),
    ``three_ctas`` (three CTAs per SM at blk 64 and D 64, faster on the H200 than two;
    ``ctas2``: two), ``k_single`` (``ctas3k1``, also set by ``selfload``: three CTAs per SM
    at blk 64 and D 128 too, with one K buffer, two V buffers and O staged in the single Q
    buffer; ignored at other blk / D), ``self_load`` (``selfload``: that without the producer
    warp, the consumer warpgroup issuing its own loads; with split-KV, ``pack_gqa``,
    ``streamk``, ``cross``, ``crossepi``, ``mpre``, ``qahead`` or ``nooverlap`` it runs as
    ``ctas3k1``), ``o_alias`` (``oalias``: O staged in a single Q buffer for the most K/V
    stages), ``cross`` (1 with ``cross``, 2 with ``crossepi``, else 0: a CTA's consecutive
    work items chained, the next item's first ``S = Q K^T`` issued with this item's last PV
    GEMM; slower on the H200), ``v_lag`` (``vlag``: the producer issues V tile ``j`` after K
    tile ``j + 1``), ``q_regs`` (``qregs``: each consumer warpgroup copies its Q slice into
    registers once per work item, and the S GEMMs read only K from shared memory; not with
    ``cross`` / ``crossepi``), ``meta_prefetch`` (``mpre``: the next work item's list count,
    and in the producer its first entry, loaded while the current item runs), ``q_ahead``
    (``qahead``: the producer issues the next item's Q during the current item; where O is
    staged in the single Q buffer, ``oalias`` and ``ctas3k1``, with ``q1`` or split-KV, and
    with ``vlag``, whose producer loop has no point to issue it, :func:`fwd_config` runs it as
    ``mpre``), ``epi_vec``
    (default; ``noepivec`` off: O staged with packed pair stores into a row-swizzled tile,
    copied out in 16-byte pieces), ``tma_o`` (default; ``notmao`` off: O staged in the
    128-byte-swizzled layout and written by TMA tensor stores, which the consumer warpgroup
    does not wait for; without split-KV or ``oalias``, packed rows only with
    ``tma_o_packed``), ``tma_o_packed``
    (default; ``notmaopack`` off: packed GQA rows by TMA stores too, boxes of the packed
    view), ``stream_k`` (``streamk``: the work items after the
    last whole wave but one cut into equal ranges of listed blocks, one per CTA),
    ``split_wait`` (True with ``splitwait``, False with ``nosplitwait``, else
    None: the config's default, True at blk 64 with D 128; the consumer warpgroup re-checks
    the V tile's full barrier before it waits for the PV GEMM, which ends a basic block, so
    that ptxas keeps that wait below the next block's softmax), ``pair_wg`` (``pairwg``: at
    blk 64 one CTA per SM whose two consumer warpgroups each run work items of their own,
    taking turns at their GEMMs; :func:`fwd_config` drops it where the kernel does not
    implement it), ``l2_hint`` (:func:`l2_hint_mode`: ``l2hint`` L2 eviction priorities on
    the TMA copies, Q loads and O stores ``evict_first`` (Q ``evict_last`` with split-KV or
    ``streamk``, where several work items read a query tile), K / V loads ``evict_last``;
    ``l2normal`` ``evict_normal`` on every copy), ``o_early`` (``oearly``: the overlapped
    mainloop rescales O for tile ``j - 1`` right after issuing ``S_j``, under that GEMM,
    instead of after the PV GEMM of tile ``j - 2`` completes; not with ``cross`` /
    ``crossepi`` or ``nooverlap``), ``tree_sum`` (``sumtree``: the online softmax adds a
    thread's probabilities of a row pairwise instead of in one chain), ``xla_clamp``
    (``xlaclamp``: the metadata clamped by XLA before the kernel, as for the other forwards,
    instead of by the kernel alone), ``sort_lists`` (``sortlists``: XLA sorts each query
    block's active list into ascending block order before the kernel), ``skip_load``
    (``skipload=N``, a timing ablation with wrong results: the producer skips the K / V
    loads of every N-th tile it issues),
    ``half`` (sparse_block_size 128 walked by 64-row work items: 1 with ``half``, one CTA per
    SM; 2 with ``half2``, two CTAs per SM, each with one Q buffer, one K and two V stages,
    at D 128 only; 0 off), ``s_n64`` (``sn64``, an
    ablation: at sparse_block_size 128 each S = Q K^T as two 64-column GEMMs),
    ``no_softmax`` (``nosm``, a timing ablation with wrong results: no online-softmax step,
    P = the masked scores), ``mix_pv`` (``mix=N``: the overlapped mainloop issues the first N
    K steps of the previous tile's PV GEMM between the K steps of the next S GEMM, in its
    wgmma group), ``k_deep`` (``kdeep``: with O in the Q buffer the plan's extra stage goes
    to the K ring instead of V; the producer issues K ahead of V only with ``vlag``),
    ``pair_step`` (blk 64 at D 128 walked two listed blocks per step, 64 x 128 score tiles:
    1 with ``pairstep`` (O in the Q buffer: two K and three V stages), 2 / 3 / 4 with
    ``pairstep4`` / ``pairstepk3`` / ``pairstepk4`` (one Q buffer that O is staged in and two
    K, four V / three K, three V / four K, two V stages); 0 off), ``kv_warps``
    (``kvwarps``: two producer warps, one issuing Q and the K tiles, the other the V tiles),
    ``pair_box`` (``pairbox``: blk 64 at D 128 walked two listed blocks per step into
    128-row K / V stages, a 64-row TMA box per half under one barrier; one Q buffer that O is
    staged in, one K and two V stages), ``wg_release`` (``wgrelease``: each consumer
    warpgroup frees a K / V stage with one arrival instead of one per warp)."""
    st = [int(o[7:]) for o in opts if o.startswith("stages=")]
    sk = [int(o[9:]) for o in opts if o.startswith("skipload=")]
    mx = [int(o[4:]) for o in opts if o.startswith("mix=")]
    return {"skip_load": sk[0] if sk else 0, "half": 2 if "half2" in opts else 1 if "half" in opts else 0, "s_n64": "sn64" in opts, "no_softmax": "nosm" in opts, "mix_pv": mx[0] if mx else 0, "k_deep": "kdeep" in opts,
            "kv_warps": "kvwarps" in opts, "pair_box": "pairbox" in opts,
            "wg_release": "wgrelease" in opts,
            "pair_step": (4 if "pairstepk4" in opts else 3 if "pairstepk3" in opts
                          else 2 if "pairstep4" in opts else 1 if "pairstep" in opts else 0),
            "overlap": "nooverlap" not in opts, "pingpong": "nopingpong" not in opts,
            "q_stages": 1 if "q1" in opts else 2, "max_stages": st[0] if st else 4,
            "head_major": "headinner" not in opts, "lazy_rescale": "lazyrescale" in opts,
            "three_ctas": "ctas2" not in opts, "o_alias": "oalias" in opts,
            "k_single": "ctas3k1" in opts or "selfload" in opts,
            "self_load": "selfload" in opts,
            "cross": 2 if "crossepi" in opts else 1 if "cross" in opts else 0,
            "v_lag": "vlag" in opts, "q_regs": "qregs" in opts,
            "meta_prefetch": "mpre" in opts, "q_ahead": "qahead" in opts,
            "epi_vec": "noepivec" not in opts, "stream_k": "streamk" in opts,
            "tma_o": "notmao" not in opts and "noepivec" not in opts,
            "tma_o_packed": "notmaopack" not in opts,
            "split_wait": (True if "splitwait" in opts else False if "nosplitwait" in opts
                           else None),
            "pair_wg": "pairwg" in opts, "l2_hint": l2_hint_mode(opts),
            "o_in_q": (True if "oinq" in opts else False if "nooinq" in opts else None),
            "o_early": "oearly" in opts, "tree_sum": "sumtree" in opts,
            "xla_clamp": "xlaclamp" in opts,
            "sort_lists": "sortlists" in opts}


def _family_impl(want: str, head_dim: int, switches, block_size: int | None = None) -> str:
    """The implementation of a pass: the switch's (sm90 kernels where they apply) in the
    Hopper family, sm80 in the portable one."""
    if _platform.kernel_family(switches) == "portable":
        return "sm80"
    return _impl(want, head_dim, block_size)


def fwd_config(dtype, head_dim, block_size, has_block_sizes, switches, causal=False, *,
               kv_splits=1, num_rows=1, k_max=1, pack_gqa: int = 1) -> BsaFwdConfig:
    """The forward compile key from the static call properties and the
    :class:`~jax_sparse_attn.config.Switches` (``causal``: the sm90ws forward only,
    :func:`causal_unsupported_reason`); ``kv_splits`` (the option), ``num_rows`` (metadata
    rows) and ``k_max`` give the split count (:func:`resolve_kv_splits`); ``pack_gqa``: r of
    packed rows, 1 = off (the sm90ws forward only, :func:`pack_gqa_unsupported_reason`)."""
    name = jnp.dtype(dtype).name
    impl = _family_impl(switches.bsa_fwd_impl, head_dim, switches, block_size)
    arch = _platform.resolved_arch()
    splits = resolve_kv_splits(kv_splits, num_rows=num_rows, k_max=k_max, impl=impl)
    if impl == "sm90ws":
        o = bsa_ws_options(switches.bsa_fwd_ws)
        # chained items need the overlapped mainloop: without it cross / crossepi are off
        if not o["overlap"]:
            o["cross"] = 0
        kw = {} if splits == 1 else {"kv_splits": splits}
        k1 = o["k_single"] and (block_size, head_dim) == (64, 128)
        if k1:
            kw["ws_k_single"] = True
            if (o["self_load"] and o["overlap"] and splits == 1 and pack_gqa == 1
                    and not (o["stream_k"] or o["cross"] or o["meta_prefetch"]
                             or o["q_ahead"])):
                kw["ws_self_load"] = True
        # the next item's Q issued ahead needs a second Q buffer: with O staged in the single
        # one (oalias, ctas3k1 / selfload) the producer would wait for the current item's
        # epilogue before issuing its remaining K / V tiles, so qahead is mpre there
        # (vlag's producer loop, K tile j + 1 before V tile j, has no such issue point either;
        # q1 and split-KV have no second Q buffer / load Q per split)
        q_ahead = (o["q_ahead"] and splits == 1 and o["q_stages"] >= 2
                   and not (k1 or o["o_alias"] or o["v_lag"]))
        # pairwg: blk 64, one item stream per consumer warpgroup, without the options that
        # change the item walk or the Q buffers
        pair = (o["pair_wg"] and block_size == 64 and splits == 1 and pack_gqa == 1
                and not (k1 or o["stream_k"] or o["cross"] or o["meta_prefetch"]
                         or o["q_ahead"] or o["o_alias"]))
        if pair:
            kw["ws_pair_wg"] = True
        if o["l2_hint"]:
            kw["ws_l2_hint"] = o["l2_hint"]
        # oinq (the default at D 128; nooinq off): O staged by the TMA stores in the item's
        # own (second) Q buffer
        o_in_q = o["o_in_q"] if o["o_in_q"] is not None else head_dim == 128
        if o["o_early"] and o["overlap"] and not o["cross"]:
            kw["ws_o_early"] = True
        if o["tree_sum"]:
            kw["ws_tree_sum"] = True
        if o["xla_clamp"]:
            kw["ws_xla_clamp"] = True
        if o["sort_lists"] and splits == 1:
            kw["ws_sort_lists"] = True
        # skipload applies where the producer issues K and V through _issue_kv (not the
        # vlag loop or the self-loading consumer)
        if o["skip_load"] and not (o["v_lag"] or o["self_load"]):
            kw["ws_skip_load"] = o["skip_load"]
        if (o["half"] and block_size == 128 and splits == 1 and pack_gqa == 1
                and not (pair or o["stream_k"] or o["cross"])
                and (o["half"] == 1 or head_dim == 128)):
            # half2's shared-memory plan is for D 128
            kw["ws_half_items"] = o["half"]
        if o["s_n64"] and block_size == 128:
            kw["ws_s_n64"] = True
        if o["no_softmax"]:
            kw["ws_no_softmax"] = True
        if o["mix_pv"] and o["overlap"] and not o["o_early"]:
            kw["ws_mix_pv"] = o["mix_pv"]
        # pairstep / pairstep4: blk 64 at D 128 with the overlapped mainloop, without
        # split-KV, pack_gqa and the options that change the item walk, the S GEMM's operand
        # or the GEMM order
        step2 = (o["pair_step"] and (block_size, head_dim) == (64, 128) and o["overlap"]
                 and splits == 1 and pack_gqa == 1 and not (k1 or pair or o["stream_k"] or o["cross"] or o["q_regs"]
                          or o["mix_pv"] or o["o_early"]))
        if step2 and o["pair_step"] > 1:
            kw["ws_pair_step"] = o["pair_step"]
        box = (o["pair_box"] and not o["pair_step"] and (block_size, head_dim) == (64, 128)
               and o["overlap"] and splits == 1 and pack_gqa == 1
               and not (k1 or pair or o["stream_k"] or o["cross"] or o["q_regs"]
                        or o["mix_pv"] or o["o_early"] or o["kv_warps"] or o["v_lag"]
                        or o["meta_prefetch"] or o["q_ahead"] or o["skip_load"]
                        or o["s_n64"]))
        if box:
            kw["ws_pair_box"] = True
        if o["wg_release"] and not kw.get("ws_self_load"):
            kw["ws_wg_release"] = True
        if (o["kv_warps"] and not (k1 or pair or o["v_lag"] or o["meta_prefetch"]
                                   or o["q_ahead"] or o["stream_k"] or kw.get("ws_skip_load"))):
            kw["ws_kv_warps"] = True
        if (o_in_q and o["tma_o"] and splits == 1 and pack_gqa == 1
                and o["q_stages"] == 2
                and not (k1 or pair or o["stream_k"] or o["cross"] or o["o_alias"]
                         or kw.get("ws_half_items") == 2 or kw.get("ws_pair_step", 0) > 1 or box)):
            kw["ws_o_in_q"] = True
            if o["k_deep"] and not step2:
                kw["ws_k_deep"] = True
            if step2 and o["pair_step"] == 1:
                # two K and three V stages: the plan with O in the Q buffer
                kw["ws_pair_step"] = 1
        return BsaFwdConfig(name, head_dim, block_size, has_block_sizes, impl,
                            ws_overlap=o["overlap"], ws_pingpong=o["pingpong"],
                            ws_q_stages=o["q_stages"], ws_max_stages=o["max_stages"],
                            ws_head_major=o["head_major"], ws_lazy_rescale=o["lazy_rescale"],
                            ws_three_ctas=(o["three_ctas"] and (block_size, head_dim) == (64, 64)
                                           and not pair or k1),
                            ws_o_alias=o["o_alias"], ws_cross=o["cross"],
                            ws_v_lag=o["v_lag"], ws_q_regs=o["q_regs"] and not o["cross"],
                            ws_meta_prefetch=o["meta_prefetch"] or o["q_ahead"] and not q_ahead,
                            ws_q_ahead=q_ahead,
                            ws_epi_vec=o["epi_vec"],
                            ws_stream_k=o["stream_k"] and splits == 1 and pack_gqa == 1,
                            ws_tma_o=o["tma_o"] and splits == 1 and not o["o_alias"]
                            and not k1 and (pack_gqa == 1 or o["tma_o_packed"]),
                            ws_tma_o_packed=o["tma_o"] and o["tma_o_packed"] and pack_gqa > 1
                            and splits == 1 and not o["o_alias"] and not k1,
                            ws_split_wait=(o["split_wait"] if o["split_wait"] is not None
                                           else (block_size, head_dim) == (64, 128)),
                            num_sms=metadata.num_sms(), arch=arch, causal=causal,
                            pack_gqa=pack_gqa, pdl=bool(getattr(switches, "pdl", False)),
                            **kw)
    if causal:
        raise NotImplementedError(causal_unsupported_reason(head_dim, block_size, ("fwd",),
                                                            switches))
    kw = {} if splits == 1 else {"kv_splits": splits}
    return BsaFwdConfig(name, head_dim, block_size, has_block_sizes, impl,
                        switches.bsa_fwd_q_in_regs and head_dim <= 128,
                        switches.bsa_fwd_min_blocks,
                        late_v_wait=switches.bsa_fwd_late_v_wait,
                        warp_rows=sm80_warp_rows(switches.bsa_fwd_warp_rows, head_dim,
                                                 block_size), arch=arch, **kw)


#: (sparse_block_size, D) of the sm80 forward that ``bsa_fwd_warp_rows="auto"`` runs with 32
#: query rows per warp (docs/support.md: faster on the H200 there, and no register spill)
_WARP_ROWS_32 = frozenset({(64, 64), (64, 128)})


def sm80_warp_rows(want: str, head_dim: int, block_size: int) -> int:
    """Query rows per warp of the sm80 forward for the ``bsa_fwd_warp_rows`` switch value."""
    if want == "auto":
        return 32 if (block_size, head_dim) in _WARP_ROWS_32 else 16
    return int(want)


#: the split-KV forwards (``kv_splits > 1``): every forward
SPLIT_IMPLS = ("sm90ws", "sm80")
#: most elements of the fp32 split-KV partial output (32-bit offsets in the kernels)
_MAX_PARTIAL_ELEMS = 2**31 - 1


def resolve_kv_splits(kv_splits, *, num_rows, k_max, impl) -> int:
    """The number of key splits the forward ``impl`` runs for the ``kv_splits`` option (an
    int >= 1 or ``"auto"``) and the call's static sizes: ``num_rows`` metadata rows (``B H_q
    N_q``; with ``pack_gqa`` ``B H_kv N_qp``, ``N_qp = ceil(S_q r / blk)``) of ``k_max`` list
    entries.

    An int is clamped to ``k_max`` (more splits would only be empty; the chunks are the same,
    :func:`~jax_sparse_attn.metadata.kv_split_ids`). ``"auto"`` is
    :func:`~jax_sparse_attn.metadata.auto_kv_splits` (the reference backend's rule:
    ``floor(num_SMs / num_rows)`` clamped to ``[1, min(k_max, 256)]``, SM count from
    :func:`~jax_sparse_attn.metadata.num_sms`, 132 without a visible GPU) on the forwards that
    split (``impl`` in :data:`SPLIT_IMPLS`) and 1 on the others.
    """
    if kv_splits == "auto":
        if impl not in SPLIT_IMPLS:
            return 1
        return metadata.auto_kv_splits(num_rows, k_max)
    return max(1, min(int(kv_splits), int(k_max)))


def kv_splits_unsupported_reason(kv_splits, *, head_dim, sparse_block_size, num_rows, k_max,
                                 partial_elems=0, switches=None) -> str | None:
    """``None`` when the kernel forward runs this ``kv_splits`` (see
    :func:`resolve_kv_splits`), else why not: more than one split needs a forward of
    :data:`SPLIT_IMPLS` and fp32 partial outputs (``partial_elems`` per split) of at most
    2^31 - 1 elements in all."""
    from ..config import Switches  # noqa: PLC0415

    switches = Switches() if switches is None else switches
    impl = _family_impl(switches.bsa_fwd_impl, head_dim, switches, sparse_block_size)
    splits = resolve_kv_splits(kv_splits, num_rows=num_rows, k_max=k_max, impl=impl)
    if splits == 1:
        return None
    if impl not in SPLIT_IMPLS:
        return f"kv_splits={kv_splits!r}: the {impl} forward does not split; use kv_splits=1"
    if splits * partial_elems > _MAX_PARTIAL_ELEMS:
        return (f"kv_splits={kv_splits!r}: the {splits} fp32 partial outputs of "
                f"{partial_elems} elements each exceed 2^31 elements; use fewer splits")
    return None


def bwd_impl_choice(want: str, head_dim: int, block_size: int, dq: str = "tile") -> str:
    """The backward a switch value names: ``auto`` (the default) is the faster Hopper
    backward on the H200 (docs/bsa.md, "The warp-specialized backward"): ``sm90ws``, except
    at ``sparse_block_size`` 64 with D = 128 under ``bsa_bwd_dq="rows"`` (``sm90``)."""
    if want != "auto":
        return want
    if dq == "rows" and block_size == 64 and head_dim == 128:
        return "sm90"
    return "sm90ws"


def bwd_config(dtype, head_dim, block_size, has_block_sizes, switches,
               pack_gqa: int = 1, causal=False, deterministic=False) -> BsaBwdConfig:
    """The dK/dV/dQ kernel's compile key (see :func:`fwd_config`). ``deterministic``: the
    sm90ws backward (``bsa_bwd_impl`` ``"auto"`` picks it at every block size;
    :func:`deterministic_unsupported_reason` says where it cannot run), with the fixed-point
    dQ (:func:`det_fixed_wanted`) where it applies, else with ordered dQ additions."""
    name = jnp.dtype(dtype).name
    want = switches.bsa_bwd_impl
    if deterministic:
        why = deterministic_unsupported_reason(head_dim, block_size, switches, pack_gqa, causal)
        if why is not None:
            raise NotImplementedError(why)
        want = "sm90ws"
    impl = _family_impl(bwd_impl_choice(want, head_dim, block_size, switches.bsa_bwd_dq),
                        head_dim, switches)
    arch = _platform.resolved_arch()
    if impl == "sm90ws" and pack_gqa > 1 and (
            "nopackws" in switches.bsa_bwd_ws or switches.bsa_bwd_dq != "tile"
            or ("decouple" in switches.bsa_bwd_ws and block_size == 128)):
        # the warp-specialized backward packs GQA groups with the dQ tile workspace; with
        # the row-major dQ workspace, decouple (blk 128) or nopackws, sm90 runs them (deterministic
        # calls do not pack: deterministic_unsupported_reason)
        impl = "sm90"
    if impl == "sm90ws":
        if deterministic and det_fixed_wanted(block_size, switches.bsa_bwd_ws):
            # the default mode's configuration with fixed-point dQ, where it has the dQ
            # writer's tile workspace and the dq reordering in the same call (tail_conv);
            # built without the default mode's options that deterministic calls do not take
            # (so that they do not turn off the step paths they exclude)
            fixed_sw = dataclasses.replace(switches, bsa_bwd_ws=tuple(
                o for o in switches.bsa_bwd_ws if o not in _NOT_FIXED_OPTS))
            cfg = _persist_config(_ws_config(name, head_dim, block_size, has_block_sizes,
                                             impl, arch, fixed_sw, False, causal, pack_gqa),
                                  fixed_sw.bsa_bwd_ws)
            if (cfg.tail_conv and cfg.dq_writer and not cfg.ws_dq_alt and not cfg.dq_claim
                    and not cfg.ws_decouple and cfg.pack_gqa == 1 and not cfg.zero_lag
                    and not cfg.ws_persist):
                # (ldscale stays off: the fixed-point multipliers take the unscaled delta;
                # dklag is not a deterministic option; with dqlag warpgroup 0 keeps the
                # previous step's multipliers in registers)
                fix = [int(o[7:]) for o in switches.bsa_bwd_ws if o.startswith("fixemu=")]
                return _buckets_config(dataclasses.replace(
                    cfg, dq_fixed=True, ws_ld_scaled=False, ws_dk_lag=False, ws_s_ahead=False,
                    ws_fix_emu=fix[0] if fix else 0,
                    fix_mult_one_pass="nomult1p" not in switches.bsa_bwd_ws), switches.bsa_bwd_ws)
        return _buckets_config(_persist_config(
            _ws_config(name, head_dim, block_size, has_block_sizes, impl, arch, switches,
                       deterministic, causal, pack_gqa), switches.bsa_bwd_ws),
            switches.bsa_bwd_ws)
    if impl == "sm90":
        return BsaBwdConfig(name, head_dim, block_size, has_block_sizes, impl, arch=arch,
                            pack_gqa=pack_gqa, causal=causal,
                            dq_tile=switches.bsa_bwd_dq == "tile" and pack_gqa == 1)
    if causal:
        raise NotImplementedError(causal_unsupported_reason(head_dim, block_size, ("bwd",),
                                                            switches))
    # 2 CTAs per SM (register cap 128) where the accumulators allow it
    min_blocks = switches.bsa_bwd_min_blocks
    if min_blocks is None:
        min_blocks = 2 if head_dim <= 128 else 1
    q_stages = bwd_q_stages(head_dim, _platform.smem_limit(arch, switches))
    if q_stages is None:
        raise NotImplementedError(smem_unsupported_reason(head_dim, block_size, ("bwd",),
                                                          switches))
    return BsaBwdConfig(name, head_dim, block_size, has_block_sizes, impl, min_blocks, arch=arch,
                        vec_red=_platform.vec_red(switches, arch), q_stages=q_stages)



def _ws_config(name, head_dim, block_size, has_block_sizes, impl, arch, switches,
               deterministic, causal, pack_gqa) -> BsaBwdConfig:
    """The ``sm90ws`` backward's configuration (:func:`bwd_config`)."""
    from ..kernels.bsa_bwd_sm90_ws import bwd_ws_dq_tile_fits  # noqa: PLC0415

    opts = switches.bsa_bwd_ws
    st = [int(o[7:]) for o in opts if o.startswith("stages=")]
    decouple = "decouple" in opts and block_size == 128 and not deterministic
    tile = switches.bsa_bwd_dq == "tile" and not decouple
    alias = tile and ("dqalias" in opts or not bwd_ws_dq_tile_fits(head_dim, block_size))
    cfg = BsaBwdConfig(name, head_dim, block_size, has_block_sizes, impl, arch=arch,
                        ws_max_stages=st[0] if st else 4, ws_ld_wait="ldwait" in opts,
                        ws_lpt="nolpt" not in opts and not deterministic,
                        ws_lpt_chain=not {"lpt", "nolpt"} & set(opts)
                        and not deterministic,
                        ws_decouple=decouple,
                        deterministic=bool(deterministic),
                        det_group=det_launch_group(block_size, opts) if deterministic else 0,
                        det_window=det_schedule_window(block_size, opts) if deterministic
                        else 0,
                        det_sched_auto=bool(deterministic) and not _det_order_opts(opts),
                        det_order_fast=bool(deterministic) and "ordfast" in opts,
                        det_order_scan=det_order_scan(opts) if deterministic else 4,
                        held_ctas=_held_ctas(block_size) if deterministic else 0,
                        dq_tile=tile,
                        ws_dq_alias=alias,
                        ws_dq_late=alias and "dqearly" not in opts,
                        ws_lse_early="lselate" not in opts,
                        ws_split_wait="splitwait" in opts,
                        ws_l2_hint=l2_hint_mode(opts),
                        ws_uniform_frags="thrfrags" not in opts,
                        ws_wg_hand="nowghand" not in opts and block_size == 128 and tile
                        and not alias and not deterministic and not decouple
                        and "dqalt" not in opts and "dqclaim" not in opts
                        and getattr(switches, "dq_writer", "auto") != "off",
                        ws_ld_scaled="ldscale" in opts and not deterministic,
                        ws_dv_wait="dvwait" in opts and not alias and not decouple
                        and not ("dqalt" in opts and block_size == 128 and tile
                                 and not deterministic
                                 and getattr(switches, "dq_writer", "auto") != "off"),
                        ws_dk_lag="dklag" in opts and block_size == 128 and not alias
                        and not decouple and not deterministic and "dvwait" not in opts
                        and "dqalt" not in opts and "persist" not in opts,
                        ws_s_ahead="sahead" in opts and block_size == 128 and not alias
                        and not decouple and not deterministic and "dvwait" not in opts
                        and "dqalt" not in opts and "persist" not in opts
                        and "dklag" not in opts and "splitwait" not in opts,
                        ws_stamps=tuple(int(o[6:]) for o in opts if o.startswith("stamp=")),
                        ws_red_v4="redv4" in opts and not tile,
                        ws_fast_div="nofdiv" not in opts and "sahead" not in opts,
                        ws_epi_pairs="epi16" not in opts,
                        ws_epi_smem=not {"epiregs", "epi16"} & set(opts),
                        ws_dq_alt="dqalt" in opts and block_size == 128 and tile
                        and not alias and not deterministic and not decouple
                        and getattr(switches, "dq_writer", "auto") != "off",
                        pdl=bool(getattr(switches, "pdl", False)),
                        det_writer=bool(deterministic) and tile
                        and bool(getattr(switches, "det_writer", False)),
                        det_slots=det_dq_slots(opts) if deterministic and tile
                        and bool(getattr(switches, "det_writer", False)) else 1,
                        det_relaxed_poll=bool(deterministic) and "relaxpoll" in opts,
                        det_store=bool(deterministic) and tile
                        and bool(getattr(switches, "det_writer", False))
                        and "detzero" not in opts,
                        det_stream=bool(deterministic) and det_stream_default(opts)
                        and not causal,
                        det_overlap=bool(deterministic) and det_stream_default(opts)
                        and "detoverlap" in opts and not causal,
                        causal=bool(causal), pack_gqa=pack_gqa,
                        dq_writer=not deterministic and tile
                        and getattr(switches, "dq_writer", "auto") != "off",
                        dq_claim="dqclaim" in opts and not deterministic and tile
                        and getattr(switches, "dq_writer", "auto") != "off"
                        and pack_gqa == 1,
                        zero_lag=ZERO_LAG if "zerolag" in opts and not deterministic
                        and tile and getattr(switches, "dq_writer", "auto") != "off"
                        and pack_gqa == 1 and "lpt" not in opts
                        and "dqclaim" not in opts else 0,
                        tail_conv="notailconv" not in opts and not deterministic and tile
                        and getattr(switches, "dq_writer", "auto") != "off"
                        and pack_gqa == 1 and "dqclaim" not in opts
                        and bool(getattr(switches, "pdl", False)))
    probe = ("noqprobe" not in opts and cfg.ws_wg_hand and not cfg.ws_dk_lag
             and not cfg.ws_s_ahead and "persist" not in opts)
    emu = [int(o[7:]) for o in opts if o.startswith("ex2emu=")]
    return dataclasses.replace(cfg, ws_q_probe=probe,
                               ws_ent_ahead=probe and "entahead" in opts
                               and cfg.ws_fast_div, ws_ex2_emu=emu[0] if emu else 0,
                               ws_dq_lag="nodqlag" not in opts and cfg.ws_wg_hand
                               and not cfg.ws_dk_lag and not cfg.ws_s_ahead
                               and not cfg.ws_dv_wait and "persist" not in opts,
                               ws_wg_uniform="nowguni" not in opts and not cfg.ws_s_ahead)


def _buckets_config(cfg: BsaBwdConfig, opts) -> BsaBwdConfig:
    """``cfg`` with long K->Q lists split in buckets where the kernel has it: with
    ``tail_conv``, not persistent, ``zero_lag``, packed, on the ordered deterministic path
    or with the ablations ``dklag`` / ``sahead`` (whose registers then spill) (``ws_lpt``
    off: the items carry their own longest-first order). The bucket size is N
    of ``buckets=N``, else from the lists' static shape (``autobuckets``, the default); none
    with ``nobuckets`` or an explicit CTA order of one CTA per KV block (``lpt``, ``hlpt``,
    ``nolpt``)."""
    n = [int(o[8:]) for o in opts if o.startswith("buckets=")]
    cap = [int(o[8:]) for o in opts if o.startswith("bucketx=")]
    if not n and "nobuckets" not in opts and not {"lpt", "hlpt", "nolpt"} & set(opts):
        n = [-1]
    if (not n or not cfg.tail_conv or cfg.ws_persist or cfg.zero_lag or cfg.pack_gqa != 1
            or cfg.deterministic or cfg.ws_stamps or cfg.ws_dk_lag or cfg.ws_s_ahead):
        return cfg
    return dataclasses.replace(cfg, ws_buckets=n[0], ws_bucket_extra=cap[0] if cap else 0,
                               ws_lpt=False, ws_lpt_chain=False)


def _persist_config(cfg: BsaBwdConfig, opts) -> BsaBwdConfig:
    """``cfg`` with the persistent grid where ``bsa_bwd_ws`` asks for it (``persist``,
    ``persistkv=N``) and the kernel has it: blk 128 with ``tail_conv``, not causal,
    ``zero_lag``, ``dq_alt``, ``dq_alias`` or ``decouple``."""
    if ("persist" not in opts or cfg.block_size != 128 or not cfg.tail_conv or cfg.causal
            or cfg.zero_lag or cfg.ws_dq_alt or cfg.ws_dq_alias or cfg.ws_decouple):
        return cfg
    kv_at = [int(o[10:]) for o in opts if o.startswith("persistkv=")]
    return dataclasses.replace(cfg, ws_persist=metadata.num_sms(),
                               ws_persist_kv_at=kv_at[0] if kv_at else -1,
                               ws_persist_kv_l2="nokvpf" not in opts)


def det_launch_group(block_size: int, opts=()) -> int:
    """The CTA launch groups of the deterministic backward's dQ order
    (``metadata.build_kq_csr``'s ``rank_group``), the faster order measured on the H200
    (docs/bsa.md, "Deterministic backward"): at blk 128 half the CTAs the GPU holds at
    once (``num_sms``, one CTA per SM), at blk 64 0 (ascending KV block order). The
    ``bsa_bwd_ws`` options: ``detkv`` 0 at every block size, ``detfull`` every CTA the GPU
    holds (``num_sms`` x 1 at blk 128, x 2 at blk 64). Within a group the CTAs may wait
    for CTAs of higher launch index, so a group must fit on the GPU at once."""
    held = metadata.num_sms() * (1 if block_size == 128 else 2)
    if "detfull" in opts:
        return held
    if "detkv" in opts or block_size != 128:
        return 0
    return max(held // 2, 1)


def det_dq_slots(opts=()) -> int:
    """fp32 dQ accumulators per query tile of the deterministic backward with the dQ writer
    warp: the ``bsa_bwd_ws`` option ``dqslots=N``, else 0 (:func:`det_slots_of` chooses per
    call)."""
    n = [int(o[8:]) for o in opts if o.startswith("dqslots=")]
    return n[0] if n else 0


#: the default's two dQ accumulators need query rows listing at least this many KV blocks
DET_SLOTS_MIN_K = 32


def det_slots_of(cfg) -> int:
    """The dQ accumulators per query tile of the backward of ``cfg`` (a ``BsaConfig``): 1
    unless deterministic with the dQ writer warp; ``cfg.bwd.det_slots`` where an option set
    it; by default 2 where the measurements favour it (docs/bsa.md, "Two dQ accumulators
    per query tile"): blk 64 in the schedule order (one query head per KV head, the order
    kernel fits) with ``K_max >= DET_SLOTS_MIN_K`` (the metadata's list length: each query
    tile may have that many contributions in turn); else 1. The workspace of the slots
    must stay within 32-bit element offsets: the default then takes 1, and an option that
    would pass them raises ``NotImplementedError``."""
    bwd = cfg.bwd
    if bwd is None or not bwd.deterministic or not bwd.det_writer:
        return 1
    tile_elems = cfg.batch * cfg.num_heads_q * -(-cfg.seqlen_q // 64) * 64 * cfg.head_dim
    if bwd.det_slots:
        if bwd.det_slots * tile_elems > _MAX_PARTIAL_ELEMS >= tile_elems:
            raise NotImplementedError(
                f"bsa_bwd_ws dqslots={bwd.det_slots}: the fp32 dQ workspace of "
                f"{bwd.det_slots} accumulators per query tile would hold "
                f"{bwd.det_slots * tile_elems} elements, past the kernels' 32-bit offsets "
                f"({_MAX_PARTIAL_ELEMS}); use fewer (dqslots=1 always fits)")
        return bwd.det_slots
    if (bwd.block_size == 64 and bwd.det_sched_auto and bwd.det_window
            and cfg.num_heads_q == cfg.num_heads_kv and cfg.k_max >= DET_SLOTS_MIN_K
            and 2 * tile_elems <= _MAX_PARTIAL_ELEMS and det_order_config(cfg) is not None):
        return 2
    return 1


def det_stream_default(opts=()) -> bool:
    """Whether the deterministic backward streams the schedule order (``det_stream``; used
    only where the schedule order runs): with ``bsa_bwd_ws`` ``detstream``, not by default
    or with ``nodetstream``. (Measured 1–4 % slower than ``nodetstream`` on the H200 with
    the present publication, a release by each storing lane of warp 0 of the order kernel:
    docs/performance.md.)"""
    return "detstream" in opts and "nodetstream" not in opts


def _held_ctas(block_size: int) -> int:
    """CTAs of the sm90ws backward the GPU holds at once: one per SM at blk 128, two at
    blk 64."""
    return metadata.num_sms() * (1 if block_size == 128 else 2)


#: the ``bsa_bwd_ws`` options that choose the deterministic backward's dQ order
DET_ORDER_OPTS = BSA_DET_ORDER_FLAGS

#: ``bsa_bwd_ws`` options of the ordered deterministic backward (with ``dqslots=N`` and
#: ``ordscan=N``): any of them asks for it instead of the fixed-point dQ
DET_ORDERED_OPTS = DET_ORDER_OPTS + ("detorder", "relaxpoll", "detstream", "nodetstream",
                                     "detoverlap", "detzero", "ordfast")


#: default-mode ``bsa_bwd_ws`` options that the fixed-point deterministic dQ ignores: the
#: multipliers take the unscaled delta (``ldscale``), and the dK GEMM of a step is not
#: deferred (``dklag``, ``sahead``)
_NOT_FIXED_OPTS = ("ldscale", "dklag", "sahead")


def det_fixed_wanted(block_size: int, opts=()) -> bool:
    """Whether ``deterministic=True`` asks for the fixed-point dQ (``dq_fixed``) rather than
    ordered dQ additions: by default (and with ``bsa_bwd_ws`` ``detfixed``) at blk 64 and
    blk 128. On an H100 it measured 0.87–0.93x the default mode at blk 64 against 0.52–0.71x
    for the schedule order, and at blk 128 (with ``dqlag``, ``wguni`` and ``mult1p``) 0.88x
    at S 16384 and 0.92x at S 32768, where the schedule order read 0.86x and 0.83x before
    ``wguni`` (docs/performance.md). Not where an
    option of the ordered path is given (:data:`DET_ORDERED_OPTS`, ``dqslots=N``,
    ``ordscan=N``) without ``detfixed``. Where the fixed point does not apply, :func:`bwd_config` keeps the
    ordered path."""
    if "detfixed" in opts:
        return True
    if any(o in DET_ORDERED_OPTS or o.startswith(("dqslots=", "ordscan=")) for o in opts):
        return False
    return block_size in (64, 128)


def _det_order_opts(opts) -> tuple:
    return tuple(o for o in opts if o in DET_ORDER_OPTS)


def det_schedule_window(block_size: int, opts=()) -> int:
    """The window of the deterministic backward's schedule order. The order cannot deadlock
    while at least this many CTAs are resident at once
    (``metadata.kq_schedule_order_reference``). By default (no order option) one CTA per SM,
    ``num_sms``, where the traced-for GPU is visible: at blk 64 half the CTAs it holds; at
    blk 128 all of them, so the whole GPU must be available to the kernel (not an MPS or
    green-context share of its SMs: use ``detsched`` or ``detlaunch`` there). Traced
    without a visible GPU (export, CPU lowering), where the SM count is a guess, half that
    at blk 128. ``bsa_bwd_ws`` options: ``detsched`` half the CTAs the GPU holds,
    ``detschedfull`` all of them; ``detkv`` / ``detfull`` / ``detlaunch`` 0, the order of
    :func:`det_launch_group`."""
    held = _held_ctas(block_size)
    if "detschedfull" in opts:
        return held
    if "detsched" in opts:
        return max(held // 2, 1)
    if _det_order_opts(opts):
        return 0
    if block_size == 128 and metadata.gpu_num_sms() is None:
        return max(metadata.num_sms() // 2, 1)
    return metadata.num_sms()


def det_order_scan(opts) -> int:
    """Entries a proposal scan of the schedule-order kernel checks at once: the
    ``bsa_bwd_ws`` option ``ordscan=N``, else 4."""
    n = [int(o[8:]) for o in opts if o.startswith("ordscan=")]
    return n[0] if n else 4


@dataclasses.dataclass(frozen=True)
class BsaDetOrderConfig:
    """Compile key of the schedule-order kernel (``kernels/bsa_det_order.py``): rows per
    chain (KV blocks), query tiles per chain (``group * N_q``), most entries per chain, the
    window, the sub-rounds per round, the entries a proposal scan checks at once and the
    ``fast`` variant (the same order with fewer serialized shared-memory operations), and
    ``held`` > 0: the kernel computes the rows' estimated starts itself
    (:func:`metadata.kq_schedule_starts` for ``held`` CTA slots) instead of reading them."""

    n_kv: int
    n_tiles: int
    e_cap: int
    window: int
    subrounds: int = 4
    scan: int = 4
    fast: bool = False
    held: int = 0


#: shared memory the schedule-order kernel may use (one CTA per SM)
DET_ORDER_SMEM = 200 * 1024
#: most CSR rows per chain (8 per thread of a 1024-thread CTA)
DET_ORDER_MAX_ROWS = 8192


def det_order_config(cfg) -> BsaDetOrderConfig | None:
    """The schedule-order kernel's configuration for the backward ``cfg`` (a ``BsaConfig``
    with ``bwd.det_window > 0``), or None where it does not fit (shared memory, rows per
    chain): the backward then uses the ``det_group`` order."""
    from ..kernels.bsa_det_order import smem_bytes  # noqa: PLC0415

    group = cfg.num_heads_q // cfg.num_heads_kv
    n_kv, n_tiles = cfg.num_kv_blocks, group * cfg.num_q_blocks
    # every chain fits: each query tile lists at most k_max entries (not n_kv: build_kq_csr's
    # sort path keeps repeated ids, e.g. out-of-range ids clipped by sanitize_bsa_metadata,
    # and slots of a chain past e_cap would be left unwritten for the backward to read)
    e_cap = n_tiles * cfg.k_max
    if n_kv > DET_ORDER_MAX_ROWS or smem_bytes(n_kv, n_tiles, e_cap) + 1024 > DET_ORDER_SMEM:
        return None
    fast = bool(getattr(cfg.bwd, "det_order_fast", False))
    return BsaDetOrderConfig(n_kv, n_tiles, e_cap, cfg.bwd.det_window,
                             scan=getattr(cfg.bwd, "det_order_scan", 4), fast=fast,
                             held=cfg.bwd.held_ctas if fast else 0)


def _det_order_or_warn(cfg) -> BsaDetOrderConfig | None:
    """:func:`det_order_config` where ``cfg.bwd`` asks for the schedule order (else None),
    with a ``UserWarning`` (once per trace) where an option asked for it, the order does
    not fit and the backward falls back to the ``det_group`` order. The default's order
    (``det_sched_auto``) runs with one query head per KV head only (with GQA the
    ``det_group`` order measured faster on the H200, docs/performance.md) and falls back
    silently."""
    if not cfg.bwd.det_window:
        return None
    if cfg.bwd.det_sched_auto and cfg.num_heads_q != cfg.num_heads_kv:
        return None
    ocfg = det_order_config(cfg)
    if ocfg is None and not cfg.bwd.det_sched_auto:
        import warnings  # noqa: PLC0415

        group = cfg.num_heads_q // cfg.num_heads_kv
        warnings.warn(
            f"bsa_bwd_ws detsched / detschedfull: the schedule order does not fit this call "
            f"({cfg.num_kv_blocks} KV blocks and {group * cfg.num_q_blocks} query tiles per "
            f"(batch, KV head), up to {cfg.k_max} entries each; the order kernel takes at most "
            f"{DET_ORDER_MAX_ROWS} KV blocks and {DET_ORDER_SMEM // 1024} KiB of shared "
            f"memory); the deterministic backward uses the launch-group order (detlaunch)",
            stacklevel=2)
    return ocfg


def _det_order_entry(stream, offsets, entries, starts, entries_out, ranks_out, *,
                     cfg: BsaDetOrderConfig):
    from ..kernels.bsa_det_order import BsaDetScheduleOrder  # noqa: PLC0415

    BsaDetScheduleOrder(cfg.n_kv, cfg.n_tiles, cfg.e_cap, cfg.window, cfg.subrounds,
                        scan=cfg.scan, fast=cfg.fast, held=cfg.held)(
        offsets, entries, starts, entries_out, ranks_out, stream)


def _det_order_held_entry(stream, offsets, entries, entries_out, ranks_out, *,
                          cfg: BsaDetOrderConfig):
    # cfg.held > 0: the kernel computes the rows' starts from the offsets
    from ..kernels.bsa_det_order import BsaDetScheduleOrder  # noqa: PLC0415

    BsaDetScheduleOrder(cfg.n_kv, cfg.n_tiles, cfg.e_cap, cfg.window, cfg.subrounds,
                        scan=cfg.scan, fast=cfg.fast, held=cfg.held)(
        offsets, entries, None, entries_out, ranks_out, stream)


@functools.cache
def _det_order_held_jit():
    """The one ``cute.jit`` of ``_det_order_held_entry``."""
    import cutlass.cute as cute  # noqa: PLC0415

    return cute.jit(_det_order_held_entry)


@functools.cache
def _det_order_jit():
    """The one ``cute.jit`` of ``_det_order_entry`` (cutlass_call caches on its identity)."""
    import cutlass.cute as cute  # noqa: PLC0415

    return cute.jit(_det_order_entry)


def det_schedule_order(offsets, entries, ocfg: BsaDetOrderConfig, held: int,
                       cute_call_mode: str = "shared"):
    """``(entries, ranks)`` of the schedule order (``metadata.kq_schedule_order_reference``
    computed on the GPU by ``kernels/bsa_det_order.py``) for the K->Q lists ``offsets``,
    ``entries`` of :func:`metadata.build_kq_csr`; ``held``: the CTAs the GPU holds (the
    launch-schedule estimate of :func:`metadata.kq_schedule_starts`). Slots past
    ``offsets[-1]`` are left unwritten."""
    from .._cute_call import call_builder  # noqa: PLC0415

    sds = jax.ShapeDtypeStruct(entries.shape, jnp.int32)
    if ocfg.held > 0:
        if held != ocfg.held:
            raise ValueError(f"det_schedule_order: held={held} differs from the order "
                             f"kernel's held={ocfg.held}")
        # the kernel computes the starts
        call = call_builder(cute_call_mode)(
            _det_order_held_jit(),
            output_shape_dtype=(sds, sds),
            compile_key=("bsa_det_order_held", ocfg),
            cfg=ocfg,
        )
        return call(offsets, entries)
    starts = metadata.kq_schedule_starts(offsets, num_kv_blocks=ocfg.n_kv, held=held)
    call = call_builder(cute_call_mode)(
        _det_order_jit(),
        output_shape_dtype=(sds, sds),
        compile_key=("bsa_det_order", ocfg),
        cfg=ocfg,
    )
    return call(offsets, entries, starts)


def deterministic_unsupported_reason(head_dim, block_size, switches=None, pack_gqa: int = 1,
                                     causal=False) -> str | None:
    """``None`` when the deterministic backward (the sm90ws kernel, with fixed-point dQ or
    ordered dQ additions) runs a call, else why not: it needs D in {64, 128} on the Hopper kernel family, the
    ``bsa_bwd_impl`` switch ``auto`` or ``sm90ws``, no ``pack_gqa`` (``causal`` is accepted
    and runs)."""
    from ..config import from_env  # noqa: PLC0415

    sw = from_env() if switches is None else switches
    where = ("deterministic=True runs the warp-specialized Hopper backward (sm90ws: head_dim "
             "in {64, 128}, sm_90a, bsa_bwd_impl 'auto' or 'sm90ws', without pack_gqa)")
    if head_dim not in _SM90_HEAD_DIMS:
        return f"{where}; got head_dim={head_dim}"
    if sw.bsa_bwd_impl not in ("auto", "sm90ws"):
        return f"{where}; got bsa_bwd_impl={sw.bsa_bwd_impl!r}"
    if _family_impl("sm90ws", head_dim, sw, block_size) != "sm90ws":
        return f"{where}; this call's kernel family is {_platform.kernel_family(sw)!r}"
    if pack_gqa > 1:
        return f"{where}; got pack_gqa=True"
    return None


def pack_gqa_unsupported_reason(*, head_dim, sparse_block_size, group, passes=("fwd", "bwd"),
                                switches=None, causal=False, kv_splits=1) -> str | None:
    """``None`` when the kernels that the ``passes`` of a call would run implement
    ``pack_gqa`` with ``group`` (``r = H_q / H_kv``) query heads per KV head, else why not:
    the sm90ws forward and the sm90ws (or sm90) backward pack groups of a size dividing 64, ``causal``
    included; the mma.sync (sm80) kernels do not pack. Every ``kv_splits`` packs (the
    packed forward splits its (packed block, KV head) rows;
    :func:`kv_splits_unsupported_reason` checks the split count against the packed metadata
    rows ``B H_kv N_qp``); ``causal`` and ``kv_splits`` are accepted for the callers' sake
    and change nothing."""
    if 64 % group:
        return (f"pack_gqa=True with r = H_q / H_kv = {group} is not implemented by the "
                f"block-sparse kernels (they pack groups of a size dividing 64)")
    for pas, want in (("fwd", None if switches is None else switches.bsa_fwd_impl),
                      ("bwd", None if switches is None else switches.bsa_bwd_impl)):
        if pas not in passes:
            continue
        want = want or "auto"
        impl = _family_impl(want, head_dim, switches, sparse_block_size)
        if impl == "sm80":
            return (f"pack_gqa=True is not implemented by the mma.sync (sm80 / portable) "
                    f"block-sparse {'forward' if pas == 'fwd' else 'backward'} (head_dim="
                    f"{head_dim}; the sm90 kernels pack at head_dim in {_SM90_HEAD_DIMS})")
    return None


def pre_config(dtype, head_dim, switches) -> BsaPreConfig | None:
    """The preprocessing kernel's compile key, or None for the XLA preprocessing."""
    if switches.bsa_pre_impl not in ("kernel", "kernel4", "delta"):
        return None
    pdl = bool(getattr(switches, "pdl", False)) and _platform.kernel_family(switches) == "sm90"
    return BsaPreConfig(jnp.dtype(dtype).name, head_dim, pdl,
                        zero_ws=switches.bsa_pre_impl != "delta",
                        rows_per_thread=4 if switches.bsa_pre_impl == "kernel4" else 1)


@dataclasses.dataclass(frozen=True)
class BsaKqConfig:
    """Compile key of the K->Q list kernel (``kernels/bsa_kq_lists.py``): ``n_chains``
    (batch x KV heads), ``group`` (query heads per KV head), ``n_q`` / ``n_kv`` (query / KV
    blocks), ``k_max`` (list slots per query block); ``bucket_entries`` / ``max_extra``
    (0 / 0: none): the work items of :func:`metadata.kq_bucket_items` computed too."""

    n_chains: int
    group: int
    n_q: int
    n_kv: int
    k_max: int
    bucket_entries: int = 0
    max_extra: int = 0


def kq_config(idx_shape, num_kv_heads: int, num_kv_blocks: int, bucket_entries: int = 0,
              max_extra: int = 0) -> BsaKqConfig | None:
    """The K->Q list kernel's compile key for ``q2k_block_index`` of shape ``idx_shape``
    ``(B, H_q, N_q, K_max)``, or None where the kernel does not take the call (symbolic or
    empty sizes, a (batch, KV head)'s bitmap or the row lengths beyond its shared memory, or
    more than ``MAX_SLOTS`` list slots, past its int32 indexing): the lists are then
    :func:`metadata.build_kq_csr`'s. ``bucket_entries`` > 0: the key of the launch that
    also computes :func:`metadata.kq_bucket_items` with ``max_extra`` (None where a chain's
    ``num_kv_blocks + max_extra`` items are more than ``MAX_ITEMS``)."""
    from ..kernels.bsa_kq_lists import fits  # noqa: PLC0415

    b, h_q, n_q, k_max = idx_shape
    dims = (b, h_q, n_q, k_max, num_kv_heads, num_kv_blocks)
    if not all(isinstance(x, int) and x >= 1 for x in dims) or h_q % num_kv_heads:
        return None
    group = h_q // num_kv_heads
    n_items = num_kv_blocks + max_extra if bucket_entries > 0 else 0
    if not fits(num_kv_blocks, group, n_q, b * num_kv_heads * num_kv_blocks,
                b * h_q * n_q * k_max, n_items):
        return None
    return BsaKqConfig(b * num_kv_heads, group, n_q, num_kv_blocks, k_max,
                       bucket_entries if n_items else 0, max_extra if n_items else 0)


def _kq_entry(stream, idx, nums, offsets, entries, words, counts, *, cfg: BsaKqConfig):
    from ..kernels.bsa_kq_lists import BsaKqLists  # noqa: PLC0415

    BsaKqLists(cfg.n_chains, cfg.group, cfg.n_q, cfg.n_kv, cfg.k_max, cfg.bucket_entries,
               cfg.max_extra)(idx, nums, offsets, entries, words, counts, stream)


@functools.cache
def _kq_jit():
    """The one ``cute.jit`` of ``_kq_entry`` (cutlass_call caches on its identity)."""
    import cutlass.cute as cute  # noqa: PLC0415

    return cute.jit(_kq_entry)


def kq_lists(q2k_block_index, q2k_block_nums, *, num_kv_heads: int, num_kv_blocks: int,
             kernel: bool = True, cute_call_mode: str = "shared", sanitized: bool = False,
             bucket_entries: int = 0, max_extra: int = 0, kernel_items: bool = False):
    """The backward's K->Q lists ``(offsets, entries)`` of the metadata as
    :func:`metadata.sanitize_bsa_metadata` clamps them (ids to ``[0, N_kv)``, counts to
    ``[0, K_max]``): :func:`metadata.build_kq_csr` of the clamped metadata (an id repeated
    in a row's active prefix listed once, as by its bitmap construction). With ``kernel``
    and where :func:`kq_config` takes the call, one launch of ``kernels/bsa_kq_lists.py``
    (it clamps as it reads); else the clamp and ``build_kq_csr`` in XLA (``sanitized``: the
    metadata are clamped already, only ``build_kq_csr``).

    ``bucket_entries`` > 0: ``offsets`` is followed by the flattened
    :func:`metadata.kq_bucket_items` of the offsets with ``bucket_entries`` and
    ``max_extra``, computed by the same launch with ``kernel_items`` where the kernel takes
    the call with them, else in XLA."""
    shape = q2k_block_index.shape
    kcfg = None
    if kernel and kernel_items and bucket_entries > 0:
        kcfg = kq_config(shape, num_kv_heads, num_kv_blocks, bucket_entries, max_extra)
    if kernel and kcfg is None:
        kcfg = kq_config(shape, num_kv_heads, num_kv_blocks)
    if kcfg is None:
        idx, nums = q2k_block_index, q2k_block_nums
        if not sanitized:
            idx, nums, _ = metadata.sanitize_bsa_metadata(idx, nums, None,
                                                          num_kv_blocks=num_kv_blocks,
                                                          block_size=1)
        offsets, entries = metadata.build_kq_csr(idx, nums, num_kv_heads=num_kv_heads,
                                                 num_kv_blocks=num_kv_blocks)
    else:
        offsets, entries = _kq_kernel_lists(q2k_block_index, q2k_block_nums, kcfg,
                                            cute_call_mode)
    if bucket_entries > 0 and not (kcfg is not None and kcfg.bucket_entries):
        items = metadata.kq_bucket_items(offsets, num_kv_blocks=num_kv_blocks,
                                         bucket_entries=bucket_entries, max_extra=max_extra)
        offsets = jnp.concatenate([offsets, items.reshape(-1)])
    return offsets, entries


def _kq_kernel_lists(q2k_block_index, q2k_block_nums, kcfg: BsaKqConfig, cute_call_mode: str):
    """``(offsets, entries)`` of one launch of the list kernel ``kcfg`` (``offsets``
    followed by the work items where ``kcfg`` has them)."""
    from .._cute_call import call_builder  # noqa: PLC0415

    n_rows = kcfg.n_chains * kcfg.n_kv
    n_words = -(-kcfg.group * kcfg.n_q // 32)
    n_slots = q2k_block_index.size
    n_item_words = (kcfg.n_chains * (kcfg.n_kv + kcfg.max_extra) * 6
                    if kcfg.bucket_entries else 0)
    i32 = jnp.int32
    call = call_builder(cute_call_mode)(
        _kq_jit(),
        output_shape_dtype=(jax.ShapeDtypeStruct((n_rows + 1 + n_item_words,), i32),
                            jax.ShapeDtypeStruct((n_slots,), i32),
                            jax.ShapeDtypeStruct((n_rows * n_words,), i32),
                            jax.ShapeDtypeStruct((n_rows,), i32)),
        compile_key=("bsa_kq_lists", kcfg),
        cfg=kcfg,
    )
    offsets, entries, _, _ = call(q2k_block_index.astype(i32).reshape(-1),
                                  q2k_block_nums.astype(i32).reshape(-1))
    return offsets, entries


def causal_unsupported_reason(head_dim, block_size, passes=("fwd", "bwd"),
                              switches=None) -> str | None:
    """``None`` when the kernels of ``passes`` implement ``causal=True``: the sm90 kernels
    (forward ``sm90ws``, backward ``sm90ws`` or ``sm90``: D in {64, 128}, Hopper kernel
    family);
    else why not, naming the option."""
    from ..config import from_env  # noqa: PLC0415

    sw = from_env() if switches is None else switches
    impls = {"fwd": _family_impl(sw.bsa_fwd_impl, head_dim, sw, block_size),
             "bwd": _family_impl(sw.bsa_bwd_impl, head_dim, sw)}
    for pas in passes:
        if impls[pas] == "sm80":
            switch = "bsa_fwd_impl" if pas == "fwd" else "bsa_bwd_impl"
            return (f"causal=True is implemented by the sm90 block-sparse kernels only "
                    f"(head_dim in {_SM90_HEAD_DIMS}, the sm90 kernel family, {switch} not "
                    f"'sm80'); this call's {'forward' if pas == 'fwd' else 'backward'} would "
                    f"run the mma.sync (sm80) kernel (head_dim={head_dim}, kernel family "
                    f"{_platform.kernel_family(sw)!r}, {switch}={getattr(sw, switch)!r}); "
                    f"backend='reference' implements it")
    return None


def bsa_kernel_unsupported_reason(*, dtype, head_dim, head_dim_v, sparse_block_size,
                                  passes=("fwd", "bwd"), switches=None, causal=False,
                                  kv_splits=1, num_rows=1, k_max=1,
                                  partial_elems=0) -> str | None:
    """``None`` when the BSA kernels implement this static configuration for the ``passes``
    the call may run on the target GPU, else why not (``kv_splits``, ``num_rows``,
    ``k_max``, ``partial_elems``: see :func:`kv_splits_unsupported_reason`; only the forward
    splits)."""
    name = jnp.dtype(dtype).name
    if name not in _DTYPES:
        return f"the BSA kernels support float16 and bfloat16 inputs, got {name}"
    if head_dim != head_dim_v:
        return f"the BSA kernels need D == D_v, got D={head_dim}, D_v={head_dim_v}"
    if head_dim not in SUPPORTED_HEAD_DIMS:
        return f"the BSA kernels support head dims {SUPPORTED_HEAD_DIMS}, got {head_dim}"
    if sparse_block_size not in SUPPORTED_BLOCK_SIZES:
        return f"the BSA kernels support sparse_block_size in {SUPPORTED_BLOCK_SIZES}, got {sparse_block_size}"
    if causal:
        reason = causal_unsupported_reason(head_dim, sparse_block_size, passes, switches)
        if reason is not None:
            return reason
    if "fwd" in passes:
        reason = kv_splits_unsupported_reason(
            kv_splits, head_dim=head_dim, sparse_block_size=sparse_block_size,
            num_rows=num_rows, k_max=k_max, partial_elems=partial_elems, switches=switches)
        if reason is not None:
            return reason
    # the sm90 kernels run D in {64, 128} on sm_90a only; elsewhere (and at D in {32, 256})
    # the sm80 kernels run, whose tiles must fit the target's shared memory
    if _platform.kernel_family(switches) == "sm90" and head_dim in _SM90_HEAD_DIMS:
        return None
    return smem_unsupported_reason(head_dim, sparse_block_size, passes, switches)


def _cutlass_dtype(name: str):
    import cutlass  # noqa: PLC0415

    return {"float16": cutlass.Float16, "bfloat16": cutlass.BFloat16}[name]


def _specs(layout: str):
    from cutlass.jax import TensorSpec  # noqa: PLC0415

    if layout == "bhsd":
        return TensorSpec(mode=(0, 2, 1, 3))
    if layout == "bshd":
        return TensorSpec()
    raise ValueError(f"layout must be 'bhsd' or 'bshd', got {layout!r}")


# --------------------------------------------------------------------------- forward


def _fwd_entry(stream, q, k, v, idx, nums, sizes, scale, out, lse, *, cfg: BsaFwdConfig):
    if cfg.impl == "sm90ws":
        kernel = _ws_fwd_kernel(cfg, stream_k=False)
    else:
        from ..kernels.bsa_fwd_sm80 import BsaFwdSm80  # noqa: PLC0415

        kw = {} if cfg.kv_splits == 1 else {"kv_splits": cfg.kv_splits}
        kernel = BsaFwdSm80(_cutlass_dtype(cfg.dtype), cfg.head_dim, cfg.block_size,
                            cfg.has_block_sizes, q_in_regs=cfg.q_in_regs,
                            min_blocks=cfg.min_blocks, late_v_wait=cfg.late_v_wait,
                            warp_rows=cfg.warp_rows, **kw)
    kernel(q, k, v, idx, nums, sizes, scale, out, lse, stream)


def _ws_fwd_kernel(cfg: BsaFwdConfig, stream_k: bool):
    """The sm90ws forward of ``cfg`` (``stream_k``: the variant whose call passes the
    partial workspace and flags, ``_fwd_sk_entry``)."""
    from ..kernels.bsa_fwd_sm90_ws import BsaFwdSm90Ws  # noqa: PLC0415

    kw = {} if cfg.kv_splits == 1 else {"kv_splits": cfg.kv_splits}
    return BsaFwdSm90Ws(_cutlass_dtype(cfg.dtype), cfg.head_dim, cfg.block_size,
                        cfg.has_block_sizes, cfg.num_sms, overlap=cfg.ws_overlap,
                        pingpong=cfg.ws_pingpong, max_stages=cfg.ws_max_stages,
                        q_stages=cfg.ws_q_stages, causal=cfg.causal, pack_gqa=cfg.pack_gqa,
                        head_major=cfg.ws_head_major, lazy_rescale=cfg.ws_lazy_rescale,
                        three_ctas=cfg.ws_three_ctas, o_alias_first=cfg.ws_o_alias,
                        cross_item=cfg.ws_cross, v_lag=cfg.ws_v_lag, q_regs=cfg.ws_q_regs,
                        meta_prefetch=cfg.ws_meta_prefetch, q_ahead=cfg.ws_q_ahead,
                        epi_vec=cfg.ws_epi_vec, split_wait=cfg.ws_split_wait, pdl=cfg.pdl,
                        stream_k=stream_k, tma_o=cfg.ws_tma_o,
                        tma_o_packed=cfg.ws_tma_o_packed, k_single=cfg.ws_k_single,
                        self_load=cfg.ws_self_load, pair_items=cfg.ws_pair_wg,
                        l2_hint=cfg.ws_l2_hint, o_in_q=cfg.ws_o_in_q,
                        o_early=cfg.ws_o_early, tree_sum=cfg.ws_tree_sum,
                        skip_load=cfg.ws_skip_load, half_items=cfg.ws_half_items,
                        s_n64=cfg.ws_s_n64, no_softmax=cfg.ws_no_softmax,
                        mix_pv=cfg.ws_mix_pv, k_deep=cfg.ws_k_deep,
                        pair_step=cfg.ws_pair_step, kv_warps=cfg.ws_kv_warps,
                        pair_box=cfg.ws_pair_box, wg_release=cfg.ws_wg_release, **kw)


@functools.cache
def _fwd_jit():
    """The one ``cute.jit`` of ``_fwd_entry`` (cutlass_call caches on its identity)."""
    import cutlass.cute as cute  # noqa: PLC0415

    return cute.jit(_fwd_entry)


def _fwd_sk_entry(stream, q, k, v, idx, nums, sizes, scale, flags, out, lse, ws, *,
                  cfg: BsaFwdConfig):
    # stream_k: the per-(CTA, warpgroup) flags are aliased to output 3 (zeroed by XLA); the
    # partial workspace is a plain output, read only where a flag says it was written
    _ws_fwd_kernel(cfg, stream_k=True)(q, k, v, idx, nums, sizes, scale, out, lse, stream,
                                       mWs=ws, mFlags=flags)


@functools.cache
def _fwd_sk_jit():
    """The one ``cute.jit`` of ``_fwd_sk_entry``."""
    import cutlass.cute as cute  # noqa: PLC0415

    return cute.jit(_fwd_sk_entry)


def _sk_sizes(cfg: BsaFwdConfig):
    """``(workspace fp32 values, flags)`` of the stream-K forward (``BsaFwdSm90Ws.sk_floats``
    and one flag per CTA slot and consumer warpgroup), from the config alone."""
    num_wg = cfg.block_size // 64
    per_sm = 1 if num_wg == 2 else (3 if cfg.ws_three_ctas else 2)
    slots = max(cfg.num_sms, 1) * per_sm
    return slots * num_wg * 128 * (cfg.head_dim // 2 + 4), slots * num_wg


def bsa_fwd(q, k, v, q2k_block_index, q2k_block_nums, block_sizes, cfg):
    """Block-sparse attention forward on the CuTe DSL kernel for the op config ``cfg``
    (:class:`~jax_sparse_attn.config.BSAConfig` with ``cfg.fwd`` set; metadata in the
    form of :func:`~jax_sparse_attn.metadata.normalize_bsa_metadata`). Returns
    ``(out, lse)``: ``out`` in q's layout and dtype, ``lse`` float32 ``(B, H_q, S_q)``
    (natural log, ``-inf`` on rows with no active block).
    """
    from .._cute_call import call_builder  # noqa: PLC0415

    if cfg.batch * cfg.num_heads_q * cfg.seqlen_q == 0 or cfg.seqlen_kv == 0:
        # no query row, or no key for any row: nothing to launch (a grid or TMA box of zero
        # extent); the result of rows without keys
        return (jnp.zeros(q.shape[:-1] + (cfg.head_dim_v,), q.dtype),
                jnp.full((cfg.batch, cfg.num_heads_q, cfg.seqlen_q), -jnp.inf, jnp.float32))
    spec = _specs(cfg.layout)
    if cfg.fwd.kv_splits > 1:
        return _bsa_fwd_split(q, k, v, q2k_block_index, q2k_block_nums, block_sizes, cfg, spec)
    if cfg.fwd.impl != "sm90ws" or cfg.fwd.ws_stream_k or cfg.fwd.ws_xla_clamp:
        # the sm90ws forward clamps counts, ids and sizes itself (block_info.BlockList:
        # every list entry it reads, the count of every item, every block size); the
        # others (and the stream-K tail's uniform-count check) read the metadata as given
        q2k_block_index, q2k_block_nums, block_sizes = _sanitize(
            q2k_block_index, q2k_block_nums, block_sizes, cfg)
    if cfg.fwd.impl == "sm90ws" and cfg.fwd.ws_sort_lists:
        q2k_block_index = _sort_lists(q2k_block_index, q2k_block_nums)
    if cfg.fwd.impl == "sm90ws" and cfg.fwd.ws_stream_k:
        n_ws, n_flags = _sk_sizes(cfg.fwd)
        flags = jnp.zeros((n_flags,), jnp.int32)
        call = call_builder(cfg.cute_call)(
            _fwd_sk_jit(),
            output_shape_dtype=(
                jax.ShapeDtypeStruct(q.shape[:-1] + (cfg.head_dim_v,), q.dtype),
                jax.ShapeDtypeStruct((cfg.batch, cfg.num_heads_q, cfg.seqlen_q), jnp.float32),
                jax.ShapeDtypeStruct((n_ws,), jnp.float32),
                jax.ShapeDtypeStruct((n_flags,), jnp.int32),
            ),
            input_spec=(spec, spec, spec, None, None, None, None, None),
            output_spec=(spec, None, None, None),
            input_output_aliases={7: 3},
            compile_key=("bsa_fwd_sk", cfg.fwd),
            cfg=cfg.fwd,
            static_last_inputs=(0, 1, 2),
            static_last_outputs=(0,),
        )
        out, lse, _, _ = call(q, k, v, q2k_block_index, q2k_block_nums, block_sizes,
                              _scale_array(cfg.softmax_scale), flags)
        return out, lse
    call = call_builder(cfg.cute_call)(
        _fwd_jit(),
        output_shape_dtype=(
            jax.ShapeDtypeStruct(q.shape[:-1] + (cfg.head_dim_v,), q.dtype),
            jax.ShapeDtypeStruct((cfg.batch, cfg.num_heads_q, cfg.seqlen_q), jnp.float32),
        ),
        input_spec=(spec, spec, spec, None, None, None, None),
        output_spec=(spec, None),
        compile_key=("bsa_fwd", cfg.fwd),
        cfg=cfg.fwd,
        static_last_inputs=(0, 1, 2),
        static_last_outputs=(0,),
    )
    return call(q, k, v, q2k_block_index, q2k_block_nums, block_sizes,
                _scale_array(cfg.softmax_scale))


# --------------------------------------------------------------------------- split-KV


@dataclasses.dataclass(frozen=True)
class BsaCombineConfig:
    """Compile key of the split-KV combine kernel (``kernels/bsa_combine.py``): ``kv_splits``
    the split count of its unrolled variant (at most ``bsa_combine.UNROLL_MAX``), 0 for the
    variant that reads the count at run time."""

    dtype: str
    head_dim: int
    kv_splits: int = 0


#: most splits the combine kernel unrolls (kernels/bsa_combine.py UNROLL_MAX)
_COMBINE_UNROLL_MAX = 16


def _combine_entry(stream, o_part, lse_part, out, lse, *, cfg: BsaCombineConfig):
    from ..kernels.bsa_combine import BsaCombine  # noqa: PLC0415

    BsaCombine(_cutlass_dtype(cfg.dtype), cfg.head_dim, cfg.kv_splits)(o_part, lse_part, out,
                                                                       lse, stream)


@functools.cache
def _combine_jit():
    """The one ``cute.jit`` of ``_combine_entry`` (cutlass_call caches on its identity)."""
    import cutlass.cute as cute  # noqa: PLC0415

    return cute.jit(_combine_entry)


def _bsa_fwd_split(q, k, v, idx, nums, sizes, cfg, spec):
    """Split-KV forward: the forward (sm90ws or sm80) with ``cfg.fwd.kv_splits = S > 1``
    writes per split ``s`` the fp32 partial ``o_part[s] (B, H_q, S_q, D_v)``, normalised by its own
    softmax denominator (0 for a split without keys), and ``lse_part[s] (B, H_q, S_q)``
    (natural log, ``-inf`` for a split without keys); the combine kernel merges them in split
    order into ``out`` (q's layout and dtype) and ``lse``. Both buffers are XLA-owned
    outputs of the first call. Metadata as in :func:`bsa_fwd` before :func:`_sanitize`."""
    from .._cute_call import call_builder  # noqa: PLC0415

    n_splits = cfg.fwd.kv_splits
    B, H, S_q, D_v = cfg.batch, cfg.num_heads_q, cfg.seqlen_q, cfg.head_dim_v
    out_shape = q.shape[:-1] + (D_v,)
    if n_splits * B * H * S_q * D_v > _MAX_PARTIAL_ELEMS:
        # the public layer declines this (kv_splits_unsupported_reason); jax.vmap folds its
        # axis into B after that check, so it is repeated on the folded shape here
        raise NotImplementedError(
            f"kv_splits={n_splits}: the {n_splits} fp32 partial outputs of {B * H * S_q * D_v} "
            f"elements each (B={B} including any jax.vmap axis, H_q={H}, S_q={S_q}, "
            f"D_v={D_v}) exceed 2^31 elements; use fewer splits or backend='reference'")
    if cfg.fwd.impl != "sm90ws":
        # the sm90ws forward clamps counts, ids and sizes itself (block_info.BlockList); the
        # others read the metadata as given
        idx, nums, sizes = _sanitize(idx, nums, sizes, cfg)
    call = call_builder(cfg.cute_call)(
        _fwd_jit(),
        output_shape_dtype=(
            jax.ShapeDtypeStruct((n_splits, B, H, S_q, D_v), jnp.float32),
            jax.ShapeDtypeStruct((n_splits, B, H, S_q), jnp.float32),
        ),
        input_spec=(spec, spec, spec, None, None, None, None),
        output_spec=(None, None),
        compile_key=("bsa_fwd", cfg.fwd),
        cfg=cfg.fwd,
        static_last_inputs=(0, 1, 2),
        static_last_outputs=(0,),
    )
    o_part, lse_part = call(q, k, v, idx, nums, sizes, _scale_array(cfg.softmax_scale))
    ckey = BsaCombineConfig(cfg.dtype, D_v,
                            n_splits if n_splits <= _COMBINE_UNROLL_MAX else 0)
    combine = call_builder(cfg.cute_call)(
        _combine_jit(),
        output_shape_dtype=(
            jax.ShapeDtypeStruct(out_shape, q.dtype),
            jax.ShapeDtypeStruct((B, H, S_q), jnp.float32),
        ),
        input_spec=(None, None),
        output_spec=(spec, None),
        compile_key=("bsa_combine", ckey),
        cfg=ckey,
        static_last_inputs=(0,),
        static_last_outputs=(0,),
    )
    return combine(o_part, lse_part)


def _sanitize(idx, nums, sizes, cfg):
    """Metadata clamped so that no value makes a kernel read or write out of bounds."""
    return metadata.sanitize_bsa_metadata(idx, nums, sizes, num_kv_blocks=cfg.num_kv_blocks,
                                          block_size=cfg.sparse_block_size)


def _sort_lists(idx, nums):
    """``idx`` (B, H, N_q, K_max) with each row's active prefix (its first ``nums`` entries,
    ``nums`` clamped to 0..K_max as the kernel clamps it) in ascending order; the entries past
    it become the int32 maximum, which sorts after every active entry, so the prefix holds
    the same multiset of blocks."""
    k_max = idx.shape[-1]
    cnt = jnp.clip(nums, 0, k_max)[..., None]
    active = jnp.arange(k_max, dtype=jnp.int32) < cnt
    return jnp.sort(jnp.where(active, idx, jnp.iinfo(jnp.int32).max), axis=-1)


def _scale_array(softmax_scale):
    return jnp.full((1,), softmax_scale, jnp.float32)


# --------------------------------------------------------------------------- backward


def _pre_entry(stream, out, do, delta, dq_acc, *, cfg: BsaPreConfig):
    from ..kernels.bsa_pre import BsaPreprocess  # noqa: PLC0415

    BsaPreprocess(_cutlass_dtype(cfg.dtype), cfg.head_dim, cfg.pdl,
                  zero_elems=cfg.zero_elems, rows_per_thread=cfg.rows_per_thread)(
        out, do, delta, dq_acc, stream)


def _pre_delta_entry(stream, out, do, delta, *, cfg: BsaPreConfig):
    from ..kernels.bsa_pre import BsaPreprocess  # noqa: PLC0415

    BsaPreprocess(_cutlass_dtype(cfg.dtype), cfg.head_dim, cfg.pdl,
                  rows_per_thread=cfg.rows_per_thread)(out, do, delta, None, stream)


@functools.cache
def _pre_jit(with_dq: bool = True):
    """The one ``cute.jit`` of ``_pre_entry`` (``with_dq``) or ``_pre_delta_entry``
    (cutlass_call caches on its identity)."""
    import cutlass.cute as cute  # noqa: PLC0415

    return cute.jit(_pre_entry if with_dq else _pre_delta_entry)


#: ``bsa_bwd_ws=zerolag``: the (batch, KV head) pairs between a CTA's own and the one whose
#: dQ workspace it zeroes (the preprocessing launch zeroes the first ones)
ZERO_LAG = 2

#: most fp32 elements of the dQ workspace that the preprocessing launch zeroes (a flat
#: tensor: its extent is an int32 in the kernel, and so are its 16-byte-vector indices)
_MAX_ZERO_ELEMS = 2**31 - 2**24


def _zero_fits(ws_shape) -> bool:
    """Whether a kernel launch may zero the fp32 dQ workspace of ``ws_shape`` (concrete and
    at most ``_MAX_ZERO_ELEMS`` elements)."""
    n = math.prod(ws_shape)
    return isinstance(n, int) and n <= _MAX_ZERO_ELEMS


def bsa_preprocess(do, out, cfg, with_ws: bool = True, zero_elems: int = 0):
    """``delta = rowsum(dO * O)`` (fp32 ``(B, H_q, S_q)``) and a zeroed fp32 dQ workspace:
    q's shape and layout, or with ``cfg.bwd.dq_tile`` the query-tile workspace
    :func:`dq_tile_shape`. One CuTe DSL launch (``kernels/bsa_pre.py``) computes delta and,
    with ``cfg.pre.zero_ws``, zeroes the workspace (else XLA zeroes it, as it does a workspace
    of more than ``_MAX_ZERO_ELEMS`` elements) when ``cfg.pre`` is set; else both are XLA's.
    ``with_ws=False``: delta only (the workspace is None). ``zero_elems`` > 0: the launch
    zeroes only the workspace's first ``zero_elems`` elements (``cfg.bwd.zero_lag``: the
    backward zeroes the rest); XLA's zeroing zeroes it all."""
    from .._cute_call import call_builder  # noqa: PLC0415

    tile = cfg.bwd is not None and cfg.bwd.dq_tile
    ws_shape = dq_tile_shape(cfg) if tile else out.shape[:-1] + (cfg.head_dim,)
    if cfg.pre is None:
        delta = jnp.sum(do.astype(jnp.float32) * out.astype(jnp.float32), axis=-1)
        if cfg.layout == "bshd":
            delta = jnp.swapaxes(delta, 1, 2)
        return delta, jnp.zeros(ws_shape, jnp.float32) if with_ws else None
    spec = _specs(cfg.layout)
    delta_sds = jax.ShapeDtypeStruct((cfg.batch, cfg.num_heads_q, cfg.seqlen_q), jnp.float32)
    if not with_ws or not _zero_fits(ws_shape):
        # the launch zeroes a flat workspace of at most _MAX_ZERO_ELEMS elements (an int32
        # extent and 32-bit indices); a larger or symbolic one is zeroed by XLA
        cfg = dataclasses.replace(cfg, pre=dataclasses.replace(cfg.pre, zero_ws=False))
    if not cfg.pre.zero_ws:
        call = call_builder(cfg.cute_call)(
            _pre_jit(False),
            output_shape_dtype=(delta_sds,),
            input_spec=(spec, spec),
            output_spec=(None,),
            compile_key=("bsa_pre_delta", cfg.pre),
            cfg=cfg.pre,
            static_last_inputs=(0, 1),
        )
        (delta,) = call(out, do.astype(out.dtype))
        return delta, jnp.zeros(ws_shape, jnp.float32) if with_ws else None
    if zero_elems:
        cfg = dataclasses.replace(cfg, pre=dataclasses.replace(cfg.pre, zero_elems=zero_elems))
    # the workspace leaves the launch flat (zeroed by 16-byte stores) and is reshaped here
    call = call_builder(cfg.cute_call)(
        _pre_jit(),
        output_shape_dtype=(
            delta_sds,
            jax.ShapeDtypeStruct((math.prod(ws_shape),), jnp.float32),
        ),
        input_spec=(spec, spec),
        output_spec=(None, None),
        compile_key=("bsa_pre", cfg.pre),
        cfg=cfg.pre,
        static_last_inputs=(0, 1),
    )
    delta, ws = call(out, do.astype(out.dtype))
    return delta, ws.reshape(ws_shape)


def dq_tile_shape(cfg) -> tuple:
    """The query-tile dQ workspace of the Hopper backwards (``cfg.bwd.dq_tile``): fp32
    ``(B, H_q, ceil(S_q / 64) P, 64 D)``, each 64-row tile in the block order of
    ``kernels/dq_tiles.py``, ``P =`` :func:`det_slots_of` ``(cfg)`` consecutive
    accumulators per query tile; with ``pack_gqa`` (``r`` in the backward's key) the packed
    rows of the KV heads, ``(B, H_kv, ceil(S_q r / 64), 64 D)``."""
    r = cfg.bwd.pack_gqa if cfg.bwd is not None else 1
    if r > 1:
        # packed rows of the KV heads (the warp-specialized backward with pack_gqa)
        return (cfg.batch, cfg.num_heads_kv, -(-cfg.seqlen_q * r // 64), 64 * cfg.head_dim)
    return (cfg.batch, cfg.num_heads_q, -(-cfg.seqlen_q // 64) * det_slots_of(cfg),
            64 * cfg.head_dim)


def dq_block_cols(bwd) -> int:
    """Columns of one block of the query-tile workspace of the backward ``bwd``."""
    if bwd.impl == "sm90ws":
        from ..kernels.bsa_bwd_sm90_ws import bwd_ws_dq_block_cols  # noqa: PLC0415

        return bwd_ws_dq_block_cols(bwd.head_dim, bwd.block_size)
    return 64


@dataclasses.dataclass(frozen=True)
class BsaDqTilesConfig:
    """Compile key of the kernel that reorders the query-tile dQ workspace into dq."""

    dtype: str
    head_dim: int
    block_cols: int
    pdl: bool = False  # programmatic dependent launch (the backward's)
    slots: int = 1  # accumulators per query tile, summed in order
    pack: int = 1  # packed GQA rows (r; 1: not packed)


def _dq_tiles_entry(stream, ws, dq, *, cfg: BsaDqTilesConfig):
    from ..kernels.dq_tiles import BsaDqFromTiles  # noqa: PLC0415

    BsaDqFromTiles(_cutlass_dtype(cfg.dtype), cfg.head_dim, cfg.block_cols, cfg.pdl,
                   cfg.slots, cfg.pack)(ws, dq, stream)


def _dq_tiles_sem_entry(stream, ws, sem, dq, *, cfg: BsaDqTilesConfig):
    # the workspace of the deterministic backward with det_store (not zeroed) and its
    # semaphores, int32 (B, H_q, N_t slots)
    from ..kernels.dq_tiles import BsaDqFromTiles  # noqa: PLC0415

    BsaDqFromTiles(_cutlass_dtype(cfg.dtype), cfg.head_dim, cfg.block_cols, cfg.pdl,
                   cfg.slots)(ws, dq, stream, mSem=sem)


@functools.cache
def _dq_tiles_jit(with_sem: bool = False):
    """The one ``cute.jit`` of ``_dq_tiles_entry`` (``with_sem``: ``_dq_tiles_sem_entry``)."""
    import cutlass.cute as cute  # noqa: PLC0415

    return cute.jit(_dq_tiles_sem_entry if with_sem else _dq_tiles_entry)


def dq_from_tiles(ws, seqlen_q, head_dim, block_cols, slots=1):
    """The ``(B, S_q, H_q, D)`` fp32 dq held by the query-tile workspace ``ws`` ``(B, H_q,
    N_t slots, 64 D)`` of ``block_cols``-column blocks (``kernels/dq_tiles.py``: block ``c =
    4 cg + rg``, float ``4 (32 j + 4 g + q) + 2 h + e`` of a block is row ``16 rg + 8 h +
    g``, column ``block_cols cg + 8 j + 2 q + e``; ``slots`` consecutive accumulators per
    query tile, summed in order): the jnp statement of what the reordering kernel computes
    (tests)."""
    b, h, nts, _ = ws.shape
    nt = nts // slots
    acc = ws.reshape(b, h, nt, slots, -1)
    ws = acc[:, :, :, 0]
    for p in range(1, slots):
        ws = ws + acc[:, :, :, p]
    w = block_cols
    # (b, h, t, cg, rg, j, g, q, hh, e)
    x = ws.reshape(b, h, nt, head_dim // w, 4, w // 8, 8, 4, 2, 2)
    # rows (t, rg, hh, g), columns (cg, j, q, e)
    x = x.transpose(0, 2, 4, 8, 6, 1, 3, 5, 7, 9)
    return x.reshape(b, nt * 64, h, head_dim)[:, :seqlen_q]


def _dq_out(dq_acc, q, cfg, spec, dq_sem=None):
    """dq in q's dtype and layout from the backward's fp32 workspace: the reordering kernel
    for the query-tile workspace, else XLA's cast. ``dq_sem``: the deterministic backward's
    semaphores of a workspace that was not zeroed (``det_store``: accumulator tiles whose
    semaphore is 0 count as zeros)."""
    from .._cute_call import call_builder  # noqa: PLC0415

    if not cfg.bwd.dq_tile:
        return dq_acc.astype(q.dtype)
    key = BsaDqTilesConfig(cfg.bwd.dtype, cfg.head_dim, dq_block_cols(cfg.bwd), cfg.bwd.pdl,
                           det_slots_of(cfg), cfg.bwd.pack_gqa)
    call = call_builder(cfg.cute_call)(
        _dq_tiles_jit(dq_sem is not None),
        output_shape_dtype=(jax.ShapeDtypeStruct(q.shape, q.dtype),),
        input_spec=(None,) * (1 if dq_sem is None else 2),
        output_spec=(spec,),
        compile_key=("bsa_dq_tiles", key, dq_sem is not None),
        cfg=key,
        static_last_outputs=(0,),
    )
    (dq,) = call(dq_acc) if dq_sem is None else call(dq_acc, dq_sem)
    return dq


def _ws_kernel(cfg: BsaBwdConfig, after_pre: bool = False):
    from ..kernels.bsa_bwd_sm90_ws import BsaBwdSm90Ws  # noqa: PLC0415

    return BsaBwdSm90Ws(_cutlass_dtype(cfg.dtype), cfg.head_dim, cfg.block_size,
                        cfg.has_block_sizes, max_stages=cfg.ws_max_stages,
                        ld_wait=cfg.ws_ld_wait, lpt=cfg.ws_lpt, decouple=cfg.ws_decouple,
                        deterministic=cfg.deterministic, dq_tile=cfg.dq_tile,
                        dq_alias=cfg.ws_dq_alias, pdl=cfg.pdl, det_writer=cfg.det_writer,
                        dq_writer=cfg.dq_writer,
                        dq_late=cfg.ws_dq_late, lse_early=cfg.ws_lse_early,
                        split_wait=cfg.ws_split_wait, epi_pairs=cfg.ws_epi_pairs,
                        epi_smem=cfg.ws_epi_smem, dq_alt=cfg.ws_dq_alt,
                        dq_slots=cfg.det_slots, relaxed_poll=cfg.det_relaxed_poll,
                        order_stream=cfg.det_stream, stream_after_pre=after_pre,
                        det_store=cfg.det_store, causal=cfg.causal, pack_gqa=cfg.pack_gqa,
                        dq_claim=cfg.dq_claim, zero_lag=cfg.zero_lag,
                        tail_conv=cfg.tail_conv, lpt_chain=cfg.ws_lpt_chain,
                        persist=cfg.ws_persist, persist_kv_at=cfg.ws_persist_kv_at,
                        persist_kv_l2=cfg.ws_persist_kv_l2, dq_fixed=cfg.dq_fixed,
                        l2_hint=cfg.ws_l2_hint, uniform_frags=cfg.ws_uniform_frags,
                        wg_hand=cfg.ws_wg_hand, ld_scaled=cfg.ws_ld_scaled,
                        dv_wait=cfg.ws_dv_wait, dk_lag=cfg.ws_dk_lag,
                        s_ahead=cfg.ws_s_ahead, stamps=cfg.ws_stamps,
                        red_v4=cfg.ws_red_v4, fast_div=cfg.ws_fast_div,
                        q_probe=cfg.ws_q_probe, ent_ahead=cfg.ws_ent_ahead,
                        ex2_emu=cfg.ws_ex2_emu, dq_lag=cfg.ws_dq_lag,
                        wg_uniform=cfg.ws_wg_uniform, fix_emu=cfg.ws_fix_emu,
                        buckets=cfg.ws_buckets != 0)


def _bwd_det_entry(stream, q, k, v, do, lse, delta, offsets, entries, ranks, sizes, scale,
                   dq_acc, dq_sem, dk, dv, *, cfg: BsaBwdConfig):
    # deterministic: dq_acc and the dq semaphores (int32 (B, H_q, N_q blk / 64 det_slots))
    # are aliased
    # to outputs 0 and 3 (zero-initialised by XLA)
    _ws_kernel(cfg)(q, k, v, do, lse, delta, offsets, entries, sizes, scale, dq_acc, dk, dv,
                    stream, mRank=ranks, mdQSem=dq_sem)


def _bwd_det_store_entry(stream, q, k, v, do, lse, delta, offsets, entries, ranks, sizes,
                         scale, dq_sem, dq_acc, dk, dv, *, cfg: BsaBwdConfig):
    # deterministic with det_store: the semaphores are aliased to output 3 (zero-initialised
    # by XLA); the workspace is a plain output, written (first contributions stored) by the
    # kernel where it has contributions
    _ws_kernel(cfg)(q, k, v, do, lse, delta, offsets, entries, sizes, scale, dq_acc, dk, dv,
                    stream, mRank=ranks, mdQSem=dq_sem)


def _bwd_claim_entry(stream, q, k, v, do, lse, delta, offsets, entries, sizes, scale, dq_sem,
                     dq_acc, dk, dv, *, cfg: BsaBwdConfig):
    # dq_claim: the per-tile flags are aliased to output 3 (zero-initialised by XLA); the
    # workspace is a plain output, written where a tile has contributions (the first one
    # stored)
    _ws_kernel(cfg)(q, k, v, do, lse, delta, offsets, entries, sizes, scale, dq_acc, dk, dv,
                    stream, mdQSem=dq_sem)


@functools.cache
def _bwd_claim_jit():
    """The one ``cute.jit`` of ``_bwd_claim_entry``."""
    import cutlass.cute as cute  # noqa: PLC0415

    return cute.jit(_bwd_claim_entry)


@functools.cache
def _bwd_det_store_jit():
    """The one ``cute.jit`` of ``_bwd_det_store_entry``."""
    import cutlass.cute as cute  # noqa: PLC0415

    return cute.jit(_bwd_det_store_entry)


def _bwd_det_stream_entry(stream, q, k, v, do, lse, delta, offsets, entries, starts, sizes,
                          scale, dq_acc, dq_sem, progress, dk, dv, entries_out, ranks, *,
                          cfg: BsaBwdConfig, ocfg: BsaDetOrderConfig):
    # deterministic with det_stream: the schedule-order kernel, then the backward (its
    # programmatic dependent with pdl), which polls each CSR row's published prefix
    # (``progress``, int32 per row, zero-initialised by XLA and aliased like dq_acc and the
    # semaphores)
    from ..kernels.bsa_det_order import BsaDetScheduleOrder  # noqa: PLC0415

    BsaDetScheduleOrder(ocfg.n_kv, ocfg.n_tiles, ocfg.e_cap, ocfg.window, ocfg.subrounds,
                        publish=True, pdl=cfg.pdl, scan=ocfg.scan, fast=ocfg.fast,
                        held=ocfg.held)(
        offsets, entries, starts, entries_out, ranks, stream, mProgress=progress)
    _ws_kernel(cfg)(q, k, v, do, lse, delta, offsets, entries_out, sizes, scale, dq_acc, dk,
                    dv, stream, mRank=ranks, mdQSem=dq_sem, mProgress=progress)


def _bwd_det_overlap_entry(stream, q, k, v, do, out, lse, offsets, entries, starts, sizes,
                           scale, dq_sem, progress, dq_acc, dk, dv, entries_out, ranks, delta,
                           *, cfg: BsaBwdConfig, ocfg: BsaDetOrderConfig, pcfg: BsaPreConfig):
    # _bwd_det_stream_entry with the preprocessing (delta, the zeroed dQ workspace) launched
    # between the order kernel and the backward, as the order kernel's programmatic
    # dependent without a wait of its own: it runs alongside the order kernel, and the
    # backward waits for it at its start
    from ..kernels.bsa_det_order import BsaDetScheduleOrder  # noqa: PLC0415
    from ..kernels.bsa_pre import BsaPreprocess  # noqa: PLC0415

    import cutlass.cute as cute  # noqa: PLC0415

    BsaDetScheduleOrder(ocfg.n_kv, ocfg.n_tiles, ocfg.e_cap, ocfg.window, ocfg.subrounds,
                        publish=True, pdl=cfg.pdl, scan=ocfg.scan, fast=ocfg.fast,
                        held=ocfg.held)(
        offsets, entries, starts, entries_out, ranks, stream, mProgress=progress)
    flat = cute.make_tensor(dq_acc.iterator, cute.make_layout((cute.size(dq_acc),)))
    BsaPreprocess(_cutlass_dtype(pcfg.dtype), pcfg.head_dim, cfg.pdl, wait=False)(
        out, do, delta, flat, stream)
    _ws_kernel(cfg, after_pre=True)(q, k, v, do, lse, delta, offsets, entries_out, sizes,
                                    scale, dq_acc, dk, dv, stream, mRank=ranks,
                                    mdQSem=dq_sem, mProgress=progress)


@functools.cache
def _bwd_det_overlap_jit():
    """The one ``cute.jit`` of ``_bwd_det_overlap_entry``."""
    import cutlass.cute as cute  # noqa: PLC0415

    return cute.jit(_bwd_det_overlap_entry)


@functools.cache
def _bwd_det_stream_jit():
    """The one ``cute.jit`` of ``_bwd_det_stream_entry``."""
    import cutlass.cute as cute  # noqa: PLC0415

    return cute.jit(_bwd_det_stream_entry)


@functools.cache
def _bwd_det_jit():
    """The one ``cute.jit`` of ``_bwd_det_entry``."""
    import cutlass.cute as cute  # noqa: PLC0415

    return cute.jit(_bwd_det_entry)


def _bwd_entry(stream, q, k, v, do, lse, delta, offsets, entries, sizes, scale, dq_acc, dk, dv,
               *, cfg: BsaBwdConfig):
    args = (_cutlass_dtype(cfg.dtype), cfg.head_dim, cfg.block_size, cfg.has_block_sizes)
    if cfg.impl == "sm90ws":
        kernel = _ws_kernel(cfg)
    elif cfg.impl == "sm90":
        from ..kernels.bsa_bwd_sm90 import BsaBwdSm90  # noqa: PLC0415

        kernel = BsaBwdSm90(*args, pack_gqa=cfg.pack_gqa, causal=cfg.causal,
                            dq_tile=cfg.dq_tile)
    else:
        from ..kernels.bsa_bwd_sm80 import BsaBwdSm80  # noqa: PLC0415

        kernel = BsaBwdSm80(*args, min_blocks=cfg.min_blocks, vec_red=cfg.vec_red,
                            q_stages=cfg.q_stages)
    kernel(q, k, v, do, lse, delta, offsets, entries, sizes, scale, dq_acc, dk, dv, stream)


@functools.cache
def _bwd_jit():
    """The one ``cute.jit`` of ``_bwd_entry`` (cutlass_call caches on its identity)."""
    import cutlass.cute as cute  # noqa: PLC0415

    return cute.jit(_bwd_entry)


def _grad_shapes(dq_acc_shape, k, v):
    """The backward kernel's first three outputs: the fp32 dQ workspace, dk and dv."""
    return (jax.ShapeDtypeStruct(dq_acc_shape, jnp.float32),
            jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype))


def bsa_bwd(do, q, k, v, out, lse, q2k_block_index, q2k_block_nums, block_sizes, cfg, *,
            dlse=None):
    """Block-sparse attention backward on the CuTe DSL kernels for the op config ``cfg``
    (``cfg.bwd`` set). ``dlse``: optional float32 ``(B, H_q, S_q)`` cotangent of ``lse``
    (enters the row term: ``delta = rowsum(dO * O) - dlse``). Returns ``(dq, dk, dv)`` in
    the layouts and dtypes of q, k, v."""
    from .._cute_call import call_builder  # noqa: PLC0415

    if cfg.batch * cfg.num_heads_q * cfg.seqlen_q == 0 or cfg.seqlen_kv == 0:
        # no query row or no key: zero gradients, nothing to launch (see bsa_fwd)
        return jnp.zeros_like(q), jnp.zeros_like(k), jnp.zeros_like(v)
    spec = _specs(cfg.layout)
    # the list kernel clamps the metadata as _sanitize does, as it reads them
    raw_idx, raw_nums = q2k_block_index, q2k_block_nums
    q2k_block_index, q2k_block_nums, block_sizes = _sanitize(
        q2k_block_index, q2k_block_nums, block_sizes, cfg)
    if cfg.bwd.deterministic:
        # the compile keys carry the dQ accumulators chosen for this call
        cfg = dataclasses.replace(cfg, bwd=dataclasses.replace(cfg.bwd,
                                                               det_slots=det_slots_of(cfg)))
    ocfg = None
    if cfg.bwd.deterministic:
        ocfg = _det_order_or_warn(cfg)
        if cfg.bwd.det_stream and ocfg is None:
            # the schedule order does not run this call: nothing to stream
            cfg = dataclasses.replace(cfg, bwd=dataclasses.replace(cfg.bwd, det_stream=False))
        if cfg.bwd.det_stream and cfg.bwd.det_store:
            # the streamed calls take the zeroed workspace
            cfg = dataclasses.replace(cfg, bwd=dataclasses.replace(cfg.bwd, det_store=False))
        if (cfg.bwd.det_stream and cfg.bwd.det_overlap and dlse is None
                and cfg.pre is not None and cfg.pre.zero_ws
                and _zero_fits(dq_tile_shape(cfg) if cfg.bwd.dq_tile
                               else out.shape[:-1] + (cfg.head_dim,))
                and do.dtype == out.dtype == q.dtype):
            return _bsa_bwd_det_stream(q, k, v, do, lse, None, None, q2k_block_index,
                                       q2k_block_nums, block_sizes, cfg, spec, ocfg, out=out)
    zero_elems = 0
    if cfg.bwd.zero_lag:
        # the preprocessing zeroes the first zero_lag (batch, KV head) pairs' workspace, the
        # backward's writer warps the others' (whose int32 element counts a pair's must fit)
        ws = dq_tile_shape(cfg)
        pair_elems = cfg.num_heads_q // cfg.num_heads_kv * ws[2] * ws[3]
        if pair_elems < 2**31:
            zero_elems = min(cfg.bwd.zero_lag, cfg.batch * cfg.num_heads_kv) * pair_elems
        else:
            cfg = dataclasses.replace(cfg, bwd=dataclasses.replace(cfg.bwd, zero_lag=0))
    delta, dq_acc = bsa_preprocess(do, out, cfg,
                                   with_ws=not (cfg.bwd.det_store or cfg.bwd.dq_claim),
                                   zero_elems=zero_elems)
    if dlse is not None:
        delta = delta - dlse.astype(jnp.float32)
    if cfg.bwd.impl == "sm90ws" and cfg.bwd.ws_ld_scaled:
        # the kernel's P^T and dS^T take lse in the log2 domain and delta times the scale
        delta = delta * jnp.float32(cfg.softmax_scale)
        lse = lse * jnp.float32(math.log2(math.e))
    if cfg.bwd.deterministic:
        return _bsa_bwd_deterministic(q, k, v, do, lse, delta, dq_acc, q2k_block_index,
                                      q2k_block_nums, block_sizes, cfg, spec, ocfg)
    # the kernel's lists read the raw metadata (it clamps them itself), XLA's the clamped ones
    kq_kernel = (cfg.kq_kernel and cfg.bwd.impl in ("sm90", "sm90ws")
                 and kq_config(q2k_block_index.shape, cfg.num_heads_kv,
                               cfg.num_kv_blocks) is not None)
    # with the bucket split, the work items of the split lists follow the offsets (their
    # own order)
    buckets = cfg.bwd.impl == "sm90ws" and cfg.bwd.ws_buckets
    offsets, entries = kq_lists(*((raw_idx, raw_nums) if kq_kernel
                                  else (q2k_block_index, q2k_block_nums)),
                                num_kv_heads=cfg.num_heads_kv, num_kv_blocks=cfg.num_kv_blocks,
                                kernel=kq_kernel, cute_call_mode=cfg.cute_call,
                                sanitized=not kq_kernel,
                                bucket_entries=(_bucket_entries(cfg, q2k_block_index)
                                                if buckets else 0),
                                max_extra=_bucket_extra(cfg, q2k_block_index) if buckets else 0,
                                kernel_items=cfg.kq_items)
    if cfg.bwd.impl == "sm90ws" and cfg.bwd.ws_lpt:
        # the sm90ws kernel reads its CTA order (longest K->Q list first) after the offsets
        order = metadata.kq_lpt_order(offsets, chain=cfg.num_kv_blocks if cfg.bwd.ws_lpt_chain
                                      else None)
        offsets = jnp.concatenate([offsets, order])
    ws_spec = None if cfg.bwd.dq_tile else spec  # the query-tile workspace is row-major
    if cfg.bwd.dq_claim:
        sem0 = _det_semaphores(cfg)
        call = _stored_ws_call(_bwd_claim_jit(), "bsa_bwd_claim", cfg, spec, k, v, sem0, 10)
        dq_acc, dk, dv, dq_sem = call(q, k, v, do, lse, delta, offsets, entries, block_sizes,
                                      _scale_array(cfg.softmax_scale), sem0)
        return _dq_out(dq_acc, q, cfg, spec, dq_sem), dk, dv
    if cfg.bwd.zero_lag or cfg.bwd.tail_conv:
        return _bsa_bwd_counted(q, k, v, do, lse, delta, offsets, entries, block_sizes, dq_acc,
                                cfg, spec, q2k=(q2k_block_index, q2k_block_nums))
    # flattened inputs: block_sizes may be None (absent, no buffer); dq_acc is the last
    n_in = 10 + (block_sizes is not None)
    call = call_builder(cfg.cute_call)(
        _bwd_jit(),
        output_shape_dtype=(
            *_grad_shapes(dq_acc.shape, k, v),
        ),
        input_spec=(spec, spec, spec, spec, None, None, None, None, None, None, ws_spec),
        output_spec=(ws_spec, spec, spec),
        input_output_aliases={10: 0},
        compile_key=("bsa_bwd", cfg.bwd),
        cfg=cfg.bwd,
        static_last_inputs=(0, 1, 2, 3, n_in - 1),
        static_last_outputs=(0, 1, 2),
    )
    dq_acc, dk, dv = call(q, k, v, do, lse, delta, offsets, entries, block_sizes,
                          _scale_array(cfg.softmax_scale), dq_acc)
    return _dq_out(dq_acc, q, cfg, spec), dk, dv


def _det_order_lists(q2k_block_index, q2k_block_nums, cfg, ocfg):
    """The K->Q lists ``(offsets, entries)`` that the schedule-order kernel ``ocfg`` orders
    (sanitized metadata): with ``ocfg.fast`` from the lists kernel where it takes the call,
    as in the default mode (the lists of build_kq_csr's bitmap construction: an id
    repeated in a row listed once), else build_kq_csr's."""
    if ocfg.fast:
        return kq_lists(q2k_block_index, q2k_block_nums, num_kv_heads=cfg.num_heads_kv,
                        num_kv_blocks=cfg.num_kv_blocks, kernel=cfg.kq_kernel,
                        cute_call_mode=cfg.cute_call, sanitized=True)
    return metadata.build_kq_csr(q2k_block_index, q2k_block_nums,
                                 num_kv_heads=cfg.num_heads_kv,
                                 num_kv_blocks=cfg.num_kv_blocks)


def _bsa_bwd_deterministic(q, k, v, do, lse, delta, dq_acc, q2k_block_index, q2k_block_nums,
                           block_sizes, cfg, spec, ocfg):
    """:func:`bsa_bwd`'s kernel call in deterministic mode: the K->Q lists with each entry's
    rank in its query row, and one zeroed int32 semaphore per 64-row query tile and dQ
    accumulator (``cfg.bwd.det_slots``); ``ocfg``: the schedule-order kernel's configuration
    (None: the launch-group order). With ``cfg.bwd.det_stream``: :func:`_bsa_bwd_det_stream`."""
    from .._cute_call import call_builder  # noqa: PLC0415

    if cfg.bwd.det_stream:
        return _bsa_bwd_det_stream(q, k, v, do, lse, delta, dq_acc, q2k_block_index,
                                   q2k_block_nums, block_sizes, cfg, spec, ocfg)
    if ocfg is not None:
        offsets, entries = _det_order_lists(q2k_block_index, q2k_block_nums, cfg, ocfg)
        entries, ranks = det_schedule_order(offsets, entries, ocfg, cfg.bwd.held_ctas,
                                            cfg.cute_call)
    else:
        offsets, entries, ranks = metadata.build_kq_csr(
            q2k_block_index, q2k_block_nums, num_kv_heads=cfg.num_heads_kv,
            num_kv_blocks=cfg.num_kv_blocks, with_ranks=True, rank_group=cfg.bwd.det_group)
    ws_spec = None if cfg.bwd.dq_tile else spec  # the query-tile workspace is row-major
    sem0 = _det_semaphores(cfg)
    if cfg.bwd.det_store:
        # the workspace is an output of the call (not zeroed): the first contribution to
        # each accumulator tile stores it
        call = _stored_ws_call(_bwd_det_store_jit(), "bsa_bwd_det_store", cfg, spec, k, v,
                               sem0, 11)
        dq_acc, dk, dv, dq_sem = call(q, k, v, do, lse, delta, offsets, entries, ranks,
                                      block_sizes, _scale_array(cfg.softmax_scale), sem0)
        return _dq_out(dq_acc, q, cfg, spec, dq_sem), dk, dv
    n_in = 12 + (block_sizes is not None)  # flattened inputs (block_sizes may be None)
    call = call_builder(cfg.cute_call)(
        _bwd_det_jit(),
        output_shape_dtype=(
            *_grad_shapes(dq_acc.shape, k, v),
            jax.ShapeDtypeStruct(sem0.shape, jnp.int32),
        ),
        input_spec=(spec, spec, spec, spec, None, None, None, None, None, None, None, ws_spec,
                    None),
        output_spec=(ws_spec, spec, spec, None),
        input_output_aliases={11: 0, 12: 3},
        compile_key=("bsa_bwd_det", cfg.bwd),
        cfg=cfg.bwd,
        static_last_inputs=(0, 1, 2, 3, n_in - 2),
        static_last_outputs=(0, 1, 2),
    )
    dq_acc, dk, dv, _ = call(q, k, v, do, lse, delta, offsets, entries, ranks, block_sizes,
                             _scale_array(cfg.softmax_scale), dq_acc, sem0)
    return _dq_out(dq_acc, q, cfg, spec), dk, dv


def _stored_ws_call(jit_fn, name, cfg, spec, k, v, sem0, n_in):
    """The backward's call where the fp32 dQ tile workspace is a plain output (each tile's
    first contribution is stored: ``det_store`` / ``dq_claim``) and the int32 per-tile flags
    ``sem0`` (zeroed) are the input after the ``n_in`` others (q, k, v, do first), aliased to
    output 3; outputs (workspace, dk, dv, flags)."""
    from .._cute_call import call_builder  # noqa: PLC0415

    return call_builder(cfg.cute_call)(
        jit_fn,
        output_shape_dtype=(
            *_grad_shapes(dq_tile_shape(cfg), k, v),
            jax.ShapeDtypeStruct(sem0.shape, jnp.int32),
        ),
        input_spec=(spec,) * 4 + (None,) * (n_in - 4 + 1),
        output_spec=(None, spec, spec, None),
        input_output_aliases={n_in: 3},
        compile_key=(name, cfg.bwd),
        cfg=cfg.bwd,
        static_last_inputs=(0, 1, 2, 3),
        static_last_outputs=(0, 1, 2),
    )


def _bwd_counted_entry(stream, q, k, v, do, lse, delta, offsets, entries, sizes, scale, count,
                       dq_acc, dk, dv, *, cfg: BsaBwdConfig):
    # zero_lag / tail_conv: the per-(batch, KV head) counters (zeroed by XLA) are aliased to
    # output 3 and the workspace to output 0
    _ws_kernel(cfg)(q, k, v, do, lse, delta, offsets, entries, sizes, scale, dq_acc, dk, dv,
                    stream, mdQSem=count)


def _bwd_fixed_entry(stream, q, k, v, do, lse, delta, offsets, entries, sizes, scale, mult,
                     count, flags, dq_acc, dk, dv, dq, *, cfg: BsaBwdConfig):
    # dq_fixed (with tail_conv): _bwd_counted_dq_entry with the per-row multipliers (fp32
    # (B, H_q, N_t, 64, 2): multiplier, inverse) and the per-tile row flags (int32 (B, H_q,
    # N_t, 2), zeroed by XLA and aliased to output 4) for both kernels
    from ..kernels.dq_tiles import BsaDqFromTiles  # noqa: PLC0415

    kernel = _ws_kernel(cfg)
    if not kernel.dq_fixed:
        raise NotImplementedError("bsa_bwd detfixed: the kernel configuration has no "
                                  "fixed-point dQ path")
    kernel(q, k, v, do, lse, delta, offsets, entries, sizes, scale, dq_acc, dk, dv,
           stream, mdQSem=count, mdQMult=mult, mdQFlags=flags)
    n_kv = (k.shape[1] + cfg.block_size - 1) // cfg.block_size
    BsaDqFromTiles(_cutlass_dtype(cfg.dtype), cfg.head_dim, dq_block_cols(cfg), True, 1,
                   wait_pairs=True, fixed=True)(dq_acc, dq, stream, mDone=count, n_wait=n_kv,
                                                mMult=mult, mFlags=flags)


def _bucket_n_items(cfg, k, offsets) -> int:
    """``buckets``: the work items per (batch, KV head) pair, from the offsets' length."""
    n_pairs = k.shape[0] * k.shape[2]
    n_kv = (k.shape[1] + cfg.block_size - 1) // cfg.block_size
    return (offsets.shape[0] - n_pairs * n_kv - 1) // (6 * n_pairs)


def _pair_counters(count, k):
    """``buckets``: the first ``2 P`` counters of ``count`` (``P`` (batch, KV head) pairs; the
    per-row counters follow), the view the dq reordering takes (it derives ``P`` from the
    length)."""
    import cutlass.cute as cute  # noqa: PLC0415

    return cute.make_tensor(count.iterator, cute.make_layout((2 * k.shape[0] * k.shape[2],)))


def _bwd_bucket_entry(stream, q, k, v, do, lse, delta, offsets, entries, sizes, scale,
                      count, dq_acc, dk, dv, dq, part, *, cfg: BsaBwdConfig):
    # buckets (with tail_conv): _bwd_counted_dq_entry with the work items after the offsets,
    # the per-row counters after the pairs' ones and the fp32 dK / dV partials (a plain
    # output, each slot written before it is read); the reordering waits for each pair's
    # items
    from ..kernels.dq_tiles import BsaDqFromTiles  # noqa: PLC0415

    kernel = _ws_kernel(cfg)
    if not kernel.buckets:
        raise NotImplementedError("bsa_bwd buckets: the kernel configuration has no "
                                  "bucket path")
    n_items = _bucket_n_items(cfg, k, offsets)
    kernel(q, k, v, do, lse, delta, offsets, entries, sizes, scale, dq_acc, dk, dv, stream,
           mdQSem=count, mPart=part, n_items=n_items)
    BsaDqFromTiles(_cutlass_dtype(cfg.dtype), cfg.head_dim, dq_block_cols(cfg), True,
                   cfg.det_slots, wait_pairs=True)(dq_acc, dq, stream,
                                                   mDone=_pair_counters(count, k),
                                                   n_wait=n_items)


def _bwd_fixed_bucket_entry(stream, q, k, v, do, lse, delta, offsets, entries, sizes, scale,
                            mult, count, flags, dq_acc, dk, dv, dq, part, *,
                            cfg: BsaBwdConfig):
    # buckets with the fixed-point dQ: _bwd_fixed_entry as _bwd_bucket_entry does
    from ..kernels.dq_tiles import BsaDqFromTiles  # noqa: PLC0415

    kernel = _ws_kernel(cfg)
    if not kernel.dq_fixed or not kernel.buckets:
        raise NotImplementedError("bsa_bwd detfixed buckets: the kernel configuration has no "
                                  "fixed-point dQ or bucket path")
    n_items = _bucket_n_items(cfg, k, offsets)
    kernel(q, k, v, do, lse, delta, offsets, entries, sizes, scale, dq_acc, dk, dv, stream,
           mdQSem=count, mdQMult=mult, mdQFlags=flags, mPart=part, n_items=n_items)
    BsaDqFromTiles(_cutlass_dtype(cfg.dtype), cfg.head_dim, dq_block_cols(cfg), True, 1,
                   wait_pairs=True, fixed=True)(dq_acc, dq, stream,
                                                mDone=_pair_counters(count, k),
                                                n_wait=n_items, mMult=mult, mFlags=flags)


@functools.cache
def _bwd_bucket_jit(fixed: bool):
    """The one ``cute.jit`` of ``_bwd_bucket_entry`` (``fixed``: ``_bwd_fixed_bucket_entry``)."""
    import cutlass.cute as cute  # noqa: PLC0415

    return cute.jit(_bwd_fixed_bucket_entry if fixed else _bwd_bucket_entry)


@functools.cache
def _bwd_fixed_jit():
    """The one ``cute.jit`` of ``_bwd_fixed_entry``."""
    import cutlass.cute as cute  # noqa: PLC0415

    return cute.jit(_bwd_fixed_entry)


def _pow2_f32(k):
    """``2^k`` as float32, exact, for int32 ``k`` in ``[-126, 127]`` (bits ``(k + 127) << 23``)."""
    return jax.lax.bitcast_convert_type((k.astype(jnp.int32) + 127) << 23, jnp.float32)


def fixed_rows_log2(x, norm: bool, one_pass: bool = False):
    """``(..., S)`` float32 from ``(..., S, D)``: log2 of the largest finite ``|x|`` over the
    last axis or (``norm``) an upper bound of the Euclidean norm of the finite values; -inf
    where none is nonzero.

    The norm takes two passes over ``x``: the largest value ``m``, then the sum of the
    squares scaled by the power of two ``2^-e`` with ``m < 2^e <= 2 m``. ``one_pass``: the largest value and the unscaled float32 sum of squares
    as sibling reductions, one pass. The sum's rounding (relative ``D * 2^-24``) lies within the
    multipliers' one-bit margin, and so do the squares below float32's normal range (flushed
    to zero on the GPU: at most ``D * 2^-126`` in all) where the sum is at least 2^-100;
    where it is smaller or overflows, ``sqrt(D)`` times the largest value bounds the norm."""
    lg = jnp.log2
    a = jnp.abs(x.astype(jnp.float32))
    a = jnp.where(jnp.isfinite(a), a, 0.0)
    m = jnp.max(a, axis=-1)
    if not norm:
        return lg(m)
    if not one_pass:
        # scaled by 2^-e (m < 2^e <= 2 m) in two exact power-of-two factors of at least
        # 2^-64 each: a division by m (a reciprocal below float32's normal range for m >=
        # 2^126, flushed to zero) or one factor 2^-128 would lose the scale
        _, e = jnp.frexp(jnp.where(m > 0, m, 1.0))
        h = e // 2
        sc = a * _pow2_f32(-h)[..., None] * _pow2_f32(h - e)[..., None]
        r = jnp.sum(jnp.square(sc), axis=-1)
        return jnp.where(m > 0, e.astype(jnp.float32) + 0.5 * lg(r), -jnp.inf)
    d = a.shape[-1]
    ss = jnp.sum(jnp.square(a), axis=-1)
    ok = jnp.isfinite(ss) & (ss >= jnp.float32(2.0**-100))
    one = 0.5 * lg(jnp.where(ok, ss, 1.0))
    big = lg(m) + jnp.float32(0.5 * math.log2(d))
    return jnp.where(m > 0, jnp.where(ok, one, big), -jnp.inf)


def dq_fixed_multipliers(k, v, do, delta, q2k_block_index, q2k_block_nums, block_sizes, cfg,
                         n_tiles: int):
    """Per query row the fixed-point multiplier of ``dq_fixed`` and its inverse: float32
    ``(B, H_q, n_tiles, 64, 2)`` (64-row tiles, rows past S_q included), exact powers of two
    ``2^s`` and ``2^-s``.

    Every contribution of a KV block to dQ row ``i`` of query head ``h``, and every sum of
    such contributions, is bounded elementwise by ``softmax_scale * Kmax * (|dO_i| * Vnorm
    + |delta_i|)`` (``dS = softmax_scale * P (dP - delta)`` with ``0 <= P``, the row's P
    summing to at most 1 with the forward's lse, ``|dP_ij| = |dO_i . V_j| <= |dO_i| |V_j|``
    by Cauchy-Schwarz), with ``|dO_i|`` the Euclidean norm of the row's finite dO values,
    ``Vnorm`` the largest Euclidean norm of a key's finite V values and ``Kmax`` the largest
    finite ``|K|``, both over the valid keys (below the sequence end and the block's
    ``block_sizes`` entry) of the KV blocks the row's query block lists. ``s = 29 - e`` with
    ``2^(e - 1)`` above that bound (one bit of margin for the 16-bit rounding of dS and the
    float32 arithmetic), clamped to ``[-120, 120]``: every contribution times ``2^s`` stays
    within ``2^28``, which leaves the int32 sum room for P's of up to 8 in sum (an lse
    that is not the forward's) before it wraps. Non-finite values do not enter the bound;
    where they reach a contribution the kernel flags its row (NaN in dq). The bound is
    computed in the log2 domain, so no norm overflows float32 (:func:`fixed_rows_log2`)."""
    f32 = jnp.float32
    blk, n_kv = cfg.sparse_block_size, cfg.num_kv_blocks
    b, h_q = cfg.batch, cfg.num_heads_q
    group = h_q // cfg.num_heads_kv
    lg = jnp.log2

    one_pass = bool(getattr(getattr(cfg, "bwd", None), "fix_mult_one_pass", False))

    def rows_log2(x, norm):
        x = x if cfg.layout == "bhsd" else jnp.swapaxes(x, 1, 2)
        return fixed_rows_log2(x, norm, one_pass)

    heads_kv = jnp.arange(h_q) // group
    if block_sizes is not None:
        cnt = jnp.clip(jnp.broadcast_to(block_sizes, (b, h_q, n_kv)), 0, blk).astype(jnp.int32)
    else:
        cnt = jnp.full((b, h_q, n_kv), blk, jnp.int32)

    def keys_max(r):
        # (B, H_q, N_kv): the largest of the per-key values r (B, H_kv, S) over the first cnt
        # keys of each block (-inf where none)
        r = jnp.pad(r, ((0, 0), (0, 0), (0, n_kv * blk - r.shape[-1])),
                    constant_values=-jnp.inf)
        pm = jax.lax.cummax(r.reshape(r.shape[0], r.shape[1], n_kv, blk), axis=3)
        at = jnp.take_along_axis(pm[:, heads_kv], jnp.maximum(cnt - 1, 0)[..., None],
                                 axis=3)[..., 0]
        return jnp.where(cnt > 0, at, -jnp.inf)

    j = jnp.arange(q2k_block_index.shape[-1])
    active = ((j < q2k_block_nums[..., None]) & (q2k_block_index >= 0)
              & (q2k_block_index < n_kv))
    ids = jnp.clip(q2k_block_index, 0, n_kv - 1).astype(jnp.int32)

    def listed_max(per_block):
        got = jnp.take_along_axis(per_block, ids.reshape(b, h_q, -1), axis=2)
        return jnp.max(jnp.where(active, got.reshape(ids.shape), -jnp.inf), axis=-1)

    n_q = q2k_block_index.shape[2]
    rows = n_tiles * 64
    blk_of_row = jnp.minimum(jnp.arange(rows) // blk, n_q - 1)
    lk = listed_max(keys_max(rows_log2(k, False)))[:, :, blk_of_row]  # (B, H_q, rows)
    lv = listed_max(keys_max(rows_log2(v, True)))[:, :, blk_of_row]
    s_q = delta.shape[-1]
    ldo = jnp.pad(rows_log2(do, True), ((0, 0), (0, 0), (0, rows - s_q)),
                  constant_values=-jnp.inf)
    dl = jnp.abs(delta.astype(f32))
    dl = jnp.pad(jnp.where(jnp.isfinite(dl), dl, 0.0), ((0, 0), (0, 0), (0, rows - s_q)))
    # log2 of the bound, each term's logarithm apart: log2(a + c) <= max(log2 a, log2 c) + 1;
    # log2(0) = -inf gives the largest exponent
    lb = lk + jnp.maximum(ldo + lv, lg(dl)) + 1.0 + lg(f32(abs(cfg.softmax_scale)))
    e = jnp.ceil(lb) + 1.0
    s_exp = jnp.clip(29.0 - jnp.where(jnp.isnan(e), 200.0, e), -120.0, 120.0).astype(jnp.int32)

    def pow2(x):
        # exact: the float32 with biased exponent x + 127 and a zero mantissa
        return jax.lax.bitcast_convert_type((x + 127) << 23, f32)

    out = jnp.stack([pow2(s_exp), pow2(-s_exp)], axis=-1)
    return out.reshape(b, h_q, n_tiles, 64, 2)


def _bwd_counted_dq_entry(stream, q, k, v, do, lse, delta, offsets, entries, sizes, scale,
                          count, dq_acc, dk, dv, dq, *, cfg: BsaBwdConfig):
    # tail_conv: the backward, then from the same call the dq reordering as its programmatic
    # dependent (a separate custom call's does not start early under XLA): the reordering's
    # CTAs start once every backward CTA has, each waiting for its pair's count of completed
    # backward CTAs (the backward's KV blocks per pair)
    from ..kernels.dq_tiles import BsaDqFromTiles  # noqa: PLC0415

    _ws_kernel(cfg)(q, k, v, do, lse, delta, offsets, entries, sizes, scale, dq_acc, dk, dv,
                    stream, mdQSem=count)
    n_kv = (k.shape[1] + cfg.block_size - 1) // cfg.block_size
    BsaDqFromTiles(_cutlass_dtype(cfg.dtype), cfg.head_dim, dq_block_cols(cfg), True,
                   cfg.det_slots, wait_pairs=True)(dq_acc, dq, stream, mDone=count,
                                                   n_wait=n_kv)


@functools.cache
def _bwd_counted_jit(with_dq: bool = False):
    """The one ``cute.jit`` of ``_bwd_counted_entry`` (``with_dq``: ``_bwd_counted_dq_entry``)."""
    import cutlass.cute as cute  # noqa: PLC0415

    return cute.jit(_bwd_counted_dq_entry if with_dq else _bwd_counted_entry)


def _bucket_entries(cfg, q2k_block_index) -> int:
    """``buckets``: the most entries of a bucket: ``N`` of ``buckets=N``, or with
    ``autobuckets`` twice a K->Q list's mean length bound (query heads of the group x query
    blocks x ``K_max`` over the KV blocks, rounded up), at least 64."""
    if cfg.bwd.ws_buckets > 0:
        return cfg.bwd.ws_buckets
    group = cfg.num_heads_q // cfg.num_heads_kv
    n_q, k_max = q2k_block_index.shape[2], q2k_block_index.shape[3]
    return max(64, 2 * -(-(group * n_q * k_max) // max(cfg.num_kv_blocks, 1)))


def _bucket_extra(cfg, q2k_block_index) -> int:
    """``buckets``: the extra work items a (batch, KV head) pair may need, from the lists'
    static shape: its entries (query heads of the group x query blocks x K_max) over the
    bucket size; at most ``ws_bucket_extra`` where that is set, and with ``autobuckets``
    (without it) at most what four lists holding every query block of the group need."""
    group = cfg.num_heads_q // cfg.num_heads_kv
    n_q, k_max = q2k_block_index.shape[2], q2k_block_index.shape[3]
    n = _bucket_entries(cfg, q2k_block_index)
    extra = group * n_q * k_max // n
    cap = cfg.bwd.ws_bucket_extra
    if not cap and cfg.bwd.ws_buckets < 0:
        cap = 4 * -(-(group * n_q) // n)
    return min(extra, cap) if cap else extra


def _bucket_buffers(cfg, offsets, count):
    """``buckets``: ``(count, part, n_items)``: the counters with one zeroed int32 per K->Q
    row after them, the fp32 partial workspace ``(2 P E or 1, 2 blk D)`` and the items per
    pair (``E`` extra items per pair, from the offsets' length)."""
    n_rows = cfg.batch * cfg.num_heads_kv * cfg.num_kv_blocks
    n_pairs = cfg.batch * cfg.num_heads_kv
    per_pair = (offsets.shape[0] - n_rows - 1) // (6 * n_pairs)
    extra = per_pair - cfg.num_kv_blocks
    count = jnp.concatenate([count, jnp.zeros((n_rows,), jnp.int32)])
    part = jax.ShapeDtypeStruct((max(2 * n_pairs * extra, 1),
                                 2 * cfg.sparse_block_size * cfg.head_dim), jnp.float32)
    return count, part, per_pair


def _bsa_bwd_counted(q, k, v, do, lse, delta, offsets, entries, block_sizes, dq_acc, cfg,
                     spec, q2k=None):
    """The default backward's call with ``cfg.bwd.zero_lag`` and / or ``tail_conv``: the
    workspace (with ``zero_lag`` zeroed by the preprocessing for the first pairs only) and
    ``2 B H_kv`` zeroed int32 counters (per (batch, KV head) pair: the zeroed shares, then
    the completed CTAs) aliased to outputs; with ``tail_conv`` the call also launches the
    dq reordering (its output dq), which runs while the backward's last wave does. With
    ``cfg.bwd.dq_fixed`` (and tail_conv) :func:`_bsa_bwd_fixed` (``q2k``: the sanitized
    ``(q2k_block_index, q2k_block_nums)``). Returns ``(dq, dk, dv)``."""
    from .._cute_call import call_builder  # noqa: PLC0415

    if cfg.bwd.dq_fixed and cfg.bwd.tail_conv:
        return _bsa_bwd_fixed(q, k, v, do, lse, delta, offsets, entries, block_sizes, dq_acc,
                              cfg, spec, *q2k)

    # ws_persist: one more counter (the persistent grid's work items)
    count = jnp.zeros((2 * cfg.batch * cfg.num_heads_kv + (cfg.bwd.ws_persist > 0),),
                      jnp.int32)
    tail = cfg.bwd.tail_conv
    part = ()
    if cfg.bwd.ws_buckets:
        count, part_shape, _ = _bucket_buffers(cfg, offsets, count)
        part = (part_shape,)
    # positional inputs 10 and 11 (the counters, the workspace) are aliased to outputs 3 and
    # 0; flattened, block_sizes may be None (absent, no buffer) and the workspace is the last
    n_in = 11 + (block_sizes is not None)
    call = call_builder(cfg.cute_call)(
        _bwd_bucket_jit(False) if part else _bwd_counted_jit(tail),
        output_shape_dtype=(*_grad_shapes(dq_acc.shape, k, v),
                            jax.ShapeDtypeStruct(count.shape, jnp.int32),
                            *((jax.ShapeDtypeStruct(q.shape, q.dtype),) if tail else ()),
                            *part),
        input_spec=(spec,) * 4 + (None,) * 8,
        output_spec=(None, spec, spec, None) + ((spec,) if tail else ()) + (None,) * len(part),
        input_output_aliases={11: 0, 10: 3},
        compile_key=("bsa_bwd_counted", cfg.bwd),
        cfg=cfg.bwd,
        static_last_inputs=(0, 1, 2, 3, n_in - 1),
        static_last_outputs=(0, 1, 2) + ((4,) if tail else ()),
    )
    outs = call(q, k, v, do, lse, delta, offsets, entries, block_sizes,
                _scale_array(cfg.softmax_scale), count, dq_acc)
    dq_acc, dk, dv = outs[:3]
    if not tail:
        return _dq_out(dq_acc, q, cfg, spec), dk, dv
    return outs[4], dk, dv


def _bsa_bwd_fixed(q, k, v, do, lse, delta, offsets, entries, block_sizes, dq_acc, cfg, spec,
                   q2k_block_index, q2k_block_nums):
    """The backward's call with fixed-point dQ (``cfg.bwd.dq_fixed``, with ``tail_conv``):
    :func:`_bsa_bwd_counted`'s, plus the per-tile multipliers
    (:func:`dq_fixed_multipliers`) and zeroed int32 row flags (two words per 64-row tile)
    aliased to an output. Returns ``(dq, dk, dv)``."""
    from .._cute_call import call_builder  # noqa: PLC0415

    count = jnp.zeros((2 * cfg.batch * cfg.num_heads_kv + (cfg.bwd.ws_persist > 0),),
                      jnp.int32)
    n_t = dq_acc.shape[2]
    mult = dq_fixed_multipliers(k, v, do, delta, q2k_block_index, q2k_block_nums,
                                block_sizes, cfg, n_t)
    flags = jnp.zeros((cfg.batch, cfg.num_heads_q, n_t, 2), jnp.int32)
    part = ()
    if cfg.bwd.ws_buckets:
        count, part_shape, _ = _bucket_buffers(cfg, offsets, count)
        part = (part_shape,)
    # positional inputs: ..., scale (9), mult (10), count (11), flags (12), workspace (13);
    # count, flags and the workspace aliased to outputs 3, 4 and 0; flattened, block_sizes
    # may be None (absent, no buffer) and the workspace is the last
    n_in = 13 + (block_sizes is not None)
    call = call_builder(cfg.cute_call)(
        _bwd_bucket_jit(True) if part else _bwd_fixed_jit(),
        output_shape_dtype=(*_grad_shapes(dq_acc.shape, k, v),
                            jax.ShapeDtypeStruct(count.shape, jnp.int32),
                            jax.ShapeDtypeStruct(flags.shape, jnp.int32),
                            jax.ShapeDtypeStruct(q.shape, q.dtype), *part),
        input_spec=(spec,) * 4 + (None,) * 10,
        output_spec=(None, spec, spec, None, None, spec) + (None,) * len(part),
        input_output_aliases={13: 0, 11: 3, 12: 4},
        compile_key=("bsa_bwd_fixed", cfg.bwd),
        cfg=cfg.bwd,
        static_last_inputs=(0, 1, 2, 3, n_in - 1),
        static_last_outputs=(0, 1, 2, 5),
    )
    outs = call(q, k, v, do, lse, delta, offsets, entries, block_sizes,
                _scale_array(cfg.softmax_scale), mult, count, flags, dq_acc)
    return outs[5], outs[1], outs[2]


def _det_semaphores(cfg):
    """One zeroed int32 semaphore per 64-row query tile and dQ accumulator."""
    return jnp.zeros((cfg.batch, cfg.num_heads_q,
                      cfg.num_q_blocks * (cfg.sparse_block_size // 64) * cfg.bwd.det_slots),
                     jnp.int32)


def _bsa_bwd_det_stream(q, k, v, do, lse, delta, dq_acc, q2k_block_index, q2k_block_nums,
                        block_sizes, cfg, spec, ocfg, out=None):
    """:func:`_bsa_bwd_deterministic` with ``det_stream``: one call launches the schedule-order
    kernel and the backward (``_bwd_det_stream_entry``); the ordered entries, their ranks
    and the per-row published prefixes are outputs of that call that nothing reads after
    it. With ``out`` (``det_overlap``; ``delta`` and ``dq_acc`` None) the call also launches
    the preprocessing between the two (``_bwd_det_overlap_entry``), and delta is one more
    output."""
    from .._cute_call import call_builder  # noqa: PLC0415

    offsets, entries = _det_order_lists(q2k_block_index, q2k_block_nums, cfg, ocfg)
    # with ocfg.held the order kernel computes the starts and does not read its starts
    # input (given the offsets)
    starts = (offsets if ocfg.held > 0 else
              metadata.kq_schedule_starts(offsets, num_kv_blocks=ocfg.n_kv,
                                          held=cfg.bwd.held_ctas))
    ws_spec = None if cfg.bwd.dq_tile else spec  # the query-tile workspace is row-major
    sem0 = _det_semaphores(cfg)
    progress0 = jnp.zeros((offsets.shape[0] - 1,), jnp.int32)
    n_in = 13 + (block_sizes is not None)  # flattened inputs (block_sizes may be None)
    if out is not None:
        dq_acc, dk, dv = _bsa_bwd_det_overlap_call(q, k, v, do, out, lse, offsets, entries,
                                                   starts, block_sizes, cfg, spec, ocfg, sem0,
                                                   progress0)
        return _dq_out(dq_acc, q, cfg, spec), dk, dv
    sds = jax.ShapeDtypeStruct(entries.shape, jnp.int32)
    call = call_builder(cfg.cute_call)(
        _bwd_det_stream_jit(),
        output_shape_dtype=(
            *_grad_shapes(dq_acc.shape, k, v),
            jax.ShapeDtypeStruct(sem0.shape, jnp.int32),
            jax.ShapeDtypeStruct(progress0.shape, jnp.int32),
            sds, sds,
        ),
        input_spec=(spec, spec, spec, spec, None, None, None, None, None, None, None, ws_spec,
                    None, None),
        output_spec=(ws_spec, spec, spec, None, None, None, None),
        input_output_aliases={11: 0, 12: 3, 13: 4},
        compile_key=("bsa_bwd_det_stream", cfg.bwd, ocfg),
        cfg=cfg.bwd,
        ocfg=ocfg,
        static_last_inputs=(0, 1, 2, 3, n_in - 3),
        static_last_outputs=(0, 1, 2),
    )
    dq_acc, dk, dv, *_ = call(q, k, v, do, lse, delta, offsets, entries, starts, block_sizes,
                              _scale_array(cfg.softmax_scale), dq_acc, sem0, progress0)
    return _dq_out(dq_acc, q, cfg, spec), dk, dv


def _bsa_bwd_det_overlap_call(q, k, v, do, out, lse, offsets, entries, starts, block_sizes, cfg,
                              spec, ocfg, sem0, progress0):
    """The ``det_overlap`` call of :func:`_bsa_bwd_det_stream`: ``(dq_acc, dk, dv)``."""
    from .._cute_call import call_builder  # noqa: PLC0415

    ws_spec = None if cfg.bwd.dq_tile else spec  # the query-tile workspace is row-major
    ws_shape = dq_tile_shape(cfg) if cfg.bwd.dq_tile else out.shape[:-1] + (cfg.head_dim,)
    sds = jax.ShapeDtypeStruct(entries.shape, jnp.int32)
    call = call_builder(cfg.cute_call)(
        _bwd_det_overlap_jit(),
        output_shape_dtype=(
            jax.ShapeDtypeStruct(sem0.shape, jnp.int32),
            jax.ShapeDtypeStruct(progress0.shape, jnp.int32),
            *_grad_shapes(ws_shape, k, v),
            sds, sds,
            jax.ShapeDtypeStruct((cfg.batch, cfg.num_heads_q, cfg.seqlen_q), jnp.float32),
        ),
        input_spec=(spec, spec, spec, spec, spec, None, None, None, None, None, None, None,
                    None),
        output_spec=(None, None, ws_spec, spec, spec, None, None, None),
        input_output_aliases={11: 0, 12: 1},
        compile_key=("bsa_bwd_det_overlap", cfg.bwd, ocfg, cfg.pre),
        cfg=cfg.bwd,
        ocfg=ocfg,
        pcfg=cfg.pre,
        static_last_inputs=(0, 1, 2, 3, 4),
        static_last_outputs=(2, 3, 4),
    )
    _, _, dq_acc, dk, dv, *_ = call(q, k, v, do, out, lse, offsets, entries, starts,
                                    block_sizes, _scale_array(cfg.softmax_scale), sem0,
                                    progress0)
    return dq_acc, dk, dv
