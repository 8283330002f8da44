"""HSTU attention: public API (validate -> static config -> custom_vjp -> backend).

Semantics (source: the HSTU paper, Zhai et al. 2024, arXiv 2402.17152, and Meta's
generative-recommenders kernels): for each packed sequence ``b`` and head ``h``, with
``S = alpha * q_i . k_j``::

    out_i = sum_j M_ij * SiLU(S_ij) * v_j / scaling_seqlen

with fp32 accumulation and no softmax. Queries are bottom-right aligned: local query
``i`` of a sequence with ``L_q`` queries and ``L_k`` keys sits at key position
``p = i + L_k - L_q``. ``window_size=(left, right)`` keeps key ``j`` iff
``p - left <= j <= p + right`` (``-1`` = unbounded side) and ``0 <= j < L_k``:
``(-1, -1)`` full, ``(-1, 0)`` causal, finite = local. An arbitrary interval mask
``func`` (int32 ``(1, N, L_f)``, N odd) keeps, for global packed query row ``r`` with
``F_t = func[0, t, r]``, the keys ``[0, F_0) U [F_1, F_2) U [F_3, F_4) U ...``
intersected with ``[0, L_k)`` (intervals may overlap, any order).

Relative attention bias (``rab``, the HSTU paper's learned position/time bias; FBGEMM's
HSTU kernel convention): ``rab`` of shape ``(B, H_rab, max_seqlen_k, max_seqlen_k)`` with
``H_rab`` in {1, H} is added to every score before the SiLU::

    out_i = sum_j M_ij * SiLU(alpha * q_i . k_j + rab[b, h % H_rab, p, j]) * v_j / scaling_seqlen

with ``p = i + L_k - L_q`` the bottom-right aligned key position of query ``i``. With
``alpha = 1`` this is the ``alpha * (q . k + rab)`` form of other implementations; for
another alpha pass ``alpha * rab`` to get that form. The gradient
``d rab[b, h, p, j] = M_ij * SiLU'(s_ij) * (dO_i . v_j) / scaling_seqlen`` is summed over
heads when ``H_rab = 1`` and is zero where masked or outside the sequences.
:mod:`jax_sparse_attn.bias` builds the paper's position and time-bucket biases.
"""

from __future__ import annotations

import dataclasses
import warnings
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from . import _backend, _platform, _transforms, metadata, reference
from ._results import HSTUBackwardRabResult, HSTUBackwardResult, HSTUForwardResult
from .config import HSTUConfig
from .validation import (
    _hstu_value_checks,
    _shape,
    as_array_arg,
    canonical_dtype,
    check_debug_checks,
    check_deterministic,
    check_hstu_args,
    check_kv_splits,
    is_concrete,
    require_values,
    run_time_value_checks,
    validate_hstu_inputs,
)

__all__ = ["hstu_attention", "hstu_attention_forward", "hstu_attention_backward", "HSTUConfig"]


def _padded_dims(cfg, mod):
    """The head dims the kernels run at: the true ones rounded up to a supported dim."""
    dims = mod.SUPPORTED_HEAD_DIMS
    return (metadata.padded_head_dim(cfg.head_dim, dims),
            metadata.padded_head_dim(cfg.head_dim_v, dims))


def _passes(cfg, op_name):
    """The kernel passes a call of ``op_name`` may run: the paged forward is inference only,
    ``hstu_attention_backward`` runs the backward, ``hstu_attention`` both."""
    if cfg.paged:
        return ("fwd",)
    return ("bwd",) if op_name.endswith("_backward") else ("fwd", "bwd")


def _kernel_unsupported_reason(cfg, passes, switches, mod):
    d_pad, dv_pad = _padded_dims(cfg, mod)
    if d_pad is None or dv_pad is None:
        return (f"head dims D={cfg.head_dim}, D_v={cfg.head_dim_v}: the kernels support head "
                f"dims up to {max(mod.SUPPORTED_HEAD_DIMS)}")
    if cfg.paged:
        if not hasattr(mod, "paged_unsupported_reason"):
            return "the HSTU kernel backend has no paged-KV forward (hstu_fwd_paged)"
        reason = mod.paged_unsupported_reason(d_pad, dv_pad, switches)
        if reason is not None:
            return reason
    if cfg.kv_group > 1:
        if not hasattr(mod, "gqa_unsupported_reason"):
            return "the HSTU kernel backend has no grouped KV heads (H_kv < H)"
        reason = mod.gqa_unsupported_reason(d_pad, dv_pad, cfg.has_rab, switches, cfg.paged)
        if reason is not None:
            return reason
        if getattr(cfg, "deterministic", False) and not cfg.paged:
            return ("grouped KV heads (H_kv < H) with deterministic=True: the deterministic "
                    "sm90 backward orders dq per query head and has no GQA")
    return mod.hstu_kernel_unsupported_reason(dtype=cfg.dtype, head_dim=d_pad, head_dim_v=dv_pad,
                                              passes=passes, switches=switches)


def _make_config(q, k, v, cu_seqlens_q, cu_seqlens_k, func, paged_kv, page_ids, page_indptrs,
                 *, max_seqlen_q, max_seqlen_k, scaling_seqlen, window_size, alpha, backend,
                 switches, op_name, debug_checks=False, rab=None,
                 deterministic=False, kv_splits="auto", extra_checks=None) -> HSTUConfig:
    """Validate the arguments and build the call's one static config (backend chosen,
    head-dim padding and kernel compile keys decided). ``extra_checks(cfg)``: the caller's
    checks of its other arguments, run before the backend is chosen (so that
    ``which_backend`` raises their errors too)."""
    _backend.check_backend(backend)
    switches = _backend.check_switches(switches)
    debug_checks = check_debug_checks(debug_checks)
    deterministic = check_deterministic(deterministic)
    kv_splits = check_kv_splits(kv_splits)
    cfg = check_hstu_args(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                          max_seqlen_k=max_seqlen_k, scaling_seqlen=scaling_seqlen,
                          window_size=window_size, alpha=alpha, func=func, paged_kv=paged_kv,
                          page_ids=page_ids, page_indptrs=page_indptrs, rab=rab)
    cfg = dataclasses.replace(cfg, deterministic=deterministic)
    require_values(cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, func=func,
                   page_ids=page_ids, page_indptrs=page_indptrs)
    if is_concrete(cu_seqlens_q, cu_seqlens_k, func, page_ids, page_indptrs):
        _hstu_value_checks(q, k, cu_seqlens_q, cu_seqlens_k, func, paged_kv, page_ids,
                           page_indptrs, cfg)
    else:
        if is_concrete(cu_seqlens_q, cu_seqlens_k):
            # concrete cu_seqlens beside a traced func or page table: check what is concrete
            # eagerly (also with debug_checks, which stages the checks of all of them below)
            pages_concrete = is_concrete(page_ids, page_indptrs)
            _hstu_value_checks(q, k, cu_seqlens_q, cu_seqlens_k,
                               func if is_concrete(func) else None, paged_kv,
                               page_ids, page_indptrs, cfg, check_pages=pages_concrete)
        if debug_checks:
            shapes = tuple(None if x is None else jax.ShapeDtypeStruct(x.shape, x.dtype)
                           for x in (q, k, paged_kv))

            def check(cu_q, cu_k, f, ids, ptrs):
                _hstu_value_checks(shapes[0], shapes[1], cu_q, cu_k, f, shapes[2], ids, ptrs,
                                   cfg)

            run_time_value_checks(check, cu_seqlens_q, cu_seqlens_k, func, page_ids,
                                  page_indptrs,
                                  names=("cu_seqlens_q", "cu_seqlens_k", "func", "page_ids",
                                         "page_indptrs"))
    if extra_checks is not None:
        extra_checks(cfg)
    passes = _passes(cfg, op_name)
    mod = _backend.select(backend, op_name, "hstu",
                          partial(_kernel_unsupported_reason, cfg, passes, switches),
                          switches=switches)
    if mod is None:
        return cfg
    d_pad, dv_pad = _padded_dims(cfg, mod)
    splits = 1
    if "fwd" in passes and hasattr(mod, "resolve_kv_splits"):
        splits = mod.resolve_kv_splits(
            kv_splits, batch=int(cu_seqlens_q.shape[0]) - 1, num_heads=cfg.num_heads,
            max_seqlen_q=cfg.max_seqlen_q, max_seqlen_k=cfg.max_seqlen_k,
            impl=switches.hstu_fwd_impl)
    extra = dict(({"paged": True} if cfg.paged else {}),
                 **({"kv_splits": splits} if splits > 1 else {}),
                 **({"max_seqlen_q": int(cfg.max_seqlen_q)} if "fwd" in passes else {}))
    # the compile keys of the passes this call may run (a pass that cannot run here is None)
    fwd = bwd = None
    if "fwd" in passes:
        fwd = mod.fwd_config(cfg.dtype, d_pad, dv_pad, cfg.func_n, switches, **_rab_key(cfg),
                             **extra)
    if "bwd" in passes:
        bwd = mod.bwd_config(cfg.dtype, d_pad, dv_pad, cfg.func_n, switches, **_det_key(cfg),
                             **_rab_key(cfg))
    return dataclasses.replace(
        cfg, backend="kernel", head_dim_pad=d_pad, head_dim_v_pad=dv_pad,
        cute_call=switches.cute_call, kv_splits=splits, schedule=switches.hstu_schedule,
        fwd=fwd, bwd=bwd, kernel_arch=_platform.resolved_arch(),
        kernel_family=_platform.kernel_family(switches))


def _det_key(cfg):
    """The deterministic part of the backward compile key (nothing in the default mode)."""
    return {"deterministic": True} if cfg.deterministic else {}


def _rab_key(cfg):
    """The rab part of the kernel compile keys (nothing without rab)."""
    if not cfg.has_rab:
        return {}
    return dict(has_rab=True, rab_per_head=cfg.rab_per_head, rab_dtype=cfg.rab_dtype)


def _i32(x):
    if x is None:
        return None
    return x if jnp.dtype(x.dtype) == jnp.int32 else jnp.asarray(x).astype(jnp.int32)


def _ref_options(cfg):
    """The semantic options in the keyword form of the :mod:`~jax_sparse_attn.reference` API."""
    return dict(max_seqlen_q=cfg.max_seqlen_q, max_seqlen_k=cfg.max_seqlen_k,
                scaling_seqlen=cfg.scaling_seqlen, window_size=cfg.window_size, alpha=cfg.alpha)


def _ffi():
    from .ffi import hstu as ffi_hstu  # noqa: PLC0415 (lazy: only on the kernel path)

    return ffi_hstu


def _rab_kw(rab):
    return {} if rab is None else {"rab": rab}


#: score elements per head below which the reference's cost is never worth a warning
_LOOSE_BOUND_MIN_WORK = 1 << 26


def _warn_loose_bounds(cfg, q, k, cu_q):
    """A UserWarning (at trace time) when the reference backend's work per head (the
    score elements of :func:`reference.hstu_ref_tiles`: its query tiles times
    ``min(max_seqlen_k, T_k)`` key slots) is over 8x an upper bound of the real work
    (``min(T_q max_seqlen_k, max_seqlen_q T_k, T_q T_k)``) and over 2**26: the bounds are
    much looser than the packed lengths allow."""
    b = cu_q.shape[-1] - 1
    if cu_q.ndim == 2:
        b *= cu_q.shape[0]
    t_q, t_k = q.shape[0], k.shape[0]
    if not all(isinstance(n, int) for n in (b, t_q, t_k)):
        return  # symbolic shapes (jax.export): nothing to compare
    mq, mk = cfg.max_seqlen_q, cfg.max_seqlen_k
    if cu_q.ndim == 2:  # per shard: each shard's reference call sees its own slice
        t_q_s, t_k_s, b_s = t_q // cu_q.shape[0], t_k // cu_q.shape[0], cu_q.shape[-1] - 1
        tile, n_keys, items = reference.hstu_ref_tiles(b_s, t_q_s, t_k_s, mq, mk)
        items *= cu_q.shape[0]
    else:
        tile, n_keys, items = reference.hstu_ref_tiles(b, t_q, t_k, mq, mk)
    work = items * tile * n_keys
    real = min(t_q * mk, mq * t_k, t_q * t_k)
    if work > _LOOSE_BOUND_MIN_WORK and work > 8 * real:
        warnings.warn(
            f"hstu_attention (reference backend): max_seqlen_q={mq}, max_seqlen_k={mk} make "
            f"the reference evaluate {items} query tiles of {tile} rows x {n_keys} keys "
            f"({work:.3g} scores per head), over {work // max(real, 1)}x what {t_q} packed "
            f"queries and {t_k} keys can need: the reference gives each sequence whole tiles "
            f"and each tile min(max_seqlen_k, T_k) key slots. If the bounds are looser than "
            f"the real lengths, pass tighter max_seqlen_q / max_seqlen_k; the GPU kernels' "
            f"work follows the real lengths", UserWarning, stacklevel=2)


def _fwd_backend(cfg, q, k, v, cu_q, cu_k, func, rab=None):
    if cfg.backend == "kernel":
        return _ffi().hstu_fwd(q, k, v, cu_q, cu_k, func, cfg, **_rab_kw(rab))
    _warn_loose_bounds(cfg, q, k, cu_q)
    return reference.hstu_attention_ref(q, k, v, cu_q, cu_k, func, **_ref_options(cfg),
                                        **_rab_kw(rab))


def _bwd_backend(cfg, do, q, k, v, cu_q, cu_k, func, rab=None):
    """``(dq, dk, dv)``, or ``(dq, dk, dv, drab)`` with ``rab``."""
    if cfg.backend == "kernel":
        return _ffi().hstu_bwd(do, q, k, v, cu_q, cu_k, func, cfg, **_rab_kw(rab))
    _warn_loose_bounds(cfg, q, k, cu_q)
    return reference.hstu_attention_bwd_ref(do, q, k, v, cu_q, cu_k, func, **_ref_options(cfg),
                                            **_rab_kw(rab))


# jax.vmap folds the mapped axis into the packed token axis (jax_sparse_attn/_transforms.py)
def _fwd_impl(cfg, q, k, v, cu_q, cu_k, func, rab=None):
    return _transforms.hstu_fwd(cfg, _fwd_backend)(q, k, v, cu_q, cu_k, func, rab)


def _bwd_impl(cfg, do, q, k, v, cu_q, cu_k, func, rab=None):
    """``(dq, dk, dv)``, or ``(dq, dk, dv, drab)`` with ``rab``."""
    return _transforms.hstu_bwd(cfg, _bwd_backend)(do, q, k, v, cu_q, cu_k, func, rab)


@partial(jax.custom_vjp, nondiff_argnums=(0,))
def _hstu(cfg, q, k, v, cu_q, cu_k, func, rab):
    return _fwd_impl(cfg, q, k, v, cu_q, cu_k, func, rab)


def _hstu_vjp_fwd(cfg, q, k, v, cu_q, cu_k, func, rab):
    return _fwd_impl(cfg, q, k, v, cu_q, cu_k, func, rab), (q, k, v, cu_q, cu_k, func, rab)


def _hstu_vjp_bwd(cfg, res, do):
    q, k, v, cu_q, cu_k, func, rab = res
    grads = _bwd_impl(cfg, do, q, k, v, cu_q, cu_k, func, rab)
    drab = grads[3] if rab is not None else None
    return grads[0], grads[1], grads[2], None, None, None, drab


_hstu.defvjp(_hstu_vjp_fwd, _hstu_vjp_bwd)
# jit with the config static: eager calls compile once per (config, shapes) instead of
# dispatching op by op; inside an outer jit this is inlined.
_hstu_jit = jax.jit(_hstu, static_argnums=(0,))
_bwd_jit = jax.jit(_bwd_impl, static_argnums=(0,))


def _paged_backend(cfg, q, paged_kv, page_ids, page_indptrs, cu_q, cu_k):
    if cfg.backend == "kernel":
        # the paged-KV kernel hook (docs/design.md): ffi.hstu.hstu_fwd_paged, same contract
        # as hstu_fwd with the pages in place of k and v
        return _ffi().hstu_fwd_paged(q, paged_kv, page_ids, page_indptrs, cu_q, cu_k, cfg)
    return reference.hstu_attention_ref(q, None, None, cu_q, cu_k, None, paged_kv=paged_kv,
                                        page_ids=page_ids, page_indptrs=page_indptrs,
                                        **_ref_options(cfg))


# jax.vmap folds the mapped axis into the packed token axis and the page table
def _paged_impl(cfg, q, paged_kv, page_ids, page_indptrs, cu_q, cu_k):
    return _transforms.hstu_fwd_paged(cfg, _paged_backend)(q, paged_kv, page_ids,
                                                           page_indptrs, cu_q, cu_k)


_PAGED_GRAD_MSG = (
    "hstu_attention with paged_kv is forward-only (inference): it cannot be differentiated "
    "(jax.grad/jax.vjp/jax.jvp). Pass k and v as packed (T_k, H, D) arrays instead of "
    "paged_kv to differentiate."
)


@partial(jax.custom_vjp, nondiff_argnums=(0,))
def _hstu_paged(cfg, q, paged_kv, page_ids, page_indptrs, cu_q, cu_k):
    return _paged_impl(cfg, q, paged_kv, page_ids, page_indptrs, cu_q, cu_k)


def _paged_vjp_fwd(cfg, *args):
    raise NotImplementedError(_PAGED_GRAD_MSG)


def _paged_vjp_bwd(cfg, res, do):  # pragma: no cover - the forward rule already raised
    raise NotImplementedError(_PAGED_GRAD_MSG)


_hstu_paged.defvjp(_paged_vjp_fwd, _paged_vjp_bwd)
_hstu_paged_jit = jax.jit(_hstu_paged, static_argnums=(0,))


_SEMANTICS_DOC = """
    Semantics: the HSTU paper (Zhai et al. 2024, arXiv 2402.17152) and Meta's
    generative-recommenders kernels; see the module docstring and ``docs/hstu.md``.

    Non-finite values: rows outside every sequence (past ``cu_seqlens[-1]``, unused page
    slots) never reach a result, whatever they hold. Inside a sequence NaN / Inf are data:
    a masked pair's weight is selected to 0 before SiLU, but the weighted sum over ``v``
    still multiplies that 0 by ``v_j`` (``0 * NaN = NaN``, as in FlashAttention-style
    kernels), so a NaN / Inf ``v_j`` can reach rows of the same sequence that do not see
    key ``j`` (on the kernels only rows whose key tiles hold ``j``); in the backward the
    same holds for ``k_j``, and for a row's ``q`` and ``do`` towards ``dk`` / ``dv``
    (``docs/hstu.md``).
"""

_ARG_LINES = """
      q: ``(T_q, H, D)`` queries, float16 or bfloat16 (float32/float64 are accepted and
        run on the reference backend). All sequences packed along axis 0 (THD layout).
      k: ``(T_k, H_kv, D)`` keys, same dtype; ``None`` with ``paged_kv``. ``H_kv`` divides
        ``H`` (``H_kv < H``: grouped-query / multi-query attention, query head ``h`` reads
        KV head ``h // (H / H_kv)``; on the kernel backend this needs the sm90ws forward and
        the sm90 backward).
      v: ``(T_k, H_kv, D_v)`` values, same dtype; ``None`` with ``paged_kv``.
      cu_seqlens_q: ``(B+1,)`` int32, starts at 0, non-decreasing: sequence ``b``'s
        queries are ``q[cu_seqlens_q[b]:cu_seqlens_q[b+1]]`` (zero lengths allowed).
        Other integer dtypes (e.g. NumPy int64) are converted to int32 (the values must
        fit; the eager value check verifies it for concrete arrays).
      cu_seqlens_k: ``(B+1,)`` int32, the same for keys/values. Both may instead be
        per-shard ``(num_shards, B_local+1)`` arrays with shard-local offsets, row ``s``
        packing tokens ``[s*T/num_shards, (s+1)*T/num_shards)`` (``func`` then
        ``(num_shards, N, L_local)``; see :mod:`jax_sparse_attn.sharding`).
      max_seqlen_q: static Python int >= every query length (compile-time bound),
        at most ``2**31 - 1``. Keep both bounds tight: the reference backend (CPU, and any
        call the kernels do not take) evaluates each sequence's query tiles (up to 128 rows,
        about ``T_q / tile + B`` tiles) against ``min(max_seqlen_k, T_k)`` key slots
        (``max_seqlen_k`` with a paged cache), so its work grows with about
        ``(T_q + tile B) * min(max_seqlen_k, T_k)``; the kernels' work follows the real
        lengths.
      max_seqlen_k: static Python int >= every key length, at most ``2**31 - 1``.
      scaling_seqlen: positive Python number dividing the output (it and
        ``1 / scaling_seqlen`` finite in float32: about 2.9e-39 to 3.4e38); default
        ``max_seqlen_q`` (1 when ``max_seqlen_q`` is 0).
      window_size: ``(left, right)`` Python ints >= -1 (-1 = unbounded), relative to the
        bottom-right aligned query position; default ``(-1, 0)`` (causal). A side
        ``>= max_seqlen_q + max_seqlen_k`` (when that is > 0) or ``>= 2**31 - 1`` reaches
        every key and means the same as -1.
      alpha: Python number scaling ``q . k`` (finite in float32); default 1.0.
      func: optional int32 ``(1, N, L_f)``, N odd, ``L_f >= T_q + 256``: arbitrary
        interval mask (see module doc; :mod:`jax_sparse_attn.masks` builds common
        ones). Requires ``window_size=(-1, -1)`` and no paged KV. Values are key
        positions in ``[0, max_seqlen_k]``: concrete values outside raise ``ValueError``;
        traced ones (under ``jax.jit`` or ``jax.vmap``, unless ``debug_checks``) are not
        checked and mean what the module doc says (each interval intersected with ``[0, L_k)``, so a value
        below 0 acts as 0 and one above ``L_k`` as ``L_k``). Default None.
      rab: optional relative attention bias ``(B, H_rab, max_seqlen_k, max_seqlen_k)``,
        ``H_rab`` in {1, H}, q's dtype or float32: ``rab[b, h % H_rab, p, j]`` is added to
        ``alpha * q_i . k_j`` of query ``i`` (key position ``p = i + L_k - L_q``) and key
        ``j`` (module doc; FBGEMM HSTU convention). Every sequence needs ``L_q <= L_k``
        (checked eagerly for concrete ``cu_seqlens``; under jit a row with ``p < 0`` gets
        bias 0). Differentiable. Not with paged KV. Default None (no bias code is compiled).
        On the kernel backend both forwards (``sm90ws``, the default, and ``sm80``) add the
        bias (docs/hstu.md)."""

_PAGED_ARG_LINES = """
      paged_kv: optional ``(num_pages, 2, 128, H_kv, D)`` paged KV cache (index 0 = K,
        1 = V; ``H_kv`` divides ``H``); forward only, causal only. Then ``k``/``v`` must be
        None. Default None. The kernel backend (sm90ws forward) reads the pages in place.
      page_ids: ``(P,)`` int32 page numbers in ``[0, num_pages)``; sequence ``b`` uses
        pages ``page_ids[page_indptrs[b]:page_indptrs[b+1]]`` concatenated, truncated to
        ``L_k`` from ``cu_seqlens_k`` (at least ``ceil(L_k / 128)`` of them; pages may be
        shared between sequences).
      page_indptrs: ``(B+1,)`` int32, starts at 0, non-decreasing, last entry <= P. Like
        ``cu_seqlens``, Python lists and other integer dtypes are converted to int32;
        the values are checked eagerly for concrete arrays.
      kv_splits: ``"auto"`` (default) or a static int in [1, 16]: split-KV of the sm90ws
        forward kernel (short queries over long histories: the keys of each query tile are
        split over this many work items, whose fp32 partial outputs are added in a fixed
        order; HSTU has no softmax to rescale). ``"auto"`` splits only when the query tiles
        x heads fill less than one wave of the GPU (``docs/hstu.md``). Same result up to
        fp32 rounding; the reference backend and the sm80 forward ignore it."""

_BACKEND_ARG_LINES = """
      backend: ``"auto"`` (default: CuTe DSL kernel on a GPU of compute capability 8.0,
        8.6, 8.9, 9.0, 10.0, 10.3 or 12.0 when it supports the call there, else the
        pure-JAX reference; docs/support.md), ``"kernel"`` or ``"reference"``.
      switches: optional :class:`jax_sparse_attn.config.Switches` choosing the kernel
        implementations and tiles (kernel backend only); default None reads them from the
        ``JAX_SPARSE_ATTN_*`` environment variables (:func:`jax_sparse_attn.config.from_env`).
      debug_checks: bool, default False. The metadata values (``cu_seqlens_*``, ``func``,
        paged-KV pages) are always checked eagerly when they are concrete; with
        ``debug_checks=True`` they are also checked when traced (inside ``jax.jit``, or
        batched by ``jax.vmap``, even in an eager call),
        on the host at run time (``jax.debug.callback``, a device-to-host copy per call):
        bad values then raise ``jax.errors.JaxRuntimeError`` carrying the eager
        validator's message under ``jax.jit`` (in an eager ``jax.vmap`` the callback runs
        at once and raises the validator's ``ValueError`` itself). Without it, bad traced
        metadata give unspecified values (never an out-of-bounds access). ``jax.export``
        cannot serialize the host callback: export with ``debug_checks=False`` (exporting
        a call that checks traced metadata raises ``NotImplementedError``).
      deterministic: static bool, default False. With True the backward's gradients
        (dq, dk, dv and drab) are bitwise reproducible run to run on the kernel backend:
        the dq contributions of the KV tiles of a query tile are added in a fixed order
        (ascending KV tile, a semaphore per query tile and head; FlashAttention-3's
        deterministic backward), and with ``H_rab = 1`` drab is summed over heads by XLA
        instead of atomics. It costs backward speed (docs/hstu.md gives the measured
        ratio); dk, dv and the forward are deterministic in both modes. The reference
        backend accepts it and runs unchanged (dense XLA ops, no scatter-adds).
"""

_ARGS_DOC = "\n    Args:" + _ARG_LINES + _PAGED_ARG_LINES + _BACKEND_ARG_LINES

_RAISES_DOC = """
    Raises:
      ValueError: bad shapes/ranks (also zero heads or head dims), options (e.g. func with a window, odd-N violation,
        scaling_seqlen <= 0, alpha, scaling_seqlen or 1 / scaling_seqlen not finite in float32,
        max_seqlen_* outside [0, 2**31 - 1], window_size not a pair of ints >= -1,
        kv_splits outside [1, 16] or a string other than "auto", backend not in
        {"auto", "kernel", "reference"}, a switch
        environment variable outside its allowed values) or, when the
        metadata are concrete arrays, bad values
        (see :func:`~jax_sparse_attn.validate_hstu_inputs`).
      TypeError: wrong dtypes (mixed q/k/v dtypes, non-integer cu_seqlens), traced
        static options, static options of the wrong type (max_seqlen_* or a window_size
        side not an int, alpha / scaling_seqlen not a real number, kv_splits neither an int
        nor a string, debug_checks / deterministic not bools), ``switches`` not a
        ``Switches``, or metadata (``cu_seqlens_*``, ``func``, ``page_ids``,
        ``page_indptrs``) given as a ``jax.ShapeDtypeStruct`` (an array is needed).
      NotImplementedError: ``backend="kernel"`` where the kernel cannot run, or
        differentiating a paged-KV call.
"""


def hstu_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, *, max_seqlen_q, max_seqlen_k,
                   scaling_seqlen=None, window_size=(-1, 0), alpha=1.0, func=None,
                   paged_kv=None, page_ids=None, page_indptrs=None, backend="auto",
                   switches=None, debug_checks=False, rab=None, deterministic=False,
                   kv_splits="auto"):
    cu_seqlens_q, cu_seqlens_k = as_array_arg(cu_seqlens_q), as_array_arg(cu_seqlens_k)
    page_ids, page_indptrs = as_array_arg(page_ids), as_array_arg(page_indptrs)
    if getattr(cu_seqlens_q, "ndim", 1) == 2 and getattr(cu_seqlens_k, "ndim", 1) == 2:
        return _per_shard(q, k, v, cu_seqlens_q, cu_seqlens_k, func, paged_kv, rab,
                          dict(max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
                               scaling_seqlen=scaling_seqlen, window_size=window_size,
                               alpha=alpha, backend=backend, switches=switches,
                               debug_checks=debug_checks, deterministic=deterministic,
                               kv_splits=kv_splits))
    cfg = _make_config(q, k, v, cu_seqlens_q, cu_seqlens_k, func, paged_kv, page_ids,
                       page_indptrs, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
                       scaling_seqlen=scaling_seqlen, window_size=window_size, alpha=alpha,
                       backend=backend, switches=switches, op_name="hstu_attention",
                       debug_checks=debug_checks, rab=rab, deterministic=deterministic,
                       kv_splits=kv_splits)
    cu_q, cu_k = _i32(cu_seqlens_q), _i32(cu_seqlens_k)
    if cfg.paged:
        return _hstu_paged_jit(cfg, q, paged_kv, _i32(page_ids), _i32(page_indptrs), cu_q, cu_k)
    return _hstu_jit(cfg, q, k, v, cu_q, cu_k, _i32(func), rab)


_VALUE_OPTS = ("max_seqlen_q", "max_seqlen_k", "scaling_seqlen", "window_size", "alpha")


def validate_per_shard(q, k, v, cu_q, cu_k, func, rab, opts):
    """The eager value checks of per-shard ``cu_seqlens`` ``(num_shards, B_local + 1)``
    (and ``func (num_shards, N, L_local)``): each row against its shard's token slice
    ``T / num_shards``, when the metadata are concrete (under ``jax.vmap`` /
    ``jax.shard_map`` they are tracers, so the per-shard calls cannot check them
    themselves). Raises the validator's ValueError prefixed with the shard; no-op for
    traced cu_seqlens (a traced func beside concrete ones is left unchecked)."""
    require_values(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, func=func)
    if not is_concrete(cu_q, cu_k):
        return
    ns = int(cu_q.shape[0])
    cq, ck = np.asarray(cu_q), np.asarray(cu_k)
    fn = None if func is None or not is_concrete(func) else np.asarray(func)  # traced: unchecked

    def local(x, rows):
        return None if x is None else jax.ShapeDtypeStruct((rows,) + tuple(x.shape[1:]), x.dtype)

    kw = {name: opts[name] for name in _VALUE_OPTS if name in opts}
    for s in range(ns):
        rb = None if rab is None else local(rab, rab.shape[0] // ns)
        try:
            validate_hstu_inputs(local(q, q.shape[0] // ns), local(k, k.shape[0] // ns),
                                 local(v, v.shape[0] // ns), cq[s], ck[s],
                                 func=None if fn is None else fn[s][None], rab=rb, **kw)
        except ValueError as e:
            tq, tk = q.shape[0] // ns, k.shape[0] // ns
            raise ValueError(f"shard {s} of the per-shard cu_seqlens (row {s}; q tokens "
                             f"[{s * tq}, {(s + 1) * tq}), k tokens [{s * tk}, "
                             f"{(s + 1) * tk})): {e}") from None


def _per_shard(q, k, v, cu_q, cu_k, func, paged_kv, rab, opts):
    """``cu_seqlens`` of shape ``(num_shards, B_local + 1)``: row ``s`` packs tokens
    ``[s*T/num_shards, (s+1)*T/num_shards)`` with shard-local offsets (the contract of
    :mod:`jax_sparse_attn.sharding`); computed as a vmap over the shards (one folded call).
    ``rab`` then has ``num_shards * B_local`` sequences (shard ``s`` owns rows
    ``[s*B_local, (s+1)*B_local)``)."""
    if paged_kv is not None:
        raise ValueError("two-dimensional (per-shard) cu_seqlens are not supported with paged_kv")
    _per_shard_shapes(q, k, v, cu_q, cu_k, func, rab)
    ns = cu_q.shape[0]
    validate_per_shard(q, k, v, cu_q, cu_k, func, rab, opts)
    split = lambda x: x.reshape((ns, x.shape[0] // ns) + tuple(x.shape[1:]))  # noqa: E731

    def one(q, k, v, cq, ck, fn, rb):
        return hstu_attention(q, k, v, cq, ck, func=None if fn is None else fn[None], rab=rb,
                              **opts)

    out = jax.vmap(one)(split(q), split(k), split(v), cu_q, cu_k, func,
                        None if rab is None else split(rab))
    return out.reshape((-1,) + tuple(out.shape[2:]))


def _per_shard_shapes(q, k, v, cu_q, cu_k, func, rab):
    """Shape checks of per-shard ``cu_seqlens`` and the arrays split along them."""
    shapes = (tuple(getattr(cu_q, "shape", ())), tuple(getattr(cu_k, "shape", ())))
    if shapes[0][0] != shapes[1][0]:
        raise ValueError("per-shard cu_seqlens_q and cu_seqlens_k must have shapes "
                         f"(num_shards, B_local + 1) with the same num_shards, got {shapes}")
    ns = shapes[0][0]
    if ns < 1:
        raise ValueError(f"per-shard cu_seqlens_q and cu_seqlens_k (num_shards, B_local + 1) "
                         f"need num_shards >= 1 rows, got shape {shapes[0]}")
    for name, x in (("q", q), ("k", k), ("v", v)):
        shape = _shape(name, x)
        if len(shape) != 3 or shape[0] % ns:
            raise ValueError(f"{name} must be (T, H, D) with T divisible by num_shards={ns} "
                             f"(per-shard cu_seqlens), got shape {shape}")
    if func is not None and (getattr(func, "ndim", 0) != 3 or func.shape[0] != ns):
        raise ValueError(f"with per-shard cu_seqlens, func must be (num_shards={ns}, N, L_local), "
                         f"got shape {getattr(func, 'shape', None)}")
    if rab is not None and (getattr(rab, "ndim", 0) != 4
                            or rab.shape[0] != ns * (shapes[0][1] - 1)):
        raise ValueError(f"with per-shard cu_seqlens, rab must be (num_shards * B_local = "
                         f"{ns * (shapes[0][1] - 1)}, H_rab, max_seqlen_k, max_seqlen_k), "
                         f"got shape {getattr(rab, 'shape', None)}")


hstu_attention.__doc__ = (
    """HSTU attention (pointwise SiLU attention over packed variable-length sequences).

    ``out_i = sum_j M_ij * SiLU(alpha * q_i . k_j + rab[b, h, p, j]) * v_j / scaling_seqlen``
    per sequence and head (no bias term without ``rab``), fp32 accumulation, no softmax;
    M from ``window_size`` (bottom-right aligned) or ``func``. Differentiable in q, k, v
    and rab (``jax.custom_vjp``; the backward of the backend that ran the forward is
    used); integer inputs get no gradient.
"""
    + _SEMANTICS_DOC
    + _ARGS_DOC
    + """
    Returns:
      ``out (T_q, H, D_v)`` in q's dtype; rows outside every sequence are 0.
"""
    + _RAISES_DOC
)


def hstu_attention_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, *, max_seqlen_q, max_seqlen_k,
                           scaling_seqlen=None, window_size=(-1, 0), alpha=1.0, func=None,
                           paged_kv=None, page_ids=None, page_indptrs=None, backend="auto",
                           switches=None, debug_checks=False, rab=None, deterministic=False,
                           kv_splits="auto"):
    out = hstu_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                         max_seqlen_k=max_seqlen_k, scaling_seqlen=scaling_seqlen,
                         window_size=window_size, alpha=alpha, func=func, paged_kv=paged_kv,
                         page_ids=page_ids, page_indptrs=page_indptrs, backend=backend,
                         switches=switches, debug_checks=debug_checks, rab=rab,
                         deterministic=deterministic, kv_splits=kv_splits)
    return HSTUForwardResult(o_tensor=out)


hstu_attention_forward.__doc__ = (
    """Forward of :func:`hstu_attention` returning a result pytree.

    Same arguments and semantics as :func:`hstu_attention`.
"""
    + _SEMANTICS_DOC
    + _ARGS_DOC
    + """
    Returns:
      :class:`~jax_sparse_attn._results.HSTUForwardResult` with key ``o_tensor``
      ``(T_q, H, D_v)``; supports ``res["o_tensor"]`` and ``(out,) = res``.
"""
    + _RAISES_DOC
)


def hstu_attention_backward(do, q, k, v, cu_seqlens_q, cu_seqlens_k, *, max_seqlen_q,
                            max_seqlen_k, scaling_seqlen=None, window_size=(-1, 0), alpha=1.0,
                            func=None, paged_kv=None, page_ids=None, page_indptrs=None,
                            backend="auto", switches=None, debug_checks=False,
                            rab=None, deterministic=False, kv_splits="auto"):
    if paged_kv is not None:
        raise NotImplementedError(_PAGED_GRAD_MSG)
    cu_seqlens_q, cu_seqlens_k = as_array_arg(cu_seqlens_q), as_array_arg(cu_seqlens_k)
    page_ids, page_indptrs = as_array_arg(page_ids), as_array_arg(page_indptrs)
    if getattr(cu_seqlens_q, "ndim", 1) == 2 and getattr(cu_seqlens_k, "ndim", 1) == 2:
        if page_ids is not None or page_indptrs is not None:
            raise ValueError("page_ids/page_indptrs are only valid together with paged_kv")
        return _per_shard_backward(
            do, q, k, v, cu_seqlens_q, cu_seqlens_k, func, rab,
            dict(max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
                 scaling_seqlen=scaling_seqlen, window_size=window_size, alpha=alpha,
                 backend=backend, switches=switches, debug_checks=debug_checks,
                 deterministic=deterministic, kv_splits=kv_splits))

    def check_do(cfg):
        want = (q.shape[0], q.shape[1], cfg.head_dim_v)
        if not hasattr(do, "shape"):
            raise TypeError(f"do must be an array (jax.Array or numpy.ndarray) of the output's "
                            f"shape (T_q, H, D_v) = {want}, got {type(do).__name__}")
        if tuple(getattr(do, "shape", ())) != want:
            raise ValueError(f"do must have the output's shape (T_q, H, D_v) = {want}, "
                             f"got {tuple(getattr(do, 'shape', ()))}")
        qdt, dodt = canonical_dtype(q), canonical_dtype(do)
        if dodt != qdt:
            raise TypeError(f"do dtype {dodt} must equal q's dtype {qdt}")

    cfg = _make_config(q, k, v, cu_seqlens_q, cu_seqlens_k, func, None, page_ids, page_indptrs,
                       max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
                       scaling_seqlen=scaling_seqlen, window_size=window_size, alpha=alpha,
                       backend=backend, switches=switches, op_name="hstu_attention_backward",
                       debug_checks=debug_checks, rab=rab, deterministic=deterministic,
                       kv_splits=kv_splits, extra_checks=check_do)
    grads = _bwd_jit(cfg, do, q, k, v, _i32(cu_seqlens_q), _i32(cu_seqlens_k), _i32(func), rab)
    if rab is None:
        return HSTUBackwardResult(dq_tensor=grads[0], dk_tensor=grads[1], dv_tensor=grads[2])
    return HSTUBackwardRabResult(dq_tensor=grads[0], dk_tensor=grads[1], dv_tensor=grads[2],
                                 drab_tensor=grads[3])


def _per_shard_backward(do, q, k, v, cu_q, cu_k, func, rab, opts):
    """:func:`hstu_attention_backward` with per-shard ``cu_seqlens`` ``(num_shards,
    B_local + 1)`` (the contract of :func:`_per_shard`): a vmap over the shards."""
    _per_shard_shapes(q, k, v, cu_q, cu_k, func, rab)
    ns = cu_q.shape[0]
    if not hasattr(do, "shape"):
        raise TypeError(f"do must be an array (jax.Array or numpy.ndarray) of the output's "
                        f"shape (T_q, H, D_v), got {type(do).__name__}")
    if do.ndim != 3 or do.shape[0] != q.shape[0]:
        raise ValueError(f"do must have the output's shape (T_q, H, D_v) with T_q = "
                         f"{q.shape[0]}, got {tuple(do.shape)}")
    validate_per_shard(q, k, v, cu_q, cu_k, func, rab, opts)
    split = lambda x: x.reshape((ns, x.shape[0] // ns) + tuple(x.shape[1:]))  # noqa: E731

    def one(do, q, k, v, cq, ck, fn, rb):
        return tuple(hstu_attention_backward(do, q, k, v, cq, ck,
                                             func=None if fn is None else fn[None], rab=rb,
                                             **opts))

    grads = jax.vmap(one)(split(do), split(q), split(k), split(v), cu_q, cu_k, func,
                          None if rab is None else split(rab))
    grads = [g.reshape((-1,) + tuple(g.shape[2:])) for g in grads]
    if rab is None:
        return HSTUBackwardResult(dq_tensor=grads[0], dk_tensor=grads[1], dv_tensor=grads[2])
    return HSTUBackwardRabResult(dq_tensor=grads[0], dk_tensor=grads[1], dv_tensor=grads[2],
                                 drab_tensor=grads[3])


hstu_attention_backward.__doc__ = (
    """Backward of :func:`hstu_attention`: gradients of ``sum(do * out)`` in q, k, v.

    Runs the backward of the backend that ``backend`` selects (paged KV is not
    supported: it is forward-only).
"""
    + _SEMANTICS_DOC
    + """
    Args:
      do: ``(T_q, H, D_v)`` output cotangent in q's dtype."""
    + _ARG_LINES
    + """
      paged_kv, page_ids, page_indptrs, kv_splits: the forward's options, accepted so
        that its options can be passed unchanged: a ``paged_kv`` raises
        ``NotImplementedError`` (paged KV is forward-only), ``page_ids`` /
        ``page_indptrs`` without it ``ValueError``; ``kv_splits`` is checked as in the
        forward and does not change the backward (it splits the forward only)."""
    + _BACKEND_ARG_LINES
    + """
    Returns:
      :class:`~jax_sparse_attn._results.HSTUBackwardResult` with ``dq_tensor (T_q, H, D)``,
      ``dk_tensor (T_k, H_kv, D)``, ``dv_tensor (T_k, H_kv, D_v)`` in the input dtype (with
      ``H_kv < H`` each sums the ``H / H_kv`` query heads of its group); with
      ``rab`` an :class:`~jax_sparse_attn._results.HSTUBackwardRabResult` that adds
      ``drab_tensor`` (rab's shape and dtype, accumulated in fp32, summed over heads when
      ``H_rab = 1``, zero where masked or outside the sequences).
"""
    + _RAISES_DOC
)
