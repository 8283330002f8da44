"""HSTU kernel benchmark: prints ms and TFLOP/s, writes JSON (not a test).

FLOPs: causal forward = 2 * sum_b L_b^2 * H * D, full = 2x that; backward = 2.5x forward.
Times are wall-clock per call of the jitted kernel-backend function
(``jax_sparse_attn.ffi.hstu``; tile-schedule metadata ops included), averaged over
``--iters`` back-to-back calls after warm-up.

    python benchmarks/hstu_bench.py --out /tmp/hstu_bench.json
    python benchmarks/hstu_bench.py --case 8x4096-causal --dtype bfloat16
    python benchmarks/hstu_bench.py --case 8x4096-causal --case movielens-128x200 --rab f32:1
    python benchmarks/hstu_bench.py --case 8x4096-causal --bwd-impl sm80 --bwd-impl sm90 \
        --bwd-only    # the backward kernels of the hstu_bwd_impl switch side by side
    python benchmarks/hstu_bench.py --inference all   # paged / short-query forward rows

``--variant 'ENV=V,ENV=V'`` (repeatable; ``+`` in a value stands for a comma of a
comma-list switch, e.g. ``JAX_SPARSE_ATTN_HSTU_WS=dynamic+chunk=16384``) runs every case with the switches of those
``JAX_SPARSE_ATTN_*`` variables (validated by ``config.from_env``), e.g. the portable kernel
family on an H100/H200 beside the default Hopper kernels::

    python benchmarks/hstu_bench.py --case 8x4096-causal --variant '' \
        --variant JAX_SPARSE_ATTN_KERNEL_FAMILY=portable --reference

``--reference`` adds a row of the pure-JAX reference backend (``backend="reference"``, the
path ``backend="auto"`` takes where the kernels cannot run) for each case.

``--deterministic`` runs every case (and every ``--variant``) twice, the second time with
``deterministic=True`` (ordered dq additions), and prints the backward time ratio default /
deterministic.

    python benchmarks/hstu_bench.py --case 8x4096-causal --case jagged32-causal \
        --bwd-only --deterministic

``--rab DTYPE:H_RAB`` (``f32`` or ``q`` = q's dtype; ``H_RAB`` 1 or ``h``) runs every case a
second time with a random relative attention bias ``(B, H_rab, L, L)`` (same FLOP count: the
bias add is not counted) and prints both rows.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

import jax
import jax.numpy as jnp
import numpy as np

from jax_sparse_attn.config import SWITCHES, Switches, from_env

_BWD_IMPLS = next(sw.allowed for sw in SWITCHES if sw.field == "hstu_bwd_impl")
_BWD_DQ = next(sw.allowed for sw in SWITCHES if sw.field == "hstu_bwd_dq")

CASES = {
    # name: (B, L, H, D, window)
    "8x4096-causal": (8, 4096, 4, 128, (-1, 0)),
    "32x1024-causal": (32, 1024, 4, 128, (-1, 0)),
    "8x4096-full": (8, 4096, 4, 128, (-1, -1)),
    "16x2048-causal": (16, 2048, 4, 128, (-1, 0)),
    "64x512-causal": (64, 512, 4, 128, (-1, 0)),
    "8x4096-causal-d64": (8, 4096, 4, 64, (-1, 0)),
    "32x1024-causal-d64": (32, 1024, 4, 64, (-1, 0)),
    "16x2048-causal-d64": (16, 2048, 4, 64, (-1, 0)),
    "64x512-causal-d64": (64, 512, 4, 64, (-1, 0)),
    "4x8192-causal-d64": (4, 8192, 4, 64, (-1, 0)),
    "8x4096-causal-d256": (8, 4096, 4, 256, (-1, 0)),
    "8x4096-causal-d32": (8, 4096, 4, 32, (-1, 0)),
    # MovieLens-1M sequence model shape (HSTU paper's ML-1M setup: L 200, one head, D 64)
    "movielens-128x200": (128, 200, 1, 64, (-1, 0)),
    # the canonical jagged batch (benchmarks._grids.canonical_jagged_lengths), H=4, D=128
    "jagged32-causal": ("jagged", None, 4, 128, (-1, 0)),
    "jagged32-causal-d64": ("jagged", None, 4, 64, (-1, 0)),
}


def _lengths(name):
    b, l = CASES[name][:2]
    if b == "jagged":
        from benchmarks._grids import canonical_jagged_lengths

        return np.asarray(canonical_jagged_lengths(), np.int64)
    return np.full(b, l, np.int64)


def flops_fwd(lens, h, d, window):
    causal = 2.0 * float(np.sum(np.asarray(lens, np.float64) ** 2)) * h * d
    return 2 * causal if window == (-1, -1) else causal


def _time(fn, args, iters, warmup=3, samples=7):
    """Median over ``samples`` of the mean time of ``iters`` back-to-back calls (ms)."""
    for _ in range(warmup):
        jax.block_until_ready(fn(*args))
    out = []
    for _ in range(samples):
        t0 = time.perf_counter()
        for _ in range(iters):
            r = fn(*args)
        jax.block_until_ready(r)
        out.append((time.perf_counter() - t0) / iters * 1e3)
    return float(np.median(out))


def _rab_array(spec, b, h, l, dtype):
    """The ``--rab`` bias ``(b, H_rab, l, l)``: ``spec`` = ``"f32:1"``, ``"q:h"``, ..."""
    if not spec:
        return None
    dt, hr = spec.split(":")
    h_rab = h if hr == "h" else int(hr)
    r = jax.random.normal(jax.random.PRNGKey(7), (b, h_rab, l, l), jnp.float32)
    return r.astype(jnp.float32 if dt == "f32" else dtype)


def run_case(name, dtype, iters, do_bwd, switches=None, do_fwd=True, rab="", backend="kernel",
             variant=None, deterministic=False):
    import jax_sparse_attn as jsa

    _, _, h, d, window = CASES[name]
    lens = _lengths(name)
    b, l = len(lens), int(lens.max())
    t = int(lens.sum())
    ks = jax.random.split(jax.random.PRNGKey(0), 4)
    q, k, v, do = (jax.random.normal(kk, (t, h, d), jnp.float32).astype(dtype) for kk in ks)
    cu = jnp.asarray(np.concatenate([[0], np.cumsum(lens)]), jnp.int32)
    kw = dict(max_seqlen_q=l, max_seqlen_k=l, scaling_seqlen=float(l), window_size=window,
              alpha=1.0 / np.sqrt(d), backend=backend, switches=switches,
              deterministic=deterministic)
    r = _rab_array(rab, b, h, l, dtype)
    fl = flops_fwd(lens, h, d, window)
    res = dict(case=name, dtype=jnp.dtype(dtype).name, B=b, L=l, H=h, D=d, window=window,
               rab=rab or None, deterministic=deterministic)
    res["backend"] = backend
    if variant is not None:
        res["variant"] = variant
    if backend == "kernel":
        choice = jsa.which_backend(jsa.hstu_attention, q, k, v, cu, cu, **kw)
        res["kernel_choice"] = choice.reason
    if switches is not None and variant is None:
        res["bwd_impl"] = switches.hstu_bwd_impl
        if switches.hstu_bwd_impl == "sm90":
            res["bwd_impl"] += f"/{switches.hstu_bwd_dq}"
    tag = f"{name} rab={rab}" if rab else name
    if backend != "kernel" or variant:
        tag += f" [{backend if backend != 'kernel' else variant}]"
    tag += " det" if deterministic else ""
    line = f"{tag:30s} {res['dtype']:9s}"
    if do_fwd:
        fwd = jax.jit(lambda q, k, v, cu, r: jsa.hstu_attention(q, k, v, cu, cu, rab=r, **kw))
        t0 = time.perf_counter()
        jax.block_until_ready(fwd(q, k, v, cu, r))
        compile_fwd = time.perf_counter() - t0
        ms = _time(fwd, (q, k, v, cu, r), iters)
        res.update(fwd_ms=ms, fwd_tflops=fl / ms / 1e9, fwd_first_call_s=compile_fwd)
        line += f" fwd {ms:8.3f} ms {res['fwd_tflops']:7.1f} TFLOP/s"
    if do_bwd:
        bwd = jax.jit(lambda do, q, k, v, cu, r: tuple(
            jsa.hstu_attention_backward(do, q, k, v, cu, cu, rab=r, **kw)))
        t0 = time.perf_counter()
        jax.block_until_ready(bwd(do, q, k, v, cu, r))
        res["bwd_first_call_s"] = time.perf_counter() - t0
        ms_b = _time(bwd, (do, q, k, v, cu, r), iters)
        res.update(bwd_ms=ms_b, bwd_tflops=2.5 * fl / ms_b / 1e9)
    if do_bwd:
        impl = f" [{res['bwd_impl']}]" if "bwd_impl" in res else ""
        line += f" | bwd{impl} {res['bwd_ms']:8.3f} ms {res['bwd_tflops']:7.1f} TFLOP/s"
    print(line, flush=True)
    return res


#: inference rows (``--inference``): name -> (B, L_q, L_k, H, H_kv, D); causal, bottom-right
#: aligned targets over histories, contiguous K/V and the paged cache (page 128)
INFERENCE = {
    "paged-8x4096": (8, 4096, 4096, 4, 4, 128),
    "target1-64x8192": (64, 1, 8192, 4, 4, 128),
    "target64-64x8192": (64, 64, 8192, 4, 4, 128),
    "target64-64x8192-gqa4": (64, 64, 8192, 4, 1, 128),
    # few sequences: the query tiles x heads fill a fraction of the GPU; kv_splits="auto"
    # splits the keys (the row also times kv_splits=1)
    "target1-8x8192": (8, 1, 8192, 4, 4, 128),
    "target64-8x8192": (8, 64, 8192, 4, 4, 128),
}
#: H200 HBM3e peak bandwidth (bytes/s) for the achieved-bandwidth column
HBM_PEAK = 4.8e12


def _paged_cache(k, v, b, l_k, h_kv, d, seed=0):
    """The contiguous ``(B * L_k, H_kv, D)`` k/v as a paged cache with shuffled pages."""
    pages = -(-l_k // 128)
    kp = jnp.pad(k.reshape(b, l_k, h_kv, d), ((0, 0), (0, pages * 128 - l_k), (0, 0), (0, 0)))
    vp = jnp.pad(v.reshape(b, l_k, h_kv, d), ((0, 0), (0, pages * 128 - l_k), (0, 0), (0, 0)))
    kv = jnp.stack([kp.reshape(b * pages, 128, h_kv, d), vp.reshape(b * pages, 128, h_kv, d)], 1)
    perm = np.random.default_rng(seed).permutation(b * pages)
    kv = kv[jnp.asarray(np.argsort(perm))]  # logical page p lives at cache row perm[p]
    ids = jnp.asarray(perm.astype(np.int32))
    ptr = jnp.asarray((np.arange(b + 1) * pages).astype(np.int32))
    return kv, ids, ptr


def _case_rows(a, case, switches, tag, **kw):
    """The rows of ``case`` with ``switches``: without and with ``--rab`` (only with it under
    ``--rab-only``), each also with ``deterministic=True`` under ``--deterministic`` (the
    backward time ratio added to the deterministic row); a row that raises is reported
    (``tag`` names the variant) and left out."""
    out = []
    for rab in ((a.rab,) if a.rab_only else ("", a.rab)) if a.rab else ("",):
        rows = []
        for det in (False, True) if a.deterministic else (False,):
            try:
                rows.append(run_case(case, jnp.dtype(a.dtype), a.iters, not a.no_bwd,
                                     switches, do_fwd=not a.bwd_only, rab=rab,
                                     deterministic=det, **kw))
            except Exception as e:  # noqa: BLE001 - report, go on with the other rows
                print(f"{case:22s} {tag} rab={rab} deterministic={det}: failed: "
                      f"{type(e).__name__}: {str(e)[:300]}", flush=True)
        if len(rows) == 2 and "bwd_ms" in rows[0]:
            ratio = rows[0]["bwd_ms"] / rows[1]["bwd_ms"]
            rows[1]["bwd_speed_vs_default"] = ratio
            print(f"{'':30s} deterministic bwd speed = {ratio:.3f} x default", flush=True)
        out.extend(rows)
    return out


def run_inference(name, dtype, iters, switches=None, schedule_ab=False, paged_variants=(),
                  contiguous_variants=()):
    """One inference row: the forward with contiguous K/V and with the paged cache; ms,
    TFLOP/s (useful work: the causal pairs) and the achieved bandwidth of the K/V read
    (B * L_k * H_kv * (D + D_v) * 2 bytes per call) against the HBM peak. ``schedule_ab``
    adds the paged call with ``hstu_schedule="xla"`` (jnp tile schedule and page-table
    sanitising) as ``paged_xla``; ``paged_variants`` / ``contiguous_variants``: more paged /
    contiguous rows, ``'ENV=V,ENV=V'`` strings of ``JAX_SPARSE_ATTN_*`` switches
    (``paged[ENV=V,...]`` / ``contiguous[...]``)."""
    import jax_sparse_attn as jsa

    b, l_q, l_k, h, h_kv, d = INFERENCE[name]
    ks = jax.random.split(jax.random.PRNGKey(0), 3)
    q = jax.random.normal(ks[0], (b * l_q, h, d), jnp.float32).astype(dtype)
    k, v = (jax.random.normal(kk, (b * l_k, h_kv, d), jnp.float32).astype(dtype)
            for kk in ks[1:])
    cu_q = jnp.asarray(np.arange(b + 1) * l_q, jnp.int32)
    cu_k = jnp.asarray(np.arange(b + 1) * l_k, jnp.int32)
    kv, ids, ptr = _paged_cache(k, v, b, l_k, h_kv, d)
    kw = dict(max_seqlen_q=l_q, max_seqlen_k=l_k, scaling_seqlen=float(l_q),
              alpha=1.0 / np.sqrt(d), backend="kernel", switches=switches)
    # visible (query, key) pairs, bottom-right causal: query i sees L_k - L_q + i + 1 keys
    pairs = b * sum(l_k - l_q + i + 1 for i in range(l_q))
    fl = 2.0 * 2.0 * pairs * h * d
    kv_bytes = b * l_k * h_kv * 2 * d * jnp.dtype(dtype).itemsize
    res = dict(case=name, dtype=jnp.dtype(dtype).name, B=b, L_q=l_q, L_k=l_k, H=h, H_kv=h_kv,
               D=d, kv_bytes=kv_bytes)
    from jax_sparse_attn.ffi.hstu import resolve_kv_splits

    res["kv_splits_auto"] = resolve_kv_splits("auto", batch=b, num_heads=h, max_seqlen_q=l_q,
                                              max_seqlen_k=l_k)
    contiguous = jax.jit(lambda q, k, v, a, c: jsa.hstu_attention(q, k, v, a, c, **kw))
    paged = jax.jit(lambda q, kv, i, p, a, c: jsa.hstu_attention(
        q, None, None, a, c, paged_kv=kv, page_ids=i, page_indptrs=p, **kw))
    variants = [("contiguous", contiguous, (q, k, v, cu_q, cu_k)),
                ("paged", paged, (q, kv, ids, ptr, cu_q, cu_k))]
    if schedule_ab:
        kw_xla = dict(kw, switches=dataclasses.replace(switches or from_env(),
                                                       hstu_schedule="xla"))
        variants.append(("paged_xla", jax.jit(lambda q, kv, i, p, a, c: jsa.hstu_attention(
            q, None, None, a, c, paged_kv=kv, page_ids=i, page_indptrs=p, **kw_xla)),
            (q, kv, ids, ptr, cu_q, cu_k)))
    for var in paged_variants:
        env = dict(kv.partition("=")[::2] for kv in filter(None, var.split(",")))
        kw_var = dict(kw, switches=from_env(env))
        variants.append((f"paged[{var}]", jax.jit(
            lambda q, kv, i, p, a, c, kw_var=kw_var: jsa.hstu_attention(
                q, None, None, a, c, paged_kv=kv, page_ids=i, page_indptrs=p, **kw_var)),
            (q, kv, ids, ptr, cu_q, cu_k)))
    for var in contiguous_variants:
        env = dict(kv.partition("=")[::2] for kv in filter(None, var.split(",")))
        kw_var = dict(kw, switches=from_env(env))
        variants.append((f"contiguous[{var}]", jax.jit(
            lambda q, k, v, a, c, kw_var=kw_var: jsa.hstu_attention(q, k, v, a, c, **kw_var)),
            (q, k, v, cu_q, cu_k)))
    if res["kv_splits_auto"] > 1:
        variants.append(("contiguous_nosplit", jax.jit(lambda q, k, v, a, c: jsa.hstu_attention(
            q, k, v, a, c, kv_splits=1, **kw)), (q, k, v, cu_q, cu_k)))
    line = f"{name:24s} {res['dtype']:9s} splits={res['kv_splits_auto']:2d}"
    for tag, fn, args in variants:
        ms = _time(fn, args, iters)
        bw = kv_bytes / (ms * 1e-3)
        res[tag] = dict(ms=ms, tflops=fl / ms / 1e9, kv_gbps=bw / 1e9, kv_hbm_frac=bw / HBM_PEAK)
        line += (f" | {tag} {ms:8.3f} ms {fl / ms / 1e9:6.1f} TFLOP/s K/V {bw / 1e9:7.1f} GB/s"
                 f" ({100 * bw / HBM_PEAK:4.1f}% HBM)")
    res["paged_over_contiguous"] = res["paged"]["ms"] / res["contiguous"]["ms"]
    print(line, flush=True)
    return res


def _tile(text):
    return None if text is None else tuple(int(x) for x in text.split(","))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", action="append", choices=sorted(CASES),
                    help="case(s) to run (default: 8x4096-causal and 32x1024-causal)")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--no-bwd", action="store_true")
    ap.add_argument("--out", default="hstu_bench.json")
    ap.add_argument("--rab", default="", choices=["", "f32:1", "f32:h", "q:1", "q:h"],
                    help="also run each case with a relative attention bias: DTYPE:H_RAB, "
                         "DTYPE f32 or q (q's dtype), H_RAB 1 or h (one per head)")
    ap.add_argument("--rab-only", action="store_true",
                    help="with --rab: only the runs with the bias (e.g. under a profiler)")
    ap.add_argument("--tiles", action="append", default=[],
                    help="extra variant 'fwd=bm,bn,warps;bwd=bm,bn,warps;impl=sm90' (sweep; "
                         "impl=sm90ws (default) / sm80 select the forward; "
                         "ws=nooverlap+nopingpong sets the sm90ws variants, "
                         "Switches.hstu_fwd_ws / JAX_SPARSE_ATTN_HSTU_WS)")
    ap.add_argument("--bwd-impl", action="append", default=[], choices=_BWD_IMPLS,
                    help="run each case's backward with this hstu_bwd_impl switch value "
                         "(Switches.hstu_bwd_impl / JAX_SPARSE_ATTN_HSTU_BWD_IMPL; repeat to "
                         "compare; default: the switches from the environment)")
    ap.add_argument("--bwd-dq", action="append", default=[], choices=_BWD_DQ,
                    help="with --bwd-impl sm90: this dQ reduction (Switches.hstu_bwd_dq / "
                         "JAX_SPARSE_ATTN_HSTU_BWD_DQ; repeat to compare; default: the "
                         "switch's default, tile)")
    ap.add_argument("--bwd-only", action="store_true",
                    help="time only the backward (no forward timing)")
    ap.add_argument("--inference", action="append", default=[],
                    choices=sorted(INFERENCE) + ["all"],
                    help="inference row(s) instead of the training cases: the forward with "
                         "contiguous and paged K/V, achieved K/V bandwidth ('all': every row)")
    ap.add_argument("--schedule-ab", action="store_true",
                    help="with --inference: also time the paged call with the jnp tile "
                         "schedule and page-table sanitising (hstu_schedule=xla)")
    ap.add_argument("--paged-variant", action="append", default=[],
                    help="with --inference: also time the paged call with the switches of "
                         "'ENV=V,ENV=V' (JAX_SPARSE_ATTN_* variables), e.g. "
                         "JAX_SPARSE_ATTN_HSTU_WS=pagepf; repeatable")
    ap.add_argument("--contiguous-variant", action="append", default=[],
                    help="with --inference: also time the contiguous call with the switches "
                         "of 'ENV=V,ENV=V'; repeatable")
    ap.add_argument("--variant", action="append", default=[],
                    help="run each case with the switches of 'ENV=V,ENV=V' (JAX_SPARSE_ATTN_* "
                         "variables; '' = the defaults); repeat to compare")
    ap.add_argument("--reference", action="store_true",
                    help="add a row of the pure-JAX reference backend per case")
    ap.add_argument("--deterministic", action="store_true",
                    help="also run every case with deterministic=True (bitwise reproducible "
                         "backward) and print the backward time ratio")
    a = ap.parse_args()
    if a.rab_only and not a.rab:
        ap.error("--rab-only needs --rab")
    if a.inference:
        names = sorted(INFERENCE) if "all" in a.inference else a.inference
        print(f"device: {jax.devices()[0]}")
        results = []
        for n in names:
            try:
                results.append(run_inference(n, jnp.dtype(a.dtype), a.iters,
                                             schedule_ab=a.schedule_ab,
                                             paged_variants=a.paged_variant,
                                             contiguous_variants=a.contiguous_variant))
            except Exception as e:  # noqa: BLE001 - report and go on with the other rows
                print(f"{n:24s} failed: {type(e).__name__}: {str(e)[:300]}", flush=True)
        with open(a.out, "w") as f:
            json.dump(dict(device=str(jax.devices()[0]), results=results), f, indent=1)
        print(f"wrote {a.out}")
        return
    cases = a.case or ["8x4096-causal", "32x1024-causal"]
    print(f"device: {jax.devices()[0]}")
    results = []
    variants = []
    for impl in a.bwd_impl or [None]:
        for dq in (a.bwd_dq or [None]) if impl == "sm90" else [None]:
            variants.append(None if impl is None else Switches(
                hstu_bwd_impl=impl, **({} if dq is None else {"hstu_bwd_dq": dq})))
    for c in cases:
        for var in a.variant:
            env = {k: v.replace("+", ",") for k, v in
                   (kv.partition("=")[::2] for kv in filter(None, var.split(",")))}
            results.extend(_case_rows(a, c, from_env(env), f"[{var}]",
                                      variant=var or "default"))
        if a.reference:
            try:
                results.append(run_case(c, jnp.dtype(a.dtype), max(2, a.iters // 10),
                                        not a.no_bwd, do_fwd=not a.bwd_only,
                                        backend="reference"))
            except Exception as e:  # noqa: BLE001
                print(f"{c:22s} [reference]: failed: {type(e).__name__}: {str(e)[:300]}",
                      flush=True)
        for sw in (variants if not (a.variant or a.reference) or a.bwd_impl else []):
            results.extend(_case_rows(a, c, sw, str(sw)))
    for variant in a.tiles:
        env = dict(kv.split("=", 1) for kv in variant.split(";") if kv)
        print(f"-- tiles {variant}")
        for c in cases:
            try:
                sw = Switches(hstu_fwd_impl=env.get("impl", "sm80"),
                              hstu_fwd_ws=env.get("ws", "").replace("+", ","),
                              hstu_fwd_tile=_tile(env.get("fwd")),
                              hstu_bwd_tile=_tile(env.get("bwd")),
                              # the tile override is the sm80 backward's
                              **({"hstu_bwd_impl": "sm80"} if env.get("bwd") else {}))
                r = run_case(c, jnp.dtype(a.dtype), a.iters, "bwd" in env, sw)
            except Exception as e:  # noqa: BLE001 - a sweep point that does not build
                print(f"{c:22s} {variant}: failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
                continue
            r["tiles"] = variant
            results.append(r)
    with open(a.out, "w") as f:
        json.dump(dict(device=str(jax.devices()[0]), results=results), f, indent=1)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
