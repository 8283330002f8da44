"""Backend selection helpers: is the CuTe DSL kernel path usable here?

The kernel path needs (a) an NVIDIA GPU of compute capability 9.0 as JAX's default
device and (b) an importable ``cutlass.jax`` (NVIDIA CuTe DSL with its JAX
extension). ``JAX_SPARSE_ATTN_FORCE_KERNEL=1`` skips the device check so that CPU
machines can lower the kernel path for ``lowering_platforms=("cuda",)`` (CI does).
"""

from __future__ import annotations

import functools

from . import config

__all__ = ["kernel_platform_unavailable_reason", "kernel_platform_available", "force_kernel"]


def force_kernel() -> bool:
    """True when ``JAX_SPARSE_ATTN_FORCE_KERNEL`` is set to a true value (validated by
    :func:`jax_sparse_attn.config.force_kernel`)."""
    return config.force_kernel()


@functools.lru_cache(maxsize=None)
def _cutedsl_unavailable_reason() -> str | None:
    try:
        import cutlass.jax as cjax  # noqa: PLC0415
    except Exception as e:  # pragma: no cover - depends on the install
        return f"NVIDIA CuTe DSL (nvidia-cutlass-dsl) is not importable: {e}"
    if not cjax.is_available():
        return "cutlass.jax (the CuTe DSL JAX extension) is not available in this install"
    return None


@functools.lru_cache(maxsize=None)
def _device_unavailable_reason() -> str | None:
    import jax  # noqa: PLC0415

    try:
        dev = jax.devices()[0]
    except Exception as e:  # pragma: no cover
        return f"no JAX device: {e}"
    if dev.platform != "gpu":
        return f"the default JAX device is {dev.platform!r}; the kernels need an NVIDIA SM90 GPU"
    cc = getattr(dev, "compute_capability", None)
    if cc is None:
        return "cannot read the GPU's compute capability"
    if str(cc) not in ("9.0",):
        return f"the GPU has compute capability {cc}; the kernels are built for sm_90a (Hopper, 9.0)"
    return None


def kernel_platform_unavailable_reason() -> str | None:
    """``None`` when the kernel path can run (or be lowered) here, else why not."""
    reason = _cutedsl_unavailable_reason()
    if reason is not None:
        return reason
    if force_kernel():
        return None
    return _device_unavailable_reason()


def kernel_platform_available() -> bool:
    return kernel_platform_unavailable_reason() is None
