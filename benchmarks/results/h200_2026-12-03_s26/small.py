"""dqalt debug: one small backward with bsa_bwd_ws=dqalt vs the default kernel."""
import sys, time, faulthandler
faulthandler.dump_traceback_later(float(sys.argv[4]) if len(sys.argv) > 4 else 35, exit=True)
import numpy as np
import jax, jax.numpy as jnp
import jax_sparse_attn as jsa
from jax_sparse_attn.config import Switches

S = int(sys.argv[1]); kmax = int(sys.argv[2]); ws = sys.argv[3] if len(sys.argv) > 3 else "dqalt"
B, H, D, blk = 1, 1, 128, 128
rng = np.random.default_rng(0)
nq = -(-S // blk)
q, k, v, do = (jnp.asarray(rng.standard_normal((B, S, H, D), np.float32), jnp.bfloat16) for _ in range(4))
idx = np.zeros((B, H, nq, kmax), np.int32)
for i in range(nq):
    idx[0, 0, i] = [(i + j) % nq for j in range(kmax)]
nums = np.full((B, H, nq), min(kmax, nq), np.int32)
idx, nums = jnp.asarray(idx), jnp.asarray(nums)

def grads(ws):
    sw = Switches(bsa_bwd_impl="sm90ws", bsa_bwd_ws=ws)
    @jax.jit
    def f(q, k, v, do):
        _, vjp = jax.vjp(lambda q, k, v: jsa.block_sparse_attention(
            q, k, v, idx, None, None, nums, layout="bshd", sparse_block_size=blk,
            softmax_scale=0.08, backend="kernel", switches=sw), q, k, v)
        return vjp(do)
    return f

t = time.time()
import os
g0 = None if os.environ.get("SKIP_DEFAULT") else jax.block_until_ready(grads("")(q, k, v, do))
print("default done", time.time() - t, flush=True)
t = time.time()
g1 = jax.block_until_ready(grads(ws)(q, k, v, do))
print(ws, "done", time.time() - t, flush=True)
for n, a, b in zip("qkv", g0 or g1, g1):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    print(n, "maxabs", np.abs(a).max(), "maxdiff", np.abs(a - b).max(), "nan", np.isnan(b).sum(), flush=True)
