"""Shared pytest configuration: the ``gpu`` marker skips cleanly without a supported GPU
(the GPU tests are written for and run on the H200)."""

import pytest


def _gpu_skip_reason():
    try:
        from jax_sparse_attn._platform import _cutedsl_unavailable_reason, _device_unavailable_reason
    except Exception as e:  # pragma: no cover
        return f"package not importable: {e}"
    return _device_unavailable_reason() or _cutedsl_unavailable_reason()


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs an SM90 GPU and CuTe DSL (run on the H200)")
    config.addinivalue_line("markers", "lowering: compiles CuTe DSL kernels for sm_90a on CPU")
    config.addinivalue_line("markers", "slow: long-running")


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
