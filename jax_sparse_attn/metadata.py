"""Kernel-path metadata preparation: everything the kernels read besides q, k, v.

Tiny XLA computations on int32 metadata, shared by the ffi adapters, the reference and
:mod:`jax_sparse_attn.masks`:

* HSTU: the pseudo-sequence appended to ``cu_seqlens``, the forward / backward tile
  schedules (:func:`hstu_fwd_schedule`, :func:`hstu_bwd_schedule`), the per-tile
  summaries of a ``func`` mask and the runtime scalars;
* BSA: :func:`normalize_bsa_metadata` (the kernel-interface form of the metadata) and
  :func:`build_kq_csr` (the K->Q transposed block lists of the backward) and the
  deterministic backward's orders of them (:func:`kq_schedule_starts`,
  :func:`kq_schedule_order_reference`);
* head-dim padding (:func:`padded_head_dim`, :func:`pad_last`);
* memory safety whatever the metadata values (:func:`sanitize_cu_seqlens`,
  :func:`sanitize_bsa_metadata`): the kernels never read or write out of bounds, even
  for metadata the eager validators would reject (traced under ``jax.jit``).
"""

from __future__ import annotations

import functools
import numbers

import jax
import jax.numpy as jnp

_BIG = 1 << 30


def padded_head_dim(d: int, supported) -> int | None:
    """The smallest supported head dim >= ``d`` (None if there is none)."""
    return min((s for s in supported if s >= d), default=None)


def pad_last(x, to: int):
    """Zero-pad the last axis of ``x`` to ``to`` entries."""
    extra = to - x.shape[-1]
    if extra == 0:
        return x
    return jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, extra)])


# ----------------------------------------------------------------------------- HSTU


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


def hstu_fwd_schedule(cu_q, cu_k, func, block_m, t_q, window_size, tokens_per_chunk=0):
    """Per CTA row: ``[batch, m_block, lo, hi, f0]`` (batch -1: idle slot), longest work
    first (number of visible keys, stable argsort; docs/performance.md gives its worth).

    ``tokens_per_chunk > 0``: ordered by sequence chunk first (``min(cu_k[b] //
    tokens_per_chunk, 126)``: the sequences whose keys start in one chunk of that many keys),
    longest work first within a chunk, idle slots last, so the tiles that run at one time
    read the K / V of few sequences.
    """
    bm = block_m
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
    if tokens_per_chunk > 0:
        chunk = jnp.where(b >= 0, jnp.minimum(cu_k[bc] // tokens_per_chunk, 126), 127)
        order = jnp.lexsort((-work, chunk))  # stable; chunk is the primary key
    else:
        order = jnp.argsort(-work, stable=True)
    tiles = jnp.concatenate([b[:, None], m[:, None], summ], axis=1).astype(jnp.int32)
    return tiles[order]


def _segment_suffix_max(b, work):
    """``max(work[j] for j >= i with b[j] == b[i])`` for ``b`` grouped in runs (canonical
    tile order): a segmented scan from the end."""
    rb, rw = b[::-1], work[::-1]
    start = jnp.concatenate([jnp.ones((1,), bool), rb[1:] != rb[:-1]])

    def combine(x, y):
        return x[0] | y[0], jnp.where(y[0], y[1], jnp.maximum(x[1], y[1]))

    _, m = jax.lax.associative_scan(combine, (start, rw))
    return m[::-1]


def hstu_bwd_schedule(cu_q, cu_k, func, block_m, block_n, t_q, t_k, window_size=None,
                      deterministic=False, tokens_per_chunk=0):
    """KV tiles ``[batch, n_block]`` in canonical order (n ascending: under a causal /
    right-aligned mask the first KV tiles of a sequence see the most queries, so they
    start first), the canonical first q-tile index per batch, and the func summary.

    With ``window_size`` the KV tiles are ordered longest work first instead (number of
    query rows that can see the tile under the window, ``L_q`` with a func mask; stable
    argsort; idle slots last): the launch order of a non-persistent grid, so the heaviest
    CTAs start first whatever the sequence lengths.

    ``deterministic`` (with ``window_size``): the sort key of a KV tile is the largest work
    of it and the later KV tiles of its sequence, so every sequence's KV tiles launch in
    ascending order (the ordered dq additions of the deterministic backward wait only for
    the previous KV tile: it must have a lower linear block index); for a causal or full
    mask this is the plain longest-first order.

    ``tokens_per_chunk > 0`` (with ``window_size``): ordered by sequence chunk first
    (``min(cu_q[b] // tokens_per_chunk, 126)``: the sequences whose queries start in one
    chunk of that many rows), then as above within a chunk, idle slots last, so the KV tiles
    that run at one time stream the Q, dO and dq rows of few sequences."""
    bm, bn = block_m, block_n
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
    if window_size is not None:
        left, right = (-1, -1) if func is not None else window_size
        bc = jnp.maximum(b, 0)
        lq = (cu_q[1:] - cu_q[:-1])[bc]
        lk = (cu_k[1:] - cu_k[:-1])[bc]
        off = lk - lq
        n0 = n * bn
        n1 = jnp.minimum(n0 + bn, lk)
        i_lo = jnp.maximum(n0 - right - off, 0) if right >= 0 else jnp.zeros_like(n0)
        i_hi = jnp.minimum(n1 + left - off, lq) if left >= 0 else lq
        work = jnp.where(b >= 0, jnp.maximum(i_hi - i_lo, 0) + 1, -1)
        if deterministic:
            work = _segment_suffix_max(b, work)
        if tokens_per_chunk > 0:
            chunk = jnp.where(b >= 0, jnp.minimum(cu_q[bc] // tokens_per_chunk, 126), 127)
            kv_tiles = kv_tiles[jnp.lexsort((-work, chunk))]  # stable; chunk first
        else:
            kv_tiles = kv_tiles[jnp.argsort(-work, stable=True)]
    return kv_tiles, q_start.astype(jnp.int32), q_tiles


def sanitize_cu_seqlens(cu, total: int):
    """``cu_seqlens`` with its first entry set to 0, clamped to ``[0, total]`` and made
    non-decreasing (running max), so every sequence ``[cu[b], cu[b+1])`` lies inside the
    ``total`` packed rows and the rows before ``cu[-1]`` all belong to a sequence (the
    kernels write every one of them), whatever the input values. Valid ``cu_seqlens``
    (``cu[0] == 0``, non-decreasing, ``cu[-1] <= total``) pass unchanged."""
    cu = jnp.clip(cu.astype(jnp.int32), 0, total).at[0].set(0)
    return jax.lax.cummax(cu, axis=0)


def append_pseudo_sequence(cu, total):
    """``cu`` plus one pseudo-sequence ending at ``total`` (None: an empty one), so that
    the kernels cover (and write zeros to) the rows past ``cu[-1]``."""
    cu = cu.astype(jnp.int32)
    last = cu[-1:] if total is None else jnp.full((1,), total, jnp.int32)
    return jnp.concatenate([cu, last])


def hstu_scalars(alpha, scaling_seqlen, window_size):
    """The runtime scalars of the HSTU kernels: float32 ``[alpha / 2, 1 / scaling_seqlen]``
    (SiLU(x) = x/2 * (1 + tanh(x/2))) and int32 ``[left, right]``."""
    scal = jnp.asarray([alpha * 0.5, 1.0 / scaling_seqlen], jnp.float32)
    win = jnp.asarray([int(window_size[0]), int(window_size[1])], jnp.int32)
    return scal, win


# ----------------------------------------------------------------------------- BSA

#: SM count assumed where no GPU is visible (CPU lowering): an H100/H200 SXM
DEFAULT_NUM_SMS = 132


def gpu_num_sms() -> int | None:
    """SM count of the first visible GPU, or None when no GPU is visible (or it does not
    say)."""
    try:
        gpus = jax.devices("gpu")
    except RuntimeError:
        gpus = []
    n = getattr(gpus[0], "core_count", 0) if gpus else 0
    return int(n) if n else None


def num_sms() -> int:
    """SM count of the first GPU (:data:`DEFAULT_NUM_SMS` when none is visible)."""
    n = gpu_num_sms()
    return DEFAULT_NUM_SMS if n is None else n


def auto_kv_splits(num_rows: int, k_max: int, sms: int | None = None) -> int:
    """``kv_splits="auto"``: the number of splits of each row's block list that makes the
    ``num_rows`` metadata rows (``B * H_q * N_q``; ``B * H_kv * N_qp`` with ``pack_gqa``)
    times the splits fill one wave of ``sms`` SMs (default :func:`num_sms`):
    ``floor(sms / num_rows)`` clamped to ``[1, min(k_max, 256)]`` (more splits than
    listed blocks would only add empty splits). A symbolic ``num_rows`` (``jax.export`` with
    a symbolic batch) gives 1: the rows are not known when the split count is fixed."""
    if not isinstance(num_rows, numbers.Integral):
        return 1
    sms = num_sms() if sms is None else int(sms)
    return max(1, min(sms // max(int(num_rows), 1), int(k_max), 256))


def kv_split_ids(num_listed, k_max: int, kv_splits: int):
    """Split of each list entry ``t < k_max`` of rows with ``num_listed`` active entries
    (any int array shape ``R``): ``t // c`` with ``c = max(1, ceil(n / kv_splits))`` (the
    active prefix cut into ``kv_splits`` contiguous chunks; entries past it get the split
    of their position but are inactive). Returns int32 ``R + (k_max,)``."""
    n = jnp.clip(jnp.asarray(num_listed, jnp.int32), 0, k_max)
    c = jnp.maximum((n + kv_splits - 1) // kv_splits, 1)
    t = jnp.arange(k_max, dtype=jnp.int32)
    return jnp.minimum(t // c[..., None], kv_splits - 1).astype(jnp.int32)


def normalize_bsa_metadata(q2k_block_index, block_sparse_num=None, block_sizes=None,
                           q2k_block_nums=None):
    """Normalise BSA metadata to the kernel-interface form (docs/design.md).

    Returns ``(q2k_block_index int32 (B, H_q, N_q, K_max), q2k_block_nums int32
    (B, H_q, N_q), block_sizes None | int32 (B, H_q, N_kv))``. A fixed
    ``block_sparse_num`` becomes a filled counts array; ``block_sizes`` of rank 1
    ``(N_kv,)`` or 2 ``(B, N_kv)`` is broadcast to rank 3. No checks are made here.
    """
    idx = jnp.asarray(q2k_block_index).astype(jnp.int32)
    B, Hq, Nq, _ = idx.shape
    if q2k_block_nums is not None:
        nums = jnp.asarray(q2k_block_nums).astype(jnp.int32)
    else:
        nums = jnp.full((B, Hq, Nq), block_sparse_num, jnp.int32)
    sizes = None
    if block_sizes is not None:
        bs = jnp.asarray(block_sizes).astype(jnp.int32)
        if bs.ndim == 1:
            sizes = jnp.broadcast_to(bs[None, None, :], (B, Hq, bs.shape[0]))
        elif bs.ndim == 2:
            sizes = jnp.broadcast_to(bs[:, None, :], (B, Hq, bs.shape[1]))
        else:
            sizes = bs
    return idx, nums, sizes


def sanitize_bsa_metadata(q2k_block_index, q2k_block_nums, block_sizes, *, num_kv_blocks: int,
                          block_size: int):
    """Normalised BSA metadata clamped to what the kernels can address: block ids to
    ``[0, N_kv)``, counts to ``[0, K_max]``, block sizes to ``[0, block_size]``. Valid
    metadata pass unchanged; any other value gives the same result as the reference
    (which clips ids and treats counts/sizes outside the range as these bounds)."""
    k_max = q2k_block_index.shape[-1]
    idx = jnp.clip(q2k_block_index, 0, max(num_kv_blocks - 1, 0))
    nums = jnp.clip(q2k_block_nums, 0, k_max)
    sizes = None if block_sizes is None else jnp.clip(block_sizes, 0, block_size)
    return idx, nums, sizes


# the dense (bitmap) K->Q construction is used up to this many (query block, KV block) pairs
# B * H_q * N_q * N_kv (its temporaries take about 16 bytes per pair: 64 MiB here); above
# it, a stable sort (argsort) builds the lists in memory linear in the number of entries
_DENSE_CSR_MAX_ELEMS = 1 << 22


def build_kq_csr(q2k_block_index, q2k_block_nums, *, num_kv_heads: int, num_kv_blocks: int,
                 with_ranks: bool = False, rank_group: int = 0):
    """K->Q transposed block lists (CSR) from the Q->K metadata, on the device.

    Returns ``(offsets, entries)``: ``offsets`` int32 ``(B*H_kv*N_kv + 1,)``; the entries of
    KV block n of KV head g in batch b are ``entries[offsets[r]:offsets[r+1]]`` with
    ``r = (b*H_kv + g)*N_kv + n``, each ``h_in_group*N_q + m`` (query head ``g*G + h_in_group``,
    query block m), in increasing order. Only the active prefix of each row is used.
    ``entries`` has ``B*H_q*N_q*K_max`` slots; those past ``offsets[-1]`` are unused.

    ``with_ranks``: also return ``ranks`` (int32, like ``entries``): the rank of each entry
    among the entries of its query row ``(b, h, m)``, ``0 .. count - 1`` over the row's
    entries: the order in which a deterministic backward adds the row's dQ contributions
    (each KV block's CTA waits for ``rank`` earlier ones). ``rank_group = 0``: ascending KV
    block order. ``rank_group = G > 0``: ascending ``(r // G, p, n)`` with ``r`` the entry's
    CSR row (the linear index of its CTA) and ``p`` its position in that row, so within a
    group of ``G`` consecutive CTAs a query row's contributions come in the order in which
    the CTAs reach it (each walks its row in order), and groups come in launch order.

    Active ids outside ``[0, num_kv_blocks)`` are skipped. Two constructions with
    identical results for unique active ids per row: for up to ``2**22`` (query block, KV
    block) pairs a dense bitmap (one scatter, packed into 32-bit words whose popcounts give
    the row lengths and each listed slot's place, one scatter of the listed slots; about a
    byte of temporaries per pair; with ``with_ranks`` the unpacked bitmap, about 16 bytes per
    pair), beyond that a stable argsort of the entries by KV block (memory linear in the
    number of entries).
    """
    b, h_q, n_q, k_max = q2k_block_index.shape
    group = h_q // num_kv_heads
    j = jnp.arange(k_max, dtype=jnp.int32)
    active = ((j[None, None, None, :] < q2k_block_nums[..., None]) & (q2k_block_index >= 0)
              & (q2k_block_index < num_kv_blocks))
    if b * h_q * n_q * num_kv_blocks <= _DENSE_CSR_MAX_ELEMS:
        if not with_ranks:
            return _kq_csr_packed_rows(q2k_block_index, active, group, num_kv_heads,
                                       num_kv_blocks)
        return _kq_csr_dense(q2k_block_index, active, group, num_kv_heads, num_kv_blocks,
                             with_ranks, rank_group)
    n_rows = b * num_kv_heads * num_kv_blocks
    bi = jnp.arange(b, dtype=jnp.int32)[:, None, None, None]
    hi = jnp.arange(h_q, dtype=jnp.int32)[None, :, None, None]
    mi = jnp.arange(n_q, dtype=jnp.int32)[None, None, :, None]
    key = (bi * num_kv_heads + hi // group) * num_kv_blocks + q2k_block_index
    key = jnp.where(active, key, n_rows).reshape(-1)
    val = jnp.broadcast_to((hi % group) * n_q + mi, q2k_block_index.shape).reshape(-1)
    perm = jnp.argsort(key, stable=True)
    entries = val[perm].astype(jnp.int32)
    counts = jnp.zeros((n_rows + 1,), jnp.int32).at[key].add(1)
    offsets = jnp.concatenate([jnp.zeros((1,), jnp.int32), jnp.cumsum(counts[:n_rows], dtype=jnp.int32)])
    if not with_ranks:
        return offsets, entries
    # rank within the query row: position in the row's stable sort by KV block id (repeated
    # ids are separate entries here, with consecutive ranks), or by (CTA group, position in
    # the CSR row, id)
    big = jnp.iinfo(jnp.int32).max
    keys = [jnp.where(active, q2k_block_index, big)]
    if rank_group:
        slot = jnp.zeros_like(perm).at[perm].set(jnp.arange(perm.shape[0], dtype=perm.dtype))
        row = jnp.minimum(key, n_rows - 1)
        p = (slot - offsets[row]).reshape(q2k_block_index.shape)
        keys += [jnp.where(active, p, big),
                 jnp.where(active, (row // rank_group).reshape(q2k_block_index.shape), big)]
    ranks = _ranks_along_last(keys).reshape(-1)[perm]
    return offsets, entries, ranks


def kq_lpt_order(offsets, chain=None):
    """The K->Q CSR rows (KV blocks) longest list first: int32 ``(R,)`` for the ``R + 1``
    ``offsets`` of :func:`build_kq_csr`, ties in row order (a stable sort). A backward
    that walks its CTAs in this order starts the longest lists first and ends with the
    shortest (longest-processing-time-first scheduling). With ``chain`` (an int, the rows
    of one (batch, KV head): its KV blocks) the rows stay grouped by chain, chains in order,
    and are sorted longest first within each chain, so the CTAs running at one time read
    the Q / dO of few heads."""
    counts = offsets[1:] - offsets[:-1]
    if chain is None:
        return jnp.argsort(-counts, stable=True).astype(jnp.int32)
    n_rows = counts.shape[0]
    ok = isinstance(chain, numbers.Integral) and not isinstance(chain, bool)
    if not ok or chain < 1 or n_rows % chain:
        raise ValueError(f"kq_lpt_order: chain must be a positive int dividing the "
                         f"{n_rows} rows; got {chain!r}")
    chain = int(chain)
    # one stable sort per chain (ties in row order), then each chain's first row added
    local = jnp.argsort(-counts.reshape(n_rows // chain, chain), axis=-1, stable=True)
    base = jnp.arange(0, n_rows, chain, dtype=local.dtype)[:, None]
    return (local + base).reshape(-1).astype(jnp.int32)


#: the fields of one work item of :func:`kq_bucket_items`
KQ_ITEM_FIELDS = ("row", "begin", "count", "slot", "first_slot", "buckets")


def kq_bucket_items(offsets, *, num_kv_blocks: int, bucket_entries: int, max_extra: int):
    """Work items of a backward whose long K->Q lists are split across CTAs in buckets.

    ``offsets``: the ``R + 1`` offsets of :func:`build_kq_csr`, ``R = P * num_kv_blocks``
    rows in chains of ``num_kv_blocks`` (one chain per (batch, KV head) pair). A row of
    ``L > bucket_entries`` entries becomes ``n = ceil(L / bucket_entries)`` buckets of
    ``L // n`` consecutive entries, the first ``L % n`` of them one more; a row of at most
    ``bucket_entries`` entries (an empty one too) stays one item. A pair whose rows would
    need more than ``max_extra`` extra items is not split at all (every row one item), so
    no entry is ever dropped; callers take ``max_extra`` from the lists' static shape (a
    pair's entries divided by ``bucket_entries`` always suffices). The ``n`` buckets of a
    split row write float32 dK / dV partials to consecutive workspace slots ``first_slot ..
    first_slot + n - 1`` in the pair's own range ``[2 p max_extra, 2 (p + 1) max_extra)``,
    so that the last of them to finish can add the ``n`` partials in bucket order (bitwise
    the same dK / dV whichever finishes last).

    Returns int32 ``(P, num_kv_blocks + max_extra, 6)``: per pair its items longest first
    (ties in row, then bucket order), then unused items; fields :data:`KQ_ITEM_FIELDS`:
    ``row`` (the CSR row, -1 for an unused item), ``begin`` (the first entry), ``count``
    (entries), ``slot`` (this bucket's workspace slot, -1 where the row is not split),
    ``first_slot`` (the row's first slot, -1 likewise) and ``buckets`` (``n``; 1 where not
    split, 0 for an unused item).

    Raises ValueError when ``num_kv_blocks`` or ``bucket_entries`` is below 1 or above
    2^31 - 1, ``max_extra`` below 0 or above that, or ``R`` not a multiple of
    ``num_kv_blocks``."""
    n_rows = offsets.shape[0] - 1
    for name, val, low in (("num_kv_blocks", num_kv_blocks, 1),
                           ("bucket_entries", bucket_entries, 1), ("max_extra", max_extra, 0)):
        if (not isinstance(val, numbers.Integral) or isinstance(val, bool) or val < low
                or val > 2**31 - 1):
            raise ValueError(f"kq_bucket_items: {name} must be an int in [{low}, 2^31 - 1]; "
                             f"got {val!r}")
    if n_rows % num_kv_blocks:
        raise ValueError(f"kq_bucket_items: the {n_rows} CSR rows must be a multiple of "
                         f"num_kv_blocks={num_kv_blocks}")
    n_kv, n_items, extra = int(num_kv_blocks), int(num_kv_blocks) + int(max_extra), int(max_extra)
    n_pairs = n_rows // n_kv
    i32 = jnp.int32
    offsets = offsets.astype(i32)
    counts = (offsets[1:] - offsets[:-1]).reshape(n_pairs, n_kv)
    nb = jnp.where(counts > bucket_entries, -(-counts // bucket_entries), 1)
    # a pair needing more extra items than the grid holds keeps every row whole
    nb = jnp.where(jnp.sum(nb - 1, axis=1, keepdims=True) > extra, 1, nb)
    # the items of each pair in row order: item i is bucket i - start[r] of the row r whose
    # [start[r], start[r] + nb[r]) holds i, r the number of rows after the first that start
    # at or before i (every row has at least one item, so the starts are distinct; one
    # scatter and a cumulative sum rather than a binary search, which XLA runs as a loop of
    # small kernels); items from the pair's last end on are unused
    ends = jnp.cumsum(nb, axis=1)
    item = jnp.arange(n_items, dtype=i32)
    starts = ends - nb
    marks = jnp.zeros((n_pairs, n_items), i32).at[
        jnp.arange(n_pairs)[:, None], starts].add(
        (jnp.arange(n_kv) > 0).astype(i32)[None, :], mode="drop")
    r_loc = jnp.cumsum(marks, axis=1).astype(i32)
    used = item[None, :] < ends[:, -1:]
    n = jnp.take_along_axis(nb, r_loc, axis=1)
    bucket = item[None, :] - (jnp.take_along_axis(ends, r_loc, axis=1) - n)
    row = r_loc + (jnp.arange(n_pairs, dtype=i32) * n_kv)[:, None]
    length = jnp.take_along_axis(counts, r_loc, axis=1)
    # (no products beyond the row's length: int32 throughout)
    q, rem = length // n, length % n
    lo = offsets[row] + bucket * q + jnp.minimum(bucket, rem)
    cnt = q + (bucket < rem).astype(i32)
    # split rows' first slots: the pair's base plus an exclusive prefix sum of the bucket
    # counts of its split rows
    sizes = jnp.where(nb > 1, nb, 0)
    first_loc = jnp.cumsum(sizes, axis=1) - sizes
    first = (jnp.take_along_axis(first_loc, r_loc, axis=1)
             + (jnp.arange(n_pairs, dtype=i32) * 2 * extra)[:, None])
    split = used & (n > 1)
    fields = jnp.stack([
        jnp.where(used, row, -1), jnp.where(used, lo, 0), jnp.where(used, cnt, 0),
        jnp.where(split, first + bucket, -1), jnp.where(split, first, -1),
        jnp.where(used, n, 0)], axis=-1).astype(i32)
    # longest first within each pair (a stable sort: ties in row, then bucket order), unused
    # items last
    order = jnp.argsort(jnp.where(used, -cnt, 1), axis=1, stable=True)
    return jnp.take_along_axis(fields, order[..., None], axis=1)


def kq_bucket_items_reference(offsets, *, num_kv_blocks: int, bucket_entries: int,
                              max_extra: int):
    """:func:`kq_bucket_items` in numpy loops (its definition, for tests)."""
    import numpy as np  # noqa: PLC0415

    offsets = np.asarray(offsets, np.int64)
    n_kv, n_items = num_kv_blocks, num_kv_blocks + max_extra
    n_pairs = (offsets.shape[0] - 1) // n_kv
    out = np.zeros((n_pairs, n_items, 6), np.int32)
    for p in range(n_pairs):
        rows = range(p * n_kv, (p + 1) * n_kv)
        lens = {r: int(offsets[r + 1] - offsets[r]) for r in rows}
        nbs = {r: -(-lens[r] // bucket_entries) if lens[r] > bucket_entries else 1 for r in rows}
        if sum(v - 1 for v in nbs.values()) > max_extra:
            nbs = dict.fromkeys(rows, 1)
        items, slot = [], 2 * p * max_extra
        for r in rows:
            n, length = nbs[r], lens[r]
            q, rem = divmod(length, n)
            for b in range(n):
                lo = offsets[r] + b * q + min(b, rem)
                items.append((r, lo, q + (b < rem), slot + b if n > 1 else -1,
                              slot if n > 1 else -1, n))
            slot += n if n > 1 else 0
        items.sort(key=lambda it: -it[2])  # stable
        items += [(-1, 0, 0, -1, -1, 0)] * (n_items - len(items))
        out[p] = np.asarray(items, np.int32)
    return out


def kq_schedule_starts(offsets, *, num_kv_blocks: int, held: int):
    """Estimated start of each K->Q CSR row's CTA, in entries (steps), relative to its
    chain: int32 ``(R,)`` for the ``R + 1`` ``offsets`` of :func:`build_kq_csr`.

    The rows are launched in order (row ``r``: KV block ``r % num_kv_blocks`` of chain
    ``r // num_kv_blocks``, a chain being one (batch, KV head)) onto ``held`` CTA slots,
    each taking one step per entry. A fluid estimate: the first ``held`` rows start at 0;
    when row ``r`` starts, the entries of the rows before it (prefix sum ``P_r``) are the
    work done on ``held`` busy slots plus what the ``held - 1`` other running rows have
    left, about half a mean row each, so ``start_r = (P_r - (held - 1) L / 2) / held``
    (``L`` the mean entries per row; integer arithmetic, rounded down), at least 0; then the
    chain's smallest start is subtracted. Why this estimate rather than a per-slot one:
    docs/performance.md, "Deterministic block-sparse backward: why the CTAs wait". The input
    of :func:`kq_schedule_order_reference` and of the kernel that computes the same order.

    Raises ValueError when ``held`` or ``num_kv_blocks`` is below 1 or ``R`` is not a
    multiple of ``num_kv_blocks``."""
    n_rows = offsets.shape[0] - 1
    if held < 1 or num_kv_blocks < 1 or n_rows % num_kv_blocks:
        raise ValueError(f"kq_schedule_starts: held={held} and num_kv_blocks={num_kv_blocks} "
                         f"must be >= 1, and the {n_rows} CSR rows a multiple of num_kv_blocks")
    prefix = offsets[:-1].astype(jnp.int32) - offsets[0].astype(jnp.int32)
    # integer arithmetic (the same result on every backend): (held - 1) L / 2 with twice
    # the mean rounded down, L2 = 2 sum / R
    mean2 = (2 * (offsets[-1] - offsets[0]).astype(jnp.int32)) // max(n_rows, 1)
    start = jnp.maximum(prefix - ((held - 1) * mean2) // 4, 0) // held
    start = jnp.where(jnp.arange(n_rows) < held, 0, start).reshape(-1, num_kv_blocks)
    return (start - start.min(axis=1, keepdims=True)).reshape(-1).astype(jnp.int32)


def kq_schedule_order_reference(offsets, entries, starts, *, num_kv_blocks: int, window: int,
                                subrounds: int = 4):
    """The deterministic backward's schedule order of the K->Q lists (numpy; the definition
    that the GPU kernel ``kernels/bsa_det_order.py`` computes bit for bit).

    Returns ``(entries, ranks)`` like :func:`build_kq_csr`'s, over the active slots
    ``[0, offsets[-1])``: each CSR row's entries reordered into the order its CTA walks them,
    and each entry's rank among the contributions to its query tile. Within each chain
    (``num_kv_blocks`` consecutive rows: one batch and KV head, whose rows share the query
    tiles ``entries`` name) the entries are coloured in rounds ``t = 0, 1, ...``, a greedy
    bipartite edge colouring done in parallel: in round ``t`` a row is active when it has
    uncoloured entries, ``t >= starts[row]`` (:func:`kq_schedule_starts`) and, for the
    chain's row ``n >= window``, its rows ``<= n - window`` have all finished in rounds
    before ``t``. In up to ``subrounds`` sub-rounds each active row that has not coloured an
    entry in this round proposes its first uncoloured entry (in ``entries`` order) whose query
    tile no row has taken in this round; a tile goes to the lowest proposing row, which
    colours that entry ``t``: it becomes the row's next entry and takes the tile's next
    rank. A row therefore walks its entries in increasing colour and a tile's contributions
    come in increasing colour.

    Why it cannot deadlock (rows launched in order, at least ``window`` CTAs resident at
    once; colours of later chains read as offset past every colour of earlier ones): every
    colour of row ``r + window`` or later is above every colour of row ``r``; at a deadlock
    the blocked CTA with the lowest current colour waits for a smaller colour, so for a row
    that is not resident (a resident one would be at a smaller colour still), so at least
    ``window`` rows past the lowest unfinished one: a contradiction with the first point.

    Raises ValueError when ``num_kv_blocks``, ``window`` or ``subrounds`` is below 1 (a
    window of 0 would never let a row start)."""
    import numpy as np  # noqa: PLC0415

    if min(num_kv_blocks, window, subrounds) < 1:
        raise ValueError(f"kq_schedule_order_reference: num_kv_blocks={num_kv_blocks}, "
                         f"window={window}, subrounds={subrounds} must be >= 1")

    offsets, entries, starts = (np.asarray(x) for x in (offsets, entries, starts))
    out_e, out_r = entries.copy(), np.zeros_like(entries)
    n_rows = len(offsets) - 1
    for c0 in range(0, n_rows, num_kv_blocks):
        n_kv = min(num_kv_blocks, n_rows - c0)
        lo, deg = offsets[c0:c0 + n_kv], offsets[c0 + 1:c0 + n_kv + 1] - offsets[c0:c0 + n_kv]
        done = [np.zeros(int(d), bool) for d in deg]
        k = np.zeros(n_kv, np.int64)
        fin_round = np.where(deg == 0, -1, np.iinfo(np.int64).max)
        tile_round, tile_cnt = {}, {}
        left, t, fin = int(deg.sum()), 0, 0
        while left > 0:
            while fin < n_kv and fin_round[fin] < t:
                fin += 1
            active = [n for n in range(n_kv) if k[n] < deg[n] and t >= starts[c0 + n]
                      and (n < window or fin >= n - window + 1)]
            ptr, got = dict.fromkeys(active, 0), set()
            for _ in range(subrounds):
                cand, prop = {}, {}
                for n in active:
                    if n in got:
                        continue
                    p = ptr[n]
                    while p < deg[n] and (done[n][p]
                                          or tile_round.get(int(entries[lo[n] + p])) == t):
                        p += 1
                    ptr[n] = p
                    if p < deg[n]:
                        tl = int(entries[lo[n] + p])
                        cand[n] = p
                        prop[tl] = min(prop.get(tl, n), n)
                if not cand:
                    break
                for n, p in cand.items():
                    tl = int(entries[lo[n] + p])
                    if prop[tl] != n:
                        ptr[n] = p + 1
                        continue
                    tile_round[tl] = t
                    out_e[lo[n] + k[n]] = tl
                    out_r[lo[n] + k[n]] = tile_cnt.get(tl, 0)
                    tile_cnt[tl] = tile_cnt.get(tl, 0) + 1
                    k[n] += 1
                    done[n][p] = True
                    got.add(n)
                    left -= 1
                    if k[n] == deg[n]:
                        fin_round[n] = t
            t += 1
    end = int(offsets[-1])
    return out_e[:end], out_r[:end]


def _ranks_along_last(keys):
    """Rank of each element along the last axis in the lexicographic order of ``keys``
    (last key most significant, ties in index order): stable sorts from the least
    significant key up, then the inverse permutation."""
    order = None
    for k in keys:
        kk = k if order is None else jnp.take_along_axis(k, order, axis=-1)
        o = jnp.argsort(kk, axis=-1, stable=True)
        order = o if order is None else jnp.take_along_axis(order, o, axis=-1)
    return jnp.argsort(order, axis=-1, stable=True).astype(jnp.int32)


def _offsets_of(counts):
    """CSR offsets ``(R + 1,)`` int32 of the row lengths ``counts`` ``(R,)``."""
    return jnp.concatenate([jnp.zeros((1,), jnp.int32), jnp.cumsum(counts, dtype=jnp.int32)])


def _kq_rows_cols(q2k_block_index, active, group, num_kv_heads, num_kv_blocks):
    """Each list slot's CSR row ``(b, g, n)`` (``R`` = ``n_rows`` for an inactive slot) and
    column ``h_in_group * n_q + m``: ``(n_rows, width, n_slots, row, col)``, ``row`` / ``col``
    int32 of ``q2k_block_index``'s shape."""
    b, h_q, n_q, k_max = q2k_block_index.shape
    n_rows = b * num_kv_heads * num_kv_blocks
    bi = jnp.arange(b, dtype=jnp.int32)[:, None, None, None]
    hi = jnp.arange(h_q, dtype=jnp.int32)[None, :, None, None]
    mi = jnp.arange(n_q, dtype=jnp.int32)[None, None, :, None]
    row = jnp.where(active, (bi * num_kv_heads + hi // group) * num_kv_blocks + q2k_block_index,
                    n_rows)
    col = jnp.broadcast_to((hi % group) * n_q + mi, q2k_block_index.shape)
    return n_rows, group * n_q, b * h_q * n_q * k_max, row, col


def _kq_csr_dense_rows(q2k_block_index, active, group, num_kv_heads, num_kv_blocks):
    """:func:`build_kq_csr`'s ``(offsets, entries)`` through a bitmap scattered directly in
    the CSR rows' order: row ``(b, g, n)``, column ``h_in_group * n_q + m`` (no transpose);
    inactive slots go to one extra row that is dropped. Each row's running count gives its
    entries' places and, at its end, the row's length. (``_kq_csr_packed_rows`` builds the
    same lists; this one is kept for ``scripts/kq_csr_ab.py``.)"""
    n_rows, width, n_slots, row, col = _kq_rows_cols(q2k_block_index, active, group,
                                                     num_kv_heads, num_kv_blocks)
    sel = jnp.zeros((n_rows + 1, width), jnp.int32).at[row, col].set(1)[:n_rows]
    cum = jnp.cumsum(sel, axis=-1, dtype=jnp.int32)
    counts = cum[:, -1] if width else jnp.zeros((n_rows,), jnp.int32)
    offsets = _offsets_of(counts)
    pos = jnp.where(sel > 0, offsets[:-1, None] + cum - 1, n_slots)
    vals = jnp.broadcast_to(jnp.arange(width, dtype=jnp.int32), sel.shape)
    entries = jnp.zeros((n_slots,), jnp.int32).at[pos.reshape(-1)].set(vals.reshape(-1),
                                                                       mode="drop")
    return offsets, entries


def _kq_csr_packed_rows(q2k_block_index, active, group, num_kv_heads, num_kv_blocks):
    """:func:`build_kq_csr`'s ``(offsets, entries)`` through a bitmap in the CSR rows' order
    (row ``(b, g, n)``, column ``h_in_group * n_q + m``; inactive slots go to one extra row
    that is dropped) packed into 32-bit words: a row's length is the popcount of its words,
    and each listed slot's place in its row is the popcount of the row's bits below its
    column, computed for the listed slots only (no running count over the whole bitmap)."""
    n_rows, width, n_slots, row, col = _kq_rows_cols(q2k_block_index, active, group,
                                                     num_kv_heads, num_kv_blocks)
    n_words = -(-width // 32)
    # a repeated (row, column) sets its bit once
    bits = jnp.zeros((n_rows + 1, n_words * 32), jnp.uint8).at[row, col].set(1)
    words = jnp.sum(bits.reshape(n_rows + 1, n_words, 32).astype(jnp.uint32)
                    << jnp.arange(32, dtype=jnp.uint32), axis=-1, dtype=jnp.uint32)
    pop = jax.lax.population_count(words).astype(jnp.int32)  # (R + 1, words)
    counts = jnp.sum(pop[:n_rows], axis=-1, dtype=jnp.int32)
    offsets = _offsets_of(counts)
    # each slot's place: its row's start, the set bits of the words before its word and of
    # its word below its bit
    before = jnp.cumsum(pop, axis=-1, dtype=jnp.int32) - pop
    w = col // 32
    below = (jnp.uint32(1) << (col % 32).astype(jnp.uint32)) - jnp.uint32(1)
    rank = before[row, w] + jax.lax.population_count(words[row, w] & below).astype(jnp.int32)
    start = jnp.concatenate([offsets[:-1], jnp.full((1,), n_slots, jnp.int32)])
    pos = jnp.where(active, start[row] + rank, n_slots)
    entries = jnp.zeros((n_slots,), jnp.int32).at[pos.reshape(-1)].set(col.reshape(-1),
                                                                       mode="drop")
    return offsets, entries


def _kq_csr_dense(q2k_block_index, active, group, num_kv_heads, num_kv_blocks, with_ranks,
                  rank_group=0):
    """:func:`build_kq_csr` through a (KV block) x (query head in group, query block) bitmap."""
    b, h_q, n_q, k_max = q2k_block_index.shape
    # selected[b, h, m, n] = 1 if query block m of head h lists KV block n (inactive slots
    # land in the dropped column num_kv_blocks)
    tgt = jnp.where(active, q2k_block_index, num_kv_blocks)
    bi = jnp.arange(b)[:, None, None, None]
    hi = jnp.arange(h_q)[None, :, None, None]
    mi = jnp.arange(n_q)[None, None, :, None]
    sel = jnp.zeros((b, h_q, n_q, num_kv_blocks + 1), jnp.int32).at[bi, hi, mi, tgt].set(1)
    sel = sel[..., :num_kv_blocks]
    # rows (b, g, n), columns h_in_group * n_q + m: the entry value, in increasing order
    rows = sel.reshape(b, num_kv_heads, group, n_q, num_kv_blocks).transpose(0, 1, 4, 2, 3)
    rows = rows.reshape(b * num_kv_heads * num_kv_blocks, group * n_q)
    offsets = jnp.concatenate([jnp.zeros((1,), jnp.int32), jnp.cumsum(rows.sum(-1), dtype=jnp.int32)])
    pos = offsets[:-1, None] + jnp.cumsum(rows, axis=-1, dtype=jnp.int32) - 1
    n_slots = b * h_q * n_q * k_max
    pos = jnp.where(rows > 0, pos, n_slots)  # unselected: out of range, dropped
    vals = jnp.broadcast_to(jnp.arange(group * n_q, dtype=jnp.int32), rows.shape)
    entries = jnp.zeros((n_slots,), jnp.int32).at[pos.reshape(-1)].set(vals.reshape(-1), mode="drop")
    if not with_ranks:
        return offsets, entries
    # rank within the query row: selected KV blocks before this one (repeated ids were
    # merged), or by (CTA group, position in the CSR row, id)
    if rank_group:
        big = jnp.iinfo(jnp.int32).max
        p = pos - offsets[:-1, None]  # (CSR row, h_in_group * n_q + m)
        p = p.reshape(b, num_kv_heads, num_kv_blocks, group, n_q).transpose(0, 1, 3, 4, 2)
        p = p.reshape(b, h_q, n_q, num_kv_blocks)
        r = ((jnp.arange(b)[:, None] * num_kv_heads + jnp.arange(h_q)[None, :] // group)[..., None]
             * num_kv_blocks + jnp.arange(num_kv_blocks)[None, None, :])  # (b, h_q, n_kv)
        gkey = jnp.broadcast_to((r // rank_group)[:, :, None, :], sel.shape)
        on = sel > 0
        rank = _ranks_along_last([jnp.where(on, jnp.arange(num_kv_blocks), big),
                                  jnp.where(on, p, big), jnp.where(on, gkey, big)])
    else:
        rank = jnp.cumsum(sel, axis=-1, dtype=jnp.int32) - 1
    rank = rank.reshape(b, num_kv_heads, group, n_q, num_kv_blocks).transpose(0, 1, 4, 2, 3)
    rank = rank.reshape(rows.shape)
    ranks = jnp.zeros((n_slots,), jnp.int32).at[pos.reshape(-1)].set(rank.reshape(-1), mode="drop")
    return offsets, entries, ranks
