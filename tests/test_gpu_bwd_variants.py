"""GPU: backward variants against the float32 reference (5x the input-dtype error), with NaN
poisoned tails / unlisted blocks and partial blocks, as the default paths' tests:

* the wait of the dP^T GEMM in its own basic block (``hstu_bwd_ws=splitwait``,
  ``bsa_bwd_ws=splitwait``: the step's Q / dO stage's full barrier is re-checked right
  before that wait, so that ptxas keeps the wait below the score function instead of
  hoisting it above; the block-sparse one also masks and converts P^T before the wait);
* dK / dV stored one 2-byte store per value (``epi16``; by default they go out as packed
  pairs of adjacent columns, 4-byte stores), at every head dim, with key rows past the
  sequence / past S_kv not written.

Run on the H200: ``python -m pytest -m gpu tests/test_gpu_bwd_variants.py``.
"""

from __future__ import annotations

import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import test_gpu_bsa as tb  # noqa: E402
import test_gpu_hstu as th  # noqa: E402
from jax_sparse_attn.config import Switches  # noqa: E402

pytestmark = pytest.mark.gpu

# the HSTU backward batches at the head dims with 64-query tiles (D = 128, 256), where the
# SiLU of S^T runs during the dP^T GEMM
HSTU_CASES = [c for c in th.BWD_BATCHES if c[2] in (128, 256)]


@pytest.mark.parametrize("name,lens,d,window,dtype", HSTU_CASES, ids=[c[0] for c in HSTU_CASES])
@pytest.mark.parametrize("poison", [False, True], ids=["clean", "poisoned"])
def test_hstu_bwd_splitwait(name, lens, d, window, dtype, poison):
    from jax_sparse_attn.ffi import hstu as fh

    sw = Switches(hstu_bwd_ws="splitwait")
    assert fh.bwd_config(dtype, d, d, 0, sw).split_wait
    assert not fh.bwd_config(dtype, 64, 64, 0, sw).split_wait  # 128-query tiles: no overlap
    th._bwd_case(lens, d, window, seed=11, poison=poison, impl="sm90", dtype=dtype, dq="tile",
                 ws=("splitwait",))


SPLIT = Switches(bsa_bwd_impl="sm90ws", bsa_bwd_ws="splitwait")


@pytest.mark.parametrize("c", tb.BWD_WS_CASES, ids=lambda c: c["name"])
def test_bsa_bwd_splitwait(c, monkeypatch):
    from jax_sparse_attn.ffi import bsa as fb

    key = fb.bwd_config(jnp.dtype(c["dtype"]), c["d"], c["blk"], False, SPLIT)
    assert key.ws_split_wait, key
    monkeypatch.setattr(tb, "BWDWS", SPLIT)
    tb.test_bsa_sm90ws_backward(c)


@pytest.mark.parametrize("c", tb.DET_CASES, ids=lambda c: c["name"])
def test_bsa_bwd_splitwait_deterministic(c, monkeypatch):
    monkeypatch.setenv("JAX_SPARSE_ATTN_BSA_BWD_WS", "splitwait")
    tb.test_bsa_bwd_deterministic(c, monkeypatch)


@pytest.mark.parametrize("name,lens,d,window,dtype", th.BWD_BATCHES,
                         ids=[c[0] for c in th.BWD_BATCHES])
def test_hstu_bwd_epi16(name, lens, d, window, dtype):
    from jax_sparse_attn.ffi import hstu as fh

    assert fh.bwd_config(dtype, d, d, 0, Switches()).epi_pairs
    assert not fh.bwd_config(dtype, d, d, 0, Switches(hstu_bwd_ws="epi16")).epi_pairs
    th._bwd_case(lens, d, window, seed=13, poison=True, impl="sm90", dtype=dtype, dq="tile",
                 ws=("epi16",))


EPI = Switches(bsa_bwd_impl="sm90ws", bsa_bwd_ws="epi16")


@pytest.mark.parametrize("c", tb.BWD_WS_CASES, ids=lambda c: c["name"])
def test_bsa_bwd_epi16(c, monkeypatch):
    from jax_sparse_attn.ffi import bsa as fb

    key = fb.bwd_config(jnp.dtype(c["dtype"]), c["d"], c["blk"], False, EPI)
    assert not key.ws_epi_pairs, key
    monkeypatch.setattr(tb, "BWDWS", EPI)
    tb.test_bsa_sm90ws_backward(c)
