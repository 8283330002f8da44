"""Builders of the HSTU relative attention bias (``rab``) from learned tables.

Source of the semantics: the HSTU paper (Zhai et al. 2024, arXiv 2402.17152, Sec. 3.1,
"relative attention bias" ``rab^{p,t}``) and its public code (Meta's
generative-recommenders, ``RelativeBucketedTimeAndPositionBasedBias``): a learned bias
per relative position plus a learned bias per logarithmic bucket of the time gap, one
table shared by all heads.

All builders return arrays of shape ``(B, H_rab, N_k, N_k)`` indexed
``[b, h, p, j]`` (``p`` = key position of the query row, ``j`` = key), the layout that
:func:`jax_sparse_attn.hstu_attention` takes as ``rab``. A 1-D table gives
``H_rab = 1``; a 2-D table ``(H_rab, n)`` gives one bias per head. Everything is
``jnp`` (jit-able, vmap-able) and reverse-mode differentiable in the tables (``jax.grad``,
``jax.vjp``, also nested); timestamps and lengths are integer data and get no gradient.

On GPUs the gradients never scatter over the ``(B, N, N)`` index set (a scatter-add of
millions of updates into a few table entries is slow there):

* the position bias is built from the table with pad / tile / reshape / slice only, so
  its gradient is the cotangent summed over the batch and then along the ``2N - 1``
  diagonals (reshapes and reductions);
* the time bias is a table lookup (a gather) with a ``jax.custom_vjp`` whose backward
  computes ``d w_ts[h, k] = sum over (b, p, j) with bucket == k of g[b, h, p, j]``,
  accumulated in float32 (float64 for float64 tables), on GPUs (every platform but the
  CPU) as one fused one-hot reduction; on the CPU, whose XLA scatter is a plain serial
  loop and the fastest way there, as a segment sum. Forward-mode
  differentiation (``jax.jvp``, ``jax.jacfwd``) of :func:`time_bias` and
  :func:`relative_bias` in ``w_ts`` is therefore not available (JAX raises a TypeError).

* :func:`position_bias`: ``w_pos[N - 1 + j - p]`` with ``N = (len(w_pos) + 1) / 2``.
* :func:`time_bucket`: ``clamp(floor(ln(max(|dt|, 1)) / 0.301), 0, num_buckets)``.
* :func:`next_timestamps`: the query timestamp of each row (the next item's).
* :func:`time_bias`: ``w_ts[bucket(query_ts[p] - ts[j])]``.
* :func:`relative_bias`: position bias + time bias (the paper's ``rab^{p,t}``).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from .validation import _static_int

__all__ = [
    "TIME_BUCKET_DIVISOR",
    "position_bias",
    "time_bucket",
    "next_timestamps",
    "time_bias",
    "relative_bias",
]

#: divisor of ``ln |dt|`` in the paper code's bucketization (``log(|dt|) / 0.301``)
TIME_BUCKET_DIVISOR = 0.301


def _table(w, name):
    w = jnp.asarray(w)
    if w.ndim not in (1, 2):
        raise ValueError(f"{name} must be a 1-D table (n,) or per-head (H_rab, n), got shape {w.shape}")
    if not jnp.issubdtype(w.dtype, jnp.floating):
        raise TypeError(f"{name} must be a floating-point table, got dtype {w.dtype}")
    if w.shape[-1] < 1 or (w.ndim == 2 and w.shape[0] < 1):
        raise ValueError(f"{name} must have H_rab >= 1 heads and at least one entry per head, "
                         f"got shape {w.shape}")
    return w if w.ndim == 2 else w[None]  # (H_rab, n)


def _check_int32_range(x, name):
    """Without x64 JAX wraps int64 values into int32: concrete integer timestamps outside
    int32 would give wrapped gaps (wrong buckets for gaps of 2**31 units or more), so they
    are refused."""
    if jax.config.jax_enable_x64 or isinstance(x, jax.Array):
        return
    a = np.asarray(x)
    if a.dtype.kind in "iu" and a.size:
        info = np.iinfo(np.int32)
        if a.min() < info.min or a.max() > info.max:
            raise ValueError(
                f"{name} holds values outside int32 ([{int(a.min())}, {int(a.max())}]), which "
                f"JAX (without jax_enable_x64) would wrap into int32, changing the time gaps: "
                f"pass them in a coarser unit (e.g. seconds: milliseconds // 1000) or enable "
                f"jax_enable_x64")


def _timestamps(x, name, batch=None):
    """A ``(B, N)`` timestamp array (``ValueError`` naming ``name`` otherwise)."""
    _check_int32_range(x, name)
    x = jnp.asarray(x)
    if x.ndim != 2 or (batch is not None and x.shape[0] != batch):
        want = "(B, N)" if batch is None else f"(B={batch}, N)"
        raise ValueError(f"{name} must have shape {want} (one padded row per sequence), "
                         f"got {x.shape}")
    return x


def position_bias(w_pos, max_seqlen_k: int):
    """Relative position bias ``out[0, h, p, j] = w_pos[h, N - 1 + j - p]``.

    Args:
      w_pos: ``(2N - 1,)`` or ``(H_rab, 2N - 1)`` float table; entry ``N - 1 + d`` is the
        bias of relative position ``d = j - p`` in ``[-(N - 1), N - 1]``.
      max_seqlen_k: static Python int ``<= N``, the side of the returned bias.

    Returns:
      ``(1, H_rab, max_seqlen_k, max_seqlen_k)`` in the table's dtype (broadcast it over
      the batch, e.g. with :func:`relative_bias` or ``jnp.broadcast_to``).

    Raises:
      ValueError: the table length is even, ``max_seqlen_k < 0`` or ``max_seqlen_k > N``.
      TypeError: ``max_seqlen_k`` is not a static int, or the table is not floating-point.
    """
    w = _table(w_pos, "w_pos")
    n2 = w.shape[-1]
    if n2 % 2 != 1:
        raise ValueError(f"w_pos must have an odd length 2N - 1, got {n2}")
    n = (n2 + 1) // 2
    mk = _static_int("max_seqlen_k", max_seqlen_k, 0)
    if mk > n:
        raise ValueError(f"max_seqlen_k={mk} exceeds N={n} positions covered by w_pos (length {n2})")
    return _skew(w[:, n - mk: n + mk - 1], mk)[None]


def _skew(wc, m):
    """``out[h, p, j] = wc[h, m - 1 + j - p]`` for ``wc`` of shape ``(H, 2m - 1)``.

    Built without a gather: with one zero appended, a row of period ``2m`` tiled ``m + 1``
    times and read in rows of ``2m - 1`` starts each row one entry earlier than the row
    above (``m - 1 + j - p`` stays within ``[0, 2m - 2]``, so the zero is never read). The
    transpose (the gradient) is therefore a sum over the ``m + 1`` tiles: no scatter.
    """
    h = wc.shape[0]
    if m == 0:
        return jnp.zeros((h, 0, 0), wc.dtype)
    period = jnp.pad(wc, ((0, 0), (0, 1)))  # (H, 2m)
    flat = jnp.tile(period, (1, m + 1))  # (H, 2m (m + 1))
    rows = flat[:, m - 1: m - 1 + m * (2 * m - 1)].reshape(h, m, 2 * m - 1)
    return rows[:, :, :m]


def time_bucket(dt, num_buckets: int = 128):
    """``clamp(floor(ln(max(|dt|, 1)) / 0.301), 0, num_buckets)`` as int32.

    ``dt`` is an integer (or float) array of time gaps in the timestamps' unit (seconds for
    MovieLens). The logarithm is evaluated in float32. ``num_buckets`` is a static Python
    int ``>= 0`` (the largest bucket; a table has ``num_buckets + 1`` entries).

    Raises:
      ValueError: ``num_buckets < 0``.  TypeError: ``num_buckets`` is not a static int.
    """
    num_buckets = _static_int("num_buckets", num_buckets, 0)
    # float32 before abs: |INT32_MIN| does not exist as an int32 (it would stay negative)
    a = jnp.maximum(jnp.abs(jnp.asarray(dt).astype(jnp.float32)), 1.0)
    b = jnp.floor(jnp.log(a) / TIME_BUCKET_DIVISOR)
    return jnp.clip(b, 0, num_buckets).astype(jnp.int32)


def next_timestamps(timestamps, lengths=None):
    """Query timestamp of each row: the next item's timestamp, as in the paper's code.

    Args:
      timestamps: ``(B, N)`` integer, row ``b`` = sequence ``b``'s timestamps padded
        to ``N``.
      lengths: optional ``(B,)`` int sequence lengths. Without it, row ``p`` gets
        ``timestamps[:, p + 1]`` and the last row ``N - 1`` its own timestamp (the
        paper code's extension). With it, rows ``p >= L_b - 1`` get ``timestamps[b, L_b - 1]``
        (the last item has no next item: its own timestamp is used).

    Returns:
      ``(B, N)`` with timestamps' dtype.

    Raises:
      ValueError: ``timestamps`` is not ``(B, N)`` or ``lengths`` is not ``(B,)``, or
        (without x64) concrete timestamps outside int32.
    """
    ts = _timestamps(timestamps, "timestamps")
    nxt = jnp.concatenate([ts[:, 1:], ts[:, -1:]], axis=1)
    if lengths is None:
        return nxt
    lengths = jnp.asarray(lengths)
    if lengths.shape != ts.shape[:1]:
        raise ValueError(f"lengths must have shape (B,) = {ts.shape[:1]}, got {lengths.shape}")
    lengths = lengths.astype(jnp.int32)
    last = jnp.take_along_axis(ts, jnp.clip(lengths - 1, 0, ts.shape[1] - 1)[:, None], axis=1)
    p = jnp.arange(ts.shape[1])[None, :]
    return jnp.where(p >= lengths[:, None] - 1, last, nxt)


def time_bias(w_ts, timestamps, query_timestamps=None):
    """Time-gap bias ``out[b, h, p, j] = w_ts[h, bucket(query_ts[b, p] - ts[b, j])]``.

    Args:
      w_ts: ``(num_buckets + 1,)`` or ``(H_rab, num_buckets + 1)`` float table.
      timestamps: ``(B, N)`` integer key timestamps (padded per sequence). Without
        ``jax_enable_x64`` JAX holds integers in int32: pass a unit whose values fit it
        (seconds, not milliseconds); concrete values outside int32 raise ValueError.
      query_timestamps: ``(B, N)`` integer timestamp of each query row; default
        :func:`next_timestamps` ``(timestamps)`` (the paper's "next item" rule).

    Returns:
      ``(B, H_rab, N, N)`` in the table's dtype. Reverse-mode differentiable in ``w_ts``
      (a ``jax.custom_vjp``: the gradient is a one-hot reduction over ``(B, N, N)``
      accumulated in float32 or wider, see the module docstring); no forward mode.

    Raises:
      ValueError: ``w_ts`` is not 1-D or 2-D or is empty, ``timestamps`` is not
        ``(B, N)``, or ``query_timestamps`` has another shape; (without x64) concrete
        timestamps outside int32.
      TypeError: ``w_ts`` is not a floating-point table.
    """
    w = _table(w_ts, "w_ts")
    ts = _timestamps(timestamps, "timestamps")
    tq = (next_timestamps(ts) if query_timestamps is None
          else _timestamps(query_timestamps, "query_timestamps"))
    if tq.shape != ts.shape:
        raise ValueError(f"query_timestamps must have timestamps' shape {ts.shape}, got {tq.shape}")
    bucket = time_bucket(tq[:, :, None] - ts[:, None, :], w.shape[-1] - 1)  # (B, N, N)
    return _bucket_lookup(w, bucket)  # (B, H_rab, N, N)


def _bucket_dtype(num_entries):
    """Smallest integer dtype holding bucket ids ``0 .. num_entries - 1`` (the residual)."""
    if num_entries <= 256:
        return jnp.uint8
    if num_entries <= 32768:
        return jnp.int16
    return jnp.int32


@jax.custom_vjp
def _bucket_lookup(w, bucket):
    """``out[b, h, p, j] = w[h, bucket[b, p, j]]``: ``w (H, K)`` float, ``bucket (B, N, N)``
    int in ``[0, K)``. Forward: a gather; backward: a one-hot reduction (no scatter)."""
    return jnp.moveaxis(w[:, bucket], 0, 1)


def _bucket_lookup_fwd(w, bucket):
    k = w.shape[-1]
    # The zero-size array carries K into the backward (residuals are arrays only).
    return _bucket_lookup(w, bucket), (bucket.astype(_bucket_dtype(k)), jnp.zeros((0, k), w.dtype))


def _bucket_lookup_bwd(res, g):
    bucket, like_w = res
    k = like_w.shape[-1]
    acc = jnp.promote_types(g.dtype, jnp.float32)
    gt = jnp.moveaxis(g, 1, -1).astype(acc)  # (B, N, N, H)
    dw = jax.lax.platform_dependent(
        bucket, gt, cpu=functools.partial(_bucket_sum_segment, k),
        default=functools.partial(_bucket_sum_onehot, k))  # (K, H)
    return dw.T.astype(like_w.dtype), None


def _bucket_sum_onehot(k, bucket, gt):
    """``dw[k, h] = sum_{b, p, j} [bucket[b, p, j] == k] * gt[b, p, j, h]`` as one fused
    reduction (accelerators). The reduced axes (b, p, j) are the major ones and the kept
    (k, h) the minor ones, so XLA fuses compare, select and sum into one reduction that reads
    ``gt`` and ``bucket`` once and never materializes the ``(B, N, N, K)`` one-hot."""
    hit = bucket.astype(jnp.int32)[..., None] == jnp.arange(k, dtype=jnp.int32)  # (B, N, N, K)
    zero = jnp.zeros((), gt.dtype)
    return jnp.sum(jnp.where(hit[..., None], gt[..., None, :], zero), axis=(0, 1, 2))


def _bucket_sum_segment(k, bucket, gt):
    """The same sums as a segment sum (CPU: XLA's CPU scatter is a serial loop over the
    updates, K times cheaper there than the one-hot reduction)."""
    return jax.ops.segment_sum(gt.reshape(-1, gt.shape[-1]), bucket.reshape(-1).astype(jnp.int32),
                               num_segments=k)


_bucket_lookup.defvjp(_bucket_lookup_fwd, _bucket_lookup_bwd)


def relative_bias(w_pos, w_ts, timestamps, query_timestamps=None):
    """The paper's ``rab^{p,t}``: :func:`position_bias` + :func:`time_bias`.

    Args:
      w_pos: ``(2N - 1,)`` or ``(H_rab, 2N - 1)`` position table.
      w_ts: ``(num_buckets + 1,)`` or ``(H_rab, num_buckets + 1)`` time-bucket table.
      timestamps: ``(B, max_seqlen_k)`` integer, padded per sequence;
        ``max_seqlen_k <= N``.
      query_timestamps: optional ``(B, max_seqlen_k)``, see :func:`time_bias`.

    Returns:
      ``(B, H_rab, max_seqlen_k, max_seqlen_k)`` in the tables' promoted dtype: pass it
      as ``rab`` to :func:`jax_sparse_attn.hstu_attention` (cast it to q's dtype or
      float32). Reverse-mode differentiable in both tables, with no scatter on GPUs
      (module docstring).

    Raises:
      ValueError / TypeError: as :func:`position_bias` and :func:`time_bias`; also
        ``ValueError`` when the two tables have different head counts ``H_rab`` (one of
        them may be 1-D or have 1 head: it is shared by the other's heads).
    """
    ts = _timestamps(timestamps, "timestamps")
    hp, ht = (_table(w, name).shape[0] for w, name in ((w_pos, "w_pos"), (w_ts, "w_ts")))
    if hp != ht and 1 not in (hp, ht):
        raise ValueError(f"w_pos and w_ts must have the same number of heads H_rab (or one of "
                         f"them 1, shared by all heads), got w_pos with {hp} and w_ts with {ht}")
    return position_bias(w_pos, ts.shape[1]) + time_bias(w_ts, ts, query_timestamps)
