"""CPU lowering (sm_90a) of the block-sparse kernels with ``pack_gqa=True``.

Each configuration lowers ``jax.grad`` of a loss through the public op (forward, the
preprocessing kernel and the dK/dV/dQ kernel: three CuTe DSL calls) with packed metadata
``(B, H_kv, ceil(S_q r / blk), K_max)``; between them: r in {2, 4, 8}, blk 64 / 128, D 64 /
128, both dtypes and layouts, with and without ``block_sizes``, on the sm90ws forward (the
default ``auto`` and the switch named), with and without ``causal``. The packed forward's Q load is one 5-D TMA box
(D, r heads, positions, KV head, batch) on the sm90ws kernel; the PTX test checks it. The
pack_gqa=False kernels are unchanged (PTX sha256 of the sm90ws forward: tests/ws_ptx_sha256.txt
via tests/test_lowering_hstu.py; all BSA SM90 kernels: docs/bsa.md).
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

pytestmark = pytest.mark.lowering

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

pytest.importorskip("cutlass.jax")

CALL_TARGET = "CuteDSLRT_NvJaxCutlassCall"

PACK_CONFIGS = [
    dict(d=128, blk=128, r=8, dtype="bfloat16", layout="bshd", sizes=True, fwd="auto"),
    # kv_splits="auto" with pack_gqa and few packed rows (unpacked, "auto" would split them):
    # one split (the packed kernels do not split; no combine kernel: still three calls)
    dict(d=64, blk=64, r=4, dtype="float16", layout="bhsd", sizes=False, fwd="auto",
         kv_splits="auto", sq=16),
    dict(d=128, blk=64, r=2, dtype="bfloat16", layout="bshd", sizes=True, fwd="sm90ws"),
    dict(d=64, blk=128, r=2, dtype="float16", layout="bhsd", sizes=True, fwd="sm90ws"),
    # pack_gqa with the causal mask (S_q != S_kv: bottom-right aligned)
    dict(d=128, blk=128, r=8, dtype="bfloat16", layout="bshd", sizes=True, fwd="auto",
         causal=True),
    dict(d=64, blk=64, r=4, dtype="float16", layout="bhsd", sizes=False, fwd="auto",
         causal=True),
]


@pytest.fixture(autouse=True)
def _sm90_env(monkeypatch):
    monkeypatch.setenv("CUTE_DSL_ARCH", os.environ.get("CUTE_DSL_ARCH", "sm_90a"))
    monkeypatch.setenv("JAX_SPARSE_ATTN_FORCE_KERNEL", "1")


def _ids(c):
    return (f"{c['fwd']}-{'splitsauto-' if 'kv_splits' in c else ''}"
            f"{'causal-' if c.get('causal') else ''}d{c['d']}-blk{c['blk']}-r{c['r']}-{c['dtype']}-{c['layout']}-"
            f"{'sizes' if c['sizes'] else 'nosizes'}")


def _loss_and_args(c, b=2, hkv=2, skv=1025, kmax=5):
    import jax_sparse_attn as jsa
    from jax_sparse_attn.config import Switches

    sq = c.get("sq", 1000)
    d, blk, r = c["d"], c["blk"], c["r"]
    dt = jnp.dtype(c["dtype"])
    nqp, nkv = -(-sq * r // blk), -(-skv // blk)

    def t(s, h):
        return jax.ShapeDtypeStruct((b, h, s, d) if c["layout"] == "bhsd" else (b, s, h, d), dt)

    args = (t(sq, hkv * r), t(skv, hkv), t(skv, hkv),
            jax.ShapeDtypeStruct((b, hkv, nqp, kmax), jnp.int32),
            jax.ShapeDtypeStruct((b, hkv, nqp), jnp.int32),
            jax.ShapeDtypeStruct((b, hkv, nkv), jnp.int32) if c["sizes"] else None)
    kw = dict(layout=c["layout"], sparse_block_size=blk, softmax_scale=0.3, backend="kernel",
              switches=Switches(bsa_fwd_impl=c["fwd"]), pack_gqa=True,
              allow_empty_block_nums=True, kv_splits=c.get("kv_splits", 1),
              causal=c.get("causal", False))

    def loss(q, k, v, i, n, s):
        out = jsa.block_sparse_attention(q, k, v, i, q2k_block_nums=n, block_sizes=s, **kw)
        return jnp.sum(out.astype(jnp.float32))

    return loss, args


@pytest.mark.parametrize("c", PACK_CONFIGS, ids=_ids)
def test_bsa_pack_gqa_fwd_bwd_lower(c):
    loss, args = _loss_and_args(c)
    txt = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).trace(*args).lower(
        lowering_platforms=("cuda",)).as_text()
    # forward, preprocessing, dK/dV/dQ
    assert txt.count(CALL_TARGET) == 3
    assert "\\7FELF" in txt


def test_bsa_pack_gqa_declined_by_the_mma_sync_kernels():
    """backend="kernel" with a pass on an mma.sync kernel: a NotImplementedError naming the
    reason."""
    import jax_sparse_attn as jsa
    from jax_sparse_attn.config import Switches

    c = dict(PACK_CONFIGS[0])
    _, (q, k, v, i, n, s) = _loss_and_args(c)
    for sw, what in ((Switches(bsa_fwd_impl="sm80"), "forward"),
                     (Switches(bsa_bwd_impl="sm80"), "backward")):
        with pytest.raises(NotImplementedError, match=f"pack_gqa=True is not implemented by "
                                                      f"the mma.sync .* {what}"):
            jax.eval_shape(lambda q, k, v, i, n: jsa.block_sparse_attention(
                q, k, v, i, q2k_block_nums=n, sparse_block_size=128, layout="bshd",
                backend="kernel", switches=sw, pack_gqa=True), q, k, v, i, n)
    """backend="kernel" with a pass on an mma.sync kernel: a NotImplementedError naming the
    reason."""

_PTX_SCRIPT = """
import sys
sys.path.insert(0, {root!r})
sys.path.insert(0, {tests!r})
import jax
import test_lowering_bsa_pack_gqa as t
loss, args = t._loss_and_args({cfg!r})
jax.jit(loss).trace(*args).lower(lowering_platforms=("cuda",))  # the forward only
"""


def test_bsa_pack_gqa_sm90ws_loads_q_with_one_5d_tma_box(tmp_path):
    """The packed sm90ws forward (fresh process, PTX kept) loads its Q slices with 5-D TMA
    boxes (D, r heads, positions, KV head, batch) and K/V with 4-D ones; the unpacked one
    has no 5-D box."""
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    tests = os.path.dirname(os.path.abspath(__file__))
    dump = tmp_path / "ptx"
    dump.mkdir()
    env = dict(os.environ, CUTE_DSL_ARCH="sm_90a", JAX_SPARSE_ATTN_FORCE_KERNEL="1",
               CUTE_DSL_KEEP="ptx", CUTE_DSL_DUMP_DIR=str(dump), JAX_PLATFORMS="cpu")
    script = _PTX_SCRIPT.format(root=os.path.dirname(tests), tests=tests, cfg=PACK_CONFIGS[0])
    r = subprocess.run([sys.executable, "-c", script], env=env, cwd=os.path.dirname(tests),
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    ws = [p.read_text() for p in dump.iterdir() if p.suffix == ".ptx"
          and "bsa_fwd_sm90_ws" in p.read_text()]
    assert len(ws) == 1
    assert "cp.async.bulk.tensor.5d" in ws[0]
    assert "cp.async.bulk.tensor.4d" in ws[0]
