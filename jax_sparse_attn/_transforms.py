"""``jax.vmap`` of the ops by folding the mapped axis into the kernels' own batch.

The CuTe DSL call (``_cute_call``) has no batching rule, so each op implementation
(forward and backward, either backend) is wrapped in ``jax.custom_batching.custom_vmap``
with a rule that turns ``N`` mapped calls into one call of the same implementation:

* **HSTU** (packed THD): the mapped tokens are concatenated (``(N, T, H, D)`` is reshaped
  to ``(N*T, H, D)``, no copy) and ``cu_seqlens`` of item ``n`` are offset by ``n*T``.
  Between two items two pseudo-sequences cover item ``n``'s rows past its
  ``cu_seqlens[-1]``: one holding those query rows with no keys and one holding those key
  rows with no queries, so they get ``out = 0`` and ``dk = dv = 0`` exactly as in the
  unmapped op. ``func`` rows are concatenated the same way (its values are sequence-local
  key positions, so they need no offset). ``rab`` (per-sequence ``(B, H_rab, N_k, N_k)``)
  gets two zero bias blocks per item for its two pseudo-sequences (which read no bias: one
  has no keys, the other no queries) and ``drab`` drops them again. Contract used:
  ``cu_seqlens[..., 0] == 0`` (checked eagerly for concrete metadata).
* **HSTU paged KV** (forward only): queries and ``cu_seqlens`` fold as above, with
  ``P * 128`` keys per item (what its ``P`` page slots hold); ``page_ids`` are concatenated
  and ``page_indptrs`` offset by ``n*P`` like ``cu_seqlens`` (the key-only pseudo-sequence
  takes the item's unused slots). A mapped cache ``(N, num_pages, 2, 128, H_kv, D)`` is
  merged to ``(N*num_pages, ...)`` and item ``n``'s page ids, clamped into
  ``[0, num_pages)`` as the unmapped op clamps them, are offset by ``n*num_pages``; an
  unmapped cache is shared by all items (never broadcast).
* **BSA** (``(B, H, S, D)``): the mapped axis is merged into ``B`` (metadata too).

Unmapped arguments are broadcast first, so any mix of mapped and unmapped arrays and
metadata works; nested ``vmap`` folds level by level (the rule calls the wrapped function
again, which the next level batches), and ``vmap`` of ``grad`` batches the backward entry
the same way. One custom_vmap function exists per static op config (cached).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.custom_batching import custom_vmap

__all__ = ["hstu_fwd", "hstu_bwd", "hstu_fwd_paged", "bsa_fwd", "bsa_bwd", "fold_cu_seqlens"]


def _bcast(x, batched, n):
    """``x`` with a leading mapped axis of size n (broadcast when unmapped)."""
    if x is None:
        return None
    if batched:
        return x
    return jnp.broadcast_to(x, (n,) + tuple(x.shape))


def _merge(x):
    return None if x is None else x.reshape((-1,) + tuple(x.shape[2:]))


def fold_cu_seqlens(cu_q, cu_k, t_q, t_k):
    """The flat ``cu_seqlens`` pair of N packed batches stacked along the token axis.

    ``cu_q`` / ``cu_k``: int32 ``(N, B+1)`` (each row starting at 0); ``t_q`` / ``t_k``:
    tokens per item. Returns int32 ``(N*(B+2)+1,)`` arrays: per item its B sequences
    offset by ``n*t_q`` / ``n*t_k``, then a pseudo-sequence of its remaining query rows
    with no keys and one of its remaining key rows with no queries.
    """
    n = cu_q.shape[0]
    cu_q = cu_q.astype(jnp.int32)
    cu_k = cu_k.astype(jnp.int32)
    idx = jnp.arange(n, dtype=jnp.int32)[:, None]
    off_q, off_k = idx * t_q, idx * t_k
    end_q, end_k = off_q + t_q, off_k + t_k
    rows_q = jnp.concatenate([cu_q + off_q, end_q, end_q], axis=1)
    rows_k = jnp.concatenate([cu_k + off_k, cu_k[:, -1:] + off_k, end_k], axis=1)
    # row n+1 starts where row n ends ((n+1)*t when cu[n+1, 0] == 0): drop the repeat
    flat_q = jnp.concatenate([rows_q[0], rows_q[1:, 1:].reshape(-1)])
    flat_k = jnp.concatenate([rows_k[0], rows_k[1:, 1:].reshape(-1)])
    return flat_q, flat_k


def _fold_func(func, t_q):
    """``(N, 1, F, L_f)`` per-item func -> ``(1, F, N*t_q + 256)`` for the folded rows."""
    n, _, f, _ = func.shape
    rows = jnp.transpose(func[:, 0, :, :t_q], (1, 0, 2)).reshape(f, n * t_q)
    return jnp.pad(rows, ((0, 0), (0, 256)))[None]


def _fold_rab(rab):
    """``(N, B, H_rab, N_k, N_k)`` per-item bias -> ``(N*(B+2), ...)``: zero blocks for each
    item's two pseudo-sequences (:func:`fold_cu_seqlens`)."""
    return _merge(jnp.pad(rab, ((0, 0), (0, 2)) + ((0, 0),) * (rab.ndim - 2)))


def _unfold_rab(drab, n):
    """The inverse of :func:`_fold_rab` for ``drab``: the pseudo-sequence blocks dropped."""
    drab = drab.reshape((n, -1) + tuple(drab.shape[1:]))
    return drab[:, : drab.shape[1] - 2]


def _hstu_fold(axis_size, in_batched, q, k, v, cu_q, cu_k, func, rab):
    n = axis_size
    q, k, v, cu_q, cu_k = (_bcast(x, b, n) for x, b in zip((q, k, v, cu_q, cu_k), in_batched))
    func = _bcast(func, in_batched[5], n)
    rab = _bcast(rab, in_batched[6], n)
    t_q, t_k = q.shape[1], k.shape[1]
    fq, fk = fold_cu_seqlens(cu_q, cu_k, t_q, t_k)
    ff = None if func is None else _fold_func(func, t_q)
    fr = None if rab is None else _fold_rab(rab)
    return (_merge(q), _merge(k), _merge(v), fq, fk, ff, fr), n, t_q, t_k


@functools.lru_cache(maxsize=None)
def hstu_fwd(cfg, impl):
    """``impl(cfg, q, k, v, cu_q, cu_k, func, rab) -> out`` as a custom_vmap function of the
    arrays (``func`` / ``rab`` may be None)."""

    @custom_vmap
    def f(q, k, v, cu_q, cu_k, func, rab):
        return impl(cfg, q, k, v, cu_q, cu_k, func, rab)

    @f.def_vmap
    def rule(axis_size, in_batched, q, k, v, cu_q, cu_k, func, rab):
        if axis_size == 0:  # vmap over no item: nothing to fold or compute
            return jnp.zeros((0,) + q.shape[-3:-1] + v.shape[-1:], q.dtype), True
        args, n, t_q, _ = _hstu_fold(axis_size, in_batched, q, k, v, cu_q, cu_k, func, rab)
        out = f(*args)
        return out.reshape((n, t_q) + tuple(out.shape[1:])), True

    return _with_jvp(f, functools.partial(impl, cfg))


@functools.lru_cache(maxsize=None)
def hstu_bwd(cfg, impl):
    """``impl(cfg, do, q, k, v, cu_q, cu_k, func, rab) -> (dq, dk, dv)`` (``+ (drab,)`` with
    rab) as a custom_vmap function."""

    @custom_vmap
    def f(do, q, k, v, cu_q, cu_k, func, rab):
        return tuple(impl(cfg, do, q, k, v, cu_q, cu_k, func, rab))

    @f.def_vmap
    def rule(axis_size, in_batched, do, q, k, v, cu_q, cu_k, func, rab):
        if axis_size == 0:  # vmap over no item: empty gradients
            empty = tuple(jnp.zeros((0,) + x.shape[x.ndim - nd:], x.dtype)
                          for x, nd in ((q, 3), (k, 3), (v, 3), (rab, 4)) if x is not None)
            return empty, (True,) * len(empty)
        do = _bcast(do, in_batched[0], axis_size)
        args, n, t_q, t_k = _hstu_fold(axis_size, in_batched[1:], q, k, v, cu_q, cu_k, func,
                                       rab)
        grads = f(_merge(do), *args)
        unfold = lambda x, t: x.reshape((n, t) + tuple(x.shape[1:]))  # noqa: E731
        out = (unfold(grads[0], t_q), unfold(grads[1], t_k), unfold(grads[2], t_k))
        if rab is not None:
            out = out + (_unfold_rab(grads[3], n),)
        return out, (True,) * len(out)

    return _with_jvp(f, lambda *args: tuple(impl(cfg, *args)))


@functools.lru_cache(maxsize=None)
def hstu_fwd_paged(cfg, impl):
    """``impl(cfg, q, paged_kv, page_ids, page_indptrs, cu_q, cu_k) -> out`` (paged-KV
    forward) as a custom_vmap function of the arrays."""

    @custom_vmap
    def f(q, paged_kv, page_ids, page_indptrs, cu_q, cu_k):
        return impl(cfg, q, paged_kv, page_ids, page_indptrs, cu_q, cu_k)

    @f.def_vmap
    def rule(axis_size, in_batched, q, paged_kv, page_ids, page_indptrs, cu_q, cu_k):
        n = axis_size
        if n == 0:  # vmap over no item: nothing to fold or compute
            return jnp.zeros((0,) + q.shape[-3:-1] + paged_kv.shape[-1:], q.dtype), True
        cache_batched = in_batched[1]
        q, page_ids, page_indptrs, cu_q, cu_k = (
            _bcast(x, b, n) for x, b in zip((q, page_ids, page_indptrs, cu_q, cu_k),
                                            (in_batched[0],) + tuple(in_batched[2:])))
        t_q, n_slots = q.shape[1], page_ids.shape[1]
        page = paged_kv.shape[-3]
        fq, fk = fold_cu_seqlens(cu_q, cu_k, t_q, n_slots * page)
        _, fp = fold_cu_seqlens(page_indptrs, page_indptrs, n_slots, n_slots)
        if cache_batched:
            n_pages = paged_kv.shape[1]
            ids = jnp.clip(page_ids.astype(jnp.int32), 0, max(n_pages - 1, 0))
            page_ids = ids + jnp.arange(n, dtype=jnp.int32)[:, None] * n_pages
            paged_kv = _merge(paged_kv)
        out = f(_merge(q), paged_kv, _merge(page_ids), fp, fq, fk)
        return out.reshape((n, t_q) + tuple(out.shape[1:])), True

    return f


def _with_jvp(f, fun):
    """The custom_vmap function ``f`` with the JVP of ``fun`` (the same function without the
    custom_vmap wrapper). JAX's JVP of a custom_vmap call cannot be linearized, so reverse
    mode could not differentiate through ``f`` (a second ``jax.grad``: the forward and the
    backward of the ops run inside the first one's backward); with ``fun``'s JVP the
    reference backend's pure-jnp implementations differentiate as written, and a kernel
    call stops at JAX's NotImplementedError for its primitive."""
    g = jax.custom_jvp(f)
    g.defjvp(lambda primals, tangents: jax.jvp(fun, primals, tangents))
    return g


def _bsa_cfg(cfg, n):
    return dataclasses.replace(cfg, batch=cfg.batch * n)


@functools.lru_cache(maxsize=None)
def bsa_fwd(cfg, impl):
    """``impl(cfg, q, k, v, idx, nums, sizes) -> (out, lse)`` as a custom_vmap function."""

    @custom_vmap
    def f(q, k, v, idx, nums, sizes):
        return tuple(impl(cfg, q, k, v, idx, nums, sizes))

    @f.def_vmap
    def rule(axis_size, in_batched, *args):
        n = axis_size
        args = [_merge(_bcast(x, b, n)) for x, b in zip(args, in_batched)]
        out, lse = bsa_fwd(_bsa_cfg(cfg, n), impl)(*args)
        split = lambda x: x.reshape((n, cfg.batch) + tuple(x.shape[1:]))  # noqa: E731
        return (split(out), split(lse)), (True, True)

    return _with_jvp(f, lambda *args: tuple(impl(cfg, *args)))


@functools.lru_cache(maxsize=None)
def bsa_bwd(cfg, impl):
    """``impl(cfg, do, q, k, v, out, lse, idx, nums, sizes, dlse) -> (dq, dk, dv)`` as a
    custom_vmap function (``dlse``: the lse cotangent or None)."""

    @custom_vmap
    def f(do, q, k, v, out, lse, idx, nums, sizes, dlse):
        return tuple(impl(cfg, do, q, k, v, out, lse, idx, nums, sizes, dlse))

    @f.def_vmap
    def rule(axis_size, in_batched, *args):
        n = axis_size
        args = [_merge(_bcast(x, b, n)) for x, b in zip(args, in_batched)]
        grads = bsa_bwd(_bsa_cfg(cfg, n), impl)(*args)
        split = lambda x: x.reshape((n, cfg.batch) + tuple(x.shape[1:]))  # noqa: E731
        return tuple(split(g) for g in grads), (True, True, True)

    return _with_jvp(f, lambda *args: tuple(impl(cfg, *args)))
