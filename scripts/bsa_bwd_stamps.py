"""Where a step of the sm90ws block-sparse backward spends its cycles: SM clock readings at
fixed points of one consumer step of every CTA (``bsa_bwd_ws=stamp=N``, a diagnostic of
``kernels/bsa_bwd_sm90_ws.py``), read back from the dK rows the kernel writes them over.

Runs the block-sparse backward of a ``benchmarks/bsa_bench.py`` TABLE row (bf16, random
top-k lists, bhsd) on the sm90ws kernel with ``stamp=N`` (plus ``--flags``), then prints, per
consumer warpgroup, the median and the 10th / 90th percentiles over the CTAs of the cycles
from the step's start to each point, and writes them as JSON. The call's gradients are not
valid (the readings overwrite dK). GPU only.

    python scripts/bsa_bwd_stamps.py --row 3 --step 16 --out stamps.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

#: the points of a step, in order (``BsaBwdSm90Ws._consume_steps``); reading 0 is the step's
#: start, after the wait for its Q / dO stage
POINTS = ("S/dP issued", "S waited", "exp2 done", "dP waited", "dS stored", "dV issued",
          "dS barrier", "dQ/dK issued", "dQ waited", "hand-back waited", "dQ staged",
          "dK waited", "stage released")


def stamps_of(dk, mark, blk):
    """The readings in ``dk`` (B, H_kv, S, D) bf16: ``(steps, ctas)``, each an ``(n, 16)``
    int32 array with the warpgroup appended. Step rows: readings 1..13 less reading 0,
    reading 0, reading 0 less the previous step's end, (marker), warpgroup; CTA rows: the
    consumer's start, the first step's start, the last step's end, the epilogue's end (clock
    readings), the number of steps, the stamped step's wait for its Q / dO stage, ...,
    warpgroup."""
    bits = np.asarray(dk).view(np.uint16)[..., :32]
    words = np.ascontiguousarray(bits).view(np.int32).reshape(-1, dk.shape[-2], 16)
    pos = np.arange(dk.shape[-2]) % blk
    out = []
    for first in (0, 2):
        sel = [(words[:, pos == first + wg], wg) for wg in (0, 1)]
        rows = [np.concatenate([w, np.full((*w.shape[:-1], 1), wg, np.int32)], -1)
                for w, wg in sel]
        r = np.concatenate(rows, 1).reshape(-1, 17)
        out.append(r[r[:, 15] == mark])
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--row", type=int, default=3, help="bsa_bench TABLE row (default 3: blk128)")
    ap.add_argument("--step", type=int, default=16, help="the running step count to stamp")
    ap.add_argument("--flags", default="", help="more bsa_bwd_ws flags (comma list)")
    ap.add_argument("--out", default="")
    a = ap.parse_args(argv)

    import jax
    import jax.numpy as jnp

    import jax_sparse_attn as jsa
    from benchmarks import bsa_bench
    from jax_sparse_attn.config import Switches
    from jax_sparse_attn.kernels.bsa_bwd_sm90_ws import STAMP_MARK

    label, blk, topk, s, d, h, h_kv = bsa_bench.TABLE[a.row]
    q, k, v, idx, nums, do = bsa_bench._inputs(jax.random.PRNGKey(0), 1, h, s, d, blk, topk,
                                               jnp.bfloat16, h_kv)
    flags = tuple(f for f in a.flags.split(",") if f) + (f"stamp={a.step}",)
    kw = dict(layout="bhsd", sparse_block_size=blk, softmax_scale=1.0 / np.sqrt(d),
              backend="kernel", switches=Switches(bsa_bwd_impl="sm90ws", bsa_bwd_ws=flags))
    out, lse = jax.jit(lambda *x: tuple(jsa.block_sparse_attention_forward(
        *x[:4], None, None, x[4], **kw)))(q, k, v, idx, nums)
    bwd = jax.jit(lambda *x: tuple(jsa.block_sparse_attention_backward(
        x[0], *x[1:4], x[4], x[5], x[6], None, None, x[7], **kw)))
    for _ in range(3):  # the last call's readings (warm caches and clocks)
        dq, dk, dv = bwd(do, q, k, v, out, lse, idx, nums)
    st, cta = stamps_of(jax.device_get(dk), STAMP_MARK, blk)
    if not len(st):
        raise SystemExit(f"no stamped step {a.step}: fewer steps per block?")
    res = dict(case=label, step=a.step, flags=list(flags), points=list(POINTS), wg={})
    print(f"{label}, step {a.step}, flags {','.join(flags)}: cycles from the step's start")
    pct = (lambda x: (float(np.median(x)), float(np.percentile(x, 10)),
                      float(np.percentile(x, 90))))
    for wg in (0, 1):
        rows = st[st[:, 16] == wg]
        if not len(rows):
            continue
        med, p10, p90 = (np.percentile(rows[:, :13], p, axis=0) for p in (50, 10, 90))
        gap = pct(rows[:, 14])
        res["wg"][wg] = dict(n=int(len(rows)), median=med.tolist(), p10=p10.tolist(),
                             p90=p90.tolist(), gap_before=gap)
        print(f"warpgroup {wg} ({len(rows)} CTAs); from the previous step's end to this "
              f"step's start: median {gap[0]:.0f}, p10 {gap[1]:.0f}, p90 {gap[2]:.0f}")
        prev = 0.0
        for name, m, lo, hi in zip(POINTS, med, p10, p90):
            print(f"  {name:18s} {m:7.0f}  (+{m - prev:6.0f})   p10 {lo:7.0f}  p90 {hi:7.0f}")
            prev = m
    # the part of the gap spent waiting for the step's Q / dO stage (CTA rows, word 5)
    for wg in (0, 1):
        rows = cta[cta[:, 16] == wg]
        if len(rows):
            wait = pct(rows[:, 5])
            res["wg"].setdefault(wg, {})["stage_wait"] = wait
            print(f"warpgroup {wg}: of the gap, waiting for the Q / dO stage: median "
                  f"{wait[0]:.0f}, p10 {wait[1]:.0f}, p90 {wait[2]:.0f}")
    w0, w1 = st[st[:, 16] == 0], st[st[:, 16] == 1]
    if len(w0) == len(w1) and len(w0):
        skew = pct((w1[:, 13].astype(np.int64) - w0[:, 13]).astype(np.int32))
        res["wg1_start_minus_wg0"] = skew
        print(f"warpgroup 1 start - warpgroup 0 start: median {skew[0]:.0f}, p10 "
              f"{skew[1]:.0f}, p90 {skew[2]:.0f}")
    # per CTA (warpgroup 0): consumer start -> first step, the steps, last step -> epilogue end
    c0 = cta[cta[:, 16] == 0]
    if len(c0):
        d = lambda i, j: (c0[:, j].astype(np.int64) - c0[:, i]).astype(np.int32)  # noqa: E731
        steps = c0[:, 4]
        res["cta"] = dict(start_to_first_step=pct(d(0, 1)), steps=pct(d(1, 2)),
                          epilogue=pct(d(2, 3)), n_steps=pct(steps),
                          cycles_per_step=pct(d(1, 2) / np.maximum(steps, 1)))
        print("per CTA (warpgroup 0; median, p10, p90):")
        for k_, v_ in res["cta"].items():
            print(f"  {k_:20s} {v_[0]:9.0f} {v_[1]:9.0f} {v_[2]:9.0f}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
