"""Executed SASS instructions per opcode of two Nsight Compute runs side by side.

``python scripts/ncu_opcodes.py A.txt B.txt [work_items]``: A and B are ``ncu`` outputs of
``--metrics sass__inst_executed_per_opcode --print-metric-instances details`` (one kernel
launch each; ``scripts/gpu_s75_e.sh`` writes them). Prints each opcode's count in A and B,
A - B, and both per work unit when ``work_items`` is given (e.g. the score tiles of the
launch: heads x query blocks x listed blocks), sorted by A - B.
"""

import sys


def parse(path):
    text = open(path).read()
    i = text.index("sass__inst_executed_per_opcode")
    body = text[text.index("(", i) + 1:text.index(")", i)].replace("\n", " ")
    counts = {}
    for item in filter(None, (s.strip() for s in body.split(";"))):
        name, value = item.split(":")
        counts[name.strip()] = int(value.strip().replace(",", ""))
    return counts


def main(argv):
    a, b = parse(argv[0]), parse(argv[1])
    units = float(argv[2]) if len(argv) > 2 else None
    keys = sorted(set(a) | set(b), key=lambda k: -(a.get(k, 0) - b.get(k, 0)))
    head = f"{'opcode':12s} {'A':>13s} {'B':>13s} {'A - B':>12s}"
    print(head + (f" {'A / unit':>9s} {'B / unit':>9s}" if units else ""))
    for k in keys + ["total"]:
        x = sum(a.values()) if k == "total" else a.get(k, 0)
        y = sum(b.values()) if k == "total" else b.get(k, 0)
        line = f"{k:12s} {x:13,d} {y:13,d} {x - y:12,d}"
        print(line + (f" {x / units:9.1f} {y / units:9.1f}" if units else ""))


if __name__ == "__main__":
    main(sys.argv[1:])
