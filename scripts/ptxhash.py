"""Lower HSTU fwd/bwd configs without rab for sm_90a, keep PTX, print sha256 per kernel."""
import hashlib, os, sys, glob, tempfile
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
os.environ["JAX_SPARSE_ATTN_FORCE_KERNEL"] = "1"
import jax, jax.numpy as jnp
from jax_sparse_attn.ffi import hstu as fh
T, B = 300, 3
cases = []
for impl in ("sm90pp", "sm90", "sm80"):
    for d, fn, dt in ((128, 0, jnp.bfloat16), (64, 3, jnp.float16), (256, 0, jnp.bfloat16), (32, 5, jnp.bfloat16)):
        cases.append(("fwd", impl, d, fn, dt))
for d, fn, dt in ((128, 0, jnp.bfloat16), (64, 3, jnp.float16), (256, 0, jnp.bfloat16), (32, 5, jnp.bfloat16)):
    cases.append(("bwd", None, d, fn, dt))
dump = sys.argv[1]
os.makedirs(dump, exist_ok=True)
os.environ["CUTE_DSL_DUMP_DIR"] = dump
os.environ["CUTE_DSL_KEEP"] = "ptx"
seen = set()
for direction, impl, d, fn, dt in cases:
    if impl: os.environ["JAX_SPARSE_ATTN_HSTU_FWD_IMPL"] = impl
    q = jax.ShapeDtypeStruct((T, 2, d), dt)
    cu = jax.ShapeDtypeStruct((B + 1,), jnp.int32)
    func = jax.ShapeDtypeStruct((1, fn, T + 256), jnp.int32) if fn else None
    window = (-1, -1) if fn else (-1, 0)
    kw = dict(max_seqlen_q=100, max_seqlen_k=100, scaling_seqlen=100.0, window_size=window, alpha=1.0)
    if direction == "fwd":
        f = lambda q, k, v, cu, func: fh.hstu_fwd(q, k, v, cu, cu, func, **kw)
        args = (q, q, q, cu, func)
    else:
        f = lambda do, q, k, v, cu, func: fh.hstu_bwd(do, q, k, v, cu, cu, func, **kw)
        args = (q, q, q, q, cu, func)
    name = f"{direction}-{impl}-{d}-{fn}-{jnp.dtype(dt).name}"
    jax.jit(f).trace(*args).lower(lowering_platforms=("cuda",))
    ptx = sorted(glob.glob(os.path.join(dump, "**", "*.ptx"), recursive=True))
    hs = [hashlib.sha256(open(p, "rb").read()).hexdigest()[:16] for p in ptx]
    for p in ptx:
        os.remove(p)
    print(name, len(ptx), " ".join(hs), flush=True)
