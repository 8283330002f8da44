"""Model of the deterministic block-sparse backward's dQ orders (CPU, numpy): how long the
CTAs wait for their turn under each order, relative to the same lists without waits.

``python scripts/det_order_model.py [--blk 64] [--s 16384] [--heads 16] [--kv-heads 16]
[--density 0.125] [--noise 0.1] [--hand-back 0.05] [--publish 0.3] [--slots 1]``

The K->Q lists come from random top-k metadata as in ``benchmarks/bsa_bench.py`` (one batch;
``--kv-heads`` for GQA). CTAs (one per K->Q row) are launched in row order onto ``held``
slots (2 x 132 at blk 64, 132 at blk 128) and walk their entries; one entry is one unit of
consumer work (the GEMMs, then ``s`` = 0.25 of it staging the step's dQ, which needs the
writer warp's hand-back of the previous step), times ``1 + noise * N(0, 1)``. The writer
warp takes a staged step once the entry's rank has come up on its query tile (every
contribution of lower rank published), hands the staging buffer back after ``--hand-back``
(0.05) and publishes ``--publish`` (0.3) later (D 64, whose step takes about half the time:
``--hand-back 0.1 --publish 0.6``). With ``--slots N`` (``bsa_bwd_ws=dqslots=N``) each
query tile has ``N`` accumulators and a contribution waits only for the one ``N`` ranks
before it.
The orders: ``none`` (no waits: the default, non-deterministic backward), ``kv`` (ascending
KV block, the blk 64 default), ``group`` (launch groups of half the slots, the blk 128
default), ``sched`` / ``schedfull`` (``metadata.kq_schedule_order_reference`` with a window
of half / all the slots: ``bsa_bwd_ws=detsched`` / ``detschedfull``). Printed: the model's
time of each order and the ratio none / order (the deterministic mode's speed relative to
the default; measured on the H200 before the schedule order: 0.53 at blk 64, 0.75 at blk 128,
against the model's 0.55 / 0.76).
"""

from __future__ import annotations

import argparse
import heapq

import jax
import jax.numpy as jnp
import numpy as np

from jax_sparse_attn import metadata


def simulate(walks, ranks, n_kv, held, noise, seed, s=0.25, delta=0.05, lam=0.3, slots=1):
    """Finish time of CTAs ``r`` (walk ``walks[r]``: query tiles; ``ranks[r]``: their ranks)
    launched in order onto ``held`` slots (see the module docstring); ``slots`` dQ
    accumulators per query tile (rank ``r`` waits for rank ``r - slots`` only)."""
    rng = np.random.default_rng(seed)
    n_rows = len(walks)
    ev, seq = [], [0]

    def push(t, kind, r, p):
        heapq.heappush(ev, (t, seq[0], kind, r, p))
        seq[0] += 1

    cnt, waiting, st = {}, {}, {}
    nxt, free, end = 0, held, 0.0

    def dur():
        return max(0.2, 1.0 + noise * rng.standard_normal())

    def launch(now):
        nonlocal nxt, free
        while free > 0 and nxt < n_rows:
            r = nxt
            nxt += 1
            free -= 1
            L = len(walks[r])
            st[r] = dict(L=L, gemm=[None] * L, staged=[None] * L, back=[None] * L, wp=0, pubs=0)
            if L == 0:
                push(now, "end", r, 0)
            else:
                push(now + dur() * (1 - s), "gemm", r, 0)

    def key(r, p):
        return (r // n_kv, int(walks[r][p]), int(ranks[r][p]) % slots)

    def try_writer(r, now):
        S = st[r]
        p = S["wp"]
        if p >= S["L"] or S["staged"][p] is None or (p > 0 and S["back"][p - 1] is None):
            return
        k = key(r, p)
        if cnt.get(k, 0) < ranks[r][p] // slots:
            waiting.setdefault(k, {})[int(ranks[r][p]) // slots] = r
            return
        t = max(now, S["staged"][p]) + delta
        S["back"][p] = t
        S["wp"] = p + 1
        push(t, "back", r, p)
        push(t + lam, "pub", r, p)

    def try_stage(r, p, now):
        S = st[r]
        if S["gemm"][p] is None or (p > 0 and S["back"][p - 1] is None) or S["staged"][p] is not None:
            return
        t = max(S["gemm"][p], S["back"][p - 1] if p > 0 else 0.0) + s
        S["staged"][p] = t
        push(t, "staged", r, p)

    launch(0.0)
    while ev:
        now, _, kind, r, p = heapq.heappop(ev)
        end = max(end, now)
        if kind == "end":
            free += 1
            launch(now)
            continue
        S = st[r]
        if kind == "gemm":
            S["gemm"][p] = now
            try_stage(r, p, now)
        elif kind == "staged":
            if p + 1 < S["L"]:
                push(now + dur() * (1 - s) - s, "gemm", r, p + 1)
            try_writer(r, now)
        elif kind == "back":
            if p + 1 < S["L"]:
                try_stage(r, p + 1, now)
            try_writer(r, now)
        else:  # "pub"
            k = key(r, p)
            cnt[k] = cnt.get(k, 0) + 1
            S["pubs"] += 1
            w = waiting.get(k, {})
            if cnt[k] in w:
                try_writer(w.pop(cnt[k]), now)
            if S["pubs"] == S["L"]:
                push(now, "end", r, 0)
    if any(st.get(r, {}).get("pubs") != len(walks[r]) for r in range(n_rows)):
        raise RuntimeError("deadlock in the model")
    return end


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blk", type=int, default=64)
    ap.add_argument("--s", type=int, default=16384)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=0, help="default: --heads (MHA)")
    ap.add_argument("--density", type=float, default=0.125)
    ap.add_argument("--noise", type=float, default=0.1)
    ap.add_argument("--sms", type=int, default=metadata.DEFAULT_NUM_SMS)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--hand-back", type=float, default=0.05,
                    help="writer warp: staged step to staging buffer handed back (steps)")
    ap.add_argument("--publish", type=float, default=0.3,
                    help="writer warp: hand-back to the contribution published (steps)")
    ap.add_argument("--slots", type=int, default=1,
                    help="dQ accumulators per query tile (bsa_bwd_ws dqslots=N)")
    a = ap.parse_args(argv)
    n = -(-a.s // a.blk)
    topk = max(1, round(a.density * n))
    held = a.sms * (1 if a.blk == 128 else 2)
    h_kv = a.kv_heads or a.heads
    rng = np.random.default_rng(a.seed)
    idx = jnp.asarray(np.argsort(rng.random((1, a.heads, n, n)), -1)[..., :topk].astype(np.int32))
    nums = jnp.full((1, a.heads, n), topk, jnp.int32)
    off, ent = (np.asarray(x) for x in metadata.build_kq_csr(
        idx, nums, num_kv_heads=h_kv, num_kv_blocks=n))
    rows = lambda e, r: [e[off[i]:off[i + 1]] for i in range(len(off) - 1)]  # noqa: E731
    orders = {"none": (rows(ent, None), [np.zeros(off[i + 1] - off[i], int)
                                         for i in range(len(off) - 1)])}
    for name, g in (("kv", 0), ("group", max(held // 2, 1))):
        _, e, r = metadata.build_kq_csr(idx, nums, num_kv_heads=h_kv, num_kv_blocks=n,
                                        with_ranks=True, rank_group=g)
        orders[name] = (rows(np.asarray(e), None), rows(np.asarray(r), None))
    starts = np.asarray(metadata.kq_schedule_starts(jnp.asarray(off), num_kv_blocks=n, held=held))
    for name, w in (("sched", max(held // 2, 1)), ("schedfull", held)):
        e, r = metadata.kq_schedule_order_reference(off, ent, starts, num_kv_blocks=n, window=w)
        orders[name] = (rows(e, None), rows(r, None))
    base = None
    print(f"blk {a.blk}, S {a.s}, {a.heads} / {h_kv} heads, top-{topk} of {n}, {held} CTA slots, "
          f"noise {a.noise}, hand-back {a.hand_back}, publish {a.publish}, slots {a.slots}")
    for name, (walks, ranks) in orders.items():
        t = simulate(walks, ranks, n, held, a.noise, a.seed + 1, delta=a.hand_back,
                     lam=a.publish, slots=a.slots)
        base = base or t
        print(f"{name:10s} {t:9.1f} units   none / order = {base / t:.2f}")


if __name__ == "__main__":
    jax.config.update("jax_platforms", "cpu")
    main()
