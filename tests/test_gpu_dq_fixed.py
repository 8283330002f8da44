"""GPU: the deterministic block-sparse backward with fixed-point dQ (``bsa_bwd_ws``
``detfixed``): the deterministic grid of ``tests/test_gpu_bsa.py`` (five runs bitwise
equal, the float32 reference within 5x the input-dtype error, poisoned outputs and NaN in
unlisted keys); dK / dV bitwise those of the default mode (the same kernel apart from the
dQ conversion) and dq close to it; a NaN in one valid dO row gives NaN in that dq row only;
rows listing 256 KV blocks within 1.5x the default mode's error against float32.
CPU side: ``tests/test_bsa_dq_fixed.py``.

Run on the H200: ``python -m pytest -m gpu tests/test_gpu_dq_fixed.py``.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import test_gpu_bsa as tb  # noqa: E402
from jax_sparse_attn.config import from_env  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("c", tb.DET_CASES, ids=lambda c: c["name"])
def test_bsa_bwd_detfixed(c, monkeypatch):
    from jax_sparse_attn.ffi import bsa as fb

    monkeypatch.setenv("JAX_SPARSE_ATTN_BSA_BWD_WS", "detfixed")
    key = fb.bwd_config(jnp.dtype(c["dtype"]), c["d"], c["blk"], False, from_env(),
                        deterministic=True, causal=bool(c.get("causal")))
    assert key.dq_fixed and not key.deterministic, key
    tb.test_bsa_bwd_deterministic(c, monkeypatch)


@pytest.mark.parametrize("c", [c for c in tb.DET_CASES if c["blk"] == 128],
                         ids=lambda c: c["name"])
def test_bsa_bwd_detfixed_dqlag(c, monkeypatch):
    """``detfixed,dqlag`` at blk 128: warpgroup 0 converts and stages its dQ half one step
    late with the previous step's row multipliers and flag words kept in registers; the
    deterministic cases (five runs bitwise equal, against the reference)."""
    from jax_sparse_attn.ffi import bsa as fb

    monkeypatch.setenv("JAX_SPARSE_ATTN_BSA_BWD_WS", "detfixed,dqlag")
    key = fb.bwd_config(jnp.dtype(c["dtype"]), c["d"], c["blk"], False, from_env(),
                        deterministic=True, causal=bool(c.get("causal")))
    assert key.dq_fixed and key.ws_dq_lag == key.ws_wg_hand, key
    tb.test_bsa_bwd_deterministic(c, monkeypatch)


@pytest.mark.parametrize("c", tb.DET_CASES, ids=lambda c: c["name"])
def test_bsa_bwd_deterministic_nowguni(c, monkeypatch):
    """``nowguni`` with deterministic=True (the warp-uniform warpgroup index is the default
    in both modes): the consumers' warpgroup index from the thread index, on the fixed-point
    dQ and, where a case names an option of the ordered path, on the ordered additions; the
    deterministic cases (five runs bitwise equal, against the reference)."""
    from jax_sparse_attn.ffi import bsa as fb

    monkeypatch.setenv("JAX_SPARSE_ATTN_BSA_BWD_WS", "nowguni")
    ws = ("nowguni",) + (tuple(c["ws"].split(",")) if c.get("ws") else ())
    key = fb.bwd_config(jnp.dtype(c["dtype"]), c["d"], c["blk"], False,
                        dataclasses.replace(from_env(), bsa_bwd_ws=ws), deterministic=True,
                        causal=bool(c.get("causal")))
    assert not key.ws_wg_uniform, key
    tb.test_bsa_bwd_deterministic(c, monkeypatch)


@pytest.mark.parametrize("c", [c for c in tb.DET_CASES if not c.get("ws")],
                         ids=lambda c: c["name"])
def test_bsa_bwd_deterministic_nomult1p(c, monkeypatch):
    """``nomult1p`` (the fixed-point multipliers' norms in two passes over dO and V, the
    largest value and then the scaled sum of squares, instead of the default's one): the
    deterministic cases of the fixed point (five runs bitwise equal, against the
    reference)."""
    from jax_sparse_attn.ffi import bsa as fb

    monkeypatch.setenv("JAX_SPARSE_ATTN_BSA_BWD_WS", "nomult1p")
    key = fb.bwd_config(jnp.dtype(c["dtype"]), c["d"], c["blk"], False,
                        dataclasses.replace(from_env(), bsa_bwd_ws=("nomult1p",)),
                        deterministic=True, causal=bool(c.get("causal")))
    assert key.dq_fixed and not key.fix_mult_one_pass, key
    tb.test_bsa_bwd_deterministic(c, monkeypatch)


FIXED_CASES = [
    dict(name="fixed-blk64-d128", blk=64, d=128, dtype="bfloat16", layout="bhsd", hq=4, hkv=4,
         sq=1000, skv=999, mode="all"),
    dict(name="fixed-blk128-d64-gqa4", blk=128, d=64, dtype="float16", layout="bshd", hq=8,
         hkv=2, sq=1500, skv=1300, mode="last-empty"),
]


def _grads(c, ws, deterministic, q, k, v, do, idx, nums, sizes):
    import jax_sparse_attn as jsa

    kw = dict(layout=c["layout"], sparse_block_size=c["blk"],
              softmax_scale=0.6 / np.sqrt(c["d"]))
    if c.get("causal"):
        kw["causal"] = True
    switches = dataclasses.replace(from_env(), bsa_bwd_ws=ws)

    @jax.jit
    def grads(q, k, v, do):
        _, vjp = jax.vjp(lambda q, k, v: jsa.block_sparse_attention(
            q, k, v, idx, None, sizes, nums, allow_empty_block_nums=True, backend="kernel",
            deterministic=deterministic, switches=switches, **kw), q, k, v)
        return vjp(do)

    return [np.asarray(g) for g in jax.block_until_ready(grads(q, k, v, do))]


@pytest.mark.parametrize("c", FIXED_CASES, ids=lambda c: c["name"])
def test_detfixed_against_the_default_mode(c):
    """dK / dV bitwise those of the default (non-deterministic) mode; dq within 2^-7 of the
    largest |dq| of the default mode's (both against fp32 sums of 16-bit dS products)."""
    (q, k, v), (kp, vp), idx, nums, sizes = tb._ws_inputs(c)
    do = jnp.asarray(np.random.default_rng(5).standard_normal(q.shape, np.float32)).astype(
        q.dtype)
    fixed = _grads(c, ("detfixed",), True, q, kp, vp, do, idx, nums, sizes)
    plain = _grads(c, (), False, q, kp, vp, do, idx, nums, sizes)
    for name, a, b in zip(("dk", "dv"), fixed[1:], plain[1:]):
        assert np.array_equal(a.view(np.uint16), b.view(np.uint16)), name
    a, b = fixed[0].astype(np.float32), plain[0].astype(np.float32)
    assert np.isfinite(a).all()
    assert np.abs(a - b).max() <= 2.0**-7 * np.abs(b).max(), np.abs(a - b).max()


FIXEMU_CASES = FIXED_CASES + [c for c in tb.DET_CASES if c["name"] in (
    "det-hot-blk128-d128-32k", "det-all-blk128-d128-causal")]


@pytest.mark.parametrize("n", [4, 8])
@pytest.mark.parametrize("c", FIXEMU_CASES, ids=lambda c: c["name"])
def test_detfixed_fixemu_bitwise(c, n):
    """``fixemu=N``: N of every 8 dQ values converted to int32 by float additions instead of
    ``cvt.rni`` give bitwise the gradients of the deterministic default (the same int32
    values, so the same sums), at blk 64 and 128 (``dqlag``'s late half included), causal
    too, with a NaN in one dO row (a row the kernel may flag: compared bit for bit too)."""
    from jax_sparse_attn.ffi import bsa as fb

    key = fb.bwd_config(jnp.dtype(c["dtype"]), c["d"], c["blk"], False,
                        dataclasses.replace(from_env(), bsa_bwd_ws=(f"fixemu={n}",)),
                        deterministic=True, causal=bool(c.get("causal")))
    assert key.dq_fixed and key.ws_fix_emu == n, key
    (q, k, v), (kp, vp), idx, nums, sizes = tb._ws_inputs(c)
    do = np.random.default_rng(8).standard_normal(q.shape, np.float32)
    do.reshape(-1, c["d"])[3, 1] = np.nan  # query 3 of head 0 (bhsd) or query 0 of head 3 (bshd)
    do = jnp.asarray(do).astype(q.dtype)
    ws = tuple(c["ws"].split(",")) if c.get("ws") else ()
    base = _grads(c, ws, True, q, kp, vp, do, idx, nums, sizes)
    emu = _grads(c, ws + (f"fixemu={n}",), True, q, kp, vp, do, idx, nums, sizes)
    for name, a, b in zip(("dq", "dk", "dv"), emu, base):
        assert np.array_equal(a.view(np.uint16), b.view(np.uint16)), name


def test_detfixed_nan_row():
    """A NaN in one valid dO row: that dq row is NaN in every column (its contributions are
    flagged), every other dq row is finite and matches the default mode's."""
    c = FIXED_CASES[0]
    (q, k, v), (kp, vp), idx, nums, sizes = tb._ws_inputs(c)
    do = np.random.default_rng(6).standard_normal(q.shape, np.float32)
    row = 77  # a valid query row of head 1, batch 0 (listed blocks: mode "all")
    do[0, 1, row, 5] = np.nan  # bhsd
    do = jnp.asarray(do).astype(q.dtype)
    fixed = _grads(c, ("detfixed",), True, q, kp, vp, do, idx, nums, sizes)[0]
    fixed = fixed.astype(np.float32)
    assert np.isnan(fixed[0, 1, row]).all()
    others = np.ones(fixed.shape[:3], bool)
    others[0, 1, row] = False
    assert np.isfinite(fixed[others]).all()
    do_clean = do.at[0, 1, row, 5].set(0)
    ref = _grads(c, (), False, q, kp, vp, do_clean, idx, nums, sizes)[0]
    # the other rows of head 1 (dS of row `row` touches only its own dq row; the
    # multipliers may differ, so within the fixed point's precision)
    a, b = fixed[0, 1], ref.astype(np.float32)[0, 1]
    keep = np.arange(a.shape[0]) != row
    assert np.abs(a[keep] - b[keep]).max() <= 2.0**-7 * np.abs(b[keep]).max()


LONG = dict(name="fixed-long-blk64-d128", b=1, blk=64, d=128, dtype="bfloat16", layout="bhsd",
            hq=2, hkv=2, sq=256, skv=16384, mode="all")


def test_detfixed_long_rows_against_fp32():
    """Rows listing all 256 KV blocks (S_kv 16384, blk 64): the fixed point's steps come from a
    bound that does not shrink with the number of blocks, so this is where it loses the most
    against the float sum. dq of the fixed-point deterministic backward against the float32
    reference is within 1.5x the default mode's error (fp32 sums of the same 16-bit dS
    products) plus a small atol, in RMS over each (batch, head)."""
    import jax_sparse_attn as jsa

    c = LONG
    (q, k, v), _, idx, nums, sizes = tb._ws_inputs(c)
    do = jnp.asarray(np.random.default_rng(7).standard_normal(q.shape, np.float32)).astype(
        q.dtype)
    fixed = _grads(c, ("detfixed",), True, q, k, v, do, idx, nums, sizes)[0]
    plain = _grads(c, (), False, q, k, v, do, idx, nums, sizes)[0]
    f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
    kw = dict(layout=c["layout"], sparse_block_size=c["blk"],
              softmax_scale=0.6 / np.sqrt(c["d"]))
    _, vjp = jax.vjp(lambda q: jsa.block_sparse_attention(
        q, f32(k), f32(v), idx, None, sizes, nums, allow_empty_block_nums=True,
        backend="reference", **kw), f32(q))
    ref = np.asarray(vjp(f32(do))[0])
    rms = lambda x: np.sqrt(np.mean(np.square(x), axis=(2, 3)))  # noqa: E731
    err_fixed = rms(fixed.astype(np.float32) - ref)
    err_plain = rms(plain.astype(np.float32) - ref)
    scale = rms(ref)
    print("RMS error / RMS dq: fixed", err_fixed / scale, "default", err_plain / scale)
    assert np.isfinite(fixed.astype(np.float32)).all()
    assert (err_fixed <= 1.5 * err_plain + 1e-3 * scale).all()
