"""GPU: the deterministic backwards without the dQ writer warp (``Switches.det_writer``, on by
default; ``JAX_SPARSE_ATTN_DET_WRITER=0``: the consumer warps wait for their turn and add each
query tile's dQ themselves): the deterministic cases of ``tests/test_gpu_hstu.py`` and
``tests/test_gpu_bsa.py`` that run a Hopper kernel with the dQ tile workspace, with the switch
off (those files run them with the writer). Each case runs the gradient five times (bitwise equal) and checks it against the float32
reference (5x the input-dtype error), as the cases of those files do.

Run on the H200: ``python -m pytest -m gpu tests/test_gpu_det_writer.py``.
"""

from __future__ import annotations

import dataclasses

import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import test_gpu_bsa as tb  # noqa: E402
import test_gpu_hstu as th  # noqa: E402
from jax_sparse_attn.config import from_env  # noqa: E402

pytestmark = pytest.mark.gpu

# the HSTU cases on the sm90 backward with the dQ tile workspace (D in {64, 128, 256})
HSTU_CASES = [c for c in th.DET_CASES if c[2] in (64, 128, 256) and c[5] == ""]
HSTU_CASES += [c for c in th.DET_CASES if c[2] == 128 and c[5] == "func"]


@pytest.fixture
def _no_writer(monkeypatch):
    monkeypatch.setenv("JAX_SPARSE_ATTN_DET_WRITER", "0")
    assert not from_env().det_writer


@pytest.mark.parametrize("name,lens,d,window,dtype,extra", HSTU_CASES,
                         ids=[c[0] for c in HSTU_CASES])
def test_hstu_bwd_det_no_writer(name, lens, d, window, dtype, extra, _no_writer):
    from jax_sparse_attn.ffi import hstu as fh

    key = fh.bwd_config(dtype, d, d, 1 if extra == "func" else 0, from_env(),
                        deterministic=True)
    assert key.impl == "sm90" and key.dq_tile and not key.det_writer, key
    th.test_hstu_bwd_deterministic(name, lens, d, window, dtype, extra)


@pytest.mark.parametrize("c", tb.DET_CASES, ids=lambda c: c["name"])
def test_bsa_bwd_det_no_writer(c, monkeypatch, _no_writer):
    """The ordered deterministic backward (``detorder``: the fixed-point dQ, the default,
    always has the writer warp) without the dQ writer warp."""
    from jax_sparse_attn.ffi import bsa as fb

    monkeypatch.setenv("JAX_SPARSE_ATTN_BSA_BWD_WS", "detorder")
    ws = tuple(dict.fromkeys(("detorder",) + (tuple(c["ws"].split(",")) if c.get("ws")
                                                else ())))
    sw = from_env()
    key = fb.bwd_config(jnp.dtype(c["dtype"]), c["d"], c["blk"], False,
                        dataclasses.replace(sw, bsa_bwd_ws=ws), deterministic=True,
                        causal=bool(c.get("causal")))
    assert key.impl == "sm90ws" and key.dq_tile and key.deterministic, key
    assert not key.det_writer, key
    tb.test_bsa_bwd_deterministic(c, monkeypatch)
