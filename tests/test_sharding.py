"""Sharded execution on two host CPU devices (a subprocess with
``--xla_force_host_platform_device_count=2``; tests/sharding_worker.py does the work) and
the per-shard cu_seqlens helpers."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import jax_sparse_attn as jsa  # noqa: E402
from jax_sparse_attn.sharding import assign_to_shards, shard_cu_seqlens  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def worker_result():
    flags = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2").strip()
    env = dict(os.environ, XLA_FLAGS=flags,
               JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("JAX_SPARSE_ATTN_FORCE_KERNEL", None)
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "sharding_worker.py")],
                          env=env, capture_output=True, text=True, timeout=1200)
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    assert proc.returncode == 0 and line, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(line[-1][len("RESULT "):])


@pytest.mark.parametrize("case", ["hstu_token_sharded", "hstu_head_sharded",
                                  "hstu_token_sharded_rab", "hstu_head_sharded_rab",
                                  "hstu_head_sharded_rab1",
                                  "bsa_batch_sharded", "bsa_head_sharded"])
def test_sharded_equals_single_device_without_gathers(worker_result, case):
    assert worker_result["devices"] == 2
    r = worker_result[case]
    assert r["max_abs_diff"] < 1e-4, r
    c = r["collectives"]
    # forward + grad run shard-locally: no gather/all-to-all/permute of q, k, v; the only
    # collective is the all-reduce of the scalar loss
    assert c["all-gather"] == 0 and c["all-to-all"] == 0 and c["collective-permute"] == 0, c
    assert c["reduce-scatter"] == 0 and c["all-reduce"] <= 1, c
    assert "data" in r["grad_sharding"]


def test_helpers_take_a_mesh_with_explicit_axes(worker_result):
    """jax.make_mesh's default (explicit axes): both helpers reshard unplaced inputs and
    equal the single-device calls, eager and under jit; also on a mesh mixing an explicit
    and an automatic axis."""
    r = worker_result["explicit_mesh"]
    assert "Explicit" in r["axis_types"][0], r
    assert r["max_abs_diff"] < 1e-5, r


def test_data_parallel_training_example_runs(worker_result):
    losses = worker_result["train"]["losses"]
    assert len(losses) == 2 and all(np.isfinite(losses))


def test_shard_cu_seqlens_and_assign():
    cu = shard_cu_seqlens([[3, 0, 5], [7]], 10)
    np.testing.assert_array_equal(cu, [[0, 3, 3, 8], [0, 7, 7, 7]])
    assert cu.dtype == np.int32
    with pytest.raises(ValueError, match="tokens_per_shard"):
        shard_cu_seqlens([[6, 6]], 10)
    with pytest.raises(ValueError, match="negative"):
        shard_cu_seqlens([[-1]])
    order, per = assign_to_shards([5, 1, 4, 4], 2)
    assert sorted(i for o in order for i in o) == [0, 1, 2, 3]
    assert sorted(sum(p) for p in per) == [6, 8]  # LPT: 5+1 and 4+4
    with pytest.raises(ValueError, match="does not fit"):
        assign_to_shards([11], 2, tokens_per_shard=10)
    # a negative length is refused where it is given, not later by shard_cu_seqlens
    with pytest.raises(ValueError, match=r"lengths must be non-negative, got lengths\[1\]=-1"):
        assign_to_shards([5, -1], 2)


def test_shard_cu_seqlens_refuses_non_integer_lengths_instead_of_truncating():
    """shard_cu_seqlens cast the lengths with np.asarray(..., np.int64), so 3.5 became 3
    without a word (a cu_seqlens other than the caller's packing); assign_to_shards did
    likewise with int(). A non-integer length (also an integral float or a bool: the ops
    take cu_seqlens as integer arrays only) or budget is a TypeError naming the argument."""
    for bad in ([[3.5, 2]], [[3.0]], [[True]], [[2], [1.5]]):
        with pytest.raises(TypeError, match=r"lengths_per_shard\[\d\] must hold int sequence"):
            shard_cu_seqlens(bad)
    with pytest.raises(TypeError, match="tokens_per_shard must be .*int"):
        shard_cu_seqlens([[3]], 10.5)
    with pytest.raises(TypeError, match="lengths must hold int sequence"):
        assign_to_shards([5, 1.5], 2)
    with pytest.raises(TypeError, match="tokens_per_shard must be .*int"):
        assign_to_shards([5, 1], 2, tokens_per_shard=9.5)
    np.testing.assert_array_equal(shard_cu_seqlens([np.array([3, 5], np.int64)], np.int64(9)),
                                  [[0, 3, 8]])


def test_per_shard_cu_seqlens_equal_per_shard_calls():
    """hstu_attention with (num_shards, B_local+1) cu_seqlens = one call per token slice."""
    cu = jnp.asarray(shard_cu_seqlens([[3, 9], [12, 0, 4]], 20))
    ks = jax.random.split(jax.random.PRNGKey(0), 3)
    q, k, v = (jax.random.normal(x, (40, 2, 16)) for x in ks)
    opts = dict(max_seqlen_q=12, max_seqlen_k=12, backend="reference")
    got = jsa.hstu_attention(q, k, v, cu, cu, **opts)
    want = jnp.concatenate([jsa.hstu_attention(q[s * 20:(s + 1) * 20], k[s * 20:(s + 1) * 20],
                                               v[s * 20:(s + 1) * 20], cu[s], cu[s], **opts)
                            for s in range(2)])
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-6)
    with pytest.raises(ValueError, match="divisible by num_shards"):
        jsa.hstu_attention(q[:39], k[:39], v[:39], cu, cu, **opts)
    with pytest.raises(ValueError, match="same num_shards"):
        jsa.hstu_attention(q, k, v, cu, cu[:1], **opts)
    with pytest.raises(ValueError, match="must have rank 1"):  # one 2-D, one 1-D
        jsa.hstu_attention(q, k, v, cu, cu[0], **opts)


def test_bsa_sharded_return_lse_is_differentiable():
    """return_lse: (out, lse) as block_sparse_attention_forward, differentiable in q, k, v
    with cotangents for both (as documented); a one-device mesh, in process."""
    from jax_sparse_attn.sharding import block_sparse_attention_sharded  # noqa: PLC0415

    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("data",))
    ks = jax.random.split(jax.random.PRNGKey(1), 3)
    q, k, v = (jax.random.normal(x, (2, 2, 256, 16)) for x in ks)
    idx = jnp.asarray(np.tile(np.array([[1], [0]], np.int32), (2, 2, 1, 1)))
    opts = dict(block_sparse_num=1, backend="reference")
    w = jnp.arange(256, dtype=jnp.float32) / 256

    def loss(fn):
        def f(q, k, v):
            o, lse = fn(q, k, v)
            return jnp.sum(o * o) + jnp.sum(lse * w)
        return f

    sharded = loss(lambda q, k, v: block_sparse_attention_sharded(
        q, k, v, idx, mesh=mesh, batch_axis="data", return_lse=True, **opts))
    single = loss(lambda q, k, v: tuple(jsa.block_sparse_attention_forward(q, k, v, idx, **opts)))
    o, lse = block_sparse_attention_sharded(q, k, v, idx, mesh=mesh, batch_axis="data",
                                            return_lse=True, **opts)
    assert lse.shape == (2, 2, 256) and lse.dtype == jnp.float32
    got = jax.grad(sharded, argnums=(0, 1, 2))(q, k, v)
    want = jax.grad(single, argnums=(0, 1, 2))(q, k, v)
    for g, h in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(h), rtol=1e-5, atol=1e-5)


def test_hstu_sharded_argument_errors_name_the_argument():
    """hstu_attention_sharded read .shape of its arguments before any check: k=None, a list
    q or func, or mesh=None crashed with AttributeError ('NoneType' object has no attribute
    'shape'). They are the op's ValueError / TypeError naming the argument."""
    from jax.sharding import Mesh

    from jax_sparse_attn.sharding import hstu_attention_sharded

    mesh = Mesh(np.array(jax.devices()[:1]), ("x",))
    q = jnp.ones((8, 2, 4), jnp.float32)
    cu = np.array([[0, 3, 8]], np.int32)
    kw = dict(mesh=mesh, token_axis="x", max_seqlen_q=5, max_seqlen_k=5)
    with pytest.raises(ValueError, match=r"k is required \(got None\)"):
        hstu_attention_sharded(q, None, None, cu, cu, **kw)
    with pytest.raises(TypeError, match=r"q must be an array with \.shape and \.dtype"):
        hstu_attention_sharded(np.ones((8, 2, 4)).tolist(), q, q, cu, cu, **kw)
    with pytest.raises(TypeError, match=r"func must be an array with \.shape and \.dtype"):
        hstu_attention_sharded(q, q, q, cu, cu, func=[[0]], window_size=(-1, -1), **kw)
    with pytest.raises(TypeError, match=r"rab must be an array with \.shape and \.dtype"):
        hstu_attention_sharded(q, q, q, cu, cu, rab=[1.0], **kw)
    with pytest.raises(TypeError, match=r"mesh must be a jax\.sharding\.Mesh"):
        hstu_attention_sharded(q, q, q, cu, cu, **dict(kw, mesh=None))
    x = jnp.ones((1, 1, 128, 8), jnp.float32)
    with pytest.raises(TypeError, match=r"mesh must be a jax\.sharding\.Mesh"):
        jsa.sharding.block_sparse_attention_sharded(x, x, x, jnp.zeros((1, 1, 1, 1), jnp.int32),
                                                    1, mesh=None, batch_axis="x")
    out = hstu_attention_sharded(q, q, q, cu, cu, **kw)
    np.testing.assert_allclose(out, jsa.hstu_attention(q, q, q, cu, cu, max_seqlen_q=5,
                                                       max_seqlen_k=5), rtol=1e-6)
