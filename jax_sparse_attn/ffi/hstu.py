"""JAX call adapters for the HSTU CuTe DSL kernels (see docs/design.md).

``hstu_fwd`` / ``hstu_bwd`` take ``jax.Array``s and the op's
:class:`~jax_sparse_attn.config.HSTUConfig`, return ``jax.Array``s, are traceable under
``jax.jit``, contain no ``custom_vjp`` and do no value validation (the public layer in
``jax_sparse_attn/hstu.py`` does). Every kernel launch goes onto XLA's stream through the
call builder of the ``cute_call`` switch (:func:`jax_sparse_attn._cute_call.call_builder`):
by default ``jax_sparse_attn._cute_call.cute_call`` (one CuTe DSL compile per compile key
for every shape, the same FFI call target as ``cutlass_call``), with ``"per_shape"`` plain
``cutlass.jax.cutlass_call``; XLA owns all outputs and workspaces.

Runtime values (never compile keys): ``cu_seqlens_*``, the tile schedules derived from
them, window sizes, ``alpha``, ``1/scaling_seqlen`` travel as small device arrays.
Compile keys are the frozen ``HstuFwdConfig`` / ``HstuBwdConfig`` (dtype, head dims, tile
sizes, warps, forward implementation, has_func and the number of func endpoints) that the
public layer keeps in ``cfg.fwd`` / ``cfg.bwd``.

Kernels (``jax_sparse_attn/kernels``): the default forward is ``hstu_fwd_sm90_ws``
(``sm90ws``: a TMA producer warp and two consumer warpgroups with wgmma, persistent grid of
``num_sms`` CTAs, 128 query rows x 128 keys per tile, 64 keys at D = 256; three consumer
warpgroups and 192 query rows at D <= 64 in bf16 from ``max_seqlen_q`` 2048); ``sm80`` selects the
portable ``hstu_fwd_sm80`` (warp-level ``mma.sync``, cp.async loads; runs on sm_80+ including
the H200). The default backward is ``hstu_bwd_sm90`` (``sm90``: TMA producer warp, two wgmma
consumer warpgroups; D = D_v in {64, 128, 256} without rab), else the portable
``hstu_bwd_sm80``. The switches ``hstu_fwd_impl``, ``hstu_fwd_ws``, ``hstu_fwd_tile``,
``hstu_bwd_impl``, ``hstu_bwd_dq``, ``hstu_bwd_order`` and ``hstu_bwd_tile`` of
:class:`jax_sparse_attn.config.Switches` select the kernels and their variants and override
the tiles; :func:`fwd_config` /
:func:`bwd_config` turn them into the compile keys. Default tiles: sm90ws 128 x 128 (64 keys at
D = 256; ``hstu_fwd_ws`` ``bn=N`` overrides the keys), 12 warps; sm80 forward 128 x 64
(D <= 128; 128 x 128 at D = 32; 64 x 64 at D = 256), 4 warps; sm90 backward 64 query rows
x 128 keys (128 x 128 at D = 64, 64 x 64 at D = 256), 12 warps; sm80 backward 64 x 128, 8
warps (64 x 64 at D = 256). docs/hstu.md has the sm90ws design and its measurements.

Schedules (built in :mod:`jax_sparse_attn.metadata`): the forward's schedule rows are its query
tiles ordered longest-work-first (argsort of the visible key count); the persistent sm90ws grid
walks (row, head) items in that order; the sm80 backward grid is ``(H, S)`` over KV tiles in
canonical order, the sm90 backward's ``(S, H)`` (``hstu_bwd_order="hlpt"``) or
``(H, S)`` (``lpt``) over KV tiles ordered longest work first, or ``(S, H)`` in canonical
order (``seq``); the default ``"auto"`` is ``lpt`` for ``deterministic=True`` at D <= 64
and for a bias shared by the heads (``H_rab = 1 < H``) without ``deterministic``, else
``hlpt``. A pseudo-sequence appended to ``cu_seqlens`` covers rows past
``cu_seqlens[-1]`` so the kernels write zeros there.

Relative attention bias (``rab (B, H_rab, N_k, N_k)``, q's dtype or fp32): a presence flag
``has_rab`` (with ``rab_per_head`` = ``H_rab == H`` and rab's dtype) in both compile keys;
without rab the adapters, kernel arguments and generated code are exactly those of the
kernels without bias (PTX sha256-identical). Both forwards (``RAB_FWD_IMPLS``: ``sm90ws`` and
``sm80``) add the bias to their score tiles, so the selected forward runs with rab too.
Backward: ``drab`` is written directly (rab's dtype, zero-initialised output) when
``H_rab == H``, else added over heads into an fp32 workspace ``(B, 1, N_k, N_k_pad)``
(``N_k_pad`` a multiple of 4: 16-byte aligned rows for the vector reductions) that XLA slices and casts. The backward
with rab runs the sm90 kernel at D = D_v in ``SM90_BWD_RAB_HEAD_DIMS`` (same drab buffers;
its dq tile workspace is zeroed and reordered as without rab), else, or with the
``hstu_bwd_ws`` flag ``rabsm80``, sm80.

Determinism: the forward and dk/dv are deterministic (each output element is written by
exactly one CTA with a fixed summation order). By default dq is accumulated in an fp32
workspace (sm90 ``hstu_bwd_dq="tile"``: bulk reduce-adds into the query-tile workspace;
else ``red.global.add.f32``) from the CTAs of every KV tile that sees the query, so its low
bits depend on scheduling order (run-to-run differences at fp32 rounding level,
before the final cast to q's dtype); so does ``drab`` when ``H_rab = 1`` (per-head ``drab``
is deterministic). The ``deterministic`` flag of the backward key (the public
``deterministic=True``) makes both reproducible: a zero-initialised int32 semaphore per
(query tile slot, head) orders the dq additions of a query tile by ascending KV tile (both
backward kernels; the sm90 schedule then keeps each sequence's KV tiles in ascending launch
order), and with ``H_rab = 1`` drab goes per head into an fp32 ``(B, H, N_k, N_k)``
workspace (direct stores) that XLA sums over heads.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp

from .. import _platform, metadata

__all__ = [
    "SUPPORTED_HEAD_DIMS",
    "HstuFwdConfig",
    "HstuBwdConfig",
    "hstu_kernel_unsupported_reason",
    "hstu_fwd",
    "hstu_bwd",
    "fwd_config",
    "bwd_config",
    "RAB_FWD_IMPLS",
    "SM90_BWD_HEAD_DIMS",
    "bwd_sm90_unsupported_reason",
    "gqa_unsupported_reason",
    "paged_unsupported_reason",
    "hstu_fwd_paged",
    "resolve_kv_splits",
    "MAX_KV_SPLITS",
    "fwd_smem_bytes",
    "bwd_smem_bytes",
    "sm80_fwd_tiles",
    "sm80_bwd_tiles",
]

SUPPORTED_HEAD_DIMS = (32, 64, 128, 256)
#: forward implementations with the relative attention bias (all of them)
RAB_FWD_IMPLS = ("sm90ws", "sm80")


@dataclasses.dataclass(frozen=True)
class _HstuKey:
    """Static kernel properties shared by the forward and backward compile keys."""

    dtype: str
    head_dim: int
    head_dim_v: int
    block_m: int
    block_n: int
    num_warps: int
    has_func: bool
    func_n: int


@dataclasses.dataclass(frozen=True)
class HstuFwdConfig(_HstuKey):
    """Compile key of the HSTU forward: static kernel properties only."""

    # "sm90ws" (warp-specialized: TMA producer warp + 2 or 3 consumer warpgroups, persistent) or
    # "sm80" (mma.sync, portable)
    impl: str
    # sm90ws only (the defaults for sm80): intra-warpgroup GEMM overlap, ping-pong of the
    # consumer warpgroups, Q stages, 16-bit score function, CTAs of the persistent grid
    ws_overlap: bool = True
    ws_pingpong: bool = True
    ws_q_stages: int = 2
    ws_silu16: bool = False
    ws_tanh16: bool = False
    # one Q buffer that O is staged in, the rest of shared memory to K/V stages ("qalias")
    ws_q_alias: bool = False
    # consecutive work items of a CTA chained (next item's first S = QK^T issued with this
    # item's last PV GEMM, the epilogue after it; 2: the epilogue during that S GEMM; 0: off,
    # the default: slower on the H200)
    ws_cross: int = 0
    # the producer issues V tile j after K tile j + 1 ("vlag")
    ws_v_lag: bool = False
    # the V tile's full barrier re-checked before the wait of the PV GEMM ("splitwait")
    ws_split_wait: bool = False
    # the epilogue's O staged with packed pair stores into a row-swizzled tile (default;
    # "noepivec": the element copies of the swizzled layout)
    ws_epi_vec: bool = True
    # query tiles inside their sequence write O by TMA tensor stores (off with "notmao")
    ws_tma_o: bool = True
    # persistent work items walk the schedule rows of one (split, head) after the other
    # ("headouter"; else the heads of a row are consecutive items)
    ws_head_outer: bool = False
    # persistent CTAs take each round of the longest-first items in alternating direction
    # (else, with "roundrobin", in the same direction every round)
    ws_snake: bool = True
    # the CTAs take their items after the first from an atomic counter ("dynamic", the
    # default of ws_options; contiguous K / V without rab only, else the static deal)
    ws_dynamic: bool = False
    # the tile schedule orders the query tiles by sequence chunks of about this many KiB of
    # K / V (all KV heads), longest work first within a chunk (0: over all tiles)
    schedule_chunk_kib: int = 0
    # consumers scale their Q tile by alpha / 2 in shared memory ("qscale"; not with rab)
    ws_q_scale: bool = False
    # consumer warpgroups (64 query rows each; block_m = 64 * ws_num_wg): 3 with "wg3"
    ws_num_wg: int = 2
    # fp16: P converted after the wait of the previous PV GEMM ("plate"; no C7513)
    ws_p_late: bool = False
    # with rab: the producer warp prefetches each KV tile's bias rows into L2 after its
    # K / V loads ("rabpf"; contiguous K / V, not with "vlag" or "cross")
    ws_rab_prefetch: bool = False
    num_sms: int = 0
    # relative attention bias: presence, H_rab == H, rab's dtype name ("" without rab)
    has_rab: bool = False
    rab_per_head: bool = False
    rab_dtype: str = ""
    # sm90ws only: K/V read from a paged cache through a page table (forward-only inference)
    paged: bool = False
    # paged: the kernel clamps the page ids into the cache (the hstu_schedule switch
    # "kernel": no XLA op sanitises the page table) instead of an XLA clip ("xla")
    page_id_clamp: bool = False
    # paged: the producer loads each KV tile's page id one tile ahead (hstu_fwd_ws "pagepf")
    ws_page_prefetch: bool = False
    # sm90ws only: split-KV (the keys of each query tile split over this many work items whose
    # fp32 partial outputs are added in a fixed order; 1 = no split)
    kv_splits: int = 1
    # the target arch (CuTe DSL name) the key was chosen for
    arch: str = ""
    # sm90ws: programmatic dependent launch (Switches.pdl), also of the tile schedule kernel
    pdl: bool = False


@dataclasses.dataclass(frozen=True)
class HstuBwdConfig(_HstuKey):
    """Compile key of the HSTU backward: static kernel properties only."""

    # relative attention bias, as in HstuFwdConfig
    has_rab: bool = False
    rab_per_head: bool = False
    rab_dtype: str = ""
    # "sm80" (mma.sync, every configuration) or "sm90" (warp-specialized wgmma; D = D_v in
    # SM90_BWD_HEAD_DIMS, with rab D = D_v in SM90_BWD_RAB_HEAD_DIMS unless the hstu_bwd_ws
    # flag "rabsm80" is set)
    impl: str = "sm80"
    # the hstu_bwd_impl switch value when the configuration replaced it by sm80 (else "")
    replaced_impl: str = ""
    # sm90: dQ reduced with bulk reduce-adds of shared-memory rows (else red.global.add)
    dq_bulk: bool = False
    # sm90 with red: 16-byte red.global.add.v4.f32 (lane pairs swap halves), else 8-byte .v2
    dq_vec4: bool = False
    # sm90: dQ added per warp with bulk reduce-adds of its accumulator slice in register
    # order (one 4 KB block at D <= 128, two at D = 256, staged in the Q / dO stage) into a
    # (query tile slots, H, block_m * D) workspace (dq_from_tiles reorders it)
    dq_tile: bool = False
    # sm90 launch order of the KV tiles: "hlpt" (longest work first within each head, one
    # head after the other), "lpt" (longest work first over all sequences, the heads of a KV
    # tile slot consecutive) or "seq" (canonical order: the KV tiles of one sequence and
    # head consecutive)
    bwd_order: str = "hlpt"
    # the target arch (CuTe DSL name)
    arch: str = ""
    # sm80: fp32 pairs (dQ, shared d rab) added with red.global.add.v2.f32 (sm_90+), else
    # with two scalar red.global.add.f32 (sm_8x; _platform.vec_red)
    vec_red: bool = True
    # bitwise reproducible dq (ordered additions, semaphore workspace) and drab (per-head
    # workspace when H_rab = 1)
    deterministic: bool = False
    # sm90: programmatic dependent launch (Switches.pdl) of the backward, its tile schedule
    # and dq reordering kernels
    pdl: bool = False
    # sm90, deterministic with dq_tile: the ordering warp issues each query tile's bulk
    # reductions (Switches.det_writer; at D = 256 it also hands the Q / dO stage back)
    det_writer: bool = False
    # sm90, not deterministic, with dq_tile: warp 1 issues every step's bulk reductions of
    # the staged dQ (Switches.dq_writer)
    dq_writer: bool = False
    # sm90 with 64-query tiles (SiLU of S^T during the dP^T GEMM): the Q / dO stage's full
    # barrier re-checked right before the dP^T wait (hstu_bwd_ws "splitwait")
    split_wait: bool = False
    # sm90: dK / dV stored as packed pairs of adjacent columns (off: hstu_bwd_ws "epi16")
    epi_pairs: bool = False
    # sm90, deterministic with det_writer: each query tile's first contribution is stored
    # (bulk copy), so the fp32 dq workspace is not zeroed; tiles nobody covers are zeroed
    # by the reordering kernel from their semaphores (the default; hstu_bwd_ws "detzero": off)
    det_store: bool = False
    # sm90, not deterministic, with dq_tile and the writer warp: each query tile's first
    # claimer stores its dQ, later ones add after its store completed, so the fp32 dq
    # workspace is not zeroed (hstu_bwd_ws "dqclaim"; turns dq_writer on)
    dq_claim: bool = False
    # sm90, not deterministic, with dq_tile at D <= 128: sequences with keys and at most
    # this many queries get their dq written by the backward's last CTA of the (sequence, KV
    # head); the reordering kernel skips them (hstu_bwd_ws "convert=N"; 0: off)
    dq_convert_rows: int = 0
    # sm90: the tile-schedule launch zeroes the fp32 dq workspace (extra CTAs) where the
    # backward needs it zeroed and the schedule kernel runs, instead of an XLA memset
    # between the two launches (off: hstu_bwd_ws "xlazero")
    sched_zero: bool = False
    # sm90 with the hlpt order: the KV tiles of each head ordered by sequence chunks of
    # about this many KiB of Q, dO and fp32 dq rows first, longest work first within a
    # chunk (hstu_bwd_ws "chunk=N"; 0: longest first over the whole head)
    sched_chunk_kib: int = 0
    # sm90 at D = 128: a consumer warpgroup whose keys the mask hides from a whole query
    # tile (or past L_k) skips that step's GEMMs but dQ (hstu_bwd_ws "wgskip")
    wg_skip: bool = False
    # sm90 with dq_tile: the reordering kernel reads the heads last to first (the backward's
    # head-major order walks them first to last; hstu_bwd_ws "revheads")
    dq_rev_heads: bool = False
    # sm90 at D <= 128: dK / dV staged in shared memory (packed pairs) and written in
    # coalesced 16-byte row pieces (off with hstu_bwd_ws "epiregs" or "epi16")
    epi_smem: bool = False
    # sm90: the consumers' shared-memory wgmma operands partitioned with their warpgroup's
    # first thread (uniform descriptors; off: hstu_bwd_ws "thrfrags")
    uniform_frags: bool = True
    # sm90 with the dQ writer warp and the staging tile (D <= 128, not dq_claim): the writer
    # takes each consumer warpgroup's half of the staged tile on its own barriers
    # (hstu_bwd_ws "wghand")
    wg_hand: bool = False
    # sm90 with the dQ staging tile, not deterministic: after its staging stores a consumer
    # tests the next step's Q / dO stage, and the next step skips its wait where the test
    # passed (hstu_bwd_ws "qprobe", opt-in)
    q_probe: bool = False
    # sm90 with rab: steps whose tile lies inside the bias load it and write d rab without
    # clamps or range selects (64-query tiles, D = 128; off: hstu_bwd_ws "norabfast")
    rab_fast: bool = False
    # sm90 with rab: the producer warp prefetches each step's bias rows into L2 when it loads
    # the step's Q / dO (off: hstu_bwd_ws "norabpf"); drab_prefetch: the same for the shared
    # fp32 d rab workspace with H_rab = 1 (hstu_bwd_ws "drabpf", opt-in)
    rab_prefetch: bool = False
    drab_prefetch: bool = False
    # sm90 with rab_fast and H_rab = 1 < H: steps inside the bias add d rab with one scalar
    # red.add per value instead of the 16-byte adds after a lane transpose (off: hstu_bwd_ws
    # "nodrabs")
    drab_scalar: bool = False
    # sm90 with rab prefetches: each step's prefetches issued one step earlier (hstu_bwd_ws
    # "rabpf2"); rab_fast_wide: the fast path at D 64 (128-query tiles) too (hstu_bwd_ws
    # "rabfast64")
    rab_pf_ahead: bool = False
    rab_fast_wide: bool = False


def fwd_smem_bytes(head_dim, head_dim_v, bm, bn) -> int:
    """Dynamic shared memory of the sm80 forward (``hstu_fwd_sm80``: Q, K, V tiles of 16-bit
    elements, each 1024-byte aligned)."""
    return _aligned(bm * max(head_dim, head_dim_v), bn * head_dim, bn * head_dim_v)


def bwd_smem_bytes(head_dim, head_dim_v, bm, bn) -> int:
    """Dynamic shared memory of the sm80 backward (``hstu_bwd_sm80``: K, V; Q and dO double
    buffered; P and dS)."""
    return _aligned(bn * head_dim, bn * head_dim_v, 2 * bm * head_dim, 2 * bm * head_dim_v,
                    bm * bn, bm * bn)


def _aligned(*elems) -> int:
    return sum(-(-2 * n // 1024) * 1024 for n in elems)


#: sm80 forward tiles (block_m, block_n, num_warps) by largest head dim, best first
_SM80_FWD_TILES = {32: ((128, 128, 4),), 64: ((128, 64, 4),), 128: ((128, 64, 4),),
                   256: ((64, 64, 4),)}
#: sm80 backward tiles, best first: 64 query rows x 128 keys (8 warps: dK/dV of 128 keys in
#: registers for D <= 128), 64 keys at D = 256 (register budget); the 32-row tiles are for
#: GPUs with less shared memory per block (2 warps along the rows)
_SM80_BWD_TILES = {32: ((64, 128, 8),), 64: ((64, 128, 8),),
                   128: ((64, 128, 8), (32, 64, 4)), 256: ((64, 64, 8), (32, 64, 8))}


def _copy_rows(num_threads, cols):
    return num_threads // ((64 if cols % 64 == 0 else 32) // 8)


def _fwd_tile_ok(d, dv, bm, bn, w) -> bool:
    return w in (2, 4, 8) and bm % (16 * w) == 0 and bn % 16 == 0


def _bwd_tile_ok(d, dv, bm, bn, w) -> bool:
    """The divisibility rules of ``hstu_bwd_sm80``'s (wm, wn) warp grid and 128-bit copies."""
    if bm % 16 or w not in (2, 4, 8):
        return False
    wm = min(4, bm // 16)
    if wm == 0 or w % wm:
        return False
    wn = w // wm
    rows_ok = all(r % _copy_rows(32 * w, c) == 0 for r in (bm, bn) for c in (d, dv))
    return (rows_ok and bm % (16 * wm) == 0 and bn % (16 * wm) == 0 and bn % (16 * wn) == 0
            and all(x % (16 * wn) == 0 for x in (d, dv, min(d, 128))))


def sm80_fwd_tiles(head_dim, head_dim_v, limit) -> tuple | None:
    """The sm80 forward's tiles for the head dims within ``limit`` bytes of shared memory
    per block, None if none fits."""
    for t in _SM80_FWD_TILES[max(head_dim, head_dim_v)]:
        if fwd_smem_bytes(head_dim, head_dim_v, t[0], t[1]) <= limit:
            return t
    return None


def sm80_bwd_tiles(head_dim, head_dim_v, limit) -> tuple | None:
    """The sm80 backward's tiles for the head dims within ``limit`` bytes, None if none fits."""
    for t in _SM80_BWD_TILES[max(head_dim, head_dim_v)]:
        if (bwd_smem_bytes(head_dim, head_dim_v, t[0], t[1]) <= limit
                and _bwd_tile_ok(head_dim, head_dim_v, *t)):
            return t
    return None


def _kb(n):
    return f"{n / 1024:g} KiB"


def smem_unsupported_reason(head_dim, head_dim_v, passes=("fwd", "bwd"), switches=None):
    """``None`` when the portable kernels of ``passes`` have tiles that fit the target's
    shared memory per block, else why not (naming the GPU, the need and the limit)."""
    limit = _platform.smem_limit(switches=switches)
    for pas, name, tiles, need in (
            ("fwd", "forward", sm80_fwd_tiles, fwd_smem_bytes),
            ("bwd", "backward", sm80_bwd_tiles, bwd_smem_bytes)):
        if pas not in passes or tiles(head_dim, head_dim_v, limit) is not None:
            continue
        smallest = min(need(head_dim, head_dim_v, t[0], t[1])
                       for t in (_SM80_FWD_TILES if name == "forward" else _SM80_BWD_TILES)[
                           max(head_dim, head_dim_v)])
        return (f"the portable (mma.sync) HSTU {name} at head_dim={head_dim}, "
                f"head_dim_v={head_dim_v} (padded) needs {_kb(smallest)} of shared memory per "
                f"block; {_platform.smem_limit_text(switches)}")
    return None


def hstu_kernel_unsupported_reason(*, dtype, head_dim, head_dim_v, passes=("fwd", "bwd"),
                                   switches=None) -> str | None:
    """``None`` if the CuTe DSL HSTU kernels handle this static configuration for the
    ``passes`` the call may run on the target GPU, else why not."""
    dt = jnp.dtype(dtype)
    if dt not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        return f"the HSTU kernels support float16 and bfloat16, got {dt}"
    for name, d in (("head_dim", head_dim), ("head_dim_v", head_dim_v)):
        if d not in SUPPORTED_HEAD_DIMS:
            return f"{name}={d} is not one of {SUPPORTED_HEAD_DIMS} (pad it first)"
    # the Hopper kernels of the default impls fall back to sm80 where they do not apply, so
    # every call needs the sm80 kernels' shared memory to fit, whatever the family
    return smem_unsupported_reason(head_dim, head_dim_v, passes, switches)


def _cutlass_dtype_name(dtype) -> str:
    return "bfloat16" if jnp.dtype(dtype) == jnp.dtype(jnp.bfloat16) else "float16"


def _sm80_tile(pass_name, head_dim, head_dim_v, switches, arch):
    """``(block_m, block_n, num_warps)`` of the sm80 forward / backward: the switch's override
    or the best tiles that fit the target's shared memory per block (``_SM80_FWD_TILES`` /
    ``_SM80_BWD_TILES``); NotImplementedError where none fits, ValueError (naming the switch)
    for an override that breaks the kernel's tile constraints."""
    fwd = pass_name == "forward"
    limit = _platform.smem_limit(arch, switches)
    tile = (switches.hstu_fwd_tile if fwd else switches.hstu_bwd_tile) or (
        sm80_fwd_tiles if fwd else sm80_bwd_tiles)(head_dim, head_dim_v, limit)
    if tile is None:
        raise NotImplementedError(smem_unsupported_reason(
            head_dim, head_dim_v, ("fwd",) if fwd else ("bwd",), switches))
    bm, bn, w = tile
    smem = (fwd_smem_bytes if fwd else bwd_smem_bytes)(head_dim, head_dim_v, bm, bn)
    ok = (_fwd_tile_ok if fwd else _bwd_tile_ok)(head_dim, head_dim_v, bm, bn, w)
    if ok and smem <= limit:
        return tile
    rule = ("num_warps in (2, 4, 8), block_m a multiple of 16 * num_warps, block_n a "
            "multiple of 16" if fwd else
            "num_warps in (2, 4, 8) with wm = min(4, block_m / 16) warps along the rows "
            "dividing it, block_m and block_n multiples of 16 * wm and of 16 * num_warps / wm "
            "(so are the head dims)")
    switch = "FWD" if fwd else "BWD"
    raise ValueError(f"JAX_SPARSE_ATTN_HSTU_{switch}_TILE / Switches.hstu_{switch.lower()}_tile="
                     f"{(bm, bn, w)} does not fit the sm80 {pass_name} at D={head_dim}, "
                     f"D_v={head_dim_v}: allowed are {rule}, needing {smem} of at most {limit} "
                     f"bytes of shared memory ({_platform.gpu_name()})")


def fwd_config(dtype, head_dim, head_dim_v, func_n, switches, *, has_rab=False,
               rab_per_head=False, rab_dtype="", paged=False, kv_splits=1,
               max_seqlen_q=0) -> HstuFwdConfig:
    """The forward compile key for padded head dims, ``func_n`` endpoint rows (0: no func)
    and the :class:`~jax_sparse_attn.config.Switches`; ``has_rab`` (with ``rab_per_head``
    and rab's dtype name) adds the relative attention bias to the selected forward;
    ``paged`` selects the paged-KV variant of the sm90ws forward
    (:func:`paged_unsupported_reason` says when it exists); ``kv_splits`` (resolved, see
    :func:`resolve_kv_splits`) splits the keys of the sm90ws forward (the sm80 forward
    ignores it); ``max_seqlen_q`` (the call's static bound, 0: unknown) picks the sm90ws
    forward's query tile at head dims up to 64 without split keys
    (:data:`WS_WG3_MIN_SEQLEN_Q`)."""
    arch = _platform.resolved_arch()
    impl = switches.hstu_fwd_impl
    if _platform.kernel_family(switches, arch) == "portable":
        impl = "sm80"
    rab = dict(has_rab=bool(has_rab), rab_per_head=bool(has_rab and rab_per_head),
               rab_dtype=rab_dtype if has_rab else "")
    if paged:
        reason = paged_unsupported_reason(head_dim, head_dim_v, switches)
        if reason is not None:
            raise NotImplementedError(reason)
        # the paged forward deals statically in the schedule's longest-first order and
        # multiplies each score by alpha / 2 (no qscale)
        return _ws_tma_o_applied(dataclasses.replace(
            _ws_config(dtype, head_dim, head_dim_v, 0, switches, rab, arch), paged=True,
            ws_dynamic=False, schedule_chunk_kib=0, ws_q_scale=False, ws_num_wg=2,
            block_m=128, num_warps=12,
            kv_splits=int(kv_splits), page_id_clamp=switches.hstu_schedule == "kernel",
            ws_page_prefetch=ws_options(switches.hstu_fwd_ws)["page_prefetch"]))
    if impl == "sm90ws":
        return _ws_tma_o_applied(dataclasses.replace(
            _ws_config(dtype, head_dim, head_dim_v, func_n, switches, rab, arch,
                       max_seqlen_q if int(kv_splits) == 1 else 0),
            kv_splits=int(kv_splits)))
    bm, bn, w = _sm80_tile("forward", head_dim, head_dim_v, switches, arch)
    return HstuFwdConfig(_cutlass_dtype_name(dtype), head_dim, head_dim_v, bm, bn, w,
                         func_n > 0, max(func_n, 1), impl, **rab, arch=arch)


#: default KiB of K / V (all KV heads) per sequence chunk of the sm90ws forward's tile
#: schedule with the dynamic deal: about a third of the H100 / H200 L2 cache (50 MB), so the
#: K / V that the CTAs running at one time read stay in L2 (docs/performance.md)
SCHEDULE_CHUNK_KIB = 16384


def ws_options(opts) -> dict:
    """The sm90ws forward's options from a validated ``Switches.hstu_fwd_ws`` tuple:
    ``overlap`` (intra-warpgroup GEMM overlap), ``pingpong`` (consumer warpgroups issue their
    GEMMs in turns), ``q_stages`` (2: the next tile's Q loads during this tile's mainloop),
    ``silu16`` (score function in packed 16-bit arithmetic), ``tanh16`` (one
    ``tanh.approx.f16x2`` per two scores), ``page_prefetch`` (``pagepf``: the paged-KV
    producer loads each KV tile's page id one tile ahead; other calls ignore it), ``q_alias``
    (``qalias``: one Q buffer that O is staged in, the freed shared memory to K/V stages),
    ``cross`` (1 with ``cross``, 2 with ``crossepi``, else 0: a CTA's consecutive work items
    chained, the next item's first ``S = Q K^T`` issued with this item's last PV GEMM;
    slower on the H200), ``v_lag`` (``vlag``: the producer issues V tile ``j`` after K tile
    ``j + 1``), ``head_outer`` (``headouter``: the persistent CTAs take all schedule rows
    of one head, then the next head, so the K / V read at one time are one head's; else the
    heads of a row are consecutive work items), ``snake`` (each round of the longest-first
    items dealt to the CTAs in alternating direction; off with ``roundrobin``: CTA ``c``
    takes items ``c, c + G, ...``), ``dynamic`` (after its first item each CTA takes the
    next one from a zeroed atomic counter: a greedy deal in the schedule's order; the
    default, off with ``static`` or ``roundrobin``; the kernels with rab or paged K / V and
    ``cross`` / ``headouter`` deal statically), ``q_scale`` (``qscale``: True, each consumer
    warpgroup scales its Q tile by alpha / 2 in shared memory once per item instead of
    multiplying every score; ``noqscale``: False; else None, which the config resolves to
    True at head dims up to 64; never with rab, paged K / V or ``cross``), ``p_late`` (``plate``: fp16's P converted after the wait
    of the previous PV GEMM, so that ptxas does not serialize the wgmmas, C7513; measured no
    faster on the H200), ``split_wait`` (``splitwait``: each consumer warpgroup re-checks the
    V tile's full barrier before it waits for the PV GEMM, which ends a basic block, so that
    ptxas keeps that wait below the next score tile instead of hoisting it above; measured
    within 1 % on the H200), ``epi_vec`` (default; ``noepivec`` off: the epilogue stages O
    with packed 4-byte shared stores into a row-swizzled tile and copies it out in 16-byte
    pieces, as the block-sparse forward does; 4–20 % faster forward on the H200), ``tma_o``
    (default; ``notmao`` or ``noepivec`` off: query tiles that end inside their sequence are
    written by TMA tensor stores the warpgroup does not wait for), ``rab_prefetch``
    (``rabpf``: with rab the producer warp prefetches each KV tile's bias rows into L2 after
    that tile's K / V loads), ``num_wg`` (consumer warpgroups: 3
    with ``wg3`` (192-row query tiles, at head dims up to 64; never with rab, paged K / V or
    ``cross``), 2 with ``wg2``, else None: the config's default), ``bn`` (block_n, 0: the kernel's default for
    the head dims), ``chunk`` (with the dynamic deal: KiB of K / V per sequence chunk of the
    tile schedule, :data:`SCHEDULE_CHUNK_KIB` unless given, 0: one longest-first order over
    all query tiles)."""
    bn = [int(o[3:]) for o in opts if o.startswith("bn=")]
    chunk = [int(o[6:]) for o in opts if o.startswith("chunk=")]
    dynamic = "static" not in opts and "roundrobin" not in opts
    return {"overlap": "nooverlap" not in opts, "pingpong": "nopingpong" not in opts,
            "q_stages": 1 if "q1" in opts else 2, "silu16": "silu16" in opts,
            "tanh16": "tanh16" in opts, "page_prefetch": "pagepf" in opts,
            "q_alias": "qalias" in opts,
            "cross": 2 if "crossepi" in opts else 1 if "cross" in opts else 0,
            "v_lag": "vlag" in opts, "head_outer": "headouter" in opts,
            "snake": "roundrobin" not in opts, "dynamic": dynamic, "q_scale": True if "qscale" in opts else False if "noqscale" in opts else None,
            "num_wg": 3 if "wg3" in opts else 2 if "wg2" in opts else None,
            "p_late": "plate" in opts, "split_wait": "splitwait" in opts,
            "epi_vec": "noepivec" not in opts,
            "tma_o": "notmao" not in opts and "noepivec" not in opts,
            "rab_prefetch": "rabpf" in opts,
            "bn": bn[0] if bn else 0,
            "chunk": (chunk[0] if chunk else SCHEDULE_CHUNK_KIB) if dynamic else 0}


#: the sm90ws forward runs three consumer warpgroups (192-row query tiles) where it can (head
#: dims up to 64, no rab / paged K / V / chained items) when ``max_seqlen_q`` is at least
#: this, without a func mask, unless ``wg2`` / ``wg3`` says otherwise: faster from L = 2048 on the H200, slower at
#: L <= 1024, where the 192-row tiles leave more rows idle and make fewer work items
#: (docs/performance.md)
WS_WG3_MIN_SEQLEN_Q = 2048

#: the largest block_n of the sm90ws forward with three consumer warpgroups
WS_WG3_MAX_BLOCK_N = 128


def ws_default_block_n(head_dim, head_dim_v) -> int:
    """The sm90ws forward's block_n (keys per tile) unless ``bn=N`` sets it: 128 up to
    D = 128, 64 above (shared memory)."""
    return 128 if max(head_dim, head_dim_v) <= 128 else 64


def _ws_config(dtype, head_dim, head_dim_v, func_n, switches, rab, arch,
               max_seqlen_q=0) -> HstuFwdConfig:
    """The warp-specialized forward: 64 query rows per consumer warpgroup (2: 128 rows, 384
    threads; 3: 192 rows, 512 threads) x ``bn`` keys. ``switches.hstu_fwd_ws`` (tuning /
    ablation only; see :func:`ws_options`) turns off the intra-warpgroup GEMM overlap or the
    ping-pong of the consumer warpgroups, single-buffers Q, computes the score function in
    packed 16-bit arithmetic, sets ``bn`` or the number of consumer warpgroups.
    ``max_seqlen_q``: the call's static bound (0: unknown), which picks three consumer
    warpgroups by default (:data:`WS_WG3_MIN_SEQLEN_Q`)."""
    if switches.hstu_fwd_tile is not None:
        raise ValueError(
            f"JAX_SPARSE_ATTN_HSTU_FWD_TILE / Switches.hstu_fwd_tile={switches.hstu_fwd_tile} "
            "applies to the sm80 forward only; the sm90ws forward takes its block_n from "
            "JAX_SPARSE_ATTN_HSTU_WS / Switches.hstu_fwd_ws 'bn=N'")
    opts = ws_options(switches.hstu_fwd_ws)
    bn = opts["bn"] or ws_default_block_n(head_dim, head_dim_v)
    # three consumer warpgroups fit their registers (160 per thread) at D <= 64 and
    # block_n <= 128 only; by default not with a func mask (its mask state spills a few
    # registers at 160); faster in both 16-bit types from L = 2048 (measured)
    if opts["num_wg"] == 3 and bn > WS_WG3_MAX_BLOCK_N:
        raise ValueError(
            f"JAX_SPARSE_ATTN_HSTU_WS / Switches.hstu_fwd_ws 'wg3' with bn={bn}: three consumer "
            f"warpgroups take block_n <= {WS_WG3_MAX_BLOCK_N} (their 160 registers per thread "
            "hold no larger score tile)")
    wg3 = (opts["num_wg"] == 3 if opts["num_wg"] is not None
           else max_seqlen_q >= WS_WG3_MIN_SEQLEN_Q and func_n == 0
           and bn <= WS_WG3_MAX_BLOCK_N)
    num_wg = (3 if wg3 and max(head_dim, head_dim_v) <= 64 and not rab["has_rab"]
              and not opts["cross"] else 2)
    # Q scaled once per item instead of every score: at D <= 64 the score function, not the
    # GEMMs, bounds the tile (docs/performance.md); by default bf16 only (fp16's narrower
    # exponent range would overflow or lose precision in q * alpha / 2 for large or tiny
    # alpha, where the fp32 multiply of each score does not)
    q_scale = (opts["q_scale"] if opts["q_scale"] is not None
               else max(head_dim, head_dim_v) <= 64 and _cutlass_dtype_name(dtype) == "bfloat16")
    if opts["bn"]:
        from ..kernels.hstu_fwd_sm90_ws import ws_smem_plan  # noqa: PLC0415

        try:
            ws_smem_plan(head_dim, head_dim_v, bn, q_stages=opts["q_stages"],
                         q_alias=opts["q_alias"], num_wg=num_wg)
        except ValueError:
            raise ValueError(
                f"JAX_SPARSE_ATTN_HSTU_WS / Switches.hstu_fwd_ws bn={bn} does not fit the "
                f"sm90ws forward's shared memory at D={head_dim}, D_v={head_dim_v}") from None
    return HstuFwdConfig(_cutlass_dtype_name(dtype), head_dim, head_dim_v, 64 * num_wg, bn,
                         4 * (1 + num_wg), func_n > 0, max(func_n, 1), "sm90ws",
                         ws_overlap=opts["overlap"], ws_pingpong=opts["pingpong"],
                         ws_q_stages=opts["q_stages"], ws_silu16=opts["silu16"],
                         ws_tanh16=opts["tanh16"], ws_q_alias=opts["q_alias"],
                         ws_cross=opts["cross"], ws_v_lag=opts["v_lag"],
                         ws_split_wait=opts["split_wait"], ws_epi_vec=opts["epi_vec"],
                         ws_tma_o=opts["tma_o"], ws_head_outer=opts["head_outer"], ws_snake=opts["snake"],
                         ws_dynamic=opts["dynamic"], schedule_chunk_kib=opts["chunk"],
                         ws_q_scale=q_scale and not rab["has_rab"] and not opts["cross"],
                         ws_rab_prefetch=(opts["rab_prefetch"] and rab["has_rab"]
                                          and not opts["v_lag"] and not opts["cross"]),
                         ws_num_wg=num_wg,
                         ws_p_late=(opts["p_late"] and _cutlass_dtype_name(dtype) == "float16"
                                     and not opts["silu16"]),
                         num_sms=metadata.num_sms(), **rab, arch=arch,
                         pdl=bool(getattr(switches, "pdl", False)))


def _ws_tma_o_applied(cfg):
    """``cfg`` with ``ws_tma_o`` only where the kernel writes O by TMA stores (as
    ``HstuFwdSm90Ws`` decides: no split-KV, O not staged in the Q buffer, ``D_v`` a multiple
    of 64, the pair-store epilogue), so that a switch that changes nothing in the kernel
    gives the same compile key."""
    if not cfg.ws_tma_o:
        return cfg
    try:
        from ..kernels.attn_fwd_sm90_ws import SMEM_LIMIT, smem_plan  # noqa: PLC0415
    except ImportError:  # no CuTe DSL: no kernel to compile either
        return cfg
    o_alias_q = smem_plan(cfg.head_dim, cfg.head_dim_v, 64 * cfg.ws_num_wg, cfg.block_n,
                          SMEM_LIMIT, 4, cfg.ws_q_stages, alias_first=cfg.ws_q_alias)[2]
    on = (cfg.kv_splits == 1 and not o_alias_q and cfg.ws_epi_vec
          and cfg.head_dim_v % 64 == 0)
    return cfg if on else dataclasses.replace(cfg, ws_tma_o=False)


#: head dims (D = D_v) of the sm90 backward; other head dims, D != D_v and rab at other head
#: dims than SM90_BWD_RAB_HEAD_DIMS (or with the hstu_bwd_ws flag "rabsm80") run sm80
SM90_BWD_HEAD_DIMS = (64, 128, 256)


#: head dims (D = D_v) of the sm90 backward with a relative attention bias
SM90_BWD_RAB_HEAD_DIMS = (64, 128)


def bwd_sm90_unsupported_reason(head_dim, head_dim_v, has_rab, rab_sm80=False) -> str | None:
    """``None`` if the sm90 backward takes this static configuration, else why it runs sm80.
    ``rab_sm80``: the hstu_bwd_ws flag "rabsm80" (calls with rab run the sm80 backward)."""
    if has_rab and rab_sm80:
        return ("the hstu_bwd_ws flag 'rabsm80' (JAX_SPARSE_ATTN_HSTU_BWD_WS) runs calls with "
                "a relative attention bias on the sm80 backward")
    if has_rab and not (head_dim == head_dim_v and head_dim in SM90_BWD_RAB_HEAD_DIMS):
        return (f"the sm90 backward with a relative attention bias takes head_dim = head_dim_v "
                f"in {SM90_BWD_RAB_HEAD_DIMS}, got {head_dim}, {head_dim_v} (padded)")
    if head_dim != head_dim_v or head_dim not in SM90_BWD_HEAD_DIMS:
        return (f"the sm90 backward takes head_dim = head_dim_v in {SM90_BWD_HEAD_DIMS}, got "
                f"{head_dim}, {head_dim_v} (padded)")
    return None


#: most key splits of the split-KV forward
MAX_KV_SPLITS = 16
#: keys per split below which "auto" does not split (one split streams >= 4 KV tiles)
_MIN_KEYS_PER_SPLIT = 512


def resolve_kv_splits(kv_splits, *, batch, num_heads, max_seqlen_q, max_seqlen_k,
                      impl="sm90ws") -> int:
    """The number of key splits of the sm90ws forward for the ``kv_splits`` option (an int
    >= 1, or ``"auto"``) and the call's static sizes. ``"auto"`` splits only when the work
    items (query tiles x heads, from ``batch``, ``max_seqlen_q`` and ``num_heads``) fill less
    than one wave of the persistent grid (one CTA per SM): it takes the most splits that keep
    one wave (``num_sms // items``), at most :data:`MAX_KV_SPLITS` and at most one per
    512 keys of ``max_seqlen_k``. Other forwards: 1."""
    if impl != "sm90ws":
        return 1
    if kv_splits != "auto":
        return int(kv_splits)
    items = max(1, batch * max(1, -(-max_seqlen_q // 128)) * num_heads)
    splits = min(metadata.num_sms() // items, MAX_KV_SPLITS,
                 max_seqlen_k // _MIN_KEYS_PER_SPLIT)
    return max(1, splits)


def _add_splits(partials, dtype):
    """Sum of the split-KV partial outputs ``(S, ...)`` fp32 in split order, cast."""
    acc = partials[0]
    for s in range(1, partials.shape[0]):
        acc = acc + partials[s]
    return acc.astype(dtype)


def paged_unsupported_reason(head_dim, head_dim_v, switches) -> str | None:
    """``None`` if the paged-KV forward kernel takes these padded head dims and
    :class:`~jax_sparse_attn.config.Switches`, else why not: it is the sm90ws forward with
    the K / V tiles loaded page by page (``block_n`` must divide the page size, 128)."""
    if _platform.kernel_family(switches) == "portable":
        return ("the paged-KV forward is a variant of the sm90ws forward, which needs sm_90a "
                "and the kernel_family switch 'auto'")
    if switches.hstu_fwd_impl != "sm90ws":
        return (f"the paged-KV forward is a variant of the sm90ws forward; hstu_fwd_impl="
                f"{switches.hstu_fwd_impl!r} (JAX_SPARSE_ATTN_HSTU_FWD_IMPL) has none")
    bn = ws_options(switches.hstu_fwd_ws)["bn"] or ws_default_block_n(head_dim, head_dim_v)
    if 128 % bn:
        return (f"the paged-KV forward needs block_n dividing the page size 128; "
                f"JAX_SPARSE_ATTN_HSTU_WS / Switches.hstu_fwd_ws bn={bn}")
    return None


def gqa_unsupported_reason(head_dim, head_dim_v, has_rab, switches, paged=False) -> str | None:
    """``None`` if the kernels run grouped KV heads (``H_kv < H``, GQA/MQA) for these padded
    head dims, rab presence and :class:`~jax_sparse_attn.config.Switches`, else why not:
    the sm90ws forward and (unless ``paged``: forward only) the sm90 backward read KV head
    ``h // (H / H_kv)``; the portable sm80 kernels do not."""
    if _platform.kernel_family(switches) == "portable":
        return ("grouped KV heads (H_kv < H) need the sm90ws forward and the sm90 backward, "
                "which need sm_90a and the kernel_family switch 'auto'")
    if switches.hstu_fwd_impl != "sm90ws":
        return (f"grouped KV heads (H_kv < H) need the sm90ws forward; hstu_fwd_impl="
                f"{switches.hstu_fwd_impl!r} (JAX_SPARSE_ATTN_HSTU_FWD_IMPL) has none")
    if paged:
        return None
    if getattr(switches, "hstu_bwd_impl", "sm80") != "sm90":
        return ("grouped KV heads (H_kv < H) need the sm90 backward; hstu_bwd_impl="
                f"{switches.hstu_bwd_impl!r} (JAX_SPARSE_ATTN_HSTU_BWD_IMPL) has none")
    reason = bwd_sm90_unsupported_reason(head_dim, head_dim_v, has_rab,
                                         "rabsm80" in getattr(switches, "hstu_bwd_ws", ()))
    if reason is not None:
        return (f"grouped KV heads (H_kv < H) need the sm90 backward, which does not take "
                f"this call: {reason}")
    return None


def bwd_config(dtype, head_dim, head_dim_v, func_n, switches, *, has_rab=False,
               rab_per_head=False, rab_dtype="", deterministic=False) -> HstuBwdConfig:
    """The backward compile key (see :func:`fwd_config`). With ``hstu_bwd_impl="sm90"`` a
    configuration the sm90 kernel does not take (:func:`bwd_sm90_unsupported_reason`) runs
    sm80; the key records the replaced switch value in ``replaced_impl``. ``deterministic``
    (both kernels) orders the dq additions (and makes drab per head); the sm90 kernel then
    takes ``tile``, ``red`` and ``red4`` of ``hstu_bwd_dq`` (``bulk`` becomes ``red``)."""
    key = _bwd_config(dtype, head_dim, head_dim_v, func_n, switches, has_rab=has_rab,
                      rab_per_head=rab_per_head, rab_dtype=rab_dtype)
    if key.impl == "sm90" and key.bwd_order == "auto":
        # deterministic at D <= 64: the resident CTAs of an hlpt order hold long runs of
        # consecutive KV tiles of one sequence whose ordered dq additions wait on each other.
        # A bias shared by the heads (H_rab = 1 < H, not deterministic): lpt runs a KV tile's heads
        # together, so their bias reads and d rab reductions meet the same rows in L2 (hlpt
        # streams the whole bias and d rab workspace once per head)
        shared_rab = key.has_rab and not key.rab_per_head and not deterministic
        key = dataclasses.replace(
            key, bwd_order="lpt" if (deterministic and head_dim <= 64) or shared_rab
            else "hlpt")
    if key.impl == "sm90" and key.bwd_order == "hlpt":
        chunk = [int(o[6:]) for o in getattr(switches, "hstu_bwd_ws", ())
                 if o.startswith("chunk=")]
        key = dataclasses.replace(
            key, sched_chunk_kib=chunk[0] if chunk else BWD_SCHEDULE_CHUNK_KIB)
    if deterministic:
        key = dataclasses.replace(key, deterministic=True, dq_bulk=False)
        if (key.impl == "sm90" and key.dq_tile
                and getattr(switches, "det_writer", False)):
            key = dataclasses.replace(
                key, det_writer=True,
                det_store="detzero" not in getattr(switches, "hstu_bwd_ws", ()))
    elif key.impl == "sm90" and key.dq_tile:
        writer = getattr(switches, "dq_writer", "auto")
        # (with rab the workspace is zeroed: no claims, see below)
        claim = "dqclaim" in getattr(switches, "hstu_bwd_ws", ())
        if claim or writer == "on" or (writer == "auto" and head_dim > 128):
            key = dataclasses.replace(key, dq_writer=True, dq_claim=claim)
            if (head_dim <= 128 and not claim
                    and "wghand" in getattr(switches, "hstu_bwd_ws", ())):
                key = dataclasses.replace(key, wg_hand=True)
        if "qprobe" in getattr(switches, "hstu_bwd_ws", ()) and head_dim <= 128:
            # (D 256 stages dQ in the step's Q / dO stage, not in the staging tile)
            key = dataclasses.replace(key, q_probe=True)
        conv = [int(o[8:]) for o in getattr(switches, "hstu_bwd_ws", ())
                if o.startswith("convert=")]
        if conv and head_dim <= 128:
            key = dataclasses.replace(key, dq_convert_rows=conv[0])
    if key.impl == "sm90" and key.has_rab:
        # with rab the fp32 dq workspace is zeroed (by XLA or the schedule launch) and
        # reordered by the dq tile kernel: no first-contribution stores, claims or in-kernel
        # conversion
        key = dataclasses.replace(key, det_store=False, dq_claim=False, dq_convert_rows=0)
    return key


def _bwd_config(dtype, head_dim, head_dim_v, func_n, switches, *, has_rab=False,
                rab_per_head=False, rab_dtype="") -> HstuBwdConfig:
    arch = _platform.resolved_arch()
    impl = getattr(switches, "hstu_bwd_impl", "sm80")
    if impl == "sm90" and _platform.kernel_family(switches, arch) == "portable":
        return dataclasses.replace(
            _bwd_config(dtype, head_dim, head_dim_v, func_n,
                       dataclasses.replace(switches, hstu_bwd_impl="sm80"), has_rab=has_rab,
                       rab_per_head=rab_per_head, rab_dtype=rab_dtype),
            replaced_impl="sm90")
    if impl == "sm90":
        if bwd_sm90_unsupported_reason(head_dim, head_dim_v, has_rab,
                                       "rabsm80" in getattr(switches, "hstu_bwd_ws", ())) is None:
            if switches.hstu_bwd_tile is not None:
                raise ValueError(
                    f"JAX_SPARSE_ATTN_HSTU_BWD_TILE / Switches.hstu_bwd_tile="
                    f"{switches.hstu_bwd_tile} applies to the sm80 backward only; the sm90 "
                    "backward (the default hstu_bwd_impl) has fixed tiles (128 x 128 at "
                    "D = 64, 64 x 128 at D = 128, 64 x 64 at D = 256): set JAX_SPARSE_ATTN_HSTU_BWD_IMPL=sm80 / "
                    "Switches.hstu_bwd_impl='sm80' to use the tile override")
            # query rows x keys per tile (kernels.hstu_bwd_sm90.bwd_sm90_tiles)
            bm, bn = ((64, 64) if head_dim > 128 else
                      ((128 if head_dim <= 64 else 64), 128))
            dq = getattr(switches, "hstu_bwd_dq", "red")
            dq_bulk = dq == "bulk" and head_dim <= 128
            ws = getattr(switches, "hstu_bwd_ws", ())
            return HstuBwdConfig(_cutlass_dtype_name(dtype), head_dim, head_dim_v, bm, bn, 12,
                                 func_n > 0, max(func_n, 1), impl="sm90", dq_bulk=dq_bulk,
                                 dq_vec4=dq == "red4",
                                 dq_tile=dq == "tile",
                                 bwd_order=getattr(switches, "hstu_bwd_order", "auto"),
                                 arch=arch, pdl=bool(getattr(switches, "pdl", False)),
                                 split_wait=bm == 64 and "splitwait" in getattr(
                                     switches, "hstu_bwd_ws", ()),
                                 epi_pairs="epi16" not in getattr(switches, "hstu_bwd_ws", ()),
                                 sched_zero="xlazero" not in getattr(
                                     switches, "hstu_bwd_ws", ()),
                                 wg_skip=bm == 64 and bn == 128 and "wgskip" in getattr(
                                     switches, "hstu_bwd_ws", ()),
                                 dq_rev_heads=dq == "tile" and "revheads" in getattr(
                                     switches, "hstu_bwd_ws", ()),
                                 epi_smem=head_dim <= 128 and not {"epiregs", "epi16"} & set(
                                     getattr(switches, "hstu_bwd_ws", ())),
                                 uniform_frags="thrfrags" not in getattr(
                                     switches, "hstu_bwd_ws", ()),
                                 has_rab=bool(has_rab), rab_per_head=bool(rab_per_head),
                                 rab_dtype=rab_dtype if has_rab else "",
                                 rab_fast=bool(has_rab) and "norabfast" not in ws,
                                 rab_prefetch=bool(has_rab) and "norabpf" not in ws,
                                 drab_prefetch=bool(has_rab) and "drabpf" in ws,
                                 drab_scalar=bool(has_rab) and "nodrabs" not in ws,
                                 rab_pf_ahead=bool(has_rab) and "rabpf2" in ws,
                                 rab_fast_wide=bool(has_rab) and "rabfast64" in ws)
        return dataclasses.replace(
            _bwd_config(dtype, head_dim, head_dim_v, func_n,
                       dataclasses.replace(switches, hstu_bwd_impl="sm80"), has_rab=has_rab,
                       rab_per_head=rab_per_head, rab_dtype=rab_dtype),
            replaced_impl="sm90")
    bm, bn, w = _sm80_tile("backward", head_dim, head_dim_v, switches, arch)
    return HstuBwdConfig(_cutlass_dtype_name(dtype), head_dim, head_dim_v, bm, bn, w,
                         func_n > 0, max(func_n, 1), bool(has_rab), bool(rab_per_head),
                         rab_dtype if has_rab else "", arch=arch,
                         vec_red=_platform.vec_red(switches, arch))


# ----------------------------------------------------------------------------------------
# module-level @cute.jit adapters (stream first); imported lazily so that importing this
# module never requires CuTe DSL.
# ----------------------------------------------------------------------------------------


def _dt(name):
    """The CuTe DSL element type of a config's dtype name."""
    import cutlass  # noqa: PLC0415

    return cutlass.BFloat16 if name == "bfloat16" else cutlass.Float16


def _ws_fwd_kernel(cfg, **extra):
    """The ``hstu_fwd_sm90_ws`` kernel object of the forward compile key ``cfg`` with
    contiguous K / V (called while an adapter traces); ``extra``: rab or dynamic-deal
    arguments."""
    from ..kernels.hstu_fwd_sm90_ws import HstuFwdSm90Ws  # noqa: PLC0415

    return HstuFwdSm90Ws(_dt(cfg.dtype), cfg.head_dim, cfg.head_dim_v, cfg.block_n,
                         cfg.has_func, cfg.func_n, cfg.num_sms, overlap=cfg.ws_overlap,
                         pingpong=cfg.ws_pingpong, q_stages=cfg.ws_q_stages,
                         silu16=cfg.ws_silu16, tanh16=cfg.ws_tanh16, q_alias=cfg.ws_q_alias,
                         cross_item=cfg.ws_cross, v_lag=cfg.ws_v_lag, pdl=cfg.pdl,
                         head_outer=cfg.ws_head_outer, snake=cfg.ws_snake,
                         kv_splits=cfg.kv_splits, q_scale=cfg.ws_q_scale,
                         num_wg=cfg.ws_num_wg, p_late=cfg.ws_p_late,
                         split_wait=cfg.ws_split_wait, epi_vec=cfg.ws_epi_vec,
                         tma_o=cfg.ws_tma_o, rab_prefetch=cfg.ws_rab_prefetch, **extra)


@functools.lru_cache(maxsize=None)
def _fwd_adapter():
    import cutlass  # noqa: PLC0415
    import cutlass.cute as cute  # noqa: PLC0415

    from ..kernels.hstu_fwd_sm80 import HstuFwdSm80  # noqa: PLC0415

    @cute.jit
    def hstu_fwd_launch(stream, q, k, v, cu_q, cu_k, tiles, func, scal, win, out,
                        *, cfg: cutlass.Constexpr):
        args = (_dt(cfg.dtype), cfg.head_dim, cfg.head_dim_v, cfg.block_m, cfg.block_n,
                cfg.num_warps, cfg.has_func, cfg.func_n)
        # one branch per value of the hstu_fwd_impl switch (config.SWITCHES)
        if cutlass.const_expr(cfg.impl == "sm80"):
            kernel = HstuFwdSm80(*args)
        elif cutlass.const_expr(cfg.impl == "sm90ws"):
            kernel = _ws_fwd_kernel(cfg)
        kernel(q, k, v, cu_q, cu_k, tiles, func, scal, win, out, stream)

    return hstu_fwd_launch


@functools.lru_cache(maxsize=None)
def _fwd_dynamic_adapter():
    import cutlass  # noqa: PLC0415
    import cutlass.cute as cute  # noqa: PLC0415

    @cute.jit
    def hstu_fwd_dynamic_launch(stream, q, k, v, cu_q, cu_k, tiles, func, scal, win, counter,
                                out, *, cfg: cutlass.Constexpr):
        # counter (int32 (1,)) is aliased to output 1 (zeroed by the tile-schedule launch, or
        # by XLA on the jnp schedule path)
        _ws_fwd_kernel(cfg, dynamic=True)(q, k, v, cu_q, cu_k, tiles, func, scal, win, out,
                                          stream, mCounter=counter)

    return hstu_fwd_dynamic_launch


@functools.lru_cache(maxsize=None)
def _fwd_paged_adapter():
    import cutlass  # noqa: PLC0415
    import cutlass.cute as cute  # noqa: PLC0415

    from ..kernels.hstu_fwd_sm90_ws import HstuFwdSm90Ws  # noqa: PLC0415

    @cute.jit
    def hstu_fwd_paged_launch(stream, q, paged_kv, page_ids, page_indptrs, cu_q, cu_k, tiles,
                              func, scal, win, out, *, cfg: cutlass.Constexpr):
        kernel = HstuFwdSm90Ws(_dt(cfg.dtype), cfg.head_dim, cfg.head_dim_v, cfg.block_n,
                               False, 1, cfg.num_sms, overlap=cfg.ws_overlap,
                               pingpong=cfg.ws_pingpong, q_stages=cfg.ws_q_stages,
                               silu16=cfg.ws_silu16, tanh16=cfg.ws_tanh16,
                               q_alias=cfg.ws_q_alias, cross_item=cfg.ws_cross,
                               v_lag=cfg.ws_v_lag, paged=True, pdl=cfg.pdl,
                               head_outer=cfg.ws_head_outer, snake=cfg.ws_snake,
                               kv_splits=cfg.kv_splits, page_id_clamp=cfg.page_id_clamp,
                               page_prefetch=cfg.ws_page_prefetch,
                               split_wait=cfg.ws_split_wait, epi_vec=cfg.ws_epi_vec,
                               tma_o=cfg.ws_tma_o)
        kernel(q, paged_kv, paged_kv, cu_q, cu_k, tiles, func, scal, win, out, stream,
               mPageIds=page_ids, mPageIndptrs=page_indptrs)

    return hstu_fwd_paged_launch


@functools.lru_cache(maxsize=None)
def _fwd_rab_adapter():
    import cutlass  # noqa: PLC0415
    import cutlass.cute as cute  # noqa: PLC0415

    from ..kernels.hstu_fwd_sm80 import HstuFwdSm80  # noqa: PLC0415

    @cute.jit
    def hstu_fwd_rab_launch(stream, q, k, v, cu_q, cu_k, tiles, func, scal, win, rab, out,
                            *, cfg: cutlass.Constexpr):
        # one branch per value of the hstu_fwd_impl switch (RAB_FWD_IMPLS)
        if cutlass.const_expr(cfg.impl == "sm80"):
            kernel = HstuFwdSm80(_dt(cfg.dtype), cfg.head_dim, cfg.head_dim_v, cfg.block_m,
                                 cfg.block_n, cfg.num_warps, cfg.has_func, cfg.func_n,
                                 has_rab=True, rab_per_head=cfg.rab_per_head)
        elif cutlass.const_expr(cfg.impl == "sm90ws"):
            kernel = _ws_fwd_kernel(cfg, has_rab=True, rab_per_head=cfg.rab_per_head)
        kernel(q, k, v, cu_q, cu_k, tiles, func, scal, win, out, stream, rab)

    return hstu_fwd_rab_launch


@functools.lru_cache(maxsize=None)
def _bwd_rab_adapter():
    import cutlass  # noqa: PLC0415
    import cutlass.cute as cute  # noqa: PLC0415

    from ..kernels.hstu_bwd_sm80 import HstuBwdSm80  # noqa: PLC0415

    @cute.jit
    def hstu_bwd_rab_launch(stream, do, q, k, v, cu_q, cu_k, kv_tiles, q_tile_start, q_tiles,
                            func, scal, win, dq_acc, rab, drab, dk, dv,
                            *, cfg: cutlass.Constexpr):
        # dq_acc and drab are aliased to outputs 2 and 3 (initialised by XLA)
        if cutlass.const_expr(cfg.impl == "sm90"):
            _sm90_bwd_kernel(cfg, rab=True)(do, q, k, v, cu_q, cu_k, kv_tiles, q_tile_start,
                                            q_tiles, func, scal, win, dq_acc, dk, dv, stream,
                                            mRab=rab, mdRab=drab)
        else:
            HstuBwdSm80(_dt(cfg.dtype), cfg.head_dim, cfg.head_dim_v, cfg.block_m,
                        cfg.block_n, cfg.num_warps, cfg.has_func, cfg.func_n, has_rab=True,
                        rab_per_head=cfg.rab_per_head, vec_red=cfg.vec_red)(
                do, q, k, v, cu_q, cu_k, kv_tiles, q_tile_start, q_tiles, func, scal, win,
                dq_acc, dk, dv, stream, rab, drab)

    return hstu_bwd_rab_launch


@functools.lru_cache(maxsize=None)
def _bwd_rab_det_adapter():
    import cutlass  # noqa: PLC0415
    import cutlass.cute as cute  # noqa: PLC0415

    from ..kernels.hstu_bwd_sm80 import HstuBwdSm80  # noqa: PLC0415

    @cute.jit
    def hstu_bwd_rab_det_launch(stream, do, q, k, v, cu_q, cu_k, kv_tiles, q_tile_start,
                                q_tiles, func, scal, win, dq_acc, rab, drab, dq_sem, dk, dv,
                                *, cfg: cutlass.Constexpr):
        # deterministic: dq_acc, drab (per head) and the dq semaphores are aliased to
        # outputs 2, 3 and 4 (zero-initialised by XLA)
        if cutlass.const_expr(cfg.impl == "sm90"):
            _sm90_bwd_kernel(cfg, rab=True)(do, q, k, v, cu_q, cu_k, kv_tiles, q_tile_start,
                                            q_tiles, func, scal, win, dq_acc, dk, dv, stream,
                                            mdQSem=dq_sem, mRab=rab, mdRab=drab)
        else:
            HstuBwdSm80(_dt(cfg.dtype), cfg.head_dim, cfg.head_dim_v, cfg.block_m,
                        cfg.block_n, cfg.num_warps, cfg.has_func, cfg.func_n, has_rab=True,
                        rab_per_head=cfg.rab_per_head, deterministic=True,
                        vec_red=cfg.vec_red)(
                do, q, k, v, cu_q, cu_k, kv_tiles, q_tile_start, q_tiles, func, scal, win,
                dq_acc, dk, dv, stream, rab, drab, dq_sem)

    return hstu_bwd_rab_det_launch


def _sm90_bwd_kernel(cfg, rab=False):
    """The ``hstu_bwd_sm90`` kernel object of the backward compile key ``cfg`` (called while
    an adapter traces); its tiles must be the key's, for which the schedule was built.
    ``rab``: the launch passes the bias (a key with ``has_rab`` whose bias has no elements
    runs the launch without it, so the kernel then has none either)."""
    from ..kernels.hstu_bwd_sm90 import HstuBwdSm90  # noqa: PLC0415

    kernel = HstuBwdSm90(_dt(cfg.dtype), cfg.head_dim, cfg.has_func, cfg.func_n,
                         dq_bulk=cfg.dq_bulk, deterministic=cfg.deterministic,
                         dq_vec4=cfg.dq_vec4, head_major=cfg.bwd_order != "lpt",
                         dq_tile=cfg.dq_tile, pdl=cfg.pdl, det_writer=cfg.det_writer,
                         dq_writer=cfg.dq_writer, split_wait=cfg.split_wait,
                         epi_pairs=cfg.epi_pairs, det_store=cfg.det_store,
                         dq_claim=cfg.dq_claim, convert_rows=cfg.dq_convert_rows,
                         wg_skip=cfg.wg_skip, epi_smem=cfg.epi_smem,
                         uniform_frags=cfg.uniform_frags, wg_hand=cfg.wg_hand,
                         has_rab=rab and cfg.has_rab, rab_per_head=cfg.rab_per_head,
                         rab_fast=cfg.rab_fast, rab_prefetch=cfg.rab_prefetch,
                         drab_prefetch=cfg.drab_prefetch, drab_scalar=cfg.drab_scalar,
                         rab_pf_ahead=cfg.rab_pf_ahead, rab_fast_wide=cfg.rab_fast_wide,
                         q_probe=cfg.q_probe)
    if (kernel.bm, kernel.bn) != (cfg.block_m, cfg.block_n):
        raise ValueError(f"hstu_bwd_sm90 tiles {(kernel.bm, kernel.bn)} differ from the "
                         f"compile key's {(cfg.block_m, cfg.block_n)}")
    return kernel


@functools.lru_cache(maxsize=None)
def _bwd_adapter():
    import cutlass  # noqa: PLC0415
    import cutlass.cute as cute  # noqa: PLC0415

    from ..kernels.hstu_bwd_sm80 import HstuBwdSm80  # noqa: PLC0415

    @cute.jit
    def hstu_bwd_launch(stream, do, q, k, v, cu_q, cu_k, kv_tiles, q_tile_start, q_tiles,
                        func, scal, win, dq_acc, dk, dv, *, cfg: cutlass.Constexpr):
        # dq_acc is aliased to the third output (the fp32 dq workspace, zero-initialized).
        # one branch per value of the hstu_bwd_impl switch (config.SWITCHES)
        if cutlass.const_expr(cfg.impl == "sm90"):
            kernel = _sm90_bwd_kernel(cfg)
        else:
            kernel = HstuBwdSm80(_dt(cfg.dtype), cfg.head_dim, cfg.head_dim_v, cfg.block_m,
                                 cfg.block_n, cfg.num_warps, cfg.has_func, cfg.func_n,
                                 vec_red=cfg.vec_red)
        kernel(do, q, k, v, cu_q, cu_k, kv_tiles, q_tile_start, q_tiles, func, scal, win,
               dq_acc, dk, dv, stream)

    return hstu_bwd_launch


@functools.lru_cache(maxsize=None)
def _bwd_det_adapter():
    import cutlass  # noqa: PLC0415
    import cutlass.cute as cute  # noqa: PLC0415

    from ..kernels.hstu_bwd_sm80 import HstuBwdSm80  # noqa: PLC0415

    @cute.jit
    def hstu_bwd_det_launch(stream, do, q, k, v, cu_q, cu_k, kv_tiles, q_tile_start, q_tiles,
                            func, scal, win, dq_acc, dq_sem, dk, dv, *, cfg: cutlass.Constexpr):
        # deterministic: dq_acc and the dq semaphores (int32 (query tile slots, H)) are
        # aliased to outputs 2 and 3 (zero-initialised by XLA; with det_store / dq_claim
        # this adapter serves the tests' filled workspace, the semaphores of dq_claim are
        # (slots, H, 2))
        if cutlass.const_expr(cfg.impl == "sm90"):
            kernel = _sm90_bwd_kernel(cfg)
        else:
            kernel = HstuBwdSm80(_dt(cfg.dtype), cfg.head_dim, cfg.head_dim_v, cfg.block_m,
                                 cfg.block_n, cfg.num_warps, cfg.has_func, cfg.func_n,
                                 deterministic=True, vec_red=cfg.vec_red)
        kernel(do, q, k, v, cu_q, cu_k, kv_tiles, q_tile_start, q_tiles, func, scal, win,
               dq_acc, dk, dv, stream, mdQSem=dq_sem)

    return hstu_bwd_det_launch


@functools.lru_cache(maxsize=None)
def _bwd_det_store_adapter():
    import cutlass  # noqa: PLC0415
    import cutlass.cute as cute  # noqa: PLC0415

    @cute.jit
    def hstu_bwd_det_store_launch(stream, do, q, k, v, cu_q, cu_k, kv_tiles, q_tile_start,
                                  q_tiles, func, scal, win, dq_sem, dk, dv, dq_acc, *,
                                  cfg: cutlass.Constexpr):
        # det_store / dq_claim: the dq semaphores (det_store: int32 (query tile slots, H);
        # dq_claim: (slots, H, 2), claim counters and ready flags) are aliased to output 3
        # (zero-initialised by XLA); the fp32 dq workspace (output 2) is not initialised
        _sm90_bwd_kernel(cfg)(do, q, k, v, cu_q, cu_k, kv_tiles, q_tile_start, q_tiles, func,
                              scal, win, dq_acc, dk, dv, stream, mdQSem=dq_sem)

    return hstu_bwd_det_store_launch


@functools.lru_cache(maxsize=None)
def _bwd_convert_adapter():
    import cutlass  # noqa: PLC0415
    import cutlass.cute as cute  # noqa: PLC0415

    @cute.jit
    def hstu_bwd_convert_launch(stream, do, q, k, v, cu_q, cu_k, kv_tiles, q_tile_start,
                                q_tiles, func, scal, win, dq_acc, dq_sem, cnt, dk, dv, dq, *,
                                cfg: cutlass.Constexpr):
        # dq_convert_rows: dq_acc (zeroed, or with dq_claim filled by the tests), the claim
        # counters (dq_claim; else a dummy) and the finished-CTA counters are aliased to
        # outputs 2, 3, 4; dq (output 5) is written here for the converted sequences
        if cutlass.const_expr(cfg.dq_claim):
            _sm90_bwd_kernel(cfg)(do, q, k, v, cu_q, cu_k, kv_tiles, q_tile_start, q_tiles,
                                  func, scal, win, dq_acc, dk, dv, stream, mdQSem=dq_sem,
                                  mdQout=dq, mCnt=cnt)
        else:
            _sm90_bwd_kernel(cfg)(do, q, k, v, cu_q, cu_k, kv_tiles, q_tile_start, q_tiles,
                                  func, scal, win, dq_acc, dk, dv, stream, mdQout=dq,
                                  mCnt=cnt)

    return hstu_bwd_convert_launch


@functools.lru_cache(maxsize=None)
def _bwd_convert_uninit_adapter():
    import cutlass  # noqa: PLC0415
    import cutlass.cute as cute  # noqa: PLC0415

    @cute.jit
    def hstu_bwd_convert_uninit_launch(stream, do, q, k, v, cu_q, cu_k, kv_tiles, q_tile_start,
                                       q_tiles, func, scal, win, dq_sem, cnt, dk, dv, dq_acc,
                                       dq, *, cfg: cutlass.Constexpr):
        # dq_convert_rows with dq_claim: the claim counters and the finished-CTA counters are
        # aliased to outputs 3 and 4; the workspace (output 2) is not initialised
        _sm90_bwd_kernel(cfg)(do, q, k, v, cu_q, cu_k, kv_tiles, q_tile_start, q_tiles, func,
                              scal, win, dq_acc, dk, dv, stream, mdQSem=dq_sem, mdQout=dq,
                              mCnt=cnt)

    return hstu_bwd_convert_uninit_launch


@functools.lru_cache(maxsize=None)
def _dq_tiles_convert_adapter():
    import cutlass  # noqa: PLC0415
    import cutlass.cute as cute  # noqa: PLC0415

    from ..kernels.hstu_dq_tiles import HstuDqFromTiles  # noqa: PLC0415

    @cute.jit
    def hstu_dq_tiles_convert_launch(stream, ws, cu_q, cu_k, q_start, sem, dq, *,
                                     dtype: cutlass.Constexpr, block_m: cutlass.Constexpr,
                                     head_dim: cutlass.Constexpr, pdl: cutlass.Constexpr,
                                     claim: cutlass.Constexpr, rows: cutlass.Constexpr):
        # dq (input 5) is aliased to the output: the backward wrote the converted sequences
        kernel = HstuDqFromTiles(_dt(dtype), block_m, head_dim, pdl=pdl, sem=claim,
                                 convert_rows=rows)
        if cutlass.const_expr(claim):
            kernel(ws, cu_q, q_start, dq, stream, mSem=sem, mCuK=cu_k)
        else:
            kernel(ws, cu_q, q_start, dq, stream, mCuK=cu_k)

    return hstu_dq_tiles_convert_launch


@functools.lru_cache(maxsize=None)
def _dq_tiles_sem_adapter():
    import cutlass  # noqa: PLC0415
    import cutlass.cute as cute  # noqa: PLC0415

    from ..kernels.hstu_dq_tiles import HstuDqFromTiles  # noqa: PLC0415

    @cute.jit
    def hstu_dq_tiles_sem_launch(stream, ws, cu_q, q_start, sem, dq, *,
                                 dtype: cutlass.Constexpr, block_m: cutlass.Constexpr,
                                 head_dim: cutlass.Constexpr, pdl: cutlass.Constexpr,
                                 rev_heads: cutlass.Constexpr = False):
        HstuDqFromTiles(_dt(dtype), block_m, head_dim, pdl=pdl, sem=True,
                        rev_heads=rev_heads)(
            ws, cu_q, q_start, dq, stream, mSem=sem)

    return hstu_dq_tiles_sem_launch


@functools.lru_cache(maxsize=None)
def _dq_tiles_adapter():
    import cutlass  # noqa: PLC0415
    import cutlass.cute as cute  # noqa: PLC0415

    from ..kernels.hstu_dq_tiles import HstuDqFromTiles  # noqa: PLC0415

    @cute.jit
    def hstu_dq_tiles_launch(stream, ws, cu_q, q_start, dq, *, dtype: cutlass.Constexpr,
                             block_m: cutlass.Constexpr, head_dim: cutlass.Constexpr,
                             pdl: cutlass.Constexpr, rev_heads: cutlass.Constexpr = False):
        HstuDqFromTiles(_dt(dtype), block_m, head_dim, pdl=pdl, rev_heads=rev_heads)(
            ws, cu_q, q_start, dq, stream)

    return hstu_dq_tiles_launch


@functools.lru_cache(maxsize=None)
def _schedule_adapter():
    import cutlass  # noqa: PLC0415
    import cutlass.cute as cute  # noqa: PLC0415

    from ..kernels.hstu_schedule import HstuSchedule  # noqa: PLC0415

    @cute.jit
    def hstu_fwd_schedule_launch(stream, cu_q, cu_k, param, cu_q_out, cu_k_out, tiles,
                                 *, block: cutlass.Constexpr, pdl: cutlass.Constexpr,
                                 chunk: cutlass.Constexpr = False):
        # the forward writes no q_start: cu_q_out stands in for it
        HstuSchedule(block, pdl=pdl, chunk=chunk)(cu_q, cu_k, param, cu_q_out, cu_k_out, tiles,
                                                  cu_q_out, stream)

    @cute.jit
    def hstu_bwd_schedule_launch(stream, cu_q, cu_k, param, cu_q_out, cu_k_out, kv_tiles,
                                 q_start, *, block: cutlass.Constexpr,
                                 block_other: cutlass.Constexpr, sort: cutlass.Constexpr,
                                 pdl: cutlass.Constexpr, chunk: cutlass.Constexpr = False):
        HstuSchedule(block, kv_major=True, block_other=block_other, sort=sort, pdl=pdl,
                     chunk=chunk)(
            cu_q, cu_k, param, cu_q_out, cu_k_out, kv_tiles, q_start, stream)

    @cute.jit
    def hstu_fwd_schedule_paged_launch(stream, cu_q, cu_k, ptr, param, cu_q_out, cu_k_out,
                                       tiles, ptr_out, *, block: cutlass.Constexpr,
                                       pdl: cutlass.Constexpr):
        HstuSchedule(block, paged=True, pdl=pdl)(cu_q, cu_k, param, cu_q_out, cu_k_out, tiles, cu_q_out,
                                        stream, mPtr=ptr, mPtrS=ptr_out)

    @cute.jit
    def hstu_fwd_schedule_counter_launch(stream, cu_q, cu_k, param, cu_q_out, cu_k_out, tiles,
                                         counter, *, block: cutlass.Constexpr,
                                         pdl: cutlass.Constexpr,
                                         chunk: cutlass.Constexpr = False):
        # also zeroes the dynamic deal's work-item counter (no XLA memset between this launch
        # and the forward, which would stop the forward's programmatic early launch)
        HstuSchedule(block, pdl=pdl, chunk=chunk)(cu_q, cu_k, param, cu_q_out, cu_k_out, tiles,
                                                  cu_q_out, stream, mCounter=counter)

    @cute.jit
    def hstu_bwd_schedule_zero_launch(stream, cu_q, cu_k, param, cu_q_out, cu_k_out, kv_tiles,
                                      q_start, dq_ws, *, block: cutlass.Constexpr,
                                      block_other: cutlass.Constexpr, sort: cutlass.Constexpr,
                                      pdl: cutlass.Constexpr, zero_ctas: cutlass.Constexpr,
                                      chunk: cutlass.Constexpr = False):
        # also zeroes the backward's flat fp32 dq workspace (no XLA memset between this
        # launch and the backward, which would stop the backward's programmatic early launch)
        HstuSchedule(block, kv_major=True, block_other=block_other, sort=sort, pdl=pdl,
                     zero_ctas=zero_ctas, chunk=chunk)(
            cu_q, cu_k, param, cu_q_out, cu_k_out, kv_tiles, q_start, stream, mZero=dq_ws)

    @cute.jit
    def hstu_bwd_schedule_zero_filled_launch(stream, cu_q, cu_k, param, dq_ws, cu_q_out,
                                             cu_k_out, kv_tiles, q_start, *,
                                             block: cutlass.Constexpr,
                                             block_other: cutlass.Constexpr,
                                             sort: cutlass.Constexpr, pdl: cutlass.Constexpr,
                                             zero_ctas: cutlass.Constexpr,
                                             chunk: cutlass.Constexpr = False):
        # (tests) the same launch with the workspace an input filled by the test, aliased to
        # output 4
        HstuSchedule(block, kv_major=True, block_other=block_other, sort=sort, pdl=pdl,
                     zero_ctas=zero_ctas, chunk=chunk)(
            cu_q, cu_k, param, cu_q_out, cu_k_out, kv_tiles, q_start, stream, mZero=dq_ws)

    return (hstu_fwd_schedule_launch, hstu_bwd_schedule_launch, hstu_fwd_schedule_paged_launch,
            hstu_fwd_schedule_counter_launch, hstu_bwd_schedule_zero_launch,
            hstu_bwd_schedule_zero_filled_launch)


def _schedule_kernel_fits(cfg, func, nb, n_slots):
    """Whether ``kernels/hstu_schedule.py`` builds this call's schedule (``cfg.schedule ==
    "kernel"``, no func mask, concrete sizes (not ``jax.export`` symbolic dims), at most
    ``MAX_SEQS`` sequences and ``MAX_SLOTS`` tiles)."""
    if cfg.schedule != "kernel" or func is not None or not isinstance(n_slots, int):
        return False
    from ..kernels.hstu_schedule import MAX_SEQS, MAX_SLOTS  # noqa: PLC0415

    return nb + 2 <= MAX_SEQS and n_slots <= MAX_SLOTS


def _schedule_param(t_q, t_k, window_size, n_slots, *extra):
    n_pow2 = 1 << max(n_slots - 1, 1).bit_length()
    left, right = (int(w) for w in window_size)
    return jnp.asarray([t_q, t_k, left, right, n_slots, n_pow2, *extra], jnp.int32)


def _paged_metadata(cu_seqlens_q, cu_seqlens_k, page_indptrs, cfg, t_q, n_page_slots, page):
    """Sanitised ``cu_q`` / ``cu_k`` / ``page_indptrs`` (each with the pseudo-sequence; keys
    clamped to the ``n_page_slots * page`` the page table can hold, page offsets to the
    ``n_page_slots``) and the forward tile schedule of a paged-KV call: one launch of
    ``kernels/hstu_schedule.py`` (paged mode) where :func:`_schedule_kernel_fits`, else the
    jnp formulation of ``metadata``."""
    bm = cfg.fwd.block_m
    nb = cu_seqlens_q.shape[0] - 1
    n_slots = t_q // bm + nb + 1
    t_k = n_page_slots * page
    if _schedule_kernel_fits(cfg, None, nb, n_slots):
        out_sds = (jax.ShapeDtypeStruct((nb + 2,), jnp.int32),
                   jax.ShapeDtypeStruct((nb + 2,), jnp.int32),
                   jax.ShapeDtypeStruct((n_slots, 5), jnp.int32),
                   jax.ShapeDtypeStruct((nb + 2,), jnp.int32))
        call = _cutlass_call(cfg)(_schedule_adapter()[2], output_shape_dtype=out_sds,
                                  compile_key=("hstu_fwd_schedule_paged", bm, cfg.fwd.pdl),
                                  block=bm, pdl=cfg.fwd.pdl)
        cu_q, cu_k, tiles, ptr = call(
            cu_seqlens_q.astype(jnp.int32), cu_seqlens_k.astype(jnp.int32),
            page_indptrs.astype(jnp.int32),
            _schedule_param(t_q, t_k, cfg.window_size, n_slots, n_page_slots))
        return cu_q, cu_k, ptr, tiles
    cu_q = metadata.append_pseudo_sequence(metadata.sanitize_cu_seqlens(cu_seqlens_q, t_q), t_q)
    cu_k = metadata.append_pseudo_sequence(metadata.sanitize_cu_seqlens(cu_seqlens_k, t_k), None)
    ptr = metadata.append_pseudo_sequence(
        metadata.sanitize_cu_seqlens(page_indptrs, n_page_slots), None)
    tiles = metadata.hstu_fwd_schedule(cu_q, cu_k, None, bm, t_q, cfg.window_size)
    return cu_q, cu_k, ptr, tiles


def _fwd_metadata(cu_seqlens_q, cu_seqlens_k, func, cfg, t_q, t_k, tokens_per_chunk=0,
                  counter=False):
    """Sanitised ``cu_q`` / ``cu_k`` (each with the pseudo-sequence) and the forward tile
    schedule: one launch of ``kernels/hstu_schedule.py`` where :func:`_schedule_kernel_fits`,
    else the jnp formulation of ``metadata``. ``tokens_per_chunk > 0``: the query tiles are
    ordered by sequence chunks of that many keys first (``metadata.hstu_fwd_schedule``).
    ``counter``: a fourth result, a zeroed int32 ``(1,)`` (the dynamic deal's item counter;
    written by the schedule kernel where it runs)."""
    bm = cfg.fwd.block_m
    nb = cu_seqlens_q.shape[0] - 1
    n_slots = t_q // bm + nb + 1
    chunk = tokens_per_chunk > 0
    if _schedule_kernel_fits(cfg, func, nb, n_slots):
        out_sds = (jax.ShapeDtypeStruct((nb + 2,), jnp.int32),
                   jax.ShapeDtypeStruct((nb + 2,), jnp.int32),
                   jax.ShapeDtypeStruct((n_slots, 5), jnp.int32))
        if counter:
            out_sds += (jax.ShapeDtypeStruct((1,), jnp.int32),)
        call = _cutlass_call(cfg)(_schedule_adapter()[3 if counter else 0],
                                  output_shape_dtype=out_sds,
                                  compile_key=("hstu_fwd_schedule", bm, cfg.fwd.pdl, chunk,
                                               counter),
                                  block=bm, pdl=cfg.fwd.pdl, chunk=chunk)
        extra = (tokens_per_chunk,) if chunk else ()
        return call(cu_seqlens_q.astype(jnp.int32), cu_seqlens_k.astype(jnp.int32),
                    _schedule_param(t_q, t_k, cfg.window_size, n_slots, *extra))
    cu_q = metadata.append_pseudo_sequence(metadata.sanitize_cu_seqlens(cu_seqlens_q, t_q), t_q)
    cu_k = metadata.append_pseudo_sequence(metadata.sanitize_cu_seqlens(cu_seqlens_k, t_k), None)
    tiles = metadata.hstu_fwd_schedule(cu_q, cu_k, func, bm, t_q, cfg.window_size,
                                       tokens_per_chunk)
    if counter:
        return cu_q, cu_k, tiles, jnp.zeros((1,), jnp.int32)
    return cu_q, cu_k, tiles


def schedule_tokens_per_chunk(key, num_kv_heads, itemsize) -> int:
    """Keys per sequence chunk of the forward's tile schedule for the compile key's
    ``schedule_chunk_kib`` (KiB of K and V over ``num_kv_heads`` heads of the padded head
    dims, ``itemsize`` bytes per element); 0: no chunked order."""
    kib = getattr(key, "schedule_chunk_kib", 0)
    if not kib:
        return 0
    per_key = max(1, num_kv_heads) * (key.head_dim + key.head_dim_v) * itemsize
    return max(1, (kib * 1024) // per_key)


#: KiB of Q, dO and fp32 dq rows of one head per sequence chunk of the sm90 backward's
#: hlpt schedule (0: no chunks)
BWD_SCHEDULE_CHUNK_KIB = 0


def bwd_tokens_per_chunk(key) -> int:
    """Query rows per sequence chunk of the sm90 backward's KV-tile schedule for the compile
    key's ``sched_chunk_kib`` (KiB of one head's Q and dO in the input dtype and its fp32 dq
    workspace rows: what the CTAs of one head's KV tiles stream); 0: one longest-first
    order over all KV tiles of a head."""
    kib = getattr(key, "sched_chunk_kib", 0)
    if not kib:
        return 0
    per_row = (key.head_dim + key.head_dim_v) * 2 + key.head_dim * 4
    return max(1, (kib * 1024) // per_row)


#: CTAs of the tile-schedule launch that zero the backward's dq workspace: with the
#: schedule's CTA one per SM of the H200 (1024 threads of 48 registers each: one resident
#: CTA per SM), a single wave
SCHED_ZERO_CTAS = 131


def _bwd_metadata(cu_seqlens_q, cu_seqlens_k, func, cfg, t_q, t_k, zero_shape=None,
                  _zero_fill=None):
    """Sanitised ``cu_q`` / ``cu_k`` (pseudo-sequence of keys), the KV tiles (longest work
    first for the sm90 backward, canonical order for sm80), each sequence's first query
    tile and the func summary: one launch of ``kernels/hstu_schedule.py`` where
    :func:`_schedule_kernel_fits`, else the jnp formulation of ``metadata``. With
    ``zero_shape`` (the fp32 dq workspace's shape) a sixth value: that workspace zeroed by
    the schedule launch, or None where the launch does not run (the caller zeroes it).
    ``_zero_fill`` (tests only): the workspace is an input filled with this value before the
    launch (aliased to its output), so that a missed element shows."""
    key = cfg.bwd
    bm, bn = key.block_m, key.block_n
    nb = cu_seqlens_q.shape[0] - 1
    nk_slots = t_k // bn + nb + 1
    sort = key.impl == "sm90" and key.bwd_order != "seq"
    # the schedule kernel's longest-first order keeps a sequence's KV tiles ascending (ties
    # in canonical order) when the work does not grow with the KV tile, i.e. without a
    # finite left window edge; the deterministic backward needs that order (its dq
    # additions wait only for the previous KV tile), so otherwise it takes the jnp schedule
    # with the deterministic sort key
    det_xla = key.deterministic and sort and int(cfg.window_size[0]) >= 0
    tokens = bwd_tokens_per_chunk(key) if sort else 0
    chunk = tokens > 0
    extra = (tokens,) if chunk else ()
    if not det_xla and _schedule_kernel_fits(cfg, func, nb, nk_slots):
        out_sds = (jax.ShapeDtypeStruct((nb + 2,), jnp.int32),
                   jax.ShapeDtypeStruct((nb + 2,), jnp.int32),
                   jax.ShapeDtypeStruct((nk_slots, 2), jnp.int32),
                   jax.ShapeDtypeStruct((nb + 2,), jnp.int32))
        raw = (cu_seqlens_q.astype(jnp.int32), cu_seqlens_k.astype(jnp.int32),
               _schedule_param(t_q, t_k, cfg.window_size, nk_slots, *extra))
        n_zero = math.prod(zero_shape) if zero_shape is not None else 0
        # (concrete sizes only: with jax.export a symbolic T_q makes the workspace symbolic)
        if isinstance(n_zero, int) and 0 < n_zero < 2 ** 31 - 2 ** 24 and n_zero % 4 == 0:
            ws_sds = jax.ShapeDtypeStruct((n_zero,), jnp.float32)
            kw = dict(block=bn, block_other=bm, sort=sort, pdl=key.pdl,
                      zero_ctas=SCHED_ZERO_CTAS, chunk=chunk)
            if _zero_fill is None:
                call = _cutlass_call(cfg)(
                    _schedule_adapter()[4], output_shape_dtype=out_sds + (ws_sds,),
                    compile_key=("hstu_bwd_schedule_zero", bn, bm, sort, key.pdl,
                                 SCHED_ZERO_CTAS, chunk), **kw)
                cu_q, cu_k, kv_tiles, q_start, ws = call(*raw)
            else:
                call = _cutlass_call(cfg)(
                    _schedule_adapter()[5], output_shape_dtype=out_sds + (ws_sds,),
                    compile_key=("hstu_bwd_schedule_zero_filled", bn, bm, sort, key.pdl,
                                 SCHED_ZERO_CTAS, chunk), input_output_aliases={3: 4}, **kw)
                cu_q, cu_k, kv_tiles, q_start, ws = call(
                    *raw, jnp.full((n_zero,), _zero_fill, jnp.float32))
            return (cu_q, cu_k, kv_tiles, q_start, jnp.zeros((1, 3), jnp.int32),
                    ws.reshape(zero_shape))
        call = _cutlass_call(cfg)(_schedule_adapter()[1], output_shape_dtype=out_sds,
                                  compile_key=("hstu_bwd_schedule", bn, bm, sort, key.pdl,
                                               chunk),
                                  block=bn, block_other=bm, sort=sort, pdl=key.pdl,
                                  chunk=chunk)
        cu_q, cu_k, kv_tiles, q_start = call(*raw)
        out = (cu_q, cu_k, kv_tiles, q_start, jnp.zeros((1, 3), jnp.int32))
        return out if zero_shape is None else out + (None,)
    cu_q = metadata.append_pseudo_sequence(metadata.sanitize_cu_seqlens(cu_seqlens_q, t_q), None)
    cu_k = metadata.append_pseudo_sequence(metadata.sanitize_cu_seqlens(cu_seqlens_k, t_k), t_k)
    kv_tiles, q_start, q_tiles = metadata.hstu_bwd_schedule(
        cu_q, cu_k, func, bm, bn, t_q, t_k, window_size=cfg.window_size if sort else None,
        deterministic=key.deterministic, tokens_per_chunk=tokens)
    out = (cu_q, cu_k, kv_tiles, q_start, q_tiles)
    return out if zero_shape is None else out + (None,)


def _cutlass_call(cfg):
    """The kernel-call builder that ``cfg.cute_call`` (the ``cute_call`` switch) selects:
    ``cute_call`` (one compile per compile key for every shape) or plain ``cutlass_call``."""
    from .._cute_call import call_builder  # noqa: PLC0415

    return call_builder(cfg.cute_call)


def _has_elements(rab):
    """False when rab has no element (B = 0 or N_k = 0): every bias is then 0."""
    return rab is not None and rab.shape[0] > 0 and rab.shape[-1] > 0


def _out_sds(key, t_q, h, dv_pad, dtype):
    """The forward kernel's output: ``out (T_q, H, Dv)``, or with split-KV the fp32 partial
    outputs ``(S, T_q, H, Dv)`` (every element written by the kernel)."""
    if key.kv_splits > 1:
        return jax.ShapeDtypeStruct((key.kv_splits, t_q, h, dv_pad), jnp.float32)
    return jax.ShapeDtypeStruct((t_q, h, dv_pad), dtype)


def hstu_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, func, cfg, rab=None):
    """HSTU forward on the CuTe DSL kernel for the op config ``cfg``
    (:class:`~jax_sparse_attn.config.HSTUConfig` with ``cfg.fwd`` set). q/k/v have the
    true head dims; they are zero-padded to ``cfg.head_dim_pad`` / ``cfg.head_dim_v_pad``
    here. ``rab``: the ``(B, H_rab, N_k, N_k)`` relative attention bias when
    ``cfg.has_rab``. Returns ``out (T_q, H, D_v)`` in q's dtype."""
    key = cfg.fwd
    t_q, h, _ = q.shape
    out_shape = (t_q, h, cfg.head_dim_v)
    if t_q == 0 or h == 0 or k.shape[0] == 0:  # no rows, or no valid key for any row
        return jnp.zeros(out_shape, q.dtype)
    # clamped so no cu_seqlens value makes the kernel read or write out of bounds;
    # pseudo-sequence B covers rows past cu_q[-1] (no keys): the kernel writes zeros there
    with_rab = key.has_rab and _has_elements(rab)
    dynamic = (key.impl == "sm90ws" and key.ws_dynamic and not key.ws_head_outer
               and not key.ws_cross and not with_rab)
    # the chunked order only with the dynamic deal (a static deal of it is badly balanced)
    tokens = schedule_tokens_per_chunk(key, k.shape[1], jnp.dtype(k.dtype).itemsize)
    cu_q, cu_k, tiles, *counter = _fwd_metadata(
        cu_seqlens_q, cu_seqlens_k, func if key.has_func else None, cfg, t_q, k.shape[0],
        tokens if dynamic else 0, counter=dynamic)
    # the chunked order changes the schedule only: one attention kernel for every chunk size
    # (and one for the kernels that deal statically, whatever the deal option)
    key = dataclasses.replace(key, schedule_chunk_kib=0,
                              ws_dynamic=dynamic)
    scal, win = metadata.hstu_scalars(cfg.alpha, cfg.scaling_seqlen, cfg.window_size)
    func_arr = func.astype(jnp.int32) if key.has_func else jnp.zeros((1, 1, 1), jnp.int32)
    out_sds = _out_sds(key, t_q, h, cfg.head_dim_v_pad, q.dtype)
    args = (metadata.pad_last(q, cfg.head_dim_pad), metadata.pad_last(k, cfg.head_dim_pad),
            metadata.pad_last(v, cfg.head_dim_v_pad), cu_q, cu_k, tiles, func_arr, scal, win)
    # static_last: q, k, v (inputs 0-2) and out carry the padded head dims of the key; rab
    # (input 9) has only runtime extents
    if with_rab:
        call = _cutlass_call(cfg)(_fwd_rab_adapter(), output_shape_dtype=out_sds,
                               compile_key=("hstu_fwd_rab", key), cfg=key,
                               static_last_inputs=(0, 1, 2), static_last_outputs=(0,))
        out = call(*args, rab)
    elif dynamic:
        # the dynamic deal's item counter: zeroed by the schedule launch (or XLA), updated in
        # place by the kernel
        call = _cutlass_call(cfg)(
            _fwd_dynamic_adapter(),
            output_shape_dtype=(out_sds, jax.ShapeDtypeStruct((1,), jnp.int32)),
            input_output_aliases={9: 1}, compile_key=("hstu_fwd_dynamic", key), cfg=key,
            static_last_inputs=(0, 1, 2), static_last_outputs=(0,))
        out, _ = call(*args, counter[0])
    else:
        call = _cutlass_call(cfg)(_fwd_adapter(), output_shape_dtype=out_sds,
                               compile_key=("hstu_fwd", key), cfg=key,
                               static_last_inputs=(0, 1, 2), static_last_outputs=(0,))
        out = call(*args)
    if key.kv_splits > 1:
        out = _add_splits(out, q.dtype)
    return out[..., : cfg.head_dim_v]


def hstu_fwd_paged(q, paged_kv, page_ids, page_indptrs, cu_seqlens_q, cu_seqlens_k, cfg):
    """HSTU forward (causal) with K / V in a paged cache, on the paged variant of the sm90ws
    kernel (``cfg.fwd.paged``): the producer warp loads each KV tile of sequence ``b`` by TMA
    from page ``page_ids[page_indptrs[b] + tile]`` of ``paged_kv (num_pages, 2, 128, H_kv,
    D)`` in place (no gathered copy; zero-padding of D to ``cfg.head_dim_pad`` copies the
    cache only for a head dim that is not a kernel dim). ``cu_seqlens_k`` gives the key
    counts. Metadata are sanitised so no value reads out of bounds: ``page_indptrs`` like
    ``cu_seqlens`` (clamped into ``[0, P]``, non-decreasing; with ``cu_seqlens`` and the tile
    schedule in one launch of the schedule kernel, :func:`_paged_metadata`), ``page_ids``
    clamped into ``[0, num_pages)`` (by the forward kernel as it reads them with
    ``cfg.fwd.page_id_clamp``, the ``hstu_schedule="kernel"`` default, else by XLA), and the
    kernel clamps each page slot into ``[0, P)``. Returns ``out (T_q, H, D)`` in q's
    dtype."""
    key = cfg.fwd
    t_q, h, _ = q.shape
    n_pages, n_slots = paged_kv.shape[0], page_ids.shape[0]
    out_shape = (t_q, h, cfg.head_dim_v)
    if t_q == 0 or h == 0 or n_pages == 0 or n_slots == 0:  # no rows, or no key anywhere
        return jnp.zeros(out_shape, q.dtype)
    cu_q, cu_k, ptr, tiles = _paged_metadata(cu_seqlens_q, cu_seqlens_k, page_indptrs, cfg,
                                             t_q, n_slots, paged_kv.shape[2])
    ids = page_ids.astype(jnp.int32)
    if not key.page_id_clamp:
        ids = jnp.clip(ids, 0, n_pages - 1)
    scal, win = metadata.hstu_scalars(cfg.alpha, cfg.scaling_seqlen, cfg.window_size)
    func_arr = jnp.zeros((1, 1, 1), jnp.int32)
    out_sds = _out_sds(key, t_q, h, cfg.head_dim_v_pad, q.dtype)
    call = _cutlass_call(cfg)(_fwd_paged_adapter(), output_shape_dtype=out_sds,
                              compile_key=("hstu_fwd_paged", key), cfg=key,
                              static_last_inputs=(0, 1), static_last_outputs=(0,))
    out = call(metadata.pad_last(q, cfg.head_dim_pad),
               metadata.pad_last(paged_kv, cfg.head_dim_pad), ids, ptr, cu_q, cu_k, tiles,
               func_arr, scal, win)
    if key.kv_splits > 1:
        out = _add_splits(out, q.dtype)
    return out[..., : cfg.head_dim_v]


def hstu_bwd(do, q, k, v, cu_seqlens_q, cu_seqlens_k, func, cfg, rab=None, _drab_init=None,
             _dq_ws_fill=None):
    """HSTU backward on the CuTe DSL kernel for the op config ``cfg`` (``cfg.bwd`` set;
    padding as in :func:`hstu_fwd`). Returns ``(dq, dk, dv)`` in the input dtype, and
    ``drab`` (rab's shape and dtype) as a fourth output when ``rab`` is given.

    ``_drab_init`` (tests only): the initial content of the buffer the kernel writes drab
    into (rab's shape and dtype when ``H_rab == H``, else the fp32 ``(B, 1, N_k, N_k_pad)``
    workspace, then returned unsliced and uncast) instead of zeros. ``_dq_ws_fill`` (tests
    only; ``det_store`` / ``dq_claim`` keys, and ``sched_zero`` keys where the schedule
    launch zeroes the workspace, else a ValueError): a value the fp32 dq workspace is filled
    with before the kernel (``sched_zero``: before the schedule launch zeroes it), which those
    modes do not zero (XLA leaves it uninitialised without it)."""
    key = cfg.bwd
    t_q, h, _ = q.shape
    t_k = k.shape[0]
    if t_q == 0 or t_k == 0 or h == 0:
        zeros = (jnp.zeros_like(q), jnp.zeros_like(k), jnp.zeros_like(v))
        return zeros if rab is None else zeros + (jnp.zeros_like(rab),)
    d, dv = cfg.head_dim_pad, cfg.head_dim_v_pad
    do_p, q_p = metadata.pad_last(do, dv), metadata.pad_last(q, d)
    k_p, v_p = metadata.pad_last(k, d), metadata.pad_last(v, dv)
    # clamped (memory safety, see hstu_fwd); pseudo-sequence B covers keys past cu_k[-1]
    # (no queries): zero dk/dv there
    # the sm90 backward launches its KV tiles longest work first (LPT launch order)
    # canonical query tile slots (metadata.hstu_bwd_schedule's q_start)
    n_q_slots = t_q // key.block_m + cu_seqlens_q.shape[0]
    dq_ws_shape = ((n_q_slots, h, key.block_m * d) if key.dq_tile else (t_q, h, d))
    # (det_store: the kernel's first contributions initialise the workspace)
    uninit = key.det_store or key.dq_claim
    sched_zero = key.sched_zero and not uninit
    if _dq_ws_fill is not None and not (uninit or sched_zero):
        raise ValueError("_dq_ws_fill applies to backward keys with det_store, dq_claim or "
                         "sched_zero only")
    # sched_zero: the schedule launch zeroes the workspace (where its kernel runs)
    cu_q, cu_k, kv_tiles, q_start, q_tiles, *ws = _bwd_metadata(
        cu_seqlens_q, cu_seqlens_k, func if key.has_func else None, cfg, t_q, t_k,
        zero_shape=dq_ws_shape if sched_zero else None,
        _zero_fill=_dq_ws_fill if sched_zero else None)
    if _dq_ws_fill is not None and sched_zero and ws[0] is None:
        raise ValueError("_dq_ws_fill: the schedule launch does not zero this call's workspace")
    scal, win = metadata.hstu_scalars(cfg.alpha, cfg.scaling_seqlen, cfg.window_size)
    func_arr = func.astype(jnp.int32) if key.has_func else jnp.zeros((1, 1, 1), jnp.int32)
    if _dq_ws_fill is not None and uninit:
        dq_acc0 = jnp.full(dq_ws_shape, _dq_ws_fill, jnp.float32)
    elif uninit:
        dq_acc0 = None
    else:
        dq_acc0 = ws[0] if ws and ws[0] is not None else jnp.zeros(dq_ws_shape, jnp.float32)
    # deterministic: one semaphore per (canonical query tile slot, head); dq_claim: a claim
    # counter and a ready flag per (slot, head)
    sem0 = (jnp.zeros((n_q_slots, h), jnp.int32) if key.deterministic else
            jnp.zeros((n_q_slots, h, 2), jnp.int32) if key.dq_claim else None)
    hd, hdv = cfg.head_dim, cfg.head_dim_v
    if key.has_rab and _has_elements(rab):
        dk, dv_out, dq_acc, drab = _bwd_rab_call(
            cfg, key, (do_p, q_p, k_p, v_p, cu_q, cu_k, kv_tiles, q_start, q_tiles, func_arr, scal,
                  win, dq_acc0), k, v, rab, _drab_init, sem0)
        if key.dq_tile:  # the sm90 backward's query-tile workspace (bwd_config: zeroed)
            dq_acc = _dq_tiles_call(cfg, key, dq_acc, cu_q, q_start, t_q, h, d, q.dtype)
        return dq_acc[..., :hd].astype(q.dtype), dk[..., :hd], dv_out[..., :hdv], drab
    out_sds = (
        jax.ShapeDtypeStruct(k_p.shape, k.dtype),
        jax.ShapeDtypeStruct(v_p.shape, v.dtype),
        jax.ShapeDtypeStruct(dq_ws_shape, jnp.float32),
    )
    args = (do_p, q_p, k_p, v_p, cu_q, cu_k, kv_tiles, q_start, q_tiles, func_arr, scal, win,
            dq_acc0)
    sem = None
    if key.dq_convert_rows:
        return _bwd_convert_call(cfg, key, args, sem0, out_sds, q, t_q, h, d, cu_q, cu_k,
                                 q_start, hd, hdv, rab)
    if uninit and dq_acc0 is None:
        # no zeroed workspace: the first contribution to each query tile is stored
        call = _cutlass_call(cfg)(
            _bwd_det_store_adapter(), output_shape_dtype=out_sds + (
                jax.ShapeDtypeStruct(sem0.shape, jnp.int32),),
            compile_key=("hstu_bwd_det_store", key), input_output_aliases={12: 3}, cfg=key,
            static_last_inputs=(0, 1, 2, 3), static_last_outputs=(0, 1, 2),
        )
        dk, dv_out, dq_acc, sem = call(*args[:12], sem0)
    elif key.deterministic:
        call = _cutlass_call(cfg)(
            _bwd_det_adapter(), output_shape_dtype=out_sds + (
                jax.ShapeDtypeStruct(sem0.shape, jnp.int32),),
            compile_key=("hstu_bwd_det", key), input_output_aliases={12: 2, 13: 3}, cfg=key,
            static_last_inputs=(0, 1, 2, 3, 12), static_last_outputs=(0, 1, 2),
        )
        dk, dv_out, dq_acc, sem = call(*args, sem0)
    elif key.dq_claim:
        # (tests: _dq_ws_fill) the workspace filled, aliased as the default mode does
        call = _cutlass_call(cfg)(
            _bwd_det_adapter(), output_shape_dtype=out_sds + (
                jax.ShapeDtypeStruct(sem0.shape, jnp.int32),),
            compile_key=("hstu_bwd_claim_filled", key), input_output_aliases={12: 2, 13: 3},
            cfg=key, static_last_inputs=(0, 1, 2, 3, 12), static_last_outputs=(0, 1, 2),
        )
        dk, dv_out, dq_acc, sem = call(*args, sem0)
    else:
        call = _cutlass_call(cfg)(
            _bwd_adapter(), output_shape_dtype=out_sds, compile_key=("hstu_bwd", key),
            input_output_aliases={12: 2}, cfg=key,
            static_last_inputs=(0, 1, 2, 3, 12), static_last_outputs=(0, 1, 2),
        )
        dk, dv_out, dq_acc = call(*args)
    if uninit:
        # as below, with the semaphores (dq_claim: the claim counters): tiles no KV tile
        # covered (never written) give zeros
        if key.det_store:
            sem = sem.reshape(sem.shape + (1,))  # (slots, H, 1): a bitcast
        call = _cutlass_call(cfg)(
            _dq_tiles_sem_adapter(),
            output_shape_dtype=jax.ShapeDtypeStruct((t_q, h, d), q.dtype),
            compile_key=("hstu_dq_tiles_sem", key.dtype, key.block_m, d, key.pdl,
                         key.dq_rev_heads),
            dtype=key.dtype, block_m=key.block_m, head_dim=d, pdl=key.pdl,
            rev_heads=key.dq_rev_heads, static_last_inputs=(0,), static_last_outputs=(0,))
        dq_acc = call(dq_acc, cu_q, q_start, sem)
    elif key.dq_tile:
        dq_acc = _dq_tiles_call(cfg, key, dq_acc, cu_q, q_start, t_q, h, d, q.dtype)
    grads = (dq_acc[..., :hd].astype(q.dtype), dk[..., :hd], dv_out[..., :hdv])
    return grads if rab is None else grads + (jnp.zeros_like(rab),)  # rab without elements


def _dq_tiles_call(cfg, key, dq_acc, cu_q, q_start, t_q, h, d, dtype):
    """dq ``(T_q, H, D)`` in ``dtype`` from the sm90 backward's query-tile workspace
    (``dq_tile``), reordered by kernels/hstu_dq_tiles.py (:func:`dq_from_tiles`: the same in
    jnp)."""
    call = _cutlass_call(cfg)(
        _dq_tiles_adapter(), output_shape_dtype=jax.ShapeDtypeStruct((t_q, h, d), dtype),
        compile_key=("hstu_dq_tiles", key.dtype, key.block_m, d, key.pdl,
                     key.dq_rev_heads), dtype=key.dtype,
        block_m=key.block_m, head_dim=d, pdl=key.pdl, rev_heads=key.dq_rev_heads,
        static_last_inputs=(0,), static_last_outputs=(0,))
    return call(dq_acc, cu_q, q_start)


def _bwd_convert_call(cfg, key, args, sem0, out_sds, q, t_q, h, d, cu_q, cu_k, q_start, hd,
                      hdv, rab):
    """:func:`hstu_bwd`'s kernels with ``dq_convert_rows``: the backward (it writes the dq of
    the sequences it converts), then the reordering kernel for the other sequences, into the
    same dq buffer."""
    n_seq = cu_q.shape[0] - 1
    cnt0 = jnp.zeros((n_seq, args[2].shape[1]), jnp.int32)  # (sequences, H_kv)
    dq_sds = jax.ShapeDtypeStruct((t_q, h, d), q.dtype)
    cnt_sds = jax.ShapeDtypeStruct(cnt0.shape, jnp.int32)
    if key.dq_claim and args[12] is None:
        call = _cutlass_call(cfg)(
            _bwd_convert_uninit_adapter(), output_shape_dtype=out_sds + (
                jax.ShapeDtypeStruct(sem0.shape, jnp.int32), cnt_sds, dq_sds),
            compile_key=("hstu_bwd_convert_uninit", key),
            input_output_aliases={12: 3, 13: 4}, cfg=key,
            static_last_inputs=(0, 1, 2, 3), static_last_outputs=(0, 1, 2, 5),
        )
        dk, dv_out, dq_acc, sem, _, dq = call(*args[:12], sem0, cnt0)
    else:
        sem_in = sem0 if key.dq_claim else jnp.zeros((1, 1, 2), jnp.int32)
        call = _cutlass_call(cfg)(
            _bwd_convert_adapter(), output_shape_dtype=out_sds + (
                jax.ShapeDtypeStruct(sem_in.shape, jnp.int32), cnt_sds, dq_sds),
            compile_key=("hstu_bwd_convert", key),
            input_output_aliases={12: 2, 13: 3, 14: 4}, cfg=key,
            static_last_inputs=(0, 1, 2, 3, 12), static_last_outputs=(0, 1, 2, 5),
        )
        dk, dv_out, dq_acc, sem, _, dq = call(*args, sem_in, cnt0)
    call = _cutlass_call(cfg)(
        _dq_tiles_convert_adapter(), output_shape_dtype=dq_sds,
        compile_key=("hstu_dq_tiles_convert", key.dtype, key.block_m, d, key.pdl, key.dq_claim,
                     key.dq_convert_rows),
        dtype=key.dtype, block_m=key.block_m, head_dim=d, pdl=key.pdl, claim=key.dq_claim,
        rows=key.dq_convert_rows, input_output_aliases={5: 0}, static_last_inputs=(0, 5),
        static_last_outputs=(0,))
    dq = call(dq_acc, cu_q, cu_k, q_start, sem, dq)
    grads = (dq[..., :hd], dk[..., :hd], dv_out[..., :hdv])
    return grads if rab is None else grads + (jnp.zeros_like(rab),)  # rab without elements


def dq_from_tiles(ws, cu_q, q_start, t_q, block_m, d):
    """The ``(T_q, H, D)`` fp32 dq of the sm90 backward's query-tile workspace (``dq_tile``).

    ``ws`` is ``(query tile slots, H, block_m * D)``: canonical query tile ``t`` of sequence
    ``b`` (slot ``q_start[b] + t``) holds blocks of 1024 floats (16 rows x 64 columns in
    the wgmma accumulator's register order: float ``4 (32 j + 4 g + q) + 2 h + e`` is row
    ``8 h + g``, column ``8 j + 2 q + e`` of the block). ``block_m = 64`` (D = 128: 8 blocks,
    D = 256: 16): block ``c = 4 cg + w`` holds rows ``16 w ..``, columns ``64 cg ..``;
    ``block_m = 128`` (D = 64, the warpgroups split the rows): block ``c = 4 wg + w`` holds
    rows ``64 wg + 16 w ..``. Token ``i`` of sequence
    ``b`` is row ``i - cu_q[b]`` of its sequence's tiles; rows past ``cu_q[-1]`` are zero. The
    jnp statement of what ``kernels/hstu_dq_tiles.py`` computes (tests)."""
    s, h = ws.shape[0], ws.shape[1]
    # (slot, H, wg, w, j, g, q, h8, e)
    # (slot, H, wg or column group cg, w, j, g, q, h8, e)
    x = ws.reshape(s, h, 2 if block_m == 128 else d // 64, 4, 8, 8, 4, 2, 2)
    if block_m == 128:  # rows (wg, w, h8, g), columns (j, q, e)
        x = x.transpose(0, 2, 3, 7, 5, 1, 4, 6, 8)
    else:  # rows (w, h8, g), columns (cg, j, q, e)
        x = x.transpose(0, 3, 7, 5, 1, 2, 4, 6, 8)
    x = x.reshape(s * block_m, h, d)
    tok = jnp.arange(t_q, dtype=jnp.int32)
    b = jnp.searchsorted(cu_q, tok, side="right").astype(jnp.int32) - 1
    b = jnp.clip(b, 0, cu_q.shape[0] - 2)
    rows = jnp.clip(q_start[b] * block_m + tok - cu_q[b], 0, s * block_m - 1)
    # rows past cu_q[-1] belong to no sequence: zeros
    return jnp.where((tok < cu_q[-1])[:, None, None], x[rows], 0.0)


def _bwd_rab_call(cfg, key, args, k, v, rab, drab_init, sem0=None):
    """The backward launch with rab: ``args`` are the 13 inputs of the launch without rab
    (the dq workspace last); returns ``(dk, dv, dq_acc, drab)`` (padded head dims).
    ``sem0``: the zeroed dq semaphores of the deterministic key."""
    b, _, n_k, _ = rab.shape
    shared_det = key.deterministic and not key.rab_per_head
    if key.rab_per_head:  # one writer per element: direct stores into rab's dtype
        drab0 = jnp.zeros(rab.shape, rab.dtype)
    elif shared_det:  # one writer per element of a per-head fp32 workspace; XLA sums heads
        drab0 = jnp.zeros((b, args[1].shape[1], n_k, n_k), jnp.float32)
    else:  # heads add into an fp32 workspace, rows padded to a multiple of 4 (16-byte
        # aligned: the vector reductions of both kernels)
        drab0 = jnp.zeros((b, 1, n_k, n_k + (-n_k) % 4), jnp.float32)
    if drab_init is not None:
        drab0 = drab_init.astype(drab0.dtype).reshape(drab0.shape)
    k_p, v_p, dq_acc0 = args[2], args[3], args[12]
    out_sds = (
        jax.ShapeDtypeStruct(k_p.shape, k.dtype),
        jax.ShapeDtypeStruct(v_p.shape, v.dtype),
        jax.ShapeDtypeStruct(dq_acc0.shape, jnp.float32),
        jax.ShapeDtypeStruct(drab0.shape, drab0.dtype),
    )
    # do, q, k, v and the dq workspace (input 12) / dk, dv, dq carry the key's head dims;
    # rab (13), drab (input 14 = output 3) and the semaphores have only runtime extents
    static = dict(static_last_inputs=(0, 1, 2, 3, 12), static_last_outputs=(0, 1, 2))
    if key.deterministic:
        call = _cutlass_call(cfg)(
            _bwd_rab_det_adapter(),
            output_shape_dtype=out_sds + (jax.ShapeDtypeStruct(sem0.shape, jnp.int32),),
            compile_key=("hstu_bwd_rab_det", key), input_output_aliases={12: 2, 14: 3, 15: 4},
            cfg=key, **static)
        dk, dv, dq_acc, drab, _ = call(*args, rab, drab0, sem0)
    else:
        call = _cutlass_call(cfg)(
            _bwd_rab_adapter(), output_shape_dtype=out_sds, compile_key=("hstu_bwd_rab", key),
            input_output_aliases={12: 2, 14: 3}, cfg=key, **static)
        dk, dv, dq_acc, drab = call(*args, rab, drab0)
    if shared_det and drab_init is None:
        # sum over the heads in a fixed order (elementwise adds, one fusion)
        drab = functools.reduce(jnp.add, [drab[:, i:i + 1] for i in range(drab.shape[1])])
        drab = drab.astype(rab.dtype)
    elif not key.rab_per_head and drab_init is None:
        drab = drab[..., :n_k].astype(rab.dtype)
    return dk, dv, dq_acc, drab
