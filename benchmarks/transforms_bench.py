"""Cost of new shapes and of a process start on the kernel backend (H200), as JSON.

* ``new_length``: after one warm-up call, the first call at each new total token count
  split into trace+lower (our part, which includes the CuTe kernel lookup), XLA's compile
  and the run, plus the CuTe DSL compiles it caused (``jax_sparse_attn._cute_call``);
* ``process_start``: two fresh processes sharing an on-disk kernel cache
  (``JAX_SPARSE_ATTN_CACHE_DIR``): cold (compiles) and warm (loads), first-call seconds.

  python benchmarks/transforms_bench.py --out transforms.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

_CHILD = r"""
import json, time
t0 = time.perf_counter()
import jax, jax.numpy as jnp, jax_sparse_attn as jsa
from jax_sparse_attn import _cute_call
q = jnp.ones((4096, 4, 128), jnp.bfloat16); cu = jnp.asarray([0, 1000, 4096], jnp.int32)
def loss(q, k, v):
    return jnp.sum(jsa.hstu_attention(q, k, v, cu, cu, max_seqlen_q=3096, max_seqlen_k=3096,
                                      backend='kernel').astype(jnp.float32))
t1 = time.perf_counter()
jax.block_until_ready(jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))(q, q, q))
t2 = time.perf_counter()
print('RESULT ' + json.dumps(dict(_cute_call.compile_stats(), import_s=t1 - t0, first_call_s=t2 - t1)))
"""


def new_length(lengths=(4096, 4097, 5000, 8191, 1023, 77)):
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415

    import jax_sparse_attn as jsa  # noqa: PLC0415
    from jax_sparse_attn import _cute_call  # noqa: PLC0415

    def loss(q, k, v, cu):
        return jnp.sum(jsa.hstu_attention(q, k, v, cu, cu, max_seqlen_q=8192, max_seqlen_k=8192,
                                          backend="kernel").astype(jnp.float32))

    f = jax.value_and_grad(loss, argnums=(0, 1, 2))
    rows = []
    for t in lengths:
        q = jnp.ones((t, 4, 128), jnp.bfloat16)
        cu = jnp.asarray([0, t // 2, t], jnp.int32)
        c0 = _cute_call.compile_stats()
        t0 = time.perf_counter()
        lowered = jax.jit(f).trace(q, q, q, cu).lower()
        t1 = time.perf_counter()
        compiled = lowered.compile()
        t2 = time.perf_counter()
        jax.block_until_ready(compiled(q, q, q, cu))
        t3 = time.perf_counter()
        c1 = _cute_call.compile_stats()
        rows.append(dict(total_tokens=t, trace_lower_s=t1 - t0, xla_compile_s=t2 - t1,
                         first_run_s=t3 - t2, cute_compiles=c1["compiles"] - c0["compiles"],
                         cute_compile_s=c1["compile_seconds"] - c0["compile_seconds"],
                         cute_lowerings=c1["lowerings"] - c0["lowerings"],
                         cute_lower_s=c1["lower_seconds"] - c0["lower_seconds"]))
        print(json.dumps(rows[-1]), flush=True)
    return rows


def process_start():
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, JAX_SPARSE_ATTN_CACHE_DIR=d)
        out = {}
        for name in ("cold", "warm"):
            p = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True,
                               text=True, timeout=600)
            line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
            out[name] = json.loads(line[-1][7:]) if line else {"error": p.stderr[-2000:]}
            print(name, json.dumps(out[name]), flush=True)
        return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    res = {"new_length": new_length(), "process_start": process_start()}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
