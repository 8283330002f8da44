"""GPU: the non-deterministic Hopper backwards with the dQ writer warp (``Switches.dq_writer``,
``JAX_SPARSE_ATTN_DQ_WRITER=1``: warp 1 of the producer warpgroup issues every step's bulk
reductions of the staged dQ and, where dQ is staged in the step's Q / dO stage, hands the
stage back to the producer; the consumer warpgroups stage and go on). The HSTU sm90 backward
batches of ``tests/test_gpu_hstu.py`` at every head dim (D = 256 stages in the Q / dO stage;
zero-length sequences, sequences ending inside a tile, causal / local / full masks,
NaN-poisoned rows past the end whose gradients must be zero) and its GQA cases (the writer
walks the query heads of the group), and the sm90ws block-sparse backward cases of
``tests/test_gpu_bsa.py`` (NaN in unlisted blocks and past block_sizes, GQA, empty rows, all
blocks listed, outputs poisoned by an all-NaN run), against the float32 reference (5x the
input-dtype error; 2x for the GQA forward). Larger batches run with several seeds.

Run on the H200: ``python -m pytest -m gpu tests/test_gpu_dq_writer.py``.
"""

from __future__ import annotations

import functools

import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import test_gpu_bsa as tb  # noqa: E402
import test_gpu_hstu as th  # noqa: E402
from jax_sparse_attn.config import Switches, from_env  # noqa: E402

pytestmark = pytest.mark.gpu

WRITER_BSA = Switches(bsa_bwd_impl="sm90ws", dq_writer=True)


@pytest.fixture
def _writer_switches(monkeypatch):
    """test_gpu_hstu builds its Switches itself: add dq_writer=True to them (and to the
    environment, for the cases that take the defaults)."""
    monkeypatch.setattr(th, "Switches", functools.partial(Switches, dq_writer=True))
    monkeypatch.setenv("JAX_SPARSE_ATTN_DQ_WRITER", "1")
    assert from_env().dq_writer


@pytest.mark.parametrize("name,lens,d,window,dtype", th.BWD_BATCHES,
                         ids=[c[0] for c in th.BWD_BATCHES])
@pytest.mark.parametrize("poison", [False, True], ids=["clean", "poisoned"])
def test_hstu_bwd_dq_writer(name, lens, d, window, dtype, poison, _writer_switches):
    from jax_sparse_attn.ffi import hstu as fh

    key = fh.bwd_config(dtype, d, d, 0, Switches(hstu_bwd_dq="tile", dq_writer=True))
    assert key.impl == "sm90" and key.dq_tile and key.dq_writer, key
    assert not fh.bwd_config(dtype, d, d, 0, Switches(hstu_bwd_dq="tile")).dq_writer
    if lens == "canonical":
        from benchmarks._grids import canonical_jagged_lengths

        lens = canonical_jagged_lengths()
    th._bwd_case(lens, d, window, seed=9, poison=poison, impl="sm90", dtype=dtype, dq="tile")


@pytest.mark.parametrize("seed", [21, 22, 23])
@pytest.mark.parametrize("d", [128, 256])
def test_hstu_bwd_dq_writer_seeds(seed, d, _writer_switches):
    """Longer causal sequences (many query tiles per KV tile, both Q / dO stages reused many
    times), several seeds."""
    lens = [1500, 0, 1023, 4097 if d == 128 else 2049, 17]
    th._bwd_case(lens, d, (-1, 0), seed=seed, poison=True, impl="sm90", dtype="bfloat16",
                 dq="tile")


@pytest.mark.parametrize("name,lens,d,ratio,window", th.GQA_CASES,
                         ids=[c[0] for c in th.GQA_CASES])
def test_hstu_gqa_dq_writer(name, lens, d, ratio, window, _writer_switches):
    lens_k = [300, 900, 64, 1000] if name.endswith("lq-lt-lk") else None
    th._gqa_case(lens, d, ratio, window, seed=41 + ratio, poison=True, lens_k=lens_k)


@pytest.mark.parametrize("c", tb.BWD_WS_CASES, ids=lambda c: c["name"])
def test_bsa_bwd_dq_writer(c, monkeypatch):
    from jax_sparse_attn.ffi import bsa as fb

    key = fb.bwd_config(jnp.dtype(c["dtype"]), c["d"], c["blk"], False, WRITER_BSA)
    assert key.impl == "sm90ws" and key.dq_tile and key.dq_writer and not key.det_writer, key
    monkeypatch.setattr(tb, "BWDWS", WRITER_BSA)
    tb.test_bsa_sm90ws_backward(c)


@pytest.mark.parametrize("c", [c for c in tb.BWD_WS_CASES if c["blk"] == 128],
                         ids=lambda c: c["name"])
def test_bsa_bwd_dq_writer_dqalias(c, monkeypatch):
    """blk 128 with the dQ slices staged in the Q / dO stage (warp 1 releases the stage)."""
    from jax_sparse_attn.ffi import bsa as fb

    sw = Switches(bsa_bwd_impl="sm90ws", bsa_bwd_ws="dqalias", dq_writer=True)
    key = fb.bwd_config(jnp.dtype(c["dtype"]), c["d"], c["blk"], False, sw)
    assert key.ws_dq_alias and key.dq_writer, key
    monkeypatch.setattr(tb, "BWDWS", sw)
    tb.test_bsa_sm90ws_backward(c)
