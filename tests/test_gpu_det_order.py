"""GPU: the schedule order of the deterministic block-sparse backward (``bsa_bwd_ws`` options
``detsched`` / ``detschedfull``): the order kernel (``kernels/bsa_det_order.py``) against its
numpy definition ``metadata.kq_schedule_order_reference`` (equal entries and ranks, bit for
bit), and the deterministic cases of ``tests/test_gpu_bsa.py`` run with the order (five
runs bitwise equal, the float32 reference within 5x the input-dtype error).

Run on the H200: ``python -m pytest -m gpu tests/test_gpu_det_order.py``.
"""

from __future__ import annotations

import types

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import test_gpu_bsa as tb  # noqa: E402
from jax_sparse_attn import metadata  # noqa: E402
from jax_sparse_attn.config import from_env  # noqa: E402

pytestmark = pytest.mark.gpu

ORDER_CASES = [  # name, b, h_q, h_kv, n_q, n_kv, k_max, held, window, ragged
    ("blk64-like", 1, 4, 4, 256, 256, 32, 264, 132, False),
    ("blk128-gqa4", 2, 8, 2, 128, 128, 16, 132, 66, True),
    ("long-rows-window1", 1, 2, 1, 64, 8, 8, 4, 1, False),
    ("all-listed-more-rows-than-threads", 1, 2, 1, 12, 1500, 1500, 300, 150, False),
    ("empty-rows", 2, 2, 2, 40, 50, 3, 20, 10, True),
]


#: the order kernel's (fast, scan, starts computed in the kernel) builds: the default, then
#: ``ordfast`` (which computes the starts) / ``ordscan=N``
ORDER_VARIANTS = [(False, 4, False), (True, 4, True), (True, 8, True), (True, 16, True),
                  (False, 8, False), (True, 4, False)]


@pytest.mark.parametrize("variant", ORDER_VARIANTS,
                         ids=lambda v: f"fast{int(v[0])}-scan{v[1]}-starts{int(v[2])}")
@pytest.mark.parametrize("case", ORDER_CASES, ids=[c[0] for c in ORDER_CASES])
def test_order_kernel_matches_reference(case, variant):
    import dataclasses

    from jax_sparse_attn.ffi import bsa as fb

    _, b, h_q, h_kv, n_q, n_kv, k_max, held, window, ragged = case
    rng = np.random.default_rng(n_q * 7 + n_kv)
    idx = np.argsort(rng.random((b, h_q, n_q, n_kv)), axis=-1)[..., :k_max].astype(np.int32)
    nums = (rng.integers(0, k_max + 1, (b, h_q, n_q)) if ragged
            else np.full((b, h_q, n_q), k_max)).astype(np.int32)
    if case[0] == "empty-rows":
        nums[:, :, ::3] = 0
    # the configuration the backward would build (det_order_config), with this window
    ocfg = fb.det_order_config(_order_cfg_fields(h_q, h_kv, n_q, n_kv, k_max, window))
    assert ocfg is not None, "the case does not fit the order kernel"
    ocfg = dataclasses.replace(ocfg, fast=variant[0], scan=variant[1],
                               held=held if variant[2] else 0)

    @jax.jit
    def order(idx, nums):
        off, ent = metadata.build_kq_csr(idx, nums, num_kv_heads=h_kv, num_kv_blocks=n_kv)
        e2, r2 = fb.det_schedule_order(off, ent, ocfg, held)
        return off, ent, e2, r2

    off, ent, e2, r2 = (np.asarray(x) for x in jax.block_until_ready(order(idx, nums)))
    starts = np.asarray(metadata.kq_schedule_starts(jnp.asarray(off), num_kv_blocks=n_kv,
                                                    held=held))
    want_e, want_r = metadata.kq_schedule_order_reference(off, ent, starts, num_kv_blocks=n_kv,
                                                          window=window)
    end = int(off[-1])
    np.testing.assert_array_equal(e2[:end], want_e)
    np.testing.assert_array_equal(r2[:end], want_r)
    # and the same again (the kernel's result does not depend on timing)
    again = [np.asarray(x) for x in jax.block_until_ready(order(idx, nums))]
    np.testing.assert_array_equal(again[2][:end], e2[:end])
    np.testing.assert_array_equal(again[3][:end], r2[:end])


def _order_cfg_fields(h_q, h_kv, n_q, n_kv, k_max, window):
    """The ``BsaConfig`` fields that ``ffi.bsa.det_order_config`` reads."""
    return types.SimpleNamespace(num_heads_q=h_q, num_heads_kv=h_kv, num_q_blocks=n_q,
                                 num_kv_blocks=n_kv, k_max=k_max,
                                 bwd=types.SimpleNamespace(det_window=window))


@pytest.mark.parametrize("ws", ["detsched", "detschedfull", "detsched,ordfast,ordscan=8"])
@pytest.mark.parametrize("c", tb.DET_CASES, ids=lambda c: c["name"])
def test_bsa_bwd_det_sched(c, ws, monkeypatch):
    from jax_sparse_attn.ffi import bsa as fb

    # the parametrized order replaces an order the case names itself (the switches take one)
    own = [f for f in (c.get("ws") or "").split(",")
           if f and f not in ("detkv", "detfull", "detlaunch", "detsched", "detschedfull")]
    c = dict(c, ws=",".join(own))
    monkeypatch.setenv("JAX_SPARSE_ATTN_BSA_BWD_WS", ws)
    key = fb.bwd_config(jnp.dtype(c["dtype"]), c["d"], c["blk"], False, from_env(),
                        deterministic=True)
    assert key.impl == "sm90ws" and key.det_window > 0, key
    # the case runs the order kernel, not the fallback to the launch-group order
    n_q, n_kv = -(-c["sq"] // c["blk"]), -(-c["skv"] // c["blk"])
    k_max = n_kv if c["mode"] == "all" else min(4, n_kv)  # as tb._ws_inputs builds them
    assert fb.det_order_config(_order_cfg_fields(c["hq"], c["hkv"], n_q, n_kv, k_max,
                                                 key.det_window)) is not None
    tb.test_bsa_bwd_deterministic(c, monkeypatch)
