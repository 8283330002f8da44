"""Input checks for HSTU attention and block-sparse attention.

Two kinds of checks:

* **Trace-time checks** (``check_hstu_args`` / ``check_bsa_args``): shapes, ranks,
  dtypes, layouts and the static Python options. They need no array values, so the
  public ops run them on every call, also under ``jax.jit``. Errors are ``ValueError``
  (bad shape/value of an option) or ``TypeError`` (bad dtype/type) naming the argument
  and what is allowed.
* **Eager value validators** (:func:`validate_hstu_inputs`,
  :func:`validate_bsa_metadata`): read the integer metadata back to the host and check
  the *values* (cu_seqlens monotone and within T, max_seqlen consistent, func
  endpoints, page ids, block indices in range and unique in the active prefix, counts,
  block sizes). They raise ``ValueError`` naming the first offending position. The
  public ops call them automatically when every metadata array is concrete (not a
  tracer); inside ``jax.jit`` call them yourself on the concrete inputs beforehand.
"""

from __future__ import annotations

import numbers

import jax
import jax.numpy as jnp
import numpy as np

from ._backend import check_backend, check_switches
from .config import BSAConfig, HSTUConfig

__all__ = [
    "validate_hstu_inputs",
    "validate_bsa_metadata",
    "check_hstu_args",
    "check_bsa_args",
    "FLOAT_DTYPES",
    "KERNEL_DTYPES",
    "SPARSE_BLOCK_SIZES",
    "HSTU_FUNC_PAD",
    "MAX_KV_SPLITS",
]

#: largest static ``kv_splits`` of the block-sparse ops
MAX_KV_SPLITS = 256

#: dtypes of the fast path (and of the issue's contract).
KERNEL_DTYPES = (jnp.dtype(jnp.float16), jnp.dtype(jnp.bfloat16))
#: dtypes accepted by the public ops: fp16/bf16 everywhere; fp32/fp64 select the reference.
FLOAT_DTYPES = KERNEL_DTYPES + (jnp.dtype(jnp.float32), jnp.dtype(jnp.float64))
#: Allowed ``sparse_block_size`` values.
SPARSE_BLOCK_SIZES = (64, 128)
#: ``func.shape[2]`` must be at least ``T_q + HSTU_FUNC_PAD``.
HSTU_FUNC_PAD = 256
HSTU_PAGE_SIZE = 128

_DTYPE_NAMES = "float16 or bfloat16 (float32/float64 only with the reference backend)"


def _is_tracer(x) -> bool:
    return isinstance(x, jax.core.Tracer)


def canonical_dtype(x):
    """The dtype ``x`` has as a JAX array (NumPy float64 is float32 unless x64 is on)."""
    return jnp.dtype(jax.dtypes.canonicalize_dtype(x.dtype))


def check_debug_checks(debug_checks) -> bool:
    """The static ``debug_checks`` option: a Python (or NumPy) bool, else TypeError."""
    if not isinstance(debug_checks, (bool, np.bool_)):
        raise TypeError(f"debug_checks must be a bool, got {debug_checks!r} "
                        f"({type(debug_checks).__name__})")
    return bool(debug_checks)


def check_deterministic(deterministic) -> bool:
    """The static ``deterministic`` option: a Python (or NumPy) bool, else TypeError."""
    if not isinstance(deterministic, (bool, np.bool_)):
        raise TypeError(f"deterministic must be a bool (static Python value), got "
                        f"{type(deterministic).__name__}")
    return bool(deterministic)


def run_time_value_checks(check, *arrays, names):
    """Stage ``check(*arrays)`` (an eager value check raising ValueError) into the traced
    computation: a ``jax.debug.callback`` runs it on the host with the arrays' run-time
    values. Under ``jax.jit`` a failure surfaces when the computation runs, as a
    ``jax.errors.JaxRuntimeError`` whose message carries the validator's ValueError.
    ``names`` names ``arrays`` (the op's arguments) for the errors.

    Raises NotImplementedError when one of ``arrays`` has a symbolic dimension
    (``jax.export``): the callback of a symbolic operand neither lowers nor serializes."""
    for name, x in zip(names, arrays, strict=True):
        if x is None:
            continue
        dims = tuple(x.shape)
        if not all(isinstance(n, numbers.Integral) for n in dims):
            raise NotImplementedError(
                f"debug_checks=True stages a host callback (jax.debug.callback) that checks "
                f"the traced metadata at run time, and jax.export cannot serialize host "
                f"callbacks; {name} has the symbolic shape {dims}. Export with "
                f"debug_checks=False and check the metadata before the call "
                f"(jax_sparse_attn.validate_hstu_inputs / validate_bsa_metadata)")

    def host(*vals):
        check(*[None if v is None else np.asarray(v) for v in vals])

    jax.debug.callback(host, *arrays)


def is_concrete(*xs) -> bool:
    """True when none of ``xs`` is a JAX tracer (values can be read on the host)."""
    return not any(_is_tracer(x) for x in xs if x is not None)


def _require_concrete(fn_name, **arrays):
    """TypeError naming the first traced array: the eager validators read values on the
    host, which a tracer (inside ``jax.jit`` / ``jax.vmap``) does not have."""
    for name, x in arrays.items():
        if x is not None and _is_tracer(x):
            raise TypeError(f"{fn_name} checks metadata values eagerly and needs concrete "
                            f"arrays, but {name} is traced (inside jax.jit, jax.vmap or "
                            f"another transformation): call it outside the transformation, "
                            f"or pass debug_checks=True to the op to check traced metadata "
                            f"at run time")


def require_values(**arrays):
    """TypeError naming the first metadata argument given as a :class:`jax.ShapeDtypeStruct`:
    the value checks and the op read the metadata values, which a shape and dtype do not
    carry (``q``, ``k``, ``v`` of the validators may be ShapeDtypeStructs; metadata may
    not)."""
    for name, x in arrays.items():
        if isinstance(x, jax.ShapeDtypeStruct):
            raise TypeError(
                f"{name} must be an array with values (jax.Array or numpy.ndarray), got a "
                f"jax.ShapeDtypeStruct {tuple(x.shape)} {jnp.dtype(x.dtype)} (shape and dtype "
                f"only): its values are read; pass the array itself, or trace the call (e.g. "
                f"jax.eval_shape) to work from shapes")


def _shape(name, x):
    if x is None:
        raise ValueError(f"{name} is required (got None)")
    shape = getattr(x, "shape", None)
    if shape is None or getattr(x, "dtype", None) is None:
        raise TypeError(f"{name} must be an array with .shape and .dtype, got "
                        f"{type(x).__name__} (convert it with jnp.asarray(...))")
    return tuple(shape)


def as_array_arg(x):
    """A Python list/tuple of numbers (e.g. ``cu_seqlens=[0, 5, 9]``) as a NumPy array
    (int32 for integers whose values fit int32; wider integers keep their int64 values, so
    that the value checks see and reject them, as for a NumPy int64 array); anything else
    unchanged. A list holding traced values (inside ``jax.jit``) is a traced array, int32
    for integers."""
    if isinstance(x, (list, tuple)):
        if any(_is_tracer(e) for e in jax.tree_util.tree_leaves(x)):
            a = jnp.asarray(x)
            return a.astype(jnp.int32) if jnp.issubdtype(a.dtype, jnp.integer) else a
        a = np.asarray(x)
        if a.dtype.kind in "iu":
            info = np.iinfo(np.int32)
            if a.size == 0 or (a.min() >= info.min and a.max() <= info.max):
                return a.astype(np.int32)
        return a
    return x


def _static_scalar(name, x, kind):
    """Static options are compile-time constants: a concrete 0-d array (``jnp.float32(0.5)``,
    ``np.int64(3)``) is read as its Python value; a traced value is refused with one message."""
    if _is_tracer(x):
        raise TypeError(
            f"{name} must be a static Python {kind} (a compile-time constant), got a traced "
            f"value ({type(x).__name__}): pass a Python or NumPy scalar, e.g. close over it or "
            f"mark it static with jax.jit(..., static_argnames=...)")
    if getattr(x, "shape", None) == () and getattr(x, "dtype", None) is not None:
        return np.asarray(x).item()
    return x


def _check_rank(name, x, rank, layout_desc):
    shape = _shape(name, x)
    if len(shape) != rank:
        raise ValueError(f"{name} must have rank {rank} {layout_desc}, got shape {shape}")
    return shape


def _check_float(name, x):
    dt = canonical_dtype(x)
    if dt not in FLOAT_DTYPES:
        raise TypeError(f"{name} dtype must be {_DTYPE_NAMES}, got {jnp.dtype(x.dtype)}")
    return dt


def _check_int(name, x):
    dt = jnp.dtype(x.dtype)
    if not jnp.issubdtype(dt, jnp.integer):
        raise TypeError(f"{name} must be an integer (int32) array, got dtype {dt}")
    return dt


#: largest int32 value: the kernels and the reference index sequences with int32 offsets
INT32_MAX = 2**31 - 1
#: largest finite float32: the kernels take alpha, 1 / scaling_seqlen and softmax_scale as
#: float32 scalars (the reference computes in float32 for 16/32-bit inputs)
FLOAT32_MAX = float(np.finfo(np.float32).max)


def _static_int(name, x, minimum=None, maximum=None):
    x = _static_scalar(name, x, "int")
    if isinstance(x, bool) or not isinstance(x, numbers.Integral):
        raise TypeError(f"{name} must be a static Python int, got {type(x).__name__}")
    x = int(x)
    if minimum is not None and x < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {x}")
    if maximum is not None and x > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {x}")
    return x


def _static_real(name, x):
    """A static finite number whose magnitude fits float32 (the dtype the kernels and the
    reference scale by: a larger value would become inf there and turn results into NaN)."""
    x = _static_scalar(name, x, "number")
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        raise TypeError(f"{name} must be a static Python number, got {type(x).__name__}")
    x = float(x)
    if not np.isfinite(x):
        raise ValueError(f"{name} must be finite, got {x}")
    if abs(x) > FLOAT32_MAX:
        raise ValueError(f"{name} must be finite in float32 (|{name}| <= {FLOAT32_MAX:.4g}), "
                         f"got {x}")
    return x


def _check_window(window_size):
    try:
        left, right = window_size
    except (TypeError, ValueError):
        raise ValueError(
            f"window_size must be a pair (left, right) of ints >= -1, got {window_size!r}"
        ) from None
    out = []
    for side, w in (("left", left), ("right", right)):
        w = _static_scalar(f"window_size {side}", w, "int")
        if isinstance(w, bool) or not isinstance(w, numbers.Integral):
            raise TypeError(f"window_size {side} must be a Python int >= -1, got {w!r}")
        if int(w) < -1:
            raise ValueError(f"window_size {side} must be >= -1 (-1 = unbounded), got {int(w)}")
        out.append(int(w))
    return tuple(out)


def _unbounded_window(window, max_seqlen_q, max_seqlen_k):
    """A window side ``>= max_seqlen_q + max_seqlen_k`` reaches every key of every sequence
    (key positions ``j`` lie in ``[0, max_seqlen_k)``, query positions ``p`` in
    ``(-max_seqlen_q, max_seqlen_k)``), so it is the unbounded side ``-1``; so is a side of
    ``2**31 - 1`` or more (at least ``max_seqlen_k - 1`` to the left and ``max_seqlen_q -
    1`` to the right, which already reach every key). Normalising it keeps the mask exact
    and the side an int32 (``(-1, 2**31 - 1)`` would otherwise wrap around in ``p + w``
    and mask every key). With both bounds 0 (no query rows) only sides of ``2**31 - 1`` or
    more are normalised (a causal window stays causal)."""
    reach = min(max_seqlen_q + max_seqlen_k, INT32_MAX) or INT32_MAX
    return tuple(-1 if w >= reach else w for w in window)


# ----------------------------------------------------------------------------- HSTU


def check_hstu_args(q, k, v, cu_seqlens_q, cu_seqlens_k, *, max_seqlen_q, max_seqlen_k,
                    scaling_seqlen=None, window_size=(-1, 0), alpha=1.0, func=None,
                    paged_kv=None, page_ids=None, page_indptrs=None, rab=None):
    """Trace-time checks of the HSTU arguments; returns the normalised static options as
    a :class:`~jax_sparse_attn.config.HSTUConfig` (backend not yet chosen; ``rab_heads``
    is H_rab, 0 without ``rab``)."""
    T_q, H, D = _check_rank("q", q, 3, "(T_q, H, D)")
    dt = _check_float("q", q)
    if H < 1 or D < 1:
        raise ValueError(f"q (T_q, H, D) needs H >= 1 heads and head dim D >= 1, got shape {(T_q, H, D)}")
    paged = paged_kv is not None
    if paged:
        if k is not None or v is not None:
            raise ValueError("with paged_kv, k and v must be None (keys/values come from the pages)")
        pshape = _check_rank("paged_kv", paged_kv, 5, "(num_pages, 2, 128, H_kv, D)")
        if (pshape[1] != 2 or pshape[2] != HSTU_PAGE_SIZE or pshape[4] != D
                or pshape[3] < 1 or H % pshape[3]):
            raise ValueError(
                f"paged_kv must have shape (num_pages, 2, {HSTU_PAGE_SIZE}, H_kv, D={D}) with "
                f"H_kv dividing H={H} (H_kv = H, or fewer KV heads: GQA/MQA), got {pshape}"
            )
        H_kv = pshape[3]
        if canonical_dtype(paged_kv) != dt:
            raise TypeError(f"paged_kv dtype {canonical_dtype(paged_kv)} must equal q's dtype {dt}")
        _check_rank("page_ids", page_ids, 1, "(P,)")
        _check_int("page_ids", page_ids)
        _check_rank("page_indptrs", page_indptrs, 1, "(B+1,)")
        _check_int("page_indptrs", page_indptrs)
        D_v = D
    else:
        if page_ids is not None or page_indptrs is not None:
            raise ValueError("page_ids/page_indptrs are only valid together with paged_kv")
        T_k, H_k, D_k = _check_rank("k", k, 3, "(T_k, H_kv, D)")
        T_v, H_v, D_v = _check_rank("v", v, 3, "(T_k, H_kv, D_v)")
        if D_k != D or H_k < 1 or H % H_k:
            raise ValueError(f"k must have shape (T_k, H_kv, D={D}) with H_kv dividing q's H={H} "
                             f"(H_kv = H, or fewer KV heads: GQA/MQA), got {(T_k, H_k, D_k)}")
        if T_v != T_k or H_v != H_k or D_v < 1:
            raise ValueError(f"v must have shape (T_k={T_k}, H_kv={H_k}, D_v >= 1), got {(T_v, H_v, D_v)}")
        H_kv = H_k
        for name, x in (("k", k), ("v", v)):
            if canonical_dtype(x) != dt:
                raise TypeError(
                    f"q, k and v must have one dtype; q is {dt} but {name} is {canonical_dtype(x)}"
                )
    cu_desc = ("(B+1,) (or, for cu_seqlens_q and cu_seqlens_k together, the per-shard "
               "(num_shards, B_local+1) of jax_sparse_attn.sharding)")
    (bq,) = _check_rank("cu_seqlens_q", cu_seqlens_q, 1, cu_desc)
    (bk,) = _check_rank("cu_seqlens_k", cu_seqlens_k, 1, cu_desc)
    _check_int("cu_seqlens_q", cu_seqlens_q)
    _check_int("cu_seqlens_k", cu_seqlens_k)
    for name, n in (("cu_seqlens_q", bq), ("cu_seqlens_k", bk)):
        if not isinstance(n, numbers.Integral):  # a symbolic dimension of jax.export
            raise ValueError(
                f"{name} must have a static length B+1 (the number of sequences is a "
                f"compile-time constant; only the token count T may be symbolic), got the "
                f"symbolic {n}: export with a fixed B and pad unused sequences with zero "
                f"length (repeat the last offset)")
    if bq < 1:
        raise ValueError("cu_seqlens_q must have B+1 >= 1 entries, got 0")
    if bk != bq:
        raise ValueError(f"cu_seqlens_k must have the same length as cu_seqlens_q ({bq}), got {bk}")
    if paged and page_indptrs.shape[0] != bq:
        raise ValueError(f"page_indptrs must have shape (B+1,) = ({bq},), got {tuple(page_indptrs.shape)}")
    max_seqlen_q = _static_int("max_seqlen_q", max_seqlen_q, 0, INT32_MAX)
    max_seqlen_k = _static_int("max_seqlen_k", max_seqlen_k, 0, INT32_MAX)
    if scaling_seqlen is None:
        scaling = float(max_seqlen_q) if max_seqlen_q > 0 else 1.0
    else:
        scaling = _static_real("scaling_seqlen", scaling_seqlen)
        if scaling <= 0:
            raise ValueError(f"scaling_seqlen must be > 0, got {scaling}")
        if 1.0 / scaling > FLOAT32_MAX:
            raise ValueError(f"scaling_seqlen must be >= {1.0 / FLOAT32_MAX:.4g} (1 / scaling_seqlen "
                             f"must be finite in float32), got {scaling}")
    window = _unbounded_window(_check_window(window_size), max_seqlen_q, max_seqlen_k)
    alpha = _static_real("alpha", alpha)
    if func is not None:
        fshape = _check_rank("func", func, 3, "(1, N, L_f)")
        _check_int("func", func)
        if fshape[0] != 1:
            raise ValueError(f"func must have shape (1, N, L_f) with a leading 1, got {fshape}")
        if fshape[1] < 1 or fshape[1] % 2 != 1:
            raise ValueError(f"func must have an odd number N >= 1 of endpoint rows, got N={fshape[1]}")
        if fshape[2] < T_q + HSTU_FUNC_PAD:
            raise ValueError(
                f"func must have L_f >= T_q + {HSTU_FUNC_PAD} = {T_q + HSTU_FUNC_PAD} columns, "
                f"got L_f={fshape[2]}"
            )
        if window != (-1, -1):
            raise ValueError(f"func requires window_size=(-1, -1), got {window}")
        if paged:
            raise ValueError("func cannot be combined with paged_kv")
    if paged and window != (-1, 0):
        raise ValueError(f"paged_kv supports the causal mask only: window_size must be (-1, 0), got {window}")
    rab_heads = _check_rab(rab, dt, bq - 1, H, max_seqlen_k, paged)
    return HSTUConfig(dtype=dt.name, head_dim=D, head_dim_v=D_v, max_seqlen_q=max_seqlen_q,
                      max_seqlen_k=max_seqlen_k, scaling_seqlen=scaling, window_size=window,
                      alpha=alpha, paged=paged, func_n=0 if func is None else fshape[1],
                      head_dim_pad=D, head_dim_v_pad=D_v, rab_heads=rab_heads,
                      rab_per_head=rab_heads == H, num_heads=H, num_heads_kv=H_kv,
                      rab_dtype="" if rab is None else canonical_dtype(rab).name)


#: most key splits of the HSTU split-KV forward (``kv_splits``)
HSTU_MAX_KV_SPLITS = 16


def check_kv_splits(kv_splits, max_splits: int = HSTU_MAX_KV_SPLITS):
    """``kv_splits``: ``"auto"`` or a static Python int in ``[1, max_splits]``; returns it
    (``ValueError`` for other strings and out-of-range ints, ``TypeError`` for other types)."""
    if isinstance(kv_splits, str):
        if kv_splits != "auto":
            raise ValueError(f"kv_splits must be an int in [1, {max_splits}] or 'auto', "
                             f"got {kv_splits!r}")
        return kv_splits
    n = _static_scalar("kv_splits", kv_splits, "int")
    if isinstance(n, bool) or not isinstance(n, numbers.Integral):
        raise TypeError(f"kv_splits must be a static Python int in [1, {max_splits}] or "
                        f"'auto', got {type(n).__name__}")
    if not 1 <= int(n) <= max_splits:
        raise ValueError(f"kv_splits must be in [1, {max_splits}] or 'auto', got {int(n)}")
    return int(n)


def _check_rab(rab, q_dtype, B, H, max_seqlen_k, paged):
    """Shape/dtype rules of the relative attention bias; returns H_rab (0 without rab)."""
    if rab is None:
        return 0
    if paged:
        raise ValueError("rab cannot be combined with paged_kv (paged KV is forward-only inference)")
    shape = _check_rank("rab", rab, 4, "(B, H_rab, max_seqlen_k, max_seqlen_k)")
    if shape[0] != B or shape[2] != max_seqlen_k or shape[3] != max_seqlen_k or shape[1] not in (1, H):
        raise ValueError(
            f"rab must have shape (B, H_rab, max_seqlen_k, max_seqlen_k) = "
            f"({B}, 1 or {H}, {max_seqlen_k}, {max_seqlen_k}), got {shape}")
    rdt = canonical_dtype(rab)
    if rdt not in (jnp.dtype(q_dtype), jnp.dtype(jnp.float32)):
        raise TypeError(f"rab dtype must be q's dtype ({jnp.dtype(q_dtype)}) or float32, got {rdt}")
    return int(shape[1])


def _host(x):
    return np.asarray(jax.device_get(x)).astype(np.int64)


def _first(mask):
    """Index tuple of the first True entry of ``mask`` (C order), or None."""
    hits = np.argwhere(mask)
    return tuple(int(i) for i in hits[0]) if hits.size else None


def _check_offsets(name, x):
    """Host copy of a prefix-sum array after checking ``x[0] == 0`` and non-decreasing."""
    x = _host(x)
    if x[0] != 0:
        raise ValueError(f"{name}[0] must be 0, got {x[0]}")
    lens = np.diff(x)
    bad = _first(lens < 0)
    if bad is not None:
        (b,) = bad
        raise ValueError(
            f"{name} must be non-decreasing: {name}[{b + 1}]={x[b + 1]} < {name}[{b}]={x[b]}"
        )
    return x, lens


def _exceeds(value, extent):
    """``value > extent`` for an int ``extent`` or a symbolic one of ``jax.export``; False
    where the symbolic comparison is inconclusive (the extent's value is not known before
    the call, as for traced metadata)."""
    try:
        return bool(value > extent)
    except jax.errors.InconclusiveDimensionOperation:
        return False


def _check_cu(name, cu, total, max_seqlen, max_name):
    cu, lens = _check_offsets(name, cu)
    if total is not None and _exceeds(int(cu[-1]), total):
        raise ValueError(f"{name}[-1]={cu[-1]} exceeds the number of tokens {total}")
    if lens.size and lens.max() > max_seqlen:
        b = int(np.flatnonzero(lens > max_seqlen)[0])
        raise ValueError(
            f"{max_name}={max_seqlen} is smaller than sequence {b}'s length {int(lens[b])} "
            f"(from {name})"
        )
    return cu, lens


def validate_hstu_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, *, max_seqlen_q, max_seqlen_k,
                         scaling_seqlen=None, window_size=(-1, 0), alpha=1.0, func=None,
                         paged_kv=None, page_ids=None, page_indptrs=None, rab=None,
                         backend="auto", switches=None, debug_checks=False, deterministic=False,
                         kv_splits="auto"):
    """Check the shapes *and values* of HSTU inputs eagerly (same arguments as the op).

    ``backend``, ``switches``, ``debug_checks``, ``deterministic`` and ``kv_splits`` are
    checked like the op's and do not change the checks of the inputs.

    Value checks: ``cu_seqlens_*[0] == 0``, non-decreasing, last entry <= T;
    ``max_seqlen_*`` >= every sequence length; ``func`` endpoints in
    ``[0, max_seqlen_k]`` for rows inside a sequence; with paged KV,
    ``page_indptrs`` starts at 0, is non-decreasing, ends <= P, gives every sequence at
    least ``ceil(L_k / 128)`` pages, and the used ``page_ids`` are in ``[0, num_pages)``;
    with ``rab``, every sequence has ``L_q <= L_k``.

    Args:
      q ``(T_q, H, D)``, k ``(T_k, H_kv, D)``, v ``(T_k, H_kv, D_v)`` (H_kv dividing H; arrays or
      :class:`jax.ShapeDtypeStruct`), cu_seqlens_q/k ``(B+1,)`` int32, and the keyword
      options of :func:`~jax_sparse_attn.hstu_attention` (func ``(1, N, L_f)`` int32,
      paged_kv ``(num_pages, 2, 128, H_kv, D)``, page_ids ``(P,)``, page_indptrs ``(B+1,)``).

    Raises:
      ValueError naming the first offending position; TypeError/ValueError from the
      trace-time checks; TypeError for traced metadata (inside ``jax.jit`` /
      ``jax.vmap``: use the op's ``debug_checks=True`` there) and for metadata given as a
      ``jax.ShapeDtypeStruct``.
    """
    check_backend(backend)
    check_switches(switches)
    check_debug_checks(debug_checks)
    check_deterministic(deterministic)
    check_kv_splits(kv_splits)
    cu_seqlens_q, cu_seqlens_k, page_ids, page_indptrs = (
        as_array_arg(x) for x in (cu_seqlens_q, cu_seqlens_k, page_ids, page_indptrs))
    opts = check_hstu_args(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                           max_seqlen_k=max_seqlen_k, scaling_seqlen=scaling_seqlen,
                           window_size=window_size, alpha=alpha, func=func, paged_kv=paged_kv,
                           page_ids=page_ids, page_indptrs=page_indptrs, rab=rab)
    require_values(cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, func=func,
                   page_ids=page_ids, page_indptrs=page_indptrs)
    _require_concrete("validate_hstu_inputs", cu_seqlens_q=cu_seqlens_q,
                      cu_seqlens_k=cu_seqlens_k, func=func, page_ids=page_ids,
                      page_indptrs=page_indptrs)
    _hstu_value_checks(q, k, cu_seqlens_q, cu_seqlens_k, func, paged_kv, page_ids, page_indptrs,
                       opts)


def _hstu_value_checks(q, k, cu_seqlens_q, cu_seqlens_k, func, paged_kv, page_ids, page_indptrs,
                       opts, check_pages=True):
    """The value checks of :func:`validate_hstu_inputs`, given the config ``opts`` that
    :func:`check_hstu_args` returned for the same arguments (the public op reuses it).
    ``func=None`` skips the func checks and ``check_pages=False`` the page-table checks
    (the op passes them so when those arrays are traced and the cu_seqlens concrete)."""
    T_q = q.shape[0]
    T_k = None if paged_kv is not None else k.shape[0]
    cu_q, lens_q = _check_cu("cu_seqlens_q", cu_seqlens_q, T_q, opts.max_seqlen_q, "max_seqlen_q")
    _, lens_k = _check_cu("cu_seqlens_k", cu_seqlens_k, T_k, opts.max_seqlen_k, "max_seqlen_k")
    if opts.rab_heads:
        bad = _first(lens_q > lens_k)
        if bad is not None:
            (b,) = bad
            raise ValueError(
                f"with rab every sequence needs L_q <= L_k (query i sits at key position "
                f"i + L_k - L_q >= 0); sequence {b} has L_q={int(lens_q[b])} > L_k={int(lens_k[b])}")
    if func is not None:
        f = _host(func)[0]
        rows = np.arange(f.shape[1])
        in_seq = rows < cu_q[-1]
        bad = _first(((f < 0) | (f > opts.max_seqlen_k)) & in_seq[None, :])
        if bad is not None:
            t, r = bad
            raise ValueError(
                f"func[0, {t}, {r}]={int(f[t, r])} is outside [0, max_seqlen_k={opts.max_seqlen_k}]"
            )
    if paged_kv is not None and check_pages:
        ptr, d = _check_offsets("page_indptrs", page_indptrs)
        ids = _host(page_ids)
        n_pages = paged_kv.shape[0]
        if ptr[-1] > ids.shape[0]:
            raise ValueError(f"page_indptrs[-1]={ptr[-1]} exceeds len(page_ids)={ids.shape[0]}")
        need = -(-lens_k // HSTU_PAGE_SIZE)
        bad = _first(d < need)
        if bad is not None:
            (b,) = bad
            raise ValueError(
                f"sequence {b} has {int(lens_k[b])} keys and needs {int(need[b])} pages, "
                f"but page_indptrs gives it {int(d[b])}"
            )
        used = ids[: ptr[-1]]
        if isinstance(n_pages, numbers.Integral):
            over = used >= n_pages
        elif used.size and _exceeds(int(used.max()) + 1, n_pages):
            # a symbolic page count (jax.export) that its constraints bound
            over = np.array([_exceeds(int(u) + 1, n_pages) for u in used], bool)
        else:
            over = False
        bad = _first((used < 0) | over)
        if bad is not None:
            (p,) = bad
            raise ValueError(f"page_ids[{p}]={int(used[p])} is outside [0, num_pages={n_pages})")


# ----------------------------------------------------------------------------- BSA


def _check_bool(name, x):
    if not isinstance(x, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {x!r}")
    return bool(x)


def check_bsa_args(q, k, v, q2k_block_index, block_sparse_num=None, block_sizes=None,
                   q2k_block_nums=None, *, sparse_block_size=128, softmax_scale=None,
                   layout="bhsd", allow_empty_block_nums=False, kv_splits=1, pack_gqa=False,
                   causal=False):
    """Trace-time checks of the block-sparse attention arguments; returns the normalised
    static options as a :class:`~jax_sparse_attn.config.BSAConfig` (backend not yet
    chosen). With ``pack_gqa`` the metadata are in the packed contract: ``H = H_kv`` rows
    of ``N_qp = ceil(S_q r / blk)`` packed query blocks, ``r = H_q / H_kv``."""
    if layout not in ("bhsd", "bshd"):
        raise ValueError(f"layout must be 'bhsd' (B, H, S, D) or 'bshd' (B, S, H, D), got {layout!r}")
    desc = "(B, H, S, D)" if layout == "bhsd" else "(B, S, H, D)"
    qs = _check_rank("q", q, 4, desc)
    ks = _check_rank("k", k, 4, desc)
    vs = _check_rank("v", v, 4, desc)
    dt = _check_float("q", q)
    for name, x in (("k", k), ("v", v)):
        if canonical_dtype(x) != dt:
            raise TypeError(f"q, k and v must have one dtype; q is {dt} but {name} is {canonical_dtype(x)}")

    def bhsd(s):
        return s if layout == "bhsd" else (s[0], s[2], s[1], s[3])

    B, Hq, Sq, D = bhsd(qs)
    Bk, Hkv, Skv, Dk = bhsd(ks)
    Bv, Hv, Sv, Dv = bhsd(vs)
    if Bk != B or Bv != B:
        raise ValueError(f"q, k and v must have the same batch size; got {B}, {Bk}, {Bv}")
    if Dk != D:
        raise ValueError(f"k's head dim {Dk} must equal q's head dim {D}")
    if D < 1 or Dv < 1:
        raise ValueError(f"head dims must be >= 1, got D={D} (q, k) and D_v={Dv} (v)")
    if (Hv, Sv) != (Hkv, Skv):
        raise ValueError(f"v must have the same heads and length as k ({Hkv}, {Skv}), got ({Hv}, {Sv})")
    if Hkv < 1:
        raise ValueError(f"k and v need at least one KV head (H_kv >= 1), got H_kv={Hkv} "
                         f"(H_q={Hq})")
    if Hq % Hkv != 0:
        raise ValueError(f"the number of query heads {Hq} must be a multiple of the KV heads {Hkv} (GQA)")
    blk = _static_int("sparse_block_size", sparse_block_size)
    if blk not in SPARSE_BLOCK_SIZES:
        raise ValueError(f"sparse_block_size must be one of {SPARSE_BLOCK_SIZES}, got {blk!r}")
    kv_splits = check_kv_splits(kv_splits, MAX_KV_SPLITS)
    pack_gqa = _check_bool("pack_gqa", pack_gqa)
    causal = _check_bool("causal", causal)
    r = Hq // Hkv
    if pack_gqa and r < 1:
        raise ValueError(f"pack_gqa=True needs H_q >= 1 query heads (a GQA group of r = H_q / "
                         f"H_kv >= 1 rows to pack), got H_q={Hq}")
    if pack_gqa and blk % r:
        raise ValueError(f"pack_gqa=True needs the GQA group size r = H_q / H_kv = {Hq} / {Hkv} "
                         f"= {r} to divide sparse_block_size={blk}")
    # rows of the metadata: query heads x query blocks, or (pack_gqa) KV heads x packed blocks
    Hm, Nq = (Hkv, -(-(Sq * r) // blk)) if pack_gqa else (Hq, -(-Sq // blk))
    Nkv = -(-Skv // blk)
    hname, nname = ("H_kv", "N_qp") if pack_gqa else ("H_q", "N_q")
    ishape = _check_rank("q2k_block_index", q2k_block_index, 4, f"(B, {hname}, {nname}, K_max)")
    _check_int("q2k_block_index", q2k_block_index)
    if pack_gqa and ishape[:3] != (B, Hm, Nq):
        raise ValueError(
            f"with pack_gqa=True q2k_block_index must have shape (B, H_kv, N_qp, K_max) = "
            f"({B}, {Hm}, {Nq}, K_max) with N_qp = ceil(S_q * r / {blk}) (S_q={Sq}, r={r}), "
            f"got {ishape}")
    if ishape[:3] != (B, Hm, Nq):
        other = "bshd" if layout == "bhsd" else "bhsd"
        B2, Hq2, Sq2 = (qs[0], qs[1], qs[2]) if other == "bhsd" else (qs[0], qs[2], qs[1])
        hint = ""
        if ishape[:3] == (B2, Hq2, -(-Sq2 // blk)):
            hint = f"; it matches q read as layout={other!r}: pass layout={other!r}"
        raise ValueError(
            f"q2k_block_index must have shape (B, H_q, N_q, K_max) = ({B}, {Hq}, {Nq}, K_max) "
            f"with N_q = ceil(S_q / {blk}) for q of shape {qs} in layout={layout!r} "
            f"{desc}, got {ishape}{hint}"
        )
    K_max = ishape[3]
    if K_max < 1:
        raise ValueError("q2k_block_index must have K_max >= 1 entries per row, got K_max=0")
    allow_empty_block_nums = _check_bool("allow_empty_block_nums", allow_empty_block_nums)
    if (block_sparse_num is None) == (q2k_block_nums is None):
        raise ValueError(
            "pass exactly one of block_sparse_num (a fixed count) and q2k_block_nums "
            f"(per-row counts (B, {hname}, {nname}))"
        )
    if block_sparse_num is not None:
        if getattr(block_sparse_num, "ndim", 0):
            raise TypeError(
                "block_sparse_num must be a static Python int (one count for every row), got "
                f"an array of shape {tuple(block_sparse_num.shape)}; for per-row counts pass "
                "the array as q2k_block_nums=...")
        n = _static_int("block_sparse_num", block_sparse_num)
        if not 1 <= n <= K_max:
            raise ValueError(f"block_sparse_num must be in [1, K_max={K_max}], got {n}")
        block_sparse_num = n
    else:
        nshape = _check_rank("q2k_block_nums", q2k_block_nums, 3, f"(B, {hname}, {nname})")
        _check_int("q2k_block_nums", q2k_block_nums)
        if nshape != (B, Hm, Nq):
            raise ValueError(f"q2k_block_nums must have shape (B, {hname}, {nname}) = "
                             f"{(B, Hm, Nq)}, got {nshape}")
    if block_sizes is not None:
        bshape = _shape("block_sizes", block_sizes)
        _check_int("block_sizes", block_sizes)
        allowed = {1: (Nkv,), 2: (B, Nkv), 3: (B, Hm, Nkv)}
        if len(bshape) not in allowed or bshape != allowed[len(bshape)]:
            raise ValueError(
                f"block_sizes must have shape (N_kv,) = ({Nkv},), (B, N_kv) = {(B, Nkv)} or "
                f"(B, {hname}, N_kv) = {(B, Hm, Nkv)}, got {bshape}"
            )
    if softmax_scale is None:
        scale = 1.0 / float(np.sqrt(D))  # D >= 1 was checked above
    else:
        scale = _static_real("softmax_scale", softmax_scale)
    return BSAConfig(dtype=dt.name, layout=layout, sparse_block_size=blk, softmax_scale=scale,
                     block_sparse_num=block_sparse_num,
                     allow_empty_block_nums=allow_empty_block_nums,
                     has_block_sizes=block_sizes is not None, batch=B, num_heads_q=Hq,
                     num_heads_kv=Hkv, seqlen_q=Sq, seqlen_kv=Skv, head_dim=D, head_dim_v=Dv,
                     num_q_blocks=Nq, num_kv_blocks=Nkv, k_max=K_max, kv_splits=kv_splits,
                     pack_gqa=pack_gqa, causal=causal)


def validate_bsa_metadata(q, k, v, q2k_block_index, block_sparse_num=None, block_sizes=None,
                          q2k_block_nums=None, *, sparse_block_size=128, layout="bhsd",
                          allow_empty_block_nums=False, softmax_scale=None, pack_gqa=False,
                          kv_splits=1, causal=False, backend="auto", switches=None,
                          debug_checks=False, deterministic=False):
    """Check the shapes *and values* of block-sparse attention metadata eagerly.

    Takes the same arguments as :func:`~jax_sparse_attn.block_sparse_attention` (``q``,
    ``k``, ``v`` may be :class:`jax.ShapeDtypeStruct`; ``kv_splits``, ``causal``,
    ``backend``, ``switches``, ``debug_checks`` and ``deterministic`` are checked like the
    op's and do not change the metadata contract). Value checks: counts in
    ``[1, K_max]`` (``[0, K_max]`` with ``allow_empty_block_nums``); indices of the active
    prefix in ``[0, N_kv)`` and unique within their row (entries past the prefix are
    ignored); ``block_sizes`` in ``[1, sparse_block_size]``.

    Args:
      q ``(B, H_q, S_q, D)``, k/v ``(B, H_kv, S_kv, D)`` (bhsd; bshd swaps S and H),
      q2k_block_index ``(B, H_q, N_q, K_max)`` int32, block_sparse_num (int) or
      q2k_block_nums ``(B, H_q, N_q)`` int32, block_sizes ``(N_kv,)``, ``(B, N_kv)`` or
      ``(B, H_q, N_kv)`` int32, and the keyword options of the op; ``pack_gqa=True``: the
      packed contract, ``H_kv`` and ``N_qp = ceil(S_q r / blk)`` in place of ``H_q`` and
      ``N_q`` (see :func:`~jax_sparse_attn.block_sparse_attention`).

    Raises:
      ValueError naming the first offending position (and the op's argument errors);
      TypeError for traced metadata (inside ``jax.jit`` / ``jax.vmap``: use the op's
      ``debug_checks=True`` there) and for metadata given as a ``jax.ShapeDtypeStruct``.
    """
    check_backend(backend)
    check_switches(switches)
    check_debug_checks(debug_checks)
    check_deterministic(deterministic)
    _bsa_eager_checks(q, k, v, q2k_block_index, block_sparse_num, block_sizes, q2k_block_nums,
                      sparse_block_size=sparse_block_size, softmax_scale=softmax_scale,
                      layout=layout, allow_empty_block_nums=allow_empty_block_nums,
                      pack_gqa=pack_gqa, kv_splits=kv_splits, causal=causal,
                      fn_name="validate_bsa_metadata")


def _bsa_eager_checks(q, k, v, q2k_block_index, block_sparse_num, block_sizes, q2k_block_nums,
                      *, allow_empty_block_nums=False, fn_name=None, **options):
    """:func:`check_bsa_args` and the value checks of the metadata. With ``fn_name`` traced
    metadata raise the TypeError of :func:`validate_bsa_metadata`; with None they are
    skipped and the concrete ones checked (as the op does)."""
    block_sizes = as_array_arg(block_sizes)  # a Python list, as the op takes it
    opts = check_bsa_args(q, k, v, q2k_block_index, block_sparse_num, block_sizes,
                          q2k_block_nums, allow_empty_block_nums=allow_empty_block_nums,
                          **options)
    require_values(q2k_block_index=q2k_block_index, block_sizes=block_sizes,
                   q2k_block_nums=q2k_block_nums)
    if fn_name is not None:
        _require_concrete(fn_name, q2k_block_index=q2k_block_index, block_sizes=block_sizes,
                          q2k_block_nums=q2k_block_nums)
    _bsa_value_checks(q2k_block_index, block_sizes, q2k_block_nums, allow_empty_block_nums, opts)


def _bsa_value_checks(q2k_block_index, block_sizes, q2k_block_nums, allow_empty_block_nums, opts):
    """The value checks of :func:`validate_bsa_metadata`, given the config ``opts`` that
    :func:`check_bsa_args` returned for the same arguments (the public op reuses it).
    Traced arrays among the metadata are skipped and the concrete ones checked (the op
    passes them so when only some metadata are traced): ``block_sizes`` on its own;
    ``q2k_block_nums`` on its own; ``q2k_block_index`` when its active prefixes are known
    (``block_sparse_num``, or concrete ``q2k_block_nums``)."""
    B, Nq, Nkv, K_max = opts.batch, opts.num_q_blocks, opts.num_kv_blocks, opts.k_max
    Hq = opts.num_heads_kv if opts.pack_gqa else opts.num_heads_q  # metadata rows
    blk = opts.sparse_block_size
    if q2k_block_nums is None:
        # (with a traced index not built: the shape may hold a symbolic batch of jax.export)
        nums = (np.full((B, Hq, Nq), opts.block_sparse_num, np.int64)
                if is_concrete(q2k_block_index) else None)
    elif not is_concrete(q2k_block_nums):
        nums = None  # traced: the active prefixes, hence the index checks, are unknown
    else:
        nums = _host(q2k_block_nums)
        lo = 0 if allow_empty_block_nums else 1
        pos = _first((nums < lo) | (nums > K_max))
        if pos is not None:
            hint = "" if allow_empty_block_nums else " (0 needs allow_empty_block_nums=True)"
            raise ValueError(f"q2k_block_nums[{pos}]={int(nums[pos])} is outside [{lo}, K_max={K_max}]{hint}")
    if nums is not None and is_concrete(q2k_block_index):
        _bsa_index_checks(_host(q2k_block_index), nums, Nkv, K_max)
    if block_sizes is not None and is_concrete(block_sizes):
        bs = _host(block_sizes)
        pos = _first((bs < 1) | (bs > blk))
        if pos is not None:
            raise ValueError(f"block_sizes[{pos}]={int(bs[pos])} is outside [1, sparse_block_size={blk}]")


def _bsa_index_checks(idx, nums, Nkv, K_max):
    """Active entries of ``q2k_block_index`` (host copy ``idx``, counts ``nums``) in
    ``[0, N_kv)`` and unique within their row."""
    active = np.arange(K_max) < nums[..., None]
    pos = _first(active & ((idx < 0) | (idx >= Nkv)))
    if pos is not None:
        raise ValueError(f"q2k_block_index[{pos}]={int(idx[pos])} is outside [0, N_kv={Nkv})")
    if K_max > 1 and idx.size:
        # duplicates among active entries: sort each row with inactive entries as unique sentinels
        sentinel = Nkv + np.arange(K_max)
        keyed = np.where(active, idx, sentinel)
        order = np.argsort(keyed, axis=-1, kind="stable")
        srt = np.take_along_axis(keyed, order, axis=-1)
        dup = np.argwhere(srt[..., 1:] == srt[..., :-1])
        if dup.size:
            b, h, m, t = (int(x) for x in dup[0])
            pos = (b, h, m, int(order[b, h, m, t + 1]))
            raise ValueError(
                f"q2k_block_index[{pos}]={int(idx[pos])} repeats a block already listed in the "
                f"active prefix of row ({b}, {h}, {m}); active indices must be unique"
            )
