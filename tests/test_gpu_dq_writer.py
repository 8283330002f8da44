"""GPU: the non-deterministic Hopper backwards with the dQ writer warp (``Switches.dq_writer``
``"on"``, ``JAX_SPARSE_ATTN_DQ_WRITER=on``; the default ``"auto"`` uses it in the block-sparse
backward and the HSTU one at D = 256: warp 1 of the producer warpgroup issues every step's bulk
reductions of the staged dQ and, where dQ is staged in the step's Q / dO stage, hands the
stage back to the producer; the consumer warpgroups stage and go on). The HSTU sm90 backward
batches of ``tests/test_gpu_hstu.py`` at every head dim (D = 256 stages in the Q / dO stage;
zero-length sequences, sequences ending inside a tile, causal / local / full masks,
NaN-poisoned rows past the end whose gradients must be zero) and its GQA cases (the writer
walks the query heads of the group) with ``"on"``; the sm90ws block-sparse backward cases of
``tests/test_gpu_bsa.py`` (NaN in unlisted blocks and past block_sizes, GQA, empty rows, all
blocks listed, outputs poisoned by an all-NaN run) and the HSTU D = 256 batches with ``"off"``
(their default files run ``"auto"``, i.e. with the writer), and blk 128 with ``dqalias`` and
the writer; against the float32 reference (5x the input-dtype error; 2x for the GQA forward).
Larger batches run with several seeds.

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

WRITER_BSA = Switches(bsa_bwd_impl="sm90ws", dq_writer="on")


@pytest.fixture
def _writer_switches(monkeypatch):
    """test_gpu_hstu builds its Switches itself: add dq_writer="on" to them (and to the
    environment, for the cases that take the defaults)."""
    monkeypatch.setattr(th, "Switches", functools.partial(Switches, dq_writer="on"))
    monkeypatch.setenv("JAX_SPARSE_ATTN_DQ_WRITER", "on")
    assert from_env().dq_writer == "on"


@pytest.mark.parametrize("name,lens,d,window,dtype", th.BWD_BATCHES,
                         ids=[c[0] for c in th.BWD_BATCHES])
@pytest.mark.parametrize("poison", [False, True], ids=["clean", "poisoned"])
def test_hstu_bwd_dq_writer(name, lens, d, window, dtype, poison, _writer_switches):
    from jax_sparse_attn.ffi import hstu as fh

    key = fh.bwd_config(dtype, d, d, 0, Switches(hstu_bwd_dq="tile", dq_writer="on"))
    assert key.impl == "sm90" and key.dq_tile and key.dq_writer, key
    # the default ("auto") uses it at D = 256 only
    assert fh.bwd_config(dtype, d, d, 0, Switches(hstu_bwd_dq="tile")).dq_writer == (d > 128)
    # (lens "canonical": _bwd_case builds the canonical jagged batch)
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


WGHAND_BATCHES = [c for c in th.BWD_BATCHES if c[2] <= 128]


@pytest.mark.parametrize("name,lens,d,window,dtype", WGHAND_BATCHES,
                         ids=[c[0] for c in WGHAND_BATCHES])
@pytest.mark.parametrize("poison", [False, True], ids=["clean", "poisoned"])
def test_hstu_bwd_wghand(name, lens, d, window, dtype, poison, _writer_switches):
    """hstu_bwd_ws "wghand" with the writer (D <= 128): warp 1 takes each consumer
    warpgroup's half of the staged dQ tile on that warpgroup's own barriers."""
    from jax_sparse_attn.ffi import hstu as fh

    key = fh.bwd_config(dtype, d, d, 0, Switches(hstu_bwd_dq="tile", dq_writer="on",
                                                 hstu_bwd_ws=("wghand",)))
    assert key.impl == "sm90" and key.dq_writer and key.wg_hand, key
    th._bwd_case(lens, d, window, seed=10, poison=poison, impl="sm90", dtype=dtype, dq="tile",
                 ws=("wghand",))


@pytest.mark.parametrize("seed", [31, 32])
def test_hstu_bwd_wghand_long(seed, _writer_switches):
    """wghand on longer causal sequences (many query tiles per KV tile) and with wgskip."""
    lens = [1500, 0, 1023, 4097, 17]
    th._bwd_case(lens, 128, (-1, 0), seed=seed, poison=True, impl="sm90", dtype="bfloat16",
                 dq="tile", ws=("wghand",) + (("wgskip",) if seed == 32 else ()))


WGHAND_GQA = [c for c in th.GQA_CASES if c[2] <= 128]


@pytest.mark.parametrize("name,lens,d,ratio,window", WGHAND_GQA, ids=[c[0] for c in WGHAND_GQA])
def test_hstu_gqa_wghand(name, lens, d, ratio, window, _writer_switches, monkeypatch):
    """wghand with GQA (the writer walks the query heads of the group); the cases take the
    switches from the environment."""
    from jax_sparse_attn.ffi import hstu as fh

    monkeypatch.setenv("JAX_SPARSE_ATTN_HSTU_BWD_WS", "wghand")
    assert fh.bwd_config("bfloat16", d, d, 0, from_env()).wg_hand
    lens_k = [300, 900, 64, 1000] if name.endswith("lq-lt-lk") else None
    th._gqa_case(lens, d, ratio, window, seed=51 + ratio, poison=True, lens_k=lens_k)


@pytest.mark.parametrize("c", tb.BWD_WS_CASES, ids=lambda c: c["name"])
def test_bsa_bwd_no_dq_writer(c, monkeypatch):
    """dq_writer="off": each consumer warp adds its own slice (tests/test_gpu_bsa.py runs the
    default, with the writer)."""
    from jax_sparse_attn.ffi import bsa as fb

    off = Switches(bsa_bwd_impl="sm90ws", dq_writer="off")
    key = fb.bwd_config(jnp.dtype(c["dtype"]), c["d"], c["blk"], False, off)
    assert key.impl == "sm90ws" and key.dq_tile and not key.dq_writer, key
    assert fb.bwd_config(jnp.dtype(c["dtype"]), c["d"], c["blk"], False, WRITER_BSA).dq_writer
    monkeypatch.setattr(tb, "BWDWS", off)
    tb.test_bsa_sm90ws_backward(c)


D256_BATCHES = [c for c in th.BWD_BATCHES if c[2] == 256]


@pytest.mark.parametrize("name,lens,d,window,dtype", D256_BATCHES,
                         ids=[c[0] for c in D256_BATCHES])
@pytest.mark.parametrize("poison", [False, True], ids=["clean", "poisoned"])
def test_hstu_bwd_d256_no_dq_writer(name, lens, d, window, dtype, poison, monkeypatch):
    """D = 256 with dq_writer="off" (each consumer warp adds its slice and waits until it is
    read before the stage goes back; tests/test_gpu_hstu_bwd_d256.py runs the default)."""
    from jax_sparse_attn.ffi import hstu as fh

    off = functools.partial(Switches, dq_writer="off")
    assert not fh.bwd_config(dtype, d, d, 0, off(hstu_bwd_dq="tile")).dq_writer
    monkeypatch.setattr(th, "Switches", off)
    th._bwd_case(lens, d, window, seed=9, poison=poison, impl="sm90", dtype=dtype, dq="tile")


@pytest.mark.parametrize("c", [c for c in tb.BWD_WS_CASES if c["blk"] == 128],
                         ids=lambda c: c["name"])
def test_bsa_bwd_dq_writer_dqalias(c, monkeypatch):
    """blk 128 with the dQ slices staged in the Q / dO stage (warp 1 releases the stage)."""
    from jax_sparse_attn.ffi import bsa as fb

    sw = Switches(bsa_bwd_impl="sm90ws", bsa_bwd_ws="dqalias", dq_writer="on")
    key = fb.bwd_config(jnp.dtype(c["dtype"]), c["d"], c["blk"], False, sw)
    assert key.ws_dq_alias and key.dq_writer, key
    monkeypatch.setattr(tb, "BWDWS", sw)
    tb.test_bsa_sm90ws_backward(c)
