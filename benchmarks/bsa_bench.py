"""Block-sparse attention kernel benchmark with the project's speed floors.

``python -m benchmarks.bsa_bench [--out bsa_bench.json] [--quick]``

Problem: bf16, B=1, H=16, S_q=S_kv=16384, D=128, random top-k KV blocks per query block
(unique indices, fixed count). Cases: blk64 top-32 (fwd, bwd), blk128 top-16 (fwd, bwd).
Effective FLOPs (listed keys only): fwd = 4*B*H_q*S_q*D*(top_k*blk), bwd = 2.5x fwd.

Timing: device-bound steady state. One jitted call runs the op on ``n_sets`` distinct input
sets back to back (more bytes than L2 together); after warm-up, a sample is ``reps`` such
calls and one ``block_until_ready``; reported time = median over samples / (reps*n_sets).
``--timing sustained`` (default): ``reps`` fills ~0.3 s per sample, five samples; under this
load the GPU may run at its software power cap (docs/performance.md, "Timing method").
``--timing burst``: seven bursts of ~20 launches, each after a 0.3 s idle pause (the clocks
of short runs, as in ``hstu_bench`` and ``scripts/gpu_trace.py``); ``--timing both`` runs
the two in turn. Rows record both times and the SM clock sampled through NVML (``pynvml``)
during each.
``--reference`` adds the pure-JAX reference backend's blk64 rows (``backend="reference"``).
``--variants 'JAX_SPARSE_ATTN_KERNEL_FAMILY=portable:blk64fwd,blk64bwd;:blk64fwd,blk64bwd'``
times the portable kernels beside the default (Hopper) ones.
``bwd`` times the kernel backward alone (delta, CSR build, dK/dV/dQ kernel, dq cast) from
saved out/lse; ``csr`` times only the K->Q CSR construction (the one-launch kernel with
``JAX_SPARSE_ATTN_BSA_KQ_IMPL=kernel``). Prints a table and writes JSON.
``--pack-gqa`` times ``pack_gqa=True`` against unpacked GQA at the same density (bf16,
H_q=32, H_kv=4, blk128, 12.5 % of the KV blocks per row, D=128; the same FLOPs
``4*B*H_q*S_q*D*(top_k*blk)`` for both, random lists drawn independently): "prefill" B=1,
S_q=S_kv=16384, fwd and bwd (the bwd also packed with ``bsa_bwd_ws=nopackws``, the
sm90 backward); "prefill-blk64" the same at blk64 (top-32 of 256), fwd and bwd; "decode" B=16, S_q=16 (S_q r = blk), S_kv=16384, fwd;
"decode-splits" the same decode packed with ``kv_splits=1`` vs ``"auto"`` (resolved over
the ``B H_kv N_qp`` packed rows: 2 splits); "decode-longkv" B=1, S_q=16, S_kv=131072 (``--quick``:
32768), blk128 top-64, packed with ``kv_splits=1`` vs ``"auto"`` (33 splits) and unpacked with
``"auto"``, fwd (rows carry ``kv_splits`` and the resolved ``splits``).
``--splits`` times the split-KV decode rows instead (:data:`SPLIT_ROWS`: few query rows against
a long KV list; ``kv_splits="auto"`` against ``kv_splits=1``), with the K/V bytes read per
second (listed blocks of K and V once per query block and head: ``2 B H_q N_q top_k blk D``
16-bit values) and the speed-up over one split.

``--dense``: cuDNN's dense attention instead (``jax.nn.dot_product_attention(...,
implementation="cudnn")``, bf16, D=128, forward and backward: :data:`DENSE_ROWS`), the
anchors of the project's comparisons, to read how a timing method moves them: with
``--timing both`` each row is timed sustained and in bursts, as the kernel rows. Forward and
forward + backward (``jax.vjp``) are timed; the backward row is their difference. FLOPs:
``4*B*H*S_q*S_kv*D`` forward (half of that causal), backward 2.5x.

``--causal``: the causal rows instead (blk128, S=16384 (``--quick``: 4096), H=16, D=128, bf16):
every query block lists its diagonal block and the 15 blocks before it (fewer near the start;
``q2k_block_nums``), timed with ``causal=True`` and with the same listing non-causal, forward
and backward. FLOPs count every listed block in full, as for the other rows (``fwd = 4*B*H*
blk*D*blk*sum(q2k_block_nums)``, ``bwd = 2.5x``): the diagonal block's masked half counts as
work, so both rows have the same FLOP count and their TFLOP/s ratio is their time ratio.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import statistics
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np

import jax_sparse_attn as jsa
from jax_sparse_attn import config, metadata


def _inputs(key, b, h, s, d, blk, topk, dtype, h_kv=None, lists="random"):
    """Random q, k, v, dO and top-k block lists: ``lists="random"`` draws each query block's
    list on its own (in random order); ``"sorted"`` the same lists in ascending block order;
    ``"paired"`` gives query blocks ``2i`` and ``2i + 1`` the same list (the
    same K/V blocks read by neighbouring work items, as in local or clustered patterns);
    ``"hot"`` makes KV block 0 one of every query block's ``topk`` (the others drawn from the
    rest): its K->Q list in the backward holds every query block of every query head of its
    KV head, ``N_q`` times the mean length."""
    n = -(-s // blk)
    kq, kk, kv, ki, kd = jax.random.split(key, 5)
    q, do = (jax.random.normal(x, (b, h, s, d), jnp.float32).astype(dtype) for x in (kq, kd))
    k, v = (jax.random.normal(x, (b, h_kv or h, s, d), jnp.float32).astype(dtype) for x in (kk, kv))
    if lists == "paired":
        one = jnp.argsort(jax.random.uniform(ki, (b, h, -(-n // 2), n)), axis=-1)[..., :topk]
        idx = jnp.repeat(one, 2, axis=2)[:, :, :n].astype(jnp.int32)
    elif lists in ("random", "sorted"):
        idx = jnp.argsort(jax.random.uniform(ki, (b, h, n, n)), axis=-1)[..., :topk].astype(jnp.int32)
        if lists == "sorted":
            idx = jnp.sort(idx, axis=-1)
    elif lists == "hot":
        rest = jnp.argsort(jax.random.uniform(ki, (b, h, n, n - 1)), axis=-1)[..., :topk - 1] + 1
        idx = jnp.concatenate([jnp.zeros((b, h, n, 1), rest.dtype), rest],
                              axis=-1).astype(jnp.int32)
    else:
        raise ValueError(f"lists must be 'random', 'sorted', 'paired' or 'hot', got {lists!r}")
    nums = jnp.full((b, h, n), topk, jnp.int32)
    return q, k, v, idx, nums, do


@functools.cache
def _nvml_handle():
    """``(pynvml, handle)`` of the GPU JAX uses first (the first entry of
    ``CUDA_VISIBLE_DEVICES`` when it is an index, else NVML device 0), or ``(None, None)``
    without ``pynvml`` or a GPU. NVML is initialised once per process."""
    try:
        import pynvml  # noqa: PLC0415  (optional: nvidia-ml-py)

        pynvml.nvmlInit()
        first = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
        return pynvml, pynvml.nvmlDeviceGetHandleByIndex(int(first) if first.isdigit() else 0)
    except Exception:  # noqa: BLE001  (no NVML: no clock samples)
        return None, None


class _ClockSampler:
    """SM clock (MHz) and clock-event reason bits of the GPU (:func:`_nvml_handle`), read
    through NVML every ``period_s`` while a ``with`` block runs (no samples without
    ``pynvml`` or a GPU)."""

    def __init__(self, period_s=0.02):
        self.period_s, self.mhz, self.reasons = period_s, [], 0
        self._nvml, self._h = _nvml_handle()

    def _read(self):
        n = self._nvml
        self.mhz.append(n.nvmlDeviceGetClockInfo(self._h, n.NVML_CLOCK_SM))
        get = getattr(n, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            n.nvmlDeviceGetCurrentClocksThrottleReasons
        self.reasons |= int(get(self._h))

    def _loop(self):
        while not self._stop.wait(self.period_s):
            self._read()

    def __enter__(self):
        if self._nvml is not None:
            self._stop = threading.Event()
            self._thread = threading.Thread(target=self._loop, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc):
        if self._nvml is not None:
            self._stop.set()
            self._thread.join()
        return False

    def summary(self):
        if not self.mhz:
            return dict(sm_mhz_median=None, sm_mhz_min=None, clock_event_reasons=None)
        return dict(sm_mhz_median=statistics.median(self.mhz), sm_mhz_min=min(self.mhz),
                    clock_event_reasons=hex(self.reasons))


#: how ``_time`` times: "sustained" (samples of ~0.3 s of back-to-back calls), "burst"
#: (bursts of about BURST_LAUNCHES launches after an idle pause) or "both" (the reported
#: ``ms`` is the sustained one); set by ``--timing``
TIMING = dict(mode="sustained")
BURST_LAUNCHES, BURST_PAUSE_S, BURST_SAMPLES = 20, 0.3, 7
_LAST = {}


def _time(fn, sets, target_s=0.3, samples=5):
    """Median device time per launch in ms (see the module docstring); the details of the
    last call (both modes' times, SM clocks) are in ``_LAST``, merged into each row."""
    mode = TIMING["mode"]
    g = jax.jit(lambda sets: [fn(*s) for s in sets])
    jax.block_until_ready(g(sets))
    t0 = time.perf_counter()
    jax.block_until_ready(g(sets))
    one = max(time.perf_counter() - t0, 1e-6)
    _LAST.clear()
    _LAST["timing"] = mode
    if mode in ("sustained", "both"):
        reps = max(1, int(target_s / one))
        res = []
        with _ClockSampler() as clk:
            for _ in range(samples):
                t0 = time.perf_counter()
                out = None
                for _ in range(reps):
                    out = g(sets)
                jax.block_until_ready(out)
                res.append((time.perf_counter() - t0) / (reps * len(sets)))
        _LAST["ms_sustained"] = statistics.median(res) * 1e3
        _LAST.update({k + "_sustained": v for k, v in clk.summary().items()})
    if mode in ("burst", "both"):
        reps = max(1, -(-BURST_LAUNCHES // len(sets)))
        res = []
        with _ClockSampler() as clk:
            for _ in range(BURST_SAMPLES):
                time.sleep(BURST_PAUSE_S)  # idle: the clock recovers from any power cap
                t0 = time.perf_counter()
                out = None
                for _ in range(reps):
                    out = g(sets)
                jax.block_until_ready(out)
                res.append((time.perf_counter() - t0) / (reps * len(sets)))
        _LAST["ms_burst"] = statistics.median(res) * 1e3
        _LAST.update({k + "_burst": v for k, v in clk.summary().items()})
    return _LAST["ms_burst" if mode == "burst" else "ms_sustained"]


def _timing_note():
    """' (burst x.xxx ms, yyyy MHz)' for the printed line when both modes ran."""
    if "ms_burst" in _LAST and "ms_sustained" in _LAST:
        mhz = [_LAST.get(f"sm_mhz_median_{m}") for m in ("sustained", "burst")]
        clk = f", {mhz[0]:.0f} / {mhz[1]:.0f} MHz" if None not in mhz else ""
        return f"  (burst {_LAST['ms_burst']:.3f} ms{clk})"
    return ""


def run(cases, b=1, h=16, s=16384, d=128, n_sets=3, seed=0, tag="", switches=None,
        backend="kernel"):
    key = jax.random.PRNGKey(seed)
    rows = []
    for blk, topk, passes in cases:
        sets = [_inputs(jax.random.fold_in(key, i), b, h, s, d, blk, topk, jnp.bfloat16)
                for i in range(n_sets)]
        scale = 1.0 / np.sqrt(d)
        kw = dict(layout="bhsd", sparse_block_size=blk, softmax_scale=scale, backend=backend,
                  switches=switches)
        flops_fwd = 4.0 * b * h * s * d * (topk * blk)

        def fwd(q, k, v, idx, nums, do):
            return tuple(jsa.block_sparse_attention_forward(q, k, v, idx, None, None, nums, **kw))

        saved = [jax.jit(fwd)(*st) for st in sets]
        bsets = [st + tuple(sv) for st, sv in zip(sets, saved)]

        def bwd(q, k, v, idx, nums, do, out, lse):
            return tuple(jsa.block_sparse_attention_backward(do, q, k, v, out, lse, idx, None,
                                                             None, nums, **kw))

        def csr(q, k, v, idx, nums, do):
            # the lists the backward builds: XLA's, or the one-launch kernel's with the
            # switch bsa_kq_impl="kernel"
            from jax_sparse_attn.ffi import bsa as fb  # noqa: PLC0415

            kern = switches is not None and switches.bsa_kq_impl in ("kernel", "items")
            return fb.kq_lists(idx, nums, num_kv_heads=h, num_kv_blocks=-(-s // blk),
                               kernel=kern and backend == "kernel")

        for p in passes:
            if p == "fwd":
                ms, fl = _time(fwd, sets), flops_fwd
            elif p == "bwd":
                ms, fl = _time(bwd, bsets), 2.5 * flops_fwd
            else:
                ms, fl = _time(csr, sets), 0.0
            row = dict(variant=tag, blk=blk, top_k=topk, pass_=p, ms=ms, tflops=fl / (ms * 1e-3) / 1e12 if fl else None,
                       B=b, H=h, S=s, D=d, dtype="bfloat16", backend=backend)
            if backend == "kernel":
                row["kernel_choice"] = jsa.which_backend(
                    jsa.block_sparse_attention, *sets[0][:3], sets[0][3], None, None,
                    sets[0][4], **kw).reason
            row.update(_LAST)
            rows.append(row)
            tf = f"{row['tflops']:.1f}" if row["tflops"] else "-"
            print(f"{tag:28s} blk{blk:<4d} top{topk:<3d} {p:4s} {ms:8.3f} ms  {tf:>7s} TFLOP/s"
                  f"{_timing_note()}", flush=True)
    return rows


#: the variants of :func:`pack_gqa_rows`: (name, pack_gqa, kv_splits); the first is the
#: baseline of the others' ``speedup``
PACK_VARIANTS = (("unpacked", False, 1), ("pack_gqa", True, 1))
#: packed decode with split-KV: one split against ``kv_splits="auto"`` (over the packed rows
#: ``B H_kv N_qp``)
PACK_SPLIT_VARIANTS = (("pack_gqa", True, 1), ("pack_gqa_splits_auto", True, "auto"))
#: the long-KV packed decode: also the unpacked call with ``kv_splits="auto"`` (over its
#: ``B H_q N_q`` rows)
PACK_LONGKV_VARIANTS = PACK_SPLIT_VARIANTS + (("unpacked_splits_auto", False, "auto"),)
#: the prefill backward: also the packed call on the ``sm90`` backward (``nopackws``; a
#: fourth element: the ``bsa_bwd_ws`` options of the call)
PACK_BWD_VARIANTS = PACK_VARIANTS + (("pack_gqa_sm90", True, 1, "nopackws"),)


def pack_gqa_rows(s=16384, h=32, h_kv=4, d=128, blk=128, density=0.125, n_sets=2, seed=0,
                  passes=("fwd", "bwd"), backend="kernel", b=1, s_q=None, tag="prefill",
                  timing=None, variants=PACK_VARIANTS):
    """``pack_gqa=True`` (metadata ``(B, H_kv, S_q r / blk, top_k)``) vs unpacked GQA
    (``(B, H_q, S_q / blk, top_k)``) at the same density (``top_k`` of the ``S / blk`` KV
    blocks per row, lists drawn independently; ``s_q``: query positions, default ``s``):
    one row per ``variants`` entry ``(name, pack_gqa, kv_splits[, bsa_bwd_ws options])``
    and pass, each but the
    first variant's with ``speedup`` over the first variant's row of the pass (default
    :data:`PACK_VARIANTS`: "unpacked" and "pack_gqa", one split each). Rows record the
    ``kv_splits`` option and ``splits``, the count it resolves to (``ffi.bsa.
    resolve_kv_splits`` over the call's metadata rows: ``B H_kv N_qp`` packed). Effective
    FLOPs are the same for all: ``4 B H_q S_q D top_k blk`` (forward), 2.5x that
    (backward). ``timing``: keyword arguments of ``_time``."""
    from jax_sparse_attn.ffi import bsa as ffi_bsa  # noqa: PLC0415 (no GPU import needed)

    timing = timing or {}
    s_q = s if s_q is None else s_q
    r = h // h_kv
    n_kv = -(-s // blk)
    topk = max(1, round(density * n_kv))
    key = jax.random.PRNGKey(seed)
    scale = 1.0 / np.sqrt(d)
    flops_fwd = 4.0 * b * h * s_q * d * (topk * blk)
    rows, ms_of = [], {}
    base = variants[0][0]
    for variant, pack, ks, *ws in variants:
        hm, nq = (h_kv, -(-s_q * r // blk)) if pack else (h, -(-s_q // blk))
        resolved = ffi_bsa.resolve_kv_splits(ks, num_rows=b * hm * nq, k_max=topk,
                                             impl="sm90ws")
        sets = []
        for i in range(n_sets):
            kq, kk, kv, ki, kd = jax.random.split(jax.random.fold_in(key, i), 5)
            q, do = (jax.random.normal(x, (b, h, s_q, d), jnp.float32).astype(jnp.bfloat16)
                     for x in (kq, kd))
            k, v = (jax.random.normal(x, (b, h_kv, s, d), jnp.float32).astype(jnp.bfloat16)
                    for x in (kk, kv))
            idx = jnp.argsort(jax.random.uniform(ki, (b, hm, nq, n_kv)), axis=-1)[..., :topk]
            nums = jnp.full((b, hm, nq), topk, jnp.int32)
            sets.append((q, k, v, idx.astype(jnp.int32), nums, do))
        kw = dict(layout="bhsd", sparse_block_size=blk, softmax_scale=scale, backend=backend,
                  pack_gqa=pack, kv_splits=ks)
        if ws:
            from jax_sparse_attn.config import from_env  # noqa: PLC0415

            env = from_env()
            kw["switches"] = dataclasses.replace(
                env, bsa_bwd_ws=tuple(env.bsa_bwd_ws) + tuple(ws[0].split(",")))

        def fwd(q, k, v, idx, nums, do, kw=kw):
            return tuple(jsa.block_sparse_attention_forward(q, k, v, idx, None, None, nums, **kw))

        def bwd(q, k, v, idx, nums, do, out, lse, kw=kw):
            return tuple(jsa.block_sparse_attention_backward(do, q, k, v, out, lse, idx, None,
                                                             None, nums, **kw))

        for p in passes:
            if p == "fwd":
                ms, fl = _time(fwd, sets, **timing), flops_fwd
            else:
                saved = [jax.jit(fwd)(*st) for st in sets]
                ms = _time(bwd, [st + tuple(sv) for st, sv in zip(sets, saved)], **timing)
                fl = 2.5 * flops_fwd
            ms_of[(variant, p)] = ms
            row = dict(case=tag, variant=variant, blk=blk, top_k=topk, pass_=p, ms=ms,
                       tflops=fl / (ms * 1e-3) / 1e12, B=b, H=h, H_kv=h_kv, S_q=s_q, S=s,
                       D=d, dtype="bfloat16", backend=backend, density=topk / n_kv,
                       kv_splits=ks, splits=resolved)
            if variant != base:
                row["speedup"] = ms_of[(base, p)] / ms
            row.update(_LAST)
            rows.append(row)
            sp = f"  {row['speedup']:.2f}x" if variant != base else ""
            print(f"{tag:8s} {variant:9s} B{b} H{h}/{h_kv} blk{blk} top{topk}/{n_kv} "
                  f"S_q{s_q} S{s} D{d} splits {resolved:3d} {p:4s} {ms:8.3f} ms "
                  f"{row['tflops']:7.1f} TFLOP/s{sp}{_timing_note()}",
                  flush=True)
    return rows


# the forward rows of the block-sparse SM90 table (bf16, B=1, random top-k lists):
# (label, blk, top_k, S, D, H_q, H_kv)
TABLE = [
    ("blk64 top32 (12.5%)", 64, 32, 16384, 128, 16, 16),
    ("blk64 top13 (5%)", 64, 13, 16384, 128, 16, 16),
    ("blk64 top64 (25%)", 64, 64, 16384, 128, 16, 16),
    ("blk128 top16 (12.5%)", 128, 16, 16384, 128, 16, 16),
    ("blk128 top32 S32768", 128, 32, 32768, 128, 16, 16),
    ("GQA 16:4 blk64 top32", 64, 32, 16384, 128, 16, 4),
    ("D64 blk64 top32", 64, 32, 16384, 64, 16, 16),
    ("D64 blk128 top16", 128, 16, 16384, 64, 16, 16),
    # few heads: with --lists hot the one long K->Q list per KV head outlasts the rest of the
    # backward's work (256 entries against 32 on average, 2 KV heads on 132 SMs)
    ("blk128 top32 S32768 H2", 128, 32, 32768, 128, 2, 2),
]


# list-length sweep (B=1 H=16 S=16384 D=128 bf16, random top-k): the time of a call against
# k separates a per-work-item cost from a per-listed-block cost (``sweep_fit``)
SWEEP_K = {64: (1, 2, 4, 8, 16, 32, 64), 128: (1, 2, 4, 8, 16, 32, 64)}
SWEEP_TABLE = [(f"blk{blk} top{k}", blk, k, 16384, 128, 16, 16)
               for blk, ks in SWEEP_K.items() for k in ks]


def sweep_fit(rows):
    """Least-squares fit ``ms = a + b k`` per (block size, variant, pass) over the sweep rows:
    ``b`` the time of one more listed block per query block (all work items), ``a`` what a
    work item costs besides its blocks (plus the launch), ``a / b`` that cost in listed
    blocks."""
    import numpy as np  # noqa: PLC0415

    fits = []
    groups = {}
    for r in rows:
        groups.setdefault((r["blk"], r["variant"], r["pass_"]), []).append(r)
    for (blk, var, pass_), rs in groups.items():
        if len(rs) < 2:
            continue
        k = np.array([r["top_k"] for r in rs], float)
        ms = np.array([r["ms"] for r in rs], float)
        b, a = np.polyfit(k, ms, 1)
        resid = float(np.max(np.abs(a + b * k - ms) / ms))
        fits.append(dict(blk=blk, variant=var, pass_=pass_, a_ms=float(a), b_ms=float(b),
                         item_cost_blocks=float(a / b), max_rel_resid=resid,
                         ks=k.tolist()))
        print(f"fit blk{blk} {pass_} {var or 'default':40s} a = {a * 1e3:8.1f} us, "
              f"b = {b * 1e3:7.2f} us / block, a / b = {a / b:5.2f} blocks "
              f"(max rel. residual {resid:.3f})", flush=True)
    return fits


def _check_variant_env(env, var):
    """Raise ValueError for a name in a ``--table`` variant that is not one of the library's
    environment variables (``JAX_SPARSE_ATTN_*``): a comma inside a switch's value splits it
    into names of their own (``X=a,b`` makes ``b`` a name); ``+`` joins the options."""
    bad = [k for k in env if not k.startswith("JAX_SPARSE_ATTN_")]
    if bad:
        raise ValueError(f"--table variant {var!r}: {', '.join(map(repr, bad))} is not a "
                         "JAX_SPARSE_ATTN_* environment variable (or 'deterministic'); "
                         "join several options of one switch with '+', e.g. "
                         "JAX_SPARSE_ATTN_BSA_BWD_WS=detfixed+dqlag")


def table(variants, n_sets=2, seed=0, rows_sel=None, pass_="fwd", rows_def=None,
          lists="random"):
    """Forward (``pass_="fwd"``) or backward (``"bwd"``: the whole backward from saved out /
    lse, FLOPs 2.5x the forward's) times of the TABLE rows under each variant (``'ENV=V,ENV=V'``
    strings of ``JAX_SPARSE_ATTN_*`` switch variables, validated by :func:`config.from_env`,
    ``+`` in a value standing for ``,``;
    the entry ``deterministic=1`` calls the ops with ``deterministic=True``); ``lists``: the
    block lists of :func:`_inputs` (``"paired"``: neighbouring query blocks share theirs;
    ``"hot"``: KV block 0 in every list; the rows' labels then end in the name)."""
    rows = []
    for j, (label, blk, topk, s, d, h, h_kv) in enumerate(rows_def or TABLE):
        if rows_sel is not None and j not in rows_sel:
            continue
        key = jax.random.fold_in(jax.random.PRNGKey(seed), blk * 1000 + topk)
        sets = [_inputs(jax.random.fold_in(key, i), 1, h, s, d, blk, topk, jnp.bfloat16, h_kv,
                        lists)
                for i in range(n_sets)]
        flops = 4.0 * h * s * d * (topk * blk) * (2.5 if pass_ == "bwd" else 1.0)
        if lists != "random":
            label = f"{label} {lists}"
        for var in variants:
            # '+' inside a value stands for ',' (several options of one switch)
            env = {k_: v_.replace("+", ",") for k_, v_ in
                   (kv.partition("=")[::2] for kv in filter(None, var.split(",")))}
            det = env.pop("deterministic", "0") == "1"
            _check_variant_env(env, var)
            kw = dict(layout="bhsd", sparse_block_size=blk, softmax_scale=1.0 / np.sqrt(d),
                      backend="kernel", switches=config.from_env(env), deterministic=det)

            def fwd(q, k, v, i, n, do=None, kw=kw):
                return tuple(jsa.block_sparse_attention_forward(q, k, v, i, None, None, n, **kw))

            def bwd(q, k, v, i, n, do, out, lse, kw=kw):
                return tuple(jsa.block_sparse_attention_backward(do, q, k, v, out, lse, i, None,
                                                                 None, n, **kw))

            try:
                if pass_ == "bwd":
                    saved = [jax.jit(fwd)(*st) for st in sets]
                    ms = _time(bwd, [st + tuple(sv) for st, sv in zip(sets, saved)])
                else:
                    ms = _time(fwd, sets)
            except Exception as e:  # noqa: BLE001  (one failing variant must not end the table)
                print(f"{label:28s} {var:44s} FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
                continue
            row = dict(case=label, variant=var, blk=blk, top_k=topk, S=s, D=d, H=h, H_kv=h_kv,
                       pass_=pass_, ms=ms, tflops=flops / (ms * 1e-3) / 1e12)
            row.update(_LAST)
            rows.append(row)
            print(f"{label:28s} {pass_} {var:44s} {ms:8.3f} ms {row['tflops']:7.1f} TFLOP/s"
                  f"{_timing_note()}",
                  flush=True)
    return rows


#: cuDNN dense attention rows of ``--dense``: (label, B, H, S, causal); bf16, D=128
DENSE_ROWS = [
    ("cudnn dense causal B8 L4096 H4", 8, 4, 4096, True),
    ("cudnn dense B1 L16384 H16", 1, 16, 16384, False),
]


def dense_rows(n_sets=2, seed=0, d=128):
    """Time :data:`DENSE_ROWS` forward and forward + backward (``jax.vjp`` of the forward,
    from the cotangent) with :func:`_time` in the current ``TIMING`` mode; the backward row
    is their difference (in each timing mode that ran)."""
    rows = []
    key = jax.random.PRNGKey(seed)
    for label, b, h, s, causal in DENSE_ROWS:
        sets = []
        for _ in range(n_sets):
            key, *ks = jax.random.split(key, 5)
            sets.append(tuple(jax.random.normal(k_, (b, s, h, d), jnp.bfloat16) for k_ in ks))
        flops = 4.0 * b * h * s * s * d * (0.5 if causal else 1.0)

        def fwd(q, k, v, do, causal=causal):
            return jax.nn.dot_product_attention(q, k, v, is_causal=causal,
                                                implementation="cudnn")

        def fwdbwd(q, k, v, do, causal=causal):
            out, vjp = jax.vjp(lambda q, k, v: jax.nn.dot_product_attention(
                q, k, v, is_causal=causal, implementation="cudnn"), q, k, v)
            return out, vjp(do)

        got = {}
        for pass_, fn, mult in (("fwd", fwd, 1.0), ("fwdbwd", fwdbwd, 3.5)):
            try:
                ms = _time(fn, sets)
            except Exception as e:  # noqa: BLE001  (report and go on)
                print(f"{label:32s} {pass_} FAILED {type(e).__name__}: {str(e)[:300]}",
                      flush=True)
                continue
            got[pass_] = dict(_LAST)
            row = dict(case=label, pass_=pass_, B=b, H=h, S=s, D=d, causal=causal, ms=ms,
                       tflops=flops * mult / (ms * 1e-3) / 1e12)
            row.update(_LAST)
            rows.append(row)
            print(f"{label:32s} {pass_:6s} {ms:8.3f} ms {row['tflops']:7.1f} TFLOP/s"
                  f"{_timing_note()}", flush=True)
        if len(got) == 2:
            row = dict(case=label, pass_="bwd", B=b, H=h, S=s, D=d, causal=causal,
                       derived="fwdbwd - fwd")
            for m in ("sustained", "burst"):
                k_ = f"ms_{m}"
                if k_ in got["fwd"] and k_ in got["fwdbwd"]:
                    ms = got["fwdbwd"][k_] - got["fwd"][k_]
                    row[k_] = ms
                    row[f"tflops_{m}"] = flops * 2.5 / (ms * 1e-3) / 1e12
            row["ms"] = row.get("ms_sustained", row.get("ms_burst"))
            row["tflops"] = row.get("tflops_sustained", row.get("tflops_burst"))
            rows.append(row)
            print(f"{label:32s} bwd    {row['ms']:8.3f} ms {row['tflops']:7.1f} TFLOP/s "
                  f"(fwdbwd - fwd; burst {row.get('tflops_burst', float('nan')):.1f})",
                  flush=True)
    return rows


# split-KV decode rows (bf16, B=1, D=128, random top-k lists of S_kv / blk blocks):
# (label, blk, top_k, S_q, S_kv, H_q, H_kv); each row is timed with every SPLIT_SETTINGS value
SPLIT_ROWS = [
    ("decode blk128 top64 S_kv=128k", 128, 64, 128, 131072, 16, 16),
    ("decode blk64 top128 S_kv=128k", 64, 128, 64, 131072, 16, 16),
]
SPLIT_SETTINGS = ("auto", 1)


def _split_inputs(key, b, h, h_kv, s_q, s_kv, d, blk, topk, dtype, n_sets):
    """``n_sets`` input sets sharing one K and V (1 GiB at S_kv = 128k): each its own q and
    random block lists, so the calls differ (no common subexpression) and read different
    blocks."""
    n_q, n_kv = -(-s_q // blk), -(-s_kv // blk)
    kk, kv, key = jax.random.split(key, 3)
    k, v = (jax.random.normal(x, (b, h_kv, s_kv, d), jnp.float32).astype(dtype) for x in (kk, kv))
    sets = []
    for i in range(n_sets):
        kq, ki = jax.random.split(jax.random.fold_in(key, i))
        q = jax.random.normal(kq, (b, h, s_q, d), jnp.float32).astype(dtype)
        idx = jnp.argsort(jax.random.uniform(ki, (b, h, n_q, n_kv)), axis=-1)[..., :topk]
        sets.append((q, k, v, idx.astype(jnp.int32), jnp.full((b, h, n_q), topk, jnp.int32)))
    return sets


def _kernel_times(fn, args, iters=20):
    """Per-kernel GPU time (us per call) of ``iters`` calls of ``fn(*args)`` from a JAX
    profiler trace (CUPTI, perfetto JSON): ``(device span per call, [(name, us), ...])``."""
    import collections  # noqa: PLC0415
    import glob  # noqa: PLC0415
    import gzip  # noqa: PLC0415
    import shutil  # noqa: PLC0415
    import tempfile  # noqa: PLC0415

    jax.block_until_ready(fn(*args))
    d = tempfile.mkdtemp(prefix="bsa_trace_")
    try:
        with jax.profiler.trace(d, create_perfetto_trace=True):
            for _ in range(iters):
                out = fn(*args)
            jax.block_until_ready(out)
        path = glob.glob(f"{d}/**/*perfetto_trace.json.gz", recursive=True)
        with gzip.open(path[0]) as f:
            t = json.load(f)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    ev = t["traceEvents"] if isinstance(t, dict) else t
    names = {e["pid"]: e.get("args", {}).get("name", "") for e in ev
             if e.get("ph") == "M" and e.get("name") == "process_name"}
    gpu = {p for p, n in names.items() if "GPU" in n or "gpu" in n}
    ev = [e for e in ev if e.get("ph") == "X" and e.get("pid") in gpu and "dur" in e]
    by = collections.defaultdict(float)
    for e in ev:
        by[e["name"][:80]] += e["dur"] / iters
    span = (max(e["ts"] + e["dur"] for e in ev) - min(e["ts"] for e in ev)) / iters if ev else 0.0
    return span, sorted(by.items(), key=lambda x: -x[1])


def splits(rows_sel=None, settings=SPLIT_SETTINGS, n_sets=16, seed=0, d=128, trace=False):
    """Forward times of the :data:`SPLIT_ROWS` under each ``kv_splits`` setting (kernel
    backend, default switches); the speed-up is over the row's ``kv_splits=1`` time. One
    jitted call runs the ``n_sets`` input sets back to back (a split forward takes tens of
    microseconds: fewer calls would time the host's dispatch). ``trace``: also the per-kernel
    GPU times of one set's call (:func:`_kernel_times`)."""
    from jax_sparse_attn.ffi import bsa as ffi_bsa  # noqa: PLC0415

    rows = []
    for j, (label, blk, topk, s_q, s_kv, h, h_kv) in enumerate(SPLIT_ROWS):
        if rows_sel is not None and j not in rows_sel:
            continue
        key = jax.random.fold_in(jax.random.PRNGKey(seed), j)
        sets = _split_inputs(key, 1, h, h_kv, s_q, s_kv, d, blk, topk, jnp.bfloat16, n_sets)
        n_q = -(-s_q // blk)
        flops = 4.0 * h * s_q * d * (topk * blk)
        kv_bytes = 2.0 * h * n_q * topk * blk * d * 2
        got = {}
        for ks in settings:
            kw = dict(layout="bhsd", sparse_block_size=blk, softmax_scale=1.0 / np.sqrt(d),
                      backend="kernel", kv_splits=ks)

            def fwd(q, k, v, i, n, kw=kw):
                return tuple(jsa.block_sparse_attention_forward(q, k, v, i, None, None, n, **kw))

            # the split count of the default forward (sm90ws at D 64 / 128)
            resolved = ffi_bsa.resolve_kv_splits(ks, num_rows=h * n_q, k_max=topk, impl="sm90ws")
            try:
                ms = _time(fwd, sets)
            except Exception as e:  # noqa: BLE001  (one failing setting must not end the rows)
                print(f"{label:32s} kv_splits={ks!s:5s} FAILED {type(e).__name__}: {str(e)[:300]}",
                      flush=True)
                continue
            got[ks] = ms
            if trace:
                try:
                    span, ks_us = _kernel_times(jax.jit(fwd), sets[0])
                    print(f"   trace kv_splits={ks}: device span {span:8.1f} us per call "
                          f"(back-to-back calls)", flush=True)
                    for n, us in ks_us[:10]:
                        print(f"   {us:9.2f} us  {n}", flush=True)
                except Exception as e:  # noqa: BLE001  (the trace is optional)
                    print(f"   trace kv_splits={ks} FAILED {type(e).__name__}: {str(e)[:200]}",
                          flush=True)
            row = dict(case=label, kv_splits=ks, splits=resolved, blk=blk, top_k=topk, S_q=s_q,
                       S_kv=s_kv, D=d, H=h, H_kv=h_kv, pass_="fwd", ms=ms,
                       tflops=flops / (ms * 1e-3) / 1e12, kv_gbs=kv_bytes / (ms * 1e-3) / 1e9,
                       num_sms=metadata.num_sms())
            row.update(_LAST)
            rows.append(row)
            print(f"{label:32s} kv_splits={ks!s:5s} ({resolved:3d} splits) {ms:8.4f} ms "
                  f"{row['tflops']:7.1f} TFLOP/s {row['kv_gbs']:8.1f} GB/s K/V", flush=True)
        for row in rows:
            if row["case"] == label and 1 in got:
                row["speedup_vs_1"] = got[1] / row["ms"]
        if 1 in got:
            for ks, ms in got.items():
                print(f"{label:32s} kv_splits={ks!s:5s} speed-up over kv_splits=1: "
                      f"{got[1] / ms:.2f}x", flush=True)
    return rows


def _causal_inputs(key, b, h, s, d, blk, past, dtype):
    """q, k, v, idx, nums, do: query block m lists blocks m, m-1, ..., m-past (those >= 0,
    in a random order per row)."""
    n = -(-s // blk)
    kq, kk, kv, ki, kd = jax.random.split(key, 5)
    q, do = (jax.random.normal(x, (b, h, s, d), jnp.float32).astype(dtype) for x in (kq, kd))
    k, v = (jax.random.normal(x, (b, h, s, d), jnp.float32).astype(dtype) for x in (kk, kv))
    m = jnp.arange(n, dtype=jnp.int32)[:, None]
    lst = m - jnp.arange(past + 1, dtype=jnp.int32)[None, :]  # (n, past + 1)
    perm = jnp.argsort(jax.random.uniform(ki, (b, h, n, past + 1)), axis=-1)
    lst = jnp.take_along_axis(jnp.broadcast_to(lst, (b, h, n, past + 1)), perm, axis=-1)
    # entries < 0 go past the active prefix (stable: the others keep their random order)
    order = jnp.argsort(lst < 0, axis=-1, stable=True)
    idx = jnp.take_along_axis(lst, order, axis=-1)
    nums = jnp.broadcast_to(jnp.minimum(m[:, 0] + 1, past + 1), (b, h, n)).astype(jnp.int32)
    return q, k, v, idx, nums, do


def causal_rows(s=16384, b=1, h=16, d=128, blk=128, past=15, n_sets=6, seed=0):
    """Causal vs non-causal rows (same listing): fwd and bwd of the kernel backend (``n_sets``
    input sets per jitted call, so that the device time per dispatch dwarfs the host's)."""
    key = jax.random.PRNGKey(seed)
    sets = [_causal_inputs(jax.random.fold_in(key, i), b, h, s, d, blk, past, jnp.bfloat16)
            for i in range(n_sets)]
    listed = int(jnp.sum(sets[0][4]))
    flops_fwd = 4.0 * blk * d * blk * listed  # every listed block in full (see --causal)
    rows = []
    for p in ("fwd", "bwd"):
        times = {}
        # non-causal, causal, then both again: each row keeps its faster round, so a drift
        # of the GPU's clocks or of other load during the run does not favour either
        for causal in (False, True, False, True):
            kw = dict(layout="bhsd", sparse_block_size=blk, softmax_scale=1.0 / np.sqrt(d),
                      backend="kernel", causal=causal)

            def fwd(q, k, v, idx, nums, do, kw=kw):
                return tuple(jsa.block_sparse_attention_forward(q, k, v, idx, None, None, nums,
                                                                **kw))

            if p == "fwd":
                ms = _time(fwd, sets)
            else:
                saved = [jax.jit(fwd)(*st) for st in sets]
                bsets = [st + tuple(sv) for st, sv in zip(sets, saved)]

                def bwd(q, k, v, idx, nums, do, out, lse, kw=kw):
                    return tuple(jsa.block_sparse_attention_backward(
                        do, q, k, v, out, lse, idx, None, None, nums, **kw))

                ms = _time(bwd, bsets)
            fl = flops_fwd * (2.5 if p == "bwd" else 1.0)
            if causal in times:  # second round: keep the faster time, replace the row
                ms = min(ms, times[causal])
                rows = [r for r in rows if not (r["pass_"] == p and r["causal"] == causal)]
            times[causal] = ms
            row = dict(variant="causal" if causal else "non-causal", case=f"diag+{past} past",
                       blk=blk, listed_blocks=listed, pass_=p, ms=ms,
                       tflops=fl / (ms * 1e-3) / 1e12, B=b, H=h, S=s, D=d, dtype="bfloat16",
                       backend="kernel", causal=causal)
            row["kernel_choice"] = jsa.which_backend(
                jsa.block_sparse_attention, *sets[0][:3], sets[0][3], None, None, sets[0][4],
                **kw).reason
            if causal:
                row["causal_over_noncausal_time"] = ms / times[False]
            row.update(_LAST)
            rows.append(row)
            ratio = f"  x{ms / times[False]:.3f} of non-causal" if causal else ""
            print(f"{row['variant']:12s} diag+{past} past blk{blk} {p:4s} {ms:8.3f} ms "
                  f"{row['tflops']:7.1f} TFLOP/s{ratio}{_timing_note()}", flush=True)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="bsa_bench.json")
    ap.add_argument("--quick", action="store_true", help="S=4096 instead of 16384")
    ap.add_argument("--variants", default="",
                    help="';'-separated tuning variants 'ENV=V,ENV=V:case,case' (case = blk64fwd, "
                         "blk64bwd, blk128fwd, blk128bwd, csr); default: the shipped settings")
    ap.add_argument("--table", default="",
                    help="';'-separated variants ('ENV=V,ENV=V') timed on the forward rows of TABLE "
                         "(e.g. 'JAX_SPARSE_ATTN_BSA_FWD_IMPL=sm90ws;JAX_SPARSE_ATTN_BSA_FWD_IMPL=sm80')")
    ap.add_argument("--table-pass", default="fwd", choices=("fwd", "bwd"),
                    help="with --table: time the forward (default) or the whole backward")
    ap.add_argument("--rows", default="",
                    help="with --table: comma list of TABLE row numbers (default: all)")
    ap.add_argument("--lists", default="random", choices=("random", "sorted", "paired", "hot"),
                    help="with --table: random top-k lists per query block (default), "
                         "sorted: the same lists in ascending block order, "
                         "paired: query blocks 2i and 2i + 1 share one list, or hot: KV block "
                         "0 in every list (one long K->Q list per KV head)")
    ap.add_argument("--sweep-k", action="store_true",
                    help="with --table: time the list-length sweep (SWEEP_TABLE: blk64 / blk128, "
                         "top-k 1..64) instead of TABLE and fit ms = a + b k per variant "
                         "(a / b: a work item's cost besides its blocks, in blocks)")
    ap.add_argument("--causal", action="store_true",
                    help="only the causal vs non-causal rows (blk128, diagonal + 15 past blocks)")
    ap.add_argument("--dense", action="store_true",
                    help="only cuDNN's dense attention rows (DENSE_ROWS), the comparisons' "
                         "anchors, in the --timing mode")
    ap.add_argument("--reference", action="store_true",
                    help="add blk64 top-32 fwd/bwd rows of the pure-JAX reference backend "
                         "(backend='reference', what backend='auto' runs without the kernels)")
    ap.add_argument("--pack-gqa", action="store_true",
                    help="only the pack_gqa rows: packed vs unpacked GQA H_q=32/H_kv=4 blk128 "
                         "12.5%% fwd and bwd (S=16384, --quick: 4096)")
    ap.add_argument("--splits", action="store_true",
                    help="time the split-KV decode rows (SPLIT_ROWS, kv_splits='auto' vs 1) only")
    ap.add_argument("--split-settings", default="auto,1",
                    help="with --splits: comma list of kv_splits values to time (the speed-up "
                         "is over 1)")
    ap.add_argument("--trace", action="store_true",
                    help="with --splits: per-kernel GPU times of one call (JAX profiler)")
    ap.add_argument("--timing", default="sustained", choices=("sustained", "burst", "both"),
                    help="sustained: samples of ~0.3 s of back-to-back calls (the default; "
                         "the GPU may run at its power cap); burst: bursts of ~20 launches "
                         "after a 0.3 s idle pause; both: the two in turn, 'ms' the "
                         "sustained one (rows carry ms_sustained / ms_burst and the SM clocks "
                         "sampled through NVML during each)")
    args = ap.parse_args(argv)
    TIMING["mode"] = args.timing
    s = 4096 if args.quick else 16384
    rows = []
    if args.pack_gqa:
        # forwards first, then the backward; the JSON is rewritten after each group of rows
        # (a time limit keeps what was measured)
        for kw in (dict(passes=("fwd",)),
                   # blk64 (L2-bound unpacked: every 64-row block streams its own K / V),
                   # where one K / V load serving r heads should pay
                   dict(passes=("fwd", "bwd"), blk=64, tag="prefill-blk64"),
                   # decode-like: S_q r = blk, one packed block per KV head vs r mostly empty
                   # 128-row tiles per query head
                   dict(b=16, s_q=16, passes=("fwd",), tag="decode"),
                   # the packed decode with split-KV: 16 * 4 * 1 = 64 packed rows fill half
                   # of 132 SMs with one split, "auto" = 2 splits (more input sets per call:
                   # a call's forwards take microseconds)
                   dict(b=16, s_q=16, passes=("fwd",), tag="decode-splits", n_sets=8,
                        variants=PACK_SPLIT_VARIANTS),
                   # long-KV decode, one sequence: S_kv 131072 (--quick: 32768), blk128
                   # top-64: 4 packed rows, "auto" = 33 splits (unpacked 32 rows: 4)
                   dict(b=1, s_q=16, passes=("fwd",), tag="decode-longkv", n_sets=8,
                        s=s * 8, density=64 / (s * 8 // 128), variants=PACK_LONGKV_VARIANTS),
                   dict(passes=("bwd",), variants=PACK_BWD_VARIANTS)):
            rows += pack_gqa_rows(**{"s": s, **kw})
            _write(args.out, rows)
    elif args.splits:
        sel = [int(r) for r in args.rows.split(",") if r] or None
        settings = tuple(x if x == "auto" else int(x) for x in args.split_settings.split(","))
        rows = splits(rows_sel=sel, settings=settings, trace=args.trace)
    elif args.dense:
        if jax.devices()[0].platform != "gpu":
            ap.error("--dense times cuDNN, which needs an NVIDIA GPU")
        rows = dense_rows()
    elif args.causal:
        status = jsa.kernel_status()
        if status.backend != "kernel":
            ap.error(f"--causal times the kernels, which cannot run here ({status.reason})")
        rows = causal_rows(s=s)
    elif args.table:
        sel = [int(r) for r in args.rows.split(",") if r] or None
        rows = table(args.table.split(";"), rows_sel=sel, pass_=args.table_pass,
                     rows_def=SWEEP_TABLE if args.sweep_k else None, lists=args.lists)
        if args.sweep_k:
            _write(args.out, rows, fits=sweep_fit(rows))
            print("wrote", args.out)
            return
    elif not args.variants:
        cases = [(64, 32, ("fwd", "bwd", "csr")), (128, 16, ("fwd", "bwd"))]
        rows = run(cases, s=s, tag="default")
    else:
        for var in args.variants.split(";"):
            envs, _, which = var.partition(":")
            env = dict(kv.partition("=")[::2] for kv in filter(None, envs.split(",")))
            switches = config.from_env(env)
            which = which.split(",")
            cases = []
            for blk, topk in ((64, 32), (128, 16)):
                ps = tuple(p for p in ("fwd", "bwd", "csr") if f"blk{blk}{p}" in which or (p == "csr" and "csr" in which and blk == 64))
                if ps:
                    cases.append((blk, topk, ps))
            rows += run(cases, s=s, n_sets=2, tag=envs or "default", switches=switches)
    if args.reference:
        rows += run([(64, 32, ("fwd", "bwd"))], s=s, n_sets=1, tag="reference",
                    backend="reference")
    _write(args.out, rows)
    print("wrote", args.out)


def _write(path, rows, fits=None):
    meta = dict(device=str(jax.devices()[0]), jax=jax.__version__, timing=TIMING["mode"],
                burst=dict(launches=BURST_LAUNCHES, pause_s=BURST_PAUSE_S,
                           samples=BURST_SAMPLES),
                flops="fwd = 4*B*H*S_q*D*(top_k*blk) (causal rows: 4*B*H*blk*D*blk*"
                      "sum(q2k_block_nums), every listed block in full); bwd = 2.5*fwd",
                floors=dict(blk64_top32_fwd=310, blk64_top32_bwd=230, blk128_top16_fwd=340))
    with open(path, "w") as f:
        json.dump(dict(meta=meta, rows=rows, **({"fits": fits} if fits is not None else {})), f,
                  indent=1)


if __name__ == "__main__":
    main()
