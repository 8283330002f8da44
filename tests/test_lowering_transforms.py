"""CPU lowering (sm_90a) of transformed kernel-path functions: vmap and vmap-of-grad fold
into one CuTe DSL call (no XLA loop), jax.export for CUDA (serialize/deserialize, symbolic
token count), jax.checkpoint recomputes the BSA kernel forward, and new lengths reuse one
CuTe compile (also across processes through the on-disk cache)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

pytest.importorskip("cutlass.jax")

import jax_sparse_attn as jsa  # noqa: E402
from jax_sparse_attn import _cute_call  # noqa: E402

pytestmark = pytest.mark.lowering
TARGET = "CuteDSLRT_NvJaxCutlassCall"
ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _force_kernel(monkeypatch):
    monkeypatch.setenv("JAX_SPARSE_ATTN_FORCE_KERNEL", "1")
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")


def _lower(fn, *args):
    return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


def _n(txt):
    """Kernel calls in a lowering other than the HSTU tile-schedule kernel's and the HSTU
    backward's dq reordering kernel's."""
    return sum("hstu_scheduleHstuSchedule" not in seg and "hstu_dq_tilesHstuDqFromTiles" not in seg
               for seg in txt.split(TARGET)[1:])


def _hstu(q, k, v, cu):
    return jsa.hstu_attention(q, k, v, cu, cu, max_seqlen_q=200, max_seqlen_k=200,
                              backend="kernel")


def _bsa(q, k, v, idx, nums):
    return jsa.block_sparse_attention(q, k, v, idx, q2k_block_nums=nums, sparse_block_size=64,
                                      backend="kernel")


def _sds(shape, dt=jnp.bfloat16):
    return jax.ShapeDtypeStruct(shape, dt)


HQ = _sds((3, 300, 2, 64))
HCU = _sds((3, 4), jnp.int32)
BQ = _sds((2, 1, 2, 256, 64))
BIDX = _sds((2, 1, 2, 4, 2), jnp.int32)
BNUMS = _sds((2, 1, 2, 4), jnp.int32)


def test_vmap_hstu_lowers_to_one_kernel_call():
    txt = _lower(jax.vmap(_hstu), HQ, HQ, HQ, HCU)
    assert _n(txt) == 1 and "stablehlo.while" not in txt
    # the folded token axis: 3 * 300 rows in one call
    assert "tensor<900x2x64xbf16>" in txt
    g = jax.vmap(jax.grad(lambda q, k, v, cu: jnp.sum(_hstu(q, k, v, cu).astype(jnp.float32)),
                          argnums=(0, 1, 2)))
    txt = _lower(g, HQ, HQ, HQ, HCU)
    assert _n(txt) == 1 and "stablehlo.while" not in txt  # the backward kernel only


def test_vmap_hstu_with_rab_lowers_to_one_kernel_call():
    """rab folds with the sequences: one CuTe call (the sm80 forward with rab) on the stacked
    tokens and the padded per-item bias."""
    def f(q, k, v, cu, rab):
        return jsa.hstu_attention(q, k, v, cu, cu, max_seqlen_q=200, max_seqlen_k=200,
                                  rab=rab, backend="kernel")

    txt = _lower(jax.vmap(f), HQ, HQ, HQ, HCU, _sds((3, 3, 1, 200, 200)))
    assert _n(txt) == 1 and "stablehlo.while" not in txt
    assert "tensor<900x2x64xbf16>" in txt and "tensor<15x1x200x200xbf16>" in txt


def test_vmap_bsa_forward_and_grad_lower_to_kernel_calls():
    txt = _lower(jax.vmap(_bsa), BQ, BQ, BQ, BIDX, BNUMS)
    assert txt.count(TARGET) == 1 and "stablehlo.while" not in txt
    assert "tensor<2x2x256x64xbf16>" in txt  # B = 2 items x 1
    loss = lambda q, k, v, i, n: jnp.sum(_bsa(q, k, v, i, n).astype(jnp.float32))  # noqa: E731
    txt = _lower(jax.vmap(jax.grad(loss, argnums=(0, 1, 2))), BQ, BQ, BQ, BIDX, BNUMS)
    # forward (lse/out residuals), preprocessing, dK/dV/dQ and dq reordering kernels, one
    # call each
    assert txt.count(TARGET) == 4 and "stablehlo.while" not in txt


def test_remat_recomputes_the_bsa_kernel_forward():
    q = _sds((1, 2, 256, 64))
    idx = jnp.zeros((1, 2, 4, 2), jnp.int32).at[..., 1].set(1)
    nums = jnp.full((1, 2, 4), 2, jnp.int32)
    loss = lambda q, k, v: jnp.sum(_bsa(q, k, v, idx, nums).astype(jnp.float32) ** 2)  # noqa: E731
    plain = _lower(jax.value_and_grad(loss, argnums=(0, 1, 2)), q, q, q).count(TARGET)
    remat = _lower(jax.value_and_grad(jax.checkpoint(loss), argnums=(0, 1, 2)), q, q,
                   q).count(TARGET)
    # forward, preprocessing, dK/dV/dQ, dq reordering; the checkpointed forward runs again
    assert (plain, remat) == (4, 5)


def test_new_lengths_reuse_one_cute_compile():
    """Total tokens, batch and lengths are runtime values: lowering at new sizes runs no
    CuTe DSL compile (cutlass_call alone compiles once per shape)."""
    def f(q, k, v, cu):
        return jsa.hstu_attention(q, k, v, cu, cu, max_seqlen_q=77, max_seqlen_k=77,
                                  window_size=(5, 0), backend="kernel")

    _lower(f, _sds((300, 2, 128)), _sds((300, 2, 128)), _sds((300, 2, 128)), _sds((4,), jnp.int32))
    before = _cute_call.compile_stats()
    for t, b in ((301, 4), (1023, 17), (17, 1)):
        x = _sds((t, 2, 128))
        txt = _lower(f, x, x, x, _sds((b + 1,), jnp.int32))
        assert _n(txt) == 1
    after = _cute_call.compile_stats()
    assert after["compiles"] == before["compiles"], (before, after)
    assert after["memory_hits"] >= before["memory_hits"] + 3
    assert after["lowerings"] >= before["lowerings"] + 3  # each new size lowered the call
    assert after["lower_seconds"] > before["lower_seconds"]


def test_export_for_cuda_round_trip_and_symbolic_tokens():
    from jax import export  # noqa: PLC0415

    def f(q, k, v, cu, bq, bidx, bnums):
        def loss(q, k, v, bq):
            return (jnp.sum(_hstu(q, k, v, cu).astype(jnp.float32))
                    + jnp.sum(_bsa(bq, bq, bq, bidx, bnums).astype(jnp.float32)))

        return loss(q, k, v, bq), jax.grad(loss, argnums=(0, 1, 2, 3))(q, k, v, bq)

    (t,) = export.symbolic_shape("t")
    hq = _sds((t, 2, 64))
    args = (hq, hq, hq, _sds((4,), jnp.int32), _sds((1, 2, 256, 64)),
            _sds((1, 2, 4, 2), jnp.int32), _sds((1, 2, 4), jnp.int32))
    with pytest.raises(ValueError, match="custom_call|safety|CuteDSLRT"):
        export.export(jax.jit(f), platforms=("cuda",))(*args)
    exp = export.export(jax.jit(f), platforms=("cuda",),
                        disabled_checks=jsa.export_safety_checks())(*args)
    back = export.deserialize(exp.serialize())
    text = back.mlir_module()
    # at least: hstu fwd + bwd, bsa fwd + preprocessing + bwd (exported StableHLO is not
    # dead-code eliminated: the forwards of the value and of the grad both appear)
    assert text.count(TARGET) >= 5, text.count(TARGET)
    assert back.platforms == ("cuda",)
    assert "t" in str(back.in_avals[0].shape)


def test_export_symbolic_query_tokens_static_keys():
    """jax.grad through the HSTU op exports for CUDA with a symbolic number of query tokens
    and a concrete number of keys: the schedule launch then has concrete sizes, while the
    dQ workspace it would zero is symbolic (left to XLA)."""
    from jax import export  # noqa: PLC0415

    def loss(q, k, v, cu):
        return jnp.sum(jsa.hstu_attention(q, k, v, cu, cu, max_seqlen_q=200, max_seqlen_k=200,
                                          backend="kernel").astype(jnp.float32))

    (t,) = export.symbolic_shape("t")
    kv = _sds((300, 2, 64))
    exp = export.export(jax.jit(jax.grad(loss, argnums=(0, 1, 2))), platforms=("cuda",),
                        disabled_checks=jsa.export_safety_checks())(
        _sds((t, 2, 64)), kv, kv, _sds((4,), jnp.int32))
    assert exp.mlir_module().count(TARGET) >= 3


def _run_cache_process(cache):
    code = (
        "import hashlib, json, jax, jax.numpy as jnp, jax_sparse_attn as jsa\n"
        "from jax_sparse_attn import _cute_call\n"
        "f = lambda q, cu: jsa.hstu_attention(q, q, q, cu, cu, max_seqlen_q=9, max_seqlen_k=9,"
        " window_size=(3, 2), backend='kernel')\n"
        "x = jax.ShapeDtypeStruct((333, 1, 32), jnp.float16)\n"
        "cu = jax.ShapeDtypeStruct((5,), jnp.int32)\n"
        "t = jax.jit(f).trace(x, cu).lower(lowering_platforms=('cuda',)).as_text()\n"
        "print('RESULT ' + json.dumps(dict(_cute_call.compile_stats(), n=t.count('CuteDSLRT'),"
        " h=hashlib.sha256(t.encode()).hexdigest())))\n")
    env = dict(os.environ, JAX_SPARSE_ATTN_CACHE_DIR=str(cache), JAX_PLATFORMS="cpu",
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for k in list(env):
        if k.startswith("CUTE_DSL_KEEP") or k == "CUTE_DSL_DUMP_DIR":
            env.pop(k)
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=900)
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    assert proc.returncode == 0 and line, proc.stderr[-3000:]
    return json.loads(line[-1][7:])


def test_disk_cache_serves_a_fresh_process(tmp_path):
    # two kernels: the tile schedule and the forward
    first = _run_cache_process(tmp_path)
    assert (first["compiles"], first["disk_writes"], first["n"]) == (2, 2, 2), first
    assert len(list(tmp_path.glob("*.o"))) == 2
    second = _run_cache_process(tmp_path)
    assert (second["compiles"], second["disk_hits"], second["n"]) == (0, 2, 2), second
    assert second["h"] == first["h"]  # the same module (object code) in the lowered call


def test_export_bsa_symbolic_batch():
    from jax import export  # noqa: PLC0415

    (b,) = export.symbolic_shape("b")
    x = _sds((b, 2, 256, 64))
    exp = export.export(jax.jit(_bsa), platforms=("cuda",),
                        disabled_checks=jsa.export_safety_checks())(
        x, x, x, _sds((b, 2, 4, 2), jnp.int32), _sds((b, 2, 4), jnp.int32))
    assert export.deserialize(exp.serialize()).mlir_module().count(TARGET) == 1


def test_cute_call_switch_selects_the_call_builder(monkeypatch):
    """Switches.cute_call / JAX_SPARSE_ATTN_CUTE_CALL: 'per_shape' builds the kernel calls
    with plain cutlass_call (nothing goes through the shared compile layer), 'shared' (the
    default) with cute_call; both lower to the CuTe DSL FFI target."""
    from jax_sparse_attn.config import Switches  # noqa: PLC0415

    def hstu(sw):
        return lambda q, k, v, cu: jsa.hstu_attention(q, k, v, cu, cu, max_seqlen_q=200,
                                                      max_seqlen_k=200, backend="kernel",
                                                      switches=sw)

    q, cu = _sds((300, 2, 64)), _sds((4,), jnp.int32)
    used = lambda st: st["compiles"] + st["memory_hits"] + st["disk_hits"]  # noqa: E731
    _cute_call.reset_compile_stats()
    assert _n(_lower(hstu(Switches(cute_call="per_shape")), q, q, q, cu)) == 1
    assert used(_cute_call.compile_stats()) == 0
    monkeypatch.setenv("JAX_SPARSE_ATTN_CUTE_CALL", "per_shape")  # the environment too
    bq, bi, bn = (_sds(x.shape[1:], x.dtype) for x in (BQ, BIDX, BNUMS))
    assert _lower(lambda *a: _bsa(*a), bq, bq, bq, bi, bn).count(TARGET) == 1
    assert used(_cute_call.compile_stats()) == 0
    monkeypatch.delenv("JAX_SPARSE_ATTN_CUTE_CALL")
    assert _n(_lower(hstu(Switches()), q, q, q, cu)) == 1
    assert used(_cute_call.compile_stats()) >= 1
