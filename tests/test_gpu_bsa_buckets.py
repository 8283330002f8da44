"""GPU: the sm90ws block-sparse backward with ``bsa_bwd_ws=buckets=N``: K->Q lists of more than
N entries split across CTAs in buckets (``metadata.kq_bucket_items``), each bucket's fp32
dK / dV partial summed in bucket order by the bucket that completes its row. The sm90ws
backward cases of ``tests/test_gpu_bsa.py`` (NaN in unlisted blocks and past block_sizes,
every KV block listed, GQA 8:1, one KV block listed by every query block of a 32768-token
sequence, empty rows, outputs poisoned by an all-NaN run) against the float32 reference (5x
the input-dtype error), dK / dV bitwise equal over runs, and the deterministic cases on the
fixed-point dQ (5 runs bitwise equal).

Run on the H200: ``python -m pytest -m gpu tests/test_gpu_bsa_buckets.py``.
"""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import test_gpu_bsa as tb  # noqa: E402
from jax_sparse_attn.config import Switches, from_env  # noqa: E402

pytestmark = pytest.mark.gpu

#: small buckets, so that most lists of the cases are split
N = 3
BUCKETS = Switches(bsa_bwd_impl="sm90ws", bsa_bwd_ws=(f"buckets={N}",))
CASES = [c for c in tb.BWD_WS_CASES if not c.get("pack")]
DET = [c for c in tb.DET_CASES if not c.get("ws")]


def _key(c, switches, **kw):
    from jax_sparse_attn.ffi import bsa as fb

    return fb.bwd_config(jnp.dtype(c["dtype"]), c["d"], c["blk"], False, switches, **kw)


@pytest.mark.parametrize("c", CASES, ids=lambda c: c["name"])
def test_bsa_bwd_buckets(c, monkeypatch):
    assert _key(c, BUCKETS).ws_buckets == N
    monkeypatch.setattr(tb, "BWDWS", BUCKETS)
    tb.test_bsa_sm90ws_backward(c)


@pytest.mark.parametrize("c", [c for c in CASES if "last" in c["name"]], ids=lambda c: c["name"])
def test_bsa_bwd_autobuckets(c, monkeypatch):
    """``autobuckets`` (the bucket size from the lists' static shape): the cases whose last
    KV block every query block lists (its K->Q list the longest) against the reference."""
    sw = Switches(bsa_bwd_impl="sm90ws", bsa_bwd_ws=("autobuckets",))
    assert _key(c, sw).ws_buckets == -1
    monkeypatch.setattr(tb, "BWDWS", sw)
    tb.test_bsa_sm90ws_backward(c)


@pytest.mark.parametrize("c", [c for c in CASES if "all" in c["name"] or "gqa8" in c["name"]],
                         ids=lambda c: c["name"])
def test_bsa_bwd_buckets_bitwise(c):
    """dK / dV of the split lists bitwise equal over three runs (whichever bucket finishes
    last adds the partials in bucket order), and close to the unsplit backward's."""
    import jax_sparse_attn as jsa

    (q, k, v), (kp, vp), idx, nums, sizes = tb._ws_inputs(c)
    kw = dict(layout=c["layout"], sparse_block_size=c["blk"], softmax_scale=0.6 / np.sqrt(c["d"]))
    do = jnp.asarray(np.random.default_rng(13).standard_normal(q.shape, np.float32)).astype(q.dtype)

    def grads(sw):
        @jax.jit
        def f(q, k, v, do):
            _, vjp = jax.vjp(lambda q, k, v: jsa.block_sparse_attention(
                q, k, v, idx, None, sizes, nums, allow_empty_block_nums=True, backend="kernel",
                switches=sw, **kw), q, k, v)
            return vjp(do)
        return [np.asarray(x.astype(jnp.float32)) for x in jax.block_until_ready(f(q, kp, vp, do))]

    runs = [grads(BUCKETS) for _ in range(3)]
    for r in runs[1:]:
        for name, a, b in zip(("dk", "dv"), runs[0][1:], r[1:]):
            np.testing.assert_array_equal(a, b, err_msg=name)
    whole = grads(tb.BWDWS)
    for name, a, b in zip(("dq", "dk", "dv"), runs[0], whole):
        scale = float(np.abs(b).max()) or 1.0
        assert np.abs(a - b).max() <= 2e-2 * scale, name


@pytest.mark.parametrize("c", DET, ids=lambda c: c["name"])
def test_bsa_bwd_buckets_deterministic(c, monkeypatch):
    """deterministic=True (the fixed-point dQ) with the split lists: 5 runs bitwise equal,
    against the reference."""
    monkeypatch.setenv("JAX_SPARSE_ATTN_BSA_BWD_WS", f"buckets={N}")
    key = _key(c, from_env(), deterministic=True, causal=bool(c.get("causal")))
    assert key.dq_fixed and key.ws_buckets == N, key
    tb.test_bsa_bwd_deterministic(c, monkeypatch)
