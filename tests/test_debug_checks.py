"""``debug_checks=True``: bad traced metadata under ``jax.jit`` raise with the eager
validators' messages; valid metadata pass and give the same result."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_sparse_attn import (
    block_sparse_attention,
    block_sparse_attention_forward,
    hstu_attention,
    hstu_attention_backward,
)

T, H, D = 40, 1, 8


def _hstu(cu, **kw):
    q = jnp.ones((T, H, D), jnp.float32)
    return hstu_attention(q, q, q, cu, cu, max_seqlen_q=20, max_seqlen_k=20,
                          backend="reference", **kw)


def _eager_message(fn, *args):
    with pytest.raises(ValueError) as e:
        fn(*args)
    return str(e.value)


@pytest.mark.parametrize("cu", [[0, -5, 30, 40], [0, 30, 20, 40], [0, 10, 20, 50], [0, 10, 35, 40]],
                         ids=["negative", "unsorted", "past_T", "longer_than_max_seqlen"])
def test_hstu_traced_bad_cu_seqlens_raise_eager_message(cu):
    cu = jnp.asarray(cu, jnp.int32)
    msg = _eager_message(_hstu, cu)
    with pytest.raises(jax.errors.JaxRuntimeError, match=re.escape(msg)):
        jax.block_until_ready(jax.jit(lambda c: _hstu(c, debug_checks=True))(cu))
    # without debug_checks: no check, some values (never a crash)
    jax.block_until_ready(jax.jit(_hstu)(cu))


def test_hstu_backward_debug_checks():
    q = jnp.ones((T, H, D), jnp.float32)
    cu = jnp.asarray([0, 30, 20, 40], jnp.int32)

    def f(c):
        return hstu_attention_backward(q, q, q, q, c, c, max_seqlen_q=20, max_seqlen_k=20,
                                       backend="reference", debug_checks=True)

    with pytest.raises(jax.errors.JaxRuntimeError, match="cu_seqlens_q"):
        jax.block_until_ready(jax.jit(f)(cu))


def test_hstu_valid_traced_metadata_pass_with_same_result():
    cu = jnp.asarray([0, 20, 20, 40], jnp.int32)
    got = jax.jit(lambda c: _hstu(c, debug_checks=True))(cu)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(_hstu(cu)))


def _bsa_inputs():
    rng = np.random.default_rng(0)
    q = jnp.asarray(rng.standard_normal((1, 2, 256, 32)), jnp.float32)
    idx = jnp.asarray(np.tile(np.arange(3, dtype=np.int32), (1, 2, 4, 1)))
    return q, idx


@pytest.mark.parametrize("case", ["count_above_kmax", "negative_count", "zero_count",
                                  "index_past_nkv", "duplicate_index"])
def test_bsa_traced_bad_metadata_raise_eager_message(case):
    q, idx = _bsa_inputs()
    nums = np.full((1, 2, 4), 2, np.int32)
    idx = np.array(idx)
    if case == "count_above_kmax":
        nums[0, 1, 2] = 50
    elif case == "negative_count":
        nums[0, 0, 1] = -7
    elif case == "zero_count":
        nums[0, 0, 0] = 0
    elif case == "index_past_nkv":
        idx[0, 1, 3, 0] = 9
    else:
        idx[0, 0, 2, 1] = idx[0, 0, 2, 0]
    idx, nums = jnp.asarray(idx), jnp.asarray(nums)

    def f(i, n, debug_checks=False):
        return block_sparse_attention(q, q, q, i, q2k_block_nums=n, sparse_block_size=64,
                                      backend="reference", debug_checks=debug_checks)

    msg = _eager_message(f, idx, nums)
    with pytest.raises(jax.errors.JaxRuntimeError, match=re.escape(msg)):
        jax.block_until_ready(jax.jit(lambda i, n: f(i, n, True))(idx, nums))


def test_bsa_forward_valid_traced_metadata_pass():
    q, idx = _bsa_inputs()
    nums = jnp.full((1, 2, 4), 3, jnp.int32)
    kw = dict(q2k_block_nums=nums, sparse_block_size=64, backend="reference")
    got = jax.jit(lambda i: block_sparse_attention_forward(q, q, q, i, debug_checks=True, **kw))(idx)
    want = block_sparse_attention_forward(q, q, q, idx, **kw)
    np.testing.assert_array_equal(np.asarray(got[0]), np.asarray(want[0]))


def test_debug_checks_must_be_bool():
    with pytest.raises(TypeError, match="debug_checks must be a bool"):
        _hstu(jnp.asarray([0, 40], jnp.int32), debug_checks="yes")


def test_debug_checks_takes_a_numpy_bool_like_the_other_flags():
    """np.bool_ is accepted (as for causal, pack_gqa, deterministic); a rejected value is
    named by its repr, not by a type name that reads as 'bool'."""
    cu = jnp.asarray([0, 20, 40], jnp.int32)
    want = _hstu(cu)
    np.testing.assert_array_equal(np.asarray(_hstu(cu, debug_checks=np.True_)), np.asarray(want))
    q, idx = _bsa_inputs()
    block_sparse_attention(q, q, q, idx, 3, sparse_block_size=64, debug_checks=np.False_)
    with pytest.raises(TypeError, match=r"debug_checks must be a bool, got 1 \(int\)"):
        _hstu(cu, debug_checks=1)


def test_eager_vmap_bad_metadata_raise_the_validator_value_error():
    """Batched by an eager jax.vmap (no jit), the run-time check runs at once: the
    validator's ValueError itself, with the eager message (the documented behaviour)."""
    good = jnp.asarray([0, 20, 20, 40], jnp.int32)
    bad = jnp.asarray([0, 30, 20, 40], jnp.int32)
    msg = _eager_message(_hstu, bad)
    with pytest.raises(ValueError, match=re.escape(msg)):
        jax.block_until_ready(jax.vmap(lambda c: _hstu(c, debug_checks=True))(
            jnp.stack([good, bad])))
    q, idx = _bsa_inputs()
    bad_idx = np.array(idx)
    bad_idx[0, 1, 3, 0] = 9

    def f(i, debug_checks=False):
        return block_sparse_attention(q, q, q, i, 2, sparse_block_size=64,
                                      backend="reference", debug_checks=debug_checks)

    msg = _eager_message(f, jnp.asarray(bad_idx))
    with pytest.raises(ValueError, match=re.escape(msg)):
        jax.block_until_ready(jax.vmap(lambda i: f(i, True))(
            jnp.stack([idx, jnp.asarray(bad_idx)])))
