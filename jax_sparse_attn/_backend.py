"""Backend selection shared by the public ops (rules in docs/design.md)."""

from __future__ import annotations

import importlib

from . import _platform, config

__all__ = ["BACKENDS", "check_backend", "check_switches", "load_ffi", "select"]

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


def select(backend: str, op_name: str, op: str, unsupported_reason):
    """Resolve ``backend``: the ffi module ``jax_sparse_attn.ffi.<op>`` when the kernel
    backend runs the call, else None (the reference).

    ``unsupported_reason(module)`` returns None when the kernel applies to this call,
    else a string. ``"kernel"`` raises NotImplementedError with the reason when the
    kernel cannot be used; ``"auto"`` falls back to the reference. ``backend`` has been
    checked with :func:`check_backend` by the caller (first, so that a typo fails before
    the eager metadata checks).
    """
    if backend == "reference":
        return None
    mod = None
    reason = _platform.kernel_platform_unavailable_reason()
    if reason is None:
        mod, reason = load_ffi(op)
        if reason is None:
            reason = unsupported_reason(mod)
    if reason is None:
        return mod
    if backend == "kernel":
        raise NotImplementedError(f"{op_name}(backend='kernel') is not available: {reason}")
    return None
