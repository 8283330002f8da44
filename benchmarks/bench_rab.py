"""Cost of the HSTU relative attention bias (rab) at the MovieLens-1M training shape.

Times, with :func:`benchmarks._timing.time_op` (median device time after warm-up), on one
batch of the MovieLens example (B=128 sequences packed into B * max_len = 25,600 tokens,
max_len 200, causal, jagged lengths of the real training windows when the data cache is
there, else drawn like them; 1 head; head dims 50 and 64; bf16 q/k/v, fp32 rab):

* ``attn``: ``hstu_attention`` forward + backward without rab, and with a given
  ``(B, 1, 200, 200)`` fp32 rab (its gradient included, as in training);
* ``bias``: ``bias.relative_bias`` forward + backward (gradient in both tables) in the
  library's formulation (``new``: scatter-free backward) and the plain-gather formulation
  (``gather``: autodiff turns the gathers into scatter-adds over B * N * N indices);
* ``block``: one attention block's rab part end to end: tables -> relative_bias ->
  hstu_attention, forward + backward, ``new`` and ``gather``;
* ``step``: one full jitted train step of ``examples/hstu_movielens.py`` (2 blocks,
  sampled softmax, Adam), without rab, with rab (``new``) and with the gather
  formulation patched in (``gather``); ``compile_s`` = the first call of a fresh jit (trace +
  XLA compile + CuTe compiles not cached yet, counted in ``cute_compiles``) + one run;
  ``host_pack_ms`` = the example's per-step numpy batch packing (host side, overlapped with
  the device by asynchronous dispatch).

``--xla-diagnostic`` reruns the ``bias``/``step`` cases in a child process with
``XLA_FLAGS=--xla_gpu_enable_scatter_determinism_expander=false`` (XLA's GPU scatter
without the sort-based deterministic rewrite) and stores them under ``xla_diagnostic``.

    python benchmarks/bench_rab.py --out bench_rab.json            # H200, ~3-5 min
    python benchmarks/bench_rab.py --tiny --backend reference      # CPU smoke, < 2 min
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import json
import os
import platform
import statistics
import subprocess
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_HERE)
_EXAMPLES = os.path.join(_ROOT, "examples")
for _p in (_ROOT, _EXAMPLES):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks import _timing  # noqa: E402
from jax_sparse_attn import bias as rab_bias  # noqa: E402
from jax_sparse_attn import hstu_attention  # noqa: E402

DIAG_FLAG = "--xla_gpu_enable_scatter_determinism_expander=false"


def gather_relative_bias(w_pos, w_ts, timestamps, query_timestamps=None):
    """``bias.relative_bias`` written with plain gathers (its gradient: two scatter-adds)."""
    wp = w_pos if w_pos.ndim == 2 else w_pos[None]
    wt = w_ts if w_ts.ndim == 2 else w_ts[None]
    ts = jnp.asarray(timestamps)
    tq = rab_bias.next_timestamps(ts) if query_timestamps is None else query_timestamps
    n, m = (wp.shape[-1] + 1) // 2, ts.shape[1]
    p, j = jnp.arange(m)[:, None], jnp.arange(m)[None, :]
    bucket = rab_bias.time_bucket(tq[:, :, None] - ts[:, None, :], wt.shape[-1] - 1)
    return wp[:, n - 1 + j - p][None] + jnp.moveaxis(wt[:, bucket], 0, 1)


BUILDERS = {"new": rab_bias.relative_bias, "gather": gather_relative_bias}


# ----------------------------------------------------------------------------- inputs


def movielens_batch(cfg, data_cache, seed=0):
    """One packed training batch of the example (numpy dict) and where it came from."""
    import hstu_movielens as hm  # noqa: PLC0415

    import _movielens_data as mldata  # noqa: PLC0415

    rng = np.random.default_rng(seed)
    if data_cache and os.path.exists(data_cache):
        seqs = mldata.load_cache(data_cache)
        if seqs.timestamps is not None:
            split = mldata.leave_one_out(seqs, paper_split=True)
            users = rng.permutation(len(split.train))[: cfg.batch_size]
            batch = hm.pack_train_batch(split.train, users, cfg, split.train_ts)
            return batch, (split, users, seqs.num_items), "ml-1m cache " + data_cache
    # Drawn like ML-1M's training windows: >= 18 items, long tail clipped at max_len;
    # gaps between ratings log-uniform from 1 s to ~3 years (spread over the log buckets).
    n_users = cfg.batch_size
    lens = np.minimum(np.round(np.exp(rng.uniform(np.log(18), np.log(1500), n_users))),
                      cfg.max_len + 1).astype(int) + 1
    seqs = [rng.integers(1, 3707, size=n) for n in lens]
    tss = [np.cumsum(np.exp(rng.uniform(0, 18, size=n))).astype(np.int64) + 9 * 10**8 for n in lens]
    tss = [np.minimum(t, 2**31 - 1).astype(np.int32) for t in tss]
    users = np.arange(n_users)
    batch = hm.pack_train_batch(seqs, users, cfg, tss)
    return batch, (None, users, 3706), "synthetic (no data cache)"


def attn_inputs(batch, cfg, d, key, dtype=jnp.bfloat16):
    T = cfg.batch_size * cfg.max_len
    kq, kk, kv, kg = jax.random.split(key, 4)
    q, k, v = (jax.random.normal(kk_, (T, 1, d), jnp.float32).astype(dtype) for kk_ in (kq, kk, kv))
    do = jax.random.normal(kg, (T, 1, d), jnp.float32).astype(dtype)
    return q, k, v, do


# ----------------------------------------------------------------------------- cases


def _attn(q, k, v, cu, rab, backend, n):
    return hstu_attention(q, k, v, cu, cu, max_seqlen_q=n, max_seqlen_k=n, scaling_seqlen=n,
                          window_size=(-1, 0), alpha=1.0, backend=backend, rab=rab)


def attn_case(batch, cfg, d, backend, with_rab, n_sets):
    n = cfg.max_len
    cu = jnp.asarray(batch["cu_seqlens"])
    tables = _tables(cfg, jax.random.PRNGKey(1))
    sets = []
    for s in range(n_sets):
        q, k, v, do = attn_inputs(batch, cfg, d, jax.random.PRNGKey(10 + s))
        rab = (rab_bias.relative_bias(*tables, jnp.asarray(batch["ts_k"]), jnp.asarray(batch["ts_q"]))
               .astype(jnp.float32) if with_rab else None)
        sets.append((q, k, v, do, rab))

    def fn(q, k, v, do, rab):
        def loss(q, k, v, rab):
            o = _attn(q, k, v, cu, rab, backend, n)
            return jnp.sum(o.astype(jnp.float32) * do.astype(jnp.float32))

        argn = (0, 1, 2, 3) if rab is not None else (0, 1, 2)
        # value_and_grad: the loss needs the forward's output (jax.grad alone would let XLA
        # drop the forward kernel, the loss being linear in it)
        return jax.value_and_grad(loss, argnums=argn)(q, k, v, rab)

    return fn, sets


def _tables(cfg, key):
    k1, k2 = jax.random.split(key)
    return (0.02 * jax.random.normal(k1, (2 * cfg.max_len - 1,)),
            0.02 * jax.random.normal(k2, (cfg.rab_num_buckets + 1,)))


def bias_case(batch, cfg, variant, n_sets):
    build = BUILDERS[variant]
    ts, tq = jnp.asarray(batch["ts_k"]), jnp.asarray(batch["ts_q"])
    shape = (cfg.batch_size, 1, cfg.max_len, cfg.max_len)
    sets = [(*_tables(cfg, jax.random.PRNGKey(20 + s)),
             jax.random.normal(jax.random.PRNGKey(30 + s), shape, jnp.float32)) for s in range(n_sets)]

    def fn(wp, wt, g):
        out, vjp = jax.vjp(lambda a, b: build(a, b, ts, tq), wp, wt)
        return out, vjp(g)

    return fn, sets


def block_case(batch, cfg, d, backend, variant, n_sets):
    build = BUILDERS[variant]
    n = cfg.max_len
    cu = jnp.asarray(batch["cu_seqlens"])
    ts, tq = jnp.asarray(batch["ts_k"]), jnp.asarray(batch["ts_q"])
    sets = [(*attn_inputs(batch, cfg, d, jax.random.PRNGKey(40 + s)),
             *_tables(cfg, jax.random.PRNGKey(50 + s))) for s in range(n_sets)]

    def fn(q, k, v, do, wp, wt):
        def loss(q, k, v, wp, wt):
            rab = build(wp, wt, ts, tq).astype(jnp.float32)
            o = _attn(q, k, v, cu, rab, backend, n)
            return jnp.sum(o.astype(jnp.float32) * do.astype(jnp.float32))

        return jax.value_and_grad(loss, argnums=(0, 1, 2, 3, 4))(q, k, v, wp, wt)

    return fn, sets


def step_case(cfg, backend, variant, batch, meta, steps, samples):
    """Median seconds of one train step (chained: params feed the next step), compile time."""

    import hstu_movielens as hm  # noqa: PLC0415
    import optax  # noqa: PLC0415

    from jax_sparse_attn import _cute_call  # noqa: PLC0415

    c = dataclasses.replace(cfg, rab=variant != "no_rab")
    num_items = meta[2]
    saved = rab_bias.relative_bias
    if variant == "gather":
        rab_bias.relative_bias = gather_relative_bias  # what encode() calls
    try:
        opt = optax.adam(c.lr, b1=0.9, b2=c.adam_b2)
        step = hm.make_train_step(c, backend, num_items, opt)
        params = hm.init_params(jax.random.PRNGKey(0), num_items, c)
        state = opt.init(params)
        dev_batch = jax.device_put(batch)
        key = jax.random.PRNGKey(1)
        n0 = _cute_call.compile_stats()
        t0 = time.perf_counter()
        params, state, loss = step(params, state, dev_batch, key)
        jax.block_until_ready(loss)
        compile_s = time.perf_counter() - t0
        n1 = _cute_call.compile_stats()
        for _ in range(3):
            params, state, loss = step(params, state, dev_batch, key)
        jax.block_until_ready(loss)
        times = []
        for _ in range(samples):
            t0 = time.perf_counter()
            for _ in range(steps):
                params, state, loss = step(params, state, dev_batch, key)
            jax.block_until_ready((params, loss))
            times.append((time.perf_counter() - t0) / steps)
        if not np.isfinite(float(loss)):
            raise FloatingPointError(f"train step {variant}: loss {float(loss)}")
    finally:
        rab_bias.relative_bias = saved
    # host side: the example's numpy packing of one batch (with / without timestamps)
    host = None
    split, users, _ = meta
    if split is not None:
        reps = 20
        t0 = time.perf_counter()
        for _ in range(reps):
            hm.pack_train_batch(split.train, users, c, split.train_ts if c.rab else None)
        host = (time.perf_counter() - t0) / reps * 1e3
    return {"ms": statistics.median(times) * 1e3, "ms_min": min(times) * 1e3,
            "ms_max": max(times) * 1e3, "compile_s": compile_s,
            "cute_compiles": n1["compiles"] - n0["compiles"],
            "steps_per_sample": steps, "samples": samples, "host_pack_ms": host}


# ----------------------------------------------------------------------------- driver


def _device():
    d = jax.devices()[0]
    return {"platform": d.platform, "device_kind": getattr(d, "device_kind", str(d)),
            "host": platform.node(), "jax": jax.__version__,
            "xla_flags": os.environ.get("XLA_FLAGS", "")}


def run(args):
    import hstu_movielens as hm  # noqa: PLC0415

    cfg = hm.PRESETS["full"]
    if args.tiny:
        cfg = dataclasses.replace(cfg, batch_size=8, eval_batch_size=8, max_len=32)
    backend = args.backend
    batch, meta, source = movielens_batch(cfg, args.data_cache)
    lens = np.diff(batch["cu_seqlens"])
    res = {"benchmark": "bench_rab", "date": _dt.datetime.now(_dt.timezone.utc).isoformat(),
           "device": _device(), "backend": backend, "data": source,
           "shape": {"batch": cfg.batch_size, "max_len": cfg.max_len, "heads": 1,
                     "tokens_packed": int(cfg.batch_size * cfg.max_len),
                     "tokens_valid": int(lens.sum()), "mean_len": float(lens.mean()),
                     "rab": [cfg.batch_size, 1, cfg.max_len, cfg.max_len]},
           "rows": []}
    sample_s = 0.01 if args.tiny else 0.05
    n_samples = 3 if args.tiny else 7

    def record(row):
        res["rows"].append(row)
        print(json.dumps(row), flush=True)
        if args.out:
            _write(args.out, res)

    def timed(case, variant, d, fn, sets):
        try:
            t = _timing.time_op(fn, sets, target_sample_s=sample_s, n_samples=n_samples)
            row = dict(case=case, variant=variant, d=d, ms=t.ms, ms_min=t.ms_min,
                       ms_max=t.ms_max, compile_s=t.compile_s, n_sets=t.n_sets, reps=t.reps)
        except Exception as e:  # noqa: BLE001  (a failing case is recorded, the rest still run)
            row = dict(case=case, variant=variant, d=d, error=f"{type(e).__name__}: {e}"[:500])
        record(row)

    parts = set(args.parts.split(","))
    n_sets = 2
    dims = (50, 64) if not args.tiny else (50,)
    if "attn" in parts:
        for d in dims:
            for with_rab in (False, True):
                timed("attn", "rab" if with_rab else "no_rab", d,
                      *attn_case(batch, cfg, d, backend, with_rab, n_sets))
    if "bias" in parts:
        for variant in ("new", "gather"):
            timed("bias", variant, None, *bias_case(batch, cfg, variant, n_sets))
    if "block" in parts:
        for d in dims:
            for variant in ("new", "gather"):
                timed("block", variant, d, *block_case(batch, cfg, d, backend, variant, n_sets))
    if "step" in parts:
        for variant in ("no_rab", "new", "gather"):
            try:
                row = dict(case="step", variant=variant, d=cfg.dqk,
                           **step_case(cfg, backend, variant, batch, meta,
                                       steps=2 if args.tiny else 20, samples=n_samples))
            except Exception as e:  # noqa: BLE001
                row = dict(case="step", variant=variant, d=cfg.dqk,
                           error=f"{type(e).__name__}: {e}"[:500])
            record(row)
    res["summary"] = summarize(res["rows"])
    return res


def summarize(rows):
    """rab's share of the train step and the gather/new ratios, from the rows."""
    get = {(r["case"], r["variant"], r.get("d")): r.get("ms") for r in rows}
    out = {}
    for variant in ("new", "gather"):
        s_rab, s_no = get.get(("step", variant, 50)), get.get(("step", "no_rab", 50))
        if s_rab and s_no:
            out[f"step_rab_share_{variant}"] = (s_rab - s_no) / s_rab
            out[f"step_rab_over_norab_{variant}"] = s_rab / s_no
    b_new, b_old = get.get(("bias", "new", None)), get.get(("bias", "gather", None))
    if b_new and b_old:
        out["bias_gather_over_new"] = b_old / b_new
    return out


def print_table(res):
    print(f"\nrab cost, {res['device']['device_kind']}, backend {res['backend']}, "
          f"{res['data']}, B={res['shape']['batch']} max_len={res['shape']['max_len']}")
    print(f"{'case':<7} {'variant':<8} {'d':>4} {'ms':>9} {'min':>9} {'compile s':>10}  note")
    for r in res["rows"]:
        if "error" in r:
            print(f"{r['case']:<7} {r['variant']:<8} {str(r.get('d') or '-'):>4}  ERROR {r['error'][:80]}")
            continue
        note = ""
        if r.get("host_pack_ms") is not None:
            note = f"host pack {r['host_pack_ms']:.2f} ms/step"
        if r.get("cute_compiles") is not None:
            note += f"  cute compiles {r['cute_compiles']}"
        print(f"{r['case']:<7} {r['variant']:<8} {str(r.get('d') or '-'):>4} {r['ms']:>9.3f} "
              f"{r['ms_min']:>9.3f} {r['compile_s'] if r.get('compile_s') is not None else float('nan'):>10.2f}  {note}")
    for k, v in res.get("summary", {}).items():
        print(f"  {k}: {v:.3f}")


def _write(path, obj):
    d = os.path.dirname(path)
    if d:
        os.makedirs(d, exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(path + ".tmp", path)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="JSON file (rewritten after every row)")
    ap.add_argument("--backend", default="kernel", choices=("kernel", "reference", "auto"))
    ap.add_argument("--data-cache", default=os.path.join(_ROOT, ".data", "ml-1m-sequences.npz"),
                    help="the example's MovieLens cache (real lengths and timestamps); "
                         "synthetic lengths if missing")
    ap.add_argument("--parts", default="attn,bias,block,step",
                    help="comma list of attn, bias, block, step")
    ap.add_argument("--tiny", action="store_true", help="B=8, max_len=32 (CPU smoke)")
    ap.add_argument("--xla-diagnostic", action="store_true",
                    help=f"also run bias,step in a child with XLA_FLAGS+={DIAG_FLAG}")
    args = ap.parse_args(argv)
    res = run(args)
    if args.xla_diagnostic:
        res["xla_diagnostic"] = diagnostic(args)
    if args.out:
        _write(args.out, res)
    print_table(res)
    if res.get("xla_diagnostic", {}).get("rows"):
        print(f"\nwith XLA_FLAGS={DIAG_FLAG}:")
        print_table(res["xla_diagnostic"])
    elif res.get("xla_diagnostic"):
        print("xla diagnostic failed:", res["xla_diagnostic"].get("error", "")[-500:])
    return res


def diagnostic(args):
    out = (args.out or "bench_rab.json") + ".xla_diag.json"
    env = dict(os.environ, XLA_FLAGS=(os.environ.get("XLA_FLAGS", "") + " " + DIAG_FLAG).strip())
    cmd = [sys.executable, os.path.abspath(__file__), "--out", out, "--backend", args.backend,
           "--data-cache", args.data_cache, "--parts", "bias,step"] + (["--tiny"] if args.tiny else [])
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=400)
        if os.path.exists(out):
            with open(out) as f:
                return json.load(f)
        return {"error": p.stderr[-3000:]}
    except subprocess.TimeoutExpired as e:
        if os.path.exists(out):
            with open(out) as f:
                return json.load(f)
        return {"error": f"timeout: {e}"}


if __name__ == "__main__":
    main()
