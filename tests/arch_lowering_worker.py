"""Worker of tests/test_lowering_arch.py: lowers kernel configurations for one target arch.

Run as ``python tests/arch_lowering_worker.py ARCH SUBSET [SWITCH=VALUE ...]`` in a fresh
process: CuTe DSL reads ``CUTE_DSL_ARCH`` when it is imported, so every arch needs its own
process. ``SUBSET`` names the configurations (:data:`SUBSETS`; ``full`` is every static
configuration of tests/test_lowering_hstu.py and tests/test_lowering_bsa.py's grids).
Optional ``field=value`` pairs are :class:`~jax_sparse_attn.config.Switches` fields (e.g.
``kernel_family=portable``).

Prints one JSON object: ``{"arch", "limit", "results": [...]}``; each result has the
configuration's name, ``ok`` (lowered), ``error`` (the exception text otherwise),
``calls`` (CuTe DSL custom calls in the lowering), ``elf`` (a cubin is embedded), the compile
keys' ``impl``/``arch``/tiles/``vec_red`` and ``smem``: every kernel launch the compile
declared, as ``[kernel class, dynamic shared memory bytes]``, read from the launch itself
(``KernelLauncher.launch(smem=...)`` is recorded).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys

ARCH = sys.argv[1]
SUBSET = sys.argv[2]
os.environ.update(CUTE_DSL_ARCH=ARCH, JAX_SPARSE_ATTN_FORCE_KERNEL="1", JAX_PLATFORMS="cpu")
for k in [k for k in os.environ if k.startswith("JAX_SPARSE_ATTN_") and k != "JAX_SPARSE_ATTN_FORCE_KERNEL"]:
    del os.environ[k]

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from cutlass.cutlass_dsl.cutlass import KernelLauncher  # noqa: E402

import jax_sparse_attn as jsa  # noqa: E402
from jax_sparse_attn import _platform  # noqa: E402
from jax_sparse_attn.config import Switches  # noqa: E402
from jax_sparse_attn.ffi import bsa as ffi_bsa  # noqa: E402
from jax_sparse_attn.ffi import hstu as ffi_hstu  # noqa: E402

_LAUNCHES = []
_launch = KernelLauncher.launch


def _recording_launch(self, *args, **kwargs):
    # a @cute.kernel method is called with the kernel object as its first argument
    owner = self.func_args[0] if self.func_args else None
    name = type(owner).__name__ if hasattr(owner, "__dict__") else "?"
    _LAUNCHES.append([name, int(kwargs.get("smem", 0) or 0)])
    return _launch(self, *args, **kwargs)


KernelLauncher.launch = _recording_launch

CALL_TARGET = "CuteDSLRT_NvJaxCutlassCall"
SCHEDULE = "hstu_scheduleHstuSchedule"  # in the name of the HSTU tile-schedule kernel
# the dq reordering kernels of the Hopper backwards' query-tile workspaces (HSTU, BSA)
DQ_TILES = ("hstu_dq_tilesHstuDqFromTiles", "dq_tilesBsaDqFromTiles")
T, B = 300, 3

# (name, op, head_dim, dtype, mask/blk, extra): HSTU (op "hstu") masks are "window" (causal),
# "func" (3 endpoint rows) or "rab" (causal with a (B, 1, N, N) fp32 bias: the shared d rab
# reductions); BSA (op "bsa") takes the sparse block size and whether block_sizes is given
CONFIGS = {
    "h128": ("hstu", 128, "bfloat16", "window", None),
    "h64f": ("hstu", 64, "float16", "func", None),
    "h256": ("hstu", 256, "bfloat16", "window", None),
    "h32": ("hstu", 32, "bfloat16", "func", None),
    "hrab": ("hstu", 128, "bfloat16", "rab", None),
    "b128": ("bsa", 128, "bfloat16", 64, True),
    "b64": ("bsa", 64, "float16", 128, False),
    "b256": ("bsa", 256, "bfloat16", 64, False),
    "b32": ("bsa", 32, "float16", 128, True),
}
#: the representative subsets lowered in CI (tests/test_lowering_arch.py says which arch runs
#: which): "all9" every configuration above, "all7" all but D = 32 (whose portable kernels
#: are the D = 64 ones with other tile counts; sm_90a lowers them in tests/test_lowering_*), "core" one per kernel and the d rab path,
#: "bw" D = 128 and 256 of both ops, "small" / "hopper" one configuration per op, "lim99"
#: the configurations whose tiles or support change at 99 KiB (HSTU / BSA D = 128 backward
#: tiles, the D = 256 backwards that do not fit)
SUBSETS = {
    "all9": tuple(CONFIGS),
    "all7": tuple(k for k in CONFIGS if k not in ("h32", "b32")),
    "core": ("h128", "hrab", "b128", "b64"),
    "bw": ("h128", "h256", "b64", "b256"),
    "small": ("h128", "b64"),
    "lim99": ("h128", "hrab", "h256", "b128", "b256"),
    "hopper": ("h128", "b128"),
}
if SUBSET == "full":
    for dt in ("bfloat16", "float16"):
        for d in (32, 64, 128, 256):
            for mask in ("window", "func"):
                CONFIGS[f"h{d}-{dt}-{mask}"] = ("hstu", d, dt, mask, None)
    for i, (d, blk) in enumerate((d, b) for d in (32, 64, 128, 256) for b in (64, 128)):
        CONFIGS[f"b{d}-{blk}-{i}"] = ("bsa", d, ("bfloat16", "float16")[i % 2], blk, bool(i % 2))
    SUBSETS["full"] = tuple(k for k in CONFIGS if "-" in k)


def _switches():
    kw = dict(a.split("=", 1) for a in sys.argv[3:])
    if "smem_limit_kb" in kw:
        kw["smem_limit_kb"] = int(kw["smem_limit_kb"])
    return Switches(**kw)


SW = _switches()


def _lower(fn, *args):
    return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


def _hstu(d, dtype, mask):
    dt = jnp.dtype(dtype)
    q = jax.ShapeDtypeStruct((T, 2, d), dt)
    cu = jax.ShapeDtypeStruct((B + 1,), jnp.int32)
    func = jax.ShapeDtypeStruct((1, 3, T + 256), jnp.int32) if mask == "func" else None
    rab = jax.ShapeDtypeStruct((B, 1, 200, 200), jnp.float32) if mask == "rab" else None
    window = (-1, -1) if mask == "func" else (-1, 0)

    def f(q, k, v, cu, func, rab):
        def fwd(q, k, v, rab):
            return jsa.hstu_attention(q, k, v, cu, cu, max_seqlen_q=200, max_seqlen_k=200,
                                      window_size=window, alpha=0.3, func=func, rab=rab,
                                      backend="kernel", switches=SW)
        if rab is None:
            out, vjp = jax.vjp(lambda q, k, v: fwd(q, k, v, None), q, k, v)
        else:
            out, vjp = jax.vjp(fwd, q, k, v, rab)
        return out, vjp(out)

    txt = _lower(f, q, q, q, cu, func, rab)
    keys = (ffi_hstu.fwd_config(dtype, d, d, 3 if mask == "func" else 0, SW,
                                has_rab=mask == "rab", rab_dtype="float32"),
            ffi_hstu.bwd_config(dtype, d, d, 3 if mask == "func" else 0, SW,
                                has_rab=mask == "rab", rab_dtype="float32"))
    return txt, keys


def _bsa(d, dtype, blk, sizes):
    dt = jnp.dtype(dtype)
    sq, skv, kmax = 1000, 1025, 5
    nq, nkv = -(-sq // blk), -(-skv // blk)
    q = jax.ShapeDtypeStruct((2, 4, sq, d), dt)
    k = jax.ShapeDtypeStruct((2, 2, skv, d), dt)
    idx = jax.ShapeDtypeStruct((2, 4, nq, kmax), jnp.int32)
    nums = jax.ShapeDtypeStruct((2, 4, nq), jnp.int32)
    bs = jax.ShapeDtypeStruct((2, 4, nkv), jnp.int32) if sizes else None

    def f(q, k, v, i, n, s):
        def fwd(q, k, v):
            return jsa.block_sparse_attention(q, k, v, i, None, s, n, sparse_block_size=blk,
                                              softmax_scale=0.3, backend="kernel",
                                              switches=SW)
        out, vjp = jax.vjp(fwd, q, k, v)
        return out, vjp(out)

    txt = _lower(f, q, k, k, idx, nums, bs)
    keys = (ffi_bsa.fwd_config(dtype, d, blk, sizes, SW), ffi_bsa.bwd_config(dtype, d, blk, sizes, SW))
    return txt, keys


def _key(k):
    return {f: getattr(k, f) for f in ("impl", "arch", "block_m", "block_n", "num_warps",
                                       "vec_red", "q_stages", "head_dim", "block_size")
            if hasattr(k, f)}


def main():
    results = []
    for name in SUBSETS[SUBSET]:
        op, d, dtype, mask, extra = CONFIGS[name]
        _LAUNCHES.clear()
        res = dict(name=name, op=op, head_dim=d, dtype=dtype, mask=mask, ok=False)
        try:
            txt, keys = _hstu(d, dtype, mask) if op == "hstu" else _bsa(d, dtype, mask, extra)
            # attention calls: CuTe DSL calls other than the HSTU tile-schedule kernel's
            calls = sum(SCHEDULE not in seg and not any(n in seg for n in DQ_TILES)
                        for seg in txt.split(CALL_TARGET)[1:])
            res.update(ok=True, calls=calls, schedule=SCHEDULE in txt, elf="\\7FELF" in txt,
                       keys=[_key(k) for k in keys])
        except Exception as e:  # noqa: BLE001 - reported to the test
            res["error"] = f"{type(e).__name__}: {e}"[:2000]
        res["smem"] = [list(x) for x in _LAUNCHES]
        results.append(res)
        jax.clear_caches()
    print(json.dumps(dict(arch=ARCH, limit=_platform.smem_limit(ARCH, SW),
                          family=_platform.kernel_family(SW), results=results)))


if __name__ == "__main__":
    main()
