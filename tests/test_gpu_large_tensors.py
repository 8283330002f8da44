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
  sequence(s) holding element offsets ``2**31 - 1`` and ``2**31`` (of q, of rab in the rab
  tests, of the fp32 partial outputs in the split-KV test) and the last six sequences (odd
  lengths and a zero-length one);
* HSTU paged KV (forward only): the selected sequences (the first, those owning the cache
  pages around element offset ``2**31`` and the highest page, those holding q offsets
  around it, the last six) are checked against the reference on their K/V gathered from
  their pages into contiguous arrays;
* BSA: the heads are independent, so the reference runs on one KV head's group of query
  heads (q, do, out, lse and the block lists of those query heads, with ``pack_gqa`` the
  KV head's packed block lists; k, v of the KV head): the first and the last group. In
  ``bhsd`` the last head starts at element ``2**31`` exactly (17 heads of ``2**27``
  elements; 33 of ``2**26``); in ``bshd`` the last query (key) blocks of every head lie
  past it.

Options covered: HSTU ``deterministic=True``, a local ``window_size``, split-KV with fp32
partial outputs of more than ``2**31`` elements, paged KV (prefill with the XLA schedule,
decode with ``kv_splits`` 4, GQA and the schedule kernel); BSA ``deterministic=True`` (the
schedule-order kernel and the launch-group order), ``pack_gqa``, split-KV decode against
K/V of more than ``2**31`` elements. With ``deterministic=True`` the backward runs twice
and the gradients must be bitwise equal (whole-tensor fingerprints and the checked parts).

On the whole tensors (cheap device reductions): no NaN in any output, rows past
``cu_seqlens[-1]`` exactly 0 (HSTU; the input rows there are NaN-poisoned) and a finite
lse everywhere (BSA: every row lists blocks). Before each kernel call the allocator
is handed NaN-filled buffers of the outputs' sizes (then freed), so that elements a kernel
leaves unwritten (e.g. a store that wrapped to a lower address) likely read as NaN. A
failure message names the worst element's global index and element offset (past
``2**31`` or not), which tells an overflow from a plain numerical error.

Inputs are generated on the device (``jax.random`` in chunks written into a donated
buffer: no host-to-device copy of the big tensors, no second copy). Every test needs at
least ``LARGE_TEST_MIN_FREE_GB`` (default 100) GB of free device memory in this process's
allocator (``memory_stats``: ``bytes_limit - bytes_in_use``; JAX preallocates 75% of the
H200 by default, about 104 GiB) and skips otherwise; their peaks are about 8 to 47 GB
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
and comparison logic, with a small stand-in for ``2**31``; ``test_large_plan_kernel_configs``
(CuTe DSL needed, no GPU) checks that the device cases' sizes take the kernel paths they
are meant to (and the documented 32-bit refusals).
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
    # an Inf in got is err = inf and an overflowed baseline berr = inf: inf <= inf passed
    ok = nans == 0 and np.isfinite(err) and np.isfinite(berr) and err <= factor * berr + atol
    report.append(f"  {name}: err={err:.2e} base={berr:.2e} max|truth|={scale:.2e}"
                  + ("" if ok else "  <-- FAIL"))
    if not ok:
        failures.append(f"{name}: err {err:.3e} > {factor} x base {berr:.3e} + atol {atol:.3e}; "
                        f"{nans} NaN; worst at {locate(int(arg))}")


def _offset_note(offset, boundary):
    return f"element offset {offset} ({'past' if offset >= boundary else 'below'} {boundary})"


def _timed(report, what, fn, note="first call: compiles included"):
    t0 = time.perf_counter()
    out = fn()
    jax.block_until_ready(out)
    report.append(f"{what}: {time.perf_counter() - t0:.2f} s" + (f" ({note})" if note else ""))
    return out


@jax.jit
def _fingerprint(x):
    """Bitwise fingerprint of ``x``: the sums (mod 2**32) of its elements' bit patterns and
    of their squares (integer sums: the same whatever the reduction order)."""
    u = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32}[jnp.dtype(x.dtype).itemsize]
    b = lax.bitcast_convert_type(x, u).astype(jnp.uint32)
    return jnp.stack([jnp.sum(b, dtype=jnp.uint32), jnp.sum(b * b, dtype=jnp.uint32)])


def _compare_rerun(names, first, second, report, failures):
    """deterministic=True: the fingerprints ``first`` / ``second`` (``{name: (fingerprint
    of the whole tensor, its checked slices)}``) of two runs must be bitwise equal."""
    for name in names:
        (fa, sa), (fb, sb) = first[name], second[name]
        same_fp = bool(np.array_equal(np.asarray(fa), np.asarray(fb)))
        same_sl = all(bool(jnp.array_equal(a, b)) for a, b in zip(sa, sb))
        yes = {True: "yes", False: "NO"}
        report.append(f"  {name}: rerun bitwise equal: whole-tensor fingerprint "
                      f"{yes[same_fp]}, checked slices {yes[same_sl]}"
                      + ("" if same_fp and same_sl else "  <-- FAIL"))
        if not (same_fp and same_sl):
            failures.append(f"deterministic=True: {name} differs between two runs "
                            f"(whole-tensor fingerprint {np.asarray(fa)} vs {np.asarray(fb)}, "
                            f"checked slices equal: {same_sl})")


# ----------------------------------------------------------------------------- HSTU


@dataclasses.dataclass(frozen=True)
class HSTUPlan:
    """Sizes of an HSTU case: ``n_seq`` sequences of ``seqlen`` tokens (causal), the second
    one ``second_len`` long (so that a sequence straddles the boundary row), the last ones
    ``tail_lens``; ``pad_rows`` NaN-poisoned rows after the last sequence; ``h_rab``: rab
    ``(n_seq, h_rab, seqlen, seqlen)`` (0: none); ``boundary``: the element offset the
    checked sequences must reach past (``2**31``; small in the CPU plans); ``window``: the
    ``window_size``; ``deterministic``: the backward's option (then run twice, the
    gradients compared bit for bit); ``kv_splits``: the forward's option (an int > 1: the
    fp32 partial outputs ``(kv_splits, T, H, D)`` are the large tensor)."""

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
    window: tuple = (-1, 0)
    deterministic: bool = False
    kv_splits: object = "auto"

    def splits(self):
        """The forward's key splits when ``kv_splits`` names them (an int), else 1."""
        return self.kv_splits if isinstance(self.kv_splits, int) else 1

    def lengths(self):
        lens = np.full(self.n_seq, self.seqlen, np.int64)
        lens[1] = self.second_len
        lens[self.n_seq - len(self.tail_lens):] = self.tail_lens
        assert lens.max() <= self.seqlen
        return lens

    def selection(self, cu):
        """The checked sequences: the first, those holding element offsets ``boundary - 1``
        and ``boundary`` of q (of rab; of the split-KV partial outputs ``(S, T, H, D)``), the
        last ``len(tail_lens)``."""
        hd = self.h * self.d
        n = int(cu[-1])
        t = n + self.pad_rows
        picks = {0} | set(range(self.n_seq - len(self.tail_lens), self.n_seq))
        for e in (self.boundary - 1, self.boundary):
            if e // hd < n:
                picks.add(int(np.searchsorted(cu, e // hd, side="right")) - 1)
            split, row = divmod(e // hd, t)
            if 0 < split < self.splits() and row < n:
                picks.add(int(np.searchsorted(cu, row, side="right")) - 1)
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
    n_split = plan.splits()
    part_elems = n_split * t * hd if n_split > 1 else 0
    if plan.h_rab:
        assert rab_elems > plan.boundary and (max(sel) + 1) * plan.h_rab * L * L > plan.boundary
    elif part_elems:  # the last split's rows of the checked sequences reach past it
        assert part_elems > plan.boundary and (n_split - 1) * t * hd + reach > plan.boundary
    else:
        assert t * hd > plan.boundary and reach > plan.boundary, (t * hd, reach)
    report.append(f"HSTU {backend}: T={t} (sum of lengths {n}), H={h}, D={d}, {plan.n_seq} "
                  f"sequences (max {L}), q/k/v {t * hd} elements ({t * hd / plan.boundary:.3f} "
                  f"x boundary {plan.boundary}), window_size={plan.window}"
                  + (", deterministic backward" if plan.deterministic else "")
                  + (f", rab ({plan.n_seq}, {plan.h_rab}, {L}, {L}) = {rab_elems} elements "
                     f"({rab_elems / plan.boundary:.3f} x boundary)" if plan.h_rab else "")
                  + (f", kv_splits={n_split}: fp32 partial outputs ({n_split}, {t}, {h}, {d}) "
                     f"= {part_elems} elements ({part_elems / plan.boundary:.3f} x boundary)"
                     if part_elems else ""))
    report.append("checked sequences: " + ", ".join(
        f"{s} (len {lens[s]}, rows {cu_np[s]}..{cu_np[s + 1]}, elements up to "
        f"{cu_np[s + 1] * hd})" for s in sel))

    cu = jnp.asarray(cu_np.astype(np.int32))
    keys = jax.random.split(jax.random.PRNGKey(plan.seed), 5)
    q, k, v, do = (_nan_rows(_randn(kk, (t, h, d)), jnp.int32(n), rows=plan.pad_rows)
                   if plan.pad_rows else _randn(kk, (t, h, d)) for kk in keys[:4])
    rab = _randn(keys[4], (plan.n_seq, plan.h_rab, L, L)) if plan.h_rab else None
    kw = dict(max_seqlen_q=L, max_seqlen_k=L, scaling_seqlen=float(L),
              window_size=tuple(plan.window), alpha=float(1.0 / np.sqrt(d)))
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
    _poison(((t, h, d), BF16), *([((n_split, t, h, d), jnp.float32)] if part_elems else []))
    out = _timed(report, "forward", lambda: jsa.hstu_attention(
        q, k, v, cu, cu, backend=backend, rab=rab, kv_splits=plan.kv_splits, **kw))
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
    def poison_bwd():
        # dq, dk, dv and the fp32 dq workspace (the sm90 backward's query-tile workspace
        # (T // 64 + B + 1, H, 64 D): at least (T, H, D); not zeroed with deterministic=True)
        _poison(((t, h, d), BF16), ((t, h, d), BF16), ((t, h, d), BF16),
                ((t // 64 + plan.n_seq + 1, h, 64 * d), jnp.float32))
        if rab is not None:
            _poison((rab.shape, rab.dtype), (rab.shape, jnp.float32))

    def backward():
        return tuple(jsa.hstu_attention_backward(do, q, k, v, cu, cu, backend=backend, rab=rab,
                                                 deterministic=plan.deterministic, **kw))

    def taken(grads):
        got = [take(g) for g in grads[:3]]
        if rab is not None:
            got.append(jnp.take(grads[3], b_sel, axis=0))
        return got

    poison_bwd()
    grads = _timed(report, "backward", backward)
    names = ("dq", "dk", "dv", "drab")[:len(grads)]
    for name, g in zip(names, grads):
        if bool(_any_nan(g)):
            failures.append(f"backward: NaN in the full {name}")
        if name != "drab" and plan.pad_rows and bool(_any_nonzero(g[n:])):
            failures.append(f"backward: {name} rows past cu_seqlens[-1] are not zero")
    got = taken(grads)
    if plan.deterministic:  # a second run (after the first's gradients are freed): bitwise
        first = {nm: (_fingerprint(g), (x,)) for nm, g, x in zip(names, grads, got)}
        del grads
        poison_bwd()
        grads = _timed(report, "backward again", backward, note="")
        second = {nm: (_fingerprint(g), (x,)) for nm, g, x in zip(names, grads, taken(grads))}
        del grads
        report.append("deterministic: the second backward vs the first:")
        _compare_rerun(names, first, second, report, failures)
        del first, second
    else:
        del grads
    del q, k, v, do
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
    and the backward's drab writes are 64-bit safe (D = 128: the sm90 backward, the default
    with rab there). About 25 (hrab4) / 40 (hrab1) GB of device memory; tens of seconds."""
    _finish(*_isolated(run_hstu, HSTU_RAB_LARGE[which], "kernel"))


#: case 1 with deterministic=True (the backward run twice) / with a local window
HSTU_DET_LARGE = dataclasses.replace(HSTU_LARGE, deterministic=True)
HSTU_WINDOW_LARGE = dataclasses.replace(HSTU_LARGE, window=(300, 40))
#: split-KV forward: 1100 sequences (T = 1_123_769 rows, q/k/v/out 5.75e8 elements each),
#: kv_splits = 4: fp32 partial outputs (4, T, 4, 128) of 2.30e9 elements
HSTU_SPLIT_LARGE = HSTUPlan(n_seq=1100, kv_splits=4, bwd=False)


@_gpu_large
def test_large_hstu_deterministic():
    """The HSTU forward and backward of test_large_hstu_fwd_bwd (q, k, v, dout, out, dq, dk,
    dv of 2.31e9 elements) with deterministic=True: the sm90 backward orders each query
    tile's dq additions by per-(query tile slot, head) semaphores and, with the default
    det_writer, stores the first contribution into a workspace that is not zeroed (fp32
    (T // 64 + B + 1, H, 64 D) = 2.45e9 elements, NaN-poisoned beforehand). Checks as
    test_large_hstu_fwd_bwd, and a second backward gives bitwise the same dq, dk, dv
    (whole-tensor fingerprints and the checked sequences). Proves the deterministic
    backward's semaphore, workspace and dq addressing is 64-bit safe. About 46 GB of device
    memory; tens of seconds (two backward runs, one compile)."""
    _finish(*_isolated(run_hstu, HSTU_DET_LARGE, "kernel"))


@_gpu_large
def test_large_hstu_window():
    """The HSTU forward and backward of test_large_hstu_fwd_bwd with a local window,
    window_size = (300, 40) (keys p - 300 .. p + 40 of query position p: the tile schedules
    skip the KV tiles outside the band, the masks cut both edges): the first sequence, the
    one straddling element offset 2**31 and the last six match the reference; no NaN; rows
    past cu_seqlens[-1] zero. About 46 GB of device memory; tens of seconds."""
    _finish(*_isolated(run_hstu, HSTU_WINDOW_LARGE, "kernel"))


@_gpu_large
def test_large_hstu_split_kv():
    """The HSTU split-KV forward (sm90ws, kv_splits = 4: each query tile's KV tiles split
    over 4 work items whose fp32 partial outputs (4, T, H, D) are summed by XLA) with
    partials of 2.30e9 elements (q, k, v, out 5.75e8 each; 1100 causal sequences of up to
    1024 tokens): the first sequence, the one whose rows hold partial element offsets
    2**31 - 1 and 2**31 (in the last split) and the last six match the reference; no NaN;
    rows past cu_seqlens[-1] zero. Unlike the block-sparse forward (_MAX_PARTIAL_ELEMS),
    the HSTU forward does not bound the partials' size: this proves their addressing is
    64-bit safe. About 15 GB of device memory; tens of seconds."""
    _finish(*_isolated(run_hstu, HSTU_SPLIT_LARGE, "kernel"))


# ----------------------------------------------------------------------------- HSTU paged KV


#: tokens per page of the paged KV cache (``paged_kv.shape[2]``)
PAGE = 128


@functools.partial(jax.jit, donate_argnums=(0,))
def _nan_page_rows(kv, pages, used):
    """``kv (num_pages, 2, PAGE, H_kv, D)`` with rows ``used[i]..`` of page ``pages[i]`` (K
    and V) set to NaN, in place (distinct pages)."""
    blk = jnp.take(kv, pages, axis=0)
    tail = jnp.arange(kv.shape[2])[None, :] >= used[:, None]
    blk = jnp.where(tail[:, None, :, None, None], jnp.asarray(jnp.nan, kv.dtype), blk)
    return kv.at[pages].set(blk, unique_indices=True)


@dataclasses.dataclass(frozen=True)
class PagedPlan:
    """Sizes of a paged-KV HSTU inference case (causal, forward only): ``n_seq`` sequences of
    ``seqlen_k`` keys (the second ``second_len``, the last ones ``tail_k``) in a cache
    ``(num_pages, 2, 128, h_kv, d)``; each sequence's pages lie at random places (one random
    permutation of the cache), followed in ``page_ids`` by one extra id of a spare page;
    ``spare_pages`` pages no sequence uses and the rows past each sequence's keys in its last
    page are NaN. Queries: ``q_len`` per sequence (0: ``L_q = L_k``, prefill; else
    ``min(q_len, L_k)``), the last ones ``tail_q``; ``pad_rows`` NaN q rows after them.
    ``kv_splits``: the forward's option; ``boundary``: as in :class:`HSTUPlan`."""

    h: int = 4
    h_kv: int = 4
    d: int = 128
    n_seq: int = 4400
    seqlen_k: int = 1024
    second_len: int = 777
    tail_k: tuple = (1023, 0, 513, 1, 1024, 999)
    q_len: int = 0
    tail_q: tuple = (1023, 0, 300, 1, 64, 999)
    spare_pages: int = 64
    pad_rows: int = 200
    kv_splits: object = "auto"
    boundary: int = BOUNDARY
    seed: int = 0

    @property
    def page_elems(self):
        return 2 * PAGE * self.h_kv * self.d

    def lengths(self):
        """``(lens_q, lens_k)``, int64 ``(n_seq,)`` each, ``lens_q <= lens_k``."""
        lens_k = np.full(self.n_seq, self.seqlen_k, np.int64)
        lens_k[1] = self.second_len
        lens_k[self.n_seq - len(self.tail_k):] = self.tail_k
        lens_q = lens_k.copy() if self.q_len == 0 else np.minimum(lens_k, self.q_len)
        lens_q[self.n_seq - len(self.tail_q):] = self.tail_q
        assert (lens_q <= lens_k).all() and lens_k.max() <= self.seqlen_k
        return lens_q, lens_k

    def page_table(self):
        """``(page_ids, page_indptrs, need, num_pages, owner, spare)``: sequence b's
        ``need[b] = ceil(L_k / 128)`` pages are ``page_ids[page_indptrs[b]:][:need[b]]``,
        then one spare page id; ``owner[p]``: the sequence of page p (-1: spare)."""
        _, lens_k = self.lengths()
        need = -(-lens_k // PAGE)
        used = int(need.sum())
        num_pages = used + self.spare_pages
        perm = np.random.default_rng(self.seed).permutation(num_pages)
        spare = perm[used:]
        owner = np.full(num_pages, -1, np.int64)
        ids, ptr, at = [], [0], 0
        for b in range(self.n_seq):
            mine = perm[at:at + need[b]]
            at += need[b]
            owner[mine] = b
            ids.append(mine)
            ids.append(spare[b % len(spare):][:1])
            ptr.append(ptr[-1] + need[b] + 1)
        return (np.concatenate(ids).astype(np.int32), np.asarray(ptr, np.int32), need,
                num_pages, owner, spare)

    def selection(self, cu_q, owner):
        """The checked sequences: the first, those holding q element offsets ``boundary - 1``
        and ``boundary``, those owning the pages that hold cache element offsets
        ``boundary - 1`` and ``boundary``, the owner of the highest used page, the last
        ``max(len(tail_k), len(tail_q))``."""
        hd = self.h * self.d
        n = int(cu_q[-1])
        tail = max(len(self.tail_k), len(self.tail_q))
        picks = {0} | set(range(self.n_seq - tail, self.n_seq))
        for e in (self.boundary - 1, self.boundary):
            if e // hd < n:
                picks.add(int(np.searchsorted(cu_q, e // hd, side="right")) - 1)
            p = e // self.page_elems
            if p < owner.shape[0] and owner[p] >= 0:
                picks.add(int(owner[p]))
        picks.add(int(owner[np.flatnonzero(owner >= 0).max()]))
        return sorted(picks)


def run_hstu_paged(plan: PagedPlan, backend: str):
    """The paged-KV HSTU forward on ``backend`` for ``plan``, checked on the selected
    sequences against the reference on their K/V gathered from the pages into contiguous
    (T_k, H_kv, D) arrays. Returns ``(report lines, failures)``."""
    report, failures = [], []
    lens_q, lens_k = plan.lengths()
    cu_q_np = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int64)
    cu_k_np = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int64)
    n = int(cu_q_np[-1])
    t = n + plan.pad_rows
    h, hkv, d = plan.h, plan.h_kv, plan.d
    hd, pe = h * d, plan.page_elems
    ids_np, ptr_np, need, num_pages, owner, spare = plan.page_table()
    sel = plan.selection(cu_q_np, owner)
    cache_elems = num_pages * pe
    assert cache_elems > plan.boundary, (cache_elems, plan.boundary)
    pages_of = {b: ids_np[ptr_np[b]:ptr_np[b] + need[b]] for b in sel}
    # the checked sequences read pages past the boundary (and one of them q/out rows past it
    # when q is large)
    assert max(int(p.max()) + 1 for p in pages_of.values() if p.size) * pe > plan.boundary
    if t * hd > plan.boundary:
        assert max(int(cu_q_np[b + 1]) for b in sel) * hd > plan.boundary
    report.append(f"HSTU paged {backend}: {plan.n_seq} sequences, L_k up to {lens_k.max()}, "
                  f"L_q up to {lens_q.max()} (T_q={t}: q/out {t * hd} elements, "
                  f"{t * hd / plan.boundary:.3f} x boundary {plan.boundary}), H={h}, "
                  f"H_kv={hkv}, D={d}; cache ({num_pages}, 2, {PAGE}, {hkv}, {d}) = "
                  f"{cache_elems} elements ({cache_elems / plan.boundary:.3f} x boundary; "
                  f"pages from {plan.boundary // pe} on lie past it), {len(spare)} spare "
                  f"(NaN) pages, kv_splits={plan.kv_splits!r}")
    report.append("checked sequences: " + ", ".join(
        f"{b} (L_q {lens_q[b]}, L_k {lens_k[b]}, {need[b]} pages"
        + (f" {int(pages_of[b].min())}..{int(pages_of[b].max())}, cache elements up to "
           f"{(int(pages_of[b].max()) + 1) * pe}" if need[b] else "") + ")" for b in sel))

    keys = jax.random.split(jax.random.PRNGKey(plan.seed), 2)
    q = _randn(keys[0], (t, h, d))
    if plan.pad_rows:
        q = _nan_rows(q, jnp.int32(n), rows=plan.pad_rows)
    kv = _randn(keys[1], (num_pages, 2, PAGE, hkv, d))
    # NaN: the spare pages, the rows past each sequence's keys in its last page
    part = [(int(ids_np[ptr_np[b] + need[b] - 1]), int(lens_k[b] - (need[b] - 1) * PAGE))
            for b in range(plan.n_seq) if need[b] and lens_k[b] % PAGE]
    poison_pages = np.asarray([p for p, _ in part] + [int(p) for p in spare], np.int32)
    poison_used = np.asarray([u for _, u in part] + [0] * len(spare), np.int32)
    kv = _nan_page_rows(kv, jnp.asarray(poison_pages), jnp.asarray(poison_used))
    ids, ptr = jnp.asarray(ids_np), jnp.asarray(ptr_np)
    cu_q = jnp.asarray(cu_q_np.astype(np.int32))
    cu_k = jnp.asarray(cu_k_np.astype(np.int32))
    max_q, max_k = max(int(lens_q.max()), 1), max(int(lens_k.max()), 1)
    kw = dict(max_seqlen_q=max_q, max_seqlen_k=max_k, scaling_seqlen=float(max_k),
              window_size=(-1, 0), alpha=float(1.0 / np.sqrt(d)))

    # ---- forward
    n_split = plan.kv_splits if isinstance(plan.kv_splits, int) else 1
    _poison(((t, h, d), BF16), *([((n_split, t, h, d), jnp.float32)] if n_split > 1 else []))
    out = _timed(report, "paged forward", lambda: jsa.hstu_attention(
        q, None, None, cu_q, cu_k, paged_kv=kv, page_ids=ids, page_indptrs=ptr,
        backend=backend, kv_splits=plan.kv_splits, **kw))
    if bool(_any_nan(out)):
        failures.append("forward: NaN in the full output")
    if plan.pad_rows and bool(_any_nonzero(out[n:])):
        failures.append("forward: output rows past cu_seqlens_q[-1] are not zero")
    rows_np = np.concatenate([np.arange(cu_q_np[b], cu_q_np[b + 1])
                              for b in sel]).astype(np.int32)
    rows = jnp.asarray(rows_np)
    out_s = jnp.take(out, rows, axis=0)
    del out

    # ---- reference on the selected sequences, K/V gathered from their pages
    pages_cat = np.concatenate([pages_of[b] for b in sel]).astype(np.int32)
    base = np.concatenate([[0], np.cumsum([need[b] for b in sel])])
    rows_k = np.concatenate([base[i] * PAGE + np.arange(lens_k[b]) for i, b in enumerate(sel)])
    kv_s = jnp.take(kv, jnp.asarray(pages_cat), axis=0)  # (pages, 2, PAGE, H_kv, D)
    k_s = jnp.take(kv_s[:, 0].reshape(-1, hkv, d), jnp.asarray(rows_k.astype(np.int32)), axis=0)
    v_s = jnp.take(kv_s[:, 1].reshape(-1, hkv, d), jnp.asarray(rows_k.astype(np.int32)), axis=0)
    q_s = jnp.take(q, rows, axis=0)
    del kv_s
    cu_q_s = jnp.asarray(np.concatenate([[0], np.cumsum(lens_q[sel])]).astype(np.int32))
    cu_k_s = jnp.asarray(np.concatenate([[0], np.cumsum(lens_k[sel])]).astype(np.int32))
    results = {}
    for name, cdt in (("truth", None), ("base", BF16)):
        dt = jnp.float32 if cdt is None else BF16
        results[name] = reference.hstu_attention_ref(
            q_s.astype(dt), k_s.astype(dt), v_s.astype(dt), cu_q_s, cu_k_s, None,
            compute_dtype=cdt, **kw)

    def loc(i):
        r_, hh, dd = (int(x) for x in np.unravel_index(i, out_s.shape))
        g = int(rows_np[r_])
        b = int(np.searchsorted(cu_q_np, g, side="right")) - 1
        return (f"row {g} (sequence {b}, local row {g - cu_q_np[b]}, its pages up to "
                f"{int(pages_of[b].max())}), head {hh}, dim {dd}: q/out "
                + _offset_note((g * h + hh) * d + dd, plan.boundary))

    report.append("forward checks (selected sequences vs the reference on their gathered K/V):")
    _check("out", out_s, results["truth"], results["base"], 2.0, 2e-3, loc, report, failures)
    return report, failures


#: case 5: paged-KV inference. prefill: 4400 sequences (L_q = L_k up to 1024), q/out of
#: 2.30e9 elements and a cache of 35245 pages x 2 x 128 x 4 x 128 = 4.62e9 elements;
#: decode-splits4: 44 sequences of up to 114688 keys (L_q <= 128), H = 8 over H_kv = 2
#: (GQA), a cache of 37120 pages x 65536 = 2.43e9 elements, kv_splits = 4 (the schedule
#: kernel builds the metadata, the forward kernel clamps the page ids)
HSTU_PAGED_LARGE = {
    "prefill": PagedPlan(),
    "decode-splits4": PagedPlan(h=8, h_kv=2, n_seq=44, seqlen_k=114688, second_len=100001,
                                tail_k=(114687, 0, 70000, 1, 114688, 99999), q_len=128,
                                tail_q=(128, 0, 77, 1, 128, 5), kv_splits=4),
}


@_gpu_large
@pytest.mark.parametrize("which", list(HSTU_PAGED_LARGE))
def test_large_hstu_paged(which):
    """HSTU paged-KV inference (causal forward; the sm90ws forward reads K / V by TMA from
    the pages in place) with a cache of more than 2**31 elements (each sequence's pages
    scattered over it by a random permutation, an extra spare-page id after each sequence's
    pages, spare pages and the rows past each sequence's keys NaN): the outputs of the first
    sequence, of those owning the pages around cache element offset 2**31 and the highest
    page, and of the last six (odd lengths, a zero-length one) match the reference on those
    sequences' K / V gathered from their pages into contiguous arrays; no NaN anywhere; q
    rows past cu_seqlens_q[-1] (NaN) give zeros. prefill (L_q = L_k, 4400 sequences: the
    XLA tile schedule, XLA clips the page ids): q / out of 2.30e9 elements too; about 19 GB
    of device memory (cache 9.2 GB, q and out 4.6 GB each; 28 GB should XLA copy the cache
    for the NaN scatter). decode-splits4 (44 sequences of up to 114688 keys, up to 128
    queries, H = 8 over H_kv = 2, kv_splits = 4: the schedule kernel and the kernel's
    page-id clamp): about 8 GB (cache 4.9 GB, the reference's temporaries). Proves the page
    offsets (page id x page stride) and the q / out addressing of the paged forward are
    64-bit safe; tens of seconds."""
    _finish(*_isolated(run_hstu_paged, HSTU_PAGED_LARGE[which], "kernel"))


# ----------------------------------------------------------------------------- BSA


@dataclasses.dataclass(frozen=True)
class BSAPlan:
    """Sizes of a BSA case: ``B = 1``, ``hq`` query / ``hkv`` KV heads, ``s`` keys (and
    queries, unless ``s_q`` says otherwise), D = ``d``, ``k_listed`` random distinct blocks
    per query block (the "anchor" block among them, in random order: the diagonal one; with
    ``pack_gqa`` the KV block of the packed block's positions; with fewer query blocks than
    KV blocks, decode, the last KV blocks); the checked KV heads' groups:
    ``check_kv_heads``. Options of the op: ``pack_gqa`` (metadata over the packed rows of
    each KV head), ``kv_splits`` (forward), ``deterministic`` (backward; then run twice, the
    gradients compared bit for bit), ``bwd_ws`` (the ``bsa_bwd_ws`` switch)."""

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
    s_q: int = 0
    pack_gqa: bool = False
    kv_splits: object = 1
    deterministic: bool = False
    bwd_ws: tuple = ()

    @property
    def sq(self):
        """Query positions (``s_q``, else ``s``)."""
        return self.s_q or self.s

    def meta_dims(self):
        """``(heads, N_q, N_kv, r)`` of the metadata: ``(H_q, ceil(S_q / blk), ...)``, with
        ``pack_gqa`` ``(H_kv, ceil(S_q r / blk), ...)``; ``r`` query heads per KV head of
        the packed rows (1 unpacked)."""
        r = self.hq // self.hkv if self.pack_gqa else 1
        heads = self.hkv if self.pack_gqa else self.hq
        return heads, -(-self.sq * r // self.blk), -(-self.s // self.blk), r

    def block_lists(self):
        """int32 ``(1, heads, N_q, k_listed)`` (:meth:`meta_dims`): block m lists its anchor
        (m; ``m // r`` packed, whose positions ``m blk / r ..`` lie in that KV block; the
        last KV blocks when ``N_q < N_kv``) and ``k_listed - 1`` other distinct random
        blocks, shuffled."""
        rng = np.random.default_rng(self.seed)
        heads, n_q, n, r = self.meta_dims()
        assert 1 <= self.k_listed <= n
        rows = heads * n_q
        m = np.arange(n_q) // r if n_q == n * r else (n - 1 - np.arange(n_q)) % n
        m = np.tile(m, heads)
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
        return lst.reshape(1, heads, n_q, self.k_listed).astype(np.int32)

    def kv_offset(self, head, row):
        """Element offset of ``k[0, head, row, 0]`` (bhsd) / ``k[0, row, head, 0]``."""
        if self.layout == "bhsd":
            return (head * self.s + row) * self.d
        return (row * self.hkv + head) * self.d


def run_bsa(plan: BSAPlan, backend: str):
    """The BSA forward (and backward) on ``backend`` for ``plan``, checked on the groups of
    ``plan.check_kv_heads`` against the reference on those heads alone. Returns
    ``(report lines, failures)``."""
    report, failures = [], []
    hq, hkv, s, sq, d, blk, kl = (plan.hq, plan.hkv, plan.s, plan.sq, plan.d, plan.blk,
                                  plan.k_listed)
    r = hq // hkv
    bhsd = plan.layout == "bhsd"
    _, n, n_kv, _ = plan.meta_dims()
    q_shape = (1, hq, sq, d) if bhsd else (1, sq, hq, d)
    kv_shape = (1, hkv, s, d) if bhsd else (1, s, hkv, d)
    q_elems, kv_elems = math.prod(q_shape), math.prod(kv_shape)
    assert max(q_elems, kv_elems) > plan.boundary, (q_elems, kv_elems, plan.boundary)
    report.append(f"BSA {backend} {plan.layout}: B=1, H_q={hq}, H_kv={hkv}, S_q={sq}, "
                  f"S_kv={s}, D={d}, blk={blk} (N_q={n}{' packed' if plan.pack_gqa else ''}, "
                  f"N_kv={n_kv}), {kl} listed blocks per query block; q {q_elems} elements "
                  f"({q_elems / plan.boundary:.3f} x boundary {plan.boundary}), k/v {kv_elems} "
                  f"({kv_elems / plan.boundary:.3f} x)"
                  + "".join(f", {o}={getattr(plan, o)!r}" for o in
                            ("pack_gqa", "kv_splits", "deterministic", "bwd_ws")
                            if getattr(plan, o) != BSAPlan.__dataclass_fields__[o].default))
    idx_np = plan.block_lists()
    idx = jnp.asarray(idx_np)
    keys = jax.random.split(jax.random.PRNGKey(plan.seed), 4)
    q, do = _randn(keys[0], q_shape), _randn(keys[3], q_shape)
    k, v = _randn(keys[1], kv_shape), _randn(keys[2], kv_shape)
    scale = float(1.0 / np.sqrt(d))
    kw = dict(block_sparse_num=kl, sparse_block_size=blk, softmax_scale=scale,
              layout=plan.layout, backend=backend, pack_gqa=plan.pack_gqa)
    if plan.bwd_ws:
        from jax_sparse_attn.config import Switches

        kw["switches"] = Switches(bsa_bwd_ws=plan.bwd_ws)
    ref_kw = dict(sparse_block_size=blk, softmax_scale=scale, layout=plan.layout,
                  pack_gqa=plan.pack_gqa)
    groups = sorted({g % hkv for g in plan.check_kv_heads})
    hax = 1 if bhsd else 2  # head axis of q/k/v/out/grads

    def heads(x, lo, hi, axis=hax):
        return lax.slice_in_dim(x, lo, hi, axis=axis)

    def meta(x, g):
        """The metadata rows of KV head g's group."""
        return x[:, g:g + 1] if plan.pack_gqa else x[:, g * r:(g + 1) * r]

    def locate(shape, h0, n_heads, kind):
        """kind "q": (1, heads, S_q, D) / (1, S_q, heads, D) slices of q-like tensors; "kv":
        of k-like; "lse": (1, heads, S_q)."""
        rows_total = sq if kind == "q" else s

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
            off = (((hg * rows_total + row) * d + dd) if bhsd
                   else ((row * n_heads + hg) * d + dd))
            return (f"{'q' if kind == 'q' else 'kv'} head {hg}, row {row} (block {row // blk}), "
                    f"dim {dd}: " + _offset_note(off, plan.boundary))
        return loc

    for g in groups:
        h0 = g * r
        listed = np.unique(meta(idx_np, g))
        k_reach = plan.kv_offset(g, min(int(listed.max()) * blk + blk, s) - 1) + d
        report.append(f"checked: KV head {g}, query heads {h0}..{h0 + r - 1}: q elements "
                      + (f"{h0 * sq * d}..{(h0 + r) * sq * d}" if bhsd else
                         f"up to {((sq - 1) * hq + h0 + r) * d} (rows interleaved)")
                      + f"; its listed K/V blocks {listed.min()}..{listed.max()} read k/v "
                      f"elements up to {k_reach} "
                      f"({'past' if k_reach > plan.boundary else 'below'} the boundary)")

    # ---- forward
    out_shape = q_shape
    n_split = plan.kv_splits if isinstance(plan.kv_splits, int) else 1
    _poison((out_shape, BF16), ((1, hq, sq), jnp.float32),
            *([((n_split, 1, hq, sq, d), jnp.float32)] if n_split > 1 else []))
    out, lse = _timed(report, "forward", lambda: tuple(jsa.block_sparse_attention_forward(
        q, k, v, idx, kv_splits=plan.kv_splits, **kw)))
    if bool(_any_nan(out)):
        failures.append("forward: NaN in the full output")
    if not bool(jnp.isfinite(lse).all()):
        failures.append("forward: lse not finite everywhere (every row lists blocks)")
    grads = None
    if plan.bwd:
        def poison_bwd():
            # dq, dk, dv, the fp32 dQ workspace (with deterministic=True not zeroed)
            _poison((q_shape, BF16), (kv_shape, BF16), (kv_shape, BF16), (q_shape, jnp.float32))

        def backward():
            return tuple(jsa.block_sparse_attention_backward(
                do, q, k, v, out, lse, idx, deterministic=plan.deterministic, **kw))

        poison_bwd()
        grads = _timed(report, "backward", backward)
        for name, x in zip(("dq", "dk", "dv"), grads):
            if bool(_any_nan(x)):
                failures.append(f"backward: NaN in the full {name}")
        def checked(gr):
            """{group: (dq, dk, dv) of the group}"""
            return {g: (heads(gr[0], g * r, (g + 1) * r), heads(gr[1], g, g + 1),
                        heads(gr[2], g, g + 1)) for g in groups}

        def prints(gr, parts):
            return {name: (_fingerprint(x), tuple(parts[g][i] for g in groups))
                    for i, (name, x) in enumerate(zip(("dq", "dk", "dv"), gr))}

        got = checked(grads)
        if plan.deterministic:  # a second run (after the first's gradients are freed): bitwise
            first = prints(grads, got)
            del grads
            poison_bwd()
            grads = _timed(report, "backward again", backward, note="")
            second = prints(grads, checked(grads))
            del grads
            report.append("deterministic: the second backward vs the first:")
            _compare_rerun(("dq", "dk", "dv"), first, second, report, failures)
            del first, second
        else:
            del grads

    # ---- checks per group, against the reference on the group alone
    for g in groups:
        h0, h1 = g * r, (g + 1) * r
        qs, dos, outs = (heads(x, h0, h1) for x in (q, do, out))
        ks, vs = heads(k, g, g + 1), heads(v, g, g + 1)
        lses = heads(lse, h0, h1, axis=1)
        idx_s = meta(idx, g)
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
            for i, (name, kind, nh, hb) in enumerate((("dq", "q", hq, h0), ("dk", "kv", hkv, g),
                                                      ("dv", "kv", hkv, g))):
                _check(name, got[g][i], t_[2 + i], b_[2 + i], 5.0, 5e-3,
                       locate(got[g][i].shape, hb, nh, kind), report, failures)
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


#: case 6: deterministic=True at blk 128, bhsd. The ordered dQ additions (detorder): sched:
#: 33 heads x 2**19 tokens (N = 4096 KV blocks: the schedule-order kernel fits,
#: DET_ORDER_MAX_ROWS and its shared memory; head 32 starts at element 2**31); launch: the
#: 17 x 2**20 problem of case 3 (N = 8192: the order kernel's shared memory does not fit, the
#: launch-group order runs). fixed: that problem with the default, the fixed-point dQ (an
#: int32 workspace of the same shape, row multipliers and flags)
BSA_DET_LARGE = {
    "sched": BSAPlan(hq=33, hkv=33, s=1 << 19, deterministic=True, bwd_ws=("detorder",)),
    "launch": BSAPlan(deterministic=True, bwd_ws=("detorder",)),
    "fixed": BSAPlan(deterministic=True),
}
#: case 7: pack_gqa, 32 query heads / 8 KV heads (r = 4), S = 589824, bshd, blk 128: q,
#: do, out, dq 2.42e9 elements, the packed metadata (1, 8, 18432, 4)
BSA_PACK_LARGE = BSAPlan(hq=32, hkv=8, s=589824, layout="bshd", pack_gqa=True)
#: case 8: split-KV decode: one query block (S_q = 128) of 17 heads against K / V of 17 x
#: 2**20 x 128 = 2.28e9 elements, 32 listed blocks per row (the last KV block among them)
BSA_SPLIT_LARGE = {
    "bhsd-splits4": BSAPlan(s_q=128, k_listed=32, kv_splits=4, bwd=False),
    "bshd-auto": BSAPlan(s_q=128, k_listed=32, kv_splits="auto", layout="bshd", bwd=False),
}


@_gpu_large
@pytest.mark.parametrize("which", list(BSA_DET_LARGE))
def test_large_bsa_deterministic(which):
    """Block-sparse attention forward and backward with deterministic=True, blk 128, bhsd,
    bf16, 4 listed blocks per query block. sched and launch: the sm90ws backward with
    ordered dQ additions (detorder: a rank per K->Q entry, int32 semaphores per 64-row
    query tile, the dQ writer warp storing each tile's first contribution into a workspace
    that is not zeroed; fp32 (1, H, N_q 2, 64 D) of 2.2e9 / 2.3e9 elements, NaN-poisoned
    beforehand). sched: 33 heads x 2**19 x 128 (2.21e9 elements per tensor; the
    schedule-order kernel computes the ranks); launch: 17 x 2**20 x 128 (2.28e9; N_kv = 8192
    is too many for the order kernel's shared memory: the launch-group order,
    metadata.build_kq_csr's ranks). fixed: 17 x 2**20 x 128 with the default fixed-point
    dQ (int32 bulk reductions into a zeroed workspace of that shape, converted back by the
    dq reordering). out, lse, dq, dk, dv of
    the first and the last head (which starts at element 2**31) match the reference on that
    head; no NaN; lse finite; a second backward gives bitwise the same dq, dk, dv
    (whole-tensor fingerprints and the checked heads). About 46 GB of device memory; tens
    of seconds (two backward runs)."""
    _finish(*_isolated(run_bsa, BSA_DET_LARGE[which], "kernel"))


@_gpu_large
def test_large_bsa_pack_gqa():
    """Block-sparse attention with pack_gqa=True (32 query heads over 8 KV heads, r = 4,
    metadata over the packed rows p = s r + g of each KV head, N_qp = 18432), S = 589824,
    D = 128, blk 128, bshd, bf16: q, do, out, dq of 2.42e9 elements (the packed dQ
    workspace (1, 8, 36864, 8192) fp32 likewise; k, v 6.0e8); out, lse, dq, dk, dv of KV
    heads 0 and 7 with their query-head groups (the last query rows of every head lie past
    element offset 2**31) match the reference (pack_gqa=True) on that group alone; no NaN;
    lse finite. Proves the packed forward's and backward's row (p // r, h_kv r + p % r)
    addressing is 64-bit safe. About 34 GB of device memory; tens of seconds."""
    _finish(*_isolated(run_bsa, BSA_PACK_LARGE, "kernel"))


@_gpu_large
@pytest.mark.parametrize("which", list(BSA_SPLIT_LARGE))
def test_large_bsa_split_kv_decode(which):
    """Block-sparse split-KV decode forward: one query block (S_q = 128) per head, 17 heads,
    against K / V of 17 x 2**20 x 128 = 2.28e9 elements, 32 listed blocks per row (the last
    KV block and 31 random ones), kv_splits = 4 (bhsd) / "auto" (bshd: floor(132 SMs / 17
    rows) = 7 splits on the H200): the fp32 partials (S, 1, 17, 128, 128) stay far below
    _MAX_PARTIAL_ELEMS; out and lse of the first and the last head match the reference (no
    split) on that head (bhsd: the last head's K / V start at element 2**31; bshd: the last
    KV block of every head lies past it); no NaN; lse finite. Proves the split forward's K /
    V reads are 64-bit safe. About 10 GB of device memory; seconds plus compiles."""
    _finish(*_isolated(run_bsa, BSA_SPLIT_LARGE[which], "kernel"))


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
TINY_HSTU_OPTS = {
    "deterministic": dataclasses.replace(TINY_HSTU, deterministic=True),
    "window": dataclasses.replace(TINY_HSTU, window=(5, 2)),
    # T = 176 rows x 32: partials (3, 176, 2, 16); boundary in split 2, row 61
    "split": dataclasses.replace(TINY_HSTU, kv_splits=3, bwd=False, boundary=13241),
}
TINY_PAGED = {
    # q (3037, 2, 16) and a cache of 38 pages x 8192 elements straddle 60001
    "prefill": PagedPlan(h=2, h_kv=2, d=16, n_seq=14, seqlen_k=300, second_len=211,
                         tail_k=(299, 0, 129, 1, 300, 257), tail_q=(299, 0, 100, 1, 64, 257),
                         spare_pages=3, pad_rows=5, boundary=60001),
    # GQA 4 / 2, a cache of 46 pages x 8192 elements straddles 200003 (q below it)
    "decode": PagedPlan(h=4, h_kv=2, d=16, n_seq=10, seqlen_k=700, second_len=401,
                        tail_k=(699, 0, 300, 1, 700, 555), q_len=16,
                        tail_q=(16, 0, 7, 1, 16, 5), spare_pages=3, pad_rows=5, kv_splits=3,
                        boundary=200003),
}
TINY_BSA_OPTS = {
    # bhsd: the last head starts at the boundary
    "deterministic": BSAPlan(hq=3, hkv=3, s=256, d=16, blk=64, k_listed=2, deterministic=True,
                             boundary=8192),
    "pack_gqa": BSAPlan(hq=4, hkv=2, s=256, d=16, blk=64, k_listed=2, layout="bshd",
                        pack_gqa=True, boundary=12001),
    # decode: K / V of 3 x 1024 x 16 (the last head's from the boundary on) / 3 x 1000 x 16
    "split-bhsd": BSAPlan(hq=3, hkv=3, s=1024, s_q=64, d=16, blk=64, k_listed=6, kv_splits=3,
                          bwd=False, boundary=32768),
    "split-bshd": BSAPlan(hq=3, hkv=3, s=1000, s_q=64, d=16, blk=64, k_listed=6,
                          kv_splits="auto", layout="bshd", bwd=False, boundary=40001),
}


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


@pytest.mark.parametrize("which", list(TINY_HSTU_OPTS))
def test_large_plan_hstu_options_cpu(which):
    """The HSTU checks with the options of the new device cases on tiny plans (reference
    backend): deterministic (the backward run twice and compared), a local window, split-KV
    (the sequence whose rows hold the boundary in the last split is selected)."""
    plan = TINY_HSTU_OPTS[which]
    cu = np.concatenate([[0], np.cumsum(plan.lengths())])
    sel = plan.selection(cu)
    if which == "split":
        split, row = divmod(plan.boundary // (plan.h * plan.d), int(cu[-1]) + plan.pad_rows)
        assert split == plan.splits() - 1 and int(np.searchsorted(cu, row, "right")) - 1 in sel
    report = _plan_ok(*_isolated(run_hstu, plan, "reference"))
    if which == "deterministic":
        assert sum("rerun bitwise equal" in line for line in report) == 3, report
    assert any(("dv:" if plan.bwd else "out:") in line for line in report)


@pytest.mark.parametrize("which", list(TINY_PAGED))
def test_large_plan_hstu_paged_cpu(which):
    """The paged-KV checks on tiny plans (reference backend, which reads the pages
    through the page table; the check's reference reads K / V gathered from them): the
    page table gives each sequence its pages and one spare page, the selection holds the
    owners of the pages around the boundary and of the highest page, the checks pass."""
    plan = TINY_PAGED[which]
    ids, ptr, need, num_pages, owner, spare = plan.page_table()
    lens_q, lens_k = plan.lengths()
    assert (np.diff(ptr) == need + 1).all() and (need == -(-lens_k // PAGE)).all()
    own = np.concatenate([ids[ptr[b]:ptr[b] + need[b]] for b in range(plan.n_seq)])
    assert np.array_equal(np.sort(np.concatenate([own, spare])), np.arange(num_pages))
    assert set(ids[ptr[1:] - 1]) <= set(spare.tolist())
    sel = plan.selection(np.concatenate([[0], np.cumsum(lens_q)]), owner)
    pb = plan.boundary // plan.page_elems
    assert owner[pb] < 0 or owner[pb] in sel
    assert owner[np.flatnonzero(owner >= 0).max()] in sel
    report = _plan_ok(*_isolated(run_hstu_paged, plan, "reference"))
    assert any("out:" in line for line in report)


@pytest.mark.parametrize("which", list(TINY_BSA_OPTS))
def test_large_plan_bsa_options_cpu(which):
    """The BSA checks with the options of the new device cases on tiny plans (reference
    backend): deterministic (the backward run twice and compared), pack_gqa (packed
    metadata sliced per KV head; anchors m // r), split-KV decode (anchors at the last KV
    blocks)."""
    plan = TINY_BSA_OPTS[which]
    lst = plan.block_lists()
    heads, n_q, n_kv, r = plan.meta_dims()
    assert lst.shape == (1, heads, n_q, plan.k_listed)
    srt = np.sort(lst, axis=-1)
    assert (srt[..., 1:] != srt[..., :-1]).all() and lst.min() >= 0 and lst.max() < n_kv
    anchor = (np.arange(n_q) // r if n_q == n_kv * r else (n_kv - 1 - np.arange(n_q)) % n_kv)
    assert (lst == anchor[None, None, :, None]).any(-1).all()
    report = _plan_ok(*_isolated(run_bsa, plan, "reference"))
    if plan.deterministic:
        assert sum("rerun bitwise equal" in line for line in report) == 3, report


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
    # the options' cases
    for p in (HSTU_DET_LARGE, HSTU_WINDOW_LARGE):
        assert p.lengths().tolist() == HSTU_LARGE.lengths().tolist() and p.bwd
    assert all(0 < w < p.seqlen for w in HSTU_WINDOW_LARGE.window)
    p = HSTU_SPLIT_LARGE
    cu = np.concatenate([[0], np.cumsum(p.lengths())])
    t, hd = int(cu[-1]) + p.pad_rows, p.h * p.d
    assert t * hd < BOUNDARY < p.splits() * t * hd and 1 < p.splits() <= 16
    split, row = divmod(BOUNDARY // hd, t)
    assert split == p.splits() - 1 and row < cu[-1]
    assert int(np.searchsorted(cu, row, side="right")) - 1 in p.selection(cu)
    for name, p in HSTU_PAGED_LARGE.items():
        lens_q, lens_k = p.lengths()
        ids, ptr, need, num_pages, owner, spare = p.page_table()
        assert num_pages * p.page_elems > BOUNDARY and num_pages < 2**31
        cu_q = np.concatenate([[0], np.cumsum(lens_q)])
        sel = p.selection(cu_q, owner)
        assert owner[BOUNDARY // p.page_elems] in sel and 0 in sel and p.n_seq - 1 in sel
        assert np.concatenate([[0], np.cumsum(lens_k)])[-1] < 2**31 and p.h % p.h_kv == 0
        q_elems = (int(cu_q[-1]) + p.pad_rows) * p.h * p.d
        assert (q_elems > BOUNDARY) == (name == "prefill")
        if name == "prefill":
            assert any(cu_q[s] * p.h * p.d < BOUNDARY < cu_q[s + 1] * p.h * p.d for s in sel)
        assert min(lens_k[-6:]) == 0 and (lens_q <= lens_k).all()
    from jax_sparse_attn import metadata
    from jax_sparse_attn.ffi import bsa as ffi_bsa

    for p in list(BSA_DET_LARGE.values()) + [BSA_PACK_LARGE]:
        heads, n_q, n_kv, r = p.meta_dims()
        assert p.hq * p.sq * p.d > BOUNDARY
        if p.layout == "bhsd":
            assert (p.hq - 1) * p.s * p.d >= BOUNDARY
        assert heads * n_q * n_kv > 1 << 22 and heads * n_q * p.k_listed < 1 << 24
        assert 64 % r == 0 and p.blk == 128
    assert [-(-p.s // p.blk) for p in BSA_DET_LARGE.values()] == [
        4096, ffi_bsa.DET_ORDER_MAX_ROWS, ffi_bsa.DET_ORDER_MAX_ROWS]
    for p in BSA_SPLIT_LARGE.values():
        heads, n_q, n_kv, r = p.meta_dims()
        assert p.hkv * p.s * p.d > BOUNDARY and p.hq * p.sq * p.d < BOUNDARY and n_q == 1
        splits = (p.kv_splits if isinstance(p.kv_splits, int)
                  else metadata.auto_kv_splits(heads * n_q, p.k_listed, sms=132))
        assert splits > 1 and splits * p.hq * p.sq * p.d <= ffi_bsa._MAX_PARTIAL_ELEMS
        assert p.kv_offset(p.hkv - 1, p.s - 1) + p.d > BOUNDARY
        if p.layout == "bhsd":
            assert p.kv_offset(p.hkv - 1, 0) >= BOUNDARY
        else:
            assert p.kv_offset(0, (n_kv - 1) * p.blk) >= BOUNDARY


@pytest.fixture
def force_kernel(monkeypatch):
    """The kernel path's configuration without a GPU (``JAX_SPARSE_ATTN_FORCE_KERNEL``,
    sm_90a): needs CuTe DSL's JAX extension."""
    pytest.importorskip("cutlass.jax")
    monkeypatch.setenv("CUTE_DSL_ARCH", os.environ.get("CUTE_DSL_ARCH", "sm_90a"))
    monkeypatch.setenv("JAX_SPARSE_ATTN_FORCE_KERNEL", "1")


def _bsa_cfg(p, op="block_sparse_attention", switches=None, **over):
    from jax_sparse_attn import bsa
    from jax_sparse_attn.config import Switches

    if switches is None and p.bwd_ws:
        switches = Switches(bsa_bwd_ws=p.bwd_ws)

    S = jax.ShapeDtypeStruct
    bhsd = p.layout == "bhsd"
    q = S((1, p.hq, p.sq, p.d) if bhsd else (1, p.sq, p.hq, p.d), BF16)
    kv = S((1, p.hkv, p.s, p.d) if bhsd else (1, p.s, p.hkv, p.d), BF16)
    opts = dict(kv_splits=p.kv_splits, pack_gqa=p.pack_gqa, deterministic=p.deterministic)
    opts.update(over)
    cfg, *_ = bsa._make_config(q, kv, kv, p.block_lists(), p.k_listed, None, None,
                               sparse_block_size=p.blk, softmax_scale=None, layout=p.layout,
                               allow_empty_block_nums=False, backend="kernel",
                               switches=switches, op_name=op, **opts)
    return cfg


def test_large_plan_kernel_configs(force_kernel):
    """The device cases take the kernel paths they are meant to (the kernel configuration
    of the public layer, built without a GPU on sm_90a, 132 SMs): BSA deterministic sched /
    launch (the schedule-order kernel fits / not, one dQ accumulator per tile, the dQ
    workspace not zeroed), pack_gqa on the warp-specialized kernels, the split-KV decode's
    split counts (accepted: partials under _MAX_PARTIAL_ELEMS); HSTU deterministic (sm90,
    det_store), split-KV 4 with partials past 2**31 (accepted: no bound), paged (XLA / kernel
    schedule). And the documented 32-bit refusals: BSA kv_splits whose partials pass 2**31
    elements and a deterministic dqslots=2 workspace that two accumulators per tile take
    past 2**31 - 1 elements raise NotImplementedError naming the option."""
    from jax_sparse_attn import hstu, metadata
    from jax_sparse_attn.config import Switches
    from jax_sparse_attn.ffi import bsa as ffi_bsa
    from jax_sparse_attn.ffi import hstu as ffi_hstu
    from jax_sparse_attn.kernels.hstu_schedule import MAX_SEQS

    for which, p in BSA_DET_LARGE.items():
        cfg = _bsa_cfg(p)
        if which == "fixed":
            assert cfg.bwd.impl == "sm90ws" and cfg.bwd.dq_fixed and not cfg.bwd.deterministic
            assert ffi_bsa.det_order_config(cfg) is None
            assert math.prod(ffi_bsa.dq_tile_shape(cfg)) > ffi_bsa._MAX_ZERO_ELEMS
            continue
        assert cfg.bwd.impl == "sm90ws" and cfg.bwd.deterministic and cfg.bwd.det_store
        assert (ffi_bsa.det_order_config(cfg) is not None) == (which == "sched"), which
        assert ffi_bsa.det_slots_of(cfg) == 1
        assert math.prod(ffi_bsa.dq_tile_shape(cfg)) > ffi_bsa._MAX_ZERO_ELEMS
        assert cfg.fwd.kv_splits == 1
    cfg = _bsa_cfg(BSA_PACK_LARGE)
    assert cfg.fwd.pack_gqa == cfg.bwd.pack_gqa == 4
    assert cfg.bwd.impl == cfg.fwd.impl == "sm90ws"
    for p in BSA_SPLIT_LARGE.values():
        cfg = _bsa_cfg(p, op="block_sparse_attention_forward")
        want = (p.kv_splits if isinstance(p.kv_splits, int)
                else metadata.auto_kv_splits(p.hq, p.k_listed))
        assert cfg.fwd.kv_splits == want > 1 and cfg.fwd.impl == "sm90ws"
    # the documented refusals: split partials past 2**31 elements, dqslots=2 at 2.3e9
    with pytest.raises(NotImplementedError, match=r"kv_splits=2.*exceed 2\^31 elements"):
        _bsa_cfg(BSA_LARGE["bhsd-blk128"], op="block_sparse_attention_forward", kv_splits=2)
    # (9 heads x 2**20 x 128: one accumulator per tile fits 2**31 - 1 elements, two do not)
    cfg = _bsa_cfg(BSAPlan(hq=9, hkv=9, deterministic=True),
                   switches=Switches(bsa_bwd_ws=("dqslots=2",)))
    with pytest.raises(NotImplementedError, match=r"dqslots=2.*32-bit offsets"):
        ffi_bsa.det_slots_of(cfg)

    def hstu_cfg(p, paged=False, op="hstu_attention", **over):
        S = jax.ShapeDtypeStruct
        if paged:
            lens_q, lens_k = p.lengths()
            ids, ptr, need, num_pages, owner, spare = p.page_table()
            t = int(lens_q.sum()) + p.pad_rows
            args = (S((t, p.h, p.d), BF16), None, None,
                    np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32),
                    np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int32), None,
                    S((num_pages, 2, PAGE, p.h_kv, p.d), BF16), ids, ptr)
            kw = dict(max_seqlen_q=int(lens_q.max()), max_seqlen_k=int(lens_k.max()),
                      window_size=(-1, 0))
        else:
            lens = p.lengths()
            t = int(lens.sum()) + p.pad_rows
            x = S((t, p.h, p.d), BF16)
            cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
            args = (x, x, x, cu, cu, None, None, None, None)
            kw = dict(max_seqlen_q=p.seqlen, max_seqlen_k=p.seqlen, window_size=p.window,
                      deterministic=p.deterministic)
        kw.update(over)
        return hstu._make_config(*args, scaling_seqlen=None, alpha=1.0, backend="kernel",
                                 switches=None, op_name=op, kv_splits=p.kv_splits, **kw)

    cfg = hstu_cfg(HSTU_DET_LARGE)
    assert cfg.bwd.impl == "sm90" and cfg.bwd.deterministic and cfg.bwd.det_store
    assert hstu_cfg(HSTU_WINDOW_LARGE).window_size == (300, 40)
    cfg = hstu_cfg(HSTU_SPLIT_LARGE, op="hstu_attention_forward")
    assert cfg.kv_splits == cfg.fwd.kv_splits == 4 and cfg.fwd.impl == "sm90ws"
    for name, p in HSTU_PAGED_LARGE.items():
        cfg = hstu_cfg(p, paged=True)
        assert cfg.fwd.paged and cfg.bwd is None
        assert cfg.fwd.kv_splits == (4 if name == "decode-splits4" else 1)
        assert (p.n_seq + 2 <= MAX_SEQS) == (name != "prefill")
        if name != "prefill":  # the schedule kernel runs, the forward clamps the page ids
            t = int(p.lengths()[0].sum()) + p.pad_rows
            assert ffi_hstu._schedule_kernel_fits(cfg, None, p.n_seq,
                                                  t // cfg.fwd.block_m + p.n_seq + 1)
            assert cfg.fwd.page_id_clamp
