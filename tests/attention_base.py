"""Shared test base of the public ops: one grid, every backend.

The grids below (HSTU: dtype x head dim x mask kind x varlen kind; BSA: dtype x layout x
block size x head dim x GQA x metadata kind x partial blocks) run through the *public*
ops (``jax.jit`` of ``jax.vjp`` through the ``custom_vjp``, so forward and backward of the
backend under test) and are checked with one rule:

    error(backend output vs truth) <= factor * error(input-dtype computation vs truth) + atol

with ``factor`` 2 for outputs (and lse), 5 for gradients, ``atol`` a small multiple of the
truth's magnitude, the input-dtype computation being ``reference.*_ref(compute_dtype=
q.dtype)``. NaN never passes, rows outside every sequence must be exactly 0 and rows
with no key give ``out = 0``, ``lse = -inf`` and zero ``dq``.

Subclasses pick the backend, the truth and the size profile:

* ``tests/test_reference_hstu.py`` / ``tests/test_reference_bsa.py`` (CI, CPU):
  ``backend="reference"``, truth = the float64 NumPy oracle of ``tests/oracle.py``, small
  shapes;
* ``tests/test_gpu_hstu.py`` / ``tests/test_gpu_bsa.py`` (H200, ``-m gpu``):
  ``backend="kernel"`` with the kernel implementations chosen by
  :class:`jax_sparse_attn.config.Switches` passed to the op, truth = the float32
  reference, full-size shapes.

Test modules import :func:`generate` as their ``pytest_generate_tests``: it parametrizes
every test method that takes ``case`` (and ``switches``) with the class's :meth:`grid`.
"""

from __future__ import annotations

import dataclasses
import functools
import os

import jax
import jax.numpy as jnp
import numpy as np

import jax_sparse_attn as jsa
from jax_sparse_attn import reference
from jax_sparse_attn.config import Switches, from_env
from jax_sparse_attn.metadata import normalize_bsa_metadata
from oracle import broadcast_sizes, bsa_oracle_vjp, hstu_oracle_vjp

FUNC_PAD = 256


def generate(metafunc):
    """``pytest_generate_tests``: parametrize ``case``/``switches`` from the class grid."""
    if metafunc.cls is None or "case" not in metafunc.fixturenames:
        return
    grid = metafunc.cls.grid()
    if "switches" in metafunc.fixturenames:
        metafunc.parametrize("case,switches", grid,
                             ids=[f"{_sw_id(s)}{c.id}" for c, s in grid])
    else:
        cases = list(dict.fromkeys(c for c, _ in grid))
        metafunc.parametrize("case", cases, ids=[c.id for c in cases])


def _sw_id(sw):
    if sw is None or sw == Switches():
        return ""
    diff = [f"{f.name}={getattr(sw, f.name)}" for f in dataclasses.fields(sw)
            if getattr(sw, f.name) != f.default]
    return ",".join(diff) + "-"


def shard(items, spec):
    """Items ``j`` with ``j % n == i`` for ``spec = "i/n"`` (all for an empty spec)."""
    if not spec:
        return list(items)
    i, n = (int(x) for x in spec.split("/"))
    return [c for j, c in enumerate(items) if j % n == i]


# ----------------------------------------------------------------------------- the rule


def _f32(x):
    return np.asarray(jnp.asarray(x, jnp.float32), np.float64)


def _maxabs(x):
    return float(np.max(np.abs(x))) if x.size else 0.0


def check_rule(name, got, truth, base, factor, rel_atol, report):
    """Assert the test rule for one output; append ``name: err/base`` to ``report``.
    ``base`` is the input-dtype computation, or a dtype name: then the baseline error is
    taken as one rounding of the truth to that dtype (``eps/2 * max|truth|``), the bound
    of a backend that computes in float32 and rounds once."""
    got, truth = _f32(got), np.asarray(truth, np.float64)
    assert got.shape == truth.shape, (name, got.shape, truth.shape)
    assert not np.isnan(got).any(), f"{name}: NaN in the output"
    err = _maxabs(got - truth)
    if isinstance(base, str):
        berr = float(jnp.finfo(jnp.dtype(base)).eps) / 2 * _maxabs(truth)
    else:
        berr = _maxabs(_f32(base) - truth)
    atol = rel_atol * max(_maxabs(truth), 1e-3)
    report.append(f"{name}: err={err:.2e} base={berr:.2e}")
    # an Inf in the output is err = inf, and an overflowed baseline berr = inf: inf <= inf
    # would pass; neither is a result the rule can accept
    assert np.isfinite(err), f"{name}: non-finite output or truth (err {err})"
    assert np.isfinite(berr), f"{name}: non-finite input-dtype baseline: no bound"
    assert err <= factor * berr + atol, (
        f"{name}: err {err:.3e} > {factor} x base {berr:.3e} + atol {atol:.3e}")


def check_unreached(names, gots, truth_rows):
    """Rows (every axis but the last) where ``truth_rows`` is exactly 0: rows no key reaches
    (query rows: out / dq) or that reach no query (key rows: dk / dv). They must be exactly 0
    in every array of ``gots`` (a tolerance would let a small contribution of masked or
    unlisted data, or an unwritten output row, pass); NaN there fails too."""
    zero = np.all(np.asarray(truth_rows, np.float64) == 0, axis=-1)
    for name, got in zip(names, gots):
        g = _f32(got)
        assert g.shape[:-1] == zero.shape, (name, g.shape, zero.shape)
        bad = zero & np.any(g != 0, axis=-1)
        assert not bad.any(), (
            f"{name}: {int(bad.sum())} of {int(zero.sum())} rows with no visible key / query "
            f"are not exactly 0 (first at {tuple(np.argwhere(bad)[0])})")


# ----------------------------------------------------------------------------- HSTU


@dataclasses.dataclass(frozen=True)
class HSTUCase:
    """One HSTU grid point. ``lens``: "mixed" (odd and zero lengths, L_q = L_k),
    "lq_lt_lk" (fewer queries than keys: bottom-right alignment), "one_query" or "partial"
    (lengths around the 64 / 128-row tile edges)."""

    d: int
    dtype: str = "bfloat16"
    window: tuple = (-1, 0)
    dv: int | None = None
    func_n: int = 0
    lens: str = "mixed"
    alpha: float | None = None
    scaling: float | None = None

    @property
    def id(self):
        s = f"{self.dtype[:4]}-d{self.d}" + (f"-dv{self.dv}" if self.dv else "")
        s += f"-w{self.window[0]}_{self.window[1]}" + (f"-func{self.func_n}" if self.func_n else "")
        s += "" if self.lens == "mixed" else f"-{self.lens}"
        return s + ("-alpha" if self.alpha else "")


HSTU_GRID = (
    [HSTUCase(d) for d in (32, 64, 128, 256)]
    + [HSTUCase(128, window=w) for w in ((-1, -1), (128, 0), (63, 17))]
    + [HSTUCase(d, "float16") for d in (64, 128)]
    + [HSTUCase(256, "float16", window=(63, 17))]
    + [HSTUCase(128, window=(-1, -1), func_n=n) for n in (1, 3, 7)]
    + [HSTUCase(64, "float16", window=(-1, -1), func_n=3),
       HSTUCase(128, lens="lq_lt_lk"),
       HSTUCase(64, window=(31, 7), lens="lq_lt_lk"),
       HSTUCase(64, dv=128),
       HSTUCase(256, lens="one_query"),
       HSTUCase(128, window=(-1, -1), alpha=0.5, scaling=77.0)]
)
#: cases that matter for the tile shapes of the forwards (sm90ws: 128 x 128 / 128 x 64 tiles,
#: two 64-row consumer warpgroups): fp16 at D = 32, func masks at D = 32 / 256, L_q < L_k at
#: D = 256, a window whose right edge cuts through 64-row tiles, and sequences ending inside
#: a tile ("partial": V rows past the end zero-filled, K rows masked)
HSTU_WGMMA_EXTRA = [
    HSTUCase(32, "float16"),
    HSTUCase(32, window=(-1, -1), func_n=3),
    HSTUCase(256, window=(-1, -1), func_n=7),
    HSTUCase(256, "float16", lens="lq_lt_lk"),
    HSTUCase(128, "float16", window=(5, 70)),
    HSTUCase(128, lens="partial"),
    HSTUCase(64, window=(-1, -1), lens="partial"),
    HSTUCase(256, lens="partial"),
]

#: (rows of the packed canvas, sequence slots, lengths per kind): every case of a profile
#: shares the canvas shape, so a kernel configuration compiles once per process
HSTU_PROFILES = {
    "small": (192, 6, {
        "mixed": ([1, 17, 0, 113, 0, 5], None),
        "lq_lt_lk": ([1, 10, 0, 40, 7], [5, 17, 3, 113, 0]),
        "one_query": ([1] * 6, [1, 17, 113, 0, 33, 2]),
        "partial": ([1, 63, 65, 0, 17, 33], None),
    }),
    "large": (5504, 10, {  # 43 * 128 rows > 4097 + 1023 + 128 + 113 + 17 + 1
        "mixed": ([1, 17, 0, 113, 128, 1023, 0, 4097], None),
        "lq_lt_lk": ([1, 10, 0, 100, 500, 64, 0, 1000], [5, 17, 3, 113, 1023, 128, 0, 4000]),
        "one_query": ([1] * 10, [1, 17, 113, 128, 1023, 2000, 0, 300, 64, 65]),
        "partial": ([1, 63, 64, 65, 127, 129], None),
    }),
}


def _cu(lens, slots):
    lens = list(lens) + [0] * (slots - len(lens))
    return np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)


def hstu_func(cu_q, cu_k, n, t, rng):
    """Random interval mask ``(1, n, t + 256)``: an F0 prefix and (n-1)/2 intervals, some
    empty, overlapping or reaching past the keys."""
    f = np.zeros((1, n, t + FUNC_PAD), np.int32)
    for b in range(len(cu_q) - 1):
        lq, lk = cu_q[b + 1] - cu_q[b], cu_k[b + 1] - cu_k[b]
        for i in range(lq):
            r, p = cu_q[b] + i, i + lk - lq
            f[0, 0, r] = rng.integers(0, max(p, 0) + 2) if rng.random() < 0.7 else 0
            for t_ in range((n - 1) // 2):
                a = rng.integers(-3, lk + 3)
                f[0, 2 * t_ + 1, r] = a
                f[0, 2 * t_ + 2, r] = a + rng.integers(-5, 300)
    return f


def hstu_inputs(case, profile, seed=0, poison_tail=False):
    """Inputs of one case on the profile's canvas: arrays and the op's keyword options.
    ``poison_tail``: q / do rows past ``cu_seqlens_q[-1]`` and k / v rows past
    ``cu_seqlens_k[-1]`` are NaN (they belong to no sequence and must contribute nothing)."""
    t, slots, lens = HSTU_PROFILES[profile]
    lens_q, lens_k = lens[case.lens]
    lens_k = lens_q if lens_k is None else lens_k
    rng = np.random.default_rng(seed)
    dt = jnp.dtype(case.dtype)
    dv = case.dv or case.d

    def rand(width):
        return jnp.asarray(rng.standard_normal((t, 2, width), dtype=np.float32)).astype(dt)

    q, k, v, do = rand(case.d), rand(case.d), rand(dv), rand(dv)
    cu_q, cu_k = _cu(lens_q, slots), _cu(lens_k, slots)
    if poison_tail:
        tq = (np.arange(t) >= cu_q[-1])[:, None, None]
        tk = (np.arange(t) >= cu_k[-1])[:, None, None]
        q, do = (jnp.where(tq, jnp.nan, x).astype(dt) for x in (q, do))
        k, v = (jnp.where(tk, jnp.nan, x).astype(dt) for x in (k, v))
    func = hstu_func(cu_q, cu_k, case.func_n, t, rng) if case.func_n else None
    max_q, max_k = max(max(lens_q), 1), max(max(lens_k), 1)
    kw = dict(max_seqlen_q=max_q, max_seqlen_k=max_k,
              scaling_seqlen=float(case.scaling or max_q), window_size=tuple(case.window),
              alpha=float(case.alpha or 2.0 / np.sqrt(case.d)))
    return dict(q=q, k=k, v=v, do=do, cu_q=jnp.asarray(cu_q), cu_k=jnp.asarray(cu_k),
                func=None if func is None else jnp.asarray(func), kw=kw)


_FAMILY_ENV = ("JAX_SPARSE_ATTN_KERNEL_FAMILY", "JAX_SPARSE_ATTN_SMEM_LIMIT_KB")


def with_env_family(switches):
    """``switches`` with the kernel family / shared-memory limit of the environment when
    ``JAX_SPARSE_ATTN_KERNEL_FAMILY`` or ``JAX_SPARSE_ATTN_SMEM_LIMIT_KB`` is set (the GPU
    grids then run e.g. the portable family on the H200 whatever switches a test builds)."""
    if switches is None or not any(os.environ.get(v) for v in _FAMILY_ENV):
        return switches
    env = from_env()
    return dataclasses.replace(switches, kernel_family=env.kernel_family,
                               smem_limit_kb=env.smem_limit_kb)


def _call_or_skip(fn, *args):
    """``fn(*args)``; a configuration the kernels cannot run in the (test-lowered) shared
    memory per block skips, any other error propagates."""
    import pytest  # noqa: PLC0415

    try:
        return fn(*args)
    except NotImplementedError as e:
        if "shared memory per block" in str(e):
            pytest.skip(f"not in this shared-memory limit: {e}")
        raise


@functools.lru_cache(maxsize=None)
def _hstu_public(backend, switches, kw_items):
    kw = dict(kw_items)

    def f(q, k, v, do, cu_q, cu_k, func):
        out, vjp = jax.vjp(lambda q, k, v: jsa.hstu_attention(
            q, k, v, cu_q, cu_k, func=func, backend=backend, switches=switches, **kw), q, k, v)
        return (out,) + vjp(do)

    return jax.jit(f)


@functools.lru_cache(maxsize=None)
def _hstu_ref(compute, kw_items):
    """The reference forward and backward, computing in float32 (``compute=None``) or in
    the given dtype."""
    kw = dict(kw_items, compute_dtype=None if compute is None else jnp.dtype(compute))

    def f(q, k, v, do, cu_q, cu_k, func):
        out = reference.hstu_attention_ref(q, k, v, cu_q, cu_k, func, **kw)
        return (out,) + tuple(reference.hstu_attention_bwd_ref(do, q, k, v, cu_q, cu_k, func,
                                                               **kw))

    return jax.jit(f)


class HSTUGrid:
    """The HSTU grid against one backend (see the module docstring)."""

    backend = "reference"
    profile = "small"
    #: extra static keyword arguments of the public op (not of the reference), e.g.
    #: ``(("deterministic", True),)``
    public_kw = ()

    @classmethod
    def grid(cls):
        """``[(case, switches)]`` to run."""
        return [(c, None) for c in HSTU_GRID]

    def truth(self, x):
        """``(out, dq, dk, dv)`` the backend is compared with."""
        raise NotImplementedError

    def baseline(self, case, kw_items, args):
        """The input-dtype computation of ``(out, dq, dk, dv)``."""
        return _hstu_ref(case.dtype, kw_items)(*args)

    def run_case(self, case, switches, seed=0, bwd=True):
        # NaN in every row past the sequences: it must reach no output (the truth reads
        # the same arrays; rows with no contribution are checked to be exactly 0 below)
        x = hstu_inputs(case, self.profile, seed, poison_tail=True)
        kw_items = tuple(sorted(x["kw"].items()))
        args = (x["q"], x["k"], x["v"], x["do"], x["cu_q"], x["cu_k"], x["func"])
        got = _call_or_skip(
            _hstu_public(self.backend, with_env_family(switches), kw_items + self.public_kw),
            *args)
        truth = self.truth(x)
        base = self.baseline(case, kw_items, args)
        report = []
        check_rule("out", got[0], truth[0], base[0], 2.0, 2e-3, report)
        tail = _f32(got[0])[int(x["cu_q"][-1]):]
        assert not np.any(tail), "out rows past cu_seqlens_q[-1] are not zero"
        # query rows with no visible key (and rows past every sequence): out = 0 exactly
        check_unreached(("out",), got[:1], truth[0])
        if bwd:
            for i, name in enumerate(("dq", "dk", "dv"), start=1):
                check_rule(name, got[i], truth[i], base[i], 5.0, 5e-3, report)
            # ... and dq = 0; key rows no query sees (dv = 0 in the truth: also those past
            # cu_seqlens_k[-1]): dk = dv = 0 exactly
            check_unreached(("dq",), got[1:2], truth[0])
            check_unreached(("dk", "dv"), got[2:4], truth[3])
        print(case.id, " | ".join(report))
        return x, got

    def test_hstu_grid(self, case, switches):
        self.run_case(case, switches)

    def test_hstu_remat_matches_plain_grad(self):
        """``jax.checkpoint`` around the op recomputes the same forward: equal gradients."""
        x = hstu_inputs(HSTUCase(64, window=(7, 0)), self.profile, seed=5)

        def loss(q, k, v):
            out = jsa.hstu_attention(q, k, v, x["cu_q"], x["cu_k"], backend=self.backend,
                                     **x["kw"])
            return jnp.sum(out.astype(jnp.float32) * x["do"].astype(jnp.float32))

        plain = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(x["q"], x["k"], x["v"])
        remat = jax.jit(jax.grad(jax.checkpoint(loss), argnums=(0, 1, 2)))(x["q"], x["k"], x["v"])
        for a, b in zip(plain, remat):
            assert np.array_equal(_f32(a), _f32(b)) and np.any(_f32(a))


class HSTUReferenceGrid(HSTUGrid):
    """CI: the reference backend against the float64 oracle. It computes in float32 and
    rounds once, so its baseline is one rounding to the input dtype (this also halves the
    CPU compile time of the grid)."""

    def baseline(self, case, kw_items, args):
        return (case.dtype,) * 4

    def truth(self, x):
        return hstu_oracle_vjp(_f32(x["q"]), _f32(x["k"]), _f32(x["v"]), _f32(x["do"]),
                               x["cu_q"], x["cu_k"], func=x["func"],
                               **{k: v for k, v in x["kw"].items() if k != "max_seqlen_k"})


class HSTUKernelGrid(HSTUGrid):
    """GPU: the kernel backend against the float32 reference."""

    backend = "kernel"
    profile = "large"

    def truth(self, x):
        kw_items = tuple(sorted(x["kw"].items()))
        return _hstu_ref(None, kw_items)(x["q"], x["k"], x["v"], x["do"], x["cu_q"], x["cu_k"],
                                         x["func"])


# ----------------------------------------------------------------------------- BSA


@dataclasses.dataclass(frozen=True)
class BSACase:
    """One BSA grid point. ``counts``: "fixed" (``block_sparse_num``), "var"
    (``q2k_block_nums``) or "empty" (var with empty rows); ``pattern``: "random" unique
    blocks, "causal" (the block lower triangle) or "same" (every query block lists one
    common block); ``sizes_rank``: 0 (no ``block_sizes``) or the rank of ``block_sizes``."""

    name: str
    dtype: str = "bfloat16"
    layout: str = "bhsd"
    blk: int = 64
    hq: int = 4
    hkv: int = 4
    sq: int = 1000
    skv: int = 1025
    d: int = 128
    counts: str = "fixed"
    sizes_rank: int = 0
    pattern: str = "random"
    kmax: int = 4
    b: int = 2

    @property
    def id(self):
        return self.name

    def small(self):
        """The CPU profile: the same case at a few hundred tokens (odd lengths kept odd)."""
        shrink = {1000: 200, 1025: 257, 4096: 383, 4095: 381, 777: 130, 1024: 256,
                  512: 128}
        return dataclasses.replace(self, sq=shrink.get(self.sq, self.sq),
                                   skv=shrink.get(self.skv, self.skv), b=1)


BSA_GRID = [
    BSACase("bf16-bhsd-64-mha-fixed"),
    BSACase("fp16-bshd-128-gqa-var-r3", dtype="float16", layout="bshd", blk=128, hq=8, hkv=2,
            sq=1025, skv=1000, d=64, counts="var", sizes_rank=3),
    BSACase("bf16-bshd-64-gqa-var-r1", layout="bshd", hq=8, hkv=2, sq=63, skv=4096,
            counts="var", sizes_rank=1, kmax=8),
    BSACase("fp16-bhsd-128-mha-fixed-r2", dtype="float16", blk=128, sq=4096, skv=63,
            sizes_rank=2, kmax=1),
    BSACase("bf16-bhsd-128-q1", blk=128, sq=1, skv=1000, counts="var", kmax=8),
    BSACase("fp16-bshd-64-q64-kv1", dtype="float16", layout="bshd", sq=64, skv=1, kmax=1),
    BSACase("bf16-bhsd-64-kv64-r3-gqa", hq=8, hkv=2, sq=1025, skv=64, sizes_rank=3, kmax=1,
            counts="var"),
    BSACase("fp16-bhsd-64-gqa-fixed-r2", dtype="float16", hq=8, hkv=2, sq=4096, skv=1000,
            sizes_rank=2, kmax=6),
    BSACase("bf16-bshd-128-mha-var-4096", layout="bshd", blk=128, sq=4096, skv=1025,
            counts="var", kmax=5),
    BSACase("bf16-bhsd-64-empty-rows", hq=8, hkv=2, counts="empty"),
    BSACase("fp16-bshd-128-empty-rows-r3", dtype="float16", layout="bshd", blk=128, sq=1025,
            skv=4096, counts="empty", sizes_rank=3, kmax=8),
    BSACase("bf16-bhsd-128-block-causal", blk=128, sq=1024, skv=1024, pattern="causal",
            counts="var", kmax=8, b=1),
    BSACase("fp16-bshd-64-block-causal-gqa", dtype="float16", layout="bshd", hq=8, hkv=2,
            sq=1000, skv=1000, pattern="causal", counts="var", kmax=16, b=1),
    BSACase("bf16-bhsd-64-all-same-block", sq=4096, pattern="same", kmax=3, skv=1000),
    BSACase("fp16-bshd-128-all-same-block-gqa-r1", dtype="float16", layout="bshd", blk=128,
            hq=8, hkv=2, sq=4096, pattern="same", sizes_rank=1, kmax=2),
    BSACase("bf16-bshd-64-d32", layout="bshd", d=32, sq=1025, skv=1000, counts="var"),
    BSACase("fp16-bhsd-128-d256-r3", dtype="float16", blk=128, d=256, sizes_rank=3, b=1),
    BSACase("bf16-bshd-64-d256-gqa", layout="bshd", d=256, hq=8, hkv=2, sq=1025, skv=4096,
            counts="var", b=1),
    BSACase("fp16-bhsd-64-d64-var", dtype="float16", d=64, sq=4096, skv=4096, counts="var",
            kmax=16, b=1),
    BSACase("bf16-bhsd-128-d64-r1", blk=128, d=64, sq=63, skv=1025, sizes_rank=1),
    # lists of 32 to 64 slots at blk 64; one lists every KV block, the last one partial
    BSACase("bf16-bhsd-64-wide-gqa-var-r1", hq=8, hkv=2, sq=1025, skv=4096, counts="var",
            sizes_rank=1, kmax=40, b=1),
    BSACase("fp16-bshd-64-every-block-fixed", dtype="float16", layout="bshd", sq=1000,
            skv=4095, kmax=64, b=1),
    BSACase("bf16-bhsd-64-wide-empty-rows-r3", sq=4096, skv=4096, counts="empty",
            sizes_rank=3, kmax=48, b=1),
]


def bsa_inputs(c, seed=0, poison_unseen=False):
    """q, k, v, do in the case's layout and dtype and the metadata in the public forms
    (garbage past the active prefix; ``block_sizes`` of the case's rank). ``poison_unseen``:
    k rows no query row attends (blocks no row of the KV head's group lists, keys past the
    block sizes) are NaN, those v rows +Inf (they must contribute nothing)."""
    rng = np.random.default_rng(seed)
    b, hq, hkv, sq, skv, d, blk = c.b, c.hq, c.hkv, c.sq, c.skv, c.d, c.blk
    nq, nkv = -(-sq // blk), -(-skv // blk)
    kmax = min(c.kmax, nkv) if c.pattern == "random" else c.kmax
    dt = jnp.dtype(c.dtype)

    def t(s, h):
        shape = (b, h, s, d) if c.layout == "bhsd" else (b, s, h, d)
        return jnp.asarray(rng.standard_normal(shape, dtype=np.float32)).astype(dt)

    q, k, v, do = t(sq, hq), t(skv, hkv), t(skv, hkv), t(sq, hq)
    idx = np.empty((b, hq, nq, kmax), np.int32)
    if c.pattern == "random":
        idx[...] = np.argsort(rng.random((b, hq, nq, nkv)), axis=-1)[..., :kmax]
        if c.counts == "fixed":
            nums = np.full((b, hq, nq), kmax, np.int32)
        elif c.counts == "var":
            nums = rng.integers(1, kmax + 1, size=(b, hq, nq)).astype(np.int32)
        else:  # empty rows allowed: about a third of the rows are empty
            nums = rng.integers(0, kmax + 1, size=(b, hq, nq)).astype(np.int32)
            nums[..., 0] = 0
    elif c.pattern == "causal":
        # block-causal lower triangle (bottom-right aligned by block count), all blocks listed
        assert kmax >= nkv, "causal case must list the whole triangle"
        off = nkv - nq
        nums = np.empty((b, hq, nq), np.int32)
        for m in range(nq):
            hi = min(max(m + off, 0), nkv - 1)
            lst = rng.permutation(hi + 1)[:kmax]
            idx[:, :, m, :] = np.concatenate([lst, np.zeros(kmax - len(lst), np.int64)])
            nums[:, :, m] = min(hi + 1, kmax)
    else:  # every query block selects the same KV block (plus others for kmax > 1)
        same = nkv // 2
        for m in range(nq):
            others = [n for n in rng.permutation(nkv) if n != same][: kmax - 1]
            idx[:, :, m, :] = [same] + others + [0] * (kmax - 1 - len(others))
        nums = np.full((b, hq, nq), min(kmax, nkv), np.int32)
    j = np.arange(kmax)[None, None, None, :]
    garbage = rng.choice(np.array([-7, 10**6, nkv, -1], np.int32), size=idx.shape)
    idx = np.where(j < nums[..., None], idx, garbage).astype(np.int32)
    sizes = None
    if c.sizes_rank:
        shape = {1: (nkv,), 2: (b, nkv), 3: (b, hq, nkv)}[c.sizes_rank]
        sizes = rng.integers(1, blk + 1, size=shape).astype(np.int32)
        sizes[..., 0] = blk  # at least one full block
        sizes = jnp.asarray(sizes)
    if poison_unseen:
        # per (batch, KV head, block): the largest size any listing row of the group uses
        full = np.full((b, hq, nkv), blk) if sizes is None else np.broadcast_to(
            np.asarray(sizes).reshape((1, 1, nkv) if c.sizes_rank == 1 else
                                      (b, 1, nkv) if c.sizes_rank == 2 else (b, hq, nkv)),
            (b, hq, nkv))
        reach = np.zeros((b, hkv, nkv), np.int64)
        for bi in range(b):
            for h in range(hq):
                listed = np.unique(idx[bi, h][j[0, 0] < nums[bi, h][:, None]])
                hk = h // (hq // hkv)
                reach[bi, hk, listed] = np.maximum(reach[bi, hk, listed], full[bi, h, listed])
        pos = np.arange(skv)
        seen = (pos % blk)[None, None] < reach[..., pos // blk]  # (B, H_kv, S_kv)
        if c.layout == "bshd":
            seen = np.swapaxes(seen, 1, 2)
        k = jnp.where(seen[..., None], k, jnp.nan).astype(dt)
        v = jnp.where(seen[..., None], v, jnp.inf).astype(dt)
    meta = dict(q2k_block_index=jnp.asarray(idx), block_sizes=sizes)
    if c.counts == "fixed":
        meta["block_sparse_num"] = kmax
    else:
        meta["q2k_block_nums"] = jnp.asarray(nums)
        meta["allow_empty_block_nums"] = c.counts == "empty"
    return dict(q=q, k=k, v=v, do=do, nums=nums, meta=meta,
                kw=dict(layout=c.layout, sparse_block_size=blk,
                        softmax_scale=float(0.7 / np.sqrt(d))))


def check_bsa_garbage_clamped(q, k, v, idx, nums, sizes, num_kv_blocks, poison=False, **kw):
    """The public block-sparse forward (``kw``: its options) on metadata outside the
    contract gives exactly the result of the same metadata clamped by
    ``metadata.sanitize_bsa_metadata``, and no NaN; ``poison``: a preceding all-NaN run
    fills the output buffers first."""
    from jax_sparse_attn.metadata import sanitize_bsa_metadata  # noqa: PLC0415

    f = jax.jit(lambda q, k, v, i, n, s: tuple(
        jsa.block_sparse_attention_forward(q, k, v, i, None, s, n, **kw)))
    if poison:
        nan = jnp.full_like(q, jnp.nan)
        kn = jnp.full_like(k, jnp.nan)
        jax.block_until_ready(f(nan, kn, kn, idx, nums, sizes))
    got = f(q, k, v, idx, nums, sizes)
    want = f(q, k, v, *sanitize_bsa_metadata(idx, nums, sizes, num_kv_blocks=num_kv_blocks,
                                             block_size=kw["sparse_block_size"]))
    for g, w in zip(got, want):
        g, w = np.asarray(g, np.float32), np.asarray(w, np.float32)
        assert not np.isnan(g).any()
        np.testing.assert_array_equal(g, w)


def bsa_fwd_vjp(idx, **kw):
    """A jitted ``f(q, k, v, do) -> (out, lse, dq, dk, dv)``: the public block-sparse forward
    (out and lse) and the VJP of the op, both with the metadata ``idx`` and keywords ``kw``."""

    def f(q, k, v, do):
        out, lse = jsa.block_sparse_attention_forward(q, k, v, idx, **kw)
        _, vjp = jax.vjp(lambda q, k, v: jsa.block_sparse_attention(q, k, v, idx, **kw), q, k, v)
        return (out, lse) + vjp(do)

    return jax.jit(f)


@functools.lru_cache(maxsize=None)
def _bsa_public(backend, switches, static_items):
    static = dict(static_items)

    def f(q, k, v, do, idx, sizes, nums):
        kw = dict(static, backend=backend, switches=switches, block_sizes=sizes,
                  q2k_block_nums=nums)
        return bsa_fwd_vjp(idx, **kw)(q, k, v, do)

    return jax.jit(f)


@functools.lru_cache(maxsize=None)
def _bsa_ref(compute, kw_items):
    kw = dict(kw_items, compute_dtype=None if compute is None else jnp.dtype(compute))

    def f(q, k, v, do, idx, nums, sizes):
        out, lse = reference.block_sparse_attention_ref(q, k, v, idx, nums, sizes, **kw)
        return (out, lse) + tuple(reference.block_sparse_attention_bwd_ref(
            do, q, k, v, out, lse, idx, nums, sizes, **kw))

    return jax.jit(f)


def _bsa_normalized(x):
    m = x["meta"]
    return normalize_bsa_metadata(m["q2k_block_index"], m.get("block_sparse_num"),
                                  m["block_sizes"], m.get("q2k_block_nums"))


def _rows_bhs(x, layout):
    return x if layout == "bhsd" else np.swapaxes(x, 1, 2)


class BSAGrid:
    """The BSA grid against one backend (see the module docstring)."""

    backend = "reference"

    @classmethod
    def grid(cls):
        return [(c.small(), None) for c in BSA_GRID]

    def truth(self, case, x):
        """``(out, lse, dq, dk, dv)`` the backend is compared with."""
        raise NotImplementedError

    def baseline(self, case, x):
        """The input-dtype computation of ``(out, lse, dq, dk, dv)``."""
        idx, nums, sizes = _bsa_normalized(x)
        return _bsa_ref(case.dtype, tuple(sorted(x["kw"].items())))(
            x["q"], x["k"], x["v"], x["do"], idx, nums, sizes)

    def run_case(self, case, switches, seed=0):
        # NaN / Inf in every K / V row no query row attends: the truth reads the same
        # arrays; out / dq / dk / dv rows with no contribution are checked to be exactly 0
        x = bsa_inputs(case, seed, poison_unseen=True)
        m = x["meta"]
        static = dict(x["kw"], block_sparse_num=m.get("block_sparse_num"),
                      allow_empty_block_nums=m.get("allow_empty_block_nums", False))
        got = _call_or_skip(
            _bsa_public(self.backend, with_env_family(switches), tuple(sorted(static.items()))),
            x["q"], x["k"], x["v"], x["do"], m["q2k_block_index"], m["block_sizes"],
            m.get("q2k_block_nums"))
        truth = self.truth(case, x)
        base = self.baseline(case, x)
        report = []
        check_rule("out", got[0], truth[0], base[0], 2.0, 2e-3, report)
        lse_g, lse_t = _f32(got[1]), np.asarray(truth[1], np.float64)
        assert not np.isnan(lse_g).any(), "lse: NaN"
        assert np.array_equal(np.isneginf(lse_g), np.isneginf(lse_t)), "lse -inf pattern differs"
        fin = np.isfinite(lse_t)
        base_lse = base[1] if isinstance(base[1], str) else _f32(base[1])[fin]
        check_rule("lse", lse_g[fin], lse_t[fin], base_lse, 2.0, 1e-4, report)
        for i, name in enumerate(("dq", "dk", "dv"), start=2):
            check_rule(name, got[i], truth[i], base[i], 5.0, 5e-3, report)
        # rows no listed key reaches (out = 0 in the truth): out = dq = 0 exactly; keys no
        # row lists (or past block_sizes; dv = 0 in the truth): dk = dv = 0 exactly
        check_unreached(("out", "dq"), (got[0], got[2]), truth[0])
        check_unreached(("dk", "dv"), (got[3], got[4]), truth[4])
        if case.counts == "empty":
            empty = np.repeat(x["nums"] == 0, case.blk, axis=-1)[..., : case.sq]  # (B, H, S)
            assert empty.any()
            assert np.all(_rows_bhs(_f32(got[0]), case.layout)[empty] == 0)
            assert np.all(np.isneginf(lse_g[empty]))
            assert np.all(_rows_bhs(_f32(got[2]), case.layout)[empty] == 0)
        print(case.id, " | ".join(report))
        return x, got

    def test_bsa_grid(self, case, switches):
        self.run_case(case, switches)


class BSAReferenceGrid(BSAGrid):
    """CI: the reference backend against the float64 oracle (baseline: one rounding to
    the input dtype, as for :class:`HSTUReferenceGrid`; lse is float32)."""

    def baseline(self, case, x):
        return (case.dtype, "float32", case.dtype, case.dtype, case.dtype)

    def truth(self, case, x):
        # the metadata as the user passes them, read by the oracle itself (not through the
        # package's normalize_bsa_metadata, which the op under test also uses): a fixed
        # block_sparse_num is that many blocks in every row
        m = x["meta"]
        idx = np.asarray(m["q2k_block_index"])
        if m.get("block_sparse_num") is not None:
            nums = np.full(idx.shape[:3], m["block_sparse_num"], np.int32)
        else:
            nums = np.asarray(m["q2k_block_nums"])
        sizes = m["block_sizes"]
        n_kv = -(-case.skv // case.blk)
        sizes = broadcast_sizes(None if sizes is None else np.asarray(sizes), case.b, case.hq,
                                n_kv)
        return bsa_oracle_vjp(_f32(x["q"]), _f32(x["k"]), _f32(x["v"]), _f32(x["do"]),
                              np.asarray(idx), np.asarray(nums), sizes, blk=case.blk,
                              softmax_scale=x["kw"]["softmax_scale"], layout=case.layout)


class BSAKernelGrid(BSAGrid):
    """GPU: the kernel backend against the float32 reference."""

    backend = "kernel"

    def truth(self, case, x):
        idx, nums, sizes = _bsa_normalized(x)
        f32 = [x[n].astype(jnp.float32) for n in ("q", "k", "v", "do")]
        return _bsa_ref(None, tuple(sorted(x["kw"].items())))(*f32, idx, nums, sizes)
