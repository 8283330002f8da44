"""Benchmark harness: ``python -m benchmarks.run --op {hstu,bsa,all} --grid {quick,full,tiny} --out DIR``.

For every configuration of the grid it times, in one process, through the public API only:

* ``kernel``    - our op with ``backend="kernel"`` (the CuTe DSL kernels; reported as
  ``unsupported`` where the platform or configuration has no kernel),
* ``reference`` - our op with ``backend="reference"`` (the pure-JAX/XLA path),
* ``cudnn_dense`` - ``jax.nn.dot_product_attention(..., implementation="cudnn")`` on the
  dense equivalent (softmax attention on the padded ``(B, L, H, D)`` tensors; causal/local for
  HSTU with the sequence lengths for jagged batches, non-causal full attention for BSA).
  Off GPU it is ``xla_dense`` (``implementation="xla"``), so the harness runs anywhere.

and the passes ``fwd`` (forward), ``bwd`` (the backward alone: the VJP function of a jitted
forward, applied to a random cotangent, so exactly what ``jax.grad`` runs after the
forward) and ``fwdbwd`` (forward + backward in one jitted function). Timing method: see
``benchmarks/_timing.py`` (device-side median after warm-up, rotating input sets larger than
L2). TFLOP/s are *effective*: the FLOPs of the sparse problem (``benchmarks/_grids.py``)
divided by the time, for anchors too. It also records each configuration's first-call
time of our op (``compile_s``: a fresh ``jax.jit`` in this process = trace + XLA compile +
any CuTe kernel compile not cached yet + one run; ``cute_compiles`` says how many CuTe
kernels that call compiled: passes run in the order fwd, bwd, fwdbwd, so fwdbwd usually
finds both kernels cached and a cold training step costs about fwd's + bwd's kernel
compiles) and the per-call overhead of a tiny shape. Writes ``DIR/<op>_<grid>.json``
(after every configuration, so an interrupted run keeps what it measured) and
``DIR/<op>_<grid>.png``, and prints a table.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import gc
import json
import os
import platform
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

__all__ = ["main", "run_op"]

PASSES = ("fwd", "bwd", "fwdbwd")
IMPLS = ("kernel", "reference", "dense")


# ----------------------------------------------------------------------------- cases
@dataclass
class Case:
    """A benchmark problem for one implementation.

    ``fwd(*inputs)`` returns the output array; the first ``n_diff`` inputs are
    differentiated (the rest are metadata); ``cots[i]`` is a cotangent for set i.
    """

    fwd: Callable
    inputs: list
    cots: list
    n_diff: int


def _dtype(name: str):
    import jax.numpy as jnp

    return {"bfloat16": jnp.bfloat16, "float16": jnp.float16, "float32": jnp.float32}[name]


# --lower-only: inputs are jax.ShapeDtypeStructs (nothing is generated or run)
_ABSTRACT_INPUTS = False


def _randn(key, shape, dtype, scale=1.0):
    import jax

    if _ABSTRACT_INPUTS:
        return jax.ShapeDtypeStruct(shape, dtype)
    return (jax.random.normal(key, shape, dtype="float32") * scale).astype(dtype)


def _nb(x) -> int:
    return int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize


def _hstu_arrays(cfg, lengths, key, dense: bool):
    import jax

    dt = _dtype(cfg.dtype)
    H, D = cfg.heads, cfg.head_dim
    ks = jax.random.split(key, 4)
    if not dense:
        T = int(lengths.sum())
        shape = (T, H, D)
    else:
        shape = (len(lengths), cfg.max_seqlen, H, D)
    return tuple(_randn(k, shape, dt) for k in ks)  # q, k, v, do


def hstu_cases(cfg, n_sets_fn, dense_impl: str | None):
    """Return (flops_fwd, {impl: factory}) for an HSTU config; factories build a Case."""
    import jax
    import jax.numpy as jnp

    import jax_sparse_attn as jsa

    from ._grids import hstu_fwd_flops, hstu_lengths

    lengths = hstu_lengths(cfg)
    flops = hstu_fwd_flops(lengths, cfg.heads, cfg.head_dim, cfg.window)
    L = int(cfg.max_seqlen)
    alpha = 1.0 / float(np.sqrt(cfg.head_dim))
    window = tuple(int(w) for w in cfg.window)
    cu = jnp.asarray(np.concatenate([[0], np.cumsum(lengths)]), dtype=jnp.int32)

    def make_ours(backend):
        def fwd(q, k, v, cu_seqlens):
            return jsa.hstu_attention(
                q, k, v, cu_seqlens, cu_seqlens, max_seqlen_q=L, max_seqlen_k=L,
                window_size=window, alpha=alpha, backend=backend,
            )

        def factory():
            one = _hstu_arrays(cfg, lengths, jax.random.key(0), dense=False)
            n = n_sets_fn(sum(_nb(x) for x in one))
            sets = [one] + [_hstu_arrays(cfg, lengths, jax.random.key(i), False) for i in range(1, n)]
            return Case(fwd, [(q, k, v, cu) for q, k, v, _ in sets], [s[3] for s in sets], 3)

        return factory

    def make_dense(impl):
        causal = window == (-1, 0)
        local = None if window in ((-1, 0), (-1, -1)) else window
        jagged = bool(np.any(lengths != L))
        lens = jnp.asarray(lengths, dtype=jnp.int32)

        def fwd(q, k, v, seq_lens):
            return jax.nn.dot_product_attention(
                q, k, v, is_causal=causal,
                query_seq_lengths=seq_lens if jagged else None,
                key_value_seq_lengths=seq_lens if jagged else None,
                local_window_size=local, implementation=impl,
            )

        def factory():
            one = _hstu_arrays(cfg, lengths, jax.random.key(0), dense=True)
            n = n_sets_fn(sum(_nb(x) for x in one))
            sets = [one] + [_hstu_arrays(cfg, lengths, jax.random.key(i), True) for i in range(1, n)]
            return Case(fwd, [(q, k, v, lens) for q, k, v, _ in sets], [s[3] for s in sets], 3)

        return factory

    facs = {"kernel": make_ours("kernel"), "reference": make_ours("reference")}
    if dense_impl:
        facs["dense"] = make_dense(dense_impl)
    return flops, facs


def _bsa_arrays(cfg, key, dense: bool):
    import jax

    dt = _dtype(cfg.dtype)
    B, Hq, Hk, S, D = cfg.batch, cfg.heads_q, cfg.heads_kv, cfg.seqlen, cfg.head_dim
    ks = jax.random.split(key, 4)
    if dense:  # jax.nn.dot_product_attention layout (B, S, H, D)
        shapes = [(B, S, Hq, D), (B, S, Hk, D), (B, S, Hk, D), (B, S, Hq, D)]
    else:
        shapes = [(B, Hq, S, D), (B, Hk, S, D), (B, Hk, S, D), (B, Hq, S, D)]
    return tuple(_randn(k, s, dt) for k, s in zip(ks, shapes))


def bsa_cases(cfg, n_sets_fn, dense_impl: str | None):
    import jax
    import jax.numpy as jnp

    import jax_sparse_attn as jsa

    from ._grids import bsa_fwd_flops, bsa_topk_index

    index_np = bsa_topk_index(cfg)
    flops = bsa_fwd_flops(cfg, index_np)
    topk, blk, layout = cfg.topk, cfg.blk, cfg.layout

    def make_ours(backend):
        def fwd(q, k, v, q2k_block_index):
            return jsa.block_sparse_attention(
                q, k, v, q2k_block_index, block_sparse_num=topk, sparse_block_size=blk,
                layout=layout, backend=backend,
            )

        def factory():
            idx = jnp.asarray(index_np)
            one = _bsa_arrays(cfg, jax.random.key(0), dense=False)
            n = n_sets_fn(sum(_nb(x) for x in one))
            sets = [one] + [_bsa_arrays(cfg, jax.random.key(i), False) for i in range(1, n)]
            return Case(fwd, [(q, k, v, idx) for q, k, v, _ in sets], [s[3] for s in sets], 3)

        return factory

    def make_dense(impl):
        def fwd(q, k, v):
            return jax.nn.dot_product_attention(q, k, v, implementation=impl)

        def factory():
            one = _bsa_arrays(cfg, jax.random.key(0), dense=True)
            n = n_sets_fn(sum(_nb(x) for x in one))
            sets = [one] + [_bsa_arrays(cfg, jax.random.key(i), True) for i in range(1, n)]
            return Case(fwd, [(q, k, v) for q, k, v, _ in sets], [s[3] for s in sets], 3)

        return factory

    facs = {"kernel": make_ours("kernel"), "reference": make_ours("reference")}
    if dense_impl:
        facs["dense"] = make_dense(dense_impl)
    return flops, facs


# ----------------------------------------------------------------------------- passes
def _pass_fn_and_sets(case: Case, pass_name: str):
    """(fn, sets) to time for one pass."""
    import jax

    nd = case.n_diff
    if pass_name == "fwd":
        return case.fwd, case.inputs

    def fwd_vjp(*inp):
        meta = inp[nd:]
        return jax.vjp(lambda *d: case.fwd(*d, *meta), *inp[:nd])

    if pass_name == "fwdbwd":

        def fb(*args):
            inp, do = args[:-1], args[-1]
            out, vjp_fn = fwd_vjp(*inp)
            return out, vjp_fn(do)

        return fb, [tuple(inp) + (do,) for inp, do in zip(case.inputs, case.cots)]
    if pass_name == "bwd":
        make = jax.jit(fwd_vjp)
        sets = []
        for inp, do in zip(case.inputs, case.cots):
            _, vjp_fn = make(*inp)
            sets.append((vjp_fn, do))
        jax.block_until_ready(sets)
        return (lambda vjp_fn, do: vjp_fn(do)), sets
    raise ValueError(f"unknown pass {pass_name!r}")


def _cute_cache_size() -> int:
    """Entries in cutlass.jax's in-process CuTe compile cache (-1 if unreadable). The growth
    during a first call says how many CuTe kernels that call compiled (the cache is keyed by
    kernel config *and* argument shapes, see docs/design.md)."""
    try:
        from cutlass.jax import compile as _cc

        return len(_cc._CUTLASS_COMPILE_CACHE)
    except Exception:
        return -1


def _status_of(exc: BaseException) -> str:
    return "unsupported" if isinstance(exc, NotImplementedError) else "error"


def _short(exc: BaseException, n: int = 400) -> str:
    s = f"{type(exc).__name__}: {exc}".replace("\n", " ")
    return s if len(s) <= n else s[: n - 3] + "..."


def _check_against(rows, checks, label, impl, out, row) -> None:
    """Sanity check of the timed forward: the kernel's output on input set 0 vs the
    reference's on the same inputs (both impls draw set 0 from the same PRNG key).
    Records ``check_rel_err`` = ||kernel - reference|| / ||reference|| (fp32) on both rows."""
    import jax.numpy as jnp

    if impl == "kernel":
        checks[label] = out
        return
    kern = checks.pop(label, None)
    if kern is None or out is None:
        return
    a = jnp.asarray(kern, jnp.float32)
    b = jnp.asarray(out, jnp.float32)
    err = float(jnp.linalg.norm(a - b) / jnp.maximum(jnp.linalg.norm(b), 1e-30))
    if not np.isfinite(err):
        err = float("inf")
    row["check_rel_err"] = err
    for r in rows:
        if r["label"] == label and r["impl"] == "kernel" and r["pass"] == "fwd":
            r["check_rel_err"] = err
    if err > 0.05:
        print(f"WARNING {label}: kernel forward differs from the reference: rel. error {err:.3g}",
              flush=True)


def _lower_only(doc, prepared, passes, op, dense_impl) -> None:
    """Trace + lower every kernel-path function the harness would time, for CUDA, on this
    machine (set JAX_SPARSE_ATTN_FORCE_KERNEL=1 and CUTE_DSL_ARCH=sm_90a; main() does when
    given --lower-only). Checks that each lowered program holds a CuTe DSL custom call."""
    import jax

    try:
        from cutlass.jax.ffi import _register_and_get_default_ffi_call_target

        target = _register_and_get_default_ffi_call_target(True)
    except Exception:
        target = "CuteDSLRT"
    for cfg, _, factories in prepared:
        case = factories["kernel"]()
        for p in passes:
            row = {"op": op, "label": cfg.label, "series": cfg.series, "impl": "kernel", "pass": p,
                   "config": cfg.as_dict(), "status": "lowered"}
            try:
                # bwd is timed as the VJP of a jitted forward: lowering fwd+bwd covers it
                fn, sets = _pass_fn_and_sets(case, "fwdbwd" if p == "bwd" else p)
                t0 = time.perf_counter()
                txt = jax.jit(fn).trace(*sets[0]).lower(lowering_platforms=("cuda",)).as_text()
                row["lower_s"] = time.perf_counter() - t0
                row["custom_calls"] = txt.count(target)
                if row["custom_calls"] == 0:
                    row.update(status="error", error=f"no CuTe DSL custom call ({target}) in the lowered program")
            except Exception as e:
                row.update(status=_status_of(e), error=_short(e))
            doc["results"].append(row)
            print(f"{row['label']:<44} kernel       {p:<7} {row['status']}"
                  + (f"  {row['custom_calls']} custom call(s), {row['lower_s']:.1f} s" if "lower_s" in row else "")
                  + (f"  {row.get('error', '')[:200]}" if row.get("error") else ""), flush=True)


def _derive_bwd(rows: list[dict], label: str, impl: str) -> None:
    """If timing the backward alone failed but fwd and fwdbwd worked, report their difference."""
    by = {r["pass"]: r for r in rows if r["label"] == label and r["impl"] == impl}
    b, f, fb = by.get("bwd"), by.get("fwd"), by.get("fwdbwd")
    if b and f and fb and b["status"] == "error" and f["status"] == fb["status"] == "ok":
        ms = fb["ms"] - f["ms"]
        if ms > 0:
            b.update(status="ok", ms=ms, tflops=b["flops"] / (ms * 1e-3) / 1e12, derived=True,
                     error=None, bwd_error=b.get("error"))


# ----------------------------------------------------------------------------- driver
def _device_meta() -> dict:
    import jax

    dev = jax.devices()[0]
    meta = {
        "jax": jax.__version__,
        "platform": dev.platform,
        "device_kind": getattr(dev, "device_kind", str(dev)),
        "device_count": jax.device_count(),
        "python": platform.python_version(),
        "utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    try:
        meta["git_commit"] = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10,
            cwd=os.path.dirname(os.path.abspath(__file__)),
        ).stdout.strip() or None
    except Exception:  # pragma: no cover - no git on the device host
        meta["git_commit"] = None
    try:
        from jax_sparse_attn._platform import kernel_platform_unavailable_reason

        meta["kernel_unavailable_reason"] = kernel_platform_unavailable_reason()
    except Exception as e:  # pragma: no cover
        meta["kernel_unavailable_reason"] = _short(e)
    return meta


def _dense_impl(choice: str, platform_name: str) -> str | None:
    if choice == "none":
        return None
    if choice == "auto":
        return "cudnn" if platform_name == "gpu" else "xla"
    return choice


def _impl_name(impl: str, dense_impl: str | None) -> str:
    return f"{dense_impl}_dense" if impl == "dense" else impl


def _fmt(x, spec):
    return "-" if x is None else format(x, spec)


def _print_row(r: dict) -> None:
    msg = r.get("error") or ""
    print(
        f"{r['label']:<44} {r['impl']:<12} {r['pass']:<7} {_fmt(r.get('ms'), '9.4f')} ms "
        f"{_fmt(r.get('tflops'), '8.4g')} TFLOP/s  compile {_fmt(r.get('compile_s'), '6.2f')} s  "
        f"{r['status']}"
        + (f"  check {r['check_rel_err']:.2e}" if r.get("check_rel_err") is not None else "")
        + (f"  {msg[:160]}" if msg else ""),
        flush=True,
    )


def summary_table(rows: list[dict]) -> str:
    """A compact pivot: per configuration, effective TFLOP/s of each impl and pass."""
    labels = list(dict.fromkeys(r["label"] for r in rows))
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    cols = [(i, p) for i in impls for p in PASSES if any(r["impl"] == i and r["pass"] == p for r in rows)]
    head = f"{'configuration (effective TFLOP/s)':<44}" + "".join(f"{i[:11] + ' ' + p:>20}" for i, p in cols)
    lines = [head, "-" * len(head)]
    by = {(r["label"], r["impl"], r["pass"]): r for r in rows}
    for lab in labels:
        cells = []
        for i, p in cols:
            r = by.get((lab, i, p))
            if r is None:
                cells.append(f"{'':>20}")
            elif r["status"] == "ok":
                cells.append(f"{r['tflops']:>11.4g} ({r['ms']:.3f}ms)"[-20:].rjust(20))
            else:
                cells.append(f"{r['status']:>20}")
        lines.append(f"{lab:<44}" + "".join(cells))
    return "\n".join(lines)


def run_op(op: str, args) -> dict:
    """Run one op's grid; returns the JSON document that was written."""
    from . import _grids
    from ._plot import plot_results
    from ._timing import choose_n_sets, measure_overhead, time_op

    t_start = time.perf_counter()
    meta = _device_meta()
    dense_impl = _dense_impl(args.dense, meta["platform"])
    impls = [i for i in args.impls.split(",") if i]
    passes = [p for p in args.passes.split(",") if p]
    for i in impls:
        if i not in IMPLS:
            raise ValueError(f"--impls: unknown implementation {i!r}; allowed: {', '.join(IMPLS)}")
    for p in passes:
        if p not in PASSES:
            raise ValueError(f"--passes: unknown pass {p!r}; allowed: {', '.join(PASSES)}")
    if dense_impl is None:
        impls = [i for i in impls if i != "dense"]
    configs = _grids.grid(op, args.grid)
    if args.dtype:
        configs = [dataclasses.replace(c, dtype=args.dtype) for c in configs]
    if args.filter:
        configs = [c for c in configs if re.search(args.filter, c.label)]
    if args.shard:
        k, n = (int(x) for x in args.shard.split("/"))
        if not 0 <= k < n:
            raise ValueError(f"--shard must be K/N with 0 <= K < N, got {args.shard!r}")
        configs = configs[k::n]
    if args.limit:
        configs = configs[: args.limit]
    rotate_bytes = int(args.rotate_mb * 2**20)

    def n_sets_fn(set_bytes):
        return choose_n_sets(set_bytes, rotate_bytes, lo=args.min_sets, hi=args.max_sets)

    cases_fn = {"hstu": hstu_cases, "bsa": bsa_cases}[op]
    os.makedirs(args.out, exist_ok=True)
    stem = f"{op}_{args.grid}" + (f"_shard{args.shard.replace('/', 'of')}" if args.shard else "")
    json_path = os.path.join(args.out, f"{stem}.json")
    png_path = os.path.join(args.out, f"{stem}.png")
    doc = {"op": op, "grid": args.grid, "meta": meta, "settings": vars(args).copy(), "results": [],
           "overhead": []}

    def save():
        doc["elapsed_s"] = time.perf_counter() - t_start
        with open(json_path, "w") as f:
            json.dump(doc, f, indent=1, default=str)

    print(f"== {op} grid={args.grid} on {meta['device_kind']} (jax {meta['jax']}); "
          f"kernel backend: {meta['kernel_unavailable_reason'] or 'available'}", flush=True)
    # Implementation-major order: if the time budget runs out, our kernel's numbers are
    # complete and only anchors are missing.
    prepared = []
    checks: dict = {}
    for cfg in configs:
        try:
            prepared.append((cfg,) + tuple(cases_fn(cfg, n_sets_fn, dense_impl)))
        except Exception as e:
            doc["results"].append({"op": op, "label": cfg.label, "series": cfg.series,
                                   "impl": "-", "pass": "-", "status": "error", "error": _short(e)})
            _print_row(doc["results"][-1])
    if args.lower_only:
        _lower_only(doc, prepared, passes, op, dense_impl)
        save()
        print(f"wrote {json_path}", flush=True)
        return doc
    for impl in impls:
        for cfg, flops_fwd, factories in prepared:
            seqlen = getattr(cfg, "max_seqlen", None) or getattr(cfg, "seqlen")
            case = None
            skip_rest = None
            for p in passes:
                row = {
                    "op": op, "label": cfg.label, "series": cfg.series, "seqlen": seqlen,
                    "impl": _impl_name(impl, dense_impl), "pass": p, "config": cfg.as_dict(),
                    "flops": flops_fwd * _grids.PASS_FLOP_FACTOR[p], "status": "ok",
                    "ms": None, "tflops": None, "compile_s": None,
                }
                elapsed = time.perf_counter() - t_start
                if args.budget_s and elapsed > args.budget_s:
                    row.update(status="skipped", error=f"time budget {args.budget_s}s spent")
                elif skip_rest is not None:
                    row.update(status=skip_rest[0], error=skip_rest[1])
                else:
                    try:
                        if case is None:
                            case = factories[impl]()
                        fn, sets = _pass_fn_and_sets(case, p)
                        # First-call time matters to users for inference (fwd) and training
                        # (fwdbwd) of our op; skipping it elsewhere saves compiles.
                        check = p == "fwd" and impl in ("kernel", "reference") and args.check
                        t = time_op(fn, sets, target_sample_s=args.sample_s, n_samples=args.samples,
                                    measure_compile=impl != "dense" and p != "bwd",
                                    keep_first_output=check,
                                    count_fn=_cute_cache_size if impl == "kernel" else None)
                        if check:
                            _check_against(doc["results"], checks, cfg.label, impl, t.first_output, row)
                        row.update(ms=t.ms, tflops=row["flops"] / (t.ms * 1e-3) / 1e12,
                                   compile_s=t.compile_s, n_sets=t.n_sets, reps=t.reps,
                                   ms_min=t.ms_min, ms_max=t.ms_max)
                        if t.new_compiles is not None:
                            row["cute_compiles"] = t.new_compiles
                        del fn, sets
                    except Exception as e:
                        row.update(status=_status_of(e), error=_short(e))
                        if isinstance(e, NotImplementedError) and p == "fwd":
                            skip_rest = (row["status"], row["error"])
                doc["results"].append(row)
                _print_row(row)
            _derive_bwd(doc["results"], cfg.label, _impl_name(impl, dense_impl))
            del case
            gc.collect()
            save()

    # Per-call overhead of a tiny shape (forward), for our two backends.
    if not args.no_overhead:
        tiny = (_grids.HSTUConfig(max_seqlen=128, head_dim=64, heads=2, tokens=128)
                if op == "hstu" else
                _grids.BSAConfig(256, density=0.5, blk=64, heads_q=2, heads_kv=2, head_dim=64))
        _, factories = cases_fn(tiny, lambda b: 8, None)
        for impl in ("kernel", "reference"):
            if impl not in impls:
                continue
            ent = {"impl": impl, "label": tiny.label}
            try:
                case = factories[impl]()
                ent.update(measure_overhead(case.fwd, case.inputs, n_calls=args.overhead_calls).as_dict())
                ent["status"] = "ok"
                print(f"overhead {tiny.label} {impl}: wall {ent['wall_us']:.1f} us, device "
                      f"{ent['device_us']:.1f} us, overhead {ent['overhead_us']:.1f} us, dispatch "
                      f"{ent['dispatch_us']:.1f} us", flush=True)
            except Exception as e:
                ent.update(status=_status_of(e), error=_short(e))
                print(f"overhead {tiny.label} {impl}: {ent['status']} {ent['error'][:160]}", flush=True)
            doc["overhead"].append(ent)
    doc["floors"] = _grids.floor_report(doc["results"])
    save()
    print()
    print(summary_table(doc["results"]))
    for fl in doc["floors"]:
        verdict = "n/a" if fl["meets"] is None else ("meets" if fl["meets"] else "BELOW")
        got = "-" if fl["tflops"] is None else f"{fl['tflops']:.1f}"
        print(f"floor  {fl['label']:<44} {fl['pass']:<7} {got:>8} TFLOP/s vs {fl['floor_tflops']:.0f}: {verdict}")
    try:
        out_png = plot_results(doc["results"], png_path,
                               title=f"{op} ({args.grid}) on {meta['device_kind']}, jax {meta['jax']}")
        doc["plot"] = out_png
    except Exception as e:  # plotting must never lose the measurements
        doc["plot_error"] = _short(e)
    save()
    print(f"\nwrote {json_path}" + (f" and {doc['plot']}" if doc.get("plot") else ""), flush=True)
    print(f"{op}: {time.perf_counter() - t_start:.1f} s in total", flush=True)
    return doc


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--op", default="all", help="hstu, bsa, or all (default)")
    p.add_argument("--grid", default="quick", choices=("quick", "full", "tiny"),
                   help="quick (a few headline shapes, ~3 min/op on an H200), full (the issue's grid), "
                        "tiny (CPU smoke)")
    p.add_argument("--out", required=True, help="output folder for <op>_<grid>.json / .png")
    p.add_argument("--impls", default="kernel,reference,dense",
                   help="comma list of kernel, reference, dense (default all)")
    p.add_argument("--passes", default="fwd,bwd,fwdbwd", help="comma list of fwd, bwd, fwdbwd")
    p.add_argument("--dense", default="auto", choices=("auto", "cudnn", "xla", "none"),
                   help="dense anchor implementation: auto = cudnn on GPU, xla elsewhere")
    p.add_argument("--rotate-mb", type=float, default=256.0,
                   help="rotate through input sets totalling at least this many MiB (L2 is 50 MiB)")
    p.add_argument("--min-sets", type=int, default=2)
    p.add_argument("--max-sets", type=int, default=16)
    p.add_argument("--sample-s", type=float, default=0.03, help="target seconds per timing sample")
    p.add_argument("--samples", type=int, default=7, help="timing samples; the median is reported")
    p.add_argument("--budget-s", type=float, default=None,
                   help="stop timing new points after this many seconds per op (default: 150 for "
                        "quick, none otherwise); skipped points are recorded")
    p.add_argument("--limit", type=int, default=0, help="only the first N configurations")
    p.add_argument("--filter", default=None, help="only configurations whose label matches this regex "
                   "(labels look like 'hstu D128 H4 jagged causal L4096', 'bsa blk64 top32/256 H16/4 D128 S16384')")
    p.add_argument("--shard", default=None, help="K/N: every N-th configuration starting at K (split "
                   "--grid full over several device calls; merge with --merge)")
    p.add_argument("--merge", nargs="+", default=None, metavar="JSON",
                   help="no timing: merge these result JSON files into OUT/<op>_merged.json + .png")
    p.add_argument("--no-overhead", action="store_true", help="skip the tiny-shape overhead measurement")
    p.add_argument("--lower-only", action="store_true",
                   help="run nothing: lower the kernel path of every configuration for CUDA (sm_90a) on "
                        "this machine, to catch errors before spending GPU time")
    p.add_argument("--no-check", dest="check", action="store_false",
                   help="skip comparing the kernel's forward output with the reference's")
    p.add_argument("--dtype", default=None, choices=("bfloat16", "float16"),
                   help="input dtype (default: each configuration's, bfloat16)")
    p.add_argument("--overhead-calls", type=int, default=200)
    args = p.parse_args(argv)
    if args.budget_s is None and args.grid == "quick":
        args.budget_s = 150.0
    return args


def merge(paths: list[str], out: str) -> list[str]:
    """Merge result JSON files (e.g. shards) per op into ``out/<op>_merged.json`` + ``.png``."""
    from ._plot import plot_results

    docs: dict[str, list] = {}
    for path in paths:
        with open(path) as f:
            d = json.load(f)
        docs.setdefault(d["op"], []).append(d)
    os.makedirs(out, exist_ok=True)
    written = []
    for op, ds in docs.items():
        merged = {"op": op, "grid": "+".join(sorted({d["grid"] for d in ds})), "meta": ds[0]["meta"],
                  "sources": [os.path.basename(p) for p in paths],
                  "results": [r for d in ds for r in d["results"]],
                  "overhead": [o for d in ds for o in d.get("overhead", [])]}
        path = os.path.join(out, f"{op}_merged.json")
        merged["plot"] = plot_results(merged["results"], os.path.join(out, f"{op}_merged.png"),
                                      title=f"{op} ({merged['grid']}) on {merged['meta']['device_kind']}")
        with open(path, "w") as f:
            json.dump(merged, f, indent=1, default=str)
        print(summary_table(merged["results"]))
        written.append(path)
    return written


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.lower_only:
        global _ABSTRACT_INPUTS
        _ABSTRACT_INPUTS = True
        os.environ["JAX_SPARSE_ATTN_FORCE_KERNEL"] = "1"
        os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    if args.merge:
        for path in merge(args.merge, args.out):
            print(f"wrote {path}")
        return 0
    ops = ["hstu", "bsa"] if args.op == "all" else [o for o in args.op.split(",") if o]
    for op in ops:
        if op not in ("hstu", "bsa"):
            print(f"--op must be hstu, bsa or all, got {op!r}", file=sys.stderr)
            return 2
    for op in ops:
        run_op(op, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
