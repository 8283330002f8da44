"""Summary of Nsight Compute's warp-stall sampling from a source-page CSV export
(``ncu --import R.ncu-rep --page source --csv --print-source sass > R.csv``): the share of
the samples per opcode, then the ``top`` instructions with the most samples in program
order (index, share, SASS). Not a test.

``python scripts/ncu_stalls.py R.csv [top]``
"""

from __future__ import annotations

import collections
import csv
import sys


def main(path: str, top: int = 40) -> None:
    rows = list(csv.reader(open(path)))
    # the export starts with a title line, then the header
    hdr_i = next(i for i, r in enumerate(rows) if "Address" in r and "Source" in r)
    hdr, data = rows[hdr_i], rows[hdr_i + 1:]
    isrc = hdr.index("Source")
    iss = hdr.index("Warp Stall Sampling (All Samples)")
    count = lambda r: int(r[iss] or 0) if len(r) > iss else 0  # noqa: E731
    tot = sum(count(r) for r in data) or 1
    print("total samples", tot, "instructions", len(data))
    cls = collections.Counter()
    for r in data:
        words = r[isrc].strip().split() if len(r) > isrc else []
        if words and words[0].startswith("@") and len(words) > 1:
            words = words[1:]
        cls[words[0].split(".")[0] if words else "?"] += count(r)
    print("by opcode:", [(k, round(100 * v / tot, 1)) for k, v in cls.most_common(15)])
    idx = sorted(range(len(data)), key=lambda i: -count(data[i]))[:top]
    for i in sorted(idx):
        print(f"{i:6d} {100 * count(data[i]) / tot:5.1f}%  {data[i][isrc].strip()[:90]}")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 40)
