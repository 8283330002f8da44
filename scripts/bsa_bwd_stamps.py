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


def stamps_of(dk, mark):
    """The readings in ``dk`` (B, H_kv, S, D) bf16: an ``(n, 16)`` int32 array, one row per
    stamped (block, warpgroup): readings 1..13 less reading 0, reading 0, the warpgroup."""
    bits = np.asarray(dk).view(np.uint16)[..., :32]
    words = np.ascontiguousarray(bits).view(np.int32).reshape(-1, 16)
    return words[words[:, 15] == mark][:, :15]


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
    st = stamps_of(jax.device_get(dk), STAMP_MARK)
    if not len(st):
        raise SystemExit(f"no stamped step {a.step}: fewer steps per block?")
    res = dict(case=label, step=a.step, flags=list(flags), points=list(POINTS), wg={})
    print(f"{label}, step {a.step}, flags {','.join(flags)}: cycles from the step's start")
    for wg in sorted(set(st[:, 14].tolist())):
        rows = st[st[:, 14] == wg][:, :13]
        med, p10, p90 = (np.percentile(rows, p, axis=0) for p in (50, 10, 90))
        res["wg"][int(wg)] = dict(n=int(len(rows)), median=med.tolist(), p10=p10.tolist(),
                                  p90=p90.tolist())
        print(f"warpgroup {wg} ({len(rows)} CTAs)")
        prev = 0.0
        for name, m, lo, hi in zip(POINTS, med, p10, p90):
            print(f"  {name:18s} {m:7.0f}  (+{m - prev:6.0f})   p10 {lo:7.0f}  p90 {hi:7.0f}")
            prev = m
    # the warpgroups' start skew within a CTA (rows n0 and n0 + 1 of one block)
    if len(res["wg"]) == 2:
        t0 = {}
        for r in st:
            t0.setdefault(int(r[14]), []).append(int(r[13]))
        if len(t0[0]) == len(t0[1]):
            skew = (np.array(t0[1], np.int64) - np.array(t0[0], np.int64)).astype(np.int32)
            res["wg1_start_minus_wg0"] = dict(median=float(np.median(skew)),
                                              p10=float(np.percentile(skew, 10)),
                                              p90=float(np.percentile(skew, 90)))
            print(f"warpgroup 1 start - warpgroup 0 start: {res['wg1_start_minus_wg0']}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
