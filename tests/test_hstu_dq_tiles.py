"""The query-tile dQ workspace of the sm90 HSTU backward (``hstu_bwd_dq="tile"``): the host
reordering ``ffi.hstu.dq_from_tiles`` inverts the kernel's store order (emulated here in
numpy from the wgmma accumulator layout), reads only rows inside their sequence and handles
zero-length sequences. CPU only: the kernel itself is checked on the GPU
(``tests/test_gpu_hstu.py``, ``test_hstu_bwd_batches``)."""

from __future__ import annotations

import numpy as np
import pytest

jnp = pytest.importorskip("jax.numpy")

from jax_sparse_attn.ffi.hstu import dq_from_tiles  # noqa: E402


def _kernel_workspace(dq, lens, block_m, rng):
    """What the kernel leaves in the workspace for the per-token fp32 ``dq (T, H, D)``:
    slot ``q_start[b] + t`` holds tile ``t`` of sequence ``b``. Consumer warp ``w`` of
    warpgroup ``wg`` (thread ``4 g + q``) holds the wgmma accumulator of rows ``16 w + 8 h +
    g`` (plus ``64 wg`` at ``block_m = 128``, where the warpgroups split the rows) and
    columns ``8 j + 2 q + e`` (plus ``D / 2 wg`` at ``block_m = 64``, where they split the
    head dim), value ``4 j + 2 h + e``; it stores 8-column group ``j`` into block ``(cg0 +
    j // 8) n_rg + rg`` (``n_rg = block_m / 16``, ``rg`` its row group, ``cg0`` its first
    64-column group) at float ``4 (32 (j % 8) + 4 g + q) + 2 h + e`` of the block's 1024
    (``kernels/dq_tiles.py``, ``stage_warp_slice``). Rows past a sequence's end and unused
    slots hold garbage (never read)."""
    t_q, h, d = dq.shape
    nb = len(lens)
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    # the backward's pseudo-sequence (no query rows); rows past cu[-1] belong to none
    cu_full = np.concatenate([cu, [cu[-1]]]).astype(np.int32)
    lens_full = np.diff(cu_full)
    tiles = -(-lens_full // block_m)
    q_start = np.concatenate([[0], np.cumsum(tiles)]).astype(np.int32)
    n_slots = t_q // block_m + len(cu_full) - 1
    assert q_start[-1] <= n_slots
    ws = rng.standard_normal((n_slots, h, block_m * d)).astype(np.float32) * 1e6
    n_rg = block_m // 16
    cols = d if block_m == 128 else d // 2  # accumulator columns of one warpgroup
    for b in range(nb + 1):
        for t in range(tiles[b]):
            for wg in range(2):
                for w in range(4):
                    rg = 4 * wg + w if block_m == 128 else w
                    cg0 = 0 if block_m == 128 else wg * cols // 64
                    for lane in range(32):
                        g, q = divmod(lane, 4)
                        for j in range(cols // 8):
                            for hh in range(2):
                                for e in range(2):
                                    r = 16 * rg + 8 * hh + g
                                    col = cg0 * 64 + 8 * j + 2 * q + e
                                    row = t * block_m + r
                                    if row < lens_full[b]:
                                        blk = (cg0 + j // 8) * n_rg + rg
                                        off = 1024 * blk + 4 * (32 * (j % 8) + lane) + 2 * hh + e
                                        ws[q_start[b] + t, :, off] = dq[cu_full[b] + row, :, col]
    return ws, cu_full, q_start


@pytest.mark.parametrize("block_m,d", [(64, 128), (128, 64), (64, 256)],
                         ids=["D128", "D64", "D256"])
def test_dq_from_tiles_inverts_the_kernel_order(block_m, d):
    rng = np.random.default_rng(3)
    lens = [1, 0, 63, 64, 65, 129]
    t_q, h = sum(lens) + 70, 2  # 70 rows past the last sequence
    dq = rng.standard_normal((t_q, h, d)).astype(np.float32)
    ws, cu_full, q_start = _kernel_workspace(dq, lens, block_m, rng)
    got = dq_from_tiles(jnp.asarray(ws), jnp.asarray(cu_full), jnp.asarray(q_start), t_q,
                        block_m, d)
    assert got.shape == (t_q, h, d) and got.dtype == jnp.float32
    want = dq.copy()
    want[sum(lens):] = 0.0
    np.testing.assert_array_equal(np.asarray(got), want)
