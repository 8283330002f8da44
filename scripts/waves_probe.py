"""Does the last partial wave of the persistent block-sparse forward cost time? Times the
forward (and optionally the backward) of `benchmarks.bsa_bench.table` rows whose sequence
lengths give a whole number of work-item waves (S = 16896: 132 query blocks of 128 x 16
heads = 16 x 132 CTAs) against the issue's S = 16384 (15.5 waves) and S = 15872 (15.03 waves).
With uniform items, the TFLOP/s of the three rows differ by the share of idle CTAs in the
last wave if that tail costs time.

    python scripts/waves_probe.py --out waves.json [--bwd]
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import bsa_bench  # noqa: E402

ROWS = [(f"blk{blk} top{k} S{s}", blk, k, s, 128, 16, 16)
        for blk, k in ((128, 16), (64, 32)) for s in (16384, 16896, 15872)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="waves.json")
    ap.add_argument("--bwd", action="store_true")
    a = ap.parse_args()
    rows = bsa_bench.table([""], rows_def=ROWS)
    if a.bwd:
        rows += bsa_bench.table([""], rows_def=ROWS, pass_="bwd")
    with open(a.out, "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
