"""Session 19: whether block_n 64 (with the D <= 64 qscale default) beats block_n 128 at D = 64:
mean TFLOP/s over the readings; bn=64 wins if >= 2 % faster on 8x4096 and not slower than 1 %
on the other D = 64 shapes. Prints 'apply' or 'keep' and the means."""
import collections
import json
import sys

d = json.load(open(sys.argv[1]))["results"]
m = collections.defaultdict(list)
for r in d:
    m[(r["case"], r["variant"])].append(r["fwd_tflops"])
mean = {k: sum(v) / len(v) for k, v in m.items()}
for k, v in sorted(mean.items()):
    print(f"{k[0]:24s} {k[1]:40s} {v:7.1f}  {m[k]}")
W = "JAX_SPARSE_ATTN_HSTU_WS="
ok = mean[("8x4096-causal-d64", W + "bn=64")] >= 1.02 * mean[("8x4096-causal-d64", "default")]
for c in ("32x1024-causal-d64", "movielens-128x200"):
    ok = ok and mean[(c, W + "bn=64")] >= 0.99 * mean[(c, "default")]
print("apply" if ok else "keep")
