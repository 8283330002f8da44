#!/usr/bin/env python3
"""Per-kernel SASS facts of the Hopper kernels, compiled on CPU for sm_90a: registers, stack
and local memory (spills), HGMMA instructions, how many of them end a wgmma group (``gsb0``)
against the PTX's ``wgmma.commit_group`` count (ptxas serializes the wgmma pipeline by
putting every HGMMA in a group of its own), and the SASS opcode counts of a loop given by
``--loop``.

The SASS is that of the cubin the CuTe DSL itself builds (``CUTE_DSL_KEEP=ptx,cubin``), so it
is the device's only where this process imports the DSL build the device runs: the GPU
bundle (``nvidia-cutlass-dsl-libs-cu13``, whose embedded ptxas is CUDA 13.4) for CPython
3.12. ``scripts/sass_env.sh`` makes such an environment on a CPU machine;
the cu12 build of the CPU CI (and the system ptxas 13.0) assemble the same PTX into
different SASS. Needs ``nvdisasm`` and ``cuobjdump`` (``$CUDA_HOME/bin`` or ``PATH``)::

    source scripts/sass_env.sh      # once per machine: $PY13, CUDA_HOME, PYTHONPATH
    $PY13 scripts/sass_sweep.py --out /tmp/sass [--only NAME ...] [--keep] [--loop LABEL]
        [--ws BSA_FWD_WS] [--bwd-ws BSA_BWD_WS] [--hstu-ws HSTU_FWD_WS]

Output: one line per kernel (``NAME kernel REG STACK LOCAL HGMMA gsb0 commit``; a
configuration that fails to lower prints ``NAME ERROR ...`` and the exit code is 1) and, with
``--keep``, each configuration's PTX, cubin and SASS under ``--out/NAME/``.
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# name -> (kind, options): the default kernels at the benchmarks' shapes, and the block-sparse
# forward variants that change the mainloop's barrier and integer work
CONFIGS = {
    "bsa-fwd-blk64-d128": ("bsa_fwd", dict(d=128, blk=64, ws="")),
    "bsa-fwd-blk128-d128": ("bsa_fwd", dict(d=128, blk=128, ws="")),
    "bsa-fwd-blk64-d64": ("bsa_fwd", dict(d=64, blk=64, ws="")),
    "bsa-fwd-blk64-d128-gqa": ("bsa_fwd", dict(d=128, blk=64, ws="", hkv=4)),
    "bsa-bwd-blk64-d128": ("bsa_bwd", dict(d=128, blk=64)),
    "bsa-bwd-blk128-d128": ("bsa_bwd", dict(d=128, blk=128)),
    "hstu-fwd-d128": ("hstu_fwd", dict(d=128)),
    "hstu-fwd-d64": ("hstu_fwd", dict(d=64)),
    "hstu-fwd-d128-fp16": ("hstu_fwd", dict(d=128, dtype="float16")),
    "hstu-fwd-d64-fp16": ("hstu_fwd", dict(d=64, dtype="float16")),
    "hstu-bwd-d128": ("hstu_bwd", dict(d=128)),
}


def lower(kind, o, ws=None, bwd_ws=None, hstu_ws=None):
    import jax
    import jax.numpy as jnp

    import jax_sparse_attn as jsa
    from jax_sparse_attn.config import Switches

    bf = jnp.bfloat16
    if kind in ("bsa_fwd", "bsa_bwd"):
        b, h, s, d, blk = 1, 16, 4096, o["d"], o["blk"]
        hkv = o.get("hkv", h)
        q = jax.ShapeDtypeStruct((b, h, s, d), bf)
        k = jax.ShapeDtypeStruct((b, hkv, s, d), bf)
        idx = jax.ShapeDtypeStruct((b, h, s // blk, 8), jnp.int32)
        nums = jax.ShapeDtypeStruct((b, h, s // blk), jnp.int32)
        sw = (Switches(bsa_fwd_impl="sm90ws", bsa_fwd_ws=o["ws"] if ws is None else ws)
              if kind == "bsa_fwd" else Switches(bsa_bwd_ws=bwd_ws or ""))
        kw = dict(layout="bhsd", sparse_block_size=blk, softmax_scale=0.3, backend="kernel",
                  switches=sw)
        if kind == "bsa_fwd":
            f = lambda q, k, v, i, n: jsa.block_sparse_attention_forward(  # noqa: E731
                q, k, v, i, None, None, n, **kw)
            args = (q, k, k, idx, nums)
        else:
            lse = jax.ShapeDtypeStruct((b, h, s), jnp.float32)
            f = lambda do, q, k, v, out, lse, i, n: jsa.block_sparse_attention_backward(  # noqa: E731
                do, q, k, v, out, lse, i, None, None, n, **kw)
            args = (q, q, k, k, q, lse, idx, nums)
    else:
        t, d = 8192, o["d"]
        q = jax.ShapeDtypeStruct((t, 4, d), jnp.dtype(o.get("dtype", "bfloat16")))
        cu = jax.ShapeDtypeStruct((5,), jnp.int32)
        sw = Switches(hstu_fwd_ws=hstu_ws) if hstu_ws else Switches()

        def fwd(q, k, v, cu):
            return jsa.hstu_attention(q, k, v, cu, cu, max_seqlen_q=2048, max_seqlen_k=2048,
                                      window_size=(-1, 0), switches=sw)

        if kind == "hstu_fwd":
            f, args = fwd, (q, q, q, cu)
        else:
            f = jax.grad(lambda q, k, v, cu: fwd(q, k, v, cu).astype(jnp.float32).sum(),
                         argnums=(0, 1, 2))
            args = (q, q, q, cu)
    jax.jit(f).trace(*args).lower(lowering_platforms=("cuda",))


def tool(name):
    home = os.environ.get("CUDA_HOME")
    if home and os.path.exists(os.path.join(home, "bin", name)):
        return os.path.join(home, "bin", name)
    path = shutil.which(name)
    if path is None:
        sys.exit(f"sass_sweep: {name} not found (set CUDA_HOME or PATH; scripts/sass_env.sh)")
    return path


def facts(cubin, ptx_text):
    sass = subprocess.run([tool("nvdisasm"), "-c", "-g", cubin], capture_output=True,
                          text=True, check=True).stdout
    res = subprocess.run([tool("cuobjdump"), "-res-usage", cubin], capture_output=True,
                         text=True, check=True).stdout
    m = re.search(r"REG:(\d+) STACK:(\d+).*?LOCAL:(\d+)", res)
    hg = re.findall(r"HGMMA\.[^;]*;", sass)
    return sass, dict(reg=int(m[1]) if m else -1, stack=int(m[2]) if m else -1,
                      local=int(m[3]) if m else -1, hgmma=len(hg),
                      gsb0=sum("gsb0" in h for h in hg),
                      commit=ptx_text.count("wgmma.commit_group"))


def loop_ops(sass, label):
    """Opcode counts between ``label:`` and the branch back to it."""
    lines = sass.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith(label + ":")), None)
    if start is None:
        return None
    end = next((i for i in range(start + 1, len(lines))
                if "BRA" in lines[i] and f"`({label})" in lines[i]), None)
    counts = {}
    for ln in lines[start:(end or start) + 1]:
        m = re.match(r"\s+/\*[0-9a-f]{4,}\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_]+)", ln)
        if m:
            counts[m[2]] = counts.get(m[2], 0) + 1
    return counts


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", nargs="*", help="configuration names (default: all)")
    ap.add_argument("--ws", help="bsa_fwd_ws options for the block-sparse forward configs")
    ap.add_argument("--hstu-ws", help="hstu_fwd_ws options for the HSTU configs")
    ap.add_argument("--bwd-ws", help="bsa_bwd_ws options for the block-sparse backward configs")
    ap.add_argument("--keep", action="store_true", help="keep PTX, cubin and SASS")
    ap.add_argument("--loop", help="with one --only: print the opcode counts of this SASS "
                                   "loop label (e.g. .L_x_21)")
    a = ap.parse_args()
    dump = tempfile.mkdtemp(prefix="sass_sweep_")
    os.environ.update(CUTE_DSL_ARCH="sm_90a", JAX_SPARSE_ATTN_FORCE_KERNEL="1",
                      CUTE_DSL_KEEP="ptx,cubin", CUTE_DSL_DUMP_DIR=dump, JAX_PLATFORMS="cpu")
    sys.path.insert(0, ROOT)
    os.makedirs(a.out, exist_ok=True)
    failed = False
    for name, (kind, o) in CONFIGS.items():
        if a.only and name not in a.only:
            continue
        try:
            lower(kind, o, a.ws, a.bwd_ws, a.hstu_ws)
        except Exception as e:  # noqa: BLE001 - one configuration's failure ends only it
            print(f"{name} ERROR {type(e).__name__}: {e}", flush=True)
            failed = True
        for cub in sorted(glob.glob(os.path.join(dump, "**", "*.cubin"), recursive=True)):
            ptx = cub[: -len(".cubin")] + ".ptx"
            ptx_text = open(ptx).read() if os.path.exists(ptx) else ""
            kern = re.search(r"\.entry\s+(\w+)", ptx_text)
            short = re.sub(r"_object_at_.*", "", kern[1]) if kern else os.path.basename(cub)
            short = re.sub(r"^kernel_cutlass_kernel_jax_sparse_attnkernels", "", short)
            sass, f = facts(cub, ptx_text)
            print(f"{name} {short} REG {f['reg']} STACK {f['stack']} LOCAL {f['local']} "
                  f"HGMMA {f['hgmma']} gsb0 {f['gsb0']} commit {f['commit']}", flush=True)
            if a.keep:
                d = os.path.join(a.out, name)
                os.makedirs(d, exist_ok=True)
                base = os.path.join(d, short)
                shutil.copy(cub, base + ".cubin")
                if os.path.exists(ptx):
                    shutil.copy(ptx, base + ".ptx")
                open(base + ".sass", "w").write(sass)
            if a.loop:
                ops = loop_ops(sass, a.loop)
                if ops:
                    tot = sum(ops.values())
                    print("  loop", a.loop, tot, " ".join(
                        f"{k} {v}" for k, v in sorted(ops.items(), key=lambda x: -x[1])))
            os.remove(cub)
            if os.path.exists(ptx):
                os.remove(ptx)
        clear_caches()
    sys.exit(1 if failed else 0)


def clear_caches():
    """Empty the compile caches, so that the next configuration compiles (and dumps) every
    kernel it lowers, also those an earlier one compiled (as tests/kept_ptx.py does)."""
    import jax
    from cutlass.jax import compile as cjc

    from jax_sparse_attn import _cute_call

    _cute_call.reset_compile_stats(clear_memory_cache=True)
    cjc.release_compile_cache()
    jax.clear_caches()


if __name__ == "__main__":
    main()
