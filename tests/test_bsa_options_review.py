"""Block-sparse attention options (``kv_splits``, ``pack_gqa``, ``causal``): cases found in a
review that the option tests did not cover.

* The reference API (``reference.block_sparse_attention_ref``) validates ``kv_splits`` as the
  op does (it ran ``kv_splits=0`` / ``-1`` as 1 and failed on ``"AUTO"`` with ``int()``'s
  message).
* ``causal=True`` on the reference backend: K/V rows past the diagonal of the last query row
  of every query block that lists them (seen by no row) may hold NaN/Inf and contribute
  nothing (the kernels' guarantee, docs/bsa.md); the reference multiplied them by 0 and
  returned NaN (out, dq), also where ``backend="auto"`` runs it on the GPU (``pack_gqa``
  with ``causal``).
* ``validate_bsa_metadata`` takes the op's ``kv_splits`` / ``causal`` keywords ("the same
  arguments as block_sparse_attention").
* Kernel path (``JAX_SPARSE_ATTN_FORCE_KERNEL=1``, sm_90a, no GPU needed): ``jax.vmap`` folds
  its axis into B after the public layer checked that the split-KV fp32 partials stay under
  2^31 elements (32-bit offsets in the kernels); the folded shape is checked again. Zero-size
  calls (``S_q = 0``, ``S_kv = 0``, ``B = 0``) launch nothing (no kernel grid or TMA box of
  zero extent) on every ``kv_splits``, forward and backward.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_sparse_attn as jsa
from jax_sparse_attn import reference
from test_reference_bsa_options import run

CALL_TARGET = "CuteDSLRT_NvJaxCutlassCall"


def _small(Hq=4, Hkv=2, Sq=40, Skv=100, D=8, blk=64, pack=False):
    rng = np.random.default_rng(0)
    r = Hq // Hkv
    Hm, Nq = (Hkv, -(-Sq * r // blk)) if pack else (Hq, -(-Sq // blk))
    q = jnp.asarray(rng.standard_normal((1, Hq, Sq, D)), jnp.float32)
    k = jnp.asarray(rng.standard_normal((1, Hkv, Skv, D)), jnp.float32)
    idx = jnp.zeros((1, Hm, Nq, 1), jnp.int32)
    nums = jnp.ones((1, Hm, Nq), jnp.int32)
    return q, k, k, idx, nums


@pytest.mark.parametrize("bad,err,msg", [
    (0, ValueError, r"kv_splits must be in \[1, 256\] or 'auto', got 0"),
    (-1, ValueError, r"kv_splits must be in \[1, 256\] or 'auto', got -1"),
    (257, ValueError, r"kv_splits must be in \[1, 256\]"),
    ("AUTO", ValueError, r"kv_splits must be an int in \[1, 256\] or 'auto', got 'AUTO'"),
    (1.5, TypeError, "kv_splits must be a static Python int"),
    (True, TypeError, "kv_splits must be a static Python int"),
])
def test_reference_api_validates_kv_splits(bad, err, msg):
    q, k, v, idx, nums = _small()
    with pytest.raises(err, match=msg):
        reference.block_sparse_attention_ref(q, k, v, idx, nums, sparse_block_size=64,
                                             kv_splits=bad)


def test_validate_bsa_metadata_takes_the_op_options():
    q, k, v, idx, nums = _small(pack=True)
    opts = dict(q2k_block_nums=nums, sparse_block_size=64, pack_gqa=True, causal=True,
                kv_splits="auto")
    jsa.validate_bsa_metadata(q, k, v, idx, **opts)  # the op's keyword set is accepted
    jsa.block_sparse_attention(q, k, v, idx, backend="reference", **opts)
    with pytest.raises(ValueError, match=r"kv_splits must be in \[1, 256\] or 'auto', got 0"):
        jsa.validate_bsa_metadata(q, k, v, idx, **dict(opts, kv_splits=0))
    with pytest.raises(TypeError, match="causal must be a bool, got 1"):
        jsa.validate_bsa_metadata(q, k, v, idx, **dict(opts, causal=1))
    with pytest.raises(ValueError, match=r"q2k_block_index\[\(0, 1, 0, 0\)\]=7 is outside"):
        jsa.validate_bsa_metadata(q, k, v, idx.at[0, 1, 0, 0].set(7), **opts)


@pytest.mark.parametrize("pack,kv_splits", [(False, 1), (False, 3), (True, 2)])
def test_reference_causal_unseen_nan_kv_contributes_nothing(pack, kv_splits):
    """S_q = S_kv = 100, blk 64, H_q 2 / H_kv 1: query block 0 lists KV blocks 0 and 1, the
    other blocks list block 0 only, so keys 64..99 are seen by no query row (block 1 lies
    past the diagonal of block 0's last row). NaN in K and Inf in V there: out, lse and the
    gradients equal those of clean K/V, no NaN."""
    rng = np.random.default_rng(3)
    q, k, v, do = (rng.standard_normal(s) for s in ((1, 2, 100, 8), (1, 1, 100, 8),
                                                    (1, 1, 100, 8), (1, 2, 100, 8)))
    hm, nq = (1, 4) if pack else (2, 2)  # packed: r = 2, N_qp = ceil(200 / 64)
    idx = np.zeros((1, hm, nq, 2), np.int32)
    idx[:, :, 0] = [0, 1]
    nums = np.ones((1, hm, nq), np.int32)
    nums[:, :, 0] = 2
    kp, vp = k.copy(), v.copy()
    kp[:, :, 64:] = np.nan
    vp[:, :, 64:] = np.inf
    opts = dict(causal=True, pack_gqa=pack, kv_splits=kv_splits)
    clean = run(q, k, v, do, idx, nums, **opts)
    got = run(q, kp, vp, do, idx, nums, **opts)
    for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), got, clean):
        assert not np.isnan(a).any(), name
        if name == "dk" or name == "dv":  # unseen keys get zero gradients
            assert np.all(a[:, :, 64:] == 0), name
        np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-13, err_msg=name)


# ----------------------------------------------------------------------------- kernel path


@pytest.fixture
def force_kernel(monkeypatch):
    pytest.importorskip("cutlass.jax")
    monkeypatch.setenv("CUTE_DSL_ARCH", os.environ.get("CUTE_DSL_ARCH", "sm_90a"))
    monkeypatch.setenv("JAX_SPARSE_ATTN_FORCE_KERNEL", "1")


@pytest.mark.lowering
def test_vmap_folded_split_partials_over_2_31_declined(force_kernel):
    """kv_splits=64 at B=1, H_q=8, S_q=4096, D=128: 2^28 partial elements pass the public
    check; vmap over 16 folds them to 2^32 (32-bit offsets would wrap): NotImplementedError
    naming kv_splits, not a launch. Over 2 it still runs (2^29)."""
    S = jax.ShapeDtypeStruct
    bf = jnp.bfloat16
    a = (S((1, 8, 4096, 128), bf), S((1, 8, 8192, 128), bf), S((1, 8, 8192, 128), bf),
         S((1, 8, 32, 64), jnp.int32))

    def f(q, k, v, i):
        return jsa.block_sparse_attention(q, k, v, i, block_sparse_num=64, backend="kernel",
                                          kv_splits=64)

    assert jax.eval_shape(f, *a).shape == (1, 8, 4096, 128)
    vm = lambda n: tuple(S((n,) + x.shape, x.dtype) for x in a)  # noqa: E731
    assert jax.eval_shape(jax.vmap(f), *vm(2)).shape == (2, 1, 8, 4096, 128)
    with pytest.raises(NotImplementedError, match=r"kv_splits=64: .* exceed 2\^31 elements"):
        jax.eval_shape(jax.vmap(f), *vm(16))


@pytest.mark.lowering
@pytest.mark.parametrize("sq,skv,b,kv_splits", [(0, 300, 1, 1), (0, 300, 1, 3), (100, 0, 1, 1),
                                                (100, 0, 1, 2), (100, 300, 0, 1)])
def test_zero_size_kernel_calls_launch_nothing(force_kernel, sq, skv, b, kv_splits):
    """S_q = 0, S_kv = 0 or B = 0 on the kernel backend: forward and backward lower to no
    CuTe DSL call (the split forward already returned early; the one-split forward and the
    backward launched a zero-extent grid / TMA box)."""
    S = jax.ShapeDtypeStruct
    bf = jnp.bfloat16
    nq = -(-sq // 128)
    a = (S((b, 4, sq, 128), bf), S((b, 2, skv, 128), bf), S((b, 2, skv, 128), bf),
         S((b, 4, nq, 3), jnp.int32), S((b, 4, nq), jnp.int32))

    def loss(q, k, v, i, n):
        o, lse = jsa.block_sparse_attention_forward(q, k, v, i, q2k_block_nums=n,
                                                    backend="kernel", kv_splits=kv_splits,
                                                    allow_empty_block_nums=True)
        return jnp.sum(o.astype(jnp.float32)) + jnp.sum(jnp.where(jnp.isfinite(lse), lse, 0))

    txt = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).trace(*a).lower(
        lowering_platforms=("cuda",)).as_text()
    assert txt.count(CALL_TARGET) == 0
