"""Session 19: whether three consumer warpgroups (wg3) beat two at D <= 64: mean TFLOP/s over
the readings; wg3 wins if >= 3 % faster on B=8 L=4096 D=64 and not slower than 2 % on B=32
L=1024 D=64. Prints the means, then 'apply' or 'keep'."""
import collections
import json
import sys

d = json.load(open(sys.argv[1]))["results"]
m = collections.defaultdict(list)
for r in d:
    m[(r["case"], r["variant"])].append(r["fwd_tflops"])
mean = {k: sum(v) / len(v) for k, v in m.items()}
for k, v in sorted(mean.items()):
    print(f"{k[0]:24s} {k[1]:40s} {v:7.1f}  {[round(x, 1) for x in m[k]]}")
W = "JAX_SPARSE_ATTN_HSTU_WS="
ok = mean[("8x4096-causal-d64", W + "wg3")] >= 1.03 * mean[("8x4096-causal-d64", "default")]
ok = ok and mean[("32x1024-causal-d64", W + "wg3")] >= 0.98 * mean[("32x1024-causal-d64", "default")]
print("apply" if ok else "keep")
