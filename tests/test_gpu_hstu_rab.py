"""GPU tests of the HSTU kernels with a relative attention bias (rab) vs the reference.

Same rule and canvas as ``test_gpu_hstu.py`` (kernel error vs the float32 reference <= 2x
forward / 5x backward the error of the same computation in the input dtype, plus a small
atol; NaN never passes), for out and all four gradients dq, dk, dv, drab. Every case has
max_seqlen_k odd or even, jagged lengths with zero-length sequences, H_rab = 1 (drab summed
over heads with fp32 reductions) or H_rab = H (direct stores), rab in q's dtype or float32.
drab must be exactly 0 outside each sequence's rows ``p in [L_k - L_q, L_k)`` and keys
``j < L_k``; a poisoned-buffer test checks that the kernel writes exactly that region.

The forward is the default ``sm90ws`` kernel except where a case selects another
(``test_hstu_rab_forward_impls``: sm80, sm90ws variants, both N_k parities). The backward
is the default's: the sm90 kernel at D = D_v in {64, 128}, sm80 at other head dims; the
``*_sm80`` tests run the grid's D = D_v in {64, 128} cases and the poisoned-buffer check on
the sm80 backward (the hstu_bwd_ws flag ``rabsm80``), ``test_hstu_rab_nan_where_masked``
both; ``HSTU_TEST_RAB_ORDER=lpt`` (or ``hlpt``, ``seq``) runs every case with that
``hstu_bwd_order``.

Run on the H200: ``python -m pytest -m gpu tests/test_gpu_hstu_rab.py``
(``HSTU_TEST_SHARD=i/n`` shards it like test_gpu_hstu.py; tests/gpu_grids.sh (PARTS=rab) runs it
with the rab benchmark rows).
"""

from __future__ import annotations

import functools
import os

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

pytestmark = pytest.mark.gpu

T_CANVAS = 2816  # 22 * 128 > every case's total length (at most 1582) + a tail
B_SLOTS = 10
H = 2
FUNC_PAD = 256
LENS_RAB = [1, 17, 0, 113, 128, 1023, 0, 300]  # max_seqlen_k = 1023 (odd)
LENS_Q_LT_K = ([1, 10, 0, 100, 500, 64, 0, 200], [5, 17, 3, 113, 600, 128, 0, 300])
# more queries than keys (bias rows p = i + L_k - L_q start below 0); 700 / 640 give D 128
# tiles inside the bias (the backward's fast path) and tiles that cross row 0
LENS_Q_GT_K = ([700, 190, 5, 0, 300, 64], [640, 120, 17, 0, 200, 64])


def _shard(cases):
    spec = os.environ.get("HSTU_TEST_SHARD")
    if not spec:
        return cases
    i, n = (int(x) for x in spec.split("/"))
    return [c for j, c in enumerate(cases) if j % n == i]


def _first_shard():
    return os.environ.get("HSTU_TEST_SHARD", "0/1").split("/")[0] == "0"


def _cu(lens):
    lens = list(lens) + [0] * (B_SLOTS - len(lens))
    assert sum(lens) <= T_CANVAS, "test case does not fit the canvas"
    return np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)


def _func(cu_q, cu_k, n, rng):
    """Random interval mask: F0 prefix + (n-1)/2 intervals (some empty, overlapping)."""
    f = np.zeros((1, n, T_CANVAS + FUNC_PAD), np.int32)
    for b in range(len(cu_q) - 1):
        lq = cu_q[b + 1] - cu_q[b]
        lk = cu_k[b + 1] - cu_k[b]
        for i in range(lq):
            r = cu_q[b] + i
            p = i + lk - lq
            f[0, 0, r] = rng.integers(0, max(p, 0) + 2) if rng.random() < 0.7 else 0
            for t in range((n - 1) // 2):
                a = rng.integers(-3, lk + 3)
                f[0, 2 * t + 1, r] = a
                f[0, 2 * t + 2, r] = a + rng.integers(-5, 300)
    return jnp.asarray(f)


def _inputs(seed, d, dv, dtype, lens_q, lens_k, heads=H):
    rng = np.random.default_rng(seed)
    ks = jax.random.split(jax.random.PRNGKey(seed), 4)
    q = jax.random.normal(ks[0], (T_CANVAS, heads, d), jnp.float32).astype(dtype)
    k = jax.random.normal(ks[1], (T_CANVAS, heads, d), jnp.float32).astype(dtype)
    v = jax.random.normal(ks[2], (T_CANVAS, heads, dv), jnp.float32).astype(dtype)
    do = jax.random.normal(ks[3], (T_CANVAS, heads, dv), jnp.float32).astype(dtype)
    return rng, q, k, v, do, jnp.asarray(_cu(lens_q)), jnp.asarray(_cu(lens_k))


def _maxerr(a, b):
    a = np.asarray(jnp.asarray(a, jnp.float32))
    b = np.asarray(jnp.asarray(b, jnp.float32))
    if not np.isfinite(a).all():
        return np.inf
    return float(np.max(np.abs(a - b))) if a.size else 0.0


def _check(name, kern, ref32, ref_lo, factor, report):
    err = _maxerr(kern, ref32)
    base = _maxerr(ref_lo, ref32)
    scale = float(np.max(np.abs(np.asarray(jnp.asarray(ref32, jnp.float32))))) if ref32.size else 0.0
    atol = 2e-3 * max(scale, 1e-6) + 1e-6
    bound = factor * base + atol
    report.append(f"{name}: err={err:.3e} base={base:.3e} bound={bound:.3e}")
    # a non-finite kernel result is err = inf: it must fail also when the input-dtype
    # reference overflowed (base = inf made the bound inf, and inf <= inf passed)
    ok = bool(np.isfinite(err) and np.isfinite(bound) and err <= bound)
    return ok, f"{name}: err {err:.3e} > {factor}x base {base:.3e} + atol {atol:.3e}"


def _rab(seed, n_k, h_rab, dtype):
    r = jax.random.normal(jax.random.PRNGKey(1000 + seed), (B_SLOTS, h_rab, n_k, n_k),
                          jnp.float32)
    return r.astype(dtype)


@functools.lru_cache(maxsize=None)
def _jitted(kind, max_q, max_k, scaling, window, alpha, compute, fwd_impl=None, bwd_ws="",
            det=False, kv_splits=1):
    """jit-compiled callables (one per static configuration; jit also keeps the eager value
    checks away from the random func endpoints, which may exceed max_seqlen_k). ``bwd_ws``:
    the hstu_bwd_ws switch of the kernel backwards ("rabsm80": the sm80 backward at every
    head dim); ``det``: their deterministic flag; ``kv_splits``: the kernel forward's."""
    import jax_sparse_attn as jsa
    from jax_sparse_attn import hstu as hstu_mod
    from jax_sparse_attn import reference
    from jax_sparse_attn.config import Switches
    from jax_sparse_attn.ffi import hstu as fh

    kw = dict(max_seqlen_q=max_q, max_seqlen_k=max_k, scaling_seqlen=scaling,
              window_size=window, alpha=alpha)
    sw = None
    if fwd_impl:  # "sm80", "sm90ws" or "sm90ws:<hstu_fwd_ws options joined by +>"
        impl, _, ws = fwd_impl.partition(":")
        sw = Switches(hstu_fwd_impl=impl, hstu_fwd_ws=ws.replace("+", ","))
    elif os.environ.get("HSTU_TEST_RAB_FWD_WS"):
        # HSTU_TEST_RAB_FWD_WS: hstu_fwd_ws flags of the default forwards (e.g. "rabpf")
        sw = Switches(hstu_fwd_ws=os.environ["HSTU_TEST_RAB_FWD_WS"])
    if kind == "kfwd":
        return jax.jit(lambda q, k, v, cq, ck, f, r: jsa.hstu_attention(
            q, k, v, cq, ck, func=f, rab=r, backend="kernel", switches=sw,
            kv_splits=kv_splits, **kw))
    # HSTU_TEST_RAB_ORDER: the hstu_bwd_order of the kernel backwards (e.g. "lpt")
    order = os.environ.get("HSTU_TEST_RAB_ORDER", "")
    # HSTU_TEST_RAB_WS: hstu_bwd_ws flags added to the sm90 backwards' (e.g. "norabfast")
    extra = os.environ.get("HSTU_TEST_RAB_WS", "")
    if extra and "rabsm80" not in bwd_ws:
        bwd_ws = ",".join(filter(None, [bwd_ws, extra]))
    bsw = (Switches(hstu_bwd_ws=bwd_ws, hstu_bwd_order=order or "auto")
           if bwd_ws or order else None)
    if kind == "kbwd":
        return jax.jit(lambda do, q, k, v, cq, ck, f, r: tuple(jsa.hstu_attention_backward(
            do, q, k, v, cq, ck, func=f, rab=r, backend="kernel", switches=bsw,
            deterministic=det, **kw)))
    if kind == "kbwd_init":  # the ffi backward with a poisoned initial drab buffer
        def bwd_init(do, q, k, v, cq, ck, f, r, init):
            cfg = hstu_mod._make_config(q, k, v, cq, ck, f, None, None, None, backend="kernel",
                                        switches=bsw, op_name="test", rab=r, **kw)
            return fh.hstu_bwd(do, q, k, v, cq, ck, f, cfg, rab=r, _drab_init=init)

        return jax.jit(bwd_init)
    cdt = None if compute == "f32" else jnp.dtype(compute)
    if kind == "rfwd":
        return jax.jit(lambda q, k, v, cq, ck, f, r: reference.hstu_attention_ref(
            q, k, v, cq, ck, f, compute_dtype=cdt, rab=r, **kw))
    return jax.jit(lambda do, q, k, v, cq, ck, f, r: reference.hstu_attention_bwd_ref(
        do, q, k, v, cq, ck, f, compute_dtype=cdt, rab=r, **kw))


def _region(lens_q, lens_k, n_k):
    """(B_SLOTS, 1, n_k, n_k) bool: rows p in [L_k - L_q, L_k), keys j < L_k."""
    m = np.zeros((B_SLOTS, 1, n_k, n_k), bool)
    for b, (lq, lk) in enumerate(zip(lens_q, lens_k)):
        m[b, 0, max(lk - lq, 0):lk, :lk] = True
    return m


def _run_rab_case(d, dtype, lens_q, lens_k, window, *, h_rab, rab_dtype, func_n=0, alpha=None,
                  scaling=None, seed=0, bwd=True, fwd_impl=None, dv=None, bwd_ws="",
                  det=False, rab_fn=None, h_kv=None, heads=H, kv_splits=1):
    dtype = jnp.dtype(dtype)
    dv = dv or d
    rng, q, k, v, do, cq, ck = _inputs(seed, d, dv, dtype, lens_q, lens_k, heads)
    if h_kv:  # grouped KV heads: query head h reads KV head h // (H / h_kv)
        k, v = k[:, :h_kv], v[:, :h_kv]
    max_q, max_k = max(max(lens_q), 1), max(max(lens_k), 1)
    alpha = float(alpha if alpha is not None else 2.0 / np.sqrt(d))
    scaling = float(scaling if scaling is not None else max_q)
    func = _func(np.asarray(cq), np.asarray(ck), func_n, rng) if func_n else None
    rab = _rab(seed, max_k, h_rab, dtype if rab_dtype == "q" else jnp.float32)
    if rab_fn is not None:
        rab = rab_fn(rab)
    args = (max_q, max_k, scaling, tuple(window), alpha)
    report, fails = [], []
    out = _jitted("kfwd", *args, None, fwd_impl, kv_splits=kv_splits)(q, k, v, cq, ck, func,
                                                                        rab)
    r32 = _jitted("rfwd", *args, "f32")(q, k, v, cq, ck, func, rab)
    rlo = _jitted("rfwd", *args, dtype.name)(q, k, v, cq, ck, func, rab)
    ok, msg = _check("out", out, r32, rlo, 2.0, report)
    if not ok:
        fails.append(msg)
    tail = np.asarray(out[int(cq[-1]):], np.float32)
    if tail.size and np.abs(tail).max() != 0:
        fails.append("out rows past cu_seqlens_q[-1] are not zero")
    if bwd:
        g = _jitted("kbwd", *args, None, None, bwd_ws, det)(do, q, k, v, cq, ck, func, rab)
        g32 = _jitted("rbwd", *args, "f32")(do, q, k, v, cq, ck, func, rab)
        glo = _jitted("rbwd", *args, dtype.name)(do, q, k, v, cq, ck, func, rab)
        assert len(g) == 4 and g[3].shape == rab.shape and g[3].dtype == rab.dtype
        for nm, a, b, c in zip(("dq", "dk", "dv", "drab"), g, g32, glo):
            ok, msg = _check(nm, a, b, c, 5.0, report)
            if not ok:
                fails.append(msg)
        outside = ~np.broadcast_to(_region(lens_q, lens_k, max_k), rab.shape)
        drab = np.asarray(g[3], np.float32)
        if np.any(drab[outside] != 0):
            fails.append("drab is not exactly 0 outside the sequences' rows/keys")
        if not np.abs(drab).max() > 0:
            fails.append("drab is all zero")
    print(" | ".join(report))
    assert not fails, "; ".join(fails)
    return q, k, v, do, cq, ck, func, rab, args


RAB_GRID = []
for _i, _d in enumerate((32, 64, 128, 256)):
    RAB_GRID.append(dict(d=_d, dtype="bfloat16", window=(-1, 0), h_rab=(1, H)[_i % 2],
                         rab_dtype=("f32", "q")[_i // 2 % 2]))
RAB_GRID += [
    dict(d=128, dtype="bfloat16", window=(-1, -1), h_rab=H, rab_dtype="f32"),
    dict(d=64, dtype="float16", window=(63, 17), h_rab=H, rab_dtype="q"),
    dict(d=128, dtype="float16", window=(-1, 0), h_rab=1, rab_dtype="q"),
    dict(d=128, dtype="bfloat16", window=(-1, -1), func_n=3, h_rab=1, rab_dtype="f32"),
    dict(d=64, dtype="float16", window=(-1, -1), func_n=7, h_rab=H, rab_dtype="f32"),
    dict(d=128, dtype="bfloat16", window=(31, 7), lens=LENS_Q_LT_K, h_rab=1, rab_dtype="q"),
    dict(d=64, dtype="bfloat16", window=(-1, -1), lens=LENS_Q_LT_K, h_rab=H, rab_dtype="f32"),
    dict(d=128, dtype="bfloat16", window=(-1, -1), alpha=0.5, scaling=77.0, h_rab=1,
         rab_dtype="f32"),
    dict(d=64, dv=128, dtype="bfloat16", window=(-1, 0), h_rab=H, rab_dtype="q"),
    # max_seqlen_k even (300) and H_rab = 1 (workspace rows not padded)
    dict(d=64, dtype="bfloat16", window=(-1, 0), h_rab=1, rab_dtype="f32",
         lens=([300, 5, 0, 64], [300, 5, 0, 64])),
    # L_q > L_k at D 128: the fast path of steps inside the bias next to steps that cross
    # bias row 0, both d rab modes
    dict(d=128, dtype="bfloat16", window=(-1, 0), h_rab=1, rab_dtype="f32", lens=LENS_Q_GT_K),
    dict(d=128, dtype="float16", window=(-1, -1), h_rab=H, rab_dtype="q", lens=LENS_Q_GT_K),
    # D 64, H_rab = 1, max_seqlen_k 301 (workspace rows padded to 304), no mask
    dict(d=64, dtype="float16", window=(-1, -1), h_rab=1, rab_dtype="q",
         lens=([301, 7, 0, 33], [301, 7, 0, 33])),
]


def _id(c):
    s = f"{c['dtype'][:4]}-d{c['d']}-w{c['window'][0]}_{c['window'][1]}-hr{c['h_rab']}-{c['rab_dtype']}"
    if c.get("dv"):
        s += f"-dv{c['dv']}"
    if c.get("func_n"):
        s += f"-func{c['func_n']}"
    if c.get("lens"):
        s += f"-lens{max(c['lens'][1])}"
    if c.get("alpha"):
        s += "-alpha"
    return s


@pytest.mark.parametrize("case", _shard(RAB_GRID), ids=_id)
def test_hstu_rab_kernel_vs_reference(case):
    lens_q, lens_k = case.get("lens", (LENS_RAB, LENS_RAB))
    _run_rab_case(case["d"], case["dtype"], lens_q, lens_k, case["window"],
                  h_rab=case["h_rab"], rab_dtype=case["rab_dtype"], func_n=case.get("func_n", 0),
                  alpha=case.get("alpha"), scaling=case.get("scaling"), dv=case.get("dv"))


# the grid's cases that the sm90 backward takes (D = D_v in {64, 128}), which the default
# runs there
RAB_GRID_SM90 = [c for c in RAB_GRID if c["d"] in (64, 128) and not c.get("dv")]


@pytest.mark.parametrize("case", _shard(RAB_GRID_SM90), ids=_id)
def test_hstu_rab_kernel_vs_reference_sm80(case):
    """:func:`test_hstu_rab_kernel_vs_reference` with the backward on the sm80 kernel
    (hstu_bwd_ws "rabsm80") where the default runs sm90."""
    lens_q, lens_k = case.get("lens", (LENS_RAB, LENS_RAB))
    _run_rab_case(case["d"], case["dtype"], lens_q, lens_k, case["window"],
                  h_rab=case["h_rab"], rab_dtype=case["rab_dtype"], func_n=case.get("func_n", 0),
                  alpha=case.get("alpha"), scaling=case.get("scaling"), bwd_ws="rabsm80")


# grouped KV heads (H_kv < H) with rab: the sm90ws forward and the sm90 backward (query head h
# reads KV head h // (H / H_kv) and bias head h % H_rab; dK / dV sum the group); four query
# heads over two KV heads, so that a query head's index within its group differs from it
GQA_RAB = [dict(d=128, dtype="bfloat16", window=(-1, 0), h_rab=4, rab_dtype="f32", h_kv=2,
                heads=4),
           dict(d=64, dtype="bfloat16", window=(31, 7), h_rab=1, rab_dtype="q", h_kv=2,
                heads=4, lens=LENS_Q_LT_K),
           # the split-KV forward (three key splits, fp32 partials summed in order)
           dict(d=128, dtype="bfloat16", window=(-1, 0), h_rab=1, rab_dtype="f32", h_kv=2,
                heads=4, kv_splits=3),
dict(d=128, dtype="bfloat16", window=(-1, 0), h_rab=1, rab_dtype="f32", h_kv=1),
           dict(d=64, dtype="float16", window=(63, 17), h_rab=H, rab_dtype="q", h_kv=1),
           dict(d=128, dtype="bfloat16", window=(-1, -1), func_n=3, h_rab=H, rab_dtype="f32",
                h_kv=1, lens=LENS_Q_LT_K),
           dict(d=64, dtype="bfloat16", window=(-1, -1), h_rab=1, rab_dtype="q", h_kv=1,
                lens=([301, 7, 0, 33], [301, 7, 0, 33]))]


@pytest.mark.parametrize("case", _shard(GQA_RAB),
                         ids=lambda c: _id(c) + f"-h{c.get('heads', H)}kv{c['h_kv']}"
                         + (f"-split{c['kv_splits']}" if c.get("kv_splits") else ""))
def test_hstu_rab_gqa(case):
    """Grouped KV heads with rab: out, dq, dk, dv, drab against the reference (which repeats
    the KV heads)."""
    lens_q, lens_k = case.get("lens", (LENS_RAB, LENS_RAB))
    _run_rab_case(case["d"], case["dtype"], lens_q, lens_k, case["window"],
                  h_rab=case["h_rab"], rab_dtype=case["rab_dtype"], func_n=case.get("func_n", 0),
                  h_kv=case["h_kv"], heads=case.get("heads", H),
                  kv_splits=case.get("kv_splits", 1), seed=6)


# deterministic=True on the sm90 backward with rab: per-head drab workspace (H_rab = 1) or
# direct stores, ordered dq additions
DET_SM90 = [dict(d=128, dtype="bfloat16", window=(-1, 0), h_rab=1, rab_dtype="f32"),
            dict(d=64, dtype="float16", window=(63, 17), h_rab=H, rab_dtype="q"),
            dict(d=128, dtype="bfloat16", window=(-1, -1), func_n=3, h_rab=1, rab_dtype="q",
                 lens=LENS_Q_LT_K)]


@pytest.mark.parametrize("case", _shard(DET_SM90), ids=_id)
def test_hstu_rab_deterministic_sm90(case):
    """deterministic=True on the sm90 backward with rab: within the tolerance of the
    reference, and dq, dk, dv, drab bitwise equal over 3 runs."""
    lens_q, lens_k = case.get("lens", (LENS_RAB, LENS_RAB))
    q, k, v, do, cq, ck, func, rab, args = _run_rab_case(
        case["d"], case["dtype"], lens_q, lens_k, case["window"], h_rab=case["h_rab"],
        rab_dtype=case["rab_dtype"], func_n=case.get("func_n", 0), det=True, seed=3)
    fn = _jitted("kbwd", *args, None, None, "", True)
    runs = [[np.asarray(x) for x in fn(do, q, k, v, cq, ck, func, rab)] for _ in range(3)]
    for r in runs[1:]:
        for nm, a, b in zip(("dq", "dk", "dv", "drab"), r, runs[0]):
            assert np.array_equal(a, b, equal_nan=True), f"{nm} differs between runs"


@pytest.mark.parametrize("bwd_ws", ["rabsm80", ""], ids=["sm80bwd", "sm90bwd"])
@pytest.mark.parametrize("h_rab", [1, H])
@pytest.mark.parametrize("d,window", [(128, (-1, 0)), (64, (31, 7))])
def test_hstu_rab_nan_where_masked(d, window, h_rab, bwd_ws):
    """rab holding NaN / inf at entries the mask hides: they contribute nothing (out, dq, dk,
    dv as with a finite bias there, drab exactly 0 there). The references take the bias
    with those entries zeroed."""
    lens = [1, 17, 0, 113, 128, 300, 0, 257]
    max_k = max(lens)
    left, right = window
    p = np.arange(max_k)[:, None]
    j = np.arange(max_k)[None, :]
    # rows p = i + L_k - L_q (L_q = L_k: p = i); hidden: keys past the window's edges
    hidden = (j > p + right) if right >= 0 else np.zeros((max_k, max_k), bool)
    if left >= 0:
        hidden = hidden | (j < p - left)
    poison = np.where((p + j) % 2 == 0, np.nan, np.inf).astype(np.float32)

    def bad(r):
        return jnp.where(jnp.asarray(hidden), jnp.asarray(poison).astype(r.dtype), r)

    def clean(r):
        return jnp.where(jnp.asarray(hidden), jnp.zeros((), r.dtype), r)

    dtype = jnp.bfloat16
    rng, q, k, v, do, cq, ck = _inputs(4, d, d, dtype, lens, lens)
    r0 = _rab(4, max_k, h_rab, jnp.float32)
    args = (max_k, max_k, float(max_k), tuple(window), float(2.0 / np.sqrt(d)))
    g = _jitted("kbwd", *args, None, None, bwd_ws)(do, q, k, v, cq, ck, None, bad(r0))
    gc = _jitted("kbwd", *args, None, None, bwd_ws)(do, q, k, v, cq, ck, None, clean(r0))
    g32 = _jitted("rbwd", *args, "f32")(do, q, k, v, cq, ck, None, clean(r0))
    glo = _jitted("rbwd", *args, "bfloat16")(do, q, k, v, cq, ck, None, clean(r0))
    out = _jitted("kfwd", *args, None)(q, k, v, cq, ck, None, bad(r0))
    outc = _jitted("kfwd", *args, None)(q, k, v, cq, ck, None, clean(r0))
    assert np.array_equal(np.asarray(out, np.float32), np.asarray(outc, np.float32))
    report, fails = [], []
    for nm, a, ac, b, c in zip(("dq", "dk", "dv", "drab"), g, gc, g32, glo):
        a32 = np.asarray(jnp.asarray(a, jnp.float32))
        assert np.isfinite(a32).all(), f"{nm} not finite"
        # dk, dv and per-head drab: the same values bitwise (dq and drab with H_rab = 1:
        # fp32 additions in any order)
        if nm in ("dk", "dv") or (nm == "drab" and h_rab == H):
            assert np.array_equal(a32, np.asarray(jnp.asarray(ac, jnp.float32))), nm
        ok, msg = _check(nm, a, b, c, 5.0, report)
        if not ok:
            fails.append(msg)
    drab = np.asarray(g[3], np.float32)
    assert (drab[:, :, hidden] == 0).all(), "drab not 0 where the mask hides the entry"
    print(" | ".join(report))
    assert not fails, "; ".join(fails)


# forward only, per implementation: sm80 explicitly; sm90ws (the default) with odd (1023:
# one load per bias element) and even (300: one load per pair of adjacent columns) N_k, and
# its variants (no intra-warpgroup overlap, 16-bit score function, block_n 64, one Q stage)
LENS_EVEN = ([300, 5, 0, 64, 299, 17], [300, 5, 0, 64, 299, 17])
FWD_IMPL_CASES = [("sm80", dict(d=128, window=(-1, 0), h_rab=1)),
                  ("sm80", dict(d=64, window=(-1, -1), func_n=3, h_rab=H)),
                  ("sm90ws", dict(d=128, window=(63, 17), h_rab=H)),
                  ("sm90ws", dict(d=256, window=(-1, 0), h_rab=1)),
                  ("sm90ws", dict(d=128, window=(-1, 0), h_rab=1, lens=LENS_EVEN)),
                  ("sm90ws", dict(d=64, window=(-1, -1), func_n=5, h_rab=H, lens=LENS_EVEN,
                                  rab_dtype="q")),
                  ("sm90ws", dict(d=32, window=(-1, 0), h_rab=1, lens=LENS_Q_LT_K)),
                  ("sm90ws:nooverlap", dict(d=128, window=(-1, 0), h_rab=H, lens=LENS_EVEN)),
                  ("sm90ws:silu16", dict(d=128, window=(-1, -1), h_rab=1, rab_dtype="q")),
                  ("sm90ws:bn=64+q1", dict(d=64, window=(-1, 0), h_rab=H, lens=LENS_EVEN))]


def _impl_id(i, c):
    s = f"{i.replace(':', '-').replace('=', '').replace('+', '-')}-d{c['d']}-hr{c['h_rab']}"
    if c.get("lens"):
        s += f"-lens{max(c['lens'][1])}"
    if c.get("func_n"):
        s += f"-func{c['func_n']}"
    return s + "-" + c.get("rab_dtype", "f32")


@pytest.mark.parametrize("impl,case", _shard(FWD_IMPL_CASES),
                         ids=[_impl_id(i, c) for i, c in _shard(FWD_IMPL_CASES)])
def test_hstu_rab_forward_impls(impl, case):
    """Each hstu_fwd_impl selection with rab runs that forward with the bias (sm80, sm90ws
    and sm90ws's variants)."""
    lens_q, lens_k = case.get("lens", (LENS_RAB, LENS_RAB))
    for dtype in ("bfloat16", "float16"):
        _run_rab_case(case["d"], dtype, lens_q, lens_k, case["window"], h_rab=case["h_rab"],
                      rab_dtype=case.get("rab_dtype", "f32"), func_n=case.get("func_n", 0),
                      seed=5, bwd=False, fwd_impl=impl)


@pytest.mark.skipif(not _first_shard(), reason="runs in shard 0")
@pytest.mark.parametrize("h_rab", [1, H])
def test_hstu_drab_poisoned_buffer_sm80(h_rab):
    """The drab buffer starts poisoned: the kernel (the sm80 backward, hstu_bwd_ws
    "rabsm80") writes (per head: stores; H_rab = 1: fp32 adds) exactly inside each
    sequence's rows p in [L_k - L_q, L_k) and keys j < L_k, and nothing outside (the poison
    survives there, padding columns included)."""
    _poisoned_buffer(h_rab, "rabsm80")


@pytest.mark.skipif(not _first_shard(), reason="runs in shard 0")
@pytest.mark.parametrize("h_rab", [1, H])
@pytest.mark.parametrize("d", [64, 128])
def test_hstu_drab_poisoned_buffer_sm90(h_rab, d):
    """:func:`test_hstu_drab_poisoned_buffer_sm80` on the sm90 backward (the default)."""
    _poisoned_buffer(h_rab, "", d)


def _poisoned_buffer(h_rab, bwd_ws, d=64):
    lens_q, lens_k = LENS_Q_LT_K
    q, k, v, do, cq, ck, func, rab, args = _run_rab_case(
        d, "bfloat16", lens_q, lens_k, (-1, -1), h_rab=h_rab, rab_dtype="f32", seed=9,
        bwd_ws=bwd_ws)
    n_k = rab.shape[-1]
    g32 = _jitted("rbwd", *args, "f32")(do, q, k, v, cq, ck, func, rab)[3]
    g32 = np.asarray(g32, np.float32)
    region = np.broadcast_to(_region(lens_q, lens_k, n_k), rab.shape)
    if h_rab == H:
        init = jnp.full(rab.shape, jnp.nan, jnp.float32)
        got = np.asarray(_jitted("kbwd_init", *args, None, None, bwd_ws)(do, q, k, v, cq, ck, func, rab,
                                                           init)[3], np.float32)
        assert np.isnan(got[~region]).all(), "drab written outside the sequences"
        inside = got[region]
    else:
        poison = 7.0
        pad = n_k + (-n_k) % 4
        init = jnp.full((B_SLOTS, 1, n_k, pad), poison, jnp.float32)
        got = np.asarray(_jitted("kbwd_init", *args, None, None, bwd_ws)(do, q, k, v, cq, ck, func, rab,
                                                           init)[3], np.float32)
        assert got.shape == (B_SLOTS, 1, n_k, pad)
        assert (got[..., n_k:] == poison).all(), "padding columns written"
        got = got[..., :n_k]
        assert (got[~region] == poison).all(), "drab added to outside the sequences"
        inside = got[region] - poison
    assert np.isfinite(inside).all()
    want = g32[region]
    assert np.max(np.abs(inside - want)) <= 0.02 * np.max(np.abs(want)) + 1e-4


@pytest.mark.skipif(not _first_shard(), reason="runs in shard 0")
@pytest.mark.parametrize("h_rab", [1, H])
def test_hstu_rab_public_grad_matches_reference(h_rab):
    """jax.grad of a jitted loss through hstu_attention(rab=...) (kernel) in q, k, v and rab
    vs the reference backend's grad."""
    import jax_sparse_attn as jsa

    lens = [100, 0, 257, 31]
    cu = jnp.asarray(np.concatenate([[0], np.cumsum(lens)]).astype(np.int32))
    t = int(cu[-1])
    ks = jax.random.split(jax.random.PRNGKey(17), 5)
    q = jax.random.normal(ks[0], (t, 2, 96), jnp.float32).astype(jnp.bfloat16)
    k = jax.random.normal(ks[1], (t, 2, 96), jnp.float32).astype(jnp.bfloat16)
    v = jax.random.normal(ks[2], (t, 2, 80), jnp.float32).astype(jnp.bfloat16)
    w = jax.random.normal(ks[3], (t, 2, 80), jnp.float32)
    rab = jax.random.normal(ks[4], (4, h_rab, 257, 257), jnp.float32)

    def loss(q, k, v, rab, backend):
        o = jsa.hstu_attention(q, k, v, cu, cu, max_seqlen_q=257, max_seqlen_k=257,
                               window_size=(-1, 0), alpha=0.2, backend=backend, rab=rab)
        return jnp.sum(o.astype(jnp.float32) * w)

    gk = jax.jit(jax.grad(functools.partial(loss, backend="kernel"), argnums=(0, 1, 2, 3)))(
        q, k, v, rab)
    gr = jax.jit(jax.grad(functools.partial(loss, backend="reference"),
                          argnums=(0, 1, 2, 3)))(q, k, v, rab)
    for a, b in zip(gk, gr):
        a = np.asarray(a, np.float32)
        b = np.asarray(b, np.float32)
        assert np.isfinite(a).all()
        assert np.max(np.abs(a - b)) <= 0.03 * np.max(np.abs(b)) + 1e-3
    res = jsa.hstu_attention_backward(jnp.ones((t, 2, 80), jnp.bfloat16), q, k, v, cu, cu,
                                      max_seqlen_q=257, max_seqlen_k=257, alpha=0.2,
                                      backend="kernel", rab=rab)
    assert res["drab_tensor"].shape == rab.shape and res.drab_tensor.dtype == rab.dtype
