"""The implementation-switch registry (jax_sparse_attn.config)."""

from __future__ import annotations

import re

import jax.numpy as jnp
import numpy as np
import pytest

import jax_sparse_attn as jsa
from jax_sparse_attn import config

BAD = {"JAX_SPARSE_ATTN_HSTU_FWD_TILE": "128,64", "JAX_SPARSE_ATTN_HSTU_BWD_TILE": "a,b,c",
       "JAX_SPARSE_ATTN_BSA_FWD_MIN_BLOCKS": "-1", "JAX_SPARSE_ATTN_BSA_BWD_MIN_BLOCKS": "two"}


@pytest.mark.parametrize("sw", config.SWITCHES, ids=lambda sw: sw.env)
def test_unknown_switch_value_names_variable_and_allowed_values(sw, monkeypatch):
    bad = BAD.get(sw.env, "sm99")
    allowed = ", ".join(sw.allowed) if isinstance(sw.allowed, tuple) else sw.allowed
    with pytest.raises(ValueError, match=re.escape(sw.env)) as e:
        config.from_env({sw.env: bad})
    text = str(e.value)
    assert bad in text
    if isinstance(sw.allowed, tuple):
        assert all(a in text for a in sw.allowed), text
    else:
        assert "integer" in text, text
    # the public ops read the environment on every call (any backend) and fail the same way
    monkeypatch.setenv(sw.env, bad)
    q = jnp.ones((4, 1, 8), jnp.float32)
    cu = np.array([0, 4], np.int32)
    with pytest.raises(ValueError, match=re.escape(sw.env)):
        jsa.hstu_attention(q, q, q, cu, cu, max_seqlen_q=4, max_seqlen_k=4)
    assert allowed  # the docs table has something to show


def test_from_env_reads_every_switch():
    env = {"JAX_SPARSE_ATTN_HSTU_FWD_IMPL": "sm80", "JAX_SPARSE_ATTN_HSTU_FWD_TILE": "64,64,4",
           "JAX_SPARSE_ATTN_HSTU_BWD_TILE": "64,64,8", "JAX_SPARSE_ATTN_BSA_FWD_IMPL": "sm80",
           "JAX_SPARSE_ATTN_BSA_BWD_IMPL": "sm80", "JAX_SPARSE_ATTN_BSA_PRE_IMPL": "xla",
           "JAX_SPARSE_ATTN_BSA_FWD_Q_IN_REGS": "0", "JAX_SPARSE_ATTN_BSA_FWD_MIN_BLOCKS": "2",
           "JAX_SPARSE_ATTN_BSA_BWD_MIN_BLOCKS": "1", "JAX_SPARSE_ATTN_FORCE_KERNEL": "true"}
    assert set(env) == {sw.env for sw in config.SWITCHES}
    assert config.from_env(env) == config.Switches(
        hstu_fwd_impl="sm80", hstu_fwd_tile=(64, 64, 4), hstu_bwd_tile=(64, 64, 8),
        bsa_fwd_impl="sm80", bsa_bwd_impl="sm80", bsa_pre_impl="xla", bsa_fwd_q_in_regs=False,
        bsa_fwd_min_blocks=2, bsa_bwd_min_blocks=1)
    assert config.force_kernel(env) and not config.force_kernel({})
    assert config.from_env({}) == config.Switches()
    assert config.from_env({"JAX_SPARSE_ATTN_HSTU_FWD_IMPL": ""}) == config.Switches()


@pytest.mark.parametrize("field,value", [("hstu_fwd_impl", "sm99"), ("bsa_pre_impl", None),
                                         ("hstu_fwd_tile", (1, 2)), ("bsa_fwd_q_in_regs", 1),
                                         ("bsa_bwd_min_blocks", -2), ("bsa_fwd_min_blocks", True)])
def test_switches_fields_are_validated(field, value):
    env = next(sw.env for sw in config.SWITCHES if sw.field == field)
    with pytest.raises(ValueError, match=re.escape(env)):
        config.Switches(**{field: value})


def test_public_ops_reject_non_switches():
    q = jnp.ones((4, 1, 8), jnp.float32)
    cu = np.array([0, 4], np.int32)
    with pytest.raises(TypeError, match="switches must be"):
        jsa.hstu_attention(q, q, q, cu, cu, max_seqlen_q=4, max_seqlen_k=4,
                           switches={"hstu_fwd_impl": "sm80"})


def test_docs_table_lists_every_switch():
    import os  # noqa: PLC0415

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "docs", "design.md")) as f:
        text = f.read()
    assert config.switches_table() in text
