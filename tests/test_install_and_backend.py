"""Install metadata (GPU extra, CPU-only base) and the visible backend choice
(:func:`jax_sparse_attn.which_backend`, :func:`kernel_status`, the one-time warning)."""

from __future__ import annotations

import pathlib
import warnings

import jax.numpy as jnp
import pytest

import jax_sparse_attn as jsa
from jax_sparse_attn import _backend, _platform

ROOT = pathlib.Path(__file__).resolve().parents[1]
tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
Requirement = pytest.importorskip("packaging.requirements").Requirement


def _project():
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _reqs(lines):
    return {Requirement(x).name: Requirement(x) for x in lines}


def test_cuda13_extra_requests_cutedsl_cu13_libraries():
    extras = _project()["optional-dependencies"]
    cuda13 = _reqs(extras["cuda13"])
    assert "cuda13" in cuda13["jax"].extras
    assert "nvidia-cutlass-dsl" in cuda13, "the GPU extra must bring the kernels' DSL"
    assert "cu13" in cuda13["nvidia-cutlass-dsl"].extras


def test_cpu_install_does_not_need_the_dsl_but_tests_do():
    base = _reqs(_project()["dependencies"])
    assert "nvidia-cutlass-dsl" not in base
    assert {"jax", "numpy"} <= set(base)
    # CI lowers every kernel on CPU: the test extra carries the DSL
    assert "nvidia-cutlass-dsl" in _reqs(_project()["optional-dependencies"]["test"])


def test_ci_installs_the_test_extra():
    ci = (ROOT / ".ci" / "run").read_text()
    assert ".[test" in ci or ",test" in ci


def _hstu_args(dtype=jnp.bfloat16):
    q = jnp.zeros((4, 1, 64), dtype)
    cu = jnp.array([0, 4], jnp.int32)
    return (q, q, q, cu, cu), dict(max_seqlen_q=4, max_seqlen_k=4)


def test_which_backend_reports_reference_and_reason_on_cpu(monkeypatch):
    monkeypatch.delenv("JAX_SPARSE_ATTN_FORCE_KERNEL", raising=False)
    args, kw = _hstu_args()
    c = jsa.which_backend(jsa.hstu_attention, *args, **kw)
    assert (c.op, c.backend) == ("hstu_attention", "reference")
    assert "cpu" in c.reason or "CuTe DSL" in c.reason
    c = jsa.which_backend(jsa.hstu_attention, *args, backend="reference", **kw)
    assert c.backend == "reference" and "requested" in c.reason
    q = jnp.zeros((1, 2, 128, 64), jnp.bfloat16)
    idx = jnp.zeros((1, 2, 1, 1), jnp.int32)
    c = jsa.which_backend(jsa.block_sparse_attention_forward, q, q, q, idx, 1)
    assert (c.op, c.backend) == ("block_sparse_attention_forward", "reference")
    # the same validation as the call itself
    with pytest.raises(ValueError, match="backend"):
        jsa.which_backend(jsa.hstu_attention, *args, backend="gpu", **kw)
    with pytest.raises(TypeError, match="op must be a public jax_sparse_attn op"):
        jsa.which_backend(lambda: None)


def test_which_backend_of_the_backwards_checks_the_cotangents(monkeypatch):
    """which_backend of the ``_backward`` ops raises the call's errors for do / o / lse /
    dlse too (they are checked before the backend is chosen), and answers for good ones."""
    monkeypatch.delenv("JAX_SPARSE_ATTN_FORCE_KERNEL", raising=False)
    args, kw = _hstu_args()
    q = args[0]
    c = jsa.which_backend(jsa.hstu_attention_backward, q, *args, **kw)
    assert (c.op, c.backend) == ("hstu_attention_backward", "reference")
    with pytest.raises(ValueError, match="do must have the output's shape"):
        jsa.which_backend(jsa.hstu_attention_backward, q[:1], *args, **kw)
    with pytest.raises(TypeError, match="do dtype"):
        jsa.which_backend(jsa.hstu_attention_backward, q.astype(jnp.float16), *args, **kw)
    bq = jnp.zeros((1, 2, 128, 64), jnp.bfloat16)
    idx = jnp.zeros((1, 2, 1, 1), jnp.int32)
    lse = jnp.zeros((1, 2, 128), jnp.float32)
    c = jsa.which_backend(jsa.block_sparse_attention_backward, bq, bq, bq, bq, bq, lse, idx, 1)
    assert (c.op, c.backend) == ("block_sparse_attention_backward", "reference")
    with pytest.raises(ValueError, match="do must have the output's shape"):
        jsa.which_backend(jsa.block_sparse_attention_backward, bq[:, :1], bq, bq, bq, bq, lse,
                          idx, 1)
    with pytest.raises(TypeError, match="lse must be float32"):
        jsa.which_backend(jsa.block_sparse_attention_backward, bq, bq, bq, bq, bq,
                          lse.astype(jnp.bfloat16), idx, 1)
    with pytest.raises(ValueError, match="dlse must have lse's shape"):
        jsa.which_backend(jsa.block_sparse_attention_backward, bq, bq, bq, bq, bq, lse, idx, 1,
                          dlse=lse[:, :1])


def test_which_backend_kernel_when_forced_and_reason_for_unsupported_dtype(monkeypatch):
    pytest.importorskip("cutlass.jax")
    monkeypatch.setenv("JAX_SPARSE_ATTN_FORCE_KERNEL", "1")
    args, kw = _hstu_args()
    assert jsa.which_backend(jsa.hstu_attention, *args, **kw).backend == "kernel"
    args32, _ = _hstu_args(jnp.float32)
    c = jsa.which_backend(jsa.hstu_attention, *args32, **kw)
    assert c.backend == "reference" and "float32" in c.reason
    assert jsa.kernel_status().backend == "kernel"


def test_auto_on_unusable_gpu_warns_once_saying_why(monkeypatch):
    monkeypatch.delenv("JAX_SPARSE_ATTN_FORCE_KERNEL", raising=False)
    why = "the GPU has compute capability 8.0; the kernels are built for sm_90a"
    monkeypatch.setattr(_platform, "kernel_platform_unavailable_reason", lambda: why)
    monkeypatch.setattr(_platform, "default_platform", lambda: "gpu")
    monkeypatch.setattr(_backend, "_warned", set())
    args, kw = _hstu_args(jnp.float32)
    with pytest.warns(jsa.KernelUnavailableWarning, match="compute capability 8.0"):
        jsa.hstu_attention(*args, **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        jsa.hstu_attention(*args, **kw)  # second call: silent
        jsa.hstu_attention(*args, backend="reference", **kw)
    assert jsa.kernel_status().backend == "reference"
    assert why in jsa.kernel_status().reason


def test_no_warning_on_cpu(monkeypatch):
    monkeypatch.delenv("JAX_SPARSE_ATTN_FORCE_KERNEL", raising=False)
    monkeypatch.setattr(_backend, "_warned", set())
    args, kw = _hstu_args(jnp.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error", jsa.KernelUnavailableWarning)
        jsa.hstu_attention(*args, **kw)


def test_forced_kernel_on_cpu_says_it_cannot_run(monkeypatch):
    """JAX_SPARSE_ATTN_FORCE_KERNEL=1 without a GPU: kernel_status says the kernel path is
    for lowering only, and a call that reaches a kernel fails with a NotImplementedError
    naming the variable, not JAX's missing-translation-rule message."""
    if _platform._device_unavailable_reason() is None:
        pytest.skip("a GPU is the default device here")
    pytest.importorskip("cutlass")
    monkeypatch.setenv("JAX_SPARSE_ATTN_FORCE_KERNEL", "1")
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    status = jsa.kernel_status()
    assert status.backend == "kernel" and "calls cannot run here" in status.reason
    x = jnp.ones((64, 2, 64), jnp.bfloat16)
    cu = jnp.array([0, 64], jnp.int32)
    with pytest.raises(NotImplementedError, match="JAX_SPARSE_ATTN_FORCE_KERNEL=1") as e:
        jsa.hstu_attention(x, x, x, cu, cu, max_seqlen_q=64, max_seqlen_k=64)
    assert "MLIR translation rule" not in str(e.value)


def test_reference_warns_about_loose_max_seqlen():
    """The reference backend evaluates whole query tiles of each sequence against
    min(max_seqlen_k, T_k) key slots: a max_seqlen_k far looser than the packed lengths
    allow (over 8x the work they can need, and over 2**26 scores per head; here 5000
    sequences of 10 tokens under max_seqlen_k=2000) gives a UserWarning at trace time
    naming both bounds; tight bounds do not."""
    import jax  # noqa: PLC0415

    b, n = 5000, 10
    x = jnp.zeros((b * n, 2, 32), jnp.float32)
    cu = jnp.arange(0, b * n + 1, n, dtype=jnp.int32)

    def lower(mk):
        jax.jit(lambda x: jsa.hstu_attention(x, x, x, cu, cu, max_seqlen_q=n, max_seqlen_k=mk,
                                             scaling_seqlen=100)).lower(x)

    with pytest.warns(UserWarning, match=r"max_seqlen_q=10, max_seqlen_k=2000.*tighter"):
        lower(2000)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lower(n)
