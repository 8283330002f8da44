"""Backend selection helpers: is the CuTe DSL kernel path usable here, and for which GPU?

The kernel path needs (a) an NVIDIA GPU of a supported compute capability (:data:`ARCHS`:
8.0, 8.6, 8.9, 9.0, 10.0, 10.3, 12.0) as JAX's default device and (b) an importable
``cutlass.jax`` (NVIDIA CuTe DSL with its JAX extension). ``JAX_SPARSE_ATTN_FORCE_KERNEL=1``
skips the device check so that CPU machines can lower the kernel path for
``lowering_platforms=("cuda",)`` (CI does); the target is then ``CUTE_DSL_ARCH``.

The *target arch* (:func:`target_arch`) is the CuTe DSL arch name the kernels are compiled
for: ``CUTE_DSL_ARCH`` when set (CuTe DSL compiles for it), else the default GPU's compute
capability in CuTe DSL's spelling (``sm_80``, ``sm_86``, ``sm_89``, ``sm_90a``,
``sm_100a``, ``sm_103a``, ``sm_120a``). It decides the *kernel family* of a call
(:func:`kernel_family`): the Hopper kernels (wgmma, TMA; ``"sm90"``) only on ``sm_90a``, the
portable ``mma.sync`` kernels (``"portable"``, the ``sm80`` implementations) everywhere
else, and the shared memory per block the portable kernels' tiles must fit
(:func:`smem_limit`).
"""

from __future__ import annotations

import functools
import os

from . import config

__all__ = ["ARCHS", "kernel_platform_unavailable_reason", "kernel_platform_available",
           "force_kernel", "target_arch", "smem_limit", "kernel_family", "vec_red", "gpu_name"]

#: supported target archs (CuTe DSL names) -> (compute capability, GPUs, the most dynamic
#: shared memory one block may use in bytes: the CUDA programming guide's "maximum amount
#: of shared memory per thread block", i.e. the opt-in limit)
ARCHS = {
    "sm_80": ("8.0", "A100, A30", 163 * 1024),
    "sm_86": ("8.6", "A10, A40, RTX 30xx", 99 * 1024),
    "sm_89": ("8.9", "L4, L40S, RTX 40xx", 99 * 1024),
    "sm_90a": ("9.0", "H100, H200, GH200", 227 * 1024),
    "sm_100a": ("10.0", "B200, GB200", 227 * 1024),
    "sm_103a": ("10.3", "B300, GB300", 227 * 1024),
    "sm_120a": ("12.0", "RTX PRO 6000 Blackwell, RTX 50xx", 99 * 1024),
}
#: the arch of the Hopper kernel family (wgmma, TMA, setmaxnreg: sm_90a only)
SM90_ARCH = "sm_90a"


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


def arch_of_capability(cc: str) -> str:
    """CuTe DSL's arch name of a compute capability ``"M.m"`` (``"a"`` suffix from 9.0 on,
    as CuTe DSL's own device detection spells it)."""
    major, minor = (int(x) for x in str(cc).split("."))
    return f"sm_{major}{minor}{'a' if major >= 9 else ''}"


def _default_gpu():
    import jax  # noqa: PLC0415

    try:
        dev = jax.devices()[0]
    except Exception:  # pragma: no cover
        return None
    return dev if dev.platform == "gpu" else None


def gpu_name() -> str:
    """``"<device kind> (compute capability M.m)"`` of the default GPU, or a description of
    the target when there is none (CPU lowering)."""
    dev = _default_gpu()
    if dev is not None:
        return f"{getattr(dev, 'device_kind', 'GPU')} (compute capability " \
               f"{getattr(dev, 'compute_capability', '?')})"
    arch = os.environ.get("CUTE_DSL_ARCH", "")
    return f"target {arch} (CUTE_DSL_ARCH, no GPU)" if arch else "no GPU"


def target_arch() -> str | None:
    """The CuTe DSL arch the kernels compile for: ``CUTE_DSL_ARCH`` when set, else the
    default GPU's (None without a GPU)."""
    arch = os.environ.get("CUTE_DSL_ARCH", "")
    if arch:
        return arch
    dev = _default_gpu()
    cc = getattr(dev, "compute_capability", None) if dev is not None else None
    return arch_of_capability(cc) if cc else None


def _arch_unsupported_reason(arch: str | None, where: str) -> str | None:
    if arch is None:
        return "cannot read the GPU's compute capability"
    if arch not in ARCHS:
        ok = ", ".join(f"{cc} ({a})" for a, (cc, _, _) in ARCHS.items())
        digits = "".join(c for c in arch if c.isdigit())
        missing = ("it lacks what the kernels need (bf16 mma.sync, cp.async, ldmatrix: compute "
                   "capability 8.0 or later)" if digits and int(digits) < 80 else
                   "the kernels are not built or tested for it")
        return f"{where} is {arch}: {missing}; supported are compute capabilities {ok}"
    return None


@functools.lru_cache(maxsize=None)
def _device_unavailable_reason() -> str | None:
    import jax  # noqa: PLC0415

    try:
        dev = jax.devices()[0]
    except Exception as e:  # pragma: no cover
        return f"no JAX device: {e}"
    if dev.platform != "gpu":
        return (f"the default JAX device is {dev.platform!r}; the kernels need an NVIDIA GPU of "
                "compute capability 8.0, 8.6, 8.9, 9.0, 10.0, 10.3 or 12.0")
    cc = getattr(dev, "compute_capability", None)
    if cc is None:
        return f"cannot read the compute capability of the GPU {getattr(dev, 'device_kind', '')}"
    return _arch_unsupported_reason(target_arch(), f"the GPU {gpu_name()}: its target arch")


def default_platform() -> str | None:
    """The platform of JAX's default device (``"cpu"``, ``"gpu"``, ``"tpu"``), None if unknown."""
    import jax  # noqa: PLC0415

    try:
        return jax.devices()[0].platform
    except Exception:  # pragma: no cover
        return None


def kernel_platform_unavailable_reason() -> str | None:
    """``None`` when the kernel path can run (or be lowered) here, else why not."""
    reason = _cutedsl_unavailable_reason()
    if reason is not None:
        return reason
    if force_kernel():
        # CPU lowering: the target is CUTE_DSL_ARCH (sm_90a when unset: CuTe DSL's own
        # default without a GPU is sm_100a, but the package lowers for Hopper by default)
        return _arch_unsupported_reason(target_arch() or SM90_ARCH, "CUTE_DSL_ARCH")
    return _device_unavailable_reason()


def kernel_platform_available() -> bool:
    return kernel_platform_unavailable_reason() is None


def resolved_arch() -> str:
    """:func:`target_arch`, ``sm_90a`` when nothing names one (forced CPU lowering without
    ``CUTE_DSL_ARCH``)."""
    return target_arch() or SM90_ARCH


def smem_limit(arch: str | None = None, switches=None) -> int:
    """Bytes of shared memory one block may use on ``arch`` (default: the target), or the
    ``smem_limit_kb`` switch when it is set and smaller (testing a smaller arch's tiles)."""
    limit = ARCHS[arch or resolved_arch()][2]
    kb = getattr(switches, "smem_limit_kb", None)
    return min(limit, kb * 1024) if kb else limit


def kernel_family(switches=None, arch: str | None = None) -> str:
    """``"sm90"`` (Hopper kernels where the op has them) on sm_90a unless the
    ``kernel_family`` switch says ``"portable"`` / ``"portable_sm8x"``; ``"portable"`` (the
    mma.sync ``sm80`` kernels) on every other arch."""
    arch = arch or resolved_arch()
    if arch != SM90_ARCH or getattr(switches, "kernel_family", "auto") != "auto":
        return "portable"
    return "sm90"


def vec_red(switches=None, arch: str | None = None) -> bool:
    """Whether the portable kernels add fp32 pairs with ``red.global.add.v2.f32`` (PTX ISA:
    sm_90 and later) rather than two scalar ``red.global.add.f32`` (sm_8x, or the
    ``kernel_family="portable_sm8x"`` switch, which runs the sm_8x code path on any GPU)."""
    arch = arch or resolved_arch()
    return not arch.startswith("sm_8") and getattr(switches, "kernel_family", "") != "portable_sm8x"


def smem_limit_text(switches=None) -> str:
    """``"<GPU> gives N KiB"`` of :func:`smem_limit` (naming the switch when it set it)."""
    limit = smem_limit(switches=switches)
    why = (" (JAX_SPARSE_ATTN_SMEM_LIMIT_KB / Switches.smem_limit_kb)"
           if limit < ARCHS[resolved_arch()][2] else "")
    return f"{gpu_name()} gives {limit / 1024:g} KiB{why}"
