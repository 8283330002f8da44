"""Block-sparse split-KV (``kv_splits``) on the kernel path, on CPU: lowering for sm_90a, the
split count of the compile key, and the split counts the kernels decline.

The lowering grid compiles the split forward (``bsa_fwd_sm90_ws`` / ``bsa_fwd_sm80`` with
``kv_splits > 1``) and the combine kernel (``kernels/bsa_combine.py``) through the public
API for ``kv_splits`` in {2, 7, 64, "auto"} at both block sizes on the default forward
(``bsa_fwd_impl="auto"``: sm90ws), with ``bsa_fwd_impl="sm90ws"`` named at each block size,
and on the mma.sync forward (D 32 and 256); dtype, layout, head dim and ``block_sizes`` presence alternate. ``kv_splits=1``
keeps the kernels of before (their PTX is pinned in ``tests/ws_ptx_sha256.txt``,
``tests/test_lowering_hstu.py::test_sm90ws_forwards_without_rab_keep_their_ptx``; the
compile key is the same object, checked below). With ``pack_gqa`` the split count resolves
over the packed metadata rows (checked below; the packed split kernels' lowering grid is in
tests/test_lowering_bsa_pack_gqa.py).
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

CALL_TARGET = "CuteDSLRT_NvJaxCutlassCall"

# (kv_splits, blk, D, dtype, layout, block_sizes, bsa_fwd_impl); K_max = 5 list entries, so
# 7 and 64 clamp to 5 splits; "auto" with B H N_q = 1 * 2 * ceil(300 / blk) rows splits too
LOWER = [
    (2, 128, 128, "bfloat16", "bhsd", False, "auto"),
    (7, 64, 64, "float16", "bshd", True, "auto"),
    ("auto", 64, 128, "bfloat16", "bhsd", False, "auto"),
    (2, 64, 128, "bfloat16", "bshd", True, "sm90ws"),
    ("auto", 128, 128, "float16", "bhsd", True, "sm90ws"),
    (7, 64, 256, "bfloat16", "bhsd", True, "auto"),  # D 256: the mma.sync forward
    (64, 128, 32, "float16", "bshd", False, "sm80"),
]


@pytest.fixture
def kernel_env(monkeypatch):
    monkeypatch.setenv("CUTE_DSL_ARCH", os.environ.get("CUTE_DSL_ARCH", "sm_90a"))
    monkeypatch.setenv("JAX_SPARSE_ATTN_FORCE_KERNEL", "1")


def _args(blk, d, dtype, layout, sizes, b=1, h=2, sq=300, skv=1100, kmax=5):
    shp = (lambda s: (b, s, h, d)) if layout == "bshd" else (lambda s: (b, h, s, d))
    q = jax.ShapeDtypeStruct(shp(sq), jnp.dtype(dtype))
    k = jax.ShapeDtypeStruct(shp(skv), jnp.dtype(dtype))
    nq, nkv = -(-sq // blk), -(-skv // blk)
    idx = jax.ShapeDtypeStruct((b, h, nq, kmax), jnp.int32)
    nums = jax.ShapeDtypeStruct((b, h, nq), jnp.int32)
    bs = jax.ShapeDtypeStruct((b, nkv), jnp.int32) if sizes else None
    return q, k, idx, nums, bs


def _idx(shape):
    """Concrete block lists ``0, 1, ..., K_max - 1`` of the given shape (valid metadata)."""
    return jnp.broadcast_to(jnp.arange(shape[-1], dtype=jnp.int32), shape)


def _config(q, k, idx, kv_splits, blk, impl="auto", op="block_sparse_attention_forward",
            block_sparse_num=None, layout="bhsd"):
    import jax_sparse_attn as jsa
    from jax_sparse_attn.config import Switches

    return jsa.bsa._make_config(
        q, k, k, idx, block_sparse_num or idx.shape[-1], None, None, sparse_block_size=blk,
        softmax_scale=None, layout=layout, allow_empty_block_nums=False, backend="kernel",
        switches=Switches(bsa_fwd_impl=impl), op_name=op, kv_splits=kv_splits)[0]


@pytest.mark.lowering
@pytest.mark.parametrize("ks,blk,d,dtype,layout,sizes,impl", LOWER,
                         ids=[f"kv{c[0]}-blk{c[1]}-d{c[2]}-{c[3]}-{c[4]}-"
                              f"{'sizes' if c[5] else 'nosizes'}-{c[6]}" for c in LOWER])
def test_bsa_split_forward_and_grad_lower(kernel_env, ks, blk, d, dtype, layout, sizes, impl):
    import jax_sparse_attn as jsa
    from jax_sparse_attn.config import Switches

    q, k, idx, nums, bs = _args(blk, d, dtype, layout, sizes)
    cfg = _config(q, k, _idx(idx.shape), ks, blk, impl, layout=layout)
    assert cfg.fwd.kv_splits == (5 if ks != 2 else 2)
    want = {"auto": "sm90ws"}.get(impl, impl)
    assert cfg.fwd.impl == ("sm80" if d in (32, 256) else want)
    kw = dict(layout=layout, sparse_block_size=blk, backend="kernel", kv_splits=ks,
              switches=Switches(bsa_fwd_impl=impl))

    def fwd(q, k, v, i, n, s):
        return jsa.block_sparse_attention_forward(q, k, v, i, None, s, n, **kw)

    txt = jax.jit(fwd).trace(q, k, k, idx, nums, bs).lower(
        lowering_platforms=("cuda",)).as_text()
    # the split forward and the combine kernel
    assert txt.count(CALL_TARGET) == 2
    assert "\\7FELF" in txt

    def loss(q, k, v, i, n, s):
        o = jsa.block_sparse_attention(q, k, v, i, None, s, n, **kw)
        return jnp.sum(o.astype(jnp.float32))

    if (ks, blk, d) not in ((2, 128, 128), (7, 64, 64)):
        return  # the gradient through the split forward: one case per default forward (CI time)
    txt = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).trace(q, k, k, idx, nums, bs).lower(
        lowering_platforms=("cuda",)).as_text()
    # split forward + combine, backward preprocessing + dK/dV/dQ kernel + dq reordering
    assert txt.count(CALL_TARGET) == 5


def test_kv_splits_resolution_and_compile_key(kernel_env):
    """The compile key's split count: an int clamped to K_max, "auto" = the reference's
    rule (metadata.auto_kv_splits) with the SM count of metadata.num_sms (132 without a
    GPU); kv_splits=1 (and "auto" where it resolves to 1) gives the very key of a call
    without the option."""
    from jax_sparse_attn import metadata
    from jax_sparse_attn.ffi import bsa as ffi_bsa

    r = ffi_bsa.resolve_kv_splits
    assert r(7, num_rows=16, k_max=64, impl="sm90ws") == 7
    assert ffi_bsa.SPLIT_IMPLS == ("sm90ws", "sm80")
    assert r(64, num_rows=16, k_max=5, impl="sm90ws") == 5
    assert r(256, num_rows=1, k_max=300, impl="sm80") == 256
    assert r("auto", num_rows=16, k_max=64, impl="sm90ws") == metadata.auto_kv_splits(16, 64)
    assert r("auto", num_rows=10_000, k_max=64, impl="sm90ws") == 1
    assert r("auto", num_rows=1, k_max=64, impl="sm80") == 64  # every forward splits
    assert metadata.num_sms() == metadata.DEFAULT_NUM_SMS == 132  # CPU: the documented default

    # B=1 H=16 S_q=128 against 64 listed blocks (the decode benchmark row): 132 // 16 = 8
    q = jax.ShapeDtypeStruct((1, 16, 128, 128), jnp.bfloat16)
    k = jax.ShapeDtypeStruct((1, 16, 64 * 128, 128), jnp.bfloat16)
    idx = _idx((1, 16, 1, 64))
    assert _config(q, k, idx, "auto", 128).fwd.kv_splits == 8
    assert _config(q, k, idx, "auto", 128, impl="sm90ws").fwd.kv_splits == 8
    # many rows: auto = 1 and the key is that of a call without kv_splits
    q2 = jax.ShapeDtypeStruct((4, 16, 8192, 128), jnp.bfloat16)
    idx2 = _idx((4, 16, 64, 64))
    k2 = jax.ShapeDtypeStruct((4, 16, 64 * 128, 128), jnp.bfloat16)
    base = _config(q2, k2, idx2, 1, 128)
    assert _config(q2, k2, idx2, "auto", 128).fwd == base.fwd
    assert base.fwd.kv_splits == 1
    assert _config(q, k, idx, 1, 128).fwd == ffi_bsa.fwd_config(
        jnp.bfloat16, 128, 128, False, __import__("jax_sparse_attn").config.Switches(
            bsa_fwd_impl="auto"))
    # the backward entry point never splits: its compile keys ignore kv_splits
    bwd = _config(q, k, idx, 64, 128, op="block_sparse_attention_backward")
    assert bwd.fwd is None and bwd.bwd is not None


def test_kv_splits_resolution_counts_packed_rows(kernel_env):
    """With pack_gqa the split count resolves over the packed metadata rows ``B H_kv N_qp``
    (``N_qp = ceil(S_q r / blk)``, ``cfg.num_q_blocks``), and the compile key carries r and
    the split count together (the packed split forward, tests/test_lowering_bsa_pack_gqa.py).
    The decode rows of benchmarks/bsa_bench.py --pack-gqa: B 16, H_q 32 / H_kv 4, S_q 16,
    blk 128 is 16 * 4 * 1 = 64 packed rows (unpacked: 16 * 32 * 1 = 512), so "auto" splits
    132 // 64 = 2 ways packed and not at all unpacked; B 1 with 64 listed blocks: 4 packed
    rows, 33 splits."""
    import jax_sparse_attn as jsa
    from jax_sparse_attn.config import Switches

    def cfg(b, hq, hkv, sq, skv, kmax, ks, pack, blk=128):
        q = jax.ShapeDtypeStruct((b, hq, sq, 128), jnp.bfloat16)
        k = jax.ShapeDtypeStruct((b, hkv, skv, 128), jnp.bfloat16)
        rows = (hkv, -(-sq * (hq // hkv) // blk)) if pack else (hq, -(-sq // blk))
        idx = _idx((b,) + rows + (kmax,))
        return jsa.bsa._make_config(
            q, k, k, idx, kmax, None, None, sparse_block_size=blk, softmax_scale=None,
            layout="bhsd", allow_empty_block_nums=False, backend="kernel",
            switches=Switches(), op_name="block_sparse_attention_forward", kv_splits=ks,
            pack_gqa=pack)[0]

    c = cfg(16, 32, 4, 16, 16384, 16, "auto", True)
    assert (c.num_q_blocks, c.fwd.pack_gqa, c.fwd.kv_splits) == (1, 8, 2)
    assert cfg(16, 32, 4, 16, 16384, 16, "auto", False).fwd.kv_splits == 1
    c = cfg(1, 32, 4, 16, 131072, 64, "auto", True)
    assert (c.fwd.pack_gqa, c.fwd.kv_splits) == (8, 33)
    assert cfg(1, 32, 4, 16, 131072, 64, 1, True).fwd.kv_splits == 1
    # an int: clamped to K_max as unpacked; N_qp over the packed rows (S_q r = 40 * 4 > 128)
    c = cfg(2, 8, 2, 40, 1100, 5, 7, True, blk=64)
    assert (c.num_q_blocks, c.fwd.pack_gqa, c.fwd.kv_splits) == (3, 4, 5)
    # many packed rows: "auto" is one split, the key of kv_splits=1
    assert (cfg(4, 16, 2, 4096, 2048, 8, "auto", True).fwd
            == cfg(4, 16, 2, 4096, 2048, 8, 1, True).fwd)


@pytest.mark.parametrize("d,impl,family", [(256, "auto", "auto"), (128, "sm80", "auto"),
                                           (64, "auto", "portable")])
def test_kv_splits_on_the_mma_sync_forward(kernel_env, d, impl, family):
    """The mma.sync (sm80) forward splits too (D 32/256, bsa_fwd_impl="sm80", the portable
    kernel family): its compile key carries the split count; the backward entry point never
    splits."""
    import jax_sparse_attn as jsa
    from jax_sparse_attn.config import Switches

    sw = Switches(bsa_fwd_impl=impl, kernel_family=family)
    q = jax.ShapeDtypeStruct((1, 2, 300, d), jnp.bfloat16)
    idx = _idx((1, 2, 5, 3))
    kw = dict(sparse_block_size=64, switches=sw)
    for ks, want in ((2, 2), (7, 3), ("auto", 3), (1, 1)):
        choice = jsa.which_backend(jsa.block_sparse_attention, q, q, q, idx, 3, kv_splits=ks,
                                   **kw)
        assert choice.backend == "kernel", choice.reason
        cfg = jsa.bsa._make_config(
            q, q, q, idx, 3, None, None, sparse_block_size=64, softmax_scale=None,
            layout="bhsd", allow_empty_block_nums=False, backend="kernel", switches=sw,
            op_name="block_sparse_attention", kv_splits=ks)[0]
        assert (cfg.fwd.impl, cfg.fwd.kv_splits) == ("sm80", want)
    cfg = jsa.bsa._make_config(
        q, q, q, idx, 3, None, None, sparse_block_size=64, softmax_scale=None, layout="bhsd",
        allow_empty_block_nums=False, backend="kernel", switches=sw,
        op_name="block_sparse_attention_backward", kv_splits=2)[0]
    assert cfg.fwd is None and cfg.bwd is not None


def test_kv_splits_partial_buffer_limit(kernel_env):
    """A split count whose fp32 partials would pass 2^31 elements is declined (the kernels
    address them with 32-bit offsets)."""
    from jax_sparse_attn.ffi import bsa as ffi_bsa

    why = ffi_bsa.kv_splits_unsupported_reason(
        64, head_dim=128, sparse_block_size=128, num_rows=64, k_max=64,
        partial_elems=2**26)
    assert why is not None and "2^31" in why
    assert ffi_bsa.kv_splits_unsupported_reason(
        16, head_dim=128, sparse_block_size=128, num_rows=64, k_max=64,
        partial_elems=2**26) is None
