"""GPU: backward variants against the float32 reference (5x the input-dtype error), with NaN
poisoned tails / unlisted blocks and partial blocks, as the default paths' tests:

* the wait of the dP^T GEMM in its own basic block (``hstu_bwd_ws=splitwait``,
  ``bsa_bwd_ws=splitwait``: the step's Q / dO stage's full barrier is re-checked right
  before that wait, so that ptxas keeps the wait below the score function instead of
  hoisting it above; the block-sparse one also masks and converts P^T before the wait);
* dK / dV stored from registers (``epiregs``: packed pairs of adjacent columns, 4-byte
  stores; ``epi16``: one 2-byte store per value; by default they are staged in shared memory
  and written in 16-byte row pieces), at every head dim, with key rows past the sequence /
  past S_kv not written;
* the block-sparse blk 128 backward with ``bsa_bwd_ws=dqalt`` (the consumer warpgroups take
  turns computing a step's whole dQ tile);
* the block-sparse backward with ``bsa_bwd_ws=dqclaim`` (the first contribution to each
  query tile claimed with an atomic and stored, no zeroed workspace).
* the block-sparse blk 128 backward with ``bsa_bwd_ws=dklag`` (a step's dK GEMM issued in
  the next step, after its S^T / dP^T GEMMs), on the sm90ws cases and the causal cases;
  likewise with ``bsa_bwd_ws=sahead`` (the second 64-row step of a list entry issues its
  S^T / dP^T GEMMs while the first step's dK GEMM may still run).

* the deterministic HSTU backward with ``hstu_bwd_ws=detzero`` (XLA zeroes the fp32
  workspace and every KV tile adds; by default the first KV tile in a query tile's order
  stores its dQ, which ``tests/test_gpu_hstu.py`` covers): the deterministic cases (5 runs
  bitwise equal, both modes against the reference); and the default deterministic backward
  with the workspace filled with NaN before the kernel, on batches where query tiles get no
  contribution (sequences without keys, L_q > L_k under a local window, func masks with
  empty intervals): their dq rows must be 0;
* the default-mode HSTU backward with ``hstu_bwd_ws=dqclaim`` (the writer warp claims each
  query tile; the first claimer stores, the others add once that store is complete; the
  workspace is not zeroed): the backward batches with NaN-poisoned tails, and the batches
  with uncovered query tiles on a NaN-filled workspace;
* the default mode's workspace zeroed by the tile-schedule launch, filled with NaN before
  that launch (batches without func masks, the canonical batch at D = 64 / 128);
* ``hstu_bwd_ws=convert=N`` (the last CTA of a sequence and KV head writes the dq of a
  sequence with at most N queries; the reordering kernel the others): the backward batches
  (N = 128: both paths in one batch), with ``dqclaim`` on a NaN-filled workspace, grouped KV
  heads.

Run on the H200: ``python -m pytest -m gpu tests/test_gpu_bwd_variants.py``.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import test_gpu_bsa as tb  # noqa: E402
import test_gpu_bsa_causal as tc  # noqa: E402
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


@pytest.mark.parametrize("name,lens,d,window,dtype", th.BWD_BATCHES,
                         ids=[c[0] for c in th.BWD_BATCHES])
@pytest.mark.parametrize("poison", [False, True], ids=["clean", "poisoned"])
def test_hstu_bwd_qprobe(name, lens, d, window, dtype, poison):
    """``hstu_bwd_ws=qprobe``: each step tests the next step's Q / dO stage after its dQ
    staging stores and skips its wait where the test passed; the backward batches (every
    head dim, masks, lengths) with the dQ tile workspace against the reference."""
    from jax_sparse_attn.ffi import hstu as fh

    # (D 256 stages dQ in the step's Q / dO stage: no test there, the default kernel)
    assert fh.bwd_config(dtype, d, d, 0, Switches(hstu_bwd_impl="sm90", hstu_bwd_dq="tile",
                                                  hstu_bwd_ws="qprobe")).q_probe == (d <= 128)
    th._bwd_case(lens, d, window, seed=13, poison=poison, impl="sm90", dtype=dtype, dq="tile",
                 ws=("qprobe",))


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


@pytest.mark.parametrize("epi", ["epi16", "epiregs"])
@pytest.mark.parametrize("name,lens,d,window,dtype", th.BWD_BATCHES,
                         ids=[c[0] for c in th.BWD_BATCHES])
def test_hstu_bwd_epi_from_registers(name, lens, d, window, dtype, epi):
    from jax_sparse_attn.ffi import hstu as fh

    key = fh.bwd_config(dtype, d, d, 0, Switches(hstu_bwd_ws=epi))
    assert not key.epi_smem and key.epi_pairs is (epi == "epiregs"), key
    th._bwd_case(lens, d, window, seed=13, poison=True, impl="sm90", dtype=dtype, dq="tile",
                 ws=(epi,))


@pytest.mark.parametrize("epi", ["epi16", "epiregs"])
@pytest.mark.parametrize("c", tb.BWD_WS_CASES, ids=lambda c: c["name"])
def test_bsa_bwd_epi_from_registers(c, epi, monkeypatch):
    from jax_sparse_attn.ffi import bsa as fb

    sw = Switches(bsa_bwd_impl="sm90ws", bsa_bwd_ws=epi)
    key = fb.bwd_config(jnp.dtype(c["dtype"]), c["d"], c["blk"], False, sw)
    assert not key.ws_epi_smem and key.ws_epi_pairs is (epi == "epiregs"), key
    monkeypatch.setattr(tb, "BWDWS", sw)
    tb.test_bsa_sm90ws_backward(c)


DQALT_CASES = [c for c in tb.BWD_WS_CASES if c["blk"] == 128]


@pytest.mark.parametrize("c", DQALT_CASES, ids=lambda c: c["name"])
def test_bsa_bwd_dqalt(c, monkeypatch):
    """``bsa_bwd_ws=dqalt``: the blk 128 consumer warpgroups take turns computing a step's
    whole dQ tile (the other one does not wait for the step's dS)."""
    from jax_sparse_attn.ffi import bsa as fb

    sw = Switches(bsa_bwd_impl="sm90ws", bsa_bwd_ws="dqalt")
    key = fb.bwd_config(jnp.dtype(c["dtype"]), c["d"], c["blk"], False, sw)
    assert key.ws_dq_alt and key.dq_writer and not key.ws_dq_alias, key
    assert not fb.bwd_config(jnp.dtype(c["dtype"]), c["d"], c["blk"], False, sw,
                             deterministic=True).ws_dq_alt
    monkeypatch.setattr(tb, "BWDWS", sw)
    tb.test_bsa_sm90ws_backward(c)


@pytest.mark.parametrize("c", tb.BWD_WS_CASES, ids=lambda c: c["name"])
def test_bsa_bwd_dqclaim(c, monkeypatch):
    """``bsa_bwd_ws=dqclaim``: the dQ writer warp claims each query tile with an atomic add;
    the first claimer stores its dQ, the others add once that store is complete; the
    workspace is not zeroed and tiles without a contribution (empty rows, rows past the
    listed blocks) come out as zeros through the reordering kernel's flag check."""
    from jax_sparse_attn.ffi import bsa as fb

    sw = Switches(bsa_bwd_impl="sm90ws", bsa_bwd_ws="dqclaim")
    key = fb.bwd_config(jnp.dtype(c["dtype"]), c["d"], c["blk"], False, sw)
    assert key.dq_claim and key.dq_writer, key
    monkeypatch.setattr(tb, "BWDWS", sw)
    tb.test_bsa_sm90ws_backward(c)


# zerolag: the sm90ws cases, plus more (batch, KV head) pairs than the lag (the writer warps
# zero the workspace of all but the first two) with a pair's KV blocks over two waves
ZEROLAG_CASES = tb.BWD_WS_CASES + [
    dict(name="zerolag-9pairs-blk64-d128-2waves", blk=64, d=128, dtype="bfloat16",
         layout="bhsd", b=3, hq=6, hkv=3, sq=300, skv=12800, mode="last"),
    dict(name="zerolag-16pairs-blk128-d64-empty", blk=128, d=64, dtype="float16",
         layout="bshd", b=1, hq=16, hkv=16, sq=1000, skv=2048, mode="last-empty"),
]


@pytest.mark.parametrize("c", ZEROLAG_CASES, ids=lambda c: c["name"])
def test_bsa_bwd_zerolag(c, monkeypatch):
    """``bsa_bwd_ws=zerolag``: the preprocessing zeroes the first two (batch, KV head) pairs'
    dQ workspace and the writer warps of pair ``p``'s CTAs the workspace of pair ``p + 2``,
    each pair's writers waiting for that count; the all-NaN run before the checked one
    leaves NaN in the workspace buffer, so a tile left unzeroed makes dq NaN."""
    from jax_sparse_attn.ffi import bsa as fb

    sw = Switches(bsa_bwd_impl="sm90ws", bsa_bwd_ws="zerolag")
    key = fb.bwd_config(jnp.dtype(c["dtype"]), c["d"], c["blk"], False, sw)
    assert key.zero_lag == fb.ZERO_LAG and key.dq_writer, key
    monkeypatch.setattr(tb, "BWDWS", sw)
    tb.test_bsa_sm90ws_backward(c)


@pytest.mark.parametrize("ws", ["tailconv", "zerolag,tailconv", "zerolag,nolpt",
                                "tailconv,lpt", "nolpt", "notailconv", "notailconv,nolpt"])
@pytest.mark.parametrize("c", ZEROLAG_CASES, ids=lambda c: c["name"])
def test_bsa_bwd_tailconv(c, ws, monkeypatch):
    """``tailconv`` (the default; alone, with zerolag, with lpt, whose CTAs take the KV
    blocks longest list first across pairs, so each CTA counts the pair it was remapped to,
    with hlpt, longest first within each pair (the default order), and in grid order
    (``nolpt``); ``notailconv`` the reordering after the backward, also in grid order):
    the dq reordering starts once the backward's last CTA has started, each of its CTAs
    waiting for its (batch, KV head) pair's count of completed backward CTAs; dq (allocated
    by the backward's call, NaN left in reused buffers by the all-NaN run first) must come
    out complete."""
    from jax_sparse_attn.ffi import bsa as fb

    sw = Switches(bsa_bwd_impl="sm90ws", bsa_bwd_ws=tuple(ws.split(",")))
    key = fb.bwd_config(jnp.dtype(c["dtype"]), c["d"], c["blk"], False, sw)
    opts = set(ws.split(","))
    assert key.tail_conv == ("notailconv" not in opts) and key.dq_writer, key
    assert key.ws_lpt == ("nolpt" not in opts), key
    assert key.ws_lpt_chain == (not {"lpt", "nolpt"} & opts), key
    monkeypatch.setattr(tb, "BWDWS", sw)
    tb.test_bsa_sm90ws_backward(c)


# the blk 128 cases of the warp-specialized backward for its persistent grid, plus more KV
# blocks (376 work items of varied list lengths, empty lists among them) than the H200 has SMs
PERSIST_CASES = [c for c in ZEROLAG_CASES if c["blk"] == 128] + [
    dict(name="persist-376items-blk128-d128-varied", blk=128, d=128, dtype="bfloat16",
         layout="bshd", b=2, hq=8, hkv=4, sq=4096, skv=6000, mode="varied"),
]


@pytest.mark.parametrize("ws", ["persist", "persist,epiregs", "persist,persistkv=0",
                                "persist,nolpt", "persist,lpt"])
@pytest.mark.parametrize("c", PERSIST_CASES, ids=lambda c: c["name"])
def test_bsa_bwd_persist(c, ws, monkeypatch):
    """``persist`` (opt-in, blk 128): one CTA per SM takes the KV blocks as work items from an
    atomic counter (in the hlpt order, lpt's or grid order), loads an item's first Q / dO
    stages and then its K / V while the previous item ends, and stages dK / dV in the K / V
    and dS tiles (``epiregs``: stores them from registers and frees K / V before); an empty
    item writes zero dK / dV. Gradients against the reference, poisoned buffers first."""
    from jax_sparse_attn import metadata
    from jax_sparse_attn.ffi import bsa as fb

    if ws != "persist" and c["name"] not in ("persist-376items-blk128-d128-varied",
                                             "zerolag-16pairs-blk128-d64-empty"):
        pytest.skip("the variants run on the two cases with more items than CTAs")
    sw = Switches(bsa_bwd_impl="sm90ws", bsa_bwd_ws=tuple(ws.split(",")))
    key = fb.bwd_config(jnp.dtype(c["dtype"]), c["d"], c["blk"], False, sw)
    assert key.ws_persist == metadata.num_sms() and key.tail_conv, key
    monkeypatch.setattr(tb, "BWDWS", sw)
    tb.test_bsa_sm90ws_backward(c)


@pytest.mark.parametrize("ws", ["wghand", "wghand,persist", "wghand,zerolag", "nowghand"])
@pytest.mark.parametrize("c", PERSIST_CASES, ids=lambda c: c["name"])
def test_bsa_bwd_wghand(c, ws, monkeypatch):
    """``wghand`` (the default at blk 128 with the dQ writer warp): the writer warp takes each
    consumer warpgroup's half of the staged dQ on its own (its own named barriers) and hands
    it back once read; alone, with the persistent grid and with zerolag; ``nowghand`` (one
    barrier pair over both warpgroups). Gradients against the reference, poisoned buffers
    first."""
    from jax_sparse_attn.ffi import bsa as fb

    if ws not in ("wghand", "nowghand") and c["name"] not in (
            "persist-376items-blk128-d128-varied", "zerolag-16pairs-blk128-d64-empty"):
        pytest.skip("the variants run on the two cases with more items than CTAs")
    sw = Switches(bsa_bwd_impl="sm90ws", bsa_bwd_ws=tuple(ws.split(",")))
    key = fb.bwd_config(jnp.dtype(c["dtype"]), c["d"], c["blk"], False, sw)
    assert key.ws_wg_hand == ("nowghand" not in ws) and key.dq_writer, key
    monkeypatch.setattr(tb, "BWDWS", sw)
    tb.test_bsa_sm90ws_backward(c)


@pytest.mark.parametrize("c", ZEROLAG_CASES, ids=lambda c: c["name"])
def test_bsa_bwd_ldscale(c, monkeypatch):
    """``ldscale`` (opt-in): XLA scales lse by log2 e and delta by softmax_scale before the
    kernel, which then takes one FFMA per score for P^T and one FFMA and one FMUL for dS^T.
    The sm90ws backward cases (blk 64 and 128, GQA, empty rows, NaN past the valid keys)
    against the reference, poisoned buffers first (lse cotangents: tests/test_gpu_fuzz.py
    with JAX_SPARSE_ATTN_BSA_BWD_WS=ldscale)."""
    from jax_sparse_attn.ffi import bsa as fb

    sw = Switches(bsa_bwd_impl="sm90ws", bsa_bwd_ws=("ldscale",))
    key = fb.bwd_config(jnp.dtype(c["dtype"]), c["d"], c["blk"], False, sw)
    assert key.ws_ld_scaled, key
    monkeypatch.setattr(tb, "BWDWS", sw)
    tb.test_bsa_sm90ws_backward(c)


@pytest.mark.parametrize("c", ZEROLAG_CASES, ids=lambda c: c["name"])
def test_bsa_bwd_dvwait(c, monkeypatch):
    """``dvwait`` (opt-in): each step issues dQ, waits for the dV GEMM, then issues dK. The
    sm90ws backward cases where it applies (not the dQ alias of blk 64 / D 128) against the
    reference, poisoned buffers first."""
    from jax_sparse_attn.ffi import bsa as fb

    sw = Switches(bsa_bwd_impl="sm90ws", bsa_bwd_ws=("dvwait",))
    key = fb.bwd_config(jnp.dtype(c["dtype"]), c["d"], c["blk"], False, sw)
    if not key.ws_dv_wait:
        assert key.ws_dq_alias, key
        pytest.skip("the dQ alias (blk 64, D 128) issues dK before dQ")
    monkeypatch.setattr(tb, "BWDWS", sw)
    tb.test_bsa_sm90ws_backward(c)


# the sm90ws backward cases at blk 128, where dklag applies
DKLAG_CASES = [c for c in ZEROLAG_CASES if c["blk"] == 128]


#: the blk 128 step-order flags and the compile-key field each sets: ``dklag`` (each step
#: issues the previous step's dK GEMM after its own S^T / dP^T GEMMs, the block's last dK
#: after its last step), ``sahead`` (the first 64-row step of a list entry ends with its dK
#: GEMM in flight; the second step's S^T / dP^T GEMMs go behind it and its S^T wait
#: releases the first step's stage), ``entahead`` (the next list entry split at the first
#: step's stage test)
STEP_ORDER_FLAGS = {"dklag": "ws_dk_lag", "sahead": "ws_s_ahead", "entahead": "ws_ent_ahead"}


@pytest.mark.parametrize("flag", STEP_ORDER_FLAGS)
@pytest.mark.parametrize("c", DKLAG_CASES, ids=lambda c: c["name"])
def test_bsa_bwd_step_order(c, flag, monkeypatch):
    """The opt-in step orders of :data:`STEP_ORDER_FLAGS` (blk 128) on the sm90ws backward
    cases at blk 128 (every block listed, the partial last block with NaN past block_sizes
    and in unlisted blocks, GQA, empty rows, S_q ending in a block's first 64 rows) against
    the reference, poisoned buffers first."""
    from jax_sparse_attn.ffi import bsa as fb

    sw = Switches(bsa_bwd_impl="sm90ws", bsa_bwd_ws=tuple(flag.split(",")))
    key = fb.bwd_config(jnp.dtype(c["dtype"]), c["d"], c["blk"], False, sw)
    assert getattr(key, STEP_ORDER_FLAGS[flag]), key
    monkeypatch.setattr(tb, "BWDWS", sw)
    tb.test_bsa_sm90ws_backward(c)


@pytest.mark.parametrize("flag", STEP_ORDER_FLAGS)
@pytest.mark.parametrize("c", [c for c in tc.CASES if c.blk == 128
                               and c.bwd_impl in ("auto", "sm90ws") and not c.bwd_ws], ids=lambda c: c.name)
def test_bsa_bwd_step_order_causal(c, flag):
    """The step orders of :data:`STEP_ORDER_FLAGS` with ``causal`` (masked steps, steps past
    the diagonal, rows without keys, packed GQA rows): the causal blk 128 cases of
    ``test_gpu_bsa_causal`` with the switch."""
    c = dataclasses.replace(c, bwd_ws=flag)
    tc.test_bsa_causal_kernel_vs_reference(c)


#: the step paths the blk 128 default replaces and the compile-key field each clears:
#: ``noqprobe`` (every step waits for its Q / dO stage at its start; the default tests the
#: next step's stage after staging its dQ slice), ``nodqlag`` (both warpgroups compute
#: their dQ halves in the step after a dS^T barrier over both; by default warpgroup 0's
#: is one step late)
STEP_START_FLAGS = {"noqprobe": "ws_q_probe", "nodqlag": "ws_dq_lag"}


@pytest.mark.parametrize("flag", STEP_START_FLAGS)
@pytest.mark.parametrize("c", DKLAG_CASES, ids=lambda c: c["name"])
def test_bsa_bwd_step_start(c, flag, monkeypatch):
    """The step-start paths of :data:`STEP_START_FLAGS` on the sm90ws backward cases at
    blk 128 (every block listed, the partial last block with NaN past block_sizes and in
    unlisted blocks, GQA, empty rows, S_q ending in a block's first 64 rows) against the
    reference, poisoned buffers first."""
    from jax_sparse_attn.ffi import bsa as fb

    sw = Switches(bsa_bwd_impl="sm90ws", bsa_bwd_ws=(flag,))
    key = fb.bwd_config(jnp.dtype(c["dtype"]), c["d"], c["blk"], False, sw)
    assert not getattr(key, STEP_START_FLAGS[flag]), key
    assert getattr(fb.bwd_config(jnp.dtype(c["dtype"]), c["d"], c["blk"], False,
                                 Switches(bsa_bwd_impl="sm90ws")), STEP_START_FLAGS[flag])
    monkeypatch.setattr(tb, "BWDWS", sw)
    tb.test_bsa_sm90ws_backward(c)


@pytest.mark.parametrize("c", ZEROLAG_CASES, ids=lambda c: c["name"])
def test_bsa_bwd_nowguni(c, monkeypatch):
    """``nowguni``: the consumers' warpgroup index from the thread index (the default takes
    it from the warp-uniform warp index); the sm90ws backward cases at blk 64 and 128 (every block listed, NaN past block_sizes and in
    unlisted blocks, GQA, empty rows) against the reference, poisoned buffers first."""
    from jax_sparse_attn.ffi import bsa as fb

    sw = Switches(bsa_bwd_impl="sm90ws", bsa_bwd_ws=("nowguni",))
    assert not fb.bwd_config(jnp.dtype(c["dtype"]), c["d"], c["blk"], False, sw).ws_wg_uniform
    monkeypatch.setattr(tb, "BWDWS", sw)
    tb.test_bsa_sm90ws_backward(c)


@pytest.mark.parametrize("n", [3, 8])
@pytest.mark.parametrize("c", ZEROLAG_CASES, ids=lambda c: c["name"])
def test_bsa_bwd_ex2emu(c, n, monkeypatch):
    """``ex2emu=N``: N of every 8 score columns take exp2 as the polynomial of
    ``kernels.common.exp2_poly3`` (relative error 1.02e-4) instead of MUFU ``ex2``; the
    sm90ws backward cases at blk 64 and 128 (rows past S_q, whose lse is +inf, NaN past
    block_sizes and in unlisted blocks, every block listed, GQA, empty rows) against the
    reference within the usual tolerance, poisoned buffers first."""
    from jax_sparse_attn.ffi import bsa as fb

    sw = Switches(bsa_bwd_impl="sm90ws", bsa_bwd_ws=(f"ex2emu={n}",))
    assert fb.bwd_config(jnp.dtype(c["dtype"]), c["d"], c["blk"], False, sw).ws_ex2_emu == n
    monkeypatch.setattr(tb, "BWDWS", sw)
    tb.test_bsa_sm90ws_backward(c)


@pytest.mark.parametrize("c", ZEROLAG_CASES, ids=lambda c: c["name"])
def test_bsa_bwd_nofdiv(c, monkeypatch):
    """``nofdiv``: the consumers split each K->Q list entry into query head and block with an
    integer division (the default uses a multiplier precomputed per CTA). The sm90ws
    backward cases (GQA 8:1 and 2:1, where the entries span several query heads, every
    block listed, partial blocks with NaN, empty rows) against the reference, poisoned
    buffers first."""
    sw = Switches(bsa_bwd_impl="sm90ws", bsa_bwd_ws=("nofdiv",))
    monkeypatch.setattr(tb, "BWDWS", sw)
    tb.test_bsa_sm90ws_backward(c)


# the deterministic cases on the sm90 backward (no rab)
DETZERO_CASES = [c for c in th.DET_CASES if c[2] in (64, 128, 256) and c[5] in ("", "func")]


@pytest.mark.parametrize("name,lens,d,window,dtype,extra", DETZERO_CASES,
                         ids=[c[0] for c in DETZERO_CASES])
def test_hstu_bwd_detzero_deterministic(name, lens, d, window, dtype, extra, monkeypatch):
    from jax_sparse_attn.config import from_env
    from jax_sparse_attn.ffi import hstu as fh

    monkeypatch.setenv("JAX_SPARSE_ATTN_HSTU_BWD_WS", "detzero")
    key = fh.bwd_config(dtype, d, d, 1 if extra == "func" else 0, from_env(),
                        deterministic=True)
    assert key.det_writer and not key.det_store, key
    th.test_hstu_bwd_deterministic(name, lens, d, window, dtype, extra)


# (name, L_q per sequence, L_k per sequence, D, window, func intervals per sequence or None)
UNCOVERED = [
    # a sequence with queries and no keys; L_q > L_k (bottom-right aligned) under a window:
    # the first query tiles see no key
    ("no-keys-d128", [130, 70, 0, 200], [130, 0, 5, 64], 128, (16, 0), None),
    ("lq-gt-lk-d64", [400, 1, 260], [40, 1, 300], 64, (8, 0), None),
    ("lq-gt-lk-d256", [300, 65], [20, 0], 256, (30, 0), None),
    # func: query rows of the middle third of each sequence see nothing (empty interval)
    ("func-empty-d128", [300, 129, 450], [300, 129, 450], 128, (-1, -1), "middle"),
]


def _unzeroed_case(lq, lk, d, window, func, mode, heads=2, reps=1, seed=5, heads_kv=None,
                   fill=float("nan")):
    """The kernel backward in ``mode`` (``hstu_bwd_ws``; ``det``: deterministic) with the
    fp32 dq workspace filled with ``fill`` before the kernel (NaN: the modes that do not
    zero it; None: as the mode leaves it), ``reps`` times: no NaN anywhere, dq / dk / dv within 5x the input-dtype error of the float32
    reference (so query tiles no KV tile covers come out as zeros, and no contribution is
    lost to a late store), rows past the last sequence zero."""
    from attention_base import check_rule

    from jax_sparse_attn import hstu as hstu_mod
    from jax_sparse_attn import reference
    from jax_sparse_attn.config import Switches
    from jax_sparse_attn.ffi import hstu as fh

    dt = jnp.dtype("bfloat16")
    cq = np.concatenate([[0], np.cumsum(lq)]).astype(np.int32)
    ck = np.concatenate([[0], np.cumsum(lk)]).astype(np.int32)
    tq, tk = int(cq[-1]) + 64, int(ck[-1]) + 64
    ks = jax.random.split(jax.random.PRNGKey(seed), 4)
    q = jax.random.normal(ks[0], (tq, heads, d), jnp.float32).astype(dt)
    do = jax.random.normal(ks[1], (tq, heads, d), jnp.float32).astype(dt)
    k = jax.random.normal(ks[2], (tk, heads_kv or heads, d), jnp.float32).astype(dt)
    v = jax.random.normal(ks[3], (tk, heads_kv or heads, d), jnp.float32).astype(dt)
    fn = None
    if func == "middle":
        # visible keys [0, F0) U [F1, F2): F0 = L_k, F1 = F2 = 0, except the middle third of
        # each sequence, whose rows see nothing (F0 = 0)
        f = np.zeros((1, 3, tq + 256), np.int32)
        for b in range(len(lq)):
            for i in range(lq[b]):
                f[0, 0, cq[b] + i] = 0 if lq[b] // 3 <= i < 2 * lq[b] // 3 else lk[b]
        fn = jnp.asarray(f)
    mq, mk = max(max(lq), 1), max(max(lk), 1)
    kw = dict(max_seqlen_q=mq, max_seqlen_k=mk, scaling_seqlen=float(mq), window_size=window,
              alpha=1.0 / np.sqrt(d))
    sw = Switches(hstu_bwd_ws="" if mode in ("det", "sched") else mode)
    cqj, ckj = jnp.asarray(cq), jnp.asarray(ck)

    def run(do, q, k, v, cq, ck, fn):
        cfg = hstu_mod._make_config(q, k, v, cq, ck, fn, None, None, None, backend="kernel",
                                    switches=sw, op_name="test",
                                    deterministic=mode == "det", **kw)
        assert (cfg.bwd.det_store if mode == "det" else
                cfg.bwd.sched_zero and not cfg.bwd.dq_claim if mode == "sched" else
                cfg.bwd.dq_claim == ("dqclaim" in mode)), cfg.bwd
        want = int(mode.split("convert=")[1]) if "convert=" in mode and d <= 128 else 0
        assert cfg.bwd.dq_convert_rows == want, cfg.bwd
        return tuple(fh.hstu_bwd(do, q, k, v, cq, ck, fn, cfg, _dq_ws_fill=fill))

    nq, nk = int(cq[-1]), int(ck[-1])

    def ref(cdt):
        return jax.jit(lambda do, q, k, v, cq, ck, fn: tuple(reference.hstu_attention_bwd_ref(
            do, q, k, v, cq, ck, fn, compute_dtype=cdt, **kw)))(
                do[:nq], q[:nq], k[:nk], v[:nk], cqj, ckj, fn)

    truth, base = ref(None), ref(dt)
    kernel = jax.jit(run)
    # a decoy run first (dO negated): output buffers XLA hands to the checked runs may hold
    # its (wrong-signed) values, so rows nobody writes cannot pass on a stale correct result
    jax.block_until_ready(kernel(-do, q, k, v, cqj, ckj, fn))
    for rep in range(reps):
        got = kernel(do, q, k, v, cqj, ckj, fn)
        report = []
        for i, (nm, lim) in enumerate((("dq", nq), ("dk", nk), ("dv", nk))):
            x = np.asarray(got[i], np.float32)
            assert not np.isnan(x).any(), (
                f"{nm}: NaN (a workspace tile nobody wrote was read), run {rep}")
            check_rule(nm, got[i][:lim], truth[i], base[i], 5.0, 5e-3, report)
            assert not np.any(x[lim:]), f"{nm} rows past the last sequence are not zero"
        print(f"run {rep}: " + " | ".join(report))


UNZEROED_MODES = ["det", "dqclaim", "dqclaim,convert=256"]


@pytest.mark.parametrize("mode", UNZEROED_MODES)
@pytest.mark.parametrize("name,lq,lk,d,window,func", UNCOVERED, ids=[c[0] for c in UNCOVERED])
def test_hstu_bwd_uncovered_tiles_unzeroed_workspace(name, lq, lk, d, window, func, mode):
    """Query tiles no KV tile covers come out as zeros from the unzeroed (NaN-filled)
    workspace (:func:`_unzeroed_case`)."""
    _unzeroed_case(lq, lk, d, window, func, mode, seed=5 + UNZEROED_MODES.index(mode))


@pytest.mark.parametrize("mode", UNZEROED_MODES)
@pytest.mark.parametrize("d", [128, 256])
def test_hstu_bwd_canonical_unzeroed_workspace(d, mode):
    """The canonical jagged batch, causal, 4 heads, three runs on a NaN-filled workspace: many
    KV tiles reach each query tile close together, so a reduce-add that overtook the first
    store (a lost contribution) would show against the reference."""
    lens = th._canonical_lengths()
    _unzeroed_case(lens, lens, d, (-1, 0), None, mode, heads=4, reps=3,
                   seed=23 + UNZEROED_MODES.index(mode))


# the schedule kernel (and so its zeroing) does not take func masks
SCHED_ZERO_CASES = [c for c in UNCOVERED if c[5] is None] + [
    ("canonical-d128", "canonical", "canonical", 128, (-1, 0), None),
    ("canonical-d64", "canonical", "canonical", 64, (-1, 0), None)]


@pytest.mark.parametrize("name,lq,lk,d,window,func", SCHED_ZERO_CASES,
                         ids=[c[0] for c in SCHED_ZERO_CASES])
def test_hstu_bwd_schedule_zeroed_workspace(name, lq, lk, d, window, func):
    """The default mode's fp32 dQ workspace zeroed by the tile-schedule launch (sched_zero):
    the workspace filled with NaN before that launch, so an element its zeroing CTAs miss
    shows as NaN in dq."""
    if lq == "canonical":
        lq = lk = th._canonical_lengths()
    _unzeroed_case(lq, lk, d, window, func, "sched", heads=4 if name.startswith("can") else 2,
                   reps=2, seed=31)


@pytest.mark.parametrize("name,lens,d,window,dtype", th.BWD_BATCHES,
                         ids=[c[0] for c in th.BWD_BATCHES])
@pytest.mark.parametrize("poison", [False, True], ids=["clean", "poisoned"])
def test_hstu_bwd_dqclaim(name, lens, d, window, dtype, poison):
    from jax_sparse_attn.ffi import hstu as fh

    key = fh.bwd_config(dtype, d, d, 0, Switches(hstu_bwd_ws="dqclaim"))
    assert key.dq_claim and key.dq_writer, key
    th._bwd_case(lens, d, window, seed=17, poison=poison, impl="sm90", dtype=dtype, dq="tile",
                 ws=("dqclaim",))


@pytest.mark.parametrize("ws", [("convert=128",), ("dqclaim", "convert=65536")],
                         ids=["convert128", "claim-convert-all"])
@pytest.mark.parametrize("name,lens,d,window,dtype", th.BWD_BATCHES,
                         ids=[c[0] for c in th.BWD_BATCHES])
def test_hstu_bwd_convert(name, lens, d, window, dtype, ws):
    from jax_sparse_attn.ffi import hstu as fh

    key = fh.bwd_config(dtype, d, d, 0, Switches(hstu_bwd_ws=",".join(ws)))
    assert key.dq_convert_rows == (int(ws[-1][8:]) if d <= 128 else 0), key
    # (a seed per variant: a reused output buffer holds another variant's different result)
    th._bwd_case(lens, d, window, seed=19 if len(ws) == 1 else 43, poison=True, impl="sm90",
                 dtype=dtype, dq="tile", ws=ws)


@pytest.mark.parametrize("mode", ["convert=300", "dqclaim,convert=300"])
@pytest.mark.parametrize("d", [64, 128])
def test_hstu_bwd_convert_gqa(d, mode):
    """Grouped KV heads (4 query heads on 2 KV heads): the converting CTA writes the dq of
    every query head of its group; sequences longer than 300 rows go to the reordering
    kernel."""
    lens = [0, 300, 1, 301, 700, 64]
    _unzeroed_case(lens, lens, d, (-1, 0), None, mode, heads=4, heads_kv=2, reps=2,
                   seed=29 if "dqclaim" in mode else 31,
                   fill=float("nan") if "dqclaim" in mode else None)
