"""cutlass_call adapters for the HSTU CuTe DSL kernels (see docs/design.md).

``hstu_fwd`` / ``hstu_bwd`` take ``jax.Array``s and the op's
:class:`~jax_sparse_attn.config.HSTUConfig`, return ``jax.Array``s, are traceable under
``jax.jit``, contain no ``custom_vjp`` and do no value validation (the public layer in
``jax_sparse_attn/hstu.py`` does). Every kernel launch goes onto XLA's stream through
``cutlass.jax.cutlass_call``; XLA owns all outputs and workspaces.

Runtime values (never compile keys): ``cu_seqlens_*``, the tile schedules derived from
them, window sizes, ``alpha``, ``1/scaling_seqlen`` travel as small device arrays.
Compile keys are the frozen ``HstuFwdConfig`` / ``HstuBwdConfig`` (dtype, head dims, tile
sizes, warps, forward implementation, has_func and the number of func endpoints) that the
public layer keeps in ``cfg.fwd`` / ``cfg.bwd``.

Kernels (``jax_sparse_attn/kernels``): ``hstu_fwd_sm80`` / ``hstu_bwd_sm80`` use warp-level
``mma.sync`` (SM80 atoms; they run on sm_80+ including the H200) with cp.async loads;
``hstu_fwd_sm90`` (wgmma, 2 consumer warpgroups) is the default forward in its ping-pong form
(``sm90pp``: the two warpgroups issue their GEMMs in turns so one's SiLU overlaps the other's
GEMMs). The switches ``hstu_fwd_impl``, ``hstu_fwd_tile`` and ``hstu_bwd_tile`` of
:class:`jax_sparse_attn.config.Switches` select the forward kernel and override the tiles;
:func:`fwd_config` / :func:`bwd_config` turn them into the compile keys. Default tiles:
sm80 forward 128 x 64 (D <= 128; 128 x 128 at D = 32; 64 x 64 at D = 256), 4 warps; wgmma
forwards 128 x 128 (64 keys at D = 256), 8 warps; backward 64 query rows x 128 keys, 8 warps
(64 x 64 at D = 256).

Schedules (built in :mod:`jax_sparse_attn.metadata`): the forward grid is ``(H, S)`` over
query tiles ordered longest-work-first (argsort of the visible key count); the backward grid is ``(H, S)`` over KV tiles in
canonical order. A pseudo-sequence appended to ``cu_seqlens`` covers rows past
``cu_seqlens[-1]`` so the kernels write zeros there.

Relative attention bias (``rab (B, H_rab, N_k, N_k)``, q's dtype or fp32): a presence flag
``has_rab`` (with ``rab_per_head`` = ``H_rab == H`` and rab's dtype) in both compile keys;
without rab the adapters, kernel arguments and generated code are exactly those of the
kernels without bias (PTX sha256-identical). The forwards with rab are ``RAB_FWD_IMPLS``;
another selected forward implementation is replaced by ``sm90pp`` (default tiles) when rab
is given. Backward: ``drab`` is written directly (rab's dtype, zero-initialised output) when
``H_rab == H``, else added over heads into an fp32 workspace ``(B, 1, N_k, N_k_pad)``
(``N_k_pad`` even for the 8-byte vector reductions) that XLA slices and casts.

Determinism: the forward and dk/dv are deterministic (each output element is written by
exactly one CTA with a fixed summation order). dq is accumulated in an fp32 workspace with
``red.global.add.f32`` from the CTAs of every KV tile that sees the query, so its low bits
depend on scheduling order (run-to-run differences at fp32 rounding level, before the
final cast to q's dtype); so does ``drab`` when ``H_rab = 1`` (per-head ``drab`` is
deterministic).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from .. import metadata

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
]

SUPPORTED_HEAD_DIMS = (32, 64, 128, 256)
_WGMMA_IMPLS = ("sm90", "sm90pp")
#: forward implementations with the relative attention bias; others fall back to sm90pp
RAB_FWD_IMPLS = ("sm90pp", "sm90", "sm80")
_RAB_FALLBACK_IMPL = "sm90pp"
_SMEM_BYTES = 227 * 1024


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

    # "sm80" (mma.sync), "sm90" (wgmma) or "sm90pp" (wgmma, ping-pong warpgroups)
    impl: str
    # relative attention bias: presence, H_rab == H, rab's dtype name ("" without rab)
    has_rab: bool = False
    rab_per_head: bool = False
    rab_dtype: str = ""


@dataclasses.dataclass(frozen=True)
class HstuBwdConfig(_HstuKey):
    """Compile key of the HSTU backward: static kernel properties only."""

    # relative attention bias, as in HstuFwdConfig
    has_rab: bool = False
    rab_per_head: bool = False
    rab_dtype: str = ""


def hstu_kernel_unsupported_reason(*, dtype, head_dim, head_dim_v) -> str | None:
    """``None`` if the CuTe DSL HSTU kernels handle this static configuration, else why not."""
    dt = jnp.dtype(dtype)
    if dt not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        return f"the HSTU kernels support float16 and bfloat16, got {dt}"
    for name, d in (("head_dim", head_dim), ("head_dim_v", head_dim_v)):
        if d not in SUPPORTED_HEAD_DIMS:
            return f"{name}={d} is not one of {SUPPORTED_HEAD_DIMS} (pad it first)"
    return None


def _cutlass_dtype_name(dtype) -> str:
    return "bfloat16" if jnp.dtype(dtype) == jnp.dtype(jnp.bfloat16) else "float16"


def _check_fwd_tile(impl, head_dim, head_dim_v, bm, bn, w):
    """The tile constraints of the forward kernels (ValueError naming the switch)."""
    if impl in _WGMMA_IMPLS:
        ok = bm == 128 and w == 8 and bn in (64, 128)
        need = "block_m=128, block_n in (64, 128), num_warps=8"
    else:
        smem = (bm * max(head_dim, head_dim_v) + bn * (head_dim + head_dim_v)) * 2
        ok = w in (2, 4, 8) and bm % (16 * w) == 0 and bn % 16 == 0 and smem <= _SMEM_BYTES
        need = ("num_warps in (2, 4, 8), block_m a multiple of 16 * num_warps, block_n a "
                f"multiple of 16, at most {_SMEM_BYTES} bytes of shared memory")
    if not ok:
        raise ValueError(f"JAX_SPARSE_ATTN_HSTU_FWD_TILE / Switches.hstu_fwd_tile="
                         f"{(bm, bn, w)} does not fit the {impl} forward at D={head_dim}, "
                         f"D_v={head_dim_v}: allowed are {need}")


def fwd_config(dtype, head_dim, head_dim_v, func_n, switches, *, has_rab=False,
               rab_per_head=False, rab_dtype="") -> HstuFwdConfig:
    """The forward compile key for padded head dims, ``func_n`` endpoint rows (0: no func)
    and the :class:`~jax_sparse_attn.config.Switches`; with ``has_rab`` a forward
    implementation outside :data:`RAB_FWD_IMPLS` is replaced by sm90pp (default tiles)."""
    d = max(head_dim, head_dim_v)
    impl = switches.hstu_fwd_impl
    tile = switches.hstu_fwd_tile
    if has_rab and impl not in RAB_FWD_IMPLS:
        impl, tile = _RAB_FALLBACK_IMPL, None
    if impl in _WGMMA_IMPLS:  # 2 consumer warpgroups x 64 query rows
        default = (128, 128 if d <= 128 else 64, 8)
    elif d <= 32:
        default = (128, 128, 4)
    elif d <= 128:
        default = (128, 64, 4)
    else:
        default = (64, 64, 4)
    bm, bn, w = tile or default
    _check_fwd_tile(impl, head_dim, head_dim_v, bm, bn, w)
    return HstuFwdConfig(_cutlass_dtype_name(dtype), head_dim, head_dim_v, bm, bn, w,
                         func_n > 0, max(func_n, 1), impl, bool(has_rab), bool(rab_per_head),
                         rab_dtype if has_rab else "")


def bwd_config(dtype, head_dim, head_dim_v, func_n, switches, *, has_rab=False,
               rab_per_head=False, rab_dtype="") -> HstuBwdConfig:
    """The backward compile key (see :func:`fwd_config`)."""
    # 64 x 128 (q rows x keys), 8 warps: dK/dV of 128 keys stay in registers for D <= 128;
    # D = 256 keeps 64 keys per CTA (register budget).
    default = (64, 128, 8) if max(head_dim, head_dim_v) <= 128 else (64, 64, 8)
    bm, bn, w = switches.hstu_bwd_tile or default
    return HstuBwdConfig(_cutlass_dtype_name(dtype), head_dim, head_dim_v, bm, bn, w,
                         func_n > 0, max(func_n, 1), bool(has_rab), bool(rab_per_head),
                         rab_dtype if has_rab else "")


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
        # one branch per value of the hstu_fwd_impl switch (config.SWITCHES)
        if cutlass.const_expr(cfg.impl == "sm80"):
            kernel = HstuFwdSm80(*args)
        elif cutlass.const_expr(cfg.impl in _WGMMA_IMPLS):
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
        # dq_acc and drab are aliased to outputs 2 and 3 (initialised by XLA)
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


def _has_elements(rab):
    """False when rab has no element (B = 0 or N_k = 0): every bias is then 0."""
    return rab is not None and rab.shape[0] > 0 and rab.shape[-1] > 0


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
    # pseudo-sequence B covers rows past cu_q[-1] (no keys): the kernel writes zeros there
    cu_q = metadata.append_pseudo_sequence(cu_seqlens_q, t_q)
    cu_k = metadata.append_pseudo_sequence(cu_seqlens_k, None)
    tiles = metadata.hstu_fwd_schedule(cu_q, cu_k, func, key.block_m, t_q, cfg.window_size)
    scal, win = metadata.hstu_scalars(cfg.alpha, cfg.scaling_seqlen, cfg.window_size)
    func_arr = func.astype(jnp.int32) if key.has_func else jnp.zeros((1, 1, 1), jnp.int32)
    out_sds = jax.ShapeDtypeStruct((t_q, h, cfg.head_dim_v_pad), q.dtype)
    args = (metadata.pad_last(q, cfg.head_dim_pad), metadata.pad_last(k, cfg.head_dim_pad),
            metadata.pad_last(v, cfg.head_dim_v_pad), cu_q, cu_k, tiles, func_arr, scal, win)
    if key.has_rab and _has_elements(rab):
        call = _cutlass_call()(_fwd_rab_adapter(), output_shape_dtype=out_sds,
                               compile_key=("hstu_fwd_rab", key), cfg=key)
        out = call(*args, rab)
    else:
        call = _cutlass_call()(_fwd_adapter(), output_shape_dtype=out_sds,
                               compile_key=("hstu_fwd", key), cfg=key)
        out = call(*args)
    return out[..., : cfg.head_dim_v]


def hstu_bwd(do, q, k, v, cu_seqlens_q, cu_seqlens_k, func, cfg, rab=None, _drab_init=None):
    """HSTU backward on the CuTe DSL kernel for the op config ``cfg`` (``cfg.bwd`` set;
    padding as in :func:`hstu_fwd`). Returns ``(dq, dk, dv)`` in the input dtype, and
    ``drab`` (rab's shape and dtype) as a fourth output when ``rab`` is given.

    ``_drab_init`` (tests only): the initial content of the buffer the kernel writes drab
    into (rab's shape and dtype when ``H_rab == H``, else the fp32 ``(B, 1, N_k, N_k_pad)``
    workspace, then returned unsliced and uncast) instead of zeros."""
    key = cfg.bwd
    t_q, h, _ = q.shape
    t_k = k.shape[0]
    if t_q == 0 or t_k == 0 or h == 0:
        zeros = (jnp.zeros_like(q), jnp.zeros_like(k), jnp.zeros_like(v))
        return zeros if rab is None else zeros + (jnp.zeros_like(rab),)
    d, dv = cfg.head_dim_pad, cfg.head_dim_v_pad
    do_p, q_p = metadata.pad_last(do, dv), metadata.pad_last(q, d)
    k_p, v_p = metadata.pad_last(k, d), metadata.pad_last(v, dv)
    # pseudo-sequence B covers keys past cu_k[-1] (no queries): zero dk/dv there
    cu_q = metadata.append_pseudo_sequence(cu_seqlens_q, None)
    cu_k = metadata.append_pseudo_sequence(cu_seqlens_k, t_k)
    kv_tiles, q_start, q_tiles = metadata.hstu_bwd_schedule(cu_q, cu_k, func, key.block_m,
                                                            key.block_n, t_q, t_k)
    scal, win = metadata.hstu_scalars(cfg.alpha, cfg.scaling_seqlen, cfg.window_size)
    func_arr = func.astype(jnp.int32) if key.has_func else jnp.zeros((1, 1, 1), jnp.int32)
    dq_acc0 = jnp.zeros((t_q, h, d), jnp.float32)
    hd, hdv = cfg.head_dim, cfg.head_dim_v
    if key.has_rab and _has_elements(rab):
        dk, dv_out, dq_acc, drab = _bwd_rab_call(
            key, (do_p, q_p, k_p, v_p, cu_q, cu_k, kv_tiles, q_start, q_tiles, func_arr, scal,
                  win, dq_acc0), k, v, rab, _drab_init)
        return dq_acc[..., :hd].astype(q.dtype), dk[..., :hd], dv_out[..., :hdv], drab
    out_sds = (
        jax.ShapeDtypeStruct(k_p.shape, k.dtype),
        jax.ShapeDtypeStruct(v_p.shape, v.dtype),
        jax.ShapeDtypeStruct((t_q, h, d), jnp.float32),
    )
    call = _cutlass_call()(
        _bwd_adapter(), output_shape_dtype=out_sds, compile_key=("hstu_bwd", key),
        input_output_aliases={12: 2}, cfg=key,
    )
    dk, dv_out, dq_acc = call(do_p, q_p, k_p, v_p, cu_q, cu_k, kv_tiles, q_start, q_tiles,
                              func_arr, scal, win, dq_acc0)
    grads = (dq_acc[..., :hd].astype(q.dtype), dk[..., :hd], dv_out[..., :hdv])
    return grads if rab is None else grads + (jnp.zeros_like(rab),)  # rab without elements


def _bwd_rab_call(key, args, k, v, rab, drab_init):
    """The backward launch with rab: ``args`` are the 13 inputs of the launch without rab
    (the dq workspace last); returns ``(dk, dv, dq_acc, drab)`` (padded head dims)."""
    b, _, n_k, _ = rab.shape
    if key.rab_per_head:  # one writer per element: direct stores into rab's dtype
        drab0 = jnp.zeros(rab.shape, rab.dtype)
    else:  # heads add into an fp32 workspace with even rows (8-byte vector reductions)
        drab0 = jnp.zeros((b, 1, n_k, n_k + n_k % 2), jnp.float32)
    if drab_init is not None:
        drab0 = drab_init.astype(drab0.dtype).reshape(drab0.shape)
    k_p, v_p, dq_acc0 = args[2], args[3], args[12]
    out_sds = (
        jax.ShapeDtypeStruct(k_p.shape, k.dtype),
        jax.ShapeDtypeStruct(v_p.shape, v.dtype),
        jax.ShapeDtypeStruct(dq_acc0.shape, jnp.float32),
        jax.ShapeDtypeStruct(drab0.shape, drab0.dtype),
    )
    call = _cutlass_call()(
        _bwd_rab_adapter(), output_shape_dtype=out_sds, compile_key=("hstu_bwd_rab", key),
        input_output_aliases={12: 2, 14: 3}, cfg=key,
    )
    dk, dv, dq_acc, drab = call(*args, rab, drab0)
    if not key.rab_per_head and drab_init is None:
        drab = drab[..., :n_k].astype(rab.dtype)
    return dk, dv, dq_acc, drab
