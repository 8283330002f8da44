"""Shared pytest configuration: the ``gpu`` marker skips cleanly without a supported GPU
(the GPU tests are written for and run on the H200); on a CPU-only setup XLA compiles the
tests' programs at LLVM optimization level 0. ``JAX_SPARSE_ATTN_GPU_TEST_TIMEOUT=seconds``
puts each ``gpu`` test under a watchdog that names a hanging test (``hang_guard.py``)."""

import importlib.util
import os

import pytest

import hang_guard

#: XLA flag of the CPU-only runs: the tests' XLA programs are small and run a few times, so
#: their compile time dominates, and LLVM's optimizations are most of it. XLA's HLO passes
#: run as at the default level; only the generated machine code is unoptimized
CPU_XLA_FLAG = "--xla_backend_optimization_level=0"


def _cpu_only():
    """JAX_PLATFORMS=cpu, or no PJRT plugin (CUDA, ROCm) installed: XLA runs on the CPU
    only. The GPU runs keep XLA's default optimization level."""
    if os.environ.get("JAX_PLATFORMS", "").strip().lower() == "cpu":
        return True
    return importlib.util.find_spec("jax_plugins") is None


# set before any test initializes an XLA backend; subprocesses that copy the environment
# inherit it
if _cpu_only() and "--xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + CPU_XLA_FLAG).strip()


def _gpu_skip_reason():
    try:
        from jax_sparse_attn._platform import _cutedsl_unavailable_reason, _device_unavailable_reason
    except Exception as e:  # pragma: no cover
        return f"package not importable: {e}"
    return _device_unavailable_reason() or _cutedsl_unavailable_reason()


def pytest_configure(config):
    try:
        hang_guard.timeout_seconds()
    except ValueError as e:
        raise pytest.UsageError(str(e)) from None
    config.addinivalue_line("markers", "gpu: needs an SM90 GPU and CuTe DSL (run on the H200)")
    config.addinivalue_line("markers", "lowering: compiles CuTe DSL kernels for sm_90a on CPU")
    config.addinivalue_line("markers", "slow: long-running")
    config.addinivalue_line("markers", "ablation: compiles or checks only opt-in ablation / "
                            "tuning variants of the switches (not run by default: -m ablation)")


def pytest_collection_modifyitems(config, items):
    if not any("gpu" in item.keywords for item in items):
        return
    reason = _gpu_skip_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"GPU test: {reason}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _gpu_hang_guard(request):
    """``gpu`` tests under ``JAX_SPARSE_ATTN_GPU_TEST_TIMEOUT``: see ``hang_guard``."""
    seconds = hang_guard.timeout_seconds() if "gpu" in request.node.keywords else 0.0
    if not seconds:
        yield
        return
    log = hang_guard.arm(request.node.nodeid, seconds)
    try:
        yield
    finally:
        hang_guard.disarm(log, request.node.nodeid)
