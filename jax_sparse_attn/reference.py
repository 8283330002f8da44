"""Pure-``jnp`` reference implementations of HSTU attention and block-sparse attention.

This module is both the any-backend execution path (``backend="reference"``, and what
``backend="auto"`` picks where no kernel applies) and the oracle every kernel test
compares against. It has exactly the semantics documented in :mod:`jax_sparse_attn.hstu`
and :mod:`jax_sparse_attn.bsa` (sources: the HSTU paper, Zhai et al. 2024, and cuDNN's
block-sparse attention conventions).

Precision
---------
By default everything is computed in float32 (float64 when the inputs are float64)
and the outputs are cast back to the input dtype (``lse`` is always float32, or
float64 for float64 inputs). ``compute_dtype=jnp.bfloat16`` (or ``jnp.float16``)
performs *the same computation in that dtype* (scores, SiLU/softmax, products and
accumulations), which kernel tests use to measure the error budget of a low-precision
computation (the "2x fwd / 5x bwd" rule).

Memory
------
Nothing of size ``(B, H, L, L)`` is materialised at once: HSTU is evaluated per query
tile of at most 128 rows of one sequence, only the tiles the sequences' lengths need (about
``T_q / tile + B`` of them, :func:`hstu_ref_tiles`), each against a padded view of
``min(max_seqlen_k, T_k)`` keys of its sequence (``max_seqlen_k`` with a paged cache); BSA
per (batch, head, query block) over the gathered listed key blocks only. The per-item
bodies run under ``lax.map`` (vectorised in chunks bounded to about 2**22 score elements)
and are rematerialised (``jax.checkpoint``) under differentiation, so ``jax.vjp`` of the
forward keeps memory bounded as well.

No value validation happens here (see :mod:`jax_sparse_attn.validation`); out-of-range
metadata entries are clipped so that gathers never read out of bounds.
"""

from __future__ import annotations

import math
import numbers

import jax
import jax.numpy as jnp
from jax import lax

from .masks import func_interval_mask
from .metadata import auto_kv_splits, kv_split_ids, normalize_bsa_metadata
from .validation import HSTU_PAGE_SIZE, MAX_KV_SPLITS, _unbounded_window, check_kv_splits

__all__ = [
    "hstu_attention_ref",
    "hstu_attention_bwd_ref",
    "block_sparse_attention_ref",
    "block_sparse_attention_bwd_ref",
    "normalize_bsa_metadata",
    "combine_kv_splits",
    "PAGE_SIZE",
]

#: Tokens per page of the HSTU paged KV cache (``paged_kv.shape[2]``).
PAGE_SIZE = HSTU_PAGE_SIZE

# Upper bound on the number of score elements evaluated per lax.map step (larger on
# accelerators, where many small sequential steps are slow).
_CHUNK_ELEMS_CPU = 1 << 22
_CHUNK_ELEMS_ACCEL = 1 << 26


def _compute_dtype(in_dtype, compute_dtype):
    if compute_dtype is None:
        return jnp.promote_types(in_dtype, jnp.float32)
    return jnp.dtype(compute_dtype)


def _map_batch(n_items: int, elems_per_item: int) -> int:
    """Items per ``lax.map`` step; 1 when ``n_items`` is symbolic (``jax.export`` shape
    polymorphism), whose chunking into larger steps would need its value."""
    if not isinstance(n_items, numbers.Integral):
        return 1
    budget = _CHUNK_ELEMS_CPU if jax.default_backend() == "cpu" else _CHUNK_ELEMS_ACCEL
    return max(1, min(n_items, budget // max(1, elems_per_item)))


# ----------------------------------------------------------------------------- HSTU


def hstu_ref_tiles(n_seqs, t_q, t_k, max_seqlen_q: int, max_seqlen_k: int, q_tile: int = 128):
    """The static tiling of the HSTU reference: ``(tile, n_keys, n_items)``.

    Each work item is one tile of ``tile`` query rows of one sequence against ``n_keys``
    key slots of that sequence, so the reference evaluates ``n_items * tile * n_keys``
    scores per head.

    * ``tile = min(q_tile, max_seqlen_q, max(16, m))``, ``m`` the packed rows per sequence
      that can be non-empty (``ceil(T_q / min(B, T_q))``) rounded up to a power of two:
      many short sequences get short tiles.
    * ``n_keys = min(max_seqlen_k, T_k)``: no sequence of valid ``cu_seqlens_k`` holds more
      keys than the packed tensor (``t_k=None``, a paged cache, keeps ``max_seqlen_k``).
    * ``n_items = min(B ceil(max_seqlen_q / tile), ceil(T_q / tile) + min(B, T_q))``, which
      covers every tile that valid ``cu_seqlens_q`` can need (a sequence of ``L >= 1`` rows
      needs ``ceil(L / tile)``, and at most ``min(B, T_q)`` sequences are non-empty).

    The tiling follows the packed sizes, so one sequence's result can differ in the last
    bits between calls whose ``T_q``, ``T_k`` or ``B`` differ (padding, batch folding under
    ``vmap``). With symbolic sizes (``jax.export``) the bounds that need their values are
    not applied.
    """
    concrete = all(isinstance(n, numbers.Integral) for n in (n_seqs, t_q))
    tile = max(1, min(int(q_tile), int(max_seqlen_q)))
    if concrete and t_q > 0 and n_seqs > 0:
        per_seq = -(-int(t_q) // min(int(n_seqs), int(t_q)))
        tile = min(tile, max(16, 1 << (per_seq - 1).bit_length()))
    n_keys = int(max_seqlen_k)
    if isinstance(t_k, numbers.Integral):
        n_keys = max(1, min(n_keys, int(t_k)))
    n_items = n_seqs * -(-int(max_seqlen_q) // tile)
    if concrete:
        n_items = min(n_items, -(-int(t_q) // tile) + min(int(n_seqs), int(t_q)))
    return tile, n_keys, n_items


def _hstu_attention_ref_impl(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    func=None,
    *,
    max_seqlen_q: int,
    max_seqlen_k: int,
    scaling_seqlen=None,
    window_size=(-1, 0),
    alpha=1.0,
    paged_kv=None,
    page_ids=None,
    page_indptrs=None,
    compute_dtype=None,
    q_tile: int = 128,
    rab=None,
):
    """HSTU attention forward, pure ``jnp``.

    Args:
      q: ``(T_q, H, D)``.  k: ``(T_k, H_kv, D)`` or None with paged KV (``H_kv`` divides
        ``H``; query head ``h`` reads KV head ``h // (H / H_kv)``, GQA/MQA).
      v: ``(T_k, H_kv, D_v)`` or None with paged KV.
      cu_seqlens_q, cu_seqlens_k: ``(B+1,)`` int32 prefix sums.
      func: optional int32 ``(1, N, L_f)`` interval mask (N odd).
      max_seqlen_q, max_seqlen_k: static Python ints, upper bounds of the per-sequence lengths.
      scaling_seqlen: output divisor, default ``max_seqlen_q``.
      window_size: ``(left, right)``, ``-1`` = unbounded side.
      alpha: score scale.
      paged_kv, page_ids, page_indptrs: paged KV cache (``(num_pages, 2, 128, H_kv, D)``).
      compute_dtype: dtype of the whole computation (default float32, float64 for
        float64 inputs).
      q_tile: query rows per evaluated tile.
      rab: optional relative attention bias ``(B, H_rab, max_seqlen_k, max_seqlen_k)``,
        ``H_rab`` in {1, H}: the score of local query ``i`` (key position
        ``p = i + L_k - L_q``) and key ``j`` is ``alpha * q_i . k_j + rab[b, h % H_rab, p, j]``
        (bias 0 where ``p < 0``).

    Returns:
      ``out (T_q, H, D_v)`` in q's dtype. Rows outside every sequence are 0.
    """
    paged = paged_kv is not None
    q = jnp.asarray(q)
    if paged:
        paged_kv, page_ids, page_indptrs = (jnp.asarray(x) for x in (paged_kv, page_ids, page_indptrs))
    else:
        k, v = jnp.asarray(k), jnp.asarray(v)
    T_q, H, D = q.shape
    D_v = paged_kv.shape[-1] if paged else v.shape[-1]
    group = H // (paged_kv.shape[3] if paged else k.shape[1])
    B = cu_seqlens_q.shape[0] - 1
    out_dtype = q.dtype
    cdt = _compute_dtype(q.dtype, compute_dtype)
    max_seqlen_q = int(max_seqlen_q)
    max_seqlen_k = int(max_seqlen_k)
    if scaling_seqlen is None:
        scaling_seqlen = max_seqlen_q
    # a side reaching every key is the unbounded -1 (keeps p + right within int32)
    left, right = _unbounded_window(tuple(int(w) for w in window_size), max_seqlen_q,
                                    max_seqlen_k)

    n_keys_avail = (paged_kv.shape[0] * page_ids.shape[0]) if paged else k.shape[0]
    if T_q == 0 or B <= 0 or max_seqlen_q <= 0 or max_seqlen_k <= 0 or n_keys_avail == 0:
        return jnp.zeros((T_q, H, D_v), out_dtype)

    tile, n_keys, n_items = hstu_ref_tiles(B, T_q, None if paged else k.shape[0],
                                           max_seqlen_q, max_seqlen_k, q_tile)
    n_t = -(-max_seqlen_q // tile)
    cu_q = jnp.asarray(cu_seqlens_q).astype(jnp.int32)
    cu_k = jnp.asarray(cu_seqlens_k).astype(jnp.int32)
    inv_scale = 1.0 / scaling_seqlen
    j = jnp.arange(n_keys, dtype=jnp.int32)
    # Work items: the query tiles the sequences' lengths need, sequence by sequence
    # (sequence b owns items [first[b], first[b + 1])); items past first[B] are idle.
    lens_q = jnp.clip(cu_q[1:] - cu_q[:-1], 0, max_seqlen_q)
    first = jnp.concatenate([jnp.zeros((1,), jnp.int32),
                             jnp.cumsum((lens_q + tile - 1) // tile).astype(jnp.int32)])

    if func is not None:
        L_f = func.shape[2]
        f2d = jnp.asarray(func)[0].astype(jnp.int32)

    def gather_kv(b):
        k0 = cu_k[b]
        if paged:
            P = page_ids.shape[0]
            slot = jnp.clip(page_indptrs[b] + j // PAGE_SIZE, 0, P - 1)
            page = jnp.clip(page_ids[slot], 0, paged_kv.shape[0] - 1)
            off = j % PAGE_SIZE
            return paged_kv[page, 0, off], paged_kv[page, 1, off]
        rows = jnp.clip(k0 + j, 0, k.shape[0] - 1)
        return k[rows], v[rows]

    def one_tile(item):
        b = jnp.clip(jnp.searchsorted(first, item, side="right").astype(jnp.int32) - 1, 0, B - 1)
        t = jnp.clip(item - first[b], 0, n_t - 1)
        q0 = cu_q[b]
        L_q = cu_q[b + 1] - q0
        L_k = cu_k[b + 1] - cu_k[b]
        i = t * tile + jnp.arange(tile, dtype=jnp.int32)
        zero = jnp.zeros((), cdt)
        # Rows past the sequence (the next sequence's data, unused page slots, padding)
        # are selected away before any arithmetic, so their values (NaN/Inf included)
        # never reach this sequence's result or gradients.
        row_in = (i < L_q) & (item < first[B])
        key_in = j < L_k
        qt = q[jnp.clip(q0 + i, 0, T_q - 1)].astype(cdt)  # (tile, H, D)
        qt = jnp.where(row_in[:, None, None], qt, zero)
        kt, vt = gather_kv(b)
        kt = jnp.where(key_in[:, None, None], kt.astype(cdt), zero)
        vt = jnp.where(key_in[:, None, None], vt.astype(cdt), zero)
        if group > 1:  # GQA/MQA: query head h reads KV head h // group (dk/dv sum the group)
            kt = jnp.repeat(kt, group, axis=1)
            vt = jnp.repeat(vt, group, axis=1)
        s = jnp.einsum("qhd,khd->hqk", qt, kt, preferred_element_type=cdt)
        s = s * jnp.asarray(alpha, cdt)
        valid = row_in[:, None] & key_in[None, :]
        p = (i + L_k - L_q)[:, None]
        if rab is not None:
            # (H_rab, tile, n_keys) rows p of sequence b's bias; 0 where p < 0
            rows = jnp.clip(p[:, 0], 0, max_seqlen_k - 1)
            bias = rab[jnp.clip(b, 0, rab.shape[0] - 1)][:, rows, :n_keys].astype(cdt)
            s = s + jnp.where((p >= 0)[None], bias, jnp.zeros((), cdt))
        if left >= 0:
            valid = valid & (j[None, :] >= p - left)
        if right >= 0:
            valid = valid & (j[None, :] <= p + right)
        if func is not None:
            valid = valid & func_interval_mask(f2d[:, jnp.clip(q0 + i, 0, L_f - 1)], j)
        # SiLU's limit at -inf is 0 (x * sigmoid(x) would give -inf * 0 = NaN); masked
        # scores are selected away (never multiplied by zero), also in the gradient. A NaN
        # score of a visible key stays NaN (silu(NaN)), as in the kernels.
        keep = valid[None] & ~jnp.isneginf(s)
        act = jnp.where(keep, jax.nn.silu(jnp.where(keep, s, zero)), zero)
        o = jnp.einsum("hqk,khd->qhd", act, vt, preferred_element_type=cdt)
        return o * jnp.asarray(inv_scale, cdt)

    outs = lax.map(
        jax.checkpoint(one_tile),
        jnp.arange(n_items, dtype=jnp.int32),
        batch_size=_map_batch(n_items, H * tile * n_keys),
    )  # (n_items, tile, H, D_v)

    r = jnp.arange(T_q, dtype=jnp.int32)
    b_r = jnp.searchsorted(cu_q, r, side="right").astype(jnp.int32) - 1
    b_c = jnp.clip(b_r, 0, B - 1)
    i_r = r - cu_q[b_c]
    item_r = first[b_c] + jnp.clip(i_r, 0, None) // tile
    row_ok = ((b_r >= 0) & (b_r < B) & (i_r >= 0) & (i_r < max_seqlen_q)
              & (item_r < n_items))
    out = outs[jnp.clip(item_r, 0, n_items - 1), jnp.clip(i_r, 0, None) % tile]
    out = jnp.where(row_ok[:, None, None], out, jnp.zeros((), cdt))
    return out.astype(out_dtype)


def _hstu_attention_bwd_ref_impl(
    do,
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    func=None,
    *,
    max_seqlen_q: int,
    max_seqlen_k: int,
    scaling_seqlen=None,
    window_size=(-1, 0),
    alpha=1.0,
    compute_dtype=None,
    rab=None,
):
    """HSTU attention backward: ``(dq, dk, dv)`` = ``jax.vjp`` of :func:`hstu_attention_ref`.

    With ``rab`` it returns ``(dq, dk, dv, drab)``; ``drab`` has rab's shape and dtype
    (summed over heads when ``H_rab = 1``, zero where masked or outside the sequences).
    The forward body is rematerialised per tile, so memory stays bounded. Gradients are
    computed in ``compute_dtype`` (default float32; drab at least float32) and returned
    in the input dtypes.
    """
    cdt = _compute_dtype(q.dtype, compute_dtype)

    def f(q_, k_, v_, rab_=None):
        o = _hstu_attention_ref_impl(
            q_, k_, v_, cu_seqlens_q, cu_seqlens_k, func,
            max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
            scaling_seqlen=scaling_seqlen, window_size=window_size, alpha=alpha,
            compute_dtype=cdt, rab=rab_,
        )
        return o

    prim = [q.astype(cdt), k.astype(cdt), v.astype(cdt)]
    if rab is not None:
        # the bias gradient is a sum over query rows (and heads): accumulate it in >= fp32
        prim.append(rab.astype(jnp.promote_types(cdt, jnp.float32)))
    _, vjp = jax.vjp(f, *prim)
    grads = vjp(do.astype(cdt))
    dq, dk, dv = grads[0].astype(q.dtype), grads[1].astype(k.dtype), grads[2].astype(v.dtype)
    if rab is None:
        return dq, dk, dv
    return dq, dk, dv, grads[3].astype(rab.dtype)


# ----------------------------------------------------------------------------- BSA


def _to_bhsd(x, layout):
    return x if layout == "bhsd" else jnp.swapaxes(x, 1, 2)


def _pack_rows(x, h_kv: int):
    """``pack_gqa`` row order: ``(B, H_q, S, ...) -> (B, H_kv, S r, ...)`` with packed row
    ``s r + g`` = position ``s`` of query head ``h_kv_index r + g`` (``r = H_q / H_kv``)."""
    B, Hq, S = x.shape[:3]
    x = x.reshape((B, h_kv, Hq // h_kv, S) + x.shape[3:])
    return jnp.swapaxes(x, 2, 3).reshape((B, h_kv, S * (Hq // h_kv)) + x.shape[4:])


def _unpack_rows(x, r: int):
    """Inverse of :func:`_pack_rows`: ``(B, H_kv, S r, ...) -> (B, H_kv r, S, ...)``."""
    B, Hkv, Sr = x.shape[:3]
    x = x.reshape((B, Hkv, Sr // r, r) + x.shape[3:])
    return jnp.swapaxes(x, 2, 3).reshape((B, Hkv * r, Sr // r) + x.shape[4:])


def _bsa_blocks(q, k, v, q2k_block_index, q2k_block_nums, block_sizes, layout,
                sparse_block_size, softmax_scale, pack_gqa=False, causal=False):
    """Shared setup: bhsd views (with ``pack_gqa`` q in packed rows ``(B, H_kv, S_q r,
    D)``), the dims ``(B, H, H_kv, S, S_kv, D, D_v, N_q, N_kv, blk, r, diag)`` of the
    metadata rows (``H``, ``S`` = ``H_q``, ``S_q``, or ``H_kv``, ``S_q r`` when packed; a
    row's query position is ``row // r``, ``r`` = 1 unpacked; ``diag = S_kv - S_q`` under
    ``causal``, else None), normalised metadata and the softmax scale (default
    ``1/sqrt(D)``)."""
    q = _to_bhsd(jnp.asarray(q), layout)
    k = _to_bhsd(jnp.asarray(k), layout)
    v = _to_bhsd(jnp.asarray(v), layout)
    blk = int(sparse_block_size)
    Hkv, Skv = k.shape[1], k.shape[2]
    Sq0 = q.shape[2]
    r = 1
    if pack_gqa and Hkv > 0:
        r = q.shape[1] // Hkv
        q = _pack_rows(q, Hkv)
    B, Hq, Sq, D = q.shape
    Dv = v.shape[-1]
    Nq = -(-Sq // blk)
    Nkv = -(-Skv // blk)
    idx, nums, sizes = normalize_bsa_metadata(q2k_block_index, None, block_sizes,
                                              q2k_block_nums)
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(D)
    diag = Skv - Sq0 if causal else None
    dims = (B, Hq, Hkv, Sq, Skv, D, Dv, Nq, Nkv, blk, r, diag)
    return q, k, v, dims, idx, nums, sizes, softmax_scale


def _pad_blocks(x, n_blocks, blk):
    """(B, H, S, E) -> (B, H, n_blocks, blk, E), zero padded."""
    B, H, S, E = x.shape
    x = jnp.pad(x, ((0, 0), (0, 0), (0, n_blocks * blk - S), (0, 0)))
    return x.reshape(B, H, n_blocks, blk, E)


def _bsa_item_keys(n, idx, nums, sizes, dims):
    """Per (b, h, m) item: gathered KV block ids, the key validity mask (causal: also
    keys that the item's last query row sees), the valid query rows and the (row, key) mask
    ``allowed`` (the key mask, and causal: key position <= query position + S_kv - S_q)."""
    B, Hq, Hkv, Sq, Skv, D, Dv, Nq, Nkv, blk, r, diag = dims
    K_max = idx.shape[-1]
    b = n // (Hq * Nq)
    h = (n // Nq) % Hq
    m = n % Nq
    ids = idx[b, h, m]
    active = jnp.arange(K_max, dtype=jnp.int32) < nums[b, h, m]
    idc = jnp.where(active, jnp.clip(ids, 0, Nkv - 1), 0)
    off = jnp.arange(blk, dtype=jnp.int32)
    kpos = idc[:, None] * blk + off[None, :]
    kval = active[:, None] & (kpos < Skv)
    if sizes is not None:
        kval = kval & (off[None, :] < sizes[b, h, idc][:, None])
    qrow_ok = (m * blk + off) < Sq
    if diag is not None:
        # keys past the diagonal of the item's last query row are seen by none of its rows:
        # they are no keys of the item (selected to zero below, whatever K/V hold there)
        q_last = (jnp.minimum((m + 1) * blk, Sq) - 1) // r
        kval = kval & (kpos <= q_last + diag)
    kval = kval.reshape(K_max * blk)
    allowed = kval[None, :]
    if diag is not None:
        qpos = (m * blk + off) // r
        allowed = allowed & (kpos.reshape(K_max * blk)[None, :] <= (qpos + diag)[:, None])
    return b, h, m, idc, kval, qrow_ok, allowed


def _listed_kv(kb, vb, b, hk, idc, kval, cdt):
    """Keys and values of the listed blocks ``(K_max * blk, D)``; key rows that are not
    keys of this row (inactive list entries, partial-block tails, padding) are selected
    to zero, so whatever they hold (NaN/Inf included) never reaches a result."""
    K_max, blk = idc.shape[0], kb.shape[3]
    zero = jnp.zeros((), cdt)
    kt = kb[b, hk, idc].reshape(K_max * blk, kb.shape[-1]).astype(cdt)
    vt = vb[b, hk, idc].reshape(K_max * blk, vb.shape[-1]).astype(cdt)
    return (jnp.where(kval[:, None], kt, zero), jnp.where(kval[:, None], vt, zero))


def _split_partials(s, vt, sp, n_splits: int, cdt):
    """Per-split softmax partials of one item: scores ``s (rows, K_max * blk)`` (-inf where
    masked), values ``vt (K_max * blk, D_v)``, split id ``sp (K_max,)`` of each list entry.
    Returns ``(o_s (n_splits, rows, D_v), lse_s (n_splits, rows))``, normalised per split;
    a split without keys gives 0 and -inf."""
    rows, K = s.shape[0], sp.shape[0]
    s3 = s.reshape(rows, K, -1)
    sel = sp[:, None] == jnp.arange(n_splits, dtype=jnp.int32)[None, :]  # (K, n_splits)
    neg = jnp.asarray(-jnp.inf, cdt)
    mxs = jnp.max(jnp.where(sel[None], jnp.max(s3, axis=-1)[:, :, None], neg), axis=1)
    mxs = jnp.where(jnp.isfinite(mxs), mxs, jnp.zeros((), cdt))  # (rows, n_splits)
    e = jnp.exp(s3 - jnp.take(mxs, sp, axis=1)[..., None])
    onehot = sel.astype(cdt)
    ls = jnp.einsum("qt,ts->sq", jnp.sum(e, axis=-1), onehot)
    o_t = jnp.einsum("qtk,tkd->qtd", e, vt.reshape(K, -1, vt.shape[-1]),
                     preferred_element_type=cdt)
    o_s = jnp.einsum("qtd,ts->sqd", o_t, onehot)
    # empty: no key (exactly 0); NaN (NaN in the row's scores) stays NaN
    nonempty = ls != 0
    ls_safe = jnp.where(nonempty, ls, jnp.ones((), cdt))
    return (o_s / ls_safe[..., None],
            jnp.where(nonempty, mxs.T + jnp.log(ls_safe), neg))


def combine_kv_splits(o_parts, lse_parts):
    """Merge split-KV partial results (the split axis first): ``o_parts (S, ..., D_v)``
    normalised per split and ``lse_parts (S, ...)`` (natural log) give ``lse = log sum_s
    exp(lse_s)`` and ``o = sum_s exp(lse_s - lse) o_s``. Splits with ``lse_s = -inf`` (no
    key) contribute nothing; if every split is empty, ``o = 0`` and ``lse = -inf`` (no
    NaN). A NaN ``lse_s`` (NaN in its scores) makes ``o`` and ``lse`` NaN."""
    mx = jnp.max(lse_parts, axis=0)
    mx = jnp.where(jnp.isfinite(mx), mx, jnp.zeros((), mx.dtype))
    w = jnp.exp(lse_parts - mx)
    tot = jnp.sum(w, axis=0)
    # empty: every weight exactly 0 (a NaN total is not empty: it stays NaN)
    nonempty = tot != 0
    tot_safe = jnp.where(nonempty, tot, jnp.ones((), tot.dtype))
    o = jnp.sum(w[..., None] * o_parts, axis=0) / tot_safe[..., None]
    return o, jnp.where(nonempty, mx + jnp.log(tot_safe), -jnp.inf)


def _block_sparse_attention_ref_impl(
    q,
    k,
    v,
    q2k_block_index,
    q2k_block_nums,
    block_sizes=None,
    *,
    layout: str = "bhsd",
    sparse_block_size: int = 128,
    softmax_scale=None,
    compute_dtype=None,
    kv_splits=1,
    pack_gqa: bool = False,
    causal: bool = False,
):
    """Block-sparse softmax attention forward, pure ``jnp``.

    Args:
      q: ``(B, H_q, S_q, D)`` (``bhsd``) or ``(B, S_q, H_q, D)`` (``bshd``).
      k: ``(B, H_kv, S_kv, D)`` / ``(B, S_kv, H_kv, D)``; v: same with ``D_v``.
      q2k_block_index: int32 ``(B, H_q, N_q, K_max)``.
      q2k_block_nums: int32 ``(B, H_q, N_q)`` active-prefix lengths (use
        :func:`normalize_bsa_metadata` to turn a fixed ``block_sparse_num`` into this).
      block_sizes: None or int32 of rank 1 ``(N_kv,)``, 2 ``(B, N_kv)`` or 3 ``(B, H_q, N_kv)``.
      softmax_scale: default ``1/sqrt(D)``.
      compute_dtype: dtype of the computation (default float32 / float64 for float64 inputs).
      kv_splits: static int in ``[1, 256]`` or ``"auto"`` (else ValueError / TypeError, as
        the op's): each row's active list is cut into that many
        contiguous chunks (:func:`~jax_sparse_attn.metadata.kv_split_ids`), each chunk's
        softmax partial is computed alone and the partials are merged by
        :func:`combine_kv_splits` (the split-KV computation; same result up to rounding).
      pack_gqa: metadata in the packed contract ``(B, H_kv, N_qp, K_max)``, packed row
        ``s r + g`` = position ``s`` of query head ``h_kv r + g``.
      causal: keys after the query position (bottom-right aligned: key ``j`` is visible
        from query ``i`` iff ``j <= i + S_kv - S_q``) are masked inside the listed blocks.

    Returns:
      ``(out, lse)``: out in the input layout and q's dtype, ``lse (B, H_q, S_q)`` natural
      log in float32 (float64 for float64 inputs), ``-inf`` (and out 0) for rows with no key.
    """
    in_dtype = q.dtype
    cdt = _compute_dtype(in_dtype, compute_dtype)
    lse_dtype = jnp.promote_types(in_dtype, jnp.float32)
    q, k, v, dims, idx, nums, sizes, softmax_scale = _bsa_blocks(
        q, k, v, q2k_block_index, q2k_block_nums, block_sizes, layout, sparse_block_size,
        softmax_scale, pack_gqa, causal)
    B, Hq, Hkv, Sq, Skv, D, Dv, Nq, Nkv, blk, r, _ = dims
    K_max, g = idx.shape[-1], Hq // max(Hkv, 1)
    if kv_splits == "auto":
        kv_splits = auto_kv_splits(B * Hq * Nq, K_max)
    n_splits = max(1, min(int(kv_splits), K_max))

    def finish(o_bhsd, lse):
        if r > 1:
            o_bhsd, lse = _unpack_rows(o_bhsd, r), _unpack_rows(lse, r)
        o = o_bhsd.astype(in_dtype)
        return (o if layout == "bhsd" else jnp.swapaxes(o, 1, 2)), lse.astype(lse_dtype)

    if B == 0 or Hq == 0 or Sq == 0 or Skv == 0 or K_max == 0:
        return finish(jnp.zeros((B, Hq, Sq, Dv), cdt),
                      jnp.full((B, Hq, Sq), -jnp.inf, lse_dtype))

    qb = _pad_blocks(q, Nq, blk)
    kb = _pad_blocks(k, Nkv, blk)
    vb = _pad_blocks(v, Nkv, blk)
    scale = jnp.asarray(softmax_scale, cdt)

    def one(n):
        b, h, m, idc, kval, _, allowed = _bsa_item_keys(n, idx, nums, sizes, dims)
        qt = qb[b, h, m].astype(cdt)  # (blk, D)
        kt, vt = _listed_kv(kb, vb, b, h // g, idc, kval, cdt)
        # the scale goes on q so that the scores are one materialised product: a fused
        # ``dot * scale - max`` (one rounding) against the rounded ``dot * scale`` of the
        # row max differs by an ulp of the score, which overflows exp at huge scales
        s = jnp.einsum("qd,kd->qk", qt * scale, kt, preferred_element_type=cdt)
        s = jnp.where(allowed, s, -jnp.inf)
        if n_splits > 1:
            sp = kv_split_ids(nums[b, h, m], K_max, n_splits)
            return combine_kv_splits(*_split_partials(s, vt, sp, n_splits, cdt))
        mx = jnp.max(s, axis=-1)
        mx = jnp.where(jnp.isfinite(mx), mx, jnp.zeros((), cdt))
        e = jnp.exp(s - mx[:, None])
        lsum = jnp.sum(e, axis=-1)
        # empty: no allowed key (every term exactly 0); NaN in the row's scores keeps NaN
        # in lse as in o, rather than reading as an empty row
        nonempty = lsum != 0
        lsum_safe = jnp.where(nonempty, lsum, jnp.ones((), cdt))
        o = jnp.einsum("qk,kd->qd", e, vt, preferred_element_type=cdt) / lsum_safe[:, None]
        lse = jnp.where(nonempty, mx + jnp.log(lsum_safe), -jnp.inf)
        return o, lse

    n_items = B * Hq * Nq
    o, lse = lax.map(jax.checkpoint(one), jnp.arange(n_items, dtype=jnp.int32),
                     batch_size=_map_batch(n_items, blk * K_max * blk))
    o = o.reshape(B, Hq, Nq * blk, Dv)[:, :, :Sq]
    lse = lse.reshape(B, Hq, Nq * blk)[:, :, :Sq]
    return finish(o, lse)


def _block_sparse_attention_bwd_ref_impl(
    do,
    q,
    k,
    v,
    out,
    lse,
    q2k_block_index,
    q2k_block_nums,
    block_sizes=None,
    *,
    layout: str = "bhsd",
    sparse_block_size: int = 128,
    softmax_scale=None,
    compute_dtype=None,
    dlse=None,
    pack_gqa: bool = False,
    causal: bool = False,
):
    """Explicit block-sparse attention backward from the saved ``out`` and ``lse``.

    Per (b, h, query block m) over the listed key blocks: ``P = exp(scale*QK^T - lse)``,
    ``dV += P^T dO``, ``dS = P (dO V^T - rowsum(dO*O))``, ``dQ = scale dS K``,
    ``dK += scale dS^T Q``; dK/dV are summed over the query heads sharing a KV head.
    ``dlse`` (optional ``(B, H_q, S_q)``) is a cotangent of ``lse``: it enters the row
    term as ``rowsum(dO*O) - dlse``. Rows with ``lse = -inf`` contribute nothing.
    ``pack_gqa`` / ``causal`` as in the forward (:func:`block_sparse_attention_ref`).
    Returns ``(dq, dk, dv)`` in the input layout and dtypes, computed in ``compute_dtype``
    (default float32).
    """
    in_dtypes = (q.dtype, k.dtype, v.dtype)
    cdt = _compute_dtype(q.dtype, compute_dtype)
    do = _to_bhsd(jnp.asarray(do), layout)
    out = _to_bhsd(jnp.asarray(out), layout)
    lse = jnp.asarray(lse)
    q, k, v, dims, idx, nums, sizes, softmax_scale = _bsa_blocks(
        q, k, v, q2k_block_index, q2k_block_nums, block_sizes, layout, sparse_block_size,
        softmax_scale, pack_gqa, causal)
    B, Hq, Hkv, Sq, Skv, D, Dv, Nq, Nkv, blk, r, _ = dims
    K_max, g = idx.shape[-1], Hq // max(Hkv, 1)
    if r > 1:
        do, out, lse = _pack_rows(do, Hkv), _pack_rows(out, Hkv), _pack_rows(lse, Hkv)
        dlse = None if dlse is None else _pack_rows(jnp.asarray(dlse), Hkv)

    def finish(dq, dk, dv):
        if r > 1:
            dq = _unpack_rows(dq, r)
        res = (dq.astype(in_dtypes[0]), dk.astype(in_dtypes[1]), dv.astype(in_dtypes[2]))
        if layout == "bshd":
            res = tuple(jnp.swapaxes(x, 1, 2) for x in res)
        return res

    if B == 0 or Hq == 0 or Sq == 0 or Skv == 0 or K_max == 0:
        return finish(jnp.zeros(q.shape, cdt), jnp.zeros(k.shape, cdt), jnp.zeros(v.shape, cdt))

    qb = _pad_blocks(q, Nq, blk)
    kb = _pad_blocks(k, Nkv, blk)
    vb = _pad_blocks(v, Nkv, blk)
    dob = _pad_blocks(do, Nq, blk)
    # delta_i = rowsum(dO * O) once per query row (the row term of dS)
    delta = jnp.sum(do.astype(cdt) * out.astype(cdt), axis=-1)
    if dlse is not None:
        delta = delta - jnp.asarray(dlse).astype(cdt)
    deltab = jnp.pad(delta, ((0, 0), (0, 0), (0, Nq * blk - Sq))).reshape(B, Hq, Nq, blk)
    lseb = jnp.pad(lse, ((0, 0), (0, 0), (0, Nq * blk - Sq)),
                   constant_values=-jnp.inf).reshape(B, Hq, Nq, blk)
    scale = jnp.asarray(softmax_scale, cdt)

    def one(n):
        b, h, m, idc, kval, qrow_ok, allowed = _bsa_item_keys(n, idx, nums, sizes, dims)
        qt = qb[b, h, m].astype(cdt)
        dot = dob[b, h, m].astype(cdt)
        lt = lseb[b, h, m]
        kt, vt = _listed_kv(kb, vb, b, h // g, idc, kval, cdt)
        s = jnp.einsum("qd,kd->qk", qt * scale, kt, preferred_element_type=cdt)
        # empty rows (lse = -inf) contribute nothing; a NaN lse (NaN in the row's scores)
        # propagates into the gradients like the NaN it stands for
        row_ok = qrow_ok & (lt != -jnp.inf)
        lt_safe = jnp.where(row_ok, lt, 0).astype(cdt)
        ok = row_ok[:, None] & allowed
        p = jnp.where(ok, jnp.exp(jnp.where(ok, s - lt_safe[:, None], 0)), jnp.zeros((), cdt))
        dv_c = jnp.einsum("qk,qd->kd", p, dot, preferred_element_type=cdt)
        dp = jnp.einsum("qd,kd->qk", dot, vt, preferred_element_type=cdt)
        di = deltab[b, h, m]
        ds = jnp.where(ok, p * (dp - di[:, None]), jnp.zeros((), cdt))
        dq = jnp.einsum("qk,kd->qd", ds, kt, preferred_element_type=cdt) * scale
        dk_c = jnp.einsum("qk,qd->kd", ds, qt, preferred_element_type=cdt) * scale
        # key rows that are no keys of this item (inactive list entries, an item with no
        # listed block, partial-block tails) get exactly zero: their zero dS / P columns
        # would still meet a NaN / Inf query or dO row of the item in 0 * NaN
        zero = jnp.zeros((), cdt)
        dk_c = jnp.where(kval[:, None], dk_c, zero)
        dv_c = jnp.where(kval[:, None], dv_c, zero)
        return dq, dk_c.reshape(K_max, blk, D), dv_c.reshape(K_max, blk, Dv), idc

    # Scan over chunks of (b, h, m) items; each chunk is vectorised and scatter-adds its
    # dK/dV block contributions into the carried (B, H_kv, N_kv, blk, D) accumulators,
    # so memory stays O(chunk + K + V) whatever K_max.
    n_items = B * Hq * Nq
    bs = _map_batch(n_items, blk * K_max * blk)
    n_chunks = -(-n_items // bs)

    def chunk(carry, c):
        dk_acc, dv_acc = carry
        items = c * bs + jnp.arange(bs, dtype=jnp.int32)
        live = items < n_items
        items_c = jnp.minimum(items, n_items - 1)
        dq, dk_c, dv_c, idc = jax.vmap(one)(items_c)
        zero = jnp.zeros((), cdt)
        dk_c = jnp.where(live[:, None, None, None], dk_c, zero)
        dv_c = jnp.where(live[:, None, None, None], dv_c, zero)
        b_i = (items_c // (Hq * Nq))[:, None]
        hk_i = ((items_c // Nq) % Hq // g)[:, None]
        dk_acc = dk_acc.at[b_i, hk_i, idc].add(dk_c)
        dv_acc = dv_acc.at[b_i, hk_i, idc].add(dv_c)
        return (dk_acc, dv_acc), dq

    init = (jnp.zeros((B, Hkv, Nkv, blk, D), cdt), jnp.zeros((B, Hkv, Nkv, blk, Dv), cdt))
    (dk, dv), dq = lax.scan(chunk, init, jnp.arange(n_chunks, dtype=jnp.int32))
    dq = dq.reshape(n_chunks * bs, blk, D)[:n_items]
    dq = dq.reshape(B, Hq, Nq * blk, D)[:, :, :Sq]
    dk = dk.reshape(B, Hkv, Nkv * blk, D)[:, :, :Skv]
    dv = dv.reshape(B, Hkv, Nkv * blk, Dv)[:, :, :Skv]
    return finish(dq, dk, dv)


# ----------------------------------------------------------------------------- jitted entry points
# Static options are compile keys of these wrappers, so eager calls compile once per
# (options, shapes) instead of dispatching op by op; inside an outer jit they inline.

_HSTU_STATIC = ("max_seqlen_q", "max_seqlen_k", "scaling_seqlen", "window_size", "alpha",
                "compute_dtype")
_BSA_STATIC = ("layout", "sparse_block_size", "softmax_scale", "compute_dtype", "pack_gqa",
               "causal")

_hstu_fwd_jit = jax.jit(_hstu_attention_ref_impl, static_argnames=_HSTU_STATIC + ("q_tile",))
_hstu_bwd_jit = jax.jit(_hstu_attention_bwd_ref_impl, static_argnames=_HSTU_STATIC)
_bsa_fwd_jit = jax.jit(_block_sparse_attention_ref_impl,
                       static_argnames=_BSA_STATIC + ("kv_splits",))
_bsa_bwd_jit = jax.jit(_block_sparse_attention_bwd_ref_impl, static_argnames=_BSA_STATIC)


def _static_float(x):
    return None if x is None else float(x)


def _static_dtype(x):
    return None if x is None else jnp.dtype(x)


def hstu_attention_ref(q, k, v, cu_seqlens_q, cu_seqlens_k, func=None, *, max_seqlen_q,
                       max_seqlen_k, scaling_seqlen=None, window_size=(-1, 0), alpha=1.0,
                       paged_kv=None, page_ids=None, page_indptrs=None, compute_dtype=None,
                       q_tile: int = 128, rab=None):
    return _hstu_fwd_jit(q, k, v, cu_seqlens_q, cu_seqlens_k, func, rab=rab,
                         max_seqlen_q=int(max_seqlen_q),
                         max_seqlen_k=int(max_seqlen_k), scaling_seqlen=_static_float(scaling_seqlen),
                         window_size=tuple(int(w) for w in window_size), alpha=float(alpha),
                         paged_kv=paged_kv, page_ids=page_ids, page_indptrs=page_indptrs,
                         compute_dtype=_static_dtype(compute_dtype), q_tile=int(q_tile))


def hstu_attention_bwd_ref(do, q, k, v, cu_seqlens_q, cu_seqlens_k, func=None, *, max_seqlen_q,
                           max_seqlen_k, scaling_seqlen=None, window_size=(-1, 0), alpha=1.0,
                           compute_dtype=None, rab=None):
    return _hstu_bwd_jit(do, q, k, v, cu_seqlens_q, cu_seqlens_k, func, rab=rab,
                         max_seqlen_q=int(max_seqlen_q), max_seqlen_k=int(max_seqlen_k),
                         scaling_seqlen=_static_float(scaling_seqlen),
                         window_size=tuple(int(w) for w in window_size), alpha=float(alpha),
                         compute_dtype=_static_dtype(compute_dtype))


def block_sparse_attention_ref(q, k, v, q2k_block_index, q2k_block_nums, block_sizes=None, *,
                               layout: str = "bhsd", sparse_block_size: int = 128,
                               softmax_scale=None, compute_dtype=None, kv_splits=1,
                               pack_gqa: bool = False, causal: bool = False):
    return _bsa_fwd_jit(q, k, v, q2k_block_index, q2k_block_nums, block_sizes, layout=layout,
                        sparse_block_size=int(sparse_block_size),
                        softmax_scale=_static_float(softmax_scale),
                        compute_dtype=_static_dtype(compute_dtype),
                        kv_splits=check_kv_splits(kv_splits, MAX_KV_SPLITS),
                        pack_gqa=bool(pack_gqa), causal=bool(causal))


def block_sparse_attention_bwd_ref(do, q, k, v, out, lse, q2k_block_index, q2k_block_nums,
                                   block_sizes=None, *, layout: str = "bhsd",
                                   sparse_block_size: int = 128, softmax_scale=None,
                                   compute_dtype=None, dlse=None, pack_gqa: bool = False,
                                   causal: bool = False):
    return _bsa_bwd_jit(do, q, k, v, out, lse, q2k_block_index, q2k_block_nums, block_sizes,
                        dlse=dlse,
                        layout=layout, sparse_block_size=int(sparse_block_size),
                        softmax_scale=_static_float(softmax_scale),
                        compute_dtype=_static_dtype(compute_dtype), pack_gqa=bool(pack_gqa),
                        causal=bool(causal))


hstu_attention_ref.__doc__ = _hstu_attention_ref_impl.__doc__
hstu_attention_bwd_ref.__doc__ = _hstu_attention_bwd_ref_impl.__doc__
block_sparse_attention_ref.__doc__ = _block_sparse_attention_ref_impl.__doc__
block_sparse_attention_bwd_ref.__doc__ = _block_sparse_attention_bwd_ref_impl.__doc__
