"""Load balance of the HSTU forward's persistent deal of work items (CPU arithmetic, no GPU).

The sm90ws forward runs ``G`` persistent CTAs (one per SM) over the work items (query tile,
head) in the longest-work-first order of the tile schedule. This script models one item's
cost as the KV tiles it visits plus ``--overhead`` (its prologue and epilogue, in KV-tile
units), deals the items as the kernel does and prints, per benchmark shape, the mean CTA load
divided by the largest (1.0 = perfectly balanced; the kernel ends with its slowest CTA):

* ``round robin``: CTA ``c`` takes items ``c, c + G, ...`` (``hstu_fwd_ws=roundrobin``);
* ``alternating``: rounds of ``G`` items dealt in alternating direction, the default
  (``tile_scheduler.snake_next``, the kernel's own index arithmetic);
* ``dynamic``: each CTA takes the next item when it finishes its current one (greedy; the
  model of ``hstu_fwd_ws=dynamic``, whose producer warp claims the next item from an atomic
  counter once the current item's loads are issued, slightly before the item ends).

Usage: ``python -m benchmarks.hstu_deal_balance [--sms 132] [--out FILE.json]``.
"""

from __future__ import annotations

import argparse
import heapq
import json

import numpy as np

from benchmarks._grids import canonical_jagged_lengths

CASES = {
    "8x4096-causal": ([4096] * 8, 128, 128),
    "8x4096-causal-d256": ([4096] * 8, 128, 64),
    "32x1024-causal": ([1024] * 32, 128, 128),
    "jagged32-causal": (None, 128, 128),
}


def item_costs(lengths, block_m, block_n, heads, overhead):
    """Costs of the causal work items in the schedule's order (longest first; a row's heads
    are consecutive items)."""
    rows = []
    for n in lengths:
        for i in range(-(-n // block_m)):
            rows.append(-(-min((i + 1) * block_m, n) // block_n))
    rows.sort(reverse=True)
    return [r + overhead for r in rows for _ in range(heads)]


def balance(costs, g, deal):
    """Mean CTA load / largest CTA load of ``costs`` over ``g`` CTAs."""
    if deal not in ("round robin", "alternating", "dynamic"):
        raise ValueError(f"deal={deal!r}: one of 'round robin', 'alternating', 'dynamic'")
    g = min(g, len(costs))
    if deal == "dynamic":
        free = [(0.0, c) for c in range(g)]
        for x in costs:
            f, c = heapq.heappop(free)
            heapq.heappush(free, (f + x, c))
        worst = max(f for f, _ in free)
    else:
        from jax_sparse_attn.kernels.tile_scheduler import snake_next  # noqa: PLC0415

        load = np.zeros(g)
        for c in range(g):
            t = c
            while t < len(costs):
                load[c] += costs[t]
                t = t + g if deal == "round robin" else snake_next(t, c, g)
        worst = load.max()
    return sum(costs) / g / worst


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sms", type=int, default=132, help="persistent CTAs (the H200: 132)")
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--overhead", type=float, default=1.0,
                    help="per-item cost besides its KV tiles, in KV-tile units")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    res = {}
    for name, (lengths, bm, bn) in CASES.items():
        if lengths is None:
            lengths = [int(n) for n in canonical_jagged_lengths()]
        costs = item_costs(lengths, bm, bn, args.heads, args.overhead)
        res[name] = {d: round(balance(costs, args.sms, d), 4)
                     for d in ("round robin", "alternating", "dynamic")}
        print(f"{name:22s} " + "  ".join(f"{d} {v:.3f}" for d, v in res[name].items()))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"sms": args.sms, "heads": args.heads, "overhead": args.overhead,
                       "balance": res}, f, indent=1)


if __name__ == "__main__":
    main()
