"""Backend selection shared by the public ops (rules in docs/design.md)."""

from __future__ import annotations

import dataclasses
import importlib
import threading
import warnings

from . import _platform, config

__all__ = ["BACKENDS", "BackendChoice", "KernelUnavailableWarning", "check_backend",
           "check_switches", "kernel_status", "load_ffi", "select", "which_backend"]

BACKENDS = ("auto", "kernel", "reference")


def check_backend(backend) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    return backend


def check_switches(switches):
    """``switches`` (a :class:`~jax_sparse_attn.config.Switches` or None) resolved:
    None reads :func:`jax_sparse_attn.config.from_env`."""
    if switches is None:
        return config.from_env()
    if not isinstance(switches, config.Switches):
        raise TypeError("switches must be a jax_sparse_attn.config.Switches or None, got "
                        f"{type(switches).__name__}")
    return switches


def load_ffi(op: str):
    """Import ``jax_sparse_attn.ffi.<op>`` lazily; returns ``(module, None)`` or ``(None, reason)``."""
    try:
        return importlib.import_module(f"jax_sparse_attn.ffi.{op}"), None
    except ImportError as e:
        return None, f"the kernel backend module jax_sparse_attn.ffi.{op} is not importable ({e})"


class KernelUnavailableWarning(UserWarning):
    """``backend="auto"`` runs the reference on a CUDA GPU where the kernels cannot run."""


@dataclasses.dataclass(frozen=True)
class BackendChoice:
    """Which backend a call runs on (``"kernel"`` or ``"reference"``) and why."""

    op: str
    backend: str
    reason: str

    def __str__(self):
        return f"{self.op}: {self.backend} ({self.reason})"


class _Resolved(Exception):  # noqa: N818 (control flow of which_backend, never escapes)
    def __init__(self, choice):
        super().__init__(choice)
        self.choice = choice


_recording = threading.local()
_warned = set()


def _warn_once_on_gpu(reason: str):
    """One KernelUnavailableWarning per reason when the default JAX device is a CUDA GPU
    but the kernel platform is unavailable (wrong GPU, CuTe DSL missing...)."""
    if reason in _warned or _platform.default_platform() != "gpu":
        return
    _warned.add(reason)
    warnings.warn(
        f"jax_sparse_attn: backend='auto' runs the pure-JAX reference on this GPU (much "
        f"slower than the kernels) because {reason}. Pass backend='reference' to silence "
        f"this, see jax_sparse_attn.kernel_status().", KernelUnavailableWarning, stacklevel=4)


def _family_text(switches) -> str:
    """``"kernel family F for arch A (GPU)"`` of the current target."""
    arch = _platform.resolved_arch()
    family = _platform.kernel_family(switches, arch)
    what = ("Hopper kernels (wgmma/TMA) where the op has them, mma.sync elsewhere"
            if family == "sm90" else "mma.sync sm80 kernels")
    return f"kernel family {family!r} ({what}) for {arch}, {_platform.gpu_name()}"


def select(backend: str, op_name: str, op: str, unsupported_reason, switches=None):
    """Resolve ``backend``: the ffi module ``jax_sparse_attn.ffi.<op>`` when the kernel
    backend runs the call, else None (the reference).

    ``switches`` (the call's :class:`~jax_sparse_attn.config.Switches`) name the kernel
    family in the recorded reason. ``unsupported_reason(module)`` returns None when the
    kernel applies to this call,
    else a string. ``"kernel"`` raises NotImplementedError with the reason when the
    kernel cannot be used; ``"auto"`` falls back to the reference. ``backend`` has been
    checked with :func:`check_backend` by the caller (first, so that a typo fails before
    the eager metadata checks).
    """
    recording = getattr(_recording, "active", False)
    if backend == "reference":
        if recording:
            raise _Resolved(BackendChoice(op_name, "reference", "backend='reference' was requested"))
        return None
    mod = None
    platform_reason = reason = _platform.kernel_platform_unavailable_reason()
    if reason is None:
        mod, reason = load_ffi(op)
        if reason is None:
            reason = unsupported_reason(mod)
    if reason is None:
        if recording:
            raise _Resolved(BackendChoice(
                op_name, "kernel", f"backend={backend!r} and the CuTe DSL kernels support this "
                f"call on this device: {_family_text(switches)}"))
        return mod
    if backend == "kernel":
        raise NotImplementedError(f"{op_name}(backend='kernel') is not available: {reason}")
    if recording:
        raise _Resolved(BackendChoice(op_name, "reference", f"backend='auto': {reason}"))
    if platform_reason is not None:
        _warn_once_on_gpu(platform_reason)
    return None


#: the public ops :func:`which_backend` takes by name
PUBLIC_OPS = ("hstu_attention", "hstu_attention_forward", "hstu_attention_backward",
              "block_sparse_attention", "block_sparse_attention_forward",
              "block_sparse_attention_backward")


def which_backend(op, *args, **kwargs) -> BackendChoice:
    """Which backend ``op(*args, **kwargs)`` would run on, and why, without running it.

    ``op`` is one of the public ops (:func:`~jax_sparse_attn.hstu_attention`,
    :func:`~jax_sparse_attn.block_sparse_attention`, their ``_forward`` / ``_backward``),
    the function or its name (``"hstu_attention"``); the arguments are those of the call
    (validated the same way, so the same errors are raised, e.g. NotImplementedError for
    ``backend="kernel"`` where the kernels cannot run). Returns a :class:`BackendChoice`
    ``(op, backend, reason)``, ``backend`` being ``"kernel"`` or ``"reference"``.

    Raises:
      TypeError: ``op`` is neither a public op nor the name of one (any other callable is
        rejected before it runs).
    """
    package = importlib.import_module("jax_sparse_attn")
    if isinstance(op, str):
        name = op if op in PUBLIC_OPS else None
    else:
        name = next((n for n in PUBLIC_OPS if getattr(package, n) is op), None)
    if name is None:
        got = repr(op) if isinstance(op, str) else getattr(op, "__name__", type(op).__name__)
        raise TypeError(f"which_backend: op must be a public jax_sparse_attn op or its name, "
                        f"one of {PUBLIC_OPS}; got {got}")
    _recording.active = True
    try:
        getattr(package, name)(*args, **kwargs)
    except _Resolved as r:
        return dataclasses.replace(r.choice, op=name)
    finally:
        _recording.active = False
    raise RuntimeError(f"which_backend: {name} made no backend choice")  # pragma: no cover


def kernel_status() -> BackendChoice:
    """Whether the CuTe DSL kernel backend can run on this machine's default JAX device:
    ``BackendChoice("kernels", "kernel" | "reference", reason)``; the reason names the
    kernel family, the target arch and the GPU (``JAX_SPARSE_ATTN_KERNEL_FAMILY`` read from
    the environment). A one-line check that
    the kernel path is live: ``python -c "import jax_sparse_attn as j; print(j.kernel_status())"``.
    """
    reason = _platform.kernel_platform_unavailable_reason()
    if reason is None:
        for op in ("hstu", "bsa"):
            _, reason = load_ffi(op)
            if reason is not None:
                break
    if (reason is None and _platform.force_kernel()
            and _platform._device_unavailable_reason() is not None):
        return BackendChoice("kernels", "kernel", "JAX_SPARSE_ATTN_FORCE_KERNEL=1: the ops take "
                             "the kernel path so that it can be lowered for "
                             "lowering_platforms=('cuda',) on this machine; calls cannot run "
                             "here (no NVIDIA GPU is the default JAX device): "
                             f"{_family_text(config.from_env())}")
    if reason is None:
        return BackendChoice("kernels", "kernel", "the CuTe DSL kernels can run on this device "
                             "(backend='auto' uses them for the calls they support): "
                             f"{_family_text(config.from_env())}")
    return BackendChoice("kernels", "reference", f"kernels unavailable: {reason}")
