"""GPU tests: the kernels on tensors of more than 2**31 elements (64-bit addressing).

Each ``gpu`` test below runs the public ops on the kernel backend with at least one tensor
of more than ``2**31`` elements, so any 32-bit element offset computed inside a kernel
(row * stride, a head or batch offset, a workspace index) overflows there. The float32
reference cannot run on the whole problem, so each test compares, with the rule of the
other GPU tests (``tests/attention_base.py``: kernel error vs the float32 reference <= 2x
(forward, lse) / 5x (backward) the error of the same computation in bfloat16 on the same
slice, plus a small atol; NaN never passes), the part of the outputs whose element offsets
lie past ``2**31`` (and, as a control, a part near offset 0) against the reference run on
just that part:

* HSTU (THD varlen layout): the sequences are independent, so the selected sequences are
  sliced out by ``cu_seqlens`` (q, k, v, the cotangent and, with rab, the bias rows) and
  packed into a small batch for the reference. Selected: the first sequence, the
  sequence(s) holding element offsets ``2**31 - 1`` and ``2**31`` (of q, or of rab in the
  rab tests) and the last six sequences (odd lengths and a zero-length one);
* BSA: the heads are independent, so the reference runs on one KV head's group of query
  heads (q, do, out, lse and the block lists of those query heads; k, v of the KV head):
  the first and the last group. In ``bhsd`` the last head starts at element ``2**31``
  exactly (17 heads of ``2**27`` elements); in ``bshd`` the last query blocks of every
  head lie past it.

On the whole tensors (cheap device reductions): no NaN in any output, rows past
``cu_seqlens[-1]`` exactly 0 (HSTU; the input rows there are NaN-poisoned) and a finite
lse everywhere (BSA: every row lists four blocks). Before each kernel call the allocator
is handed NaN-filled buffers of the outputs' sizes (then freed), so that elements a kernel
leaves unwritten (e.g. a store that wrapped to a lower address) likely read as NaN. A
failure message names the worst element's global index and element offset (past
``2**31`` or not), which tells an overflow from a plain numerical error.

Inputs are generated on the device (``jax.random`` in chunks written into a donated
buffer: no host-to-device copy of the big tensors, no second copy). Every test needs at
least ``LARGE_TEST_MIN_FREE_GB`` (default 100) GB of free device memory in this process's
allocator (``memory_stats``: ``bytes_limit - bytes_in_use``; JAX preallocates 75% of the
H200 by default, about 104 GiB) and skips otherwise; their peaks are about 25 to 46 GB
(docstrings). A test's device arrays are freed before its result is reported (an
exception inside it is turned into text, so pytest's saved traceback holds no tens of GB
into the next test).

Run on the H200::

    JAX_SPARSE_ATTN_GPU_TEST_TIMEOUT=900 \
        python3 -m pytest -m gpu -q -rA tests/test_gpu_large_tensors.py
    python3 -m pytest -m gpu -q -rA tests/test_gpu_large_tensors.py -k "bsa and bhsd"

One process per test is safest: a kernel that computes a wrapped 32-bit offset most
likely faults with an illegal address, and the CUDA context is then unusable for the
tests after it in the same process::

    for t in $(python3 -m pytest -m gpu -q --collect-only tests/test_gpu_large_tensors.py \
               | grep ::); do python3 -m pytest -q -rA "$t"; done

All the tests have ``large`` in their names (``-k large`` / ``-k "not large"``) and are
marked ``slow`` as well as ``gpu``. The kernel implementations are those of the
``JAX_SPARSE_ATTN_*`` switch variables (``switches=None``), so e.g.
``JAX_SPARSE_ATTN_HSTU_BWD_IMPL=sm80`` or ``JAX_SPARSE_ATTN_BSA_FWD_IMPL=sm80`` runs the
same checks on the other kernels. ``test_large_plan_*`` (not ``gpu``) run the same code on
tiny sizes on the reference backend (CPU, a few seconds): they check the slicing, packing
and comparison logic, with a small stand-in for ``2**31``.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import math
import os
import time
import traceback

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402

import jax_sparse_attn as jsa  # noqa: E402
from jax_sparse_attn import reference  # noqa: E402

BOUNDARY = 2**31
BF16 = jnp.bfloat16
#: elements of one random chunk (its float32 temporaries: 1 GiB each)
CHUNK_ELEMS = 1 << 28
MIN_FREE_GB = float(os.environ.get("LARGE_TEST_MIN_FREE_GB", "100"))


# ----------------------------------------------------------------------------- helpers


def _mem_stats():
    try:
        return jax.devices()[0].memory_stats()
    except Exception:  # pragma: no cover - backends without memory_stats
        return None


@pytest.fixture
def large_device_memory():
    """Skip unless the device allocator has ``LARGE_TEST_MIN_FREE_GB`` free (checked after
    a garbage collection, so arrays left by an earlier test are counted only while they
    are alive); prints the test's time and the process's peak device memory."""
    gc.collect()
    stats = _mem_stats()
    if stats and "bytes_limit" in stats:
        free = stats["bytes_limit"] - stats.get("bytes_in_use", 0)
        if free < MIN_FREE_GB * 1e9:
            pytest.skip(f"needs {MIN_FREE_GB:.0f} GB of free device memory "
                        f"(LARGE_TEST_MIN_FREE_GB), the allocator has {free / 1e9:.1f} GB free "
                        f"of {stats['bytes_limit'] / 1e9:.1f} GB")
    t0 = time.perf_counter()
    yield
    gc.collect()
    stats = _mem_stats() or {}
    peak = stats.get("peak_bytes_in_use")
    print(f"[large] test time {time.perf_counter() - t0:.1f} s"
          + (f", process peak device memory {peak / 1e9:.1f} GB" if peak else "")
          + (f", in use after the test {stats['bytes_in_use'] / 1e9:.2f} GB"
             if "bytes_in_use" in stats else ""))


def _gpu_large(f):
    """The marks of the device tests: gpu, slow, the memory gate."""
    for mark in (pytest.mark.usefixtures("large_device_memory"), pytest.mark.slow,
                 pytest.mark.gpu):
        f = mark(f)
    return f


def _isolated(fn, *args):
    """``(fn(*args), None)``, or ``(None, traceback text)`` if it raised: the exception is
    dropped inside this frame, so no saved traceback keeps ``fn``'s device arrays alive."""
    try:
        return fn(*args), None
    except Exception:
        return None, traceback.format_exc()


def _finish(result, err):
    """Print the report; fail with the traceback text or the collected failures."""
    gc.collect()
    if err is not None:
        pytest.fail(f"raised:\n{err}", pytrace=False)
    report, failures = result
    print("\n".join(report))
    if failures:
        pytest.fail(f"{len(failures)} check(s) failed:\n" + "\n".join(failures)
                    + "\n--- report ---\n" + "\n".join(report), pytrace=False)


@functools.partial(jax.jit, static_argnames=("rows", "axis"), donate_argnums=(0,))
def _fill_chunk(buf, key, start, *, rows, axis):
    shape = list(buf.shape)
    shape[axis] = rows
    x = jax.random.normal(key, tuple(shape), jnp.float32).astype(buf.dtype)
    return lax.dynamic_update_slice_in_dim(buf, x, start, axis)


def _randn(key, shape, dtype=BF16):
    """Standard normal ``shape`` array generated on the device in chunks along its longest
    axis, written in place into one buffer (chunk temporaries of at most
    :data:`CHUNK_ELEMS` float32 elements; the last chunk overlaps the one before)."""
    axis = int(np.argmax(shape))
    n = shape[axis]
    per_row = max(1, math.prod(shape) // max(n, 1))
    rows = max(1, min(n, CHUNK_ELEMS // per_row))
    buf = jnp.zeros(shape, dtype)
    for i, start in enumerate(range(0, n, rows)):
        start = min(start, n - rows)
        buf = _fill_chunk(buf, jax.random.fold_in(key, i), jnp.int32(start), rows=rows,
                          axis=axis)
    return buf


@functools.partial(jax.jit, static_argnames=("rows",), donate_argnums=(0,))
def _nan_rows(x, start, *, rows):
    """``x`` with rows ``[start, start + rows)`` of axis 0 set to NaN (in place)."""
    tail = jnp.full((rows,) + x.shape[1:], jnp.nan, x.dtype)
    return lax.dynamic_update_slice_in_dim(x, tail, start, 0)


def _poison(*shapes_dtypes):
    """Hand the allocator NaN-filled buffers of these sizes, then free them (the next
    allocations of those sizes likely reuse them: unwritten output elements read NaN)."""
    bufs = [jnp.full(s, jnp.nan, d) for s, d in shapes_dtypes]
    for b in bufs:
        b.block_until_ready()
    del bufs


@jax.jit
def _any_nan(x):
    return jnp.isnan(x).any()


@jax.jit
def _any_nonzero(x):
    return (x != 0).any()


@jax.jit
def _err_stats(got, truth, base):
    """Device-side statistics of the rule: max |got - truth| (NaN counts as inf), where,
    max |base - truth|, max |truth|, number of NaN in got; elements where the truth is not
    finite (lse = -inf) are left out and must be equal in got."""
    g, t, b = (x.astype(jnp.float32) for x in (got, truth, base))
    fin = jnp.isfinite(t)
    d = jnp.where(fin, jnp.abs(g - t), jnp.where(g == t, 0.0, jnp.inf))
    d = jnp.where(jnp.isnan(d), jnp.inf, d).reshape(-1)
    bd = jnp.where(fin, jnp.abs(b - t), 0.0)
    return (jnp.max(d), jnp.argmax(d), jnp.max(jnp.where(jnp.isnan(bd), 0.0, bd)),
            jnp.max(jnp.where(fin, jnp.abs(t), 0.0)), jnp.sum(jnp.isnan(g)))


def _check(name, got, truth, base, factor, rel_atol, locate, report, failures):
    """The rule ``err <= factor * base + rel_atol * max|truth|`` on device arrays;
    ``locate(flat index) -> str`` describes the worst element."""
    assert got.shape == truth.shape == base.shape, (name, got.shape, truth.shape, base.shape)
    if got.size == 0:
        report.append(f"  {name}: empty")
        return
    err, arg, berr, scale, nans = (x.item() for x in _err_stats(got, truth, base))
    atol = rel_atol * max(scale, 1e-3)
    ok = nans == 0 and err <= factor * berr + atol
    report.append(f"  {name}: err={err:.2e} base={berr:.2e} max|truth|={scale:.2e}"
                  + ("" if ok else "  <-- FAIL"))
    if not ok:
        failures.append(f"{name}: err {err:.3e} > {factor} x base {berr:.3e} + atol {atol:.3e}; "
                        f"{nans} NaN; worst at {locate(int(arg))}")


def _offset_note(offset, boundary):
    return f"element offset {offset} ({'past' if offset >= boundary else 'below'} {boundary})"


def _timed(report, what, fn):
    t0 = time.perf_counter()
    out = fn()
    jax.block_until_ready(out)
    report.append(f"{what}: {time.perf_counter() - t0:.2f} s (first call: compiles included)")
    return out


# ----------------------------------------------------------------------------- HSTU


@dataclasses.dataclass(frozen=True)
class HSTUPlan:
    """Sizes of an HSTU case: ``n_seq`` sequences of ``seqlen`` tokens (causal), the second
    one ``second_len`` long (so that a sequence straddles the boundary row), the last ones
    ``tail_lens``; ``pad_rows`` NaN-poisoned rows after the last sequence; ``h_rab``: rab
    ``(n_seq, h_rab, seqlen, seqlen)`` (0: none); ``boundary``: the element offset the
    checked sequences must reach past (``2**31``; small in the CPU plans)."""

    h: int = 4
    d: int = 128
    n_seq: int = 4400
    seqlen: int = 1024
    second_len: int = 777
    tail_lens: tuple = (1023, 0, 513, 1, 1024, 999)
    pad_rows: int = 200
    h_rab: int = 0
    bwd: bool = True
    boundary: int = BOUNDARY
    seed: int = 0

    def lengths(self):
        lens = np.full(self.n_seq, self.seqlen, np.int64)
        lens[1] = self.second_len
        lens[self.n_seq - len(self.tail_lens):] = self.tail_lens
        assert lens.max() <= self.seqlen
        return lens

    def selection(self, cu):
        """The checked sequences: the first, those holding element offsets ``boundary - 1``
        and ``boundary`` of q (and of rab), the last ``len(tail_lens)``."""
        hd = self.h * self.d
        n = int(cu[-1])
        picks = {0} | set(range(self.n_seq - len(self.tail_lens), self.n_seq))
        for e in (self.boundary - 1, self.boundary):
            if e // hd < n:
                picks.add(int(np.searchsorted(cu, e // hd, side="right")) - 1)
            if self.h_rab:
                b = e // (self.h_rab * self.seqlen ** 2)
                if b < self.n_seq:
                    picks.add(int(b))
        return sorted(picks)


def run_hstu(plan: HSTUPlan, backend: str):
    """The HSTU forward (and backward) on ``backend`` for ``plan``, checked on the selected
    sequences against the reference. Returns ``(report lines, failures)``."""
    report, failures = [], []
    lens = plan.lengths()
    cu_np = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    n = int(cu_np[-1])
    t = n + plan.pad_rows
    h, d, L = plan.h, plan.d, plan.seqlen
    hd = h * d
    sel = plan.selection(cu_np)
    sel_lens = lens[sel]
    rows_np = np.concatenate([np.arange(cu_np[s], cu_np[s + 1]) for s in sel]).astype(np.int32)
    # the checked part must reach past the boundary, the tensors must exceed it
    reach = max(int(cu_np[s + 1]) * hd for s in sel)
    rab_elems = plan.n_seq * plan.h_rab * L * L
    if plan.h_rab:
        assert rab_elems > plan.boundary and (max(sel) + 1) * plan.h_rab * L * L > plan.boundary
    else:
        assert t * hd > plan.boundary and reach > plan.boundary, (t * hd, reach)
    report.append(f"HSTU {backend}: T={t} (sum of lengths {n}), H={h}, D={d}, {plan.n_seq} "
                  f"sequences (max {L}), q/k/v {t * hd} elements ({t * hd / plan.boundary:.3f} "
                  f"x boundary {plan.boundary})"
                  + (f", rab ({plan.n_seq}, {plan.h_rab}, {L}, {L}) = {rab_elems} elements "
                     f"({rab_elems / plan.boundary:.3f} x boundary)" if plan.h_rab else ""))
    report.append("checked sequences: " + ", ".join(
        f"{s} (len {lens[s]}, rows {cu_np[s]}..{cu_np[s + 1]}, elements up to "
        f"{cu_np[s + 1] * hd})" for s in sel))

    cu = jnp.asarray(cu_np.astype(np.int32))
    keys = jax.random.split(jax.random.PRNGKey(plan.seed), 5)
    q, k, v, do = (_nan_rows(_randn(kk, (t, h, d)), jnp.int32(n), rows=plan.pad_rows)
                   if plan.pad_rows else _randn(kk, (t, h, d)) for kk in keys[:4])
    rab = _randn(keys[4], (plan.n_seq, plan.h_rab, L, L)) if plan.h_rab else None
    kw = dict(max_seqlen_q=L, max_seqlen_k=L, scaling_seqlen=float(L), window_size=(-1, 0),
              alpha=float(1.0 / np.sqrt(d)))
    rows = jnp.asarray(rows_np)
    b_sel = jnp.asarray(np.asarray(sel, np.int32))
    cu_sel = jnp.asarray(np.concatenate([[0], np.cumsum(sel_lens)]).astype(np.int32))

    def take(x):
        return None if x is None else jnp.take(x, rows, axis=0)

    q_s, k_s, v_s, do_s = (take(x) for x in (q, k, v, do))
    rab_s = None if rab is None else jnp.take(rab, b_sel, axis=0)

    def locate_rows(shape):
        def loc(i):
            r, hh, dd = np.unravel_index(i, shape)
            g = int(rows_np[r])
            s = int(np.searchsorted(cu_np, g, side="right")) - 1
            return (f"row {g} (sequence {s}, local row {g - cu_np[s]}), head {hh}, dim {dd}: "
                    + _offset_note((g * h + int(hh)) * d + int(dd), plan.boundary))
        return loc

    def locate_rab(shape):
        def loc(i):
            bi, hh, p, j = (int(x) for x in np.unravel_index(i, shape))
            b = sel[bi]
            off = ((b * plan.h_rab + hh) * L + p) * L + j
            return f"rab[{b}, {hh}, {p}, {j}]: " + _offset_note(off, plan.boundary)
        return loc

    def ref_in(dtype):
        xs = [x.astype(dtype) for x in (q_s, k_s, v_s, do_s)]
        return xs + [None if rab_s is None else rab_s.astype(dtype)]

    # ---- forward
    _poison(((t, h, d), BF16))
    out = _timed(report, "forward", lambda: jsa.hstu_attention(
        q, k, v, cu, cu, backend=backend, rab=rab, **kw))
    if bool(_any_nan(out)):
        failures.append("forward: NaN in the full output")
    if plan.pad_rows and bool(_any_nonzero(out[n:])):
        failures.append("forward: output rows past cu_seqlens[-1] are not zero")
    out_s = take(out)
    del out
    results = {}
    for name, cdt in (("truth", None), ("base", BF16)):
        qq, kk, vv, _, rr = ref_in(jnp.float32 if cdt is None else BF16)
        results[name] = reference.hstu_attention_ref(qq, kk, vv, cu_sel, cu_sel, None, rab=rr,
                                                     compute_dtype=cdt, **kw)
    report.append("forward checks (selected sequences vs the reference on them):")
    _check("out", out_s, results["truth"], results["base"], 2.0, 2e-3,
           locate_rows(out_s.shape), report, failures)
    del out_s, results
    if not plan.bwd:
        return report, failures

    # ---- backward (gradients of sum(out * do))
    _poison(((t, h, d), BF16), ((t, h, d), BF16), ((t, h, d), BF16), ((t, h, d), jnp.float32))
    if rab is not None:
        _poison((rab.shape, rab.dtype), (rab.shape, jnp.float32))
    grads = _timed(report, "backward", lambda: tuple(jsa.hstu_attention_backward(
        do, q, k, v, cu, cu, backend=backend, rab=rab, **kw)))
    del q, k, v, do
    names = ("dq", "dk", "dv", "drab")[:len(grads)]
    for name, g in zip(names, grads):
        if bool(_any_nan(g)):
            failures.append(f"backward: NaN in the full {name}")
        if name != "drab" and plan.pad_rows and bool(_any_nonzero(g[n:])):
            failures.append(f"backward: {name} rows past cu_seqlens[-1] are not zero")
    got = [take(g) for g in grads[:3]]
    if rab is not None:
        got.append(jnp.take(grads[3], b_sel, axis=0))
    del grads
    refs = {}
    for name, cdt in (("truth", None), ("base", BF16)):
        qq, kk, vv, dd, rr = ref_in(jnp.float32 if cdt is None else BF16)
        refs[name] = tuple(reference.hstu_attention_bwd_ref(dd, qq, kk, vv, cu_sel, cu_sel, None,
                                                             rab=rr, compute_dtype=cdt, **kw))
    report.append("backward checks (selected sequences vs the reference on them):")
    for i, name in enumerate(names):
        loc = locate_rab(got[i].shape) if name == "drab" else locate_rows(got[i].shape)
        _check(name, got[i], refs["truth"][i], refs["base"][i], 5.0, 5e-3, loc, report,
               failures)
    return report, failures


#: case 1: q/k/v/do/out/dq/dk/dv of T = 4_504_621 rows x 4 heads x 128 = 2.306e9 elements
HSTU_LARGE = HSTUPlan()
#: case 2: rab of 2.26e9 elements (q/k/v below 2**31): per head (540 sequences) and shared
#: by the heads (2160 sequences)
HSTU_RAB_LARGE = {
    "hrab4": HSTUPlan(n_seq=540, h_rab=4),
    "hrab1": HSTUPlan(n_seq=2160, h_rab=1),
}


@_gpu_large
def test_large_hstu_fwd_bwd():
    """HSTU forward and backward with q, k, v, dout, out, dq, dk, dv of 2.31e9 elements each
    (4400 causal sequences of up to 1024 tokens, H = 4, D = 128, bf16; the dq fp32
    workspace 2.31e9 elements): the first sequence, the sequence straddling element offset
    2**31 and the last six (lengths 1023, 0, 513, 1, 1024, 999, all past 2**31) match the
    reference on those sequences; no NaN anywhere; rows past cu_seqlens[-1] (NaN inputs)
    are zero. Proves the forward and backward kernels' q/k/v/out/dq/dk/dv addressing (and
    the dq workspace's) is 64-bit safe. Inputs, out and gradients (4.6 GB each) and
    the 9.2 GB fp32 dq workspace: about 46 GB of device memory; tens of seconds, mostly
    kernel and reference compiles."""
    _finish(*_isolated(run_hstu, HSTU_LARGE, "kernel"))


@_gpu_large
@pytest.mark.parametrize("which", list(HSTU_RAB_LARGE))
def test_large_hstu_rab(which):
    """HSTU forward and backward with a relative attention bias rab of 2.26e9 elements
    (hrab4: 540 sequences x H_rab = H = 4 x 1024 x 1024, drab stored directly; hrab1: 2160
    sequences x H_rab = 1, drab summed over heads in an fp32 workspace of 2.26e9
    elements): out, dq, dk, dv and drab of the first sequence, of the sequences whose rab
    blocks straddle element offset 2**31 and of the last six (past it) match the reference
    on those sequences; no NaN anywhere. Proves the rab reads of both forwards' score tiles
    and the backward's drab writes are 64-bit safe (the rab backward runs the sm80 kernel:
    the sm90 one takes no rab). About 25 (hrab4) / 40 (hrab1) GB of device memory; tens
    of seconds."""
    _finish(*_isolated(run_hstu, HSTU_RAB_LARGE[which], "kernel"))


# ----------------------------------------------------------------------------- BSA


@dataclasses.dataclass(frozen=True)
class BSAPlan:
    """Sizes of a BSA case: ``B = 1``, ``hq`` query / ``hkv`` KV heads of ``s`` tokens,
    D = ``d``, ``k_listed`` random distinct blocks per query block (the diagonal one among
    them, in random order); the checked KV heads' groups: ``check_kv_heads``."""

    hq: int = 17
    hkv: int = 17
    s: int = 1 << 20
    d: int = 128
    blk: int = 128
    k_listed: int = 4
    layout: str = "bhsd"
    bwd: bool = True
    check_kv_heads: tuple = (0, -1)
    boundary: int = BOUNDARY
    seed: int = 0

    def block_lists(self):
        """int32 ``(1, hq, N, k_listed)``: block m lists m and ``k_listed - 1`` other
        distinct random blocks, shuffled."""
        rng = np.random.default_rng(self.seed)
        n = -(-self.s // self.blk)
        assert 1 <= self.k_listed <= n
        rows = self.hq * n
        m = np.tile(np.arange(n), self.hq)
        r = rng.integers(1, n, size=(rows, self.k_listed - 1)) if n > 1 else \
            np.zeros((rows, 0), np.int64)
        while True:  # redraw the rows with a repeated offset
            srt = np.sort(r, axis=1)
            bad = (srt[:, 1:] == srt[:, :-1]).any(axis=1)
            if not bad.any():
                break
            r[bad] = rng.integers(1, n, size=(int(bad.sum()), self.k_listed - 1))
        lst = np.concatenate([m[:, None], (m[:, None] + r) % n], axis=1)
        order = np.argsort(rng.random(lst.shape), axis=1)
        lst = np.take_along_axis(lst, order, axis=1)
        return lst.reshape(1, self.hq, n, self.k_listed).astype(np.int32)


def run_bsa(plan: BSAPlan, backend: str):
    """The BSA forward (and backward) on ``backend`` for ``plan``, checked on the groups of
    ``plan.check_kv_heads`` against the reference on those heads alone. Returns
    ``(report lines, failures)``."""
    report, failures = [], []
    hq, hkv, s, d, blk, kl = plan.hq, plan.hkv, plan.s, plan.d, plan.blk, plan.k_listed
    r = hq // hkv
    bhsd = plan.layout == "bhsd"
    n = -(-s // blk)
    q_shape = (1, hq, s, d) if bhsd else (1, s, hq, d)
    kv_shape = (1, hkv, s, d) if bhsd else (1, s, hkv, d)
    q_elems = math.prod(q_shape)
    assert q_elems > plan.boundary, (q_elems, plan.boundary)
    report.append(f"BSA {backend} {plan.layout}: B=1, H_q={hq}, H_kv={hkv}, S={s}, D={d}, "
                  f"blk={blk} (N={n}), {kl} listed blocks per query block; q {q_elems} "
                  f"elements ({q_elems / plan.boundary:.3f} x boundary {plan.boundary}), "
                  f"k/v {math.prod(kv_shape)}")
    idx_np = plan.block_lists()
    idx = jnp.asarray(idx_np)
    keys = jax.random.split(jax.random.PRNGKey(plan.seed), 4)
    q, do = _randn(keys[0], q_shape), _randn(keys[3], q_shape)
    k, v = _randn(keys[1], kv_shape), _randn(keys[2], kv_shape)
    scale = float(1.0 / np.sqrt(d))
    kw = dict(block_sparse_num=kl, sparse_block_size=blk, softmax_scale=scale,
              layout=plan.layout, backend=backend)
    ref_kw = dict(sparse_block_size=blk, softmax_scale=scale, layout=plan.layout)
    groups = sorted({g % hkv for g in plan.check_kv_heads})
    hax = 1 if bhsd else 2  # head axis of q/k/v/out/grads

    def heads(x, lo, hi, axis=hax):
        return lax.slice_in_dim(x, lo, hi, axis=axis)

    def locate(shape, h0, n_heads, kind):
        """kind "q": (1, heads, S, D) / (1, S, heads, D) slices of q-like tensors; "kv": of
        k-like; "lse": (1, heads, S)."""
        def loc(i):
            idx_ = [int(x) for x in np.unravel_index(i, shape)]
            if kind == "lse":
                _, hh, row = idx_
                return f"lse[0, {h0 + hh}, {row}] (query block {row // blk})"
            if bhsd:
                _, hh, row, dd = idx_
            else:
                _, row, hh, dd = idx_
            hg = h0 + hh
            off = ((hg * s + row) * d + dd) if bhsd else ((row * n_heads + hg) * d + dd)
            return (f"{'q' if kind == 'q' else 'kv'} head {hg}, row {row} (block {row // blk}), "
                    f"dim {dd}: " + _offset_note(off, plan.boundary))
        return loc

    for g in groups:
        h0 = g * r
        report.append(f"checked: KV head {g}, query heads {h0}..{h0 + r - 1}: q elements "
                      + (f"{h0 * s * d}..{(h0 + r) * s * d}" if bhsd else
                         f"up to {((s - 1) * hq + h0 + r) * d} (rows interleaved)"))

    # ---- forward
    out_shape = q_shape
    _poison((out_shape, BF16), ((1, hq, s), jnp.float32))
    out, lse = _timed(report, "forward", lambda: tuple(jsa.block_sparse_attention_forward(
        q, k, v, idx, **kw)))
    if bool(_any_nan(out)):
        failures.append("forward: NaN in the full output")
    if not bool(jnp.isfinite(lse).all()):
        failures.append("forward: lse not finite everywhere (every row lists blocks)")
    grads = None
    if plan.bwd:
        _poison((q_shape, BF16), (kv_shape, BF16), (kv_shape, BF16), (q_shape, jnp.float32))
        grads = _timed(report, "backward", lambda: tuple(jsa.block_sparse_attention_backward(
            do, q, k, v, out, lse, idx, **kw)))
        for name, x in zip(("dq", "dk", "dv"), grads):
            if bool(_any_nan(x)):
                failures.append(f"backward: NaN in the full {name}")

    # ---- checks per group, against the reference on the group alone
    for g in groups:
        h0, h1 = g * r, (g + 1) * r
        qs, dos, outs = (heads(x, h0, h1) for x in (q, do, out))
        ks, vs = heads(k, g, g + 1), heads(v, g, g + 1)
        lses = heads(lse, h0, h1, axis=1)
        idx_s = idx[:, h0:h1]
        nums = jnp.full(idx_s.shape[:3], kl, jnp.int32)
        refs = {}
        for name, cdt in (("truth", None), ("base", BF16)):
            dt = jnp.float32 if cdt is None else BF16
            qq, kk, vv, dd = (x.astype(dt) for x in (qs, ks, vs, dos))
            o_r, l_r = reference.block_sparse_attention_ref(qq, kk, vv, idx_s, nums, None,
                                                            compute_dtype=cdt, **ref_kw)
            gr = ()
            if plan.bwd:
                gr = tuple(reference.block_sparse_attention_bwd_ref(
                    dd, qq, kk, vv, o_r, l_r, idx_s, nums, None, compute_dtype=cdt, **ref_kw))
            refs[name] = (o_r, l_r) + gr
        t_, b_ = refs["truth"], refs["base"]
        report.append(f"KV head {g} (query heads {h0}..{h1 - 1}) vs the reference on them:")
        _check("out", outs, t_[0], b_[0], 2.0, 2e-3, locate(outs.shape, h0, hq, "q"), report,
               failures)
        _check("lse", lses, t_[1], b_[1], 2.0, 1e-4, locate(lses.shape, h0, hq, "lse"), report,
               failures)
        if plan.bwd:
            got = (heads(grads[0], h0, h1), heads(grads[1], g, g + 1), heads(grads[2], g, g + 1))
            for i, (name, kind, nh, hb) in enumerate((("dq", "q", hq, h0), ("dk", "kv", hkv, g),
                                                      ("dv", "kv", hkv, g))):
                _check(name, got[i], t_[2 + i], b_[2 + i], 5.0, 5e-3,
                       locate(got[i].shape, hb, nh, kind), report, failures)
    return report, failures


#: case 3: 17 heads x 2**20 tokens x 128 = 2.28e9 elements per tensor (bhsd: the last head
#: starts at element 2**31), blk 128 (N = 8192) and 64 (N = 16384), both layouts
BSA_LARGE = {f"{layout}-blk{blk}": BSAPlan(layout=layout, blk=blk)
             for layout in ("bhsd", "bshd") for blk in (128, 64)}
#: case 4: GQA, 32 query heads / 8 KV heads, S = 589824: q, out, dq 2.42e9 elements (query
#: heads 28..31 of the last group start at elements 2.11e9..2.34e9), k/v 6.0e8
BSA_GQA_LARGE = BSAPlan(hq=32, hkv=8, s=589824)


@_gpu_large
@pytest.mark.parametrize("which", list(BSA_LARGE))
def test_large_bsa_fwd_bwd(which):
    """Block-sparse attention forward and backward, B = 1, 17 heads of 2**20 tokens, D =
    128, bf16: q, k, v, do, out, dq, dk, dv of 2.28e9 elements each (and the fp32 dq
    workspace), 4 listed blocks per query block (the diagonal one and three random ones),
    bhsd / bshd, sparse_block_size 128 / 64: out, lse, dq, dk, dv of the first and the last
    head (bhsd: the last head lies wholly past element offset 2**31; bshd: the last query
    blocks of every head do) match the reference on that head alone; no NaN in any output,
    lse finite everywhere. Proves the forward's and backward's (preprocessing, dq
    accumulation and conversion included) addressing is 64-bit safe. The backward's K->Q
    lists take the argsort path of build_kq_csr (17 x N x N pairs > 2**22): memory linear
    in the 17 x N x 4 entries. About 46 GB of device memory (8 tensors of 4.56 GB, the
    9.1 GB fp32 dq workspace); tens of seconds."""
    _finish(*_isolated(run_bsa, BSA_LARGE[which], "kernel"))


@_gpu_large
def test_large_bsa_gqa():
    """Block-sparse attention with GQA (32 query heads, 8 KV heads, S = 589824, D = 128,
    blk 128, bhsd, bf16): q, do, out, dq of 2.42e9 elements (k, v 6.0e8); out, lse, dq,
    dk, dv of KV heads 0 and 7 with their query-head groups (query head 28 straddles
    element offset 2**31, heads 29..31 lie past it) match the reference on that group
    alone; no NaN; lse finite. Proves the GQA forward and backward index q-sized tensors
    with 64-bit offsets. About 35 GB of device memory; tens of seconds."""
    _finish(*_isolated(run_bsa, BSA_GQA_LARGE, "kernel"))


# ----------------------------------------------------------------------------- CPU plans
# The same code on tiny sizes and the reference backend (the "kernel" output is then the
# reference on the whole problem): checks the selection, slicing, packing and comparison,
# with a boundary small enough that the checked parts straddle and pass it.

TINY_HSTU = HSTUPlan(h=2, d=16, n_seq=14, seqlen=16, second_len=11,
                     tail_lens=(15, 0, 9, 1, 16, 7), pad_rows=5, boundary=2001)
TINY_RAB = dataclasses.replace(TINY_HSTU, h_rab=1, boundary=769)
TINY_BSA = BSAPlan(hq=3, hkv=3, s=200, d=16, blk=64, k_listed=3, layout="bshd",
                   boundary=7001)
TINY_GQA = BSAPlan(hq=4, hkv=2, s=256, d=16, blk=64, k_listed=2, boundary=12001)


def _plan_ok(result, err):
    assert err is None, err
    report, failures = result
    assert not failures, "\n".join(failures + report)
    return report


def test_large_plan_hstu_cpu():
    """The HSTU checks on a tiny plan (reference backend): selection holds the first, the
    boundary-straddling and the last sequences, the checks pass, rab slicing included."""
    assert TINY_HSTU.selection(np.concatenate([[0], np.cumsum(TINY_HSTU.lengths())])) == \
        [0, 4, 8, 9, 10, 11, 12, 13]
    assert TINY_RAB.selection(np.concatenate([[0], np.cumsum(TINY_RAB.lengths())])) == \
        [0, 1, 3, 8, 9, 10, 11, 12, 13]
    report = _plan_ok(*_isolated(run_hstu, TINY_HSTU, "reference"))
    assert any("dv:" in line for line in report)
    report = _plan_ok(*_isolated(run_hstu, TINY_RAB, "reference"))
    assert any("drab:" in line for line in report)


def test_large_plan_bsa_cpu():
    """The BSA checks on tiny plans (reference backend, bshd MHA and bhsd GQA): block lists
    hold the diagonal and distinct blocks; the head-group slicing passes the checks."""
    lst = TINY_BSA.block_lists()
    n = lst.shape[2]
    assert (lst == np.arange(n)[None, None, :, None]).any(-1).all()
    srt = np.sort(lst, axis=-1)
    assert (srt[..., 1:] != srt[..., :-1]).all() and lst.min() >= 0 and lst.max() < n
    _plan_ok(*_isolated(run_bsa, TINY_BSA, "reference"))
    _plan_ok(*_isolated(run_bsa, TINY_GQA, "reference"))


def test_large_plan_sizes():
    """The device plans: every tensor they call large exceeds 2**31 elements, the checked
    parts reach past it, the block lists stay small, int32 metadata fits."""
    p = HSTU_LARGE
    lens = p.lengths()
    cu = np.concatenate([[0], np.cumsum(lens)])
    t = int(cu[-1]) + p.pad_rows
    assert t * p.h * p.d > BOUNDARY and t < 2**31
    sel = p.selection(cu)
    assert len(sel) == 8 and 0 in sel and p.n_seq - 1 in sel
    assert any(cu[s] * p.h * p.d < BOUNDARY < cu[s + 1] * p.h * p.d for s in sel)
    assert min(lens[-6:]) == 0
    for p in HSTU_RAB_LARGE.values():
        per = p.h_rab * p.seqlen ** 2
        assert p.n_seq * per > BOUNDARY
        assert {BOUNDARY // per - 1, BOUNDARY // per} <= set(p.selection(
            np.concatenate([[0], np.cumsum(p.lengths())])))
    for p in list(BSA_LARGE.values()) + [BSA_GQA_LARGE]:
        assert p.hq * p.s * p.d > BOUNDARY
        r = p.hq // p.hkv
        if p.layout == "bhsd":  # the last group's last head starts past (or at) 2**31
            assert (p.hq - 1) * p.s * p.d >= BOUNDARY
        n = -(-p.s // p.blk)
        # build_kq_csr: the argsort path (memory linear in the entries)
        assert p.hq * n * n > 1 << 22 and p.hq * n * p.k_listed < 1 << 24
        assert p.hq % p.hkv == 0 and r >= 1
