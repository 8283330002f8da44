"""CPU lowering (sm_90a) of the block-sparse kernels with ``pack_gqa=True``.

Each configuration lowers ``jax.grad`` of a loss through the public op (forward, the
preprocessing kernel and the dK/dV/dQ kernel: three CuTe DSL calls; with more than one key
split the combine kernel too: four) with packed metadata ``(B, H_kv, ceil(S_q r / blk),
K_max)``; between them: r in {2, 4, 8}, blk 64 / 128, D 64 / 128, both dtypes and layouts,
with and without ``block_sizes``, on the sm90ws forward (the default ``auto`` and the switch
named), without and with ``kv_splits`` (2, 7 (clamped to K_max = 5), ``"auto"``, which counts
the packed metadata rows ``B H_kv N_qp``: decode-like shapes split), with and without
``causal``. The packed forward's Q
load is one 5-D TMA box (D, r heads, positions, KV head, batch) on the sm90ws kernel; the PTX
tests check it, and that the packed split forward stores fp32 partial rows from registers
(no 16-bit smem-staged stores). The pack_gqa=False kernels are unchanged (PTX sha256 of the
sm90ws forward: tests/ws_ptx_sha256.txt via tests/test_lowering_hstu.py; all BSA SM90
kernels: docs/bsa.md).
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

# ``splits``: the split count the forward's compile key resolves (K_max = 5; "auto" =
# min(132 // (B H_kv N_qp), K_max) with B = H_kv = 2)
PACK_CONFIGS = [
    dict(d=128, blk=128, r=8, dtype="bfloat16", layout="bshd", sizes=True, fwd="auto"),
    dict(d=128, blk=64, r=2, dtype="bfloat16", layout="bshd", sizes=True, fwd="sm90ws"),
    dict(d=64, blk=128, r=2, dtype="float16", layout="bhsd", sizes=True, fwd="sm90ws"),
    # pack_gqa with kv_splits: work items (packed block, split, KV head), the fp32 partials
    # in the unpacked (S, B, H_q, S_q, D) layout merged by the combine kernel.
    # decode-like (S_q r <= blk: one packed block per KV head): "auto" splits 4 rows 5 ways
    dict(d=64, blk=64, r=4, dtype="float16", layout="bhsd", sizes=False, fwd="auto",
         kv_splits="auto", sq=16, splits=5),
    dict(d=128, blk=128, r=8, dtype="bfloat16", layout="bshd", sizes=True, fwd="auto",
         kv_splits="auto", sq=16, splits=5),
    dict(d=128, blk=128, r=8, dtype="bfloat16", layout="bhsd", sizes=False, fwd="sm90ws",
         kv_splits=2, sq=16, splits=2),
    dict(d=64, blk=64, r=8, dtype="float16", layout="bshd", sizes=True, fwd="sm90ws",
         kv_splits=7, sq=9, splits=5),
    dict(d=128, blk=64, r=2, dtype="float16", layout="bhsd", sizes=True, fwd="auto",
         kv_splits=7, splits=5),
    dict(d=64, blk=128, r=4, dtype="bfloat16", layout="bshd", sizes=False, fwd="auto",
         kv_splits=2, splits=2),
    dict(d=128, blk=64, r=4, dtype="bfloat16", layout="bshd", sizes=False, fwd="sm90ws",
         kv_splits="auto", sq=40, splits=5),
    dict(d=64, blk=128, r=2, dtype="float16", layout="bhsd", sizes=True, fwd="sm90ws",
         kv_splits=7, sq=16, splits=5),
    # many packed rows (2 * 2 * 63 > 132): "auto" resolves to one split (kv_splits=1's key)
    dict(d=128, blk=64, r=4, dtype="bfloat16", layout="bhsd", sizes=False, fwd="auto",
         kv_splits="auto", splits=1),
    # pack_gqa with the causal mask (S_q != S_kv: bottom-right aligned)
    dict(d=128, blk=128, r=8, dtype="bfloat16", layout="bshd", sizes=True, fwd="auto",
         causal=True),
    dict(d=64, blk=64, r=4, dtype="float16", layout="bhsd", sizes=False, fwd="auto",
         causal=True),
    # pack_gqa with causal and kv_splits together
    dict(d=128, blk=128, r=8, dtype="bfloat16", layout="bhsd", sizes=True, fwd="auto",
         causal=True, kv_splits=2, sq=16, splits=2),
]


@pytest.fixture(autouse=True)
def _sm90_env(monkeypatch):
    monkeypatch.setenv("CUTE_DSL_ARCH", os.environ.get("CUTE_DSL_ARCH", "sm_90a"))
    monkeypatch.setenv("JAX_SPARSE_ATTN_FORCE_KERNEL", "1")


def _ids(c):
    splits = f"splits{c['kv_splits']}-" if "kv_splits" in c else ""
    causal = "causal-" if c.get("causal") else ""
    return (f"{c['fwd']}-{splits}{causal}d{c['d']}-blk{c['blk']}-r{c['r']}-{c['dtype']}-"
            f"{c['layout']}-"
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
              switches=Switches(bsa_fwd_impl=c["fwd"], bsa_fwd_ws=c.get("ws", "")),
              pack_gqa=True,
              allow_empty_block_nums=True, kv_splits=c.get("kv_splits", 1),
              causal=c.get("causal", False))

    def loss(q, k, v, i, n, s):
        out = jsa.block_sparse_attention(q, k, v, i, q2k_block_nums=n, block_sizes=s, **kw)
        return jnp.sum(out.astype(jnp.float32))

    return loss, args


def _fwd_key(c, args):
    """The forward compile key (``ffi.bsa.BsaFwdConfig``) of configuration ``c``."""
    import jax_sparse_attn as jsa
    from jax_sparse_attn.config import Switches

    q, k, v, i, n, s = args
    # concrete metadata of those shapes (the value checks run on them): blocks 0 .. K_max - 1
    i = jnp.broadcast_to(jnp.arange(i.shape[-1], dtype=jnp.int32), i.shape)
    n = jnp.full(n.shape, i.shape[-1], jnp.int32)
    s = None if s is None else jnp.full(s.shape, c["blk"], jnp.int32)
    cfg = jsa.bsa._make_config(
        q, k, v, i, None, s, n, sparse_block_size=c["blk"], softmax_scale=0.3,
        layout=c["layout"], allow_empty_block_nums=True, backend="kernel",
        switches=Switches(bsa_fwd_impl=c["fwd"], bsa_fwd_ws=c.get("ws", "")),
        op_name="block_sparse_attention",
        kv_splits=c.get("kv_splits", 1), pack_gqa=True, causal=c.get("causal", False))[0]
    return cfg.fwd


@pytest.mark.parametrize("c", PACK_CONFIGS, ids=_ids)
def test_bsa_pack_gqa_fwd_bwd_lower(c):
    loss, args = _loss_and_args(c)
    key = _fwd_key(c, args)
    splits = c.get("splits", 1)
    assert (key.impl, key.pack_gqa, key.kv_splits, key.causal) == (
        "sm90ws", c["r"], splits, c.get("causal", False))
    txt = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).trace(*args).lower(
        lowering_platforms=("cuda",)).as_text()
    # forward (+ the combine kernel with more than one split), the K->Q lists,
    # preprocessing, dK/dV/dQ of the packed rows, the dQ reordering
    assert txt.count(CALL_TARGET) == (5 if splits == 1 else 6)
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
    # with kv_splits too: the packed mma.sync forward is declined (the sm80 forward splits
    # but does not pack)
    with pytest.raises(NotImplementedError, match="pack_gqa=True is not implemented by "
                                                  "the mma.sync .* forward"):
        jax.eval_shape(lambda q, k, v, i, n: jsa.block_sparse_attention(
            q, k, v, i, q2k_block_nums=n, sparse_block_size=128, layout="bshd",
            backend="kernel", switches=Switches(bsa_fwd_impl="sm80"), pack_gqa=True,
            kv_splits=2), q, k, v, i, n)


def test_bsa_fwd_sm90ws_packs_with_kv_splits_and_causal():
    """The kernel class itself: pack_gqa with kv_splits > 1, with causal, and with both."""
    import cutlass

    from jax_sparse_attn.kernels.bsa_fwd_sm90_ws import BsaFwdSm90Ws

    for blk, d, r, ks, causal in ((128, 128, 8, 2, False), (64, 64, 4, 7, False),
                                  (64, 128, 2, 3, True), (128, 64, 8, 1, True)):
        k = BsaFwdSm90Ws(cutlass.BFloat16, d, blk, False, 132, pack_gqa=r, kv_splits=ks,
                         causal=causal)
        assert (k.pack, k.kv_splits, k.causal) == (r, ks, causal)
    with pytest.raises(NotImplementedError, match="dividing 64"):
        BsaFwdSm90Ws(cutlass.BFloat16, 128, 128, False, 132, pack_gqa=3)


_PTX_SCRIPT = """
import sys
sys.path.insert(0, {root!r})
sys.path.insert(0, {tests!r})
import jax
import test_lowering_bsa_pack_gqa as t
loss, args = t._loss_and_args({cfg!r})
jax.jit(loss).trace(*args).lower(lowering_platforms=("cuda",))  # the forward only
"""


def _packed_fwd_ptx(tmp_path, cfg):
    """The PTX of the sm90ws forward of configuration ``cfg`` (lowered in a fresh process
    with the PTX kept)."""
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    tests = os.path.dirname(os.path.abspath(__file__))
    dump = tmp_path / "ptx"
    dump.mkdir()
    env = dict(os.environ, CUTE_DSL_ARCH="sm_90a", JAX_SPARSE_ATTN_FORCE_KERNEL="1",
               CUTE_DSL_KEEP="ptx", CUTE_DSL_DUMP_DIR=str(dump), JAX_PLATFORMS="cpu")
    script = _PTX_SCRIPT.format(root=os.path.dirname(tests), tests=tests, cfg=cfg)
    r = subprocess.run([sys.executable, "-c", script], env=env, cwd=os.path.dirname(tests),
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    ws = [p.read_text() for p in dump.iterdir() if p.suffix == ".ptx"
          and "bsa_fwd_sm90_ws" in p.read_text()]
    assert len(ws) == 1
    return ws[0]


#: the packed decode-like split forward of the PTX test (the "auto" split of PACK_CONFIGS)
PACK_SPLIT_PTX = dict(d=128, blk=128, r=8, dtype="bfloat16", layout="bshd", sizes=True,
                      fwd="auto", kv_splits="auto", sq=16, splits=5)


def test_bsa_pack_gqa_sm90ws_loads_q_with_one_5d_tma_box(tmp_path):
    """The packed sm90ws forward (fresh process, PTX kept) loads its Q slices with 5-D TMA
    boxes (D, r heads, positions, KV head, batch) and K/V with 4-D ones; the unpacked one
    has no 5-D box. Without splits and with ``bsa_fwd_ws=notmaopack`` it stores O in 16 bit
    through shared memory with 128-bit row stores: the tile staged with packed 4-byte shared
    stores (32 per consumer thread at D 128) and read back with 16-byte shared loads (8 per
    thread), no 2-byte shared accesses."""
    import re  # noqa: PLC0415

    ptx = _packed_fwd_ptx(tmp_path, dict(PACK_CONFIGS[0], ws="notmaopack"))
    assert "cp.async.bulk.tensor.5d" in ptx
    assert "cp.async.bulk.tensor.4d" in ptx
    assert "st.global.v4.b32" in ptx and "st.global.v2.b32" not in ptx
    ops = {}
    for m in re.finditer(r"\b(st|ld)\.shared\.([a-z0-9.]+)", ptx):
        ops[m.group(0)] = ops.get(m.group(0), 0) + 1
    assert ops.get("st.shared.b32") == 32 and ops.get("ld.shared.v4.b32") == 8, ops
    assert not any(op.endswith(("b16", "u16")) for op in ops), ops


@pytest.mark.parametrize("c", [PACK_CONFIGS[0], dict(PACK_CONFIGS[1], causal=True)],
                         ids=lambda c: _ids(c))
def test_bsa_pack_gqa_tma_o_packed_ptx(tmp_path, c):
    """The packed forward (default; ``bsa_fwd_ws=tmaopack`` names it) writes O with 5-D TMA
    tensor stores of the packed view (the boxes of its Q loads: D / 64 per 64-row slice),
    staged with packed 4-byte shared stores and no shared loads (128-bit global stores only
    for the zeros of items without listed blocks); ``notmaopack`` keeps the copy (the test
    above). The two compile keys differ only in ``ws_tma_o`` and ``ws_tma_o_packed``."""
    import re  # noqa: PLC0415

    _, args = _loss_and_args(c)
    key, plain = _fwd_key(c, args), _fwd_key(dict(c, ws="notmaopack"), args)
    assert key == _fwd_key(dict(c, ws="tmaopack"), args)
    assert (key.ws_tma_o, key.ws_tma_o_packed) == (True, True)
    assert (plain.ws_tma_o, plain.ws_tma_o_packed) == (False, False)
    assert key == type(key)(**{**plain.__dict__, "ws_tma_o": True, "ws_tma_o_packed": True})
    ptx = _packed_fwd_ptx(tmp_path, c)
    stores = re.findall(r"cp\.async\.bulk\.tensor\.5d\.global\.shared::cta", ptx)
    assert len(stores) == c["d"] // 64, stores
    assert ptx.count("cp.async.bulk.wait_group.read") == 2
    assert "ld.shared.v4" not in ptx
    # 128-bit global stores only for the zeros of work items without listed blocks
    assert ptx.count("st.global.v4") == c["d"] // 16
    assert ptx.count("st.shared.b32") == c["d"] // 4


def test_bsa_pack_gqa_split_forward_is_its_own_kernel(tmp_path):
    """pack_gqa with kv_splits > 1 compiles another forward than pack_gqa alone (its compile
    key carries both, and no TMA stores of O): the same 5-D Q boxes, and the split epilogue stores each packed row's
    fp32 partial from registers, two adjacent columns per store (D / 4 such stores per
    thread: its two accumulator rows of D / 8 column pairs), with no 16-bit O staging in
    shared memory and no 128-bit stores."""
    assert PACK_SPLIT_PTX in PACK_CONFIGS
    _, args = _loss_and_args(PACK_SPLIT_PTX)
    key = _fwd_key(PACK_SPLIT_PTX, args)
    alone = _fwd_key(dict(PACK_SPLIT_PTX, kv_splits=1), args)
    assert (key.pack_gqa, key.kv_splits) == (8, 5) and (alone.pack_gqa, alone.kv_splits) == (8, 1)
    # (split partials are fp32 rows from registers: no TMA stores of O)
    assert key != alone and key == type(key)(**{**alone.__dict__, "kv_splits": 5,
                                                "ws_tma_o": False, "ws_tma_o_packed": False})
    ptx = _packed_fwd_ptx(tmp_path, PACK_SPLIT_PTX)
    assert "cp.async.bulk.tensor.5d" in ptx
    assert "cp.async.bulk.tensor.4d" in ptx
    assert ptx.count("st.global.v2.b32") == PACK_SPLIT_PTX["d"] // 4
    assert "st.global.v4" not in ptx and "st.shared.b16" not in ptx


def _packed_grad_lowers(c, switches, causal=False):
    """``jax.grad`` of a packed call of configuration ``c`` with ``switches`` lowers to the
    forward, the preprocessing (delta), the packed sm90ws backward and the dQ reordering,
    with the packed dQ tile workspace ``(B, H_kv, ceil(S_q r / 64), 64 D)``."""
    import jax_sparse_attn as jsa

    _, args = _loss_and_args(c)
    kw = dict(layout=c["layout"], sparse_block_size=c["blk"], softmax_scale=0.3,
              backend="kernel", switches=switches, pack_gqa=True, allow_empty_block_nums=True,
              causal=causal)

    def loss(q, k, v, i, n, s):
        out = jsa.block_sparse_attention(q, k, v, i, q2k_block_nums=n, block_sizes=s, **kw)
        return jnp.sum(out.astype(jnp.float32))

    txt = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).trace(*args).lower(
        lowering_platforms=("cuda",)).as_text()
    # forward, the K->Q lists, preprocessing, the packed backward, the dq reordering
    assert txt.count(CALL_TARGET) == 5 and "\\7FELF" in txt
    bshd = c["layout"] == "bshd"
    b, hkv, sq = args[0].shape[0], args[1].shape[2 if bshd else 1], args[0].shape[1 if bshd else 2]
    assert f"tensor<{b}x{hkv}x{-(-sq * c['r'] // 64)}x{64 * c['d']}xf32>" in txt


@pytest.mark.parametrize("c", [PACK_CONFIGS[0], PACK_CONFIGS[2], PACK_CONFIGS[3]], ids=_ids)
def test_bsa_pack_gqa_packws_lowers(c):
    """The warp-specialized backward with packed rows (the default; its key carries r; a dQ
    tile workspace of packed rows and the packed reordering), also with causal; with
    ``bsa_bwd_ws=nopackws`` pack_gqa runs the sm90 backward."""
    from jax_sparse_attn.config import Switches
    from jax_sparse_attn.ffi import bsa

    sw = Switches()
    key = bsa.bwd_config(jnp.bfloat16, c["d"], c["blk"], c["sizes"], sw, pack_gqa=c["r"])
    assert (key.impl, key.pack_gqa, key.dq_tile) == ("sm90ws", c["r"], True)
    assert key == bsa.bwd_config(jnp.bfloat16, c["d"], c["blk"], c["sizes"],
                                 Switches(bsa_bwd_ws="packws"), pack_gqa=c["r"])
    assert bsa.bwd_config(jnp.bfloat16, c["d"], c["blk"], c["sizes"],
                          Switches(bsa_bwd_ws="nopackws"), pack_gqa=c["r"]).impl == "sm90"
    ckey = bsa.bwd_config(jnp.bfloat16, c["d"], c["blk"], c["sizes"], sw, pack_gqa=c["r"],
                          causal=True)
    assert (ckey.impl, ckey.causal, ckey.pack_gqa) == ("sm90ws", True, c["r"])
    _packed_grad_lowers(c, sw)
    _packed_grad_lowers(c, sw, causal=True)


@pytest.mark.ablation
@pytest.mark.parametrize("sw", [dict(bsa_bwd_ws=("dqalt",)), dict(bsa_bwd_ws=("lpt",)),
                                dict(dq_writer="off"), dict(bsa_bwd_ws=("dqalias", "epiregs"))],
                         ids=["dqalt", "lpt", "nowriter", "dqalias-epiregs"])
def test_bsa_pack_gqa_packed_backward_tuning_switches_lower(sw):
    """The packed sm90ws backward with the backward's tuning switches (blk 128, r 8): each
    reaches the packed key and lowers with the packed dQ tile workspace."""
    from jax_sparse_attn.config import Switches
    from jax_sparse_attn.ffi import bsa

    c = PACK_CONFIGS[0]
    switches = Switches(**sw)
    key = bsa.bwd_config(jnp.bfloat16, c["d"], c["blk"], c["sizes"], switches, pack_gqa=c["r"])
    assert (key.impl, key.pack_gqa, key.dq_tile) == ("sm90ws", c["r"], True)
    if "dqalt" in sw.get("bsa_bwd_ws", ()):
        assert key.ws_dq_alt
    _packed_grad_lowers(c, switches)
