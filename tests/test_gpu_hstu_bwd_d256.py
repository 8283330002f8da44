"""GPU: the sm90 HSTU backward at D = 256 with both dQ reductions — ``hstu_bwd_dq="tile"`` (the
default: the query-tile workspace, each warp's slice staged in the consumed Q / dO tiles) and
``"red"`` (red.global.add from registers): the D = 256 backward batches of
``tests/test_gpu_hstu.py`` (zero-length sequences, sequences ending inside a tile, causal /
local / full masks, NaN-poisoned rows past the end whose gradients must be zero) and its
deterministic D = 256 case (5 runs bitwise equal), against the float32 reference (5x the
input-dtype error).

Run on the H200: ``python -m pytest -m gpu tests/test_gpu_hstu_bwd_d256.py``.
"""

from __future__ import annotations

import pytest

jax = pytest.importorskip("jax")

import test_gpu_hstu as th  # noqa: E402
from jax_sparse_attn.config import Switches  # noqa: E402

pytestmark = pytest.mark.gpu

D256_BATCHES = [c for c in th.BWD_BATCHES if c[2] == 256]
D256_DET = [c for c in th.DET_CASES if c[2] == 256]


@pytest.mark.parametrize("name,lens,d,window,dtype", D256_BATCHES,
                         ids=[c[0] for c in D256_BATCHES])
@pytest.mark.parametrize("poison", [False, True], ids=["clean", "poisoned"])
@pytest.mark.parametrize("dq", ["tile", "red"])
def test_hstu_bwd_d256_batches(name, lens, d, window, dtype, poison, dq):
    from jax_sparse_attn.ffi import hstu as fh

    assert fh.bwd_config(dtype, d, d, 0, Switches(hstu_bwd_dq=dq)).dq_tile == (dq == "tile")
    th._bwd_case(lens, d, window, seed=9, poison=poison, impl="sm90", dtype=dtype, dq=dq)


@pytest.mark.parametrize("name,lens,d,window,dtype,extra", D256_DET,
                         ids=[c[0] for c in D256_DET])
@pytest.mark.parametrize("dq", ["tile", "red"])
def test_hstu_bwd_d256_deterministic(name, lens, d, window, dtype, extra, dq, monkeypatch):
    monkeypatch.setenv("JAX_SPARSE_ATTN_HSTU_BWD_DQ", dq)
    th.test_hstu_bwd_deterministic(name, lens, d, window, dtype, extra)
