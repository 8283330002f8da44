"""CPU tests of the ``deterministic=`` option of the HSTU entry points: validation, the
static config and compile keys, the reference backend, and the deterministic backward
schedule (each sequence's KV tiles launch in ascending order). The kernels' lowering is in
tests/test_lowering_hstu.py; bitwise reproducibility on the GPU in tests/test_gpu_hstu.py
(``test_hstu_bwd_deterministic``)."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import jax_sparse_attn as jsa  # noqa: E402
from jax_sparse_attn import metadata  # noqa: E402
from jax_sparse_attn.config import Switches  # noqa: E402
from jax_sparse_attn.ffi import hstu as fh  # noqa: E402

LENS = [37, 0, 130, 64]
KW = dict(max_seqlen_q=130, max_seqlen_k=130, window_size=(-1, 0), alpha=0.5)


def _inputs(d=16, h=2, seed=0):
    cu = jnp.asarray(np.concatenate([[0], np.cumsum(LENS)]), jnp.int32)
    t = int(cu[-1])
    ks = jax.random.split(jax.random.PRNGKey(seed), 4)
    q, k, v, do = (jax.random.normal(kk, (t, h, d), jnp.float32) for kk in ks)
    return q, k, v, do, cu


@pytest.mark.parametrize("bad", [1, 0, "yes", None, jnp.asarray(True)])
def test_deterministic_must_be_a_bool(bad):
    q, k, v, do, cu = _inputs()
    for call in (lambda: jsa.hstu_attention(q, k, v, cu, cu, deterministic=bad, **KW),
                 lambda: jsa.hstu_attention_forward(q, k, v, cu, cu, deterministic=bad, **KW),
                 lambda: jsa.hstu_attention_backward(do, q, k, v, cu, cu, deterministic=bad,
                                                     **KW)):
        with pytest.raises(TypeError, match="deterministic must be a bool"):
            call()


def test_reference_backend_accepts_deterministic():
    """All three entry points take it; the reference results are the same in both modes and
    the gradient through hstu_attention equals hstu_attention_backward's."""
    q, k, v, do, cu = _inputs()
    o0 = jsa.hstu_attention(q, k, v, cu, cu, backend="reference", **KW)
    o1 = jsa.hstu_attention(q, k, v, cu, cu, backend="reference", deterministic=True, **KW)
    f1 = jsa.hstu_attention_forward(q, k, v, cu, cu, backend="reference", deterministic=True,
                                    **KW)
    np.testing.assert_array_equal(np.asarray(o0), np.asarray(o1))
    np.testing.assert_array_equal(np.asarray(o0), np.asarray(f1["o_tensor"]))
    g0 = jsa.hstu_attention_backward(do, q, k, v, cu, cu, backend="reference", **KW)
    g1 = jsa.hstu_attention_backward(do, q, k, v, cu, cu, backend="reference",
                                     deterministic=np.bool_(True), **KW)
    vjp = jax.vjp(lambda q, k, v: jsa.hstu_attention(q, k, v, cu, cu, backend="reference",
                                                     deterministic=True, **KW), q, k, v)[1](do)
    for name, gv in zip(("dq_tensor", "dk_tensor", "dv_tensor"), vjp):
        np.testing.assert_array_equal(np.asarray(g0[name]), np.asarray(g1[name]))
        np.testing.assert_allclose(np.asarray(gv), np.asarray(g1[name]), rtol=1e-5, atol=1e-5)


def test_config_carries_deterministic(monkeypatch):
    """The op config and the backward compile key carry the flag (so the two modes compile
    separately); the forward key is the same in both modes; deterministic turns the sm90
    bulk dQ reduction off; the per-shard (vmap) path passes it on."""
    from jax_sparse_attn import hstu  # noqa: PLC0415

    monkeypatch.setenv("JAX_SPARSE_ATTN_FORCE_KERNEL", "1")
    q, k, v, do, cu = _inputs(d=128)
    q, k, v = (x.astype(jnp.bfloat16) for x in (q, k, v))

    def cfg(det, switches=None):
        return hstu._make_config(q, k, v, cu, cu, None, None, None, None, scaling_seqlen=None,
                                 backend="kernel", switches=switches, op_name="t",
                                 deterministic=det, **KW)

    c0, c1 = cfg(False), cfg(True)
    assert not c0.deterministic and c1.deterministic
    assert not c0.bwd.deterministic and c1.bwd.deterministic and c0.bwd != c1.bwd
    assert c0.fwd == c1.fwd
    assert c1.bwd.impl == "sm90" and hash(c1) != hash(c0)
    bulk = Switches(hstu_bwd_dq="bulk")
    assert cfg(False, bulk).bwd.dq_bulk and not cfg(True, bulk).bwd.dq_bulk
    # configurations routed to the sm80 backward keep the flag
    for d, rab in ((32, False), (256, True)):
        key = fh.bwd_config("bfloat16", d, d, 0, Switches(), has_rab=rab,
                            rab_dtype="float32" if rab else "", deterministic=True)
        assert key.impl == "sm80" and key.deterministic, (d, rab)
    # with rab at D = 128 the sm90 backward (per-head drab workspace)
    k128 = fh.bwd_config("bfloat16", 128, 128, 0, Switches(), has_rab=True,
                         rab_dtype="float32", deterministic=True)
    assert k128.impl == "sm90" and k128.deterministic
    # D = 256 runs the sm90 backward (64 x 64 tiles) in both modes
    k256 = fh.bwd_config("bfloat16", 256, 256, 0, Switches(), deterministic=True)
    assert (k256.impl, k256.block_n, k256.deterministic) == ("sm90", 64, True)
    ref = hstu._make_config(q, k, v, cu, cu, None, None, None, None, scaling_seqlen=None,
                            backend="reference", switches=None, op_name="t",
                            deterministic=True, **KW)
    assert ref.backend == "reference" and ref.deterministic


def test_per_shard_passes_deterministic():
    q, k, v, do, cu = _inputs()
    q2, k2, v2 = (jnp.concatenate([x, x]) for x in (q, k, v))
    cu2 = jnp.stack([cu, cu])
    with pytest.raises(TypeError, match="deterministic must be a bool"):
        jsa.hstu_attention(q2, k2, v2, cu2, cu2, deterministic="x", **KW)
    o = jsa.hstu_attention(q2, k2, v2, cu2, cu2, deterministic=True, backend="reference", **KW)
    np.testing.assert_allclose(np.asarray(o[: q.shape[0]]), np.asarray(jsa.hstu_attention(
        q, k, v, cu, cu, backend="reference", **KW)), rtol=1e-6, atol=1e-6)


def _slot_order(cu_lens, window, deterministic, bn=128, bm=64):
    cu = metadata.append_pseudo_sequence(
        jnp.asarray(np.concatenate([[0], np.cumsum(cu_lens)]), jnp.int32), None)
    t = int(sum(cu_lens)) + 10
    tiles, _, _ = metadata.hstu_bwd_schedule(cu, cu, None, bm, bn, t, t, window_size=window,
                                             deterministic=deterministic)
    return np.asarray(tiles)


@pytest.mark.parametrize("window", [(-1, 0), (-1, -1), (64, -1), (300, 40), (0, -1)])
def test_deterministic_schedule_keeps_kv_tiles_ascending(window):
    """With deterministic=True every sequence's KV tiles appear in ascending order in the
    launch order (the ordered dq additions wait only for the previous KV tile, which must
    launch earlier); every tile appears once; for causal and full masks the order is the
    default longest-first one."""
    lens = [700, 0, 1500, 129, 64, 1000, 1]
    det = _slot_order(lens, window, True)
    default = _slot_order(lens, window, False)
    assert sorted(map(tuple, det.tolist())) == sorted(map(tuple, default.tolist()))
    for b in range(len(lens)):
        ns = det[det[:, 0] == b, 1]
        assert np.all(np.diff(ns) == 1) and (ns.size == 0 or ns[0] == 0), (b, ns)
    if window in ((-1, 0), (-1, -1)):
        np.testing.assert_array_equal(det, default)
    if window == (64, -1):  # the default order is longest-first: later KV tiles first
        assert not all(np.all(np.diff(default[default[:, 0] == b, 1]) > 0)
                       for b in range(len(lens)))


def _q_range(n, lq, lk, left, right, bm, bn, func_tiles=None):
    """The query tiles KV tile ``n`` adds to, by the formulas of ``block_info.QTileRange``
    (``create`` + ``tile_state``'s active test)."""
    n0 = n * bn
    n1 = min(n0 + bn, lk)
    off = lk - lq
    i_lo, i_hi = 0, lq
    if func_tiles is None:
        if right >= 0:
            i_lo = max(n0 - right - off, 0)
        if left >= 0:
            i_hi = min(n1 + left - off, lq)
    m_min = i_lo // bm
    m_max = -(-i_hi // bm) if i_hi > i_lo else m_min
    out = set()
    for m in range(m_min, m_max):
        if func_tiles is not None:
            lo, hi = max(func_tiles[m][0], 0), min(func_tiles[m][1], lk)
            if not (lo < n0 + bn and hi > n0 and hi > lo):
                continue
        out.add(m)
    return out


@pytest.mark.parametrize("seed", range(4))
def test_contributors_of_a_query_tile_are_contiguous(seed):
    """The ordered dq additions wait for KV tile ``n - 1`` only if it adds to the same query
    tile; that is the previous contributor (no deadlock, fixed order) only if the KV tiles
    adding to a query tile form a contiguous range. Checked on random lengths (L_q != L_k
    both ways), windows and func tile summaries, with both backward tile shapes."""
    rng = np.random.default_rng(seed)
    for _ in range(150):
        bm, bn = ((64, 128), (128, 128), (64, 64))[rng.integers(3)]
        lk = int(rng.integers(0, 900))
        lq = int(rng.integers(0, 900)) if rng.random() < 0.5 else lk
        func_tiles = None
        if rng.random() < 0.3:
            nq = -(-lq // bm)
            func_tiles = [tuple(sorted(rng.integers(-50, lk + 50, 2))) if rng.random() < 0.8
                          else tuple(rng.integers(-50, lk + 50, 2)) for _ in range(nq)]
            left = right = -1
        else:
            left, right = (int(x) if rng.random() < 0.7 else -1
                           for x in rng.integers(0, 400, 2))
        ranges = [_q_range(n, lq, lk, left, right, bm, bn, func_tiles)
                  for n in range(-(-lk // bn))]
        for m in set().union(*ranges) if ranges else ():
            ns = [n for n, r in enumerate(ranges) if m in r]
            assert ns == list(range(ns[0], ns[-1] + 1)), (lq, lk, left, right, bm, bn, m, ns)
