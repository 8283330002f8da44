"""GPU: the sm90ws block-sparse backward with ``bsa_bwd_ws=dqearly`` (dQ = dS K issued with the
dK GEMM, before the dV / dK GEMMs complete; the default issues it after them) where the dQ
slices are staged in the Q / dO stage (blk 64 / D 128): the sm90ws backward cases of
``tests/test_gpu_bsa.py`` that run that path (NaN in unlisted blocks and past block_sizes,
every KV block listed, GQA, outputs poisoned by an all-NaN run) and its deterministic blk 64 /
D 128 case (5 runs bitwise equal), against the float32 reference (5x the input-dtype error).
The default order runs in ``tests/test_gpu_bsa.py``.

Run on the H200: ``python -m pytest -m gpu tests/test_gpu_bsa_dqearly.py``.
"""

from __future__ import annotations

import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import test_gpu_bsa as tb  # noqa: E402
from jax_sparse_attn.config import Switches, from_env  # noqa: E402

pytestmark = pytest.mark.gpu

EARLY = Switches(bsa_bwd_impl="sm90ws", bsa_bwd_ws="dqearly")
CASES = [c for c in tb.BWD_WS_CASES if c["blk"] == 64 and c["d"] == 128]
DET = [c for c in tb.DET_CASES if c["blk"] == 64 and c["d"] == 128]


@pytest.mark.parametrize("c", CASES, ids=lambda c: c["name"])
def test_bsa_bwd_dqearly(c, monkeypatch):
    from jax_sparse_attn.ffi import bsa as fb

    key = fb.bwd_config(jnp.dtype(c["dtype"]), 128, 64, False, EARLY)
    assert key.ws_dq_alias and not key.ws_dq_late, key
    monkeypatch.setattr(tb, "BWDWS", EARLY)
    tb.test_bsa_sm90ws_backward(c)


@pytest.mark.parametrize("c", DET, ids=lambda c: c["name"])
def test_bsa_bwd_dqearly_deterministic(c, monkeypatch):
    from jax_sparse_attn.ffi import bsa as fb

    monkeypatch.setenv("JAX_SPARSE_ATTN_BSA_BWD_WS", "dqearly")
    key = fb.bwd_config(jnp.dtype(c["dtype"]), 128, 64, False, from_env(), deterministic=True)
    assert key.ws_dq_alias and not key.ws_dq_late, key
    tb.test_bsa_bwd_deterministic(c, monkeypatch)
