"""Result containers of the ``*_forward`` / ``*_backward`` functions.

Each result is a :class:`typing.NamedTuple` (hence a JAX pytree, returnable from
``jax.jit``) that also supports dict-style access by field name::

    res = hstu_attention_forward(...)
    out = res["o_tensor"]          # dict access
    (out,) = res                   # tuple unpacking
    dict(res)                      # {"o_tensor": out}
    "o_tensor" in res              # True: membership tests entry names, as for a dict

Membership takes a field name only: ``x in res`` with anything but a string is a
``TypeError`` (a tuple's ``in`` would compare ``x`` with the arrays, whose truth value is
ambiguous).
"""

from __future__ import annotations

from typing import Any, NamedTuple

__all__ = [
    "HSTUForwardResult",
    "HSTUBackwardResult",
    "HSTUBackwardRabResult",
    "BSAForwardResult",
    "BSABackwardResult",
]


class _DictAccess:
    """Mixin: ``res["name"]``, ``keys()``, ``values()``, ``items()``, ``"name" in res``."""

    __slots__ = ()

    def __getitem__(self, key: Any):
        if isinstance(key, str):
            if key not in self._fields:  # type: ignore[attr-defined]
                raise KeyError(
                    f"{type(self).__name__} has no entry {key!r}; "
                    f"entries: {', '.join(self._fields)}"  # type: ignore[attr-defined]
                )
            return getattr(self, key)
        return tuple.__getitem__(self, key)  # type: ignore[arg-type]

    def keys(self):
        return tuple(self._fields)  # type: ignore[attr-defined]

    def values(self):
        return tuple(self)  # type: ignore[arg-type]

    def items(self):
        return tuple(zip(self._fields, self))  # type: ignore[attr-defined,call-overload]

    def __contains__(self, key: Any) -> bool:
        """``"name" in res``: whether ``name`` is an entry (like ``res.keys()``). Other keys
        are a TypeError: comparing them with the entries (a tuple's ``in``) would take
        the truth value of array comparisons."""
        if isinstance(key, str):
            return key in self._fields  # type: ignore[attr-defined]
        raise TypeError(
            f"'in' tests the entry names of {type(self).__name__} ({', '.join(self._fields)}), "  # type: ignore[attr-defined]
            f"so the key must be a str, got {type(key).__name__}; to find an array among the "
            f"entries compare them yourself, e.g. any(x is e for e in res.values())")


class _HSTUForward(NamedTuple):
    o_tensor: Any


class _HSTUBackward(NamedTuple):
    dq_tensor: Any
    dk_tensor: Any
    dv_tensor: Any


class _HSTUBackwardRab(NamedTuple):
    dq_tensor: Any
    dk_tensor: Any
    dv_tensor: Any
    drab_tensor: Any


class _BSAForward(NamedTuple):
    o_tensor: Any
    lse_tensor: Any


class _BSABackward(NamedTuple):
    dq_tensor: Any
    dk_tensor: Any
    dv_tensor: Any


class HSTUForwardResult(_DictAccess, _HSTUForward):
    """``o_tensor``: ``(T_q, H, D_v)`` in q's dtype."""

    __slots__ = ()


class HSTUBackwardResult(_DictAccess, _HSTUBackward):
    """``dq_tensor (T_q, H, D)``, ``dk_tensor (T_k, H_kv, D)``, ``dv_tensor (T_k, H_kv, D_v)``
    in the input dtype."""

    __slots__ = ()


class HSTUBackwardRabResult(_DictAccess, _HSTUBackwardRab):
    """:class:`HSTUBackwardResult` plus ``drab_tensor (B, H_rab, max_seqlen_k, max_seqlen_k)``
    in rab's dtype (the gradient of the relative attention bias)."""

    __slots__ = ()


class BSAForwardResult(_DictAccess, _BSAForward):
    """``o_tensor`` in the input layout and q's dtype; ``lse_tensor (B, H_q, S_q)`` float32
    (float64 for float64 inputs), ``-inf`` for rows without keys."""

    __slots__ = ()


class BSABackwardResult(_DictAccess, _BSABackward):
    """``dq_tensor``, ``dk_tensor``, ``dv_tensor`` in the input layout and dtypes."""

    __slots__ = ()


def _register_export_serialization():
    """Register the result types with ``jax.export`` so that an exported function returning
    one can be serialized (``Exported.serialize``); older JAX without the hook: no-op."""
    try:
        from jax import export  # noqa: PLC0415

        register = export.register_namedtuple_serialization
    except (ImportError, AttributeError):
        return
    for cls in (HSTUForwardResult, HSTUBackwardResult, HSTUBackwardRabResult,
                BSAForwardResult, BSABackwardResult):
        try:
            register(cls, serialized_name=f"jax_sparse_attn.{cls.__name__}")
        except ValueError:  # already registered (a reloaded module)
            pass


_register_export_serialization()
