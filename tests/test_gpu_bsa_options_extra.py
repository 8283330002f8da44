"""GPU: block-sparse option cases that the option suites do not have (``kv_splits``,
``pack_gqa``, ``causal`` on the kernels vs the float32 reference).

The checks are those of the option suites, reused (not copied): each case runs the public
forward (out, lse) and backward (dq, dk, dv) on the kernel backend after an all-NaN run
(poisoned output buffers) and applies the rule of ``tests/attention_base.py`` (kernel error
vs the float32 reference <= 2x (forward, lse) / 5x (backward) the error of the reference in
the input dtype, plus a small atol; NaN never passes; rows without keys exactly 0 / -inf).
Inputs hold NaN (and Inf) in every K/V row no query row sees. New here:

* ``pack_gqa`` (``tests/test_gpu_bsa_pack_gqa.py``'s check): r = 2 at D 64 on the sm90ws forward
  (blk 64) with B = 3 and S_q = 113, r = 2 at D 64 / S_q 17 on sm90ws (blk 128) with rank-2
  ``block_sizes``, r = 64 (one position per 64-row slice, MQA) and r = 32 with S_q = 1023.
* ``kv_splits`` (``tests/test_gpu_bsa_splits.py``'s check): S_q 17 with r = 3 (not dividing
  blk) and more splits than listed blocks, 16 splits (the combine kernel's largest unrolled
  count) with S_q = S_kv = 1023 MQA, 17 splits (its smallest runtime-count one), the mma.sync
  forward at D 256 / blk 128.
* ``causal`` with ``kv_splits`` (``tests/test_gpu_bsa_causal.py``'s check, NaN/Inf in
  every key no row sees): S_q > S_kv (1023 vs 129) with r = 3 and empty rows, S_q = 333 on
  the sm90ws forward (switch named) at blk 128 with 7 splits, future-only and empty rows, ``"auto"`` with
  S_q > S_kv on sm90ws.
* every count 0 with splits and causal and all-NaN K/V; zero-size calls (S_q = 0, S_kv = 0,
  B = 0) on every path: out 0, lse -inf, zero gradients, no launch error.

Run on the H200 (7 processes, about 2 cases each, within 120 s):
``T=120 OUT=$OUT bash scripts/sessions/gpu_r1.sh`` (logs in ``$OUT/r1_logs.tgz``), or by hand
``seq 0 6 | XLA_PYTHON_CLIENT_PREALLOCATE=false xargs -P 7 -I{} env EXTRA_SHARD={}/7
timeout 115 python3 -m pytest -m gpu -q -rA tests/test_gpu_bsa_options_extra.py``.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import test_gpu_bsa_causal as gc  # noqa: E402
import test_gpu_bsa_pack_gqa as gp  # noqa: E402
import test_gpu_bsa_splits as gs  # noqa: E402
from attention_base import bsa_fwd_vjp, shard  # noqa: E402
from jax_sparse_attn.config import Switches  # noqa: E402

pytestmark = pytest.mark.gpu

SHARD = os.environ.get("EXTRA_SHARD", "")

PACK = [
    gp.PackCase("x-r2-blk64-d64-fp16-bshd-b3-sq113", 2, 64, d=64, dtype="float16",
                layout="bshd", sq=113, skv=777, kmax=5, b=3),
    gp.PackCase("x-r2-blk128-d64-bf16-sq17-sizes2", 2, 128, d=64, sq=17, skv=1000,
                sizes_rank=2),
    gp.PackCase("x-r64-blk128-d64-bf16-mqa-sq17", 64, 128, d=64, hkv=1, sq=17, skv=513,
                kmax=3),
    gp.PackCase("x-r32-blk64-d128-fp16-sq1023", 32, 64, dtype="float16", hkv=1, sq=1023,
                skv=300, kmax=3, b=1),
]
# (name, blk, d, dtype, layout, hq, hkv, sq, skv, kmax, sizes, bsa_fwd_impl), kv_splits
SPLITS = [
    (("x-ws-blk128-d64-r3-sq17", 128, 64, "float16", "bhsd", 6, 2, 17, 1500, 3, True,
      "auto"), 7),
    (("x-ws-blk64-d128-mqa-sq1023", 64, 128, "bfloat16", "bshd", 2, 1, 1023, 1023, 16,
      False, "auto"), 16),
    (("x-ws-blk64-d64-splits17", 64, 64, "bfloat16", "bhsd", 2, 2, 65, 1400, 20, False,
      "sm90ws"), 17),
    (("x-mma-blk128-d256-sq113", 128, 256, "float16", "bhsd", 2, 1, 113, 700, 6, True,
      "auto"), 5),
]
CAUSAL = [
    (gc.CausalCase("x-bf16-blk64-d64-sq-gt-skv-r3-empty", blk=64, d=64, layout="bshd", hq=6,
                   hkv=2, sq=1023, skv=129, kmax=3, counts="empty"), 5),
    (gc.CausalCase("x-fp16-blk128-d128-sq333-ws-future-gqa", dtype="float16", hq=8, hkv=2,
                   sq=333, skv=4001, kmax=6, pattern="future", counts="empty", impl="sm90ws",
                   b=3), 7),
    (gc.CausalCase("x-bf16-blk128-d64-sq300-skv129-ws", d=64, sq=300, skv=129, kmax=2),
     "auto"),
]
CASES = ([("pack", c) for c in PACK] + [("splits", c) for c in SPLITS]
         + [("causal", c) for c in CAUSAL] + [("empty", None), ("zero", None)])


def _id(case):
    kind, c = case
    if kind == "pack":
        return c.name
    if kind == "splits":
        return f"{c[0][0]}-kv{c[1]}"
    if kind == "causal":
        return f"{c[0].name}-kv{c[1]}"
    return kind


@pytest.mark.parametrize("case", shard(CASES, SHARD), ids=_id)
def test_bsa_options_extra(case, monkeypatch):
    kind, c = case
    if kind == "pack":
        gp.test_bsa_pack_gqa_kernel_vs_reference(c)
    elif kind == "splits":
        gs._check_case(*c)
    elif kind == "causal":
        cc, ks = c
        run = gc._kernel
        # the causal suite's check with the split forward: only the kernel call splits
        monkeypatch.setattr(gc, "_kernel", lambda c_, x, *a: run(
            c_, dict(x, kw=dict(x["kw"], kv_splits=ks)), *a))
        gc.test_bsa_causal_kernel_vs_reference(cc)
    elif kind == "empty":
        _check_all_rows_empty()
    else:
        _check_zero_sizes()


def _check_all_rows_empty():
    """Every count 0, K/V all NaN, kv_splits=3 and causal: out 0, lse -inf, grads 0, no NaN
    (the split forward, the combine kernel and the backward on empty lists)."""
    rng = np.random.default_rng(11)
    for blk, impl in ((128, "auto"), (64, "sm90ws")):
        b, hq, hkv, sq, skv, d, kmax = 2, 4, 2, 300, 700, 128, 4
        nq = -(-sq // blk)
        q, do = (jnp.asarray(rng.standard_normal((b, hq, sq, d)), jnp.bfloat16)
                 for _ in range(2))
        kv = jnp.full((b, hkv, skv, d), jnp.nan, jnp.bfloat16)
        idx = jnp.asarray(rng.integers(-3, 99, (b, hq, nq, kmax)), jnp.int32)  # all inactive
        nums = jnp.zeros((b, hq, nq), jnp.int32)
        kw = dict(q2k_block_nums=nums, sparse_block_size=blk, allow_empty_block_nums=True,
                  backend="kernel", kv_splits=3, causal=True, switches=Switches(bsa_fwd_impl=impl))
        f = bsa_fwd_vjp(idx, **kw)

        jax.block_until_ready(f(q * jnp.nan, kv, kv, do))  # poisoned buffers
        out, lse, dq, dk, dv = (np.asarray(x, np.float32) for x in f(q, kv, kv, do))
        assert np.all(out == 0) and np.all(np.isneginf(lse)), blk
        assert np.all(dq == 0) and np.all(dk == 0) and np.all(dv == 0), blk


def _check_zero_sizes():
    """S_q = 0, S_kv = 0 (every row empty by the contract) and B = 0 on the kernel backend,
    kv_splits 1 and 3, causal off and on: no launch error, out 0, lse -inf, zero grads."""
    import jax_sparse_attn as jsa

    for sq, skv, b, ks, causal in ((0, 300, 1, 1, False), (0, 300, 1, 3, True),
                                   (100, 0, 1, 1, True), (100, 0, 2, 2, False),
                                   (100, 300, 0, 1, False)):
        nq = -(-sq // 128)
        q = jnp.ones((b, 4, sq, 128), jnp.bfloat16)
        kv = jnp.ones((b, 2, skv, 128), jnp.bfloat16)
        idx = jnp.zeros((b, 4, nq, 2), jnp.int32)
        nums = jnp.zeros((b, 4, nq), jnp.int32)
        kw = dict(q2k_block_nums=nums, allow_empty_block_nums=True, backend="kernel",
                  kv_splits=ks, causal=causal)

        def loss(q, k, v):
            return jnp.sum(jsa.block_sparse_attention(q, k, v, idx, **kw).astype(jnp.float32))

        out, lse = jsa.block_sparse_attention_forward(q, kv, kv, idx, **kw)
        grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, kv, kv)
        case = (sq, skv, b, ks, causal)
        assert out.shape == (b, 4, sq, 128) and lse.shape == (b, 4, sq), case
        assert np.all(np.asarray(out, np.float32) == 0), case
        assert np.all(np.isneginf(np.asarray(lse))), case
        for g, x in zip(grads, (q, kv, kv)):
            assert g.shape == x.shape and np.all(np.asarray(g, np.float32) == 0), case
