"""CPU (CI) lowering tests of the HSTU kernel path for sm_90a.

With ``CUTE_DSL_ARCH=sm_90a`` and ``JAX_SPARSE_ATTN_FORCE_KERNEL=1``,
``jax.jit(...).trace(...).lower(lowering_platforms=("cuda",))`` runs the full CuTe DSL
compile (MLIR -> PTX -> cubin) on a machine without a GPU. Every static configuration
the public API can select (dtype x padded head dim x mask kind x fwd/bwd) must lower and
the lowered module must contain the CuTe DSL custom call, i.e. the kernel (not an XLA
fallback) is what runs on the GPU.
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

pytestmark = pytest.mark.lowering

T = 300
B = 3


def _have_cutedsl():
    try:
        import cutlass.jax  # noqa: F401, PLC0415
    except Exception:  # pragma: no cover
        return False
    return True


@pytest.fixture(autouse=True)
def _force_kernel(monkeypatch):
    if not _have_cutedsl():
        pytest.skip("CuTe DSL not importable")
    monkeypatch.setenv("JAX_SPARSE_ATTN_FORCE_KERNEL", "1")
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")


def _lower(fn, *args):
    lowered = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",))
    return lowered.as_text()


def _target():
    from cutlass.jax.ffi import _register_and_get_default_ffi_call_target  # noqa: PLC0415

    try:
        return _register_and_get_default_ffi_call_target(True)
    except Exception:  # pragma: no cover - fall back to the stable prefix
        return "CuteDSLRT"


CONFIGS = [
    (dt, d, mask, direction)
    for dt in ("bfloat16", "float16")
    for d in (32, 64, 128, 256)
    for mask in ("window", "func")
    for direction in ("fwd", "bwd")
]


@pytest.mark.parametrize("dtype,head_dim,mask,direction", CONFIGS,
                         ids=["-".join(map(str, c)) for c in CONFIGS])
def test_hstu_kernel_lowers(dtype, head_dim, mask, direction):
    import jax_sparse_attn as jsa  # noqa: PLC0415

    dt = jnp.dtype(dtype)
    # D one below the supported dim for the smaller dims: exercises the zero-padding path
    d = head_dim - 8 if head_dim in (64, 256) else head_dim
    q = jax.ShapeDtypeStruct((T, 2, d), dt)
    v = jax.ShapeDtypeStruct((T, 2, d), dt)
    cu = jax.ShapeDtypeStruct((B + 1,), jnp.int32)
    func = jax.ShapeDtypeStruct((1, 3, T + 256), jnp.int32) if mask == "func" else None
    window = (-1, -1) if mask == "func" else (-1, 0)

    def fwd(q, k, v, cu, func):
        return jsa.hstu_attention(q, k, v, cu, cu, max_seqlen_q=200, max_seqlen_k=200,
                                  window_size=window, alpha=0.3, func=func, backend="kernel")

    if direction == "fwd":
        txt = _lower(fwd, q, q, v, cu, func)
    else:
        def loss(q, k, v, cu, func):
            return jnp.sum(fwd(q, k, v, cu, func).astype(jnp.float32))

        txt = _lower(jax.grad(loss, argnums=(0, 1, 2)), q, q, v, cu, func)
    target = _target()
    n_calls = txt.count(target)
    # forward: 1 kernel; grad of a sum: only the backward kernel (the forward's output is not
    # needed, so XLA drops that call)
    assert n_calls == 1, f"expected one {target} custom call in the lowering, got {n_calls}"
    assert "\\7FELF" in txt, "no embedded cubin in the lowered module"


def test_hstu_kernel_lowers_dv_ne_d_and_window_values():
    """D != D_v and different window values share one compiled configuration."""
    from jax_sparse_attn.ffi import hstu as fh  # noqa: PLC0415

    q = jax.ShapeDtypeStruct((T, 2, 64), jnp.bfloat16)
    v = jax.ShapeDtypeStruct((T, 2, 128), jnp.bfloat16)
    cu = jax.ShapeDtypeStruct((B + 1,), jnp.int32)
    texts = []
    for window in ((-1, 0), (63, 17)):
        def f(q, k, v, cu, window=window):
            return fh.hstu_fwd(q, k, v, cu, cu, None, max_seqlen_q=100, max_seqlen_k=100,
                               scaling_seqlen=100.0, window_size=window, alpha=1.0)

        texts.append(_lower(f, q, q, v, cu))
    assert all(_target() in t for t in texts)


# the warp-specialized forward's static variants: every head dim (D = 256 uses 64-key tiles, one
# Q stage and the O staging buffer inside Q's), D != D_v, fp16, func masks, and the ablation /
# tuning knobs of JAX_SPARSE_ATTN_HSTU_WS
# (the default-path test above already lowers sm90ws for every dtype x head dim x mask kind)
WS_LOWER = [("sm90ws", "", d, dv, fn, dt)
            for d, dv, fn, dt in ((256, 256, 7, "bfloat16"), (64, 128, 0, "bfloat16"))]
WS_LOWER += [("sm90ws", ws, 128, 128, 0, "bfloat16")
             for ws in ("nooverlap", "nopingpong", "q1", "silu16")]
WS_LOWER += [("sm90ws", "bn=80", 256, 256, 0, "float16"), ("sm80", "", 128, 128, 0, "bfloat16")]


def _fwd_text(head_dim, head_dim_v, func_n, dtype):
    from jax_sparse_attn.ffi import hstu as fh  # noqa: PLC0415

    q = jax.ShapeDtypeStruct((T, 2, head_dim), jnp.dtype(dtype))
    v = jax.ShapeDtypeStruct((T, 2, head_dim_v), jnp.dtype(dtype))
    cu = jax.ShapeDtypeStruct((B + 1,), jnp.int32)
    func = jax.ShapeDtypeStruct((1, func_n, T + 256), jnp.int32) if func_n else None
    window = (-1, -1) if func_n else (-1, 0)

    def f(q, k, v, cu, func):
        return fh.hstu_fwd(q, k, v, cu, cu, func, max_seqlen_q=100, max_seqlen_k=100,
                           scaling_seqlen=100.0, window_size=window, alpha=1.0)

    return _lower(f, q, q, v, cu, func)


@pytest.mark.parametrize("impl,ws,head_dim,head_dim_v,func_n,dtype", WS_LOWER,
                         ids=["-".join(map(str, c)).replace("=", "") for c in WS_LOWER])
def test_hstu_forward_impls_lower(monkeypatch, impl, ws, head_dim, head_dim_v, func_n, dtype):
    """The forwards (sm90ws with its knobs; the portable sm80) keep compiling for sm_90a."""
    monkeypatch.setenv("JAX_SPARSE_ATTN_HSTU_FWD_IMPL", impl)
    monkeypatch.setenv("JAX_SPARSE_ATTN_HSTU_WS", ws)
    txt = _fwd_text(head_dim, head_dim_v, func_n, dtype)
    assert _target() in txt and "\\7FELF" in txt


_PTX_SCRIPT = """
import sys
sys.path.insert(0, {root!r})
import tests.test_lowering_hstu as t
t._fwd_text({d}, {d}, {fn}, {dt!r})
"""


@pytest.mark.parametrize("head_dim,func_n,dtype", [(128, 0, "bfloat16"), (256, 3, "float16")])
def test_hstu_sm90ws_ptx_is_warp_specialized(tmp_path, head_dim, func_n, dtype):
    """The default forward's PTX (kept with CUTE_DSL_KEEP=ptx, in a fresh process so that the
    CuTe DSL reads the variables and compiles) has TMA loads, warpgroup MMAs and register
    reallocation between the producer and the consumer warpgroups."""
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, CUTE_DSL_ARCH="sm_90a", JAX_SPARSE_ATTN_FORCE_KERNEL="1",
               JAX_SPARSE_ATTN_HSTU_FWD_IMPL="sm90ws", JAX_SPARSE_ATTN_HSTU_WS="",
               CUTE_DSL_KEEP="ptx", CUTE_DSL_DUMP_DIR=str(tmp_path), JAX_PLATFORMS="cpu")
    script = _PTX_SCRIPT.format(root=root, d=head_dim, fn=func_n, dt=dtype)
    r = subprocess.run([sys.executable, "-c", script], env=env, cwd=root, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    ptx = [p for p in tmp_path.iterdir() if p.suffix == ".ptx"]
    assert len(ptx) == 1, [p.name for p in tmp_path.iterdir()]
    text = ptx[0].read_text()
    for needle in ("cp.async.bulk.tensor", "wgmma.mma_async", "setmaxnreg.dec",
                   "setmaxnreg.inc", "mbarrier.try_wait"):
        assert needle in text, f"{needle} missing from the sm90ws PTX"


def test_hstu_fwd_impl_env_rejects_unknown(monkeypatch):
    from jax_sparse_attn.ffi import hstu as fh  # noqa: PLC0415

    monkeypatch.setenv("JAX_SPARSE_ATTN_HSTU_FWD_IMPL", "sm99")
    with pytest.raises(ValueError, match="JAX_SPARSE_ATTN_HSTU_FWD_IMPL"):
        fh.fwd_config(jnp.bfloat16, 128, 128, False, 1)
