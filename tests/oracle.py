"""Independent float64 NumPy oracle written with explicit loops.

Shares no code with ``jax_sparse_attn.reference``: it re-derives every rule from the
issue text (bottom-right aligned windows, func intervals, paged KV, BSA block lists).
Loops run over sequences, heads and query rows; the key rule is evaluated per key.
"""

from __future__ import annotations

import math

import numpy as np


def x64():
    """Context manager enabling float64 in JAX (jax.enable_x64 or the experimental one)."""
    import jax  # noqa: PLC0415

    if hasattr(jax, "enable_x64"):
        return jax.enable_x64(True)
    from jax.experimental import enable_x64  # noqa: PLC0415

    return enable_x64()


def f64(x):
    return np.asarray(x, dtype=np.float64) if x is not None else None


def _silu(x):
    return x / (1.0 + math.exp(-x)) if x >= 0 else x * math.exp(x) / (1.0 + math.exp(x))


def hstu_key_allowed(i, j, L_q, L_k, window_size, func_row=None):
    """Is local key j visible to local query i? (explicit rule, one key at a time)."""
    if not (0 <= j < L_k):
        return False
    p = i + L_k - L_q
    left, right = window_size
    if left != -1 and j < p - left:
        return False
    if right != -1 and j > p + right:
        return False
    if func_row is not None:
        ok = j < func_row[0]
        for t in range(1, len(func_row), 2):
            if func_row[t] <= j < func_row[t + 1]:
                ok = True
        if not ok:
            return False
    return True


def hstu_oracle(q, k, v, cu_q, cu_k, *, max_seqlen_q, scaling_seqlen=None, window_size=(-1, 0),
                alpha=1.0, func=None, paged_kv=None, page_ids=None, page_indptrs=None,
                page_size=128, rab=None):
    """out (T_q, H, D_v) float64. ``rab (B, H_rab, N, N)``: score + rab[b, h % H_rab, p, j]."""
    q = f64(q)
    cu_q = [int(x) for x in np.asarray(cu_q)]
    cu_k = [int(x) for x in np.asarray(cu_k)]
    B = len(cu_q) - 1
    T_q, H, D = q.shape
    if paged_kv is not None:
        pk = f64(paged_kv)
        ids = [int(x) for x in np.asarray(page_ids)]
        ptr = [int(x) for x in np.asarray(page_indptrs)]
        D_v = pk.shape[-1]
    else:
        k, v = f64(k), f64(v)
        D_v = v.shape[-1]
    scale = float(max_seqlen_q if scaling_seqlen is None else scaling_seqlen)
    fn = None if func is None else np.asarray(func)[0]
    rab = f64(rab)
    out = np.zeros((T_q, H, D_v))
    for b in range(B):
        L_q = cu_q[b + 1] - cu_q[b]
        L_k = cu_k[b + 1] - cu_k[b]
        if paged_kv is not None:
            kb = np.zeros((L_k, pk.shape[3], D))
            vb = np.zeros((L_k, pk.shape[3], D_v))
            for jj in range(L_k):
                page = ids[ptr[b] + jj // page_size]
                kb[jj] = pk[page, 0, jj % page_size]
                vb[jj] = pk[page, 1, jj % page_size]
        else:
            kb = k[cu_k[b]:cu_k[b + 1]]
            vb = v[cu_k[b]:cu_k[b + 1]]
        for i in range(L_q):
            r = cu_q[b] + i
            frow = None if fn is None else [int(x) for x in fn[:, r]]
            for jj in range(L_k):
                if not hstu_key_allowed(i, jj, L_q, L_k, window_size, frow):
                    continue
                p = i + L_k - L_q
                g = H // kb.shape[1]  # GQA/MQA: query head h reads KV head h // g
                for h in range(H):
                    s = alpha * float(np.dot(q[r, h], kb[jj, h // g]))
                    if rab is not None and p >= 0:
                        s += float(rab[b, h % rab.shape[1], p, jj])
                    out[r, h] += _silu(s) * vb[jj, h // g] / scale
    return out


def hstu_dense_mask_oracle(cu_q, cu_k, max_seqlen_q, max_seqlen_k, window_size, func=None):
    """(B, max_q, max_k) bool from the explicit rule."""
    cu_q = [int(x) for x in np.asarray(cu_q)]
    cu_k = [int(x) for x in np.asarray(cu_k)]
    fn = None if func is None else np.asarray(func)[0]
    B = len(cu_q) - 1
    m = np.zeros((B, max_seqlen_q, max_seqlen_k), bool)
    for b in range(B):
        L_q, L_k = cu_q[b + 1] - cu_q[b], cu_k[b + 1] - cu_k[b]
        for i in range(L_q):
            frow = None if fn is None else [int(x) for x in fn[:, cu_q[b] + i]]
            for j in range(L_k):
                m[b, i, j] = hstu_key_allowed(i, j, L_q, L_k, window_size, frow)
    return m


def bsa_key_positions(b, h, m, idx, nums, sizes, blk, S_kv):
    """Sorted key token positions attended by query block m of (b, h)."""
    keys = set()
    for t in range(int(nums[b][h][m])):
        n = int(idx[b][h][m][t])
        size = blk if sizes is None else int(sizes[b][h][n])
        for off in range(size):
            pos = n * blk + off
            if pos < S_kv:
                keys.add(pos)
    return sorted(keys)


def bsa_oracle(q, k, v, idx, nums, sizes=None, *, blk=128, softmax_scale=None, layout="bhsd"):
    """Returns (out, lse) float64; q/k/v in ``layout``; idx (B,H,N_q,K), nums (B,H,N_q),
    sizes None or (B,H,N_kv) (already broadcast)."""
    q, k, v = f64(q), f64(k), f64(v)
    if layout == "bshd":
        q, k, v = (np.swapaxes(x, 1, 2) for x in (q, k, v))
    B, Hq, Sq, D = q.shape
    Hkv, Skv = k.shape[1], k.shape[2]
    D_v = v.shape[-1]
    g = Hq // Hkv
    scale = 1.0 / math.sqrt(D) if softmax_scale is None else softmax_scale
    idx = np.asarray(idx)
    nums = np.asarray(nums)
    sizes = None if sizes is None else np.asarray(sizes)
    out = np.zeros((B, Hq, Sq, D_v))
    lse = np.full((B, Hq, Sq), -np.inf)
    for b in range(B):
        for h in range(Hq):
            hk = h // g
            for m in range(-(-Sq // blk)):
                keys = bsa_key_positions(b, h, m, idx, nums, sizes, blk, Skv)
                if not keys:
                    continue
                for i in range(m * blk, min((m + 1) * blk, Sq)):
                    s = np.array([scale * float(np.dot(q[b, h, i], k[b, hk, j])) for j in keys])
                    mx = s.max()
                    w = np.exp(s - mx)
                    tot = w.sum()
                    lse[b, h, i] = mx + math.log(tot)
                    acc = np.zeros(D_v)
                    for wj, j in zip(w, keys):
                        acc += wj * v[b, hk, j]
                    out[b, h, i] = acc / tot
    if layout == "bshd":
        out = np.swapaxes(out, 1, 2)
    return out, lse


def broadcast_sizes(block_sizes, B, H, N_kv):
    if block_sizes is None:
        return None
    bs = np.asarray(block_sizes)
    if bs.ndim == 1:
        return np.broadcast_to(bs[None, None], (B, H, N_kv))
    if bs.ndim == 2:
        return np.broadcast_to(bs[:, None], (B, H, N_kv))
    return bs


def fd_check(f, args, cot, eps=1e-6, n_dirs=3, seed=0):
    """Directional central finite differences of ``<cot, f(*args)>`` vs ``jax.vjp``.

    float64 inputs expected (run under :func:`x64`). Asserts agreement to 1e-6 relative
    along ``n_dirs`` random directions and returns ``(out, grads)``.
    """
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415

    out, vjp = jax.vjp(f, *args)
    grads = vjp(cot)
    rng = np.random.default_rng(seed)
    for _ in range(n_dirs):
        dirs = [jnp.asarray(rng.standard_normal(a.shape)) for a in args]
        plus = f(*[a + eps * d for a, d in zip(args, dirs)])
        minus = f(*[a - eps * d for a, d in zip(args, dirs)])
        fd = float(jnp.sum(cot * (plus - minus)) / (2 * eps))
        an = float(sum(jnp.sum(g * d) for g, d in zip(grads, dirs)))
        assert abs(fd - an) <= 1e-6 * max(1.0, abs(fd)), (fd, an)
    return out, grads


def _dsilu(x):
    s = 1.0 / (1.0 + np.exp(-x))
    return s * (1.0 + x * (1.0 - s))


def hstu_oracle_vjp(q, k, v, do, cu_q, cu_k, *, max_seqlen_q, scaling_seqlen=None,
                    window_size=(-1, 0), alpha=1.0, func=None):
    """``(out, dq, dk, dv)`` float64: the HSTU forward and its gradients for the output
    cotangent ``do``, per sequence and head with dense matrices; the mask comes from the
    key-by-key rule :func:`hstu_key_allowed` (packed K/V only)."""
    q, k, v, do = f64(q), f64(k), f64(v), f64(do)
    cu_q = [int(x) for x in np.asarray(cu_q)]
    cu_k = [int(x) for x in np.asarray(cu_k)]
    scale = float(max_seqlen_q if scaling_seqlen is None else scaling_seqlen)
    fn = None if func is None else np.asarray(func)[0]
    out, dq = np.zeros(q.shape[:2] + v.shape[2:]), np.zeros(q.shape)
    dk, dv = np.zeros(k.shape), np.zeros(v.shape)
    for b in range(len(cu_q) - 1):
        rq = slice(cu_q[b], cu_q[b + 1])
        rk = slice(cu_k[b], cu_k[b + 1])
        L_q, L_k = rq.stop - rq.start, rk.stop - rk.start
        if L_q == 0 or L_k == 0:
            continue
        m = np.zeros((L_q, L_k))
        for i in range(L_q):
            frow = None if fn is None else [int(x) for x in fn[:, cu_q[b] + i]]
            for j in range(L_k):
                m[i, j] = hstu_key_allowed(i, j, L_q, L_k, window_size, frow)
        g = q.shape[1] // k.shape[1]  # GQA/MQA: query head h reads KV head h // g
        for h in range(q.shape[1]):
            hk = h // g
            s = alpha * q[rq, h] @ k[rk, hk].T
            p = m * (s / (1.0 + np.exp(-s))) / scale
            out[rq, h] = p @ v[rk, hk]
            dv[rk, hk] += p.T @ do[rq, h]
            ds = (do[rq, h] @ v[rk, hk].T) * m * _dsilu(s) * alpha / scale
            dq[rq, h] += ds @ k[rk, hk]
            dk[rk, hk] += ds.T @ q[rq, h]
    return out, dq, dk, dv


def _rows_vjp(q, k, v, do, scale, b, h, hk, rows, keys, out, lse, dq, dk, dv):
    """Softmax attention of query rows ``rows`` of head ``h`` over the keys ``keys`` of KV
    head ``hk``: writes out, lse, dq of the rows and adds their dk, dv contributions."""
    kk, vv = k[b, hk, keys], v[b, hk, keys]
    s = scale * q[b, h, rows] @ kk.T
    mx = s.max(axis=1, keepdims=True)
    w = np.exp(s - mx)
    tot = w.sum(axis=1, keepdims=True)
    p = w / tot
    o = p @ vv
    out[b, h, rows], lse[b, h, rows] = o, (mx + np.log(tot))[:, 0]
    dob = do[b, h, rows]
    ds = p * (dob @ vv.T - np.sum(dob * o, axis=1, keepdims=True))
    dq[b, h, rows] = scale * ds @ kk
    dk[b, hk, keys] += scale * ds.T @ q[b, h, rows]
    dv[b, hk, keys] += p.T @ dob


def _bsa_vjp(q, k, v, do, softmax_scale, layout, units):
    """float64 ``(out, lse, dq, dk, dv)`` of the BSA oracles: ``units(B, H_q, S_q, S_kv, r)``
    yields ``(b, h, rows, keys)`` (a slice of query rows of head ``h`` and their key
    positions), every query row at most once; rows never yielded or with no key get out 0,
    lse -inf and no gradient."""
    q, k, v, do = f64(q), f64(k), f64(v), f64(do)
    if layout == "bshd":
        q, k, v, do = (np.swapaxes(x, 1, 2) for x in (q, k, v, do))
    B, Hq, Sq, D = q.shape
    r = Hq // k.shape[1]
    scale = 1.0 / math.sqrt(D) if softmax_scale is None else softmax_scale
    out, lse = np.zeros(do.shape), np.full((B, Hq, Sq), -np.inf)
    dq, dk, dv = np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape)
    for b, h, rows, keys in units(B, Hq, Sq, k.shape[2], r):
        if keys:
            _rows_vjp(q, k, v, do, scale, b, h, h // r, rows, keys, out, lse, dq, dk, dv)
    if layout == "bshd":
        out, dq, dk, dv = (np.swapaxes(x, 1, 2) for x in (out, dq, dk, dv))
    return out, lse, dq, dk, dv


def bsa_oracle_vjp(q, k, v, do, idx, nums, sizes=None, *, blk=128, softmax_scale=None,
                   layout="bhsd"):
    """``(out, lse, dq, dk, dv)`` float64: block-sparse softmax attention and its gradients
    for ``do``, one query block at a time over the key set of :func:`bsa_key_positions`
    (``sizes`` None or broadcast to ``(B, H_q, N_kv)``)."""
    idx, nums = np.asarray(idx), np.asarray(nums)
    sizes = None if sizes is None else np.asarray(sizes)

    def units(B, Hq, Sq, Skv, r):
        for b in range(B):
            for h in range(Hq):
                for mb in range(-(-Sq // blk)):
                    yield (b, h, slice(mb * blk, min((mb + 1) * blk, Sq)),
                           bsa_key_positions(b, h, mb, idx, nums, sizes, blk, Skv))

    return _bsa_vjp(q, k, v, do, softmax_scale, layout, units)


def bsa_row_keys(b, h, i, idx, nums, sizes, blk, S_q, S_kv, r=1, pack_gqa=False,
                 causal=False):
    """Sorted key positions attended by query row ``i`` of query head ``h`` (batch ``b``):
    the keys of the listed blocks of its metadata row, which is query block ``i // blk`` of
    head ``h``, or with ``pack_gqa`` packed block ``(i r + h % r) // blk`` of KV head
    ``h // r`` (``r = H_q / H_kv``); with ``causal`` only keys ``j <= i + S_kv - S_q``.
    ``sizes``: None or broadcast to ``(B, rows' heads, N_kv)``."""
    hm, m = (h // r, (i * r + h % r) // blk) if pack_gqa else (h, i // blk)
    keys = bsa_key_positions(b, hm, m, idx, nums, sizes, blk, S_kv)
    if causal:
        keys = [j for j in keys if j <= i + S_kv - S_q]
    return keys


def bsa_rows_oracle_vjp(q, k, v, do, idx, nums, sizes=None, *, blk=128, softmax_scale=None,
                        layout="bhsd", pack_gqa=False, causal=False):
    """``(out, lse, dq, dk, dv)`` float64 of block-sparse softmax attention with the
    ``pack_gqa`` / ``causal`` options, one query row at a time over
    :func:`bsa_row_keys` (rows without keys: out 0, lse -inf, no gradient)."""
    idx, nums = np.asarray(idx), np.asarray(nums)
    sizes = None if sizes is None else np.asarray(sizes)

    def units(B, Hq, Sq, Skv, r):
        for b in range(B):
            for h in range(Hq):
                for i in range(Sq):
                    yield b, h, slice(i, i + 1), bsa_row_keys(
                        b, h, i, idx, nums, sizes, blk, Sq, Skv, r, pack_gqa, causal)

    return _bsa_vjp(q, k, v, do, softmax_scale, layout, units)
