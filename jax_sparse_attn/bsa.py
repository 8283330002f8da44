"""Block-sparse softmax attention: public API (validate -> static config -> custom_vjp -> backend).

Semantics (source: softmax attention restricted to listed key blocks; metadata conventions
as in cuDNN's block-sparse attention): queries and keys are cut into blocks of ``blk =
sparse_block_size`` tokens, ``N_q = ceil(S_q / blk)``, ``N_kv = ceil(S_kv / blk)``.
Query block ``m`` of head ``h`` attends to the listed KV blocks
``q2k_block_index[b, h, m, :n]`` (the *active prefix*, ``n`` = ``block_sparse_num`` or
``q2k_block_nums[b, h, m]``; entries past it are ignored whatever their value). Block
``n`` contributes key tokens ``[n*blk, n*blk + size_n) ∩ [0, S_kv)`` (``size_n`` from
``block_sizes``, default ``blk``). Softmax with ``softmax_scale`` runs over exactly
those keys; an empty key set gives ``out = 0`` and ``lse = -inf``. Query head ``h``
uses KV head ``h // (H_q // H_kv)`` (GQA).

Options (static): ``kv_splits`` (split-KV as in cuDNN's block-sparse API: each row's active
prefix cut into contiguous chunks whose softmax partials are merged; same result),
``pack_gqa`` (cuDNN's packed-GQA metadata: rows are packed query rows ``p = s r + g``,
position ``s`` of query head ``h_kv r + g``, ``r = H_q / H_kv``, in blocks of ``blk`` packed
rows per KV head) and ``causal`` (keys ``j > i + S_kv - S_q`` of the listed blocks are
masked, FlashAttention's bottom-right aligned causal mask; rows left without keys give
``out = 0``, ``lse = -inf``).
"""

from __future__ import annotations

import dataclasses
from functools import partial

import jax
import jax.numpy as jnp

from . import _backend, _platform, _transforms, metadata, reference
from ._results import BSABackwardResult, BSAForwardResult
from .config import BSAConfig
from .validation import (
    _bsa_value_checks,
    as_array_arg,
    canonical_dtype,
    check_bsa_args,
    check_debug_checks,
    check_deterministic,
    is_concrete,
    require_values,
    run_time_value_checks,
)

__all__ = [
    "block_sparse_attention",
    "block_sparse_attention_forward",
    "block_sparse_attention_backward",
    "BSAConfig",
]


def _passes(op_name):
    """The kernel passes a call of ``op_name`` may run (the forward entry points are
    differentiable, so they may run the backward too)."""
    return ("bwd",) if op_name.endswith("_backward") else ("fwd", "bwd")


def _causal_kw(cfg):
    """``causal=True`` for the ffi module's key / support functions (nothing when False)."""
    return {"causal": True} if cfg.causal else {}


def _det_kw(cfg):
    """``deterministic=True`` for the ffi module's backward key (nothing when False)."""
    return {"deterministic": True} if cfg.deterministic else {}


def _kernel_unsupported_reason(cfg, passes, switches, mod):
    # causal, pack_gqa: the sm90 kernels; kv_splits: every forward; deterministic: the sm90ws
    # backward (the ffi module says where not)
    if cfg.deterministic and "bwd" in passes:
        why = mod.deterministic_unsupported_reason(
            cfg.head_dim, cfg.sparse_block_size, switches,
            cfg.num_heads_q // max(cfg.num_heads_kv, 1) if cfg.pack_gqa else 1, cfg.causal)
        if why is not None:
            return why + "; backend='reference' implements it"
    if cfg.pack_gqa:
        why = mod.pack_gqa_unsupported_reason(
            head_dim=cfg.head_dim, sparse_block_size=cfg.sparse_block_size,
            group=cfg.num_heads_q // max(cfg.num_heads_kv, 1), passes=passes, switches=switches,
            kv_splits=cfg.kv_splits, **_causal_kw(cfg))
        if why is not None:
            return why + "; backend='reference' implements it"
    return mod.bsa_kernel_unsupported_reason(dtype=cfg.dtype, head_dim=cfg.head_dim,
                                             head_dim_v=cfg.head_dim_v,
                                             sparse_block_size=cfg.sparse_block_size,
                                             passes=passes, switches=switches,
                                             **_causal_kw(cfg), **_kv_split_sizes(cfg))


def _kv_split_sizes(cfg):
    """The split-KV option and the static sizes that resolve it (``ffi.bsa.resolve_kv_splits``):
    metadata rows ``B H_q N_q`` (with ``pack_gqa`` ``B H_kv N_qp``: ``cfg.num_q_blocks`` is
    then ``N_qp``), ``K_max`` and the elements of one fp32 partial output ``B H_q S_q D_v``
    (unpacked also with ``pack_gqa``); nothing for ``kv_splits=1`` (the ffi functions'
    defaults)."""
    if cfg.kv_splits == 1:
        return {}
    heads = cfg.num_heads_kv if cfg.pack_gqa else cfg.num_heads_q
    return dict(kv_splits=cfg.kv_splits, num_rows=cfg.batch * heads * cfg.num_q_blocks,
                k_max=cfg.k_max,
                partial_elems=cfg.batch * cfg.num_heads_q * cfg.seqlen_q * cfg.head_dim_v)


def _make_config(q, k, v, q2k_block_index, block_sparse_num, block_sizes, q2k_block_nums, *,
                 sparse_block_size, softmax_scale, layout, allow_empty_block_nums, backend,
                 switches, op_name, debug_checks=False, kv_splits=1, pack_gqa=False,
                 causal=False, deterministic=False, extra_checks=None):
    """Validate the arguments and build the call's one static config (backend chosen,
    kernel compile keys decided); returns it with the metadata in normalised form
    (:func:`~jax_sparse_attn.metadata.normalize_bsa_metadata`). ``extra_checks(cfg)``: the
    caller's checks of its other arguments, run before the backend is chosen (so that
    ``which_backend`` raises their errors too)."""
    _backend.check_backend(backend)
    switches = _backend.check_switches(switches)
    debug_checks = check_debug_checks(debug_checks)
    block_sizes = as_array_arg(block_sizes)
    cfg = check_bsa_args(q, k, v, q2k_block_index, block_sparse_num, block_sizes,
                         q2k_block_nums, sparse_block_size=sparse_block_size,
                         softmax_scale=softmax_scale, layout=layout,
                         allow_empty_block_nums=allow_empty_block_nums, kv_splits=kv_splits,
                         pack_gqa=pack_gqa, causal=causal)
    cfg = dataclasses.replace(cfg, deterministic=check_deterministic(deterministic))
    require_values(q2k_block_index=q2k_block_index, block_sizes=block_sizes,
                   q2k_block_nums=q2k_block_nums)
    # the concrete metadata are checked eagerly (also beside traced ones, e.g. jax.jit over
    # block_sizes only); debug_checks stages the checks of all of them when some are traced
    _bsa_value_checks(q2k_block_index, block_sizes, q2k_block_nums, allow_empty_block_nums, cfg)
    if debug_checks and not is_concrete(q2k_block_index, block_sizes, q2k_block_nums):
        run_time_value_checks(
            lambda i, s, n: _bsa_value_checks(i, s, n, allow_empty_block_nums, cfg),
            q2k_block_index, block_sizes, q2k_block_nums,
            names=("q2k_block_index", "block_sizes", "q2k_block_nums"))
    if extra_checks is not None:
        extra_checks(cfg)
    passes = _passes(op_name)
    mod = _backend.select(backend, op_name, "bsa",
                          partial(_kernel_unsupported_reason, cfg, passes, switches),
                          switches=switches)
    if mod is not None:
        static = (cfg.dtype, cfg.head_dim, cfg.sparse_block_size, cfg.has_block_sizes, switches)
        # pack_gqa: the kernels' compile keys carry r (1 = not packed)
        pack = {"pack_gqa": cfg.num_heads_q // cfg.num_heads_kv} if cfg.pack_gqa else {}
        # the compile keys of the passes this call may run (None: not run by this call)
        cfg = dataclasses.replace(cfg, backend="kernel", cute_call=switches.cute_call,
                                  fwd=(mod.fwd_config(*static, **_causal_kw(cfg),
                                                      **_fwd_split_args(cfg), **pack)
                                       if "fwd" in passes else None),
                                  bwd=(mod.bwd_config(*static, **_causal_kw(cfg), **pack,
                                                      **_det_kw(cfg))
                                       if "bwd" in passes else None),
                                  pre=mod.pre_config(cfg.dtype, cfg.head_dim, switches),
                                  kq_kernel=(switches.bsa_kq_impl in ("kernel", "items") and
                                             _platform.kernel_family(switches) == "sm90"),
                                  kq_items=switches.bsa_kq_impl == "items",
                                  kernel_arch=_platform.resolved_arch(),
                                  kernel_family=_platform.kernel_family(switches))
    idx, nums, sizes = metadata.normalize_bsa_metadata(
        q2k_block_index, cfg.block_sparse_num, block_sizes, q2k_block_nums)
    return cfg, idx, nums, sizes


def _fwd_split_args(cfg):
    sizes = _kv_split_sizes(cfg)
    sizes.pop("partial_elems", None)
    return sizes


def _ref_options(cfg):
    """The semantic options in the keyword form of the :mod:`~jax_sparse_attn.reference` API."""
    return dict(layout=cfg.layout, sparse_block_size=cfg.sparse_block_size,
                softmax_scale=cfg.softmax_scale, pack_gqa=cfg.pack_gqa, causal=cfg.causal)


def _fwd_backend(cfg, q, k, v, idx, nums, sizes):
    if cfg.backend == "kernel":
        from .ffi import bsa as ffi_bsa  # noqa: PLC0415 (lazy: only on the kernel path)

        return ffi_bsa.bsa_fwd(q, k, v, idx, nums, sizes, cfg)
    return reference.block_sparse_attention_ref(q, k, v, idx, nums, sizes, kv_splits=cfg.kv_splits,
                                                **_ref_options(cfg))


def _bwd_backend(cfg, do, q, k, v, out, lse, idx, nums, sizes, dlse=None):
    if cfg.backend == "kernel":
        from .ffi import bsa as ffi_bsa  # noqa: PLC0415

        extra = {} if dlse is None else {"dlse": dlse}
        return ffi_bsa.bsa_bwd(do, q, k, v, out, lse, idx, nums, sizes, cfg, **extra)
    return reference.block_sparse_attention_bwd_ref(do, q, k, v, out, lse, idx, nums, sizes,
                                                    dlse=dlse, **_ref_options(cfg))


# jax.vmap folds the mapped axis into the batch axis B (jax_sparse_attn/_transforms.py)
def _fwd_impl(cfg, q, k, v, idx, nums, sizes):
    return _transforms.bsa_fwd(cfg, _fwd_backend)(q, k, v, idx, nums, sizes)


def _bwd_impl(cfg, do, q, k, v, out, lse, idx, nums, sizes, dlse=None):
    return _transforms.bsa_bwd(cfg, _bwd_backend)(do, q, k, v, out, lse, idx, nums, sizes,
                                                   dlse)


@partial(jax.custom_vjp, nondiff_argnums=(0,))
def _bsa(cfg, q, k, v, idx, nums, sizes):
    return _fwd_impl(cfg, q, k, v, idx, nums, sizes)[0]


def _bsa_vjp_fwd(cfg, q, k, v, idx, nums, sizes):
    out, lse = _fwd_impl(cfg, q, k, v, idx, nums, sizes)
    return out, (q, k, v, out, lse, idx, nums, sizes)


def _bsa_vjp_bwd(cfg, res, do):
    q, k, v, out, lse, idx, nums, sizes = res
    dq, dk, dv = _bwd_impl(cfg, do, q, k, v, out, lse, idx, nums, sizes)
    return dq, dk, dv, None, None, None


_bsa.defvjp(_bsa_vjp_fwd, _bsa_vjp_bwd)


@partial(jax.custom_vjp, nondiff_argnums=(0,))
def _bsa_out_lse(cfg, q, k, v, idx, nums, sizes):
    """``(out, lse)``, differentiable in q, k, v with cotangents for both outputs."""
    return _fwd_impl(cfg, q, k, v, idx, nums, sizes)


def _out_lse_vjp_fwd(cfg, q, k, v, idx, nums, sizes):
    out, lse = _fwd_impl(cfg, q, k, v, idx, nums, sizes)
    return (out, lse), (q, k, v, out, lse, idx, nums, sizes)


def _out_lse_vjp_bwd(cfg, res, cts):
    # d lse_i / d s_ij = P_ij, so the lse cotangent enters the row term of dS:
    # dS = P * (dP - delta) with delta_i = rowsum(dO * O) - dlse_i
    q, k, v, out, lse, idx, nums, sizes = res
    do, dlse = cts
    dq, dk, dv = _bwd_impl(cfg, do, q, k, v, out, lse, idx, nums, sizes, dlse=dlse)
    return dq, dk, dv, None, None, None


_bsa_out_lse.defvjp(_out_lse_vjp_fwd, _out_lse_vjp_bwd)
# jit with the config static: eager calls compile once per (config, shapes); inlined
# inside an outer jit.
_bsa_jit = jax.jit(_bsa, static_argnums=(0,))
_fwd_jit = jax.jit(_bsa_out_lse, static_argnums=(0,))
_bwd_jit = jax.jit(_bwd_impl, static_argnums=(0,))


_SEMANTICS_DOC = """
    Semantics: softmax attention over the listed key blocks; the metadata follow cuDNN's
    block-sparse attention conventions (see the module docstring and ``docs/bsa.md``).
"""

_ARG_LINES = """
      q: ``(B, H_q, S_q, D)`` for ``layout="bhsd"`` or ``(B, S_q, H_q, D)`` for
        ``"bshd"``; float16 or bfloat16 (float32/float64 run on the reference backend).
      k: ``(B, H_kv, S_kv, D)`` / ``(B, S_kv, H_kv, D)``, same dtype; ``H_q`` must be a
        multiple of ``H_kv`` (query head h uses KV head ``h // (H_q // H_kv)``).
      v: like k with head dim ``D_v``."""

_META_ARG_LINES = """
      q2k_block_index: int32 ``(B, H_q, N_q, K_max)``, ``K_max >= 1``: KV block ids per
        query block; only the active prefix is read. Active ids must be unique and in
        ``[0, N_kv)`` (caller contract, checked eagerly when concrete). Other integer
        dtypes of the metadata arrays are converted to int32.
      block_sparse_num: Python int in ``[1, K_max]``: fixed active-prefix length. Pass
        exactly one of this and ``q2k_block_nums``. Default None.
      block_sizes: optional int32 ``(N_kv,)``, ``(B, N_kv)`` or ``(B, H_q, N_kv)``, values
        in ``[1, sparse_block_size]``: tokens of each KV block that are keys (a prefix
        of the block). Default None: whole blocks (the tail past ``S_kv`` is always
        masked).
      q2k_block_nums: int32 ``(B, H_q, N_q)`` per-row active-prefix lengths in
        ``[1, K_max]`` (``[0, K_max]`` with ``allow_empty_block_nums=True``). Default None.
      sparse_block_size: 64 or 128 (default 128 on every backend).
      softmax_scale: Python number, finite in float32; default ``1 / sqrt(D)``. The scaled
        scores ``softmax_scale * q.k`` are computed in float32, as in any softmax kernel: a
        score that overflows to ``+inf`` (beyond about 3.4e38) makes its row's out NaN and
        its lse not finite; a row whose every score overflows to ``-inf`` reads as a row
        with no keys (out 0, lse ``-inf``).
      layout: ``"bhsd"`` (default) or ``"bshd"``; outputs follow it.
      allow_empty_block_nums: allow counts of 0 (empty rows: out 0, lse -inf); default
        False.
      backend: ``"auto"`` (default), ``"kernel"`` or ``"reference"`` (see
        :func:`hstu_attention`).
      switches: optional :class:`jax_sparse_attn.config.Switches` (kernel implementations;
        default None reads the environment, see :func:`hstu_attention`).
      debug_checks: bool, default False: also check traced metadata values (inside
        ``jax.jit``, or batched by ``jax.vmap`` even in an eager call) on the host at run time; bad values raise
        ``jax.errors.JaxRuntimeError`` with the eager validator's message under
        ``jax.jit`` (in an eager ``jax.vmap``, the validator's ``ValueError`` itself; see
        :func:`hstu_attention`). Without it, bad traced metadata give unspecified values
        (never an out-of-bounds access). Not with ``jax.export``, which cannot serialize
        the host callback (exporting a call that checks traced metadata raises
        ``NotImplementedError``).
      kv_splits: static int in ``[1, 256]`` or ``"auto"`` (default 1): split-KV, each row's
        active prefix cut into ``kv_splits`` contiguous chunks of ``ceil(n / kv_splits)``
        entries, per-chunk fp32 softmax partials merged by ``lse = log sum exp(lse_s)``
        (empty chunks contribute nothing). ``"auto"``: ``floor(num_SMs / (B H_q N_q))``
        (``B H_kv N_qp`` metadata rows with ``pack_gqa``) clamped to ``[1, min(K_max,
        256)]`` (132 SMs where no GPU is visible), resolved at trace time (1 for a
        symbolic batch of ``jax.export``). The backward
        does not split. Kernels: every forward splits (fp32
        partials + a combine kernel, ``docs/bsa.md``).
      pack_gqa: bool (default False): metadata over packed query rows ``p = s r + g``
        (position ``s`` of query head ``h_kv r + g``, ``r = H_q / H_kv`` must divide
        ``sparse_block_size``): ``q2k_block_index (B, H_kv, N_qp, K_max)``,
        ``q2k_block_nums (B, H_kv, N_qp)``, ``block_sizes`` ranks 1-2 or
        ``(B, H_kv, N_kv)``, ``N_qp = ceil(S_q r / blk)``; ``lse`` stays ``(B, H_q, S_q)``.
        Semantics: cuDNN's packed GQA (FlashAttention's ``pack_gqa``). Reference backend,
        and the SM90 kernels at D in {64, 128} for r dividing 64, with any ``kv_splits`` and
        with ``causal`` (the mma.sync kernels decline it).
      causal: bool (default False): token-level causal mask inside the listed blocks,
        key ``j`` visible from query position ``i`` iff ``j <= i + S_kv - S_q``
        (bottom-right aligned). Kernels: the sm90 ones (D in {64, 128} on sm_90a; the
        warp-specialized backward, also under ``pack_gqa``); the mma.sync (sm80 /
        portable) kernels raise NotImplementedError. Keys past the diagonal are data of
        the later rows, not padding: a NaN / Inf in such a key's ``k`` stays out of the
        earlier rows, but one in its ``v`` reaches the earlier rows of a query block that
        lists its block through their zero weight (``0 * NaN = NaN`` in ``P V``, as in
        causal softmax kernels; likewise a NaN ``q`` of a row that sees no key of a listed
        block reaches that block's ``dk``). Keys of unlisted blocks, past ``S_kv`` or past
        ``block_sizes`` never reach a result (``docs/bsa.md``).
      deterministic: static bool (default False). With True the backward's gradients are
        bitwise reproducible run to run. By default the dq contributions of the KV blocks
        are not ordered: each is converted to int32 fixed point with a power-of-two scale
        per query row taken from a bound on its values, and int32 sums do not depend on
        the order of the additions. With the ``bsa_bwd_ws`` switch ``detorder`` (or where
        the fixed point does not apply: the ``pdl`` or ``dq_writer`` switch off,
        ``bsa_bwd_dq="rows"``, or the ``bsa_bwd_ws`` options ``notailconv``, ``dqalt``,
        ``dqclaim``, ``decouple``, ``zerolag``, ``persist``) the contributions to each
        64-row query tile are added in a fixed order, each waiting for its turn on an int32
        counter of the tile (FlashAttention-2/3's deterministic backward technique); the
        order is computed on the GPU from the block lists along the launch schedule (one
        extra launch), or with GQA follows the launch order of the KV blocks; with ``detorder``
        at sparse_block_size 64, K_max >= 32 and one query head per KV head a tile has two
        fp32 accumulators, so which dq bits a call reproduces depends on its static shapes.
        In the fixed-point mode a dq row with a value that is not finite is NaN in every
        column. dk, dv and the forward are deterministic in both modes. Kernels: the warp-specialized Hopper
        backward (D in {64, 128}, sm_90a, without pack_gqa; its cost is in
        ``docs/bsa.md``);
        elsewhere ``backend="auto"`` runs the reference (deterministic) and
        ``backend="kernel"`` raises NotImplementedError.
"""

_ARGS_DOC = "\n    Args:" + _ARG_LINES + _META_ARG_LINES

_RAISES_DOC = """
    Raises:
      ValueError: bad ranks/shapes (also zero head dims), layout not in {"bhsd",
        "bshd"}, sparse_block_size not in {64, 128}, kv_splits outside [1, 256] or a string other than
        "auto", pack_gqa with H_q = 0 or H_q / H_kv not dividing sparse_block_size, K_max = 0,
        both or neither of
        block_sparse_num/q2k_block_nums, block_sparse_num outside [1, K_max], a
        softmax_scale that is not finite in float32, backend not in {"auto", "kernel", "reference"}, a
        switch environment variable outside its allowed values, and
        (for concrete metadata) bad values, see
        :func:`~jax_sparse_attn.validate_bsa_metadata`.
      TypeError: deterministic not a bool, mixed or unsupported dtypes, non-integer metadata, a non-bool
        allow_empty_block_nums, block_sparse_num/softmax_scale not static Python numbers,
        sparse_block_size not a static int,
        ``switches`` not a ``Switches``, kv_splits neither an int nor a string, pack_gqa /
        causal not bools, metadata arrays given as a ``jax.ShapeDtypeStruct`` (an array is
        needed; backward: ``do``, ``o`` or ``lse`` of the wrong dtype).
      NotImplementedError: ``backend="kernel"`` where the kernel cannot run (also
        ``causal=True`` where the mma.sync kernels would run: D in {32, 256}, the portable
        kernel family or the ``sm80`` switches; ``pack_gqa=True`` there too; a
        ``kv_splits`` whose fp32 partials would
        pass 2^31 elements; ``deterministic=True`` where the warp-specialized backward
        does not run).
"""


def block_sparse_attention(q, k, v, q2k_block_index, block_sparse_num=None, block_sizes=None,
                           q2k_block_nums=None, *, sparse_block_size=128, softmax_scale=None,
                           layout="bhsd", allow_empty_block_nums=False, backend="auto",
                           switches=None, debug_checks=False, kv_splits=1, pack_gqa=False,
                           causal=False, deterministic=False):
    cfg, idx, nums, sizes = _make_config(
        q, k, v, q2k_block_index, block_sparse_num, block_sizes, q2k_block_nums,
        sparse_block_size=sparse_block_size, softmax_scale=softmax_scale, layout=layout,
        allow_empty_block_nums=allow_empty_block_nums, backend=backend, switches=switches,
        debug_checks=debug_checks, kv_splits=kv_splits, pack_gqa=pack_gqa, causal=causal,
        deterministic=deterministic, op_name="block_sparse_attention")
    return _bsa_jit(cfg, q, k, v, idx, nums, sizes)


block_sparse_attention.__doc__ = (
    """Block-sparse softmax attention.

    ``out = softmax(softmax_scale * q k^T over the listed key blocks) v`` per query block,
    fp32 accumulation. Differentiable in q, k, v (``jax.custom_vjp``; the forward saves
    q, k, v, out, lse and the metadata, the backward of the same backend runs).
"""
    + _SEMANTICS_DOC
    + _ARGS_DOC
    + """
    Returns:
      ``out`` in the input layout (``(B, H_q, S_q, D_v)`` for bhsd), q's dtype.
"""
    + _RAISES_DOC
)


def block_sparse_attention_forward(q, k, v, q2k_block_index, block_sparse_num=None,
                                   block_sizes=None, q2k_block_nums=None, *,
                                   sparse_block_size=128, softmax_scale=None, layout="bhsd",
                                   allow_empty_block_nums=False, backend="auto",
                                   switches=None, debug_checks=False, kv_splits=1,
                                   pack_gqa=False, causal=False, deterministic=False):
    cfg, idx, nums, sizes = _make_config(
        q, k, v, q2k_block_index, block_sparse_num, block_sizes, q2k_block_nums,
        sparse_block_size=sparse_block_size, softmax_scale=softmax_scale, layout=layout,
        allow_empty_block_nums=allow_empty_block_nums, backend=backend, switches=switches,
        debug_checks=debug_checks, kv_splits=kv_splits, pack_gqa=pack_gqa, causal=causal,
        deterministic=deterministic, op_name="block_sparse_attention_forward")
    out, lse = _fwd_jit(cfg, q, k, v, idx, nums, sizes)
    return BSAForwardResult(o_tensor=out, lse_tensor=lse)


block_sparse_attention_forward.__doc__ = (
    """Forward of :func:`block_sparse_attention` returning ``(o_tensor, lse_tensor)``.
"""
    + _SEMANTICS_DOC
    + _ARGS_DOC
    + """
    Differentiable in q, k, v on every backend with cotangents for both ``o_tensor`` and
    ``lse_tensor`` (``jax.custom_vjp``): the lse cotangent enters the backward's row term,
    ``delta_i = rowsum(dO * O) - dlse_i`` (z-loss, distillation, merging partial
    attention results).

    Returns:
      :class:`~jax_sparse_attn._results.BSAForwardResult`: ``o_tensor`` (input layout,
      q's dtype) and ``lse_tensor (B, H_q, S_q)`` float32 (float64 for float64 inputs)
      natural-log sum of
      ``exp(softmax_scale * q.k)`` over the attended keys (``-inf`` for empty rows).
      Supports ``res["lse_tensor"]`` and ``o, lse = res``.
"""
    + _RAISES_DOC
)


def _lse_dtype(cfg):
    """lse's dtype for the call's inputs: float32 (float64 for float64 inputs)."""
    return jnp.promote_types(jnp.dtype(cfg.dtype), jnp.float32)


def block_sparse_attention_backward(do, q, k, v, o, lse, q2k_block_index, block_sparse_num=None,
                                    block_sizes=None, q2k_block_nums=None, *,
                                    sparse_block_size=128, softmax_scale=None, layout="bhsd",
                                    allow_empty_block_nums=False, backend="auto",
                                    switches=None, dlse=None, debug_checks=False, kv_splits=1,
                                    pack_gqa=False, causal=False, deterministic=False):
    def check_cotangents(cfg):
        lse_dtype = _lse_dtype(cfg)
        qs = tuple(q.shape)
        out_shape = qs[:-1] + (cfg.head_dim_v,)
        for name, x in (("do", do), ("o", o), ("lse", lse)):
            if x is None:
                raise ValueError(f"{name} is required (got None): the backward takes the "
                                 f"forward's out and lse (block_sparse_attention_forward) and "
                                 f"the cotangent do")
        for name, x in (("do", do), ("o", o), ("lse", lse), ("dlse", dlse)):
            if x is not None and not hasattr(x, "shape"):
                raise TypeError(f"{name} must be an array (jax.Array or numpy.ndarray), got "
                                f"{type(x).__name__}")
        for name, x in (("do", do), ("o", o)):
            if tuple(getattr(x, "shape", ())) != out_shape:
                raise ValueError(f"{name} must have the output's shape {out_shape}, "
                                 f"got {tuple(getattr(x, 'shape', ()))}")
            if canonical_dtype(x) != canonical_dtype(q):
                raise TypeError(f"{name} dtype {canonical_dtype(x)} must equal q's dtype "
                                f"{canonical_dtype(q)}")
        lse_shape = (cfg.batch, cfg.num_heads_q, cfg.seqlen_q)
        if tuple(getattr(lse, "shape", ())) != lse_shape:
            raise ValueError(f"lse must have shape (B, H_q, S_q) = {lse_shape}, "
                             f"got {tuple(getattr(lse, 'shape', ()))}")
        if canonical_dtype(lse) != lse_dtype:
            raise TypeError(f"lse must be {lse_dtype} (the lse_tensor of "
                            f"block_sparse_attention_forward for {canonical_dtype(q)} inputs), "
                            f"got {canonical_dtype(lse)}")
        if dlse is not None:
            if tuple(getattr(dlse, "shape", ())) != lse_shape:
                raise ValueError(f"dlse must have lse's shape (B, H_q, S_q) = {lse_shape}, "
                                 f"got {tuple(getattr(dlse, 'shape', ()))}")
            if not jnp.issubdtype(canonical_dtype(dlse), jnp.floating):
                raise TypeError(f"dlse must be a floating array, got {canonical_dtype(dlse)}")

    cfg, idx, nums, sizes = _make_config(
        q, k, v, q2k_block_index, block_sparse_num, block_sizes, q2k_block_nums,
        sparse_block_size=sparse_block_size, softmax_scale=softmax_scale, layout=layout,
        allow_empty_block_nums=allow_empty_block_nums, backend=backend, switches=switches,
        debug_checks=debug_checks, kv_splits=kv_splits, pack_gqa=pack_gqa, causal=causal,
        deterministic=deterministic, op_name="block_sparse_attention_backward",
        extra_checks=check_cotangents)
    if dlse is not None:
        dlse = jnp.asarray(dlse).astype(_lse_dtype(cfg))
    dq, dk, dv = _bwd_jit(cfg, do, q, k, v, o, lse, idx, nums, sizes, dlse)
    return BSABackwardResult(dq_tensor=dq, dk_tensor=dk, dv_tensor=dv)


block_sparse_attention_backward.__doc__ = (
    """Backward of :func:`block_sparse_attention` from the saved forward results.
"""
    + _SEMANTICS_DOC
    + """
    Args:
      do: output cotangent, the output's shape (input layout) and q's dtype."""
    + _ARG_LINES
    + """
      o: ``o_tensor`` of :func:`block_sparse_attention_forward` for the same inputs.
      lse: its ``lse_tensor (B, H_q, S_q)``, float32 (float64 for float64 inputs)."""
    + _META_ARG_LINES
    + """
      dlse: optional cotangent of ``lse`` (its shape, floating; default None = 0): the
        gradients are then those of ``sum(do * o) + sum(dlse * lse)``.

    Returns:
      :class:`~jax_sparse_attn._results.BSABackwardResult` with ``dq_tensor``,
      ``dk_tensor``, ``dv_tensor`` (input layout and dtypes).
"""
    + _RAISES_DOC
)
