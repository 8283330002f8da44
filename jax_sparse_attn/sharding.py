"""Running the ops on inputs sharded over several devices (data and head parallelism).

The CuTe DSL kernels are opaque custom calls to XLA's SPMD partitioner, which would
gather q/k/v onto every device to run them. The functions here wrap the ops in
``jax.shard_map`` instead, so that under ``jax.jit`` each device runs the kernel on its
own shard, with no collective at all in the forward or the backward (the caller's loss
reduction and gradient all-reduce are the only collectives of a data-parallel step).

* :func:`block_sparse_attention_sharded`: shards ``(B, H, S, D)`` tensors (either
  layout) and the metadata over the batch axis and/or the head axis (GQA: ``H_q`` and
  ``H_kv`` are both divided by the head-axis size, so the query heads of a KV head stay
  on its device).
* :func:`hstu_attention_sharded`: shards the packed THD tensors over heads freely and
  over tokens **by whole sequences**: the caller packs each shard's sequences into an
  equal token budget ``T_local`` (``T = num_shards * T_local``, as data-parallel loaders
  do) and passes ``cu_seqlens`` of shape ``(num_shards, B_local + 1)`` holding each
  shard's *shard-local* offsets (row ``s`` describes tokens
  ``[s*T_local, (s+1)*T_local)``; rows past ``cu_seqlens[s, -1]`` are padding with
  output 0), sharded like q along its first axis. :func:`shard_cu_seqlens` builds it and
  :func:`assign_to_shards` balances sequences across shards. :func:`jax_sparse_attn.hstu_attention`
  itself accepts the same two-dimensional ``cu_seqlens`` (it then runs the shards as
  one folded batch on one device), so the single-device and the sharded call compute
  the same function.

Semantics: JAX's ``shard_map`` (https://docs.jax.dev/en/latest/notebooks/shard_map.html);
the per-shard packing follows the variable-length batching of FlashAttention /
generative-recommenders training loaders.
"""

from __future__ import annotations

import numpy as np

import jax
from jax.sharding import PartitionSpec as P

from . import bsa as _bsa
from . import hstu as _hstu
from .validation import (_bsa_eager_checks, _shape, _static_int, as_array_arg, is_concrete,
                         validate_bsa_metadata)

#: the options of block_sparse_attention that validate_bsa_metadata takes
_BSA_VALUE_OPTS = ("sparse_block_size", "allow_empty_block_nums", "softmax_scale", "pack_gqa",
                   "kv_splits", "causal", "backend", "switches", "debug_checks",
                   "deterministic")
#: those of them that the trace-time checks (validation.check_bsa_args) take
_BSA_ARG_OPTS = ("sparse_block_size", "allow_empty_block_nums", "softmax_scale", "pack_gqa",
                 "kv_splits", "causal")

__all__ = [
    "hstu_attention_sharded",
    "block_sparse_attention_sharded",
    "shard_cu_seqlens",
    "assign_to_shards",
]


def _axis_size(mesh, axis):
    if axis is None:
        return 1
    names = axis if isinstance(axis, tuple) else (axis,)
    size = 1
    for a in names:
        if a not in mesh.shape:
            raise ValueError(f"mesh axis {a!r} is not one of the mesh's axes {tuple(mesh.shape)}")
        size *= mesh.shape[a]
    return size


def _check_mesh(mesh):
    if not isinstance(mesh, (jax.sharding.Mesh, jax.sharding.AbstractMesh)):
        raise TypeError(f"mesh must be a jax.sharding.Mesh (e.g. jax.make_mesh(...)), got "
                        f"{type(mesh).__name__}")


def _check_div(name, n, k, axis):
    if k > 1 and n % k:
        raise ValueError(f"{name} = {n} must be divisible by the size {k} of mesh axis {axis!r}")


def _int_lengths(name, lengths) -> np.ndarray:
    """``lengths`` (a sequence of ints) as int64; a non-integer entry (``3.5``, also an
    integral float or a bool, as for ``cu_seqlens``) is a TypeError naming ``name``."""
    try:
        a = np.asarray(list(lengths))
    except TypeError:
        raise TypeError(f"{name} must be a sequence of int sequence lengths, got "
                        f"{type(lengths).__name__}") from None
    if a.size and a.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold int sequence lengths (like cu_seqlens, an integer "
                        f"array), got {a.reshape(-1)[:8].tolist()} (dtype {a.dtype})")
    return a.astype(np.int64).reshape(-1)


def shard_cu_seqlens(lengths_per_shard, tokens_per_shard=None) -> np.ndarray:
    """The per-shard ``cu_seqlens`` ``(num_shards, B_local + 1)`` int32 (NumPy) of
    sequence lengths assigned to shards.

    Args:
      lengths_per_shard: one sequence of non-negative ints per shard (the lengths of the
        sequences packed, in order, into that shard's token slice). Shards with fewer
        sequences are padded with zero-length sequences (``B_local`` = the largest count).
      tokens_per_shard: the token budget ``T_local`` of every shard (an int); default the
        largest shard total. Raises ValueError when a shard's lengths sum past it.
    Returns:
      int32 ``(num_shards, B_local + 1)``, each row starting at 0 and non-decreasing.
    Raises:
      TypeError: a length or ``tokens_per_shard`` that is not an int (``3.5``, ``3.0``).
      ValueError: no shard, a negative length, a shard past ``tokens_per_shard`` or a
        budget past int32.
    """
    rows = [_int_lengths(f"lengths_per_shard[{s}]", r) for s, r in enumerate(lengths_per_shard)]
    if not rows:
        raise ValueError("lengths_per_shard must name at least one shard")
    for s, r in enumerate(rows):
        if r.size and r.min() < 0:
            raise ValueError(f"lengths_per_shard[{s}] has a negative length")
    totals = [int(r.sum()) for r in rows]
    budget = (max(totals) if tokens_per_shard is None
              else _static_int("tokens_per_shard", tokens_per_shard, 0))
    for s, t in enumerate(totals):
        if t > budget:
            raise ValueError(f"shard {s} holds {t} tokens, more than tokens_per_shard={budget}")
    if budget >= 2**31:
        raise ValueError(f"tokens_per_shard={budget} does not fit int32")
    b_local = max(r.size for r in rows)
    cu = np.zeros((len(rows), b_local + 1), np.int32)
    for s, r in enumerate(rows):
        c = np.concatenate([[0], np.cumsum(r)])
        cu[s, : c.size] = c
        cu[s, c.size:] = c[-1]
    return cu


def assign_to_shards(lengths, num_shards: int, tokens_per_shard: int | None = None):
    """Balance sequences over shards: longest first onto the shard with the fewest
    tokens (greedy LPT). Returns ``(order, lengths_per_shard)``: ``order[s]`` lists the
    indices of the sequences of shard ``s`` (pack their tokens in this order), and
    ``lengths_per_shard`` is ready for :func:`shard_cu_seqlens`. ValueError for a
    negative length or when a budget ``tokens_per_shard`` cannot hold a sequence; TypeError for a length,
    ``num_shards`` or ``tokens_per_shard`` that is not an int."""
    lengths = [int(x) for x in _int_lengths("lengths", lengths)]
    neg = [i for i, x in enumerate(lengths) if x < 0]
    if neg:
        raise ValueError(f"lengths must be non-negative, got lengths[{neg[0]}]={lengths[neg[0]]}")
    num_shards = _static_int("num_shards", num_shards, 1)
    if tokens_per_shard is not None:
        tokens_per_shard = _static_int("tokens_per_shard", tokens_per_shard, 0)
    load = [0] * num_shards
    order = [[] for _ in range(num_shards)]
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        s = min(range(num_shards), key=lambda s: load[s])
        if tokens_per_shard is not None and load[s] + lengths[i] > tokens_per_shard:
            raise ValueError(f"sequence {i} (length {lengths[i]}) does not fit any shard's "
                             f"budget tokens_per_shard={tokens_per_shard}")
        order[s].append(i)
        load[s] += lengths[i]
    return order, [[lengths[i] for i in o] for o in order]


def _placed(mesh, specs, args):
    """``args`` resharded over the explicit axes of ``mesh`` (the default of
    ``jax.make_mesh``) to what ``specs`` name of them: ``shard_map`` takes inputs only with
    those shardings on explicit axes, and reshards over automatic axes itself."""
    explicit_type = getattr(jax.sharding.AxisType, "Explicit", None)
    types = dict(zip(mesh.axis_names, getattr(mesh, "axis_types", ())))
    explicit = {n for n, t in types.items() if explicit_type is not None and t == explicit_type}
    if not explicit:
        return args

    def keep(entry):
        names = entry if isinstance(entry, tuple) else (entry,)
        kept = tuple(n for n in names if n in explicit)
        return kept[0] if len(kept) == 1 else (kept or None)

    return tuple(a if a is None or spec is None else jax.sharding.reshard(
        a, jax.sharding.NamedSharding(mesh, P(*(keep(e) for e in spec))))
        for a, spec in zip(args, specs))


def hstu_attention_sharded(q, k, v, cu_seqlens_q, cu_seqlens_k, *, mesh, token_axis=None,
                           head_axis=None, func=None, rab=None, **kwargs):
    """:func:`jax_sparse_attn.hstu_attention` run shard-locally with ``jax.shard_map``.

    Args:
      q, k, v: global ``(T_q, H, D)``, ``(T_k, H_kv, D)``, ``(T_k, H_kv, D_v)`` arrays (any
        sharding: they are resharded to the specs below if needed, on explicit mesh axes,
        ``jax.make_mesh``'s default, as on automatic ones).
      cu_seqlens_q, cu_seqlens_k: int32 ``(num_shards, B_local + 1)`` shard-local
        offsets (see the module doc; :func:`shard_cu_seqlens`); ``num_shards`` is the
        size of ``token_axis`` (``(B+1,)`` is accepted when ``token_axis`` is None).
      mesh: a ``jax.sharding.Mesh``. With explicit axes (``jax.make_mesh``'s
        default), take gradients inside ``with jax.set_mesh(mesh):``: JAX needs the
        mesh context to transpose explicitly sharded values (outside it, ``jax.grad``
        raises JAX's own ``ValueError`` asking for a mesh context).
      token_axis: mesh axis name (or tuple of names) sharding the tokens by whole
        sequences; None keeps tokens replicated.
      head_axis: mesh axis name sharding the heads; None keeps heads replicated.
      func: optional int32 ``(num_shards, N, L_local)`` per-shard interval mask with
        ``L_local >= T_q / num_shards + 256`` (row ``s`` is shard ``s``'s func), or the
        ``(1, N, L_f)`` func of :func:`~jax_sparse_attn.hstu_attention` when tokens are
        not sharded.
      rab: optional relative attention bias ``(num_shards * B_local, H_rab, max_seqlen_k,
        max_seqlen_k)`` as for :func:`~jax_sparse_attn.hstu_attention` with per-shard
        ``cu_seqlens`` (shard ``s`` owns sequences ``[s * B_local, (s + 1) * B_local)``);
        split over ``token_axis`` by sequence and, with ``H_rab = H``, over ``head_axis``
        (``H_rab = 1``: every head shard reads the one bias).
      **kwargs: the static options of :func:`~jax_sparse_attn.hstu_attention`
        (``max_seqlen_q``, ``max_seqlen_k``, ``window_size``, ``alpha``, ``backend``...).
    Returns:
      ``out (T_q, H, D_v)`` sharded over ``(token_axis, head_axis)``.
    Raises:
      ValueError: an axis not in the mesh, ``T`` / ``H`` / ``H_kv`` not divisible by the axis
        sizes (each head shard keeps whole GQA groups, so MQA, ``H_kv = 1``, is not
        head-sharded), ``rab`` of another shape than above,
        ``cu_seqlens`` rows not equal to the token-axis size; plus the errors of
        :func:`~jax_sparse_attn.hstu_attention` (paged KV is not supported here).
    """
    if kwargs.get("paged_kv") is not None:
        raise ValueError("hstu_attention_sharded does not support paged_kv")
    _check_mesh(mesh)
    for name, x in (("q", q), ("k", k), ("v", v), ("func", func), ("rab", rab)):
        if x is not None or name in ("q", "k", "v"):
            _shape(name, x)  # ValueError for a None array, TypeError for a non-array
    ns, nh = _axis_size(mesh, token_axis), _axis_size(mesh, head_axis)
    cu_q, cu_k = (c if c.ndim == 2 else c[None] for c in (jax.numpy.asarray(cu_seqlens_q),
                                                          jax.numpy.asarray(cu_seqlens_k)))
    for name, c in (("cu_seqlens_q", cu_q), ("cu_seqlens_k", cu_k)):
        if c.shape[0] != ns:
            raise ValueError(f"{name} must have shape (num_shards={ns}, B_local + 1) for "
                             f"token_axis={token_axis!r}, got {tuple(c.shape)}")
    _check_div("T_q", q.shape[0], ns, token_axis)
    _check_div("T_k", k.shape[0], ns, token_axis)
    _check_div("H", q.shape[1], nh, head_axis)
    _check_div("H_kv", k.shape[1], nh, head_axis)  # GQA: each shard keeps whole groups
    if func is not None and func.shape[0] != ns:
        raise ValueError(f"func must have shape (num_shards={ns}, N, L_local), got {func.shape}")
    rab_heads = None
    if rab is not None:
        b_all = ns * (cu_q.shape[1] - 1)
        if getattr(rab, "ndim", 0) != 4 or rab.shape[0] != b_all or rab.shape[1] not in (
                1, q.shape[1]):
            raise ValueError(
                f"rab must have shape (num_shards * B_local = {b_all}, H_rab, max_seqlen_k, "
                f"max_seqlen_k) with H_rab in (1, H={q.shape[1]}), got "
                f"{getattr(rab, 'shape', None)}")
        # a per-head bias is split with the heads; one bias for all heads is replicated
        rab_heads = head_axis if rab.shape[1] == q.shape[1] and q.shape[1] > 1 else None
    # concrete metadata are checked here: inside shard_map they are tracers
    _hstu.validate_per_shard(q, k, v, cu_q, cu_k, func, rab, kwargs)
    tok = P(token_axis, head_axis, None)
    meta = P(token_axis, None)

    def local(q, k, v, cu_q, cu_k, func, rab):
        return _hstu.hstu_attention(q, k, v, cu_q[0], cu_k[0], func=func, rab=rab, **kwargs)

    in_specs = (tok, tok, tok, meta, meta, None if func is None else P(token_axis, None, None),
                None if rab is None else P(token_axis, rab_heads, None, None))
    fn = jax.shard_map(local, mesh=mesh, in_specs=in_specs, out_specs=tok, check_vma=False)
    return fn(*_placed(mesh, in_specs, (q, k, v, cu_q, cu_k, func, rab)))


def block_sparse_attention_sharded(q, k, v, q2k_block_index, block_sparse_num=None,
                                   block_sizes=None, q2k_block_nums=None, *, mesh,
                                   batch_axis=None, head_axis=None, layout="bhsd",
                                   return_lse=False, **kwargs):
    """:func:`jax_sparse_attn.block_sparse_attention` run shard-locally with ``jax.shard_map``
    over the batch axis and/or the head axis.

    Args:
      q, k, v, q2k_block_index, block_sparse_num, block_sizes, q2k_block_nums, layout:
        as for :func:`~jax_sparse_attn.block_sparse_attention` (global shapes).
      mesh: a ``jax.sharding.Mesh``. With explicit axes (``jax.make_mesh``'s
        default), take gradients inside ``with jax.set_mesh(mesh):``: JAX needs the
        mesh context to transpose explicitly sharded values (outside it, ``jax.grad``
        raises JAX's own ``ValueError`` asking for a mesh context).
      batch_axis / head_axis: mesh axis names (or None) sharding B and the heads
        (``H_q`` and ``H_kv`` must both be divisible).
      return_lse: also return ``lse (B, H_q, S_q)``, float32 (float64 for float64
        inputs), as :func:`~jax_sparse_attn.block_sparse_attention_forward` does; both
        outputs are then differentiable in q, k, v (cotangents for ``out`` and ``lse``).
      **kwargs: the other static options of the op (``sparse_block_size``,
        ``softmax_scale``, ``allow_empty_block_nums``, ``backend``, ``switches``,
        ``debug_checks``, ``kv_splits``, ``pack_gqa``, ``causal``, ``deterministic``).
    Returns:
      ``out`` (and ``lse``) sharded like q.
    Raises:
      ValueError: an axis not in the mesh or B / H_q / H_kv not divisible by its size,
        plus the errors of :func:`~jax_sparse_attn.block_sparse_attention`.
    """
    _check_mesh(mesh)
    nb, nh = _axis_size(mesh, batch_axis), _axis_size(mesh, head_axis)
    h_axis = 1 if layout == "bhsd" else 2
    block_sizes = as_array_arg(block_sizes)  # a Python list, as the op takes it
    _check_div("B", q.shape[0], nb, batch_axis)
    _check_div("H_q", q.shape[h_axis], nh, head_axis)
    _check_div("H_kv", k.shape[h_axis], nh, head_axis)
    # the eager value checks of the op on the global metadata (inside shard_map they are
    # tracers): the concrete ones, also beside traced ones
    opts = {n: kwargs[n] for n in _BSA_VALUE_OPTS if n in kwargs}
    if is_concrete(q2k_block_index, block_sizes, q2k_block_nums):
        validate_bsa_metadata(q, k, v, q2k_block_index, block_sparse_num, block_sizes,
                              q2k_block_nums, layout=layout, **opts)
    else:
        _bsa_eager_checks(q, k, v, q2k_block_index, block_sparse_num, block_sizes,
                          q2k_block_nums, layout=layout,
                          **{n: x for n, x in opts.items() if n in _BSA_ARG_OPTS})
    x_spec = (P(batch_axis, head_axis, None, None) if layout == "bhsd"
              else P(batch_axis, None, head_axis, None))
    idx_spec = P(batch_axis, head_axis, None, None)
    nums_spec = None if q2k_block_nums is None else P(batch_axis, head_axis, None)
    sizes_spec = None
    if block_sizes is not None:
        sizes_spec = {1: P(None), 2: P(batch_axis, None), 3: P(batch_axis, head_axis, None)}[
            block_sizes.ndim]
    lse_spec = P(batch_axis, head_axis, None)

    def local(q, k, v, idx, sizes, nums):
        opts = dict(block_sparse_num=block_sparse_num, block_sizes=sizes, q2k_block_nums=nums,
                    layout=layout, **kwargs)
        if return_lse:
            o, lse = _bsa.block_sparse_attention_forward(q, k, v, idx, **opts)
            return o, lse
        return _bsa.block_sparse_attention(q, k, v, idx, **opts)

    in_specs = (x_spec, x_spec, x_spec, idx_spec, sizes_spec, nums_spec)
    fn = jax.shard_map(local, mesh=mesh, in_specs=in_specs,
                       out_specs=(x_spec, lse_spec) if return_lse else x_spec, check_vma=False)
    return fn(*_placed(mesh, in_specs,
                       (q, k, v, q2k_block_index, block_sizes, q2k_block_nums)))
