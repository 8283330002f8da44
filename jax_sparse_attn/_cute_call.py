"""A shape-independent ``cutlass_call``: one CuTe DSL compile per static configuration.

``cutlass.jax.cutlass_call`` (nvidia-cutlass-dsl 4.8) compiles while lowering and caches
the object code under ``(compile_key, FunctionSpec, str(os.environ))``. The
``FunctionSpec`` holds every tensor's concrete shape, and the default ``TensorSpec``
adds a divisibility hint equal to each concrete extent, so each new total token count,
batch or sequence length is a cache miss and a full compile (about 2 s per kernel), and
so is any change of any environment variable. Nothing in the kernel needs those
shapes: with ``static=False`` (the default) the kernels read every extent from the XLA
FFI buffer descriptors at run time; only the divisibility hints tie the object code to
the extents.

This module is the smallest layer that removes the shapes from the compile:

* every tensor gets an explicit divisibility hint: 1 (no assumption) for every dim except
  the last dim of tensors the caller names static (the head dims, already part of the
  kernel's compile key), so the generated code is valid for every extent;
* the compile sees a *canonical* ``FunctionSpec`` with those dynamic extents replaced by
  1, so one compile serves every shape of a static configuration; the lowered FFI call
  still carries the real shapes;
* the object code is cached in memory under ``(compile_key, canonical spec)`` (the
  environment is not part of the key: the compile keys hold the implementation
  switches) and, optionally, on disk across processes (:func:`cache_dir`).

It is its own JAX primitive (``jax_sparse_attn_cute_call``) lowered, on CUDA only, to the
same FFI call target and ABI as ``cutlass_call`` (``CuteDSLRT_NvJaxCutlassCall_v2``,
module bytes and fingerprint as attributes), so the lowered HLO, ``jax.export`` and
:func:`export_safety_checks` behave as with ``cutlass_call``. Compiles reuse
``cutlass.jax.compile.get_or_compile_kernel``; the FFI target is registered by
``cutlass.jax``.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import os
import pathlib
import threading
import time

import jax
import jax.extend
from jax._src import dispatch as _dispatch
from jax.interpreters import batching
from jax.interpreters import mlir

__all__ = ["cute_call", "call_builder", "compile_stats", "reset_compile_stats", "cache_dir",
           "export_safety_checks", "register_ffi_targets", "CACHE_DIR_ENV"]

logger = logging.getLogger(__name__)

#: environment variable naming the on-disk kernel cache directory ("0"/"off" disables it)
CACHE_DIR_ENV = "JAX_SPARSE_ATTN_CACHE_DIR"

_lock = threading.Lock()
_MEMORY: dict = {}
_STATS = {"compiles": 0, "memory_hits": 0, "disk_hits": 0, "disk_writes": 0,
          "compile_seconds": 0.0, "lowerings": 0, "lower_seconds": 0.0}


def compile_stats() -> dict:
    """Counters of this process: ``compiles`` (CuTe DSL compiles run), ``memory_hits``,
    ``disk_hits``, ``disk_writes``, ``compile_seconds`` (wall time of the compiles),
    ``lowerings`` (kernel calls lowered into XLA modules) and ``lower_seconds`` (wall time
    of those lowerings, compiles and cache lookups included: this layer's share of a
    ``jit`` trace + lower)."""
    with _lock:
        return dict(_STATS)


def reset_compile_stats(clear_memory_cache: bool = False) -> None:
    """Zero the counters (and, with ``clear_memory_cache``, drop the in-memory kernels;
    JAX's own jit caches may still hold lowered calls)."""
    with _lock:
        for k in _STATS:
            _STATS[k] = 0.0 if k.endswith("_seconds") else 0
        if clear_memory_cache:
            _MEMORY.clear()


def cache_dir() -> pathlib.Path | None:
    """The on-disk kernel cache directory, or None when it is off.

    ``JAX_SPARSE_ATTN_CACHE_DIR`` (a path; ``0``/``off``/``false`` disables) wins; else,
    when JAX's persistent compilation cache is configured (``jax_compilation_cache_dir``),
    its subdirectory ``jax_sparse_attn_cute``; else off. The cache is also bypassed while
    ``CUTE_DSL_KEEP*`` / ``CUTE_DSL_DUMP_DIR`` ask the DSL to keep intermediate files (a
    disk hit would skip the compile that writes them).
    """
    if any(k.startswith("CUTE_DSL_KEEP") or k == "CUTE_DSL_DUMP_DIR" for k in os.environ):
        return None
    env = os.environ.get(CACHE_DIR_ENV)
    if env is not None:
        if env.strip().lower() in ("", "0", "off", "false", "no"):
            return None
        return pathlib.Path(env).expanduser()
    jax_dir = jax.config.jax_compilation_cache_dir
    if jax_dir:
        return pathlib.Path(jax_dir).expanduser() / "jax_sparse_attn_cute"
    return None


@functools.cache
def _sources_digest() -> str:
    """sha256 over the kernel and adapter sources (a kernel edit invalidates the disk cache)."""
    root = pathlib.Path(__file__).parent
    h = hashlib.sha256()
    for p in sorted([*root.glob("kernels/*.py"), *root.glob("ffi/*.py"), root / "_cute_call.py"]):
        h.update(p.name.encode())
        h.update(p.read_bytes())
    return h.hexdigest()


def _versions() -> str:
    import cutlass  # noqa: PLC0415

    try:
        from importlib.metadata import version  # noqa: PLC0415

        dsl = version("nvidia-cutlass-dsl")
    except Exception:  # pragma: no cover
        dsl = getattr(cutlass, "__version__", "?")
    return f"cutlass-dsl={dsl};jax={jax.__version__}"


def _arch() -> str:
    arch = os.environ.get("CUTE_DSL_ARCH")
    if arch:
        return arch
    try:
        dev = jax.devices()[0]
        return f"{dev.platform}:{getattr(dev, 'compute_capability', '?')}"
    except Exception:  # pragma: no cover
        return "?"


def _disk_key(compile_key, spec) -> str:
    env = sorted((k, v) for k, v in os.environ.items() if k.startswith("CUTE_DSL_"))
    text = repr((compile_key, spec, _versions(), _sources_digest(), _arch(), env))
    return hashlib.sha256(text.encode()).hexdigest()


def _get_kernel(fn, spec, compile_key):
    """The compiled kernel (``cutlass.jax.compile.CompileResult``) for a canonical spec."""
    from cutlass.jax import compile as cjc  # noqa: PLC0415

    mem_key = (compile_key, spec)
    with _lock:
        hit = _MEMORY.get(mem_key)
        if hit is not None:
            _STATS["memory_hits"] += 1
            return hit
    directory = cache_dir()
    path = None
    if directory is not None:
        path = directory / f"{_disk_key(compile_key, spec)}.o"
        try:
            module = path.read_bytes()
        except OSError:
            module = None
        if module:
            result = cjc.CompileResult(module=module, fingerprint=hashlib.sha256(module).digest(),
                                       spec=spec)
            with _lock:
                _MEMORY[mem_key] = result
                _STATS["disk_hits"] += 1
            return result
    start = time.perf_counter()
    result = cjc.get_or_compile_kernel(fn, spec, compile_key=compile_key)
    with _lock:
        _MEMORY[mem_key] = result
        _STATS["compiles"] += 1
        _STATS["compile_seconds"] += time.perf_counter() - start
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            tmp.write_bytes(result.module)
            os.replace(tmp, path)  # atomic: concurrent processes never read a partial file
            with _lock:
                _STATS["disk_writes"] += 1
        except OSError as e:  # pragma: no cover - a read-only cache is not an error
            logger.warning("jax_sparse_attn: cannot write the kernel cache %s: %s", path, e)
    return result


# ------------------------------------------------------------------------------ primitive

_cute_call_p = jax.extend.core.Primitive("jax_sparse_attn_cute_call")
_cute_call_p.multiple_results = True


@dataclasses.dataclass(frozen=True)
class _Target:
    """The kernel entry point with a hashable identity (its compile key) for JAX's caches."""

    fn: object = dataclasses.field(compare=False, hash=False, repr=False)
    compile_key: object = None


@_cute_call_p.def_abstract_eval
def _abstract(*_, out_avals, **__):
    return [jax.core.ShapedArray(s.shape, s.dtype) for s in out_avals]


def _impl(*args, target, spec, out_avals, ffi_target):
    from cutlass.jax.types import cutlass_to_jax_layout_order  # noqa: PLC0415

    kernel = _get_kernel(target.fn, spec, target.compile_key)
    call = jax.ffi.ffi_call(
        ffi_target,
        result_shape_dtypes=out_avals,
        input_output_aliases=dict(spec.input_output_aliases),
        input_layouts=[cutlass_to_jax_layout_order(s.layout) for s in spec.input_spec],
        output_layouts=[cutlass_to_jax_layout_order(s.layout) for s in spec.output_spec],
    )
    return call(*args, module=kernel.module, key=kernel.fingerprint)


def _no_batching(*_, **__):
    raise NotImplementedError(
        "jax_sparse_attn_cute_call has no batching rule: the public ops batch through "
        "jax.custom_batching.custom_vmap before reaching it")


batching.primitive_batchers[_cute_call_p] = _no_batching
_lower_impl = mlir.lower_fun(_impl, multiple_results=True)


def _lowering(ctx, *args, **params):
    start = time.perf_counter()
    try:
        return _lower_impl(ctx, *args, **params)
    finally:
        with _lock:
            _STATS["lowerings"] += 1
            _STATS["lower_seconds"] += time.perf_counter() - start


mlir.register_lowering(_cute_call_p, _lowering, platform="cuda")


def _no_gpu_lowering(ctx, *args, **params):
    raise NotImplementedError(
        "jax_sparse_attn: a CuTe DSL kernel call is being compiled for a CPU device; the "
        "kernels run on NVIDIA GPUs only. JAX_SPARSE_ATTN_FORCE_KERNEL=1 (or "
        "backend='kernel' with it) only lets a machine without a GPU lower the kernel path "
        "for lowering_platforms=('cuda',); unset it (or use backend='reference') to run "
        "the ops here")


mlir.register_lowering(_cute_call_p, _no_gpu_lowering, platform="cpu")
_dispatch.simple_impl(_cute_call_p)  # eager binds run through a jitted call
# as for cutlass_call: the compile may look at the device (target architecture)
_dispatch.prim_requires_devices_during_lowering.add(_cute_call_p)


def _canonical(tensors, specs, static_last):
    """TensorSpecs with explicit divisibility (last dim kept where static, else 1) and the
    canonical shapes the compile sees (dynamic extents replaced by 1)."""
    from cutlass.jax import TensorSpec  # noqa: PLC0415
    from cutlass.jax.types import row_major_layout  # noqa: PLC0415

    out_specs, shapes = [], []
    for t, s, keep in zip(tensors, specs, static_last):
        nd = len(t.shape)
        s = TensorSpec() if s is None else s
        order = s.layout if s.layout is not None else row_major_layout(t.shape)
        div = [1] * nd
        shape = [1] * nd
        if keep and nd:
            last = order.index(0)  # the stride-1 dim
            div[last] = int(t.shape[last])
            shape[last] = int(t.shape[last])
        out_specs.append(dataclasses.replace(s, layout=tuple(order), divisibility=tuple(div)))
        shapes.append(tuple(shape))
    return out_specs, shapes


def cute_call(fn, *, output_shape_dtype, compile_key, input_spec=None, output_spec=None,
              input_output_aliases=None, static_last_inputs=(), static_last_outputs=(),
              allow_cuda_graph=True, **kwargs):
    """Like ``cutlass.jax.cutlass_call(fn, ...)`` (same ``fn`` signature ``(stream, *inputs,
    *outputs, **kwargs)`` and spec arguments) but compiled once per ``compile_key`` and
    static extents, for every shape.

    ``compile_key`` (hashable, required) must identify the kernel body and every
    compile-time option; ``kwargs`` are forwarded to ``fn`` as compile-time constants.
    ``static_last_inputs`` / ``static_last_outputs``: positions (in the flattened tensors,
    ``None`` inputs skipped) whose last dim is fixed by ``compile_key`` (head dims); the
    kernel may assume their extents, every other extent is a runtime value.
    Returns a callable of the input arrays (a tuple of outputs when
    ``output_shape_dtype`` is a sequence).
    """
    from cutlass.jax.compile import (  # noqa: PLC0415
        _normalize_input_output_aliases,
        build_function_spec,
    )
    from cutlass.jax.ffi import _register_and_get_default_ffi_call_target  # noqa: PLC0415
    from cutlass.jax.primitive import _resolve_input_spec_flat, _resolve_spec_flat  # noqa: PLC0415

    if compile_key is None:
        raise TypeError("cute_call needs a hashable compile_key")
    aliases = _normalize_input_output_aliases(input_output_aliases)
    ffi_target = _register_and_get_default_ffi_call_target(allow_cuda_graph)
    multiple = isinstance(output_shape_dtype, (tuple, list))
    outs = tuple(output_shape_dtype) if multiple else (output_shape_dtype,)
    outs = tuple(jax.ShapeDtypeStruct(o.shape, o.dtype) for o in outs)
    target = _Target(fn, compile_key)

    def call(*args):
        args_flat, args_tree = jax.tree.flatten(args)
        out_flat, out_tree = jax.tree.flatten(outs)
        in_specs = _resolve_input_spec_flat(input_spec, args, args_flat)
        out_specs = _resolve_spec_flat(output_spec, out_flat)
        in_specs, in_shapes = _canonical(
            args_flat, in_specs, [i in static_last_inputs for i in range(len(args_flat))])
        out_specs, out_shapes = _canonical(
            out_flat, out_specs, [i in static_last_outputs for i in range(len(out_flat))])
        spec = build_function_spec(args_flat, args_tree, out_flat, out_tree, tuple(in_specs),
                                   tuple(out_specs), dict(aliases), None, False, kwargs)
        spec = dataclasses.replace(
            spec,
            in_args=tuple(dataclasses.replace(a, shape=s) for a, s in zip(spec.in_args, in_shapes)),
            out_args=tuple(dataclasses.replace(a, shape=s)
                           for a, s in zip(spec.out_args, out_shapes)))
        res = _cute_call_p.bind(*args_flat, target=target, spec=spec,
                                out_avals=tuple(out_flat), ffi_target=ffi_target)
        res = jax.tree.unflatten(out_tree, res)
        return tuple(res) if multiple else res[0]

    return call


def _per_shape_call(fn, *, static_last_inputs=(), static_last_outputs=(), **kwargs):
    """``cutlass.jax.cutlass_call(fn, **kwargs)`` (one compile per shape, default specs);
    the static-extent positions only matter to :func:`cute_call`."""
    from cutlass.jax import cutlass_call  # noqa: PLC0415

    del static_last_inputs, static_last_outputs
    return cutlass_call(fn, **kwargs)


def call_builder(mode: str):
    """The call builder of the ``cute_call`` switch (:class:`jax_sparse_attn.config.Switches`,
    ``JAX_SPARSE_ATTN_CUTE_CALL``): ``"shared"`` -> :func:`cute_call`; ``"per_shape"`` ->
    plain ``cutlass.jax.cutlass_call`` (same arguments; ``static_last_*`` ignored)."""
    if mode == "shared":
        return cute_call
    if mode == "per_shape":
        return _per_shape_call
    raise ValueError(f"cute_call mode must be 'shared' or 'per_shape', got {mode!r}")


def export_safety_checks() -> tuple:
    """The ``disabled_checks`` that ``jax.export.export`` needs for functions calling the
    ops on the kernel backend (the CuTe DSL FFI call targets are not on JAX's list of
    custom calls with stable ABIs): ``jax.export.export(jax.jit(f), platforms=["cuda"],
    disabled_checks=jax_sparse_attn.export_safety_checks())``. Empty when CuTe DSL is not
    installed (the reference backend needs no exception).

    A process that only deserializes and calls an exported function must register the
    CuTe DSL FFI targets first: :func:`register_ffi_targets`."""
    try:
        from cutlass.jax import get_export_disabled_safety_checks  # noqa: PLC0415
    except Exception:
        return ()
    return tuple(get_export_disabled_safety_checks())


def register_ffi_targets() -> None:
    """Register the CuTe DSL FFI call targets with XLA (``cutlass.jax.register_ffi()``).

    Calling an op registers them; a process that only runs a deserialized
    ``jax.export.Exported`` (the kernels travel inside it) must call this first. Raises
    ImportError when CuTe DSL is not installed."""
    from cutlass.jax import register_ffi  # noqa: PLC0415

    register_ffi()
