"""Timing helpers: first-call compile time, steady-state device time, per-call overhead.

How a steady-state time is measured (the same code on GPU and CPU):

* The op is wrapped as ``g = jax.jit(lambda sets: [fn(*s) for s in sets])`` over
  ``n_sets`` *different* input sets (distinct device buffers, chosen so that together they
  exceed the L2 cache), so one dispatch runs ``n_sets`` back-to-back launches on the device
  and no launch re-reads the previous launch's inputs from L2.
* After warm-up, one *sample* is ``reps`` calls of ``g`` dispatched asynchronously and one
  ``jax.block_until_ready`` at the end; the sample's time per op is
  ``wall / (reps * n_sets)``. Host dispatch and the final synchronisation are amortised
  over many launches, so this is the device time. ``reps`` is chosen so that a sample
  lasts about ``target_sample_s``. The reported time is the median over samples.

On CPU the "device" is the host, so the same numbers are wall-clock times.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

import jax

__all__ = ["Timing", "Overhead", "time_op", "measure_overhead", "nbytes", "choose_n_sets"]


def nbytes(tree: Any) -> int:
    """Total bytes of the arrays in a pytree."""
    return int(sum(getattr(x, "nbytes", 0) for x in jax.tree_util.tree_leaves(tree)))


def choose_n_sets(set_bytes: int, rotate_bytes: int, *, lo: int = 2, hi: int = 16) -> int:
    """Number of input sets to rotate through so that they cover ``rotate_bytes``."""
    if set_bytes <= 0:
        return lo
    return int(min(hi, max(lo, math.ceil(rotate_bytes / set_bytes))))


@dataclass
class Timing:
    """Result of :func:`time_op` (times in milliseconds / seconds as named)."""

    ms: float  # median steady-state time per op
    ms_min: float
    ms_max: float
    compile_s: float | None  # first call of a fresh jit: trace + lower + compile + one run
    n_sets: int
    reps: int
    samples_ms: list[float] = field(default_factory=list)
    first_output: Any = field(default=None, repr=False)  # output on sets[0] (if asked for)
    new_compiles: int | None = None  # count_fn() growth during the first call (e.g. CuTe compiles)

    def as_dict(self) -> dict:
        d = asdict(self)
        d.pop("first_output")
        return d


@dataclass
class Overhead:
    """Per-call overhead of a (tiny) op: wall time of one synchronous call minus device time."""

    wall_us: float  # median of call + block_until_ready, one call at a time
    dispatch_us: float  # median time for the call to return (asynchronous dispatch)
    device_us: float  # steady-state device time per op (see module docstring)
    overhead_us: float  # wall_us - device_us

    def as_dict(self) -> dict:
        return asdict(self)


def _sample(g: Callable, sets: Sequence, reps: int) -> float:
    t0 = time.perf_counter()
    out = None
    for _ in range(reps):
        out = g(sets)
    jax.block_until_ready(out)
    return time.perf_counter() - t0


def time_op(
    fn: Callable,
    sets: Sequence[tuple],
    *,
    target_sample_s: float = 0.03,
    n_samples: int = 7,
    warmup: int = 2,
    max_reps: int = 10_000,
    measure_compile: bool = True,
    keep_first_output: bool = False,
    count_fn: Callable[[], int] | None = None,
) -> Timing:
    """Time ``fn(*s)`` over the input sets ``sets`` (see the module docstring).

    ``fn`` must be a pure JAX function returning arrays (a pytree); it is jitted here.
    Raises whatever ``fn`` raises (e.g. ``NotImplementedError`` from an unsupported backend).
    """
    sets = list(sets)
    if not sets:
        raise ValueError("sets must hold at least one input set")
    compile_s = None
    first = None
    new_compiles = None
    if measure_compile or keep_first_output:
        # First call of a fresh jit of the single op: what a user pays once per configuration.
        f = jax.jit(fn)
        n0 = count_fn() if count_fn else None
        t0 = time.perf_counter()
        first = jax.block_until_ready(f(*sets[0]))
        if measure_compile:
            compile_s = time.perf_counter() - t0
        if count_fn:
            new_compiles = count_fn() - n0
        del f

    g = jax.jit(lambda ss: [fn(*s) for s in ss])
    est = None
    for _ in range(max(1, warmup)):
        est = _sample(g, sets, 1)
    per_call = max(est, 1e-6)
    reps = int(min(max_reps, max(1, round(target_sample_s / per_call))))
    samples = [_sample(g, sets, reps) / (reps * len(sets)) * 1e3 for _ in range(n_samples)]
    del g
    return Timing(
        first_output=first if keep_first_output else None,
        new_compiles=new_compiles,
        ms=statistics.median(samples),
        ms_min=min(samples),
        ms_max=max(samples),
        compile_s=compile_s,
        n_sets=len(sets),
        reps=reps,
        samples_ms=samples,
    )


def measure_overhead(fn: Callable, sets: Sequence[tuple], *, n_calls: int = 200) -> Overhead:
    """Per-call overhead of ``jax.jit(fn)`` on the given (tiny) input sets."""
    sets = list(sets)
    f = jax.jit(fn)
    jax.block_until_ready(f(*sets[0]))
    walls, dispatches = [], []
    for i in range(n_calls):
        args = sets[i % len(sets)]
        t0 = time.perf_counter()
        out = f(*args)
        t1 = time.perf_counter()
        jax.block_until_ready(out)
        t2 = time.perf_counter()
        dispatches.append(t1 - t0)
        walls.append(t2 - t0)
    dev = time_op(fn, sets, n_samples=5)
    wall_us = statistics.median(walls) * 1e6
    device_us = dev.ms * 1e3
    return Overhead(
        wall_us=wall_us,
        dispatch_us=statistics.median(dispatches) * 1e6,
        device_us=device_us,
        overhead_us=wall_us - device_us,
    )
