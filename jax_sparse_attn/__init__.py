"""jax_sparse_attn: HSTU attention and block-sparse attention for JAX.

Two attention ops with one API on every JAX backend: a CuTe DSL kernel backend on NVIDIA
GPUs of compute capability 8.0, 8.6, 8.9, 9.0, 10.0, 10.3 and 12.0 (the warp-specialized
kernels on Hopper, SM90; portable mma.sync kernels on the others) and a pure-JAX reference
everywhere else (CPU, TPU, other GPUs). Torch-free.

* :func:`hstu_attention` (+ ``_forward`` / ``_backward``): pointwise SiLU attention over
  packed variable-length sequences (HSTU, Zhai et al. 2024).
* :func:`block_sparse_attention` (+ ``_forward`` / ``_backward``): softmax attention over
  listed KV blocks per query block.
* :mod:`jax_sparse_attn.bias`: the HSTU relative attention bias (``rab``) from learned
  position / time-bucket tables; :mod:`jax_sparse_attn.masks`: mask / metadata builders; :mod:`jax_sparse_attn.reference`:
  the pure-JAX implementations; eager validators :func:`validate_hstu_inputs`,
  :func:`validate_bsa_metadata`.
"""

from . import bias, masks, reference
from ._backend import BackendChoice, KernelUnavailableWarning, kernel_status, which_backend
from ._cute_call import export_safety_checks, register_ffi_targets
from ._results import (
    BSABackwardResult,
    BSAForwardResult,
    HSTUBackwardRabResult,
    HSTUBackwardResult,
    HSTUForwardResult,
)
from .bsa import (
    block_sparse_attention,
    block_sparse_attention_backward,
    block_sparse_attention_forward,
)
from .hstu import hstu_attention, hstu_attention_backward, hstu_attention_forward
from .validation import validate_bsa_metadata, validate_hstu_inputs

__version__ = "0.1.0"

__all__ = [
    "hstu_attention",
    "hstu_attention_forward",
    "hstu_attention_backward",
    "block_sparse_attention",
    "block_sparse_attention_forward",
    "block_sparse_attention_backward",
    "validate_hstu_inputs",
    "validate_bsa_metadata",
    "export_safety_checks",
    "register_ffi_targets",
    "HSTUForwardResult",
    "HSTUBackwardResult",
    "HSTUBackwardRabResult",
    "BSAForwardResult",
    "BSABackwardResult",
    "masks",
    "bias",
    "reference",
    "which_backend",
    "kernel_status",
    "BackendChoice",
    "KernelUnavailableWarning",
]
