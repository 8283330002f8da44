"""cutlass_call adapters for the block-sparse attention (BSA) CuTe DSL kernels.

Contract (docs/design.md): ``bsa_fwd`` / ``bsa_bwd`` take and return ``jax.Array``s, are
traceable under ``jax.jit``, contain no ``custom_vjp`` and do no value validation. The
public layer has already normalized the metadata: ``q2k_block_nums`` is int32
``(B, H_q, N_q)`` and ``block_sizes`` is ``None`` or int32 ``(B, H_q, N_kv)``.

Tensors stay in the caller's layout: the kernels see logical ``(B, S, H, D)`` modes and
``bhsd`` buffers are presented that way through ``TensorSpec(mode=(0, 2, 1, 3))`` (no
transpose). ``softmax_scale`` travels as a ``(1,)`` float32 device array, never as a
compile key; compile keys are the frozen ``BsaFwdConfig`` / ``BsaBwdConfig`` dataclasses.

Kernels (``jax_sparse_attn/kernels``):

* D in {64, 128}: ``bsa_fwd_sm90`` / ``bsa_bwd_sm90`` (warpgroup MMA, sm_90a) by default;
* D in {32, 256}: ``bsa_fwd_sm80`` / ``bsa_bwd_sm80`` (warp-level ``mma.sync``, also run on
  sm_90a). ``JAX_SPARSE_ATTN_BSA_FWD_IMPL`` / ``JAX_SPARSE_ATTN_BSA_BWD_IMPL`` = ``sm80``
  force the ``mma.sync`` kernels for every D (read at trace time; part of the compile key).
* ``JAX_SPARSE_ATTN_BSA_FWD_IMPL=sm90ws`` (opt-in): the forward on the warp-specialized TMA +
  wgmma mainloop (``bsa_fwd_sm90_ws``: TMA producer warp, persistent grid) for D in {64, 128};
  other head dims fall back to ``bsa_fwd_sm80``. ``JAX_SPARSE_ATTN_BSA_WS`` (tuning / ablation
  only): comma list of ``nooverlap``, ``nopingpong``, ``q1`` (single-buffered Q), ``stages=<n>``
  (at most n K/V stages).

Backward structure (all launches on XLA's stream, all buffers XLA-owned):

1. The preprocessing kernel (``kernels/bsa_pre.py``, default; ``JAX_SPARSE_ATTN_BSA_PRE_IMPL=xla``
   uses an XLA fusion instead): ``delta = rowsum(dO * O)`` in fp32 and a zero-initialised
   fp32 ``dq`` accumulator (same physical layout as q) in one launch; the dK/dV/dQ kernel
   then updates the accumulator in place (``input_output_aliases``).
2. The K->Q transposed block lists (CSR) built on the device from the forward metadata
   each call (``build_kq_csr``: a dense bitmap with a row-wise prefix sum for up to 2**22
   (query block, KV block) pairs, else a stable argsort; 30-53 us and 128 us respectively
   for B=1, H=16, N=256, top-32 on the H200).
3. One dK/dV/dQ kernel: a CTA per (64-key tile, KV head, batch) walks the (query head in
   the GQA group, query block) entries that listed its KV block, keeps dK/dV in
   registers and adds each dQ tile to the fp32 accumulator (``sm90``: bulk
   ``cp.reduce.async.bulk .add.f32`` of shared-memory rows; ``sm80``: ``atomicAdd``).
   Determinism: dK and dV are bitwise deterministic (fixed entry order, no atomics); dQ
   is not (the order of the fp32 additions varies from run to run).
4. ``dq = dq_accum.astype(q.dtype)`` (XLA).
"""

from __future__ import annotations

import dataclasses
import functools
import os

import jax
import jax.numpy as jnp

SUPPORTED_HEAD_DIMS = (32, 64, 128, 256)
SUPPORTED_BLOCK_SIZES = (64, 128)
_DTYPES = ("float16", "bfloat16")
_DEFAULT_FWD_IMPL = "sm90"
_DEFAULT_BWD_IMPL = "sm90"


@dataclasses.dataclass(frozen=True)
class BsaFwdConfig:
    dtype: str
    head_dim: int
    block_size: int
    has_block_sizes: bool
    impl: str = "sm80"  # "sm90": wgmma kernel (D in {64, 128}); "sm80": mma.sync kernel
    # "sm90ws" only: intra-warpgroup GEMM overlap, ping-pong (blk 128), SMs of the grid
    ws_overlap: bool = True
    ws_pingpong: bool = True
    ws_q_stages: int = 2
    ws_max_stages: int = 4
    num_sms: int = 0


FWD_IMPLS = ("sm90", "sm90ws", "sm80")


def _fwd_impl(head_dim: int) -> str:
    want = os.environ.get("JAX_SPARSE_ATTN_BSA_FWD_IMPL", _DEFAULT_FWD_IMPL)
    if want not in FWD_IMPLS:
        raise ValueError(f"JAX_SPARSE_ATTN_BSA_FWD_IMPL must be one of {FWD_IMPLS}, got {want!r}")
    if want in ("sm90", "sm90ws") and head_dim in (64, 128):
        return want
    return "sm80"


def _fwd_config(dtype_name: str, head_dim: int, block_size: int, has_sizes: bool) -> BsaFwdConfig:
    impl = _fwd_impl(head_dim)
    if impl != "sm90ws":
        return BsaFwdConfig(dtype_name, head_dim, block_size, has_sizes, impl)
    from .hstu import _num_sms  # noqa: PLC0415

    opts = [o for o in os.environ.get("JAX_SPARSE_ATTN_BSA_WS", "").split(",") if o]
    return BsaFwdConfig(dtype_name, head_dim, block_size, has_sizes, impl,
                        ws_overlap="nooverlap" not in opts, ws_pingpong="nopingpong" not in opts,
                        ws_q_stages=1 if "q1" in opts else 2,
                        ws_max_stages=int(next((o[7:] for o in opts if o.startswith("stages=")), 4)),
                        num_sms=_num_sms())


@dataclasses.dataclass(frozen=True)
class BsaBwdConfig:
    dtype: str
    head_dim: int
    block_size: int
    has_block_sizes: bool
    impl: str = "sm80"  # "sm90": wgmma kernel (D in {64, 128}); "sm80": mma.sync kernel


_BWD_IMPLS = ("sm90", "sm80")


def _bwd_impl(head_dim: int) -> str:
    want = os.environ.get("JAX_SPARSE_ATTN_BSA_BWD_IMPL", _DEFAULT_BWD_IMPL)
    if want not in _BWD_IMPLS:
        raise ValueError(f"JAX_SPARSE_ATTN_BSA_BWD_IMPL must be one of {_BWD_IMPLS}, got {want!r}")
    if want == "sm90" and head_dim in (64, 128):
        return "sm90"
    return "sm80"


def bsa_kernel_unsupported_reason(*, dtype, head_dim, head_dim_v, sparse_block_size) -> str | None:
    """``None`` when the BSA kernels implement this static configuration, else why not."""
    name = jnp.dtype(dtype).name
    if name not in _DTYPES:
        return f"the BSA kernels support float16 and bfloat16 inputs, got {name}"
    if head_dim != head_dim_v:
        return f"the BSA kernels need D == D_v, got D={head_dim}, D_v={head_dim_v}"
    if head_dim not in SUPPORTED_HEAD_DIMS:
        return f"the BSA kernels support head dims {SUPPORTED_HEAD_DIMS}, got {head_dim}"
    if sparse_block_size not in SUPPORTED_BLOCK_SIZES:
        return f"the BSA kernels support sparse_block_size in {SUPPORTED_BLOCK_SIZES}, got {sparse_block_size}"
    return None


def _cutlass_dtype(name: str):
    import cutlass  # noqa: PLC0415

    return {"float16": cutlass.Float16, "bfloat16": cutlass.BFloat16}[name]


def _specs(layout: str):
    from cutlass.jax import TensorSpec  # noqa: PLC0415

    if layout == "bhsd":
        return TensorSpec(mode=(0, 2, 1, 3))
    if layout == "bshd":
        return TensorSpec()
    raise ValueError(f"layout must be 'bhsd' or 'bshd', got {layout!r}")


def _dims(q, k, layout):
    if layout == "bhsd":
        b, h_q, s_q, d = q.shape
        _, h_kv, s_kv, _ = k.shape
    else:
        b, s_q, h_q, d = q.shape
        _, s_kv, h_kv, _ = k.shape
    return b, h_q, s_q, h_kv, s_kv, d


# --------------------------------------------------------------------------- forward


def _fwd_entry(stream, q, k, v, idx, nums, sizes, scale, out, lse, *, cfg: BsaFwdConfig):
    if cfg.impl == "sm90ws":
        from ..kernels.bsa_fwd_sm90_ws import BsaFwdSm90Ws  # noqa: PLC0415

        BsaFwdSm90Ws(_cutlass_dtype(cfg.dtype), cfg.head_dim, cfg.block_size, cfg.has_block_sizes,
                     cfg.num_sms, overlap=cfg.ws_overlap, pingpong=cfg.ws_pingpong,
                     max_stages=cfg.ws_max_stages, q_stages=cfg.ws_q_stages)(
            q, k, v, idx, nums, sizes, scale, out, lse, stream)
        return
    if cfg.impl == "sm90":
        from ..kernels.bsa_fwd_sm90 import BsaFwdSm90 as Kernel  # noqa: PLC0415
    else:
        from ..kernels.bsa_fwd_sm80 import BsaFwdSm80 as Kernel  # noqa: PLC0415

    Kernel(_cutlass_dtype(cfg.dtype), cfg.head_dim, cfg.block_size, cfg.has_block_sizes)(
        q, k, v, idx, nums, sizes, scale, out, lse, stream
    )


@functools.cache
def _fwd_jit():
    """The one ``cute.jit`` of ``_fwd_entry`` (cutlass_call caches on its identity)."""
    import cutlass.cute as cute  # noqa: PLC0415

    return cute.jit(_fwd_entry)


def bsa_fwd(q, k, v, q2k_block_index, q2k_block_nums, block_sizes, *, layout: str,
            sparse_block_size: int, softmax_scale: float):
    """Block-sparse attention forward on the CuTe DSL kernel. Returns ``(out, lse)``.

    ``out`` has q's layout and dtype, ``lse`` is float32 ``(B, H_q, S_q)`` (natural log,
    ``-inf`` on rows with no active block).
    """
    from cutlass.jax import cutlass_call  # noqa: PLC0415

    b, h_q, s_q, _h_kv, _s_kv, d = _dims(q, k, layout)
    cfg = _fwd_config(jnp.dtype(q.dtype).name, int(d), int(sparse_block_size), block_sizes is not None)
    spec = _specs(layout)
    scale = jnp.full((1,), softmax_scale, jnp.float32)
    idx = q2k_block_index.astype(jnp.int32)
    nums = q2k_block_nums.astype(jnp.int32)
    sizes = None if block_sizes is None else block_sizes.astype(jnp.int32)
    call = cutlass_call(
        _fwd_jit(),
        output_shape_dtype=(
            jax.ShapeDtypeStruct(q.shape[:-1] + (v.shape[-1],), q.dtype),
            jax.ShapeDtypeStruct((b, h_q, s_q), jnp.float32),
        ),
        input_spec=(spec, spec, spec, None, None, None, None),
        output_spec=(spec, None),
        compile_key=("bsa_fwd", cfg),
        cfg=cfg,
    )
    out, lse = call(q, k, v, idx, nums, sizes, scale)
    return out, lse


# --------------------------------------------------------------------------- backward


# the dense (bitmap) K->Q construction is used up to this many (query block, KV block) pairs
# B * H_q * N_q * N_kv (its temporaries take about 16 bytes per pair: 64 MiB here); above
# it, a stable sort (argsort) builds the lists in memory linear in the number of entries
_DENSE_CSR_MAX_ELEMS = 1 << 22


def build_kq_csr(q2k_block_index, q2k_block_nums, *, num_kv_heads: int, num_kv_blocks: int):
    """K->Q transposed block lists (CSR) from the Q->K metadata, on the device.

    Returns ``(offsets, entries)``: ``offsets`` int32 ``(B*H_kv*N_kv + 1,)``; the entries of
    KV block n of KV head g in batch b are ``entries[offsets[r]:offsets[r+1]]`` with
    ``r = (b*H_kv + g)*N_kv + n``, each ``h_in_group*N_q + m`` (query head ``g*G + h_in_group``,
    query block m), in increasing order. Only the active prefix of each row is used.
    ``entries`` has ``B*H_q*N_q*K_max`` slots; those past ``offsets[-1]`` are unused.

    Two constructions with identical results for valid metadata (unique active block ids
    per row): for up to ``2**22`` (query block, KV block) pairs a dense bitmap (one scatter,
    a row-wise prefix sum, one scatter; 30-53 us for 16 heads x 256 x 256 blocks on an H200,
    about 16 bytes of temporaries per pair), beyond that a stable argsort of the entries by
    KV block (about 130 us for the same problem, memory linear in the number of entries).
    """
    b, h_q, n_q, k_max = q2k_block_index.shape
    group = h_q // num_kv_heads
    j = jnp.arange(k_max, dtype=jnp.int32)
    active = j[None, None, None, :] < q2k_block_nums[..., None]
    if b * h_q * n_q * num_kv_blocks <= _DENSE_CSR_MAX_ELEMS:
        return _kq_csr_dense(q2k_block_index, active, group, num_kv_heads, num_kv_blocks)
    n_rows = b * num_kv_heads * num_kv_blocks
    bi = jnp.arange(b, dtype=jnp.int32)[:, None, None, None]
    hi = jnp.arange(h_q, dtype=jnp.int32)[None, :, None, None]
    mi = jnp.arange(n_q, dtype=jnp.int32)[None, None, :, None]
    key = (bi * num_kv_heads + hi // group) * num_kv_blocks + q2k_block_index
    key = jnp.where(active, key, n_rows).reshape(-1)
    val = jnp.broadcast_to((hi % group) * n_q + mi, q2k_block_index.shape).reshape(-1)
    perm = jnp.argsort(key, stable=True)
    entries = val[perm].astype(jnp.int32)
    counts = jnp.zeros((n_rows + 1,), jnp.int32).at[key].add(1)
    offsets = jnp.concatenate([jnp.zeros((1,), jnp.int32), jnp.cumsum(counts[:n_rows], dtype=jnp.int32)])
    return offsets, entries


def _kq_csr_dense(q2k_block_index, active, group, num_kv_heads, num_kv_blocks):
    """:func:`build_kq_csr` through a (KV block) x (query head in group, query block) bitmap."""
    b, h_q, n_q, k_max = q2k_block_index.shape
    # selected[b, h, m, n] = 1 if query block m of head h lists KV block n (inactive slots
    # land in the dropped column num_kv_blocks)
    tgt = jnp.where(active, q2k_block_index, num_kv_blocks)
    bi = jnp.arange(b)[:, None, None, None]
    hi = jnp.arange(h_q)[None, :, None, None]
    mi = jnp.arange(n_q)[None, None, :, None]
    sel = jnp.zeros((b, h_q, n_q, num_kv_blocks + 1), jnp.int32).at[bi, hi, mi, tgt].set(1)
    sel = sel[..., :num_kv_blocks]
    # rows (b, g, n), columns h_in_group * n_q + m: the entry value, in increasing order
    rows = sel.reshape(b, num_kv_heads, group, n_q, num_kv_blocks).transpose(0, 1, 4, 2, 3)
    rows = rows.reshape(b * num_kv_heads * num_kv_blocks, group * n_q)
    offsets = jnp.concatenate([jnp.zeros((1,), jnp.int32), jnp.cumsum(rows.sum(-1), dtype=jnp.int32)])
    pos = offsets[:-1, None] + jnp.cumsum(rows, axis=-1, dtype=jnp.int32) - 1
    n_slots = b * h_q * n_q * k_max
    pos = jnp.where(rows > 0, pos, n_slots)  # unselected: out of range, dropped
    vals = jnp.broadcast_to(jnp.arange(group * n_q, dtype=jnp.int32), rows.shape)
    entries = jnp.zeros((n_slots,), jnp.int32).at[pos.reshape(-1)].set(vals.reshape(-1), mode="drop")
    return offsets, entries


@dataclasses.dataclass(frozen=True)
class BsaPreConfig:
    dtype: str
    head_dim: int


_PRE_IMPLS = ("xla", "kernel")
_DEFAULT_PRE_IMPL = "kernel"


def _pre_impl() -> str:
    want = os.environ.get("JAX_SPARSE_ATTN_BSA_PRE_IMPL", _DEFAULT_PRE_IMPL)
    if want not in _PRE_IMPLS:
        raise ValueError(f"JAX_SPARSE_ATTN_BSA_PRE_IMPL must be one of {_PRE_IMPLS}, got {want!r}")
    return want


def _pre_entry(stream, out, do, delta, dq_acc, *, cfg: BsaPreConfig):
    from ..kernels.bsa_pre import BsaPreprocess  # noqa: PLC0415

    BsaPreprocess(_cutlass_dtype(cfg.dtype), cfg.head_dim)(out, do, delta, dq_acc, stream)


@functools.cache
def _pre_jit():
    """The one ``cute.jit`` of ``_pre_entry`` (cutlass_call caches on its identity)."""
    import cutlass.cute as cute  # noqa: PLC0415

    return cute.jit(_pre_entry)


def bsa_preprocess(do, out, *, layout: str):
    """``delta = rowsum(dO * O)`` (fp32 ``(B, H_q, S_q)``) and a zeroed fp32 dQ accumulator
    (q's shape and layout) from one CuTe DSL launch (``kernels/bsa_pre.py``)."""
    from cutlass.jax import cutlass_call  # noqa: PLC0415

    if layout == "bhsd":
        b, h, s, d = out.shape
    else:
        b, s, h, d = out.shape
    spec = _specs(layout)
    cfg = BsaPreConfig(jnp.dtype(out.dtype).name, int(d))
    call = cutlass_call(
        _pre_jit(),
        output_shape_dtype=(
            jax.ShapeDtypeStruct((b, h, s), jnp.float32),
            jax.ShapeDtypeStruct(out.shape, jnp.float32),
        ),
        input_spec=(spec, spec),
        output_spec=(None, spec),
        compile_key=("bsa_pre", cfg),
        cfg=cfg,
    )
    return call(out, do.astype(out.dtype))


def _bwd_entry(stream, q, k, v, do, lse, delta, offsets, entries, sizes, scale, dq_acc, dk, dv,
               *, cfg: BsaBwdConfig):
    if cfg.impl == "sm90":
        from ..kernels.bsa_bwd_sm90 import BsaBwdSm90 as Kernel  # noqa: PLC0415
    else:
        from ..kernels.bsa_bwd_sm80 import BsaBwdSm80 as Kernel  # noqa: PLC0415

    Kernel(_cutlass_dtype(cfg.dtype), cfg.head_dim, cfg.block_size, cfg.has_block_sizes)(
        q, k, v, do, lse, delta, offsets, entries, sizes, scale, dq_acc, dk, dv, stream
    )


@functools.cache
def _bwd_jit():
    """The one ``cute.jit`` of ``_bwd_entry`` (cutlass_call caches on its identity)."""
    import cutlass.cute as cute  # noqa: PLC0415

    return cute.jit(_bwd_entry)


def bsa_bwd(do, q, k, v, out, lse, q2k_block_index, q2k_block_nums, block_sizes, *, layout: str,
            sparse_block_size: int, softmax_scale: float):
    """Block-sparse attention backward on the CuTe DSL kernels. Returns ``(dq, dk, dv)``
    in the layouts and dtypes of q, k, v."""
    from cutlass.jax import cutlass_call  # noqa: PLC0415

    _, _, _, h_kv, s_kv, d = _dims(q, k, layout)
    blk = int(sparse_block_size)
    n_kv = -(-s_kv // blk)
    cfg = BsaBwdConfig(jnp.dtype(q.dtype).name, int(d), blk, block_sizes is not None, _bwd_impl(int(d)))
    spec = _specs(layout)
    scale = jnp.full((1,), softmax_scale, jnp.float32)
    if _pre_impl() == "kernel":
        # delta and the zeroed dq accumulator from one CuTe DSL launch
        delta, dq_acc = bsa_preprocess(do, out, layout=layout)
    else:
        # delta_i = rowsum(dO * O), fp32, (B, H_q, S_q)
        delta = jnp.sum(do.astype(jnp.float32) * out.astype(jnp.float32), axis=-1)
        if layout == "bshd":
            delta = jnp.swapaxes(delta, 1, 2)
        dq_acc = jnp.zeros(q.shape, jnp.float32)
    offsets, entries = build_kq_csr(
        q2k_block_index.astype(jnp.int32), q2k_block_nums.astype(jnp.int32),
        num_kv_heads=h_kv, num_kv_blocks=n_kv,
    )
    sizes = None if block_sizes is None else block_sizes.astype(jnp.int32)
    call = cutlass_call(
        _bwd_jit(),
        output_shape_dtype=(
            jax.ShapeDtypeStruct(q.shape, jnp.float32),
            jax.ShapeDtypeStruct(k.shape, k.dtype),
            jax.ShapeDtypeStruct(v.shape, v.dtype),
        ),
        input_spec=(spec, spec, spec, spec, None, None, None, None, None, None, spec),
        output_spec=(spec, spec, spec),
        input_output_aliases={10: 0},
        compile_key=("bsa_bwd", cfg),
        cfg=cfg,
    )
    dq_acc, dk, dv = call(q, k, v, do, lse, delta, offsets, entries, sizes, scale, dq_acc)
    return dq_acc.astype(q.dtype), dk, dv
