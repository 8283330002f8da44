"""cutlass_call adapters for the HSTU CuTe DSL kernels (see docs/design.md).

``hstu_fwd`` / ``hstu_bwd`` take and return ``jax.Array``s, are traceable under
``jax.jit``, contain no ``custom_vjp`` and do no value validation (the public layer in
``jax_sparse_attn/hstu.py`` does). Every kernel launch goes onto XLA's stream through
``cutlass.jax.cutlass_call``; XLA owns all outputs and workspaces.

Runtime values (never compile keys): ``cu_seqlens_*``, the tile schedules derived from
them, window sizes, ``alpha``, ``1/scaling_seqlen`` travel as small device arrays.
Compile keys are the frozen ``HstuFwdConfig`` / ``HstuBwdConfig`` (dtype, head dims, tile
sizes, warps, has_func and the number of func endpoints, a shape).

Kernels (``jax_sparse_attn/kernels``): ``hstu_fwd_sm80`` / ``hstu_bwd_sm80`` use warp-level
``mma.sync`` (SM80 atoms; they run on sm_80+ including the H200) with cp.async loads;
``hstu_fwd_sm90`` (wgmma, 2 consumer warpgroups) is the default forward in its ping-pong form
(``sm90pp``: the two warpgroups issue their GEMMs in turns so one's SiLU overlaps the other's
GEMMs); ``JAX_SPARSE_ATTN_HSTU_FWD_IMPL=sm80`` / ``sm90`` select the others. On the H200
(B=8 L=4096 H=4 D=128 causal bf16) the forward measured sm90pp 405, sm90 403, sm80 341 TFLOP/s. Default tiles: forward 128 x 64 (D <= 128;
128 x 128 at D = 32; 64 x 64 at D = 256), 4 warps; backward 64 query rows x 128 keys,
8 warps (64 x 64 at D = 256). ``JAX_SPARSE_ATTN_HSTU_{FWD,BWD}_TILE=bm,bn,warps``
overrides them (tuning only).

Schedules: the forward grid is ``(H, S)`` over query tiles ordered longest-work-first
(argsort of the visible key count); the backward grid is ``(H, S)`` over KV tiles in
canonical order. A pseudo-sequence appended to ``cu_seqlens`` covers rows past
``cu_seqlens[-1]`` so the kernels write zeros there.

Relative attention bias (``rab (B, H_rab, N_k, N_k)``, q's dtype or fp32): a presence flag
``has_rab`` (with ``rab_per_head`` = ``H_rab == H`` and rab's dtype) in both configs; without
rab the adapters, kernel arguments and generated code are exactly those of the kernels
without bias (PTX sha256-identical). The rab forwards are ``RAB_FWD_IMPLS``; another
selected forward impl is replaced by the default ``sm90pp`` when rab is given. Backward:
``drab`` is written directly (rab's dtype, zero-initialised output) when ``H_rab == H``, else
added over heads into an fp32 workspace ``(B, 1, N_k, N_k_pad)`` (``N_k_pad`` even for the
8-byte vector reductions) that XLA slices and casts.

Determinism: the forward and dk/dv are deterministic (each output element is written by
exactly one CTA with a fixed summation order). dq is accumulated in an fp32 workspace with
``red.global.add.f32`` from the CTAs of every KV tile that sees the query, so its low bits
depend on scheduling order (run-to-run differences at fp32 rounding level, before the
final cast to q's dtype); so does ``drab`` when ``H_rab = 1`` (per-head ``drab`` is deterministic).
"""

from __future__ import annotations

import dataclasses
import functools
import os

import jax
import jax.numpy as jnp

__all__ = [
    "SUPPORTED_HEAD_DIMS",
    "HstuFwdConfig",
    "HstuBwdConfig",
    "hstu_kernel_unsupported_reason",
    "hstu_fwd",
    "hstu_bwd",
    "fwd_config",
    "bwd_config",
]

SUPPORTED_HEAD_DIMS = (32, 64, 128, 256)
#: forward kernels selectable with JAX_SPARSE_ATTN_HSTU_FWD_IMPL
FWD_IMPLS = ("sm80", "sm90", "sm90pp")
#: the forward kernel used when JAX_SPARSE_ATTN_HSTU_FWD_IMPL is unset
DEFAULT_FWD_IMPL = "sm90pp"
#: forward kernels that implement the relative attention bias (others fall back to sm90pp)
RAB_FWD_IMPLS = ("sm80", "sm90", "sm90pp")
_BIG = 1 << 30


@dataclasses.dataclass(frozen=True)
class HstuFwdConfig:
    dtype: str
    head_dim: int
    head_dim_v: int
    block_m: int
    block_n: int
    num_warps: int
    has_func: bool
    func_n: int
    # "sm80" (mma.sync), "sm90" (wgmma) or "sm90pp" (wgmma, ping-pong warpgroups; default)
    impl: str = "sm90pp"
    # relative attention bias: presence, H_rab == H, rab's dtype name ("" without rab)
    has_rab: bool = False
    rab_per_head: bool = False
    rab_dtype: str = ""


@dataclasses.dataclass(frozen=True)
class HstuBwdConfig:
    dtype: str
    head_dim: int
    head_dim_v: int
    block_m: int
    block_n: int
    num_warps: int
    has_func: bool
    func_n: int
    has_rab: bool = False
    rab_per_head: bool = False
    rab_dtype: str = ""


def hstu_kernel_unsupported_reason(*, dtype, head_dim, head_dim_v, has_func: bool,
                                   paged: bool) -> str | None:
    """``None`` if the CuTe DSL HSTU kernels handle this static configuration, else why not."""
    del has_func
    dt = jnp.dtype(dtype)
    if dt not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        return f"the HSTU kernels support float16 and bfloat16, got {dt}"
    if paged:
        return "paged KV is not implemented in the HSTU kernels yet (use backend='reference')"
    for name, d in (("head_dim", head_dim), ("head_dim_v", head_dim_v)):
        if d not in SUPPORTED_HEAD_DIMS:
            return f"{name}={d} is not one of {SUPPORTED_HEAD_DIMS} (pad it first)"
    return None


def _cutlass_dtype_name(dtype) -> str:
    return "bfloat16" if jnp.dtype(dtype) == jnp.dtype(jnp.bfloat16) else "float16"


def _tile_override(name):
    """Tuning knob: ``JAX_SPARSE_ATTN_HSTU_{FWD,BWD}_TILE="block_m,block_n,num_warps"``."""
    v = os.environ.get(f"JAX_SPARSE_ATTN_HSTU_{name}_TILE")
    if not v:
        return None
    bm, bn, w = (int(x) for x in v.split(","))
    return bm, bn, w


def _rab_fields(rab, num_heads):
    if rab is None:
        return {}
    return dict(has_rab=True, rab_per_head=int(rab.shape[1]) == int(num_heads),
                rab_dtype=jnp.dtype(rab.dtype).name)


def fwd_config(dtype, head_dim, head_dim_v, has_func, func_n, *, has_rab=False,
               rab_per_head=False, rab_dtype="") -> HstuFwdConfig:
    d = max(head_dim, head_dim_v)
    if d <= 32:
        bm, bn, w = 128, 128, 4
    elif d <= 128:
        bm, bn, w = 128, 64, 4
    else:
        bm, bn, w = 64, 64, 4
    bm, bn, w = _tile_override("FWD") or (bm, bn, w)
    impl = os.environ.get("JAX_SPARSE_ATTN_HSTU_FWD_IMPL") or DEFAULT_FWD_IMPL
    if impl not in FWD_IMPLS:
        raise ValueError(f"JAX_SPARSE_ATTN_HSTU_FWD_IMPL={impl!r} is not one of {FWD_IMPLS}")
    if has_rab and impl not in RAB_FWD_IMPLS:
        impl = DEFAULT_FWD_IMPL
    if impl in ("sm90", "sm90pp"):  # wgmma kernels: 2 warpgroups x 64 query rows
        bm, w = 128, 8
        bn = 128 if d <= 128 else 64
    return HstuFwdConfig(_cutlass_dtype_name(dtype), head_dim, head_dim_v, bm, bn, w,
                         bool(has_func), int(func_n) if has_func else 1, impl,
                         bool(has_rab), bool(rab_per_head), rab_dtype if has_rab else "")


def bwd_config(dtype, head_dim, head_dim_v, has_func, func_n, *, has_rab=False,
               rab_per_head=False, rab_dtype="") -> HstuBwdConfig:
    # 64 x 128 (q rows x keys), 8 warps: dK/dV of 128 keys stay in registers for D <= 128;
    # D = 256 keeps 64 keys per CTA (register budget).
    default = (64, 128, 8) if max(head_dim, head_dim_v) <= 128 else (64, 64, 8)
    bm, bn, w = _tile_override("BWD") or default
    return HstuBwdConfig(_cutlass_dtype_name(dtype), head_dim, head_dim_v, bm, bn, w,
                         bool(has_func), int(func_n) if has_func else 1,
                         bool(has_rab), bool(rab_per_head), rab_dtype if has_rab else "")


# ----------------------------------------------------------------------------------------
# module-level @cute.jit adapters (stream first); imported lazily so that importing this
# module never requires CuTe DSL.
# ----------------------------------------------------------------------------------------


def _dt(name):
    """The CuTe DSL element type of a config's dtype name."""
    import cutlass  # noqa: PLC0415

    return cutlass.BFloat16 if name == "bfloat16" else cutlass.Float16


@functools.lru_cache(maxsize=None)
def _fwd_adapter():
    import cutlass  # noqa: PLC0415
    import cutlass.cute as cute  # noqa: PLC0415

    from ..kernels.hstu_fwd_sm80 import HstuFwdSm80  # noqa: PLC0415
    from ..kernels.hstu_fwd_sm90 import HstuFwdSm90  # noqa: PLC0415

    @cute.jit
    def hstu_fwd_launch(stream, q, k, v, cu_q, cu_k, tiles, func, scal, win, out,
                        *, cfg: cutlass.Constexpr):
        args = (_dt(cfg.dtype), cfg.head_dim, cfg.head_dim_v, cfg.block_m, cfg.block_n,
                cfg.num_warps, cfg.has_func, cfg.func_n)
        if cutlass.const_expr(cfg.impl == "sm80"):
            kernel = HstuFwdSm80(*args)
        else:
            kernel = HstuFwdSm90(*args, pingpong=cfg.impl == "sm90pp")
        kernel(q, k, v, cu_q, cu_k, tiles, func, scal, win, out, stream)

    return hstu_fwd_launch


@functools.lru_cache(maxsize=None)
def _fwd_rab_adapter():
    import cutlass  # noqa: PLC0415
    import cutlass.cute as cute  # noqa: PLC0415

    from ..kernels.hstu_fwd_sm80 import HstuFwdSm80  # noqa: PLC0415
    from ..kernels.hstu_fwd_sm90 import HstuFwdSm90  # noqa: PLC0415

    @cute.jit
    def hstu_fwd_rab_launch(stream, q, k, v, cu_q, cu_k, tiles, func, scal, win, rab, out,
                            *, cfg: cutlass.Constexpr):
        args = (_dt(cfg.dtype), cfg.head_dim, cfg.head_dim_v, cfg.block_m, cfg.block_n,
                cfg.num_warps, cfg.has_func, cfg.func_n)
        rab_kw = dict(has_rab=True, rab_per_head=cfg.rab_per_head)
        if cutlass.const_expr(cfg.impl == "sm80"):
            kernel = HstuFwdSm80(*args, **rab_kw)
        else:
            kernel = HstuFwdSm90(*args, pingpong=cfg.impl == "sm90pp", **rab_kw)
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
        # dq_acc and drab are aliased to outputs 2 and 3 (zero-initialised by XLA)
        HstuBwdSm80(_dt(cfg.dtype), cfg.head_dim, cfg.head_dim_v, cfg.block_m, cfg.block_n,
                    cfg.num_warps, cfg.has_func, cfg.func_n, has_rab=True,
                    rab_per_head=cfg.rab_per_head)(
            do, q, k, v, cu_q, cu_k, kv_tiles, q_tile_start, q_tiles, func, scal, win,
            dq_acc, dk, dv, stream, rab, drab)

    return hstu_bwd_rab_launch


@functools.lru_cache(maxsize=None)
def _bwd_adapter():
    import cutlass  # noqa: PLC0415
    import cutlass.cute as cute  # noqa: PLC0415

    from ..kernels.hstu_bwd_sm80 import HstuBwdSm80  # noqa: PLC0415

    @cute.jit
    def hstu_bwd_launch(stream, do, q, k, v, cu_q, cu_k, kv_tiles, q_tile_start, q_tiles,
                        func, scal, win, dq_acc, dk, dv, *, cfg: cutlass.Constexpr):
        # dq_acc is aliased to the third output (the fp32 dq workspace, zero-initialized).
        HstuBwdSm80(_dt(cfg.dtype), cfg.head_dim, cfg.head_dim_v, cfg.block_m, cfg.block_n,
                    cfg.num_warps, cfg.has_func, cfg.func_n)(
            do, q, k, v, cu_q, cu_k, kv_tiles, q_tile_start, q_tiles, func, scal, win,
            dq_acc, dk, dv, stream)

    return hstu_bwd_launch


def _cutlass_call():
    from cutlass.jax import cutlass_call  # noqa: PLC0415

    return cutlass_call


# ----------------------------------------------------------------------------------------
# tile schedules (tiny XLA ops on int32 metadata)
# ----------------------------------------------------------------------------------------


def _tiles_per_seq(cu, block):
    lens = cu[1:] - cu[:-1]
    return lens, (lens + block - 1) // block


def _canonical_tiles(cu, block, n_slots):
    """Slot s -> (batch, tile index in batch) in canonical order; batch = -1 past the end."""
    _, nt = _tiles_per_seq(cu, block)
    start = jnp.concatenate([jnp.zeros((1,), jnp.int32), jnp.cumsum(nt).astype(jnp.int32)])
    s = jnp.arange(n_slots, dtype=jnp.int32)
    b = (jnp.searchsorted(start, s, side="right", method="compare_all") - 1).astype(jnp.int32)
    nb = cu.shape[0] - 1
    b = jnp.clip(b, 0, max(nb - 1, 0))
    idx = s - start[b]
    valid = s < start[-1]
    return jnp.where(valid, b, -1), jnp.where(valid, idx, 0), start


def _func_tile_summary(func, cu_q, block, n_slots, t_q):
    """Per canonical q tile: [min interval start, max interval end, min F0] over its rows."""
    f = func[0, :, :t_q]  # (N, T_q)
    n = f.shape[0]
    starts = [jnp.where(f[0] > 0, 0, _BIG)]
    ends = [jnp.where(f[0] > 0, f[0], -_BIG)]
    for t in range((n - 1) // 2):
        a, e = f[2 * t + 1], f[2 * t + 2]
        ne = e > a
        starts.append(jnp.where(ne, a, _BIG))
        ends.append(jnp.where(ne, e, -_BIG))
    lo = functools.reduce(jnp.minimum, starts)
    hi = functools.reduce(jnp.maximum, ends)
    f0 = f[0]
    rows = jnp.arange(t_q, dtype=jnp.int32)
    b = (jnp.searchsorted(cu_q, rows, side="right") - 1).astype(jnp.int32)
    b = jnp.clip(b, 0, cu_q.shape[0] - 2)
    _, nt = _tiles_per_seq(cu_q, block)
    start = jnp.concatenate([jnp.zeros((1,), jnp.int32), jnp.cumsum(nt).astype(jnp.int32)])
    seg = start[b] + (rows - cu_q[b]) // block
    lo_t = jax.ops.segment_min(lo, seg, num_segments=n_slots)
    hi_t = jax.ops.segment_max(hi, seg, num_segments=n_slots)
    f0_t = jax.ops.segment_min(f0, seg, num_segments=n_slots)
    return jnp.stack([lo_t, hi_t, f0_t], axis=1).astype(jnp.int32)


def _fwd_schedule(cu_q, cu_k, func, cfg, t_q, window_size):
    """Per CTA row: ``[batch, m_block, lo, hi, f0]`` (batch -1: idle slot), longest work
    first (number of visible keys, stable argsort). Measured on the H200 at B=8, L=4096
    causal: 323 TFLOP/s with this order vs 294 with a sort-free reversed canonical order.
    """
    bm = cfg.block_m
    nb = cu_q.shape[0] - 1
    n_slots = t_q // bm + nb
    b, m, _ = _canonical_tiles(cu_q, bm, n_slots)
    bc = jnp.maximum(b, 0)
    lq = (cu_q[1:] - cu_q[:-1])[bc]
    lk = (cu_k[1:] - cu_k[:-1])[bc]
    if func is not None:
        summ = _func_tile_summary(func, cu_q, bm, n_slots, t_q)
        j_lo = jnp.maximum(summ[:, 0], 0)
        j_hi = jnp.minimum(summ[:, 1], lk)
    else:
        summ = jnp.zeros((n_slots, 3), jnp.int32)
        left, right = window_size
        off = lk - lq
        m0 = m * bm
        m1 = jnp.minimum(m0 + bm, lq)
        j_lo = jnp.maximum(m0 + off - left, 0) if left >= 0 else jnp.zeros_like(m0)
        j_hi = jnp.minimum(m1 + off + right, lk) if right >= 0 else lk
    work = jnp.where(b >= 0, jnp.maximum(j_hi - j_lo, 0) + 1, -1)
    order = jnp.argsort(-work, stable=True)
    tiles = jnp.concatenate([b[:, None], m[:, None], summ], axis=1).astype(jnp.int32)
    return tiles[order]


def _bwd_schedule(cu_q, cu_k, func, cfg, t_q, t_k):
    """KV tiles ``[batch, n_block]`` in canonical order (n ascending: under a causal /
    right-aligned mask the first KV tiles of a sequence see the most queries, so they
    start first), the canonical first q-tile index per batch, and the func summary."""
    bm, bn = cfg.block_m, cfg.block_n
    nb = cu_q.shape[0] - 1
    nk_slots = t_k // bn + nb
    nq_slots = t_q // bm + nb
    b, n, _ = _canonical_tiles(cu_k, bn, nk_slots)
    _, _, q_start = _canonical_tiles(cu_q, bm, nq_slots)
    if func is not None:
        q_tiles = _func_tile_summary(func, cu_q, bm, nq_slots, t_q)
    else:
        q_tiles = jnp.zeros((1, 3), jnp.int32)
    kv_tiles = jnp.stack([b, n], axis=1).astype(jnp.int32)
    return kv_tiles, q_start.astype(jnp.int32), q_tiles


def _append(cu, total):
    cu = cu.astype(jnp.int32)
    last = cu[-1:] if total is None else jnp.full((1,), total, jnp.int32)
    return jnp.concatenate([cu, last])


def _scalars(alpha, scaling_seqlen, window_size):
    scal = jnp.asarray([alpha * 0.5, 1.0 / scaling_seqlen], jnp.float32)
    win = jnp.asarray([int(window_size[0]), int(window_size[1])], jnp.int32)
    return scal, win


def _usable_rab(rab):
    """rab, or None when it has no element (B = 0 or N_k = 0: every bias is 0)."""
    if rab is None or rab.shape[0] == 0 or rab.shape[-1] == 0:
        return None
    return rab


def hstu_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, func, *, max_seqlen_q: int,
             max_seqlen_k: int, scaling_seqlen: float, window_size: tuple[int, int],
             alpha: float, rab=None):
    """HSTU forward on the CuTe DSL kernel. Returns ``out (T_q, H, D_v)`` in q's dtype.

    ``rab``: optional ``(B, H_rab, N_k, N_k)`` relative attention bias (module doc)."""
    del max_seqlen_q, max_seqlen_k
    t_q, h, d = q.shape
    dv = v.shape[-1]
    out_sds = jax.ShapeDtypeStruct((t_q, h, dv), q.dtype)
    if t_q == 0 or h == 0:
        return jnp.zeros(out_sds.shape, out_sds.dtype)
    has_func = func is not None
    rab = _usable_rab(rab)
    cfg = fwd_config(q.dtype, d, dv, has_func, func.shape[1] if has_func else 1,
                     **_rab_fields(rab, h))
    if k.shape[0] == 0:  # no keys anywhere: every row has no valid key
        return jnp.zeros(out_sds.shape, out_sds.dtype)
    # pseudo-sequence B covers rows past cu_q[-1] (no keys): the kernel writes zeros there
    cu_q = _append(cu_seqlens_q, t_q)
    cu_k = _append(cu_seqlens_k, None)
    tiles = _fwd_schedule(cu_q, cu_k, func, cfg, t_q, window_size)
    scal, win = _scalars(alpha, scaling_seqlen, window_size)
    func_arr = func.astype(jnp.int32) if has_func else jnp.zeros((1, 1, 1), jnp.int32)
    if rab is not None:
        call = _cutlass_call()(_fwd_rab_adapter(), output_shape_dtype=out_sds,
                               compile_key=("hstu_fwd_rab", cfg), cfg=cfg)
        return call(q, k, v, cu_q, cu_k, tiles, func_arr, scal, win, rab)
    fwd_launch = _fwd_adapter()
    call = _cutlass_call()(fwd_launch, output_shape_dtype=out_sds, compile_key=("hstu_fwd", cfg),
                           cfg=cfg)
    return call(q, k, v, cu_q, cu_k, tiles, func_arr, scal, win)


def hstu_bwd(do, q, k, v, cu_seqlens_q, cu_seqlens_k, func, *, max_seqlen_q: int,
             max_seqlen_k: int, scaling_seqlen: float, window_size: tuple[int, int],
             alpha: float, rab=None, _drab_init=None):
    """HSTU backward on the CuTe DSL kernel. Returns ``(dq, dk, dv)`` in the input dtype,
    and ``drab`` (rab's shape and dtype) as a fourth output when ``rab`` is given.

    ``_drab_init`` (tests only): the initial content of the drab buffer the kernel writes
    into (rab's shape and dtype when ``H_rab == H``, else the fp32 ``(B, 1, N_k, N_k_pad)``
    workspace, returned unsliced and uncast) instead of zeros."""
    del max_seqlen_q, max_seqlen_k
    t_q, h, d = q.shape
    t_k = k.shape[0]
    dv_dim = v.shape[-1]
    rab_in = rab
    rab = _usable_rab(rab)
    if t_q == 0 or t_k == 0 or h == 0:
        zeros = (jnp.zeros_like(q), jnp.zeros_like(k), jnp.zeros_like(v))
        return zeros if rab_in is None else zeros + (jnp.zeros_like(rab_in),)
    has_func = func is not None
    cfg = bwd_config(q.dtype, d, dv_dim, has_func, func.shape[1] if has_func else 1,
                     **_rab_fields(rab, h))
    # pseudo-sequence B covers keys past cu_k[-1] (no queries): zero dk/dv there
    cu_q = _append(cu_seqlens_q, None)
    cu_k = _append(cu_seqlens_k, t_k)
    kv_tiles, q_start, q_tiles = _bwd_schedule(cu_q, cu_k, func, cfg, t_q, t_k)
    scal, win = _scalars(alpha, scaling_seqlen, window_size)
    func_arr = func.astype(jnp.int32) if has_func else jnp.zeros((1, 1, 1), jnp.int32)
    dq_acc0 = jnp.zeros((t_q, h, d), jnp.float32)
    if rab is not None:
        return _hstu_bwd_rab(cfg, do, q, k, v, cu_q, cu_k, kv_tiles, q_start, q_tiles,
                             func_arr, scal, win, dq_acc0, rab, _drab_init)
    if rab_in is not None:  # rab without elements: its gradient is empty
        dq, dk, dv = _hstu_bwd_call(cfg, do, q, k, v, cu_q, cu_k, kv_tiles, q_start, q_tiles,
                                    func_arr, scal, win, dq_acc0)
        return dq, dk, dv, jnp.zeros_like(rab_in)
    return _hstu_bwd_call(cfg, do, q, k, v, cu_q, cu_k, kv_tiles, q_start, q_tiles, func_arr,
                          scal, win, dq_acc0)


def _hstu_bwd_rab(cfg, do, q, k, v, cu_q, cu_k, kv_tiles, q_start, q_tiles, func_arr, scal,
                  win, dq_acc0, rab, drab_init=None):
    b, _, n_k, _ = rab.shape
    if cfg.rab_per_head:
        drab0 = jnp.zeros(rab.shape, rab.dtype)
    else:
        drab0 = jnp.zeros((b, 1, n_k, n_k + n_k % 2), jnp.float32)
    if drab_init is not None:
        drab0 = drab_init.astype(drab0.dtype).reshape(drab0.shape)
    out_sds = (
        jax.ShapeDtypeStruct(k.shape, k.dtype),
        jax.ShapeDtypeStruct(v.shape, v.dtype),
        jax.ShapeDtypeStruct(dq_acc0.shape, jnp.float32),
        jax.ShapeDtypeStruct(drab0.shape, drab0.dtype),
    )
    call = _cutlass_call()(
        _bwd_rab_adapter(), output_shape_dtype=out_sds, compile_key=("hstu_bwd_rab", cfg),
        input_output_aliases={12: 2, 14: 3}, cfg=cfg,
    )
    dk, dv, dq_acc, drab = call(do, q, k, v, cu_q, cu_k, kv_tiles, q_start, q_tiles, func_arr,
                                scal, win, dq_acc0, rab, drab0)
    if not cfg.rab_per_head and drab_init is None:
        drab = drab[..., :n_k].astype(rab.dtype)
    return dq_acc.astype(q.dtype), dk, dv, drab


def _hstu_bwd_call(cfg, do, q, k, v, cu_q, cu_k, kv_tiles, q_start, q_tiles, func_arr, scal,
                   win, dq_acc0):
    t_q, h, d = q.shape
    bwd_launch = _bwd_adapter()
    out_sds = (
        jax.ShapeDtypeStruct(k.shape, k.dtype),
        jax.ShapeDtypeStruct(v.shape, v.dtype),
        jax.ShapeDtypeStruct((t_q, h, d), jnp.float32),
    )
    call = _cutlass_call()(
        bwd_launch, output_shape_dtype=out_sds, compile_key=("hstu_bwd", cfg),
        input_output_aliases={12: 2}, cfg=cfg,
    )
    dk, dv, dq_acc = call(do, q, k, v, cu_q, cu_k, kv_tiles, q_start, q_tiles, func_arr,
                          scal, win, dq_acc0)
    return dq_acc.astype(q.dtype), dk, dv
