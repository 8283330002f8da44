"""GPU: the sm90ws block-sparse backward with ``bsa_bwd_ws=dqalias`` where the default stages
the dQ slices in a staging tile of their own (blk 128, or D = 64): with ``dqalias`` they are
staged in the step's Q / dO stage once every consumer warp's GEMMs have read it, and dQ = dS K
is issued after the dV / dK GEMMs. The sm90ws backward cases of ``tests/test_gpu_bsa.py`` on
those shapes (NaN in unlisted blocks and past block_sizes, every KV block listed, GQA, empty
rows, outputs poisoned by an all-NaN run) and their deterministic cases (5 runs bitwise equal),
against the float32 reference (5x the input-dtype error). The default (own staging tile) runs
in ``tests/test_gpu_bsa.py``.

Run on the H200: ``python -m pytest -m gpu tests/test_gpu_bsa_dqalias.py``.
"""

from __future__ import annotations

import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import test_gpu_bsa as tb  # noqa: E402
from jax_sparse_attn.config import Switches, from_env  # noqa: E402

pytestmark = pytest.mark.gpu

ALIAS = Switches(bsa_bwd_impl="sm90ws", bsa_bwd_ws="dqalias")
CASES = [c for c in tb.BWD_WS_CASES if not (c["blk"] == 64 and c["d"] == 128)]
DET = [c for c in tb.DET_CASES if not (c["blk"] == 64 and c["d"] == 128)]


def _check_key(c, switches, **kw):
    from jax_sparse_attn.ffi import bsa as fb

    key = fb.bwd_config(jnp.dtype(c["dtype"]), c["d"], c["blk"], False, switches, **kw)
    # the default on these shapes stages dQ in its own tile: the switch changes the kernel
    default = fb.bwd_config(jnp.dtype(c["dtype"]), c["d"], c["blk"], False,
                            Switches(bsa_bwd_impl="sm90ws"), **kw)
    assert key.ws_dq_alias and key.ws_dq_late and not default.ws_dq_alias, (key, default)


@pytest.mark.parametrize("c", CASES, ids=lambda c: c["name"])
def test_bsa_bwd_dqalias(c, monkeypatch):
    _check_key(c, ALIAS)
    monkeypatch.setattr(tb, "BWDWS", ALIAS)
    tb.test_bsa_sm90ws_backward(c)


@pytest.mark.parametrize("c", DET, ids=lambda c: c["name"])
def test_bsa_bwd_dqalias_deterministic(c, monkeypatch):
    monkeypatch.setenv("JAX_SPARSE_ATTN_BSA_BWD_WS", "dqalias")
    _check_key(c, from_env(), deterministic=True)
    tb.test_bsa_bwd_deterministic(c, monkeypatch)
