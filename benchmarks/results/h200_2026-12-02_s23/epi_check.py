"""dK / dV (and dq) of the HSTU sm90 backward with hstu_bwd_ws=epismem against the default:
bitwise equal (dq too in the deterministic mode), on batches with partial KV tiles,
zero-length sequences, L_q != L_k and rows past the last sequence."""
import sys
import numpy as np
import jax, jax.numpy as jnp
import jax_sparse_attn as jsa
from jax_sparse_attn.config import Switches

sys.path.insert(0, ".")
from benchmarks._grids import canonical_jagged_lengths

fails = 0
cases = [("canonical d128 causal", canonical_jagged_lengths(), None, 128, (-1, 0)),
         ("small d128 local", [700, 0, 1500, 129, 64, 1000, 1], None, 128, (100, 20)),
         ("lq<lk d128 causal", [300, 0, 257, 5, 129], [400, 0, 300, 70, 129], 128, (-1, 0)),
         ("small d64 causal", [700, 0, 1500, 129, 64, 1000, 1], None, 64, (-1, 0)),
         ("lq<lk d64 full", [300, 0, 257, 5, 129], [400, 0, 300, 70, 129], 64, (-1, -1))]
for name, lq, lk, d, win in cases:
    lk = lk or lq
    cq = jnp.asarray(np.concatenate([[0], np.cumsum(lq)]), jnp.int32)
    ck = jnp.asarray(np.concatenate([[0], np.cumsum(lk)]), jnp.int32)
    tq, tk = int(sum(lq)) + 37, int(sum(lk)) + 21
    ks = jax.random.split(jax.random.PRNGKey(5), 4)
    q = jax.random.normal(ks[0], (tq, 4, d), jnp.bfloat16)
    k = jax.random.normal(ks[1], (tk, 4, d), jnp.bfloat16)
    v = jax.random.normal(ks[2], (tk, 4, d), jnp.bfloat16)
    do = jax.random.normal(ks[3], (tq, 4, d), jnp.bfloat16)
    kw = dict(max_seqlen_q=max(lq), max_seqlen_k=max(lk), window_size=win, alpha=d ** -0.5,
              scaling_seqlen=float(max(lq)), backend="kernel")
    for det in (False, True):
        outs = []
        for ws in ((), ("epismem",)):
            sw = Switches(hstu_bwd_ws=ws)
            f = jax.jit(lambda do, q, k, v, a, b, sw=sw: jsa.hstu_attention_backward(
                do, q, k, v, a, b, switches=sw, deterministic=det, **kw))
            outs.append([np.asarray(x.astype(jnp.float32)) for x in f(do, q, k, v, cq, ck)])
        res = []
        for i, nm in enumerate(("dq", "dk", "dv")):
            if nm == "dq" and not det:
                err = np.max(np.abs(outs[0][i] - outs[1][i]) / (np.abs(outs[0][i]) + 1e-2))
                ok = err < 2e-2 and np.isfinite(outs[1][i]).all()
                res.append(f"dq rel {err:.1e}")
            else:
                ok = np.array_equal(outs[0][i], outs[1][i])
                res.append(f"{nm} {'equal' if ok else 'DIFFERS (%d)' % int(np.sum(outs[0][i] != outs[1][i]))}")
            fails += not ok
        print(f"{name} det={det}: " + ", ".join(res), flush=True)
print("FAILS", fails)
