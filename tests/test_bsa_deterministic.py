"""CPU tests of the ``deterministic=`` option of the block-sparse entry points: validation,
the static config and compile keys, where the deterministic backward runs (and where
``backend="auto"`` falls back to the reference), the reference backend, and the per-entry
ranks of the K->Q lists that order the dQ additions. The kernel's lowering and PTX are in
tests/test_lowering_bsa_bwd_ws.py; bitwise reproducibility on the GPU in
tests/test_gpu_bsa.py (``test_bsa_bwd_deterministic``)."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import jax_sparse_attn as jsa  # noqa: E402
from jax_sparse_attn import bsa, metadata  # noqa: E402
from jax_sparse_attn.config import Switches  # noqa: E402
from jax_sparse_attn.ffi import bsa as fb  # noqa: E402

B, HQ, HKV, S, BLK = 2, 4, 2, 300, 64
NB = -(-S // BLK)


def _inputs(d=64, dtype=jnp.float32, hq=HQ, hkv=HKV, seed=0):
    rng = np.random.default_rng(seed)
    q = jnp.asarray(rng.standard_normal((B, hq, S, d)), dtype)
    k = jnp.asarray(rng.standard_normal((B, hkv, S, d)), dtype)
    v = jnp.asarray(rng.standard_normal((B, hkv, S, d)), dtype)
    do = jnp.asarray(rng.standard_normal((B, hq, S, d)), dtype)
    idx = np.stack([np.stack([np.stack([rng.permutation(NB)[:3] for _ in range(NB)])
                              for _ in range(hq)]) for _ in range(B)]).astype(np.int32)
    nums = rng.integers(1, 4, (B, hq, NB)).astype(np.int32)
    return q, k, v, do, jnp.asarray(idx), jnp.asarray(nums)


KW = dict(sparse_block_size=BLK)


@pytest.mark.parametrize("bad", [1, 0, "yes", None, jnp.asarray(True)])
def test_deterministic_must_be_a_bool(bad):
    q, k, v, do, idx, nums = _inputs()
    o, lse = jsa.block_sparse_attention_forward(q, k, v, idx, None, None, nums, **KW)
    for call in (
        lambda: jsa.block_sparse_attention(q, k, v, idx, None, None, nums, deterministic=bad,
                                           **KW),
        lambda: jsa.block_sparse_attention_forward(q, k, v, idx, None, None, nums,
                                                   deterministic=bad, **KW),
        lambda: jsa.block_sparse_attention_backward(do, q, k, v, o, lse, idx, None, None, nums,
                                                    deterministic=bad, **KW)):
        with pytest.raises(TypeError, match="deterministic must be a bool"):
            call()


def test_reference_backend_accepts_deterministic():
    """All three entry points take it; the reference gives the same results in both modes
    and the gradient through block_sparse_attention equals the backward entry point's."""
    q, k, v, do, idx, nums = _inputs()
    args = (q, k, v, idx, None, None, nums)
    o0 = jsa.block_sparse_attention(*args, backend="reference", **KW)
    o1 = jsa.block_sparse_attention(*args, backend="reference", deterministic=True, **KW)
    f1 = jsa.block_sparse_attention_forward(*args, backend="reference", deterministic=True,
                                            **KW)
    np.testing.assert_array_equal(np.asarray(o0), np.asarray(o1))
    np.testing.assert_array_equal(np.asarray(o0), np.asarray(f1["o_tensor"]))
    o, lse = f1
    g0 = jsa.block_sparse_attention_backward(do, q, k, v, o, lse, idx, None, None, nums,
                                             backend="reference", **KW)
    g1 = jsa.block_sparse_attention_backward(do, q, k, v, o, lse, idx, None, None, nums,
                                             backend="reference", deterministic=np.bool_(True),
                                             **KW)
    vjp = jax.vjp(lambda q, k, v: jsa.block_sparse_attention(
        q, k, v, idx, None, None, nums, backend="reference", deterministic=True, **KW),
        q, k, v)[1](do)
    for name, gv in zip(("dq_tensor", "dk_tensor", "dv_tensor"), vjp):
        np.testing.assert_array_equal(np.asarray(g0[name]), np.asarray(g1[name]))
        np.testing.assert_allclose(np.asarray(gv), np.asarray(g1[name]), rtol=1e-5, atol=1e-5)


def _cfg(monkeypatch, det, d=128, blk=64, switches=None, backend="kernel", **kw):
    monkeypatch.setenv("JAX_SPARSE_ATTN_FORCE_KERNEL", "1")
    q, k, v, _, idx, nums = _inputs(d=d, dtype=jnp.bfloat16)
    # metadata rows: (B, H_q, N_q), or (B, H_kv, N_qp) over the packed rows with pack_gqa
    r = HQ // HKV if kw.get("pack_gqa") else 1
    h, nb = (HKV if r > 1 else HQ), -(-S * r // blk)
    idx = jnp.zeros((B, h, nb, 2), jnp.int32)
    nums = jnp.ones((B, h, nb), jnp.int32)
    cfg, *_ = bsa._make_config(q, k, v, idx, None, None, nums, sparse_block_size=blk,
                               softmax_scale=None, layout="bhsd", allow_empty_block_nums=False,
                               backend=backend, switches=switches, op_name="t",
                               deterministic=det, **kw)
    return cfg


@pytest.mark.parametrize("d,blk", [(128, 64), (128, 128), (64, 64), (64, 128)])
def test_config_carries_deterministic(monkeypatch, d, blk):
    """The op config and the backward compile key carry the flag (the two modes compile
    separately) and the forward key is the same in both; the deterministic backward is the
    sm90ws kernel at every block size (``auto`` picks sm90 at blk 64 / D 128 only with
    ``bsa_bwd_dq="rows"``), with the ``lpt`` and ``decouple`` variants off."""
    c0, c1 = _cfg(monkeypatch, False, d, blk), _cfg(monkeypatch, True, d, blk)
    assert not c0.deterministic and c1.deterministic
    # the fixed-point dQ by default (the default mode's kernels with int32 dQ), the ordered
    # additions with detorder
    assert not c0.bwd.deterministic and c0.bwd != c1.bwd
    assert (c1.bwd.dq_fixed, c1.bwd.deterministic) == (True, False)
    c1 = _cfg(monkeypatch, True, d, blk, Switches(bsa_bwd_ws="detorder"))
    assert c1.bwd.deterministic and not c1.bwd.dq_fixed
    assert c0.fwd == c1.fwd and hash(c0) != hash(c1)
    assert c1.bwd.impl == "sm90ws"
    assert c0.bwd.impl == "sm90ws"
    rows = _cfg(monkeypatch, False, d, blk, Switches(bsa_bwd_dq="rows")).bwd
    assert rows.impl == ("sm90" if (d, blk) == (128, 64) else "sm90ws")
    sw = Switches(bsa_bwd_ws="lpt,decouple,detorder")
    key = _cfg(monkeypatch, True, d, blk, sw).bwd
    assert key.deterministic and not key.ws_lpt and not key.ws_decouple
    assert _cfg(monkeypatch, True, d, blk, Switches(bsa_bwd_impl="sm90ws",
                                                    bsa_bwd_ws="detorder")).bwd == c1.bwd


@pytest.mark.parametrize("case", ["d32", "d256", "sm80", "sm90", "pack_gqa"])
def test_where_the_deterministic_backward_does_not_run(monkeypatch, case):
    """D in {32, 256}, the ``sm80`` / ``sm90`` backward switches and pack_gqa:
    ``backend="kernel"`` raises NotImplementedError naming the option, ``"auto"`` runs the
    reference (which is deterministic); the default mode is unaffected."""
    d = {"d32": 32, "d256": 256}.get(case, 128)
    sw = {"sm80": Switches(bsa_bwd_impl="sm80"),
          "sm90": Switches(bsa_bwd_impl="sm90")}.get(case)
    kw = {"pack_gqa": {"pack_gqa": True}}.get(case, {})
    with pytest.raises(NotImplementedError, match="deterministic=True"):
        _cfg(monkeypatch, True, d, 64, sw, **kw)
    assert _cfg(monkeypatch, True, d, 64, sw, backend="auto", **kw).backend == "reference"
    assert _cfg(monkeypatch, False, d, 64, sw, backend="auto", **kw).backend == "kernel"


def test_every_entry_point_declines(monkeypatch):
    """The backward entry point checks its backward, and the forward entry points may run
    the backward (they are differentiable): all three decline on the kernel backend."""
    q, k, v, _, _, _ = _inputs(d=256, dtype=jnp.bfloat16)
    idx = jnp.zeros((B, HQ, NB, 2), jnp.int32)
    nums = jnp.ones((B, HQ, NB), jnp.int32)
    monkeypatch.setenv("JAX_SPARSE_ATTN_FORCE_KERNEL", "1")
    for name in ("block_sparse_attention", "block_sparse_attention_forward",
                 "block_sparse_attention_backward"):
        with pytest.raises(NotImplementedError, match="head_dim=256"):
            bsa._make_config(q, k, v, idx, None, None, nums, sparse_block_size=64,
                             softmax_scale=None, layout="bhsd", allow_empty_block_nums=False,
                             backend="kernel", switches=None, op_name=name, deterministic=True)


def _row_ranks(idx, nums, n_kv):
    """Reference ranks: for (b, h, m) and each active id, the number of distinct active ids
    of the row below it."""
    out = {}
    b_, h_, nq, _ = idx.shape
    for b in range(b_):
        for h in range(h_):
            for m in range(nq):
                act = [int(x) for x in idx[b, h, m, :nums[b, h, m]] if 0 <= x < n_kv]
                for x in set(act):
                    out[(b, h, m, x)] = len({y for y in act if y < x})
    return out


@pytest.mark.parametrize("dense", [True, False])
@pytest.mark.parametrize("group", [1, 5, 13, 1000])
def test_kq_csr_ranks_in_launch_groups(monkeypatch, dense, group):
    """``rank_group = G``: a query row's entries are ranked by (CSR row // G, position in
    the CSR row, KV block), 0 .. count - 1; so a contribution only waits for lower groups
    (lower launch indices) or, within its group, for CTAs that reach the row earlier in
    their walk (no cycle: the pair (position, KV block) decreases along every wait)."""
    if not dense:
        monkeypatch.setattr(metadata, "_DENSE_CSR_MAX_ELEMS", 0)
    rng = np.random.default_rng(group)
    b, hq, hkv, nq, nkv, kmax = 2, 6, 2, 7, 9, 5
    g = hq // hkv
    idx = np.stack([np.stack([np.stack([rng.permutation(nkv)[:kmax] for _ in range(nq)])
                              for _ in range(hq)]) for _ in range(b)]).astype(np.int32)
    nums = rng.integers(0, kmax + 1, (b, hq, nq)).astype(np.int32)
    offsets, entries, ranks = (np.asarray(x) for x in metadata.build_kq_csr(
        jnp.asarray(idx), jnp.asarray(nums), num_kv_heads=hkv, num_kv_blocks=nkv,
        with_ranks=True, rank_group=group))
    rows = {}
    for r in range(b * hkv * nkv):
        bb, gg, n = r // (hkv * nkv), (r // nkv) % hkv, r % nkv
        for e in range(offsets[r], offsets[r + 1]):
            hg, m = divmod(int(entries[e]), nq)
            rows.setdefault((bb, gg * g + hg, m), []).append(
                (r // group, e - offsets[r], n, int(ranks[e])))
    assert sum(len(v) for v in rows.values()) == int(nums.sum())
    for key, lst in rows.items():
        assert [x[3] for x in sorted(lst)] == list(range(len(lst))), (key, lst)


def test_det_launch_group():
    """By default half the CTAs the GPU holds at once at blk 128 (one per SM) and the KV
    block order (0) at blk 64; every CTA held with ``detfull`` (2 per SM at blk 64), 0 with
    ``detkv``; in the compile key."""
    sms = metadata.num_sms()
    assert fb.det_launch_group(128) == sms // 2 and fb.det_launch_group(64) == 0
    assert fb.det_launch_group(64, ("detfull",)) == 2 * sms
    assert fb.det_launch_group(128, ("detfull",)) == sms
    assert fb.det_launch_group(128, ("detkv",)) == 0
    key = fb.bwd_config(jnp.bfloat16, 128, 128, False, Switches(bsa_bwd_ws="detkv"),
                        deterministic=True)
    assert key.deterministic and key.det_group == 0
    assert fb.bwd_config(jnp.bfloat16, 64, 128, False, Switches(bsa_bwd_ws="detorder"),
                         deterministic=True).det_group == sms // 2
    assert fb.bwd_config(jnp.bfloat16, 64, 64, False, Switches(bsa_bwd_ws="detfull"),
                         deterministic=True).det_group == 2 * sms
    assert fb.bwd_config(jnp.bfloat16, 128, 128, False, Switches()).det_group == 0


@pytest.mark.parametrize("dense", [True, False])
@pytest.mark.parametrize("seed", range(3))
def test_kq_csr_ranks(monkeypatch, dense, seed):
    """``build_kq_csr(..., with_ranks=True)``: each entry's rank is the number of KV blocks
    of its query row below its own, so a row's entries hold the ranks 0 .. count - 1 once
    each (the order of the deterministic dQ additions); both constructions; offsets and
    entries equal those without ranks; out-of-range ids past the prefix are ignored."""
    if not dense:
        monkeypatch.setattr(metadata, "_DENSE_CSR_MAX_ELEMS", 0)
    rng = np.random.default_rng(seed)
    b, hq, hkv, nq, nkv, kmax = 2, 6, 2, 7, 9, 5
    g = hq // hkv
    idx = np.stack([np.stack([np.stack([rng.permutation(nkv)[:kmax] for _ in range(nq)])
                              for _ in range(hq)]) for _ in range(b)]).astype(np.int32)
    nums = rng.integers(0, kmax + 1, (b, hq, nq)).astype(np.int32)
    j = np.arange(kmax)
    idx = np.where(j < nums[..., None], idx, rng.choice([-1, nkv, 99], idx.shape)).astype(np.int32)
    offsets, entries, ranks = (np.asarray(x) for x in metadata.build_kq_csr(
        jnp.asarray(idx), jnp.asarray(nums), num_kv_heads=hkv, num_kv_blocks=nkv,
        with_ranks=True))
    o2, e2 = metadata.build_kq_csr(jnp.asarray(idx), jnp.asarray(nums), num_kv_heads=hkv,
                                   num_kv_blocks=nkv)
    np.testing.assert_array_equal(offsets, np.asarray(o2))
    np.testing.assert_array_equal(entries[:offsets[-1]], np.asarray(e2)[:offsets[-1]])
    want = _row_ranks(idx, nums, nkv)
    got = {}
    for r in range(b * hkv * nkv):
        bb, gg, n = r // (hkv * nkv), (r // nkv) % hkv, r % nkv
        for e in range(offsets[r], offsets[r + 1]):
            hg, m = divmod(int(entries[e]), nq)
            got[(bb, gg * g + hg, m, n)] = int(ranks[e])
    assert got == want
