import csv, sys, collections
f = sys.argv[1]; top = int(sys.argv[2]) if len(sys.argv) > 2 else 40
rows = list(csv.reader(open(f)))
hdr = rows[1]; data = rows[2:]
ia = hdr.index("Address"); isrc = hdr.index("Source"); iss = hdr.index("Warp Stall Sampling (All Samples)")
# stall reason columns
reasons = [i for i, h in enumerate(hdr) if h.startswith("stall_") or "Stall" in h and i not in (iss,)]
tot = sum(int(r[iss] or 0) for r in data)
print("total samples", tot, "instructions", len(data))
# per opcode class
cls = collections.Counter()
for r in data:
    op = r[isrc].strip().split()[0] if r[isrc].strip() else "?"
    if op.startswith("@"): op = r[isrc].strip().split()[1]
    cls[op.split(".")[0]] += int(r[iss] or 0)
print("by opcode:", [(k, round(100*v/tot,1)) for k, v in cls.most_common(15)])
idx = sorted(range(len(data)), key=lambda i: -int(data[i][iss] or 0))[:top]
for i in sorted(idx):
    r = data[i]
    print(f"{i:6d} {100*int(r[iss])/tot:5.1f}%  {r[isrc].strip()[:90]}")
