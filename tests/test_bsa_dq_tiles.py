"""The query-tile dQ workspace of the Hopper block-sparse backwards (``bsa_bwd_dq="tile"``):
the host statement ``ffi.bsa.dq_from_tiles`` inverts the consumer warps' store order
(emulated here in numpy from the wgmma accumulator layout, exactly as
``kernels/dq_tiles.stage_warp_slice`` computes its addresses) for every block width the
kernels use; the compile keys choose the workspace where the kernels implement it. CPU
only: the kernels themselves are checked on the GPU (``tests/test_gpu_bsa.py``)."""

from __future__ import annotations

import numpy as np
import pytest

jnp = pytest.importorskip("jax.numpy")

from jax_sparse_attn.ffi import bsa  # noqa: E402


def _staged_tile(acc_tile, warp_cols, w, rng):
    """The fp32 ``64 * D`` floats the consumer warps leave for one ``(64, D)`` dQ tile: warp
    ``(wg, rg)`` holds rows ``16 rg ..`` and columns ``warp_cols * wg ..`` (warpgroups split
    the head dim when ``warp_cols < D``) as wgmma accumulator values ``i = 4 k4 + 2 h + e``
    of lane ``4 g + q`` (row ``16 rg + 8 h + g``, column ``warp_cols wg + 8 k4 + 2 q + e``)
    and stores value group ``k4`` at block ``(cg0 + 8 k4 // w) 4 + rg``, float
    ``4 (32 ((8 k4 % w) // 8) + lane) + i % 4``, ``cg0 = wg warp_cols / w``."""
    d = acc_tile.shape[1]
    out = rng.standard_normal(64 * d).astype(np.float32) * 1e6  # every float is overwritten
    seen = np.zeros(64 * d, bool)
    for wg in range(d // warp_cols):
        cg0 = wg * warp_cols // w
        for rg in range(4):
            for lane in range(32):
                g, q = divmod(lane, 4)
                for i in range(warp_cols // 2):
                    k4, hh, e = i // 4, (i // 2) % 2, i % 2
                    row = 16 * rg + 8 * hh + g
                    col = warp_cols * wg + 8 * k4 + 2 * q + e
                    blk = (cg0 + (8 * k4) // w) * 4 + rg
                    off = blk * 16 * w + 4 * (32 * ((8 * k4) % w // 8) + lane) + i % 4
                    assert not seen[off]
                    seen[off] = True
                    out[off] = acc_tile[row, col]
    assert seen.all()
    return out


# (head_dim, columns of one warp's accumulator, block columns): sm90 (one warpgroup, all of
# D), sm90ws blk 128 (two warpgroups split D), sm90ws blk 64 / D 64
CASES = [(128, 128, 64), (64, 64, 64), (128, 64, 64), (64, 32, 32)]


@pytest.mark.parametrize("d,warp_cols,w", CASES, ids=lambda c: str(c))
def test_dq_from_tiles_inverts_the_warp_store_order(d, warp_cols, w):
    rng = np.random.default_rng(7)
    b, h, s_q = 2, 3, 150  # 3 query tiles, the last one partial
    nt = -(-s_q // 64)
    dq = rng.standard_normal((b, nt * 64, h, d)).astype(np.float32)
    ws = np.stack([np.stack([np.stack([_staged_tile(dq[bi, 64 * t:64 * t + 64, hi], warp_cols,
                                                    w, rng)
                                       for t in range(nt)]) for hi in range(h)])
                   for bi in range(b)])
    assert ws.shape == (b, h, nt, 64 * d)
    got = np.asarray(bsa.dq_from_tiles(jnp.asarray(ws), s_q, d, w))
    np.testing.assert_array_equal(got, dq[:, :s_q])


def test_dq_block_cols_follow_the_kernels():
    """64-column blocks, except the sm90ws backward at blk 128 / D 64 (each warpgroup's
    m64n32 slice), as the kernel's ``bwd_ws_dq_block_cols``."""
    from jax_sparse_attn.config import Switches

    pytest.importorskip("cutlass")
    sw = Switches()
    cols = {}
    for d in (64, 128):
        for blk in (64, 128):
            key = bsa.bwd_config(jnp.bfloat16, d, blk, False, sw)
            cols[(d, blk)] = (key.impl, key.dq_tile, bsa.dq_block_cols(key) if key.dq_tile else 0)
    assert cols == {(64, 64): ("sm90ws", True, 64), (64, 128): ("sm90ws", True, 32),
                    (128, 64): ("sm90ws", True, 64), (128, 128): ("sm90ws", True, 64)}
    sm90 = bsa.bwd_config(jnp.bfloat16, 128, 64, False, Switches(bsa_bwd_impl="sm90"))
    assert sm90.dq_tile and bsa.dq_block_cols(sm90) == 64


def test_dq_tile_choice():
    """``bsa_bwd_dq="tile"`` (the default) except where the kernels do not implement it:
    ``decouple`` (blk 128) and pack_gqa on the sm90 backward (``nopackws``: it adds packed
    rows; the sm90ws backward's tiles hold packed rows); the sm90ws backward stages
    the slices in the consumed Q / dO tiles at blk 64 / D 128 (two CTAs per SM: no room for
    a staging tile of its own) and with ``dqalias``; ``"rows"`` everywhere."""
    from jax_sparse_attn.config import Switches

    pytest.importorskip("cutlass")
    sw = Switches()
    assert sw.bsa_bwd_dq == "tile"
    key = lambda d, blk, s=sw, **kw: bsa.bwd_config(jnp.bfloat16, d, blk, False, s, **kw)  # noqa: E731
    packed = key(128, 64, pack_gqa=2)
    assert packed.impl == "sm90ws" and packed.dq_tile and packed.pack_gqa == 2
    packed = key(128, 64, Switches(bsa_bwd_ws="nopackws"), pack_gqa=2)
    assert packed.impl == "sm90" and not packed.dq_tile
    assert key(128, 64, causal=True).impl == "sm90ws" and key(128, 64, causal=True).dq_tile
    aliased = {(d, blk): key(d, blk).ws_dq_alias for d in (64, 128) for blk in (64, 128)}
    assert aliased == {(64, 64): False, (64, 128): False, (128, 64): True, (128, 128): False}
    for blk in (64, 128):
        det = key(128, blk, deterministic=True)
        assert det.impl == "sm90ws" and det.dq_tile and det.ws_dq_alias == (blk == 64)
    assert key(128, 128, Switches(bsa_bwd_ws="dqalias")).ws_dq_alias
    assert not key(128, 128, Switches(bsa_bwd_ws="decouple")).dq_tile
    assert key(128, 64, Switches(bsa_bwd_ws="decouple")).dq_tile  # no decoupling at blk 64
    rows = Switches(bsa_bwd_dq="rows")
    assert not any(key(d, blk, rows).dq_tile for d in (64, 128) for blk in (64, 128))


@pytest.mark.parametrize("slots", [2, 3])
def test_dq_from_tiles_sums_the_slots_in_order(slots):
    """With ``slots`` accumulators per query tile (the deterministic backward's
    ``dqslots=N``), tile ``t`` slot ``p`` sits at ``t * slots + p`` and the slots are summed
    in slot order: each slot holds a part of the tile's dQ, and the result is the ordered
    fp32 sum of the slots' reorderings (bitwise)."""
    rng = np.random.default_rng(11)
    b, h, s_q, d, w = 1, 2, 100, 64, 64
    nt = -(-s_q // 64)
    parts = rng.standard_normal((slots, b, nt * 64, h, d)).astype(np.float32)
    ws = np.zeros((b, h, nt * slots, 64 * d), np.float32)
    for p in range(slots):
        for bi in range(b):
            for hi in range(h):
                for t in range(nt):
                    ws[bi, hi, t * slots + p] = _staged_tile(
                        parts[p, bi, 64 * t:64 * t + 64, hi], d, w, rng)
    got = np.asarray(bsa.dq_from_tiles(jnp.asarray(ws), s_q, d, w, slots=slots))
    want = parts[0]
    for p in range(1, slots):
        want = want + parts[p]
    np.testing.assert_array_equal(got, want[:, :s_q])
    if slots == 3:
        # the grouping matters in fp32: (p0 + p1) + p2, not p0 + (p1 + p2)
        other = parts[0] + (parts[1] + parts[2])
        assert not np.array_equal(got, other[:, :s_q])


def test_dq_slots_compile_keys():
    """``bsa_bwd_ws`` ``dqslots=N`` sets ``det_slots`` only in the deterministic sm90ws
    backward with the dQ writer warp (and so the workspace, the semaphores and the
    reordering key); elsewhere it is 1, or 0 (chosen per call) in the deterministic default.
    The workspace holds ``N`` tiles per query tile."""
    import dataclasses

    from jax_sparse_attn.config import Switches, from_env
    from jax_sparse_attn.validation import check_bsa_args

    pytest.importorskip("cutlass")
    sw = from_env({"JAX_SPARSE_ATTN_BSA_BWD_WS": "dqslots=3"})
    assert sw.bsa_bwd_ws == ("dqslots=3",)
    for d in (64, 128):
        for blk in (64, 128):
            det = bsa.bwd_config(jnp.bfloat16, d, blk, False, sw, deterministic=True)
            assert det.det_slots == 3 and det.det_writer, (d, blk)
            assert bsa.bwd_config(jnp.bfloat16, d, blk, False, sw).det_slots == 1
            # the ordered path's default (detorder; the fixed-point dQ, the default, has one
            # tile per query tile)
            assert bsa.bwd_config(jnp.bfloat16, d, blk, False,
                                  Switches(bsa_bwd_ws=("detorder",)),
                                  deterministic=True).det_slots == 0
    no_writer = dataclasses.replace(sw, det_writer=False)
    assert bsa.bwd_config(jnp.bfloat16, 128, 64, False, no_writer,
                          deterministic=True).det_slots == 1
    rows = dataclasses.replace(sw, bsa_bwd_dq="rows")
    assert bsa.bwd_config(jnp.bfloat16, 128, 128, False, rows, deterministic=True).det_slots == 1
    x = jnp.zeros((1, 2, 130, 64), jnp.bfloat16)
    cfg = check_bsa_args(x, x, x, jnp.zeros((1, 2, 3, 1), jnp.int32), 1, layout="bhsd",
                         sparse_block_size=64)
    det = bsa.bwd_config(jnp.bfloat16, 64, 64, False, sw, deterministic=True)
    assert bsa.dq_tile_shape(dataclasses.replace(cfg, bwd=det)) == (1, 2, 9, 64 * 64)
    one = bsa.bwd_config(jnp.bfloat16, 64, 64, False, from_env({"JAX_SPARSE_ATTN_BSA_BWD_WS":
                                                                "dqslots=1"}),
                         deterministic=True)
    assert bsa.dq_tile_shape(dataclasses.replace(cfg, bwd=one)) == (1, 2, 3, 64 * 64)


@pytest.mark.parametrize("blk,h_kv,k_max,ws,want", [
    (64, 16, 32, "detorder", 2), (64, 16, 64, "detorder", 2), (64, 16, 13, "detorder", 1),
    (64, 16, 31, "detorder", 1), (64, 4, 32, "detorder", 1), (128, 16, 32, "detorder", 1),
    (128, 16, 32, "", 1),
    (64, 16, 32, "", 1), (64, 16, 32, "detlaunch", 1),
    (64, 16, 32, "detsched", 1), (64, 16, 13, "dqslots=3", 3), (128, 4, 16, "dqslots=2", 2)])
def test_det_slots_default(blk, h_kv, k_max, ws, want):
    """The ordered deterministic backward's dQ accumulators per query tile: 2 at blk 64 in
    the schedule order (query heads = KV heads, no order option) where query rows list at
    least ``DET_SLOTS_MIN_K`` KV blocks, else 1; ``dqslots=N`` wherever it is given. The
    fixed-point dQ (the default) has one tile per query tile."""
    import dataclasses

    from jax_sparse_attn.config import from_env
    from jax_sparse_attn.validation import check_bsa_args

    pytest.importorskip("cutlass")
    s = 16384
    q = jax_struct((1, 16, s, 128))
    k = jax_struct((1, h_kv, s, 128))
    idx = jnp.zeros((1, 16, s // blk, k_max), jnp.int32)
    cfg = check_bsa_args(q, k, k, idx, k_max, layout="bhsd", sparse_block_size=blk)
    sw = from_env({"JAX_SPARSE_ATTN_BSA_BWD_WS": ws} if ws else {})
    det = bsa.bwd_config(jnp.bfloat16, 128, blk, False, sw, deterministic=True)
    cfg = dataclasses.replace(cfg, bwd=det)
    assert bsa.det_slots_of(cfg) == want
    assert bsa.dq_tile_shape(cfg)[2] == -(-s // 64) * want
    assert bsa.det_slots_of(dataclasses.replace(
        cfg, bwd=bsa.bwd_config(jnp.bfloat16, 128, blk, False, sw))) == 1


def jax_struct(shape):
    import jax

    return jax.ShapeDtypeStruct(shape, jnp.bfloat16)


def test_det_slots_keep_32_bit_offsets():
    """The slots' workspace stays within the kernels' 32-bit element offsets: at B 4, H 32,
    S 65536, D 128 (2^30 floats per accumulator) the default takes one accumulator and
    ``dqslots=2`` raises ``NotImplementedError`` naming the option; at B 2 the default
    takes two."""
    import dataclasses

    from jax_sparse_attn.config import Switches, from_env
    from jax_sparse_attn.validation import check_bsa_args

    pytest.importorskip("cutlass")

    def cfg_for(b, sw):
        q = jax_struct((b, 32, 65536, 128))
        idx = jnp.zeros((b, 32, 1024, 32), jnp.int32)
        cfg = check_bsa_args(q, q, q, idx, 32, layout="bhsd", sparse_block_size=64)
        return dataclasses.replace(cfg, bwd=bsa.bwd_config(jnp.bfloat16, 128, 64, False, sw,
                                                           deterministic=True))

    # the ordered path (detorder; the fixed-point dQ is the default)
    order = Switches(bsa_bwd_ws=("detorder",))
    assert bsa.det_slots_of(cfg_for(2, order)) == 2
    assert bsa.det_slots_of(cfg_for(4, order)) == 1
    two = from_env({"JAX_SPARSE_ATTN_BSA_BWD_WS": "dqslots=2"})
    with pytest.raises(NotImplementedError, match="dqslots=2"):
        bsa.det_slots_of(cfg_for(4, two))
    assert bsa.det_slots_of(cfg_for(2, two)) == 2


@pytest.mark.parametrize("d,blk,env,want", [
    (128, 64, {}, False), (64, 64, {}, False), (128, 128, {}, False),
    (128, 128, {"JAX_SPARSE_ATTN_BSA_BWD_WS": "detorder"}, False),
    (128, 64, {"JAX_SPARSE_ATTN_BSA_BWD_WS": "nodetstream"}, False),
    (128, 128, {"JAX_SPARSE_ATTN_BSA_BWD_WS": "detstream"}, True),
    (64, 64, {"JAX_SPARSE_ATTN_BSA_BWD_WS": "detsched,detstream"}, True),
    (128, 64, {"JAX_SPARSE_ATTN_BSA_BWD_WS": "detoverlap"}, False),
    (128, 64, {"JAX_SPARSE_ATTN_DET_WRITER": "0", "JAX_SPARSE_ATTN_BSA_BWD_WS": "detstream"},
     True),
    (128, 64, {"JAX_SPARSE_ATTN_PDL": "0", "JAX_SPARSE_ATTN_BSA_BWD_WS": "detstream"}, True)])
def test_det_stream_default(d, blk, env, want):
    """The deterministic backward streams the schedule order with ``detstream`` only (not by
    default, not with ``nodetstream``), whatever the shape, ``pdl`` or the dQ writer warp;
    ``detoverlap`` alone does not; the non-deterministic backward never does."""
    from jax_sparse_attn.config import from_env

    pytest.importorskip("cutlass")
    sw = from_env(env)
    det = bsa.bwd_config(jnp.bfloat16, d, blk, False, sw, deterministic=True)
    assert det.det_stream is want
    assert det.det_overlap is False
    assert bsa.bwd_config(jnp.bfloat16, d, blk, False, sw).det_stream is False
