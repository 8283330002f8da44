"""BSA sm90ws backward: default epilogue (dK / dV through shared memory) against
bsa_bwd_ws=epiregs: dk / dv bitwise equal (dq too when deterministic), partial blocks,
empty rows, GQA, S_kv not a multiple of the block."""
import numpy as np
import jax, jax.numpy as jnp
import jax_sparse_attn as jsa
from jax_sparse_attn.config import Switches

fails = 0
CFGS = [(128, 128, "bshd", 4, 2, True), (128, 64, "bhsd", 4, 4, False),
        (64, 128, "bhsd", 8, 1, True), (64, 64, "bshd", 4, 2, False)]
b, sq, skv, kmax = 2, 1000, 1025, 6
for d, blk, layout, hq, hkv, sizes_on in CFGS:
    rng = np.random.default_rng(d + blk)
    nq, nkv = -(-sq // blk), -(-skv // blk)
    idx = np.stack([rng.permutation(nkv)[:kmax] for _ in range(b * hq * nq)]).reshape(
        b, hq, nq, kmax).astype(np.int32)
    nums = rng.integers(0, kmax + 1, (b, hq, nq)).astype(np.int32)
    sizes = (jnp.asarray(rng.integers(1, blk + 1, (b, hq, nkv)).astype(np.int32))
             if sizes_on else None)
    ks = jax.random.split(jax.random.PRNGKey(d * blk), 4)
    def t(key, s, h):
        shape = (b, h, s, d) if layout == "bhsd" else (b, s, h, d)
        return jax.random.normal(key, shape, jnp.bfloat16)
    q, k, v, do = t(ks[0], sq, hq), t(ks[1], skv, hkv), t(ks[2], skv, hkv), t(ks[3], sq, hq)
    kw = dict(layout=layout, sparse_block_size=blk, softmax_scale=d ** -0.5, backend="kernel",
              allow_empty_block_nums=True)
    fwd = jsa.block_sparse_attention_forward(q, k, v, jnp.asarray(idx), None, sizes,
                                             jnp.asarray(nums), **kw)
    o, lse = fwd.o_tensor, fwd.lse_tensor
    for det in (False, True):
        outs = []
        for ws in ("", "epiregs"):
            sw = Switches(bsa_bwd_impl="sm90ws", bsa_bwd_ws=ws)
            g = jsa.block_sparse_attention_backward(do, q, k, v, o, lse, jnp.asarray(idx), None,
                                                    sizes, jnp.asarray(nums), switches=sw,
                                                    deterministic=det, **kw)
            outs.append([np.asarray(x.astype(jnp.float32)) for x in g[:3]])
        res = []
        for i, nm in enumerate(("dq", "dk", "dv")):
            fin = np.isfinite(outs[0][i]).all()
            if nm == "dq" and not det:
                err = np.max(np.abs(outs[0][i] - outs[1][i]) / (np.abs(outs[1][i]) + 1e-2))
                ok = err < 2e-2 and fin
                res.append(f"dq rel {err:.1e}")
            else:
                ok = np.array_equal(outs[0][i], outs[1][i]) and fin
                res.append(f"{nm} {'equal' if ok else 'DIFFERS (%d)' % int(np.sum(outs[0][i] != outs[1][i]))}")
            fails += not ok
        print(f"d{d} blk{blk} {layout} h{hq}:{hkv} sizes={sizes_on} det={det}: " + ", ".join(res),
              flush=True)
print("FAILS", fails)
