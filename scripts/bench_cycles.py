"""Cycles of ``bsa_bench`` / ``hstu_bench`` rows: for each row of the JSON files, the
sustained time, TFLOP/s, the median SM clock sampled during the sustained run and their
product (thousands of SM cycles), and against the first variant of the same case the time,
cycle and clock ratios (above 1: faster, fewer cycles, higher clock). Under the power cap the
clock differs between variants, so a variant's time gain splits into its cycle gain and
its clock gain. Not a test.

``python scripts/bench_cycles.py R.json [R2.json ...]``
"""

from __future__ import annotations

import json
import sys


def rows_with_cycles(rows):
    """``rows`` (the JSON's ``rows``) with ``kcycles`` and, per case, the ratios against the
    case's first row (``time_x``, ``cycles_x``, ``clock_x``); rows without a clock reading
    get ``None``."""
    first = {}
    out = []
    for r in rows:
        ms, mhz = r.get("ms_sustained", r.get("ms")), r.get("sm_mhz_median_sustained")
        kcyc = ms * mhz if ms is not None and mhz else None
        base = first.setdefault(r["case"], (ms, kcyc, mhz))
        ratio = (lambda a, b: a / b if a and b else None)  # noqa: E731
        out.append(dict(r, kcycles=kcyc, time_x=ratio(base[0], ms),
                        cycles_x=ratio(base[1], kcyc), clock_x=ratio(mhz, base[2])))
    return out


def main(paths) -> None:
    fmt = lambda v, f: "-" if v is None else format(v, f)  # noqa: E731
    print(f"{'case':24s} {'variant':44s} {'ms':>7s} {'TFLOP/s':>8s} {'MHz':>6s} "
          f"{'Kcycles':>8s} {'time':>6s} {'cycles':>6s} {'clock':>6s}")
    for p in paths:
        for r in rows_with_cycles(json.load(open(p))["rows"]):
            print(f"{r['case']:24s} {r.get('variant') or 'default':44s} "
                  f"{fmt(r.get('ms_sustained', r.get('ms')), '7.3f')} {fmt(r.get('tflops'), '8.1f')} "
                  f"{fmt(r.get('sm_mhz_median_sustained'), '6.0f')} {fmt(r['kcycles'], '8.1f')} "
                  f"{fmt(r['time_x'], '6.3f')} {fmt(r['cycles_x'], '6.3f')} "
                  f"{fmt(r['clock_x'], '6.3f')}")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
