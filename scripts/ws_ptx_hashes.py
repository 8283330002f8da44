#!/usr/bin/env python3
"""sha256 of the PTX of the warp-specialized SM90 forwards (HSTU and BSA ``sm90ws``), lowered
for sm_90a on CPU through the public API, one line per configuration.

Used to show that a change leaves these kernels byte-identical: run it on two trees and diff
the outputs (``.loc``/``.file`` lines and comments are dropped before hashing)::

    PYTHONPATH=<tree> python scripts/ws_ptx_hashes.py [hstu|bsa|rab|all|quick] > a.txt

``rab`` lowers the HSTU sm90ws forward with a relative attention bias. ``quick`` is one HSTU
and one BSA configuration (tests/test_lowering_hstu.py compares them with the hashes recorded
in tests/ws_ptx_sha256.txt, whose first line is the CuTe DSL version they were made with).
"""

import glob
import hashlib
import os
import re
import sys
import tempfile

dump = tempfile.mkdtemp(prefix="ws_ptx_")
os.environ.update(CUTE_DSL_ARCH="sm_90a", JAX_SPARSE_ATTN_FORCE_KERNEL="1", CUTE_DSL_KEEP="ptx",
                  CUTE_DSL_DUMP_DIR=dump, JAX_PLATFORMS="cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import jax_sparse_attn as jsa  # noqa: E402
from jax_sparse_attn.config import Switches  # noqa: E402


def norm(text):
    out = []
    for ln in text.splitlines():
        s = ln.strip()
        if s.startswith((".loc", ".file", "//")):
            continue
        s = re.sub(r"//.*$", "", ln).rstrip()
        if s:
            out.append(s)
    return "\n".join(out)


def take_ptx():
    ptx = sorted(p for p in glob.glob(os.path.join(dump, "**", "*.ptx"), recursive=True)
                 if "hstu_scheduleHstuSchedule" not in open(p).read())  # not the schedule kernel
    hs = sorted(hashlib.sha256(norm(open(p).read()).encode()).hexdigest()[:16] for p in ptx)
    for p in ptx:
        os.remove(p)
    return hs


T, B = 300, 3


def hstu_case(dt, d, dv, fn, ws, rab=None):
    q = jax.ShapeDtypeStruct((T, 2, d), jnp.dtype(dt))
    v = jax.ShapeDtypeStruct((T, 2, dv), jnp.dtype(dt))
    cu = jax.ShapeDtypeStruct((B + 1,), jnp.int32)
    func = jax.ShapeDtypeStruct((1, fn, T + 256), jnp.int32) if fn else None
    r = None
    if rab is not None:
        r = jax.ShapeDtypeStruct((B, rab[0], 200, 200), jnp.dtype(rab[1]))
    window = (-1, -1) if fn else (-1, 0)
    # pdl=False: the pinned PTX is the kernel's without the programmatic-dependent-launch
    # wait (the default adds one griddepcontrol.wait; tests/test_lowering_hstu.py checks it)
    sw = Switches(hstu_fwd_impl="sm90ws", hstu_fwd_ws=ws, pdl=False)

    def f(q, k, v, cu, func, r):
        return jsa.hstu_attention(q, k, v, cu, cu, max_seqlen_q=200, max_seqlen_k=200,
                                  window_size=window, alpha=0.3, func=func, rab=r,
                                  backend="kernel", switches=sw)

    jax.jit(f).trace(q, q, v, cu, func, r).lower(lowering_platforms=("cuda",))


def bsa_case(d, blk, dt, layout, sizes, ws):
    h, s = 2, 300
    shp = (1, s, h, d) if layout == "bshd" else (1, h, s, d)
    q = jax.ShapeDtypeStruct(shp, jnp.dtype(dt))
    nq = -(-s // blk)
    idx = jax.ShapeDtypeStruct((1, h, nq, nq), jnp.int32)
    nums = jax.ShapeDtypeStruct((1, h, nq), jnp.int32)
    bs = jax.ShapeDtypeStruct((1, h, nq), jnp.int32) if sizes else None
    sw = Switches(bsa_fwd_impl="sm90ws", bsa_fwd_ws=ws, pdl=False)

    def f(q, k, v, i, n, bs):
        return jsa.block_sparse_attention_forward(
            q, k, v, i, None, bs, n, layout=layout, sparse_block_size=blk, softmax_scale=0.3,
            backend="kernel", switches=sw)

    jax.jit(f).trace(q, q, q, idx, nums, bs).lower(lowering_platforms=("cuda",))


HSTU = [("bfloat16", d, d, 0, "") for d in (32, 64, 128, 256)]
HSTU += [("bfloat16", 128, 128, 3, ""), ("bfloat16", 256, 256, 7, ""), ("float16", 128, 128, 0, ""),
         ("float16", 64, 64, 5, ""), ("bfloat16", 64, 128, 0, "")]
HSTU += [("bfloat16", 128, 128, 0, k) for k in ("nooverlap", "nopingpong", "q1", "silu16", "bn=64",
                                                "bn=80")]
HSTU += [("float16", 256, 256, 0, "bn=32"), ("bfloat16", 64, 64, 0, "noqscale"),
         ("float16", 128, 128, 0, "plate"), ("bfloat16", 64, 64, 0, "wg3"),
         ("bfloat16", 128, 128, 0, "splitwait"), ("bfloat16", 128, 128, 0, "noepivec"),
         ("float16", 64, 64, 0, "noepivec")]
HSTU += [("bfloat16", 128, 128, 0, "notmao"), ("bfloat16", 64, 64, 0, "notmao"),
         ("float16", 128, 128, 0, "notmao"), ("bfloat16", 128, 128, 3, "notmao"),
         ("bfloat16", 64, 128, 0, "notmao")]
BSA = [(128, 128, "bfloat16", "bshd", False, ""), (128, 64, "float16", "bhsd", True, ""),
       (64, 128, "float16", "bhsd", True, ""), (64, 64, "bfloat16", "bshd", False, ""),
       (128, 128, "bfloat16", "bhsd", True, "nooverlap,nopingpong"),
       (128, 64, "bfloat16", "bshd", False, "nooverlap"), (128, 128, "float16", "bshd", True, "q1"),
       (64, 64, "float16", "bhsd", True, "q1,stages=3"),
       (128, 64, "float16", "bhsd", True, "nosplitwait"),
       (128, 128, "bfloat16", "bshd", False, "noepivec"),
       (64, 128, "float16", "bhsd", True, "noepivec"),
       (128, 128, "bfloat16", "bshd", False, "notmao"), (128, 64, "float16", "bhsd", True, "notmao"),
       (64, 128, "float16", "bhsd", True, "notmao"), (64, 64, "bfloat16", "bshd", False, "notmao"),
       (128, 128, "bfloat16", "bshd", False, "nooinq"), (128, 64, "float16", "bhsd", True, "nooinq")]
RAB = [("bfloat16", 128, 128, 0, "", (1, "float32")), ("float16", 64, 64, 5, "", (2, "float16")),
       ("bfloat16", 256, 256, 0, "", (2, "bfloat16")), ("bfloat16", 32, 32, 3, "", (1, "float32")),
       ("bfloat16", 128, 128, 0, "silu16", (1, "bfloat16")),
       ("bfloat16", 128, 128, 0, "nooverlap", (2, "float32"))]

what = sys.argv[1] if len(sys.argv) > 1 else "all"
todo = []
if what in ("hstu", "all"):
    todo += [("hstu", c) for c in HSTU]
if what in ("bsa", "all"):
    todo += [("bsa", c) for c in BSA]
if what == "quick":
    todo += [("hstu", HSTU[2]), ("bsa", BSA[0])]
if what in ("rab",):
    todo += [("rab", c) for c in RAB]
for kind, c in todo:
    name = kind + "-" + "-".join(str(x) for x in c)
    try:
        if kind == "bsa":
            bsa_case(*c)
        else:
            hstu_case(*c)
        res = " ".join(take_ptx())
    except Exception as e:  # noqa: BLE001
        res = f"ERROR {type(e).__name__}: {e}"[:300].replace("\n", " ")
    print(name, res, flush=True)
