"""Sharding checks on every local device (run as a script; prints one JSON line).

CPU: ``XLA_FLAGS=--xla_force_host_platform_device_count=2 python tests/sharding_worker.py``
(tests/test_sharding.py does this in a subprocess). GPU: ``python tests/sharding_worker.py
--backend kernel`` on a 2-GPU host. For batch- and head-sharded HSTU and BSA, forward and
grad under jax.jit with NamedSharding inputs: max abs difference to the single-device
result, and the collectives in the compiled HLO (there must be no all-gather / all-to-all;
the loss all-reduce is the only collective). Then two steps of examples/hstu_dp_train.py.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import sys

import numpy as np

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import jax_sparse_attn as jsa
from jax_sparse_attn import masks
from jax_sparse_attn.sharding import (
    block_sparse_attention_sharded,
    hstu_attention_sharded,
    shard_cu_seqlens,
)

COLLECTIVES = ("all-gather", "all-to-all", "collective-permute", "reduce-scatter", "all-reduce")


def _collectives(compiled_text):
    return {c: len(re.findall(rf"\b{c}(?:-start)?\(", compiled_text)) for c in COLLECTIVES}


def _diff(a, b):
    """Max abs difference over the leaves; NaN counts as inf (Python's max() skips a NaN
    that is not its first argument, so a NaN gradient after a finite loss gave 0)."""
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    assert len(la) == len(lb) and la, (len(la), len(lb))
    diffs = []
    for x, y in zip(la, lb):
        assert x.shape == y.shape, (x.shape, y.shape)
        d = float(jnp.max(jnp.abs(jnp.asarray(x, jnp.float32) - jnp.asarray(y, jnp.float32))))
        diffs.append(float("inf") if np.isnan(d) else d)
    return max(diffs)


def _check(name, f_single, f_sharded, args, shardings, out):
    """f(*args) -> scalar loss-like output; compare fwd+grad and list collectives."""
    g_single = jax.jit(jax.value_and_grad(f_single, argnums=(0, 1, 2)))
    g_sharded = jax.jit(jax.value_and_grad(f_sharded, argnums=(0, 1, 2)))
    placed = [jax.device_put(a, s) for a, s in zip(args, shardings)]
    want = g_single(*args)
    got = g_sharded(*placed)
    text = g_sharded.lower(*placed).compile().as_text()
    scale = max(float(jnp.max(jnp.abs(jnp.asarray(x, jnp.float32)))) for x in jax.tree.leaves(want))
    out[name] = {"max_abs_diff": _diff(got, want), "scale": scale,
                 "collectives": _collectives(text),
                 "grad_sharding": str(got[1][0].sharding.spec)}


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="reference")
    ap.add_argument("--train-steps", type=int, default=2)
    args = ap.parse_args(argv)
    backend = args.backend
    dt = jnp.float32 if backend == "reference" else jnp.bfloat16
    devs = jax.devices()
    n = len(devs)
    out = {"devices": n, "platform": devs[0].platform, "backend": backend}
    rng = np.random.default_rng(0)

    # ---- HSTU, tokens sharded by whole sequences
    t_local, h, d = 256, 2, 64
    per_shard = [[int(x) for x in rng.integers(0, 90, size=3)] for _ in range(n)]
    cu = jnp.asarray(shard_cu_seqlens(per_shard, t_local))
    ks = jax.random.split(jax.random.PRNGKey(0), 4)
    q, k, v = (jax.random.normal(kk, (n * t_local, 2 * n, d), dt) for kk in ks[:3])
    w = jax.random.normal(ks[3], q.shape, jnp.float32)
    opts = dict(max_seqlen_q=90, max_seqlen_k=90, alpha=0.1, backend=backend)
    mesh = Mesh(np.array(devs), ("data",))

    def single(q, k, v, cu, w):
        return jnp.sum(jsa.hstu_attention(q, k, v, cu, cu, **opts).astype(jnp.float32) * w)

    def sharded_tok(q, k, v, cu, w):
        o = hstu_attention_sharded(q, k, v, cu, cu, mesh=mesh, token_axis="data", **opts)
        return jnp.sum(o.astype(jnp.float32) * w)

    tok = NamedSharding(mesh, P("data"))
    _check("hstu_token_sharded", single, sharded_tok, (q, k, v, cu, w), (tok,) * 5, out)

    # ---- HSTU, heads sharded (one packed batch)
    cu1 = cu[:1]
    qh, kh, vh = (x[:t_local] for x in (q, k, v))
    wh = w[:t_local]

    def single_h(q, k, v, cu, w):
        return jnp.sum(jsa.hstu_attention(q, k, v, cu[0], cu[0], **opts).astype(jnp.float32) * w)

    def sharded_h(q, k, v, cu, w):
        o = hstu_attention_sharded(q, k, v, cu, cu, mesh=mesh, head_axis="data", **opts)
        return jnp.sum(o.astype(jnp.float32) * w)

    hs, rep = NamedSharding(mesh, P(None, "data")), NamedSharding(mesh, P())
    _check("hstu_head_sharded", single_h, sharded_h, (qh, kh, vh, cu1, wh),
           (hs, hs, hs, rep, hs), out)

    # ---- HSTU with a relative attention bias: per head over token shards (sequence s of
    # the per-shard batch is rab row s), per head over head shards, one bias for all heads
    kr = jax.random.split(jax.random.PRNGKey(2), 3)
    rab_tok = jax.random.normal(kr[0], (n * 3, 2 * n, 90, 90), jnp.float32)

    def single_r(q, k, v, cu, w, rab):
        return jnp.sum(jsa.hstu_attention(q, k, v, cu, cu, rab=rab, **opts).astype(jnp.float32)
                       * w)

    def sharded_tok_r(q, k, v, cu, w, rab):
        o = hstu_attention_sharded(q, k, v, cu, cu, mesh=mesh, token_axis="data", rab=rab,
                                   **opts)
        return jnp.sum(o.astype(jnp.float32) * w)

    _check("hstu_token_sharded_rab", single_r, sharded_tok_r, (q, k, v, cu, w, rab_tok),
           (tok,) * 6, out)
    for name, h_rab, spec in (("hstu_head_sharded_rab", 2 * n, P(None, "data")),
                              ("hstu_head_sharded_rab1", 1, P())):
        rab_h = jax.random.normal(kr[1], (3, h_rab, 90, 90), jnp.float32)

        def single_hr(q, k, v, cu, w, rab):
            return jnp.sum(jsa.hstu_attention(q, k, v, cu[0], cu[0], rab=rab, **opts)
                           .astype(jnp.float32) * w)

        def sharded_hr(q, k, v, cu, w, rab):
            o = hstu_attention_sharded(q, k, v, cu, cu, mesh=mesh, head_axis="data", rab=rab,
                                       **opts)
            return jnp.sum(o.astype(jnp.float32) * w)

        _check(name, single_hr, sharded_hr, (qh, kh, vh, cu1, wh, rab_h),
               (hs, hs, hs, rep, hs, NamedSharding(mesh, spec)), out)

    # ---- BSA, batch- and head-sharded
    b, hq, hkv, s, blk = 2 * n, 2 * n, n, 512, 64
    ks = jax.random.split(jax.random.PRNGKey(1), 4)
    bq = jax.random.normal(ks[0], (b, hq, s, d), dt)
    bk = jax.random.normal(ks[1], (b, hkv, s, d), dt)
    bv = jax.random.normal(ks[2], (b, hkv, s, d), dt)
    bw = jax.random.normal(ks[3], bq.shape, jnp.float32)
    idx, nums = masks.topk_block_index(bq, jnp.repeat(bk, hq // hkv, axis=1), 3,
                                       sparse_block_size=blk)
    bopts = dict(q2k_block_nums=nums, sparse_block_size=blk, backend=backend)

    def bsingle(q, k, v, w):
        return jnp.sum(jsa.block_sparse_attention(q, k, v, idx, **bopts).astype(jnp.float32) * w)

    for axis_name, spec in (("bsa_batch_sharded", dict(batch_axis="data")),
                            ("bsa_head_sharded", dict(head_axis="data"))):
        def bsharded(q, k, v, w, spec=spec):
            o = block_sparse_attention_sharded(q, k, v, idx, mesh=mesh, **spec, **bopts)
            return jnp.sum(o.astype(jnp.float32) * w)

        xs = NamedSharding(mesh, P("data") if "batch_axis" in spec else P(None, "data"))
        _check(axis_name, bsingle, bsharded, (bq, bk, bv, bw), (xs,) * 4, out)

    # ---- a mesh of jax.make_mesh (explicit axes by default): inputs placed anywhere, eager
    # and under jit, both helpers equal the single-device calls
    emesh = jax.make_mesh((n,), ("data",))
    want_h = jsa.hstu_attention(q, k, v, cu, cu, **opts)
    want_b = jsa.block_sparse_attention(bq, bk, bv, idx, **bopts)
    diffs = []
    for wrap in (lambda f: f, jax.jit):
        diffs.append(_diff(wrap(lambda q, k, v: hstu_attention_sharded(
            q, k, v, cu, cu, mesh=emesh, token_axis="data", **opts))(q, k, v), want_h))
        diffs.append(_diff(wrap(lambda q, k, v: block_sparse_attention_sharded(
            q, k, v, idx, mesh=emesh, batch_axis="data", **bopts))(bq, bk, bv), want_b))
    # a mesh mixing an explicit and an automatic axis, both named by the helpers
    mmesh = jax.make_mesh((n, 1), ("data", "h"), axis_types=(jax.sharding.AxisType.Explicit,
                                                             jax.sharding.AxisType.Auto))
    diffs.append(_diff(jax.jit(lambda q, k, v: block_sparse_attention_sharded(
        q, k, v, idx, mesh=mmesh, batch_axis="data", head_axis="h", **bopts))(bq, bk, bv),
        want_b))
    diffs.append(_diff(hstu_attention_sharded(q, k, v, cu, cu, mesh=mmesh, token_axis="data",
                                              head_axis="h", **opts), want_h))
    out["explicit_mesh"] = {"max_abs_diff": max(diffs),
                            "axis_types": [str(t) for t in emesh.axis_types]}

    # ---- the data-parallel training example
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "examples"))
    import hstu_dp_train  # noqa: PLC0415

    res = hstu_dp_train.run(devs, steps=args.train_steps, tokens_per_device=512,
                            backend=backend, dtype=dt, vocab=128, d_model=32, head_dim=32)
    out["train"] = {"losses": res["losses"], "tokens_per_s": res["tokens_per_s"]}
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    main()
