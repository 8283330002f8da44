"""Mask and metadata builders (pure ``jnp``, jit-able).

HSTU ``func`` builders
    :func:`hstu_target_func` builds the generative-recommender masks of Meta's
    generative-recommenders / HSTU paper (Zhai et al. 2024) as an interval mask
    ``func`` for :func:`~jax_sparse_attn.hstu_attention`: causal history,
    ``num_targets`` candidate items at the end of each sequence, a contextual prefix
    and an optional ``max_attn_len`` window. :func:`hstu_func_to_dense` expands any
    ``func`` into per-sequence dense masks (for inspection and tests).

BSA metadata builders
    :func:`block_mask_to_index` turns a dense block mask ``(B, H, N_q, N_kv) bool`` into
    ``(q2k_block_index, q2k_block_nums)`` (a ``(B, H_kv, N_qp, N_kv)`` mask over packed
    query blocks gives ``pack_gqa`` metadata); :func:`topk_block_index` picks the top-k KV
    blocks per query block from mean-pooled QK scores (``pack_gqa=True``: per packed
    block); :func:`transpose_block_index` builds the transposed KV->Q lists (CSR) a
    backward pass iterates over.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .metadata import build_kq_csr
from .validation import (HSTU_FUNC_PAD, SPARSE_BLOCK_SIZES, _check_bool, _check_int,
                         _check_offsets, _check_rank, _static_int, is_concrete)

__all__ = [
    "hstu_target_func",
    "hstu_func_to_dense",
    "func_interval_mask",
    "block_mask_to_index",
    "topk_block_index",
    "transpose_block_index",
]


# ----------------------------------------------------------------------------- HSTU


def _check_int32_values(name, x, why="token counts and offsets are int32"):
    """Concrete integer values outside int32 raise ValueError: ``jnp.asarray`` (without
    x64) and the int32 ``func`` would wrap them (``2**32 + 5`` becoming ``5``). Traced
    values (inside ``jax.jit``) are int32 already."""
    if any(isinstance(e, jax.core.Tracer) for e in jax.tree_util.tree_leaves(x)):
        return
    dt = getattr(x, "dtype", None)
    if dt is not None and np.can_cast(dt, np.int32):
        return  # nothing to read back: every value of the dtype fits
    a = np.asarray(x)
    if a.dtype.kind in "iu" and a.size:
        info = np.iinfo(np.int32)
        lo, hi = int(a.min()), int(a.max())
        if lo < info.min or hi > info.max:
            raise ValueError(f"{name} must hold int32 values ({why}), got values in "
                             f"[{lo}, {hi}]")


def hstu_target_func(cu_seqlens, total_len: int, *, num_targets=None, contextual_seq_len: int = 0,
                     max_attn_len: int | None = None, func_len: int | None = None):
    """Interval mask ``func`` for self-attention over packed sequences with targets.

    For a sequence of length ``L`` with ``n = num_targets[b]`` targets (the last ``n``
    tokens, clipped to ``[0, L]``), history length ``L_h = L - n``, contextual length
    ``c = contextual_seq_len`` and window ``w = max_attn_len`` (None/0 = unbounded),
    local query ``i`` sees the local keys:

    * contextual query ``i < min(c, L_h)``: every non-target key ``[0, L_h)``;
    * history query ``c <= i < L_h``: the keys ``[max(c, i - w), i]`` (causal, windowed),
      and the contextual keys ``[0, min(c, L_h))`` when ``i - c + 1 <= w`` (all or none);
    * target query ``i >= L_h``: the history keys ``[max(c, L_h - w), L_h)``, the contextual
      keys when ``L_h - c + 1 <= w``, and itself.

    With ``w`` unbounded a history query sees ``[0, i]`` and a target ``[0, L_h)`` and
    itself. Where the contextual prefix fits the history (``c <= L_h``) this is the mask of
    generative-recommenders' reference (``_get_valid_attn_mask``, causal): the ``c``
    contextual positions share one position id, ``0``, and the history ones follow
    (``i - c + 1``), so a query is as far from every contextual key as from position
    ``c - 1``; every target shares the id after the history's. With ``c > L_h`` (a
    contextual prefix reaching into the targets) the rules above clip it to the history,
    ``min(c, L_h)``, where that reference's position ids differ.

    Use with ``hstu_attention(..., cu_seqlens_q=cu, cu_seqlens_k=cu,
    window_size=(-1, -1), func=func)``.

    Args:
      cu_seqlens: ``(B+1,)`` int32 prefix sums (queries = keys).
      total_len: static int ``T`` (= ``q.shape[0]``).
      num_targets: optional ``(B,)`` int32.
      contextual_seq_len: static int ``c >= 0``.
      max_attn_len: static int window or None.
      func_len: static ``L_f``, default ``T + 256`` (the minimum the op accepts).

    Returns:
      int32 ``(1, N, L_f)`` with ``N = 5`` when ``num_targets`` is given, else 3; rows
      outside every sequence see nothing.

    Raises:
      ValueError: ``cu_seqlens`` not ``(B+1,)``, or (concrete values) outside int32, not
        starting at 0, decreasing or ending past ``total_len``; ``num_targets`` not ``(B,)``
        or (concrete values) outside int32, a negative
        ``total_len`` / ``contextual_seq_len`` / ``max_attn_len``, ``func_len`` below
        ``total_len + 256``.
      TypeError: non-integer ``cu_seqlens`` / ``num_targets``, or a static size that is
        not a Python int.
    """
    T = _static_int("total_len", total_len, 0)
    L_f = T + HSTU_FUNC_PAD if func_len is None else _static_int("func_len", func_len)
    if L_f < T + HSTU_FUNC_PAD:
        raise ValueError(f"func_len must be >= total_len + {HSTU_FUNC_PAD} = {T + HSTU_FUNC_PAD}, got {L_f}")
    c = _static_int("contextual_seq_len", contextual_seq_len)
    if c < 0:
        raise ValueError(f"contextual_seq_len must be >= 0, got {c}")
    w = None if max_attn_len is None else _static_int("max_attn_len", max_attn_len)
    if w is not None and w < 0:
        raise ValueError(f"max_attn_len must be >= 0 or None, got {max_attn_len}")
    w = w or None  # 0 = unbounded
    _check_int32_values("cu_seqlens", cu_seqlens)
    cu_seqlens = jnp.asarray(cu_seqlens)
    (n_cu,) = _check_rank("cu_seqlens", cu_seqlens, 1, "(B+1,)")
    _check_int("cu_seqlens", cu_seqlens)
    if n_cu < 1:
        raise ValueError("cu_seqlens must have B+1 >= 1 entries, got 0")
    if is_concrete(cu_seqlens):
        cu_np = np.asarray(cu_seqlens).astype(np.int64)
        if cu_np[0] != 0 or np.any(np.diff(cu_np) < 0):
            raise ValueError(f"cu_seqlens must start at 0 and be non-decreasing, got "
                             f"{cu_np.tolist()[:8]}{' ...' if cu_np.size > 8 else ''}")
        if cu_np[-1] > T:
            raise ValueError(f"cu_seqlens[-1]={int(cu_np[-1])} exceeds total_len={T} (the "
                             f"packed length, q.shape[0])")
    if num_targets is not None:
        _check_int32_values("num_targets", num_targets)
        num_targets = jnp.asarray(num_targets)
        _check_rank("num_targets", num_targets, 1, f"(B,) = ({n_cu - 1},)")
        _check_int("num_targets", num_targets)
        if num_targets.shape[0] != n_cu - 1:
            raise ValueError(f"num_targets must have shape (B,) = ({n_cu - 1},) (one count per "
                             f"sequence of cu_seqlens), got {tuple(num_targets.shape)}")
    return _target_func(cu_seqlens.astype(jnp.int32),
                        None if num_targets is None else num_targets.astype(jnp.int32),
                        L_f, c, w)


@partial(jax.jit, static_argnums=(2, 3, 4))
def _target_func(cu, num_targets, L_f, c, w):
    """The body of :func:`hstu_target_func` on validated arguments (one compiled program per
    shape and static options when called outside ``jit``, inlined inside one)."""
    B = cu.shape[0] - 1
    r = jnp.arange(L_f, dtype=jnp.int32)
    b_r = jnp.searchsorted(cu, r, side="right").astype(jnp.int32) - 1
    in_seq = (b_r >= 0) & (b_r < B)
    b_c = jnp.clip(b_r, 0, max(B - 1, 0))
    L = (cu[b_c + 1] - cu[b_c]) if B > 0 else jnp.zeros_like(r)
    i = r - (cu[b_c] if B > 0 else 0)
    if num_targets is None:
        n = jnp.zeros_like(r)
    else:
        n = jnp.clip(num_targets[b_c], 0, L)
    Lh = L - n
    zero = jnp.zeros_like(r)
    is_target = i >= Lh
    is_ctx = (i < c) & ~is_target
    # the contextual keys [0, F0): the first min(c, L_h), for a history / target query
    # within the window of their shared position id (all or none)
    c_keys = jnp.minimum(c, Lh)
    if w is None:
        sees_ctx = jnp.ones_like(is_target)
        lo_hist = jnp.full_like(r, c)
        lo_tgt = jnp.full_like(r, c)
    else:
        sees_ctx = jnp.where(is_target, Lh - c + 1, i - c + 1) <= w
        lo_hist = jnp.maximum(i - w, c)
        lo_tgt = jnp.maximum(Lh - w, c)
    f0 = jnp.where(sees_ctx & ~is_ctx, c_keys, zero)
    # interval [F1, F2): causal/windowed history keys from c on (the whole history for
    # contextual rows); [F3, F4): a target's own position
    f1 = jnp.where(is_target, jnp.minimum(lo_tgt, Lh), jnp.where(is_ctx, zero, lo_hist))
    f2 = jnp.where(is_target | is_ctx, Lh, i + 1)
    f0 = jnp.where(in_seq, f0, zero)
    f1 = jnp.where(in_seq, f1, zero)
    f2 = jnp.where(in_seq, f2, zero)
    rows = [f0, f1, f2]
    if num_targets is not None:
        rows += [jnp.where(in_seq & is_target, i, zero), jnp.where(in_seq & is_target, i + 1, zero)]
    return jnp.stack(rows)[None].astype(jnp.int32)


def func_interval_mask(endpoints, j):
    """The ``func`` key rule: is key ``j`` in ``[0, F_0) U [F_1, F_2) U [F_3, F_4) U ...``?

    ``endpoints`` int ``(N, *rows)`` (N odd) holds ``F_0 .. F_{N-1}`` of each query row,
    ``j`` int ``(L,)`` key positions. Returns bool ``(*rows, L)``. Intervals may be empty,
    overlap or come in any order. Raises ValueError for an even N or a ``j`` that is not
    1-D.
    """
    endpoints, j = jnp.asarray(endpoints), jnp.asarray(j)
    if endpoints.ndim < 1 or endpoints.shape[0] % 2 != 1:
        raise ValueError(f"endpoints must have an odd leading size N (F_0, then pairs "
                         f"[F_1, F_2), ...), got shape {tuple(endpoints.shape)}")
    if j.ndim != 1:
        raise ValueError(f"j must be the 1-D key positions (L,), got shape {tuple(j.shape)}")
    inside = j < endpoints[0][..., None]
    if endpoints.shape[0] > 1:
        lo, hi = endpoints[1::2][..., None], endpoints[2::2][..., None]
        inside = inside | jnp.any((j >= lo) & (j < hi), axis=0)
    return inside


def hstu_func_to_dense(func, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, max_seqlen_k: int):
    """Expand ``func`` into dense per-sequence masks ``(B, max_seqlen_q, max_seqlen_k) bool``.

    Entry ``[b, i, j]`` is True iff local key ``j`` is in
    ``[0, F_0) U [F_1, F_2) U ...`` for global row ``cu_seqlens_q[b] + i``, intersected
    with the sequence's valid queries and keys. Meant for inspection and tests (it is
    dense by construction).

    Args:
      func: int ``(1, N, L_f)`` with N odd and ``L_f >= T_q``, as
        :func:`jax_sparse_attn.hstu_attention` takes it.
      cu_seqlens_q, cu_seqlens_k: int ``(B+1,)`` offsets.
      max_seqlen_q, max_seqlen_k: static ints >= 0, at least every sequence's length (the
        masks' extents).
    Raises:
      TypeError: a float ``func`` or ``cu_seqlens_*``, or non-int ``max_seqlen_*``.
      ValueError: a wrong rank or shape, an even N, and for concrete values: values
        outside int32, offsets not starting at 0 or decreasing, or a sequence longer than
        ``max_seqlen_q`` / ``max_seqlen_k``.
    """
    for name, x in (("func", func), ("cu_seqlens_q", cu_seqlens_q),
                    ("cu_seqlens_k", cu_seqlens_k)):
        _check_int32_values(name, x)
    f = jnp.asarray(func)
    _check_rank("func", f, 3, "(1, N, T_q) with N odd")
    _check_int("func", f)
    if f.shape[0] != 1 or f.shape[1] % 2 != 1:
        raise ValueError(f"func must have shape (1, N, T_q) with N odd, got {tuple(f.shape)}")
    f = f[0].astype(jnp.int32)
    mq = _static_int("max_seqlen_q", max_seqlen_q, 0)
    mk = _static_int("max_seqlen_k", max_seqlen_k, 0)
    cus = []
    for name, cu, m, mname in (("cu_seqlens_q", cu_seqlens_q, mq, "max_seqlen_q"),
                               ("cu_seqlens_k", cu_seqlens_k, mk, "max_seqlen_k")):
        cu = jnp.asarray(cu)
        _check_rank(name, cu, 1, "(B+1,)")
        _check_int(name, cu)
        if cu.shape[0] < 1:
            raise ValueError(f"{name} must have B+1 >= 1 entries, got 0")
        if is_concrete(cu):
            _, lens = _check_offsets(name, cu)
            long = np.flatnonzero(lens > m)
            if long.size:
                b = int(long[0])
                raise ValueError(f"{mname}={m} is smaller than sequence {b}'s length "
                                 f"{int(lens[b])} (from {name}); the mask would be cut")
        cus.append(cu.astype(jnp.int32))
    cu_q, cu_k = cus
    if cu_k.shape != cu_q.shape:
        raise ValueError(f"cu_seqlens_k must have the shape of cu_seqlens_q "
                         f"{tuple(cu_q.shape)}, got {tuple(cu_k.shape)}")
    max_seqlen_q, max_seqlen_k = mq, mk
    i = jnp.arange(max_seqlen_q, dtype=jnp.int32)
    j = jnp.arange(max_seqlen_k, dtype=jnp.int32)
    rows = jnp.clip(cu_q[:-1, None] + i[None, :], 0, f.shape[1] - 1)  # (B, Lq)
    inside = func_interval_mask(f[:, rows], j)  # (B, Lq, Lk)
    Lq = (cu_q[1:] - cu_q[:-1])[:, None, None]
    Lk = (cu_k[1:] - cu_k[:-1])[:, None, None]
    return inside & (i[None, :, None] < Lq) & (j[None, None, :] < Lk)


# ----------------------------------------------------------------------------- BSA


def block_mask_to_index(block_mask, max_blocks: int | None = None):
    """Dense block mask -> ``(q2k_block_index, q2k_block_nums)``.

    Args:
      block_mask: bool ``(B, H, N_q, N_kv)`` (an integer array: nonzero = True); True =
        query block m attends KV block n.
        For ``pack_gqa`` metadata pass the mask over packed query blocks,
        ``(B, H_kv, N_qp, N_kv)``.
      max_blocks: static ``K_max``; default ``N_kv``. Rows with more than ``K_max`` True
        entries keep their ``K_max`` lowest block ids (the counts are clipped too).

    Returns:
      ``q2k_block_index`` int32 ``(B, H, N_q, K_max)``: the True block ids in ascending
      order, then the remaining ids (ignored: past the active prefix);
      ``q2k_block_nums`` int32 ``(B, H, N_q)``: number of True entries (min K_max). Rows
      without any True entry have count 0 (use ``allow_empty_block_nums=True``).

    Raises:
      ValueError: ``block_mask`` not of rank 4; ``max_blocks`` below 1, or not given with
        ``N_kv = 0``.
      TypeError: ``block_mask`` neither bool nor integer; ``max_blocks`` not a Python int.
    """
    mask = jnp.asarray(block_mask)
    if mask.ndim != 4:
        raise ValueError(f"block_mask must have rank 4 (B, H, N_q, N_kv), got shape {mask.shape}")
    if not (mask.dtype == jnp.bool_ or jnp.issubdtype(mask.dtype, jnp.integer)):
        raise TypeError(f"block_mask must be a bool (or integer: nonzero = True) array, got "
                        f"dtype {mask.dtype}")
    mask = mask.astype(bool)
    n_kv = mask.shape[-1]
    if max_blocks is None:
        if n_kv < 1:
            raise ValueError(f"block_mask has N_kv = 0 KV blocks (shape {mask.shape}): pass "
                             f"max_blocks >= 1 for the K_max of the (empty) lists")
        k_max = n_kv
    else:
        k_max = _static_int("max_blocks", max_blocks)
    if k_max < 1:
        raise ValueError(f"max_blocks must be >= 1, got {k_max}")
    order = jnp.argsort(~mask, axis=-1, stable=True).astype(jnp.int32)
    if k_max <= n_kv:
        index = order[..., :k_max]
    else:
        index = jnp.concatenate(
            [order, jnp.zeros(order.shape[:-1] + (k_max - n_kv,), jnp.int32)], axis=-1)
    nums = jnp.minimum(jnp.sum(mask, axis=-1), k_max).astype(jnp.int32)
    return index, nums


def _block_means(x, blk):
    """(B, H, S, D) -> mean over the valid tokens of each block, (B, H, N, D) float32."""
    B, H, S, D = x.shape
    n = -(-S // blk)
    xp = jnp.pad(x.astype(jnp.float32), ((0, 0), (0, 0), (0, n * blk - S), (0, 0)))
    sums = xp.reshape(B, H, n, blk, D).sum(axis=3)
    counts = jnp.minimum(blk, S - jnp.arange(n) * blk).astype(jnp.float32)
    return sums / counts[None, None, :, None]


def topk_block_index(q, k, top_k: int, *, sparse_block_size: int = 128, layout: str = "bhsd",
                     causal: bool = False, pack_gqa: bool = False):
    """Top-k KV blocks per query block from mean-pooled QK scores.

    Scores ``mean_pool(q_block_m) . mean_pool(k_block_n)`` (means over the valid tokens
    of each block; query head h uses KV head ``h // (H_q // H_kv)``). With ``causal`` KV
    blocks after the query block's diagonal block are excluded and the diagonal block is
    always kept: the diagonal block holds key ``s_last + S_kv - S_q`` of the block's last
    query position ``s_last = min((m + 1) blk, S_q) - 1`` (token-exact, bottom-right aligned
    as the op's ``causal=True``, so the lists hold every key a causal call can see; when
    ``S_q`` and ``S_kv`` are multiples of ``blk`` this is block ``m + N_kv - N_q``). A query
    block whose last position sees no key (``s_last + S_kv - S_q < 0``, possible when
    ``S_q > S_kv``) gets count 0 (pass ``allow_empty_block_nums=True`` to the op).

    With ``pack_gqa`` the metadata are built at packed granularity (the ``pack_gqa``
    contract of :func:`~jax_sparse_attn.block_sparse_attention`): the query block is the
    packed block ``m`` of KV head ``h_kv`` (packed rows ``[m blk, (m + 1) blk)``, row
    ``s r + g`` = position ``s`` of query head ``h_kv r + g``), pooled over all its rows;
    with ``causal`` its diagonal block is found as above from its last query position
    ``s_last`` (packed row ``(m + 1) blk - 1`` is position ``((m + 1) blk - 1) // r``).

    Args:
      q: ``(B, H_q, S_q, D)`` (bhsd) or ``(B, S_q, H_q, D)`` (bshd).
      k: ``(B, H_kv, S_kv, D)`` / ``(B, S_kv, H_kv, D)``.
      top_k: static ``K_max`` (>= 1, clipped to ``N_kv``).
      sparse_block_size: 64 or 128 (default 128, as the op's).
      layout: "bhsd" or "bshd".
      causal: restrict to KV blocks up to the diagonal block (see above).
      pack_gqa: build packed metadata (default False).

    Returns:
      ``(q2k_block_index int32 (B, H_q, N_q, K_max), q2k_block_nums int32 (B, H_q, N_q))``,
      indices of the active prefix sorted by descending score (a NaN score, from NaN in a
      block's queries or keys, ranks below every finite one; ties: the lower block first);
      with ``pack_gqa``
      ``(B, H_kv, N_qp, K_max)`` and ``(B, H_kv, N_qp)``, ``N_qp = ceil(S_q r / blk)``.

    Raises:
      ValueError: ``top_k < 1``, ``sparse_block_size`` not in {64, 128}, a layout other
        than "bhsd"/"bshd", ``H_q`` not a multiple of ``H_kv``, or (``pack_gqa``) ``H_q = 0``
        or the group size ``r = H_q / H_kv`` not dividing ``sparse_block_size``.
      TypeError: ``q`` or ``k`` not floating-point, ``causal`` / ``pack_gqa`` not bools,
        ``top_k`` / ``sparse_block_size`` not static ints.
    """
    if layout not in ("bhsd", "bshd"):
        raise ValueError(f"layout must be 'bhsd' or 'bshd', got {layout!r}")
    blk = _static_int("sparse_block_size", sparse_block_size)
    if blk not in SPARSE_BLOCK_SIZES:
        raise ValueError(f"sparse_block_size must be one of {SPARSE_BLOCK_SIZES}, got {blk!r}")
    causal = _check_bool("causal", causal)
    pack_gqa = _check_bool("pack_gqa", pack_gqa)
    top_k = _static_int("top_k", top_k)
    if top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    desc = "(B, H, S, D)" if layout == "bhsd" else "(B, S, H, D)"
    _check_rank("q", q, 4, desc)
    _check_rank("k", k, 4, desc)
    for name, x in (("q", q), ("k", k)):
        if not jnp.issubdtype(jnp.asarray(x).dtype, jnp.floating):
            raise TypeError(f"{name} must be a floating-point array (the attention's "
                            f"queries / keys), got dtype {jnp.asarray(x).dtype}")
    if layout == "bshd":
        q = jnp.swapaxes(q, 1, 2)
        k = jnp.swapaxes(k, 1, 2)
    B, Hq, Sq, D = q.shape
    Bk, Hkv, Skv, Dk = k.shape
    if Bk != B or Dk != D:
        raise ValueError(f"k must have q's batch size {B} and head dim {D} (layout={layout!r} "
                         f"{desc}), got batch {Bk} and head dim {Dk}")
    if Hkv < 1:
        raise ValueError(f"k needs at least one KV head (H_kv >= 1), got H_kv={Hkv} (H_q={Hq})")
    if Hq % Hkv:
        raise ValueError(f"H_q={Hq} must be a multiple of H_kv={Hkv}")
    if Skv < 1:
        raise ValueError(f"k must have S_kv >= 1 keys (N_kv >= 1 blocks to choose from), got "
                         f"S_kv={Skv}")
    r = Hq // Hkv
    if pack_gqa:
        if r < 1:
            raise ValueError(f"pack_gqa=True needs H_q >= 1 query heads (a GQA group of r = "
                             f"H_q / H_kv >= 1 rows to pack), got H_q={Hq}")
        if blk % r:
            raise ValueError(f"pack_gqa=True needs the GQA group size r = H_q / H_kv = {r} to "
                             f"divide sparse_block_size={blk}")
        qp = jnp.swapaxes(q.reshape(B, Hkv, r, Sq, D), 2, 3).reshape(B, Hkv, Sq * r, D)
        qm = _block_means(qp, blk)
        km = _block_means(k, blk)
    else:
        qm = _block_means(q, blk)
        km = jnp.repeat(_block_means(k, blk), r, axis=1)
    scores = jnp.einsum("bhmd,bhnd->bhmn", qm, km)
    # a NaN score (NaN in a block's queries or keys) ranks below every finite score and
    # above the excluded blocks (lax.top_k would rank it first)
    scores = jnp.where(jnp.isnan(scores), jnp.finfo(scores.dtype).min, scores)
    n_q, n_kv = qm.shape[2], km.shape[2]
    kk = max(1, min(int(top_k), n_kv))
    allowed = jnp.ones((n_q, n_kv), bool)
    if causal:
        m = jnp.arange(n_q)[:, None]
        n = jnp.arange(n_kv)[None, :]
        # the last query position of the (packed) block and the KV block of its last
        # visible key (bottom-right aligned, the op's causal=True)
        s_last = jnp.minimum(((m + 1) * blk - 1) // (r if pack_gqa else 1), Sq - 1)
        diag = jnp.floor_divide(s_last + (k.shape[2] - Sq), blk)
        allowed = n <= diag
        scores = jnp.where(n == diag, jnp.inf, scores)
    scores = jnp.where(allowed, scores, -jnp.inf)
    _, index = lax.top_k(scores, kk)
    nums = jnp.minimum(jnp.sum(allowed, axis=-1), kk).astype(jnp.int32)
    nums = jnp.broadcast_to(nums, (B, qm.shape[1], n_q))
    return index.astype(jnp.int32), nums


def transpose_block_index(q2k_block_index, q2k_block_nums, num_kv_blocks: int):
    """Transposed (KV -> Q) block lists in CSR form, for backward passes over KV blocks.

    Args:
      q2k_block_index: int32 ``(B, H, N_q, K_max)``.
      q2k_block_nums: int32 ``(B, H, N_q)`` (active-prefix lengths).
      num_kv_blocks: static ``N_kv``.

    Returns:
      ``(k2q_indptr, k2q_index)``: ``k2q_indptr`` int32 ``(B, H, N_kv + 1)`` and
      ``k2q_index`` int32 ``(B, H, N_q * K_max)``: for KV block n of head h, the query
      blocks that list it are ``k2q_index[b, h, k2q_indptr[b, h, n]:k2q_indptr[b, h, n+1]]``
      in ascending order. Entries past ``k2q_indptr[b, h, -1]`` are -1. Inactive and
      out-of-range entries of the input are ignored; a block listed twice in one row is
      listed once.

    Raises:
      TypeError: non-integer metadata or a non-int ``num_kv_blocks``.
      ValueError: wrong ranks or shapes, a negative ``num_kv_blocks``, or concrete values
        outside int32.
    """
    # the lists are built in int32: wider values would wrap into valid ids or counts
    why = "block ids and counts are int32"
    _check_int32_values("q2k_block_index", q2k_block_index, why)
    _check_int32_values("q2k_block_nums", q2k_block_nums, why)
    idx, nums = jnp.asarray(q2k_block_index), jnp.asarray(q2k_block_nums)
    B, H, Nq, K = _check_rank("q2k_block_index", idx, 4, "(B, H, N_q, K_max)")
    _check_int("q2k_block_index", idx)
    _check_rank("q2k_block_nums", nums, 3, "(B, H, N_q)")
    _check_int("q2k_block_nums", nums)
    if tuple(nums.shape) != (B, H, Nq):
        raise ValueError(f"q2k_block_nums must have shape (B, H, N_q) = {(B, H, Nq)}, "
                         f"got {tuple(nums.shape)}")
    n_kv = _static_int("num_kv_blocks", num_kv_blocks, 0)
    idx, nums = idx.astype(jnp.int32), nums.astype(jnp.int32)
    # one list per (b, h): build_kq_csr with as many KV heads as query heads
    offsets, entries = build_kq_csr(idx, nums, num_kv_heads=H, num_kv_blocks=n_kv)
    starts = offsets[: B * H * n_kv + 1 : n_kv] if n_kv else jnp.zeros((B * H + 1,), jnp.int32)
    indptr = jnp.concatenate([offsets[:-1].reshape(B, H, n_kv), starts[1:].reshape(B, H, 1)],
                             axis=-1) - starts[:-1].reshape(B, H, 1)
    j = jnp.arange(Nq * K, dtype=jnp.int32)
    pos = jnp.minimum(starts[:-1].reshape(B, H, 1) + j, max(entries.shape[0] - 1, 0))
    k2q_index = jnp.where(j < indptr[..., -1:], entries[pos], -1).astype(jnp.int32)
    return indptr.astype(jnp.int32), k2q_index
