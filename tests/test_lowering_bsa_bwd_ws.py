"""CPU lowering of the warp-specialized block-sparse backward (``bsa_bwd_impl="sm90ws"``,
``kernels/bsa_bwd_sm90_ws.py``) for sm_90a, its PTX, its shared-memory plan and the
``auto`` choice between the Hopper backwards (no GPU needed).

The tests of the opt-in ``bsa_bwd_ws`` variants kept for measurement on the GPU (and of
``bsa_pre_impl="kernel4"``, ``bsa_bwd_dq="rows"``, ``det_writer`` off and the ordered
deterministic path's options) are marked ``ablation`` (``pytest -m ablation``); their PTX is
kept by a fixture of its own (:func:`kept_ptx_ablation`). The compile keys of those options
and the checks of the defaults' own PTX that the ablation tests compare with stay in
default-run tests of their own."""

from __future__ import annotations

import os
import re
import types

import pytest

# CuTe DSL reads its target arch when cutlass is first imported: set it before that.
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

pytestmark = pytest.mark.lowering

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

pytest.importorskip("cutlass.jax")

CALL_TARGET = "CuteDSLRT_NvJaxCutlassCall"

# every (D, blk) pair of the kernel; dtype, layout, block_sizes presence and GQA alternate
CONFIGS = [
    dict(d=128, blk=128, dtype="bfloat16", layout="bshd", sizes=False, hq=4, hkv=2),
    dict(d=128, blk=64, dtype="bfloat16", layout="bhsd", sizes=True, hq=4, hkv=4),
    dict(d=64, blk=128, dtype="float16", layout="bhsd", sizes=True, hq=8, hkv=1),
    dict(d=64, blk=64, dtype="float16", layout="bshd", sizes=False, hq=4, hkv=2),
]


def _ids(c):
    return (f"d{c['d']}-blk{c['blk']}-{c['dtype']}-{c['layout']}-"
            f"{'sizes' if c['sizes'] else 'nosizes'}-h{c['hq']}:{c['hkv']}")


def _bwd_text(cfg, ws="", b=2, sq=1000, skv=1025, kmax=5, impl="sm90ws", deterministic=False,
              dq="tile", det_writer=False, dlse=False, causal=False, pre="kernel"):
    """The lowered text of the public backward on the ``impl`` kernel for ``cfg`` (``dlse``:
    with an lse cotangent). ``deterministic``: the ordered dQ additions (``detorder`` joins
    ``ws``) unless ``ws`` names ``detfixed``."""
    import jax_sparse_attn as jsa
    from jax_sparse_attn.config import Switches

    ws = _ordered(ws, deterministic)
    d, blk = cfg["d"], cfg["blk"]
    dt = jnp.dtype(cfg["dtype"])
    nq, nkv = -(-sq // blk), -(-skv // blk)

    def t(s, h):
        shape = (b, h, s, d) if cfg["layout"] == "bhsd" else (b, s, h, d)
        return jax.ShapeDtypeStruct(shape, dt)

    q, k = t(sq, cfg["hq"]), t(skv, cfg["hkv"])
    idx = jax.ShapeDtypeStruct((b, cfg["hq"], nq, kmax), jnp.int32)
    nums = jax.ShapeDtypeStruct((b, cfg["hq"], nq), jnp.int32)
    sizes = jax.ShapeDtypeStruct((b, cfg["hq"], nkv), jnp.int32) if cfg["sizes"] else None
    lse = jax.ShapeDtypeStruct((b, cfg["hq"], sq), jnp.float32)
    kw = dict(layout=cfg["layout"], sparse_block_size=blk, softmax_scale=0.3, backend="kernel",
              switches=Switches(bsa_bwd_impl=impl, bsa_bwd_ws=ws, bsa_bwd_dq=dq,
                                det_writer=det_writer, bsa_pre_impl=pre),
              deterministic=deterministic, causal=causal)

    def bwd(do, q, k, v, o, lse, i, n, s):
        extra = {"dlse": lse * 0.5} if dlse else {}
        return jsa.block_sparse_attention_backward(do, q, k, v, o, lse, i, None, s, n, **kw,
                                                   **extra)

    return jax.jit(bwd).trace(q, q, k, k, q, lse, idx, nums, sizes).lower(
        lowering_platforms=("cuda",)).as_text()


@pytest.fixture(autouse=True)
def _sm90_env(monkeypatch):
    monkeypatch.setenv("CUTE_DSL_ARCH", os.environ.get("CUTE_DSL_ARCH", "sm_90a"))
    monkeypatch.setenv("JAX_SPARSE_ATTN_FORCE_KERNEL", "1")


def _ordered(ws, deterministic):
    """``ws`` with ``detorder`` where a deterministic call does not ask for ``detfixed``:
    these tests check the ordered additions, which deterministic calls run only when asked
    for."""
    if not deterministic or "detfixed" in ws.split(",") or "detorder" in ws.split(","):
        return ws
    return ",".join(filter(None, (ws, "detorder")))


def _calls(cfg, ws="", **kw):
    """CuTe DSL calls of the backward: preprocessing, dK/dV/dQ kernel, in the default mode
    the K->Q lists (``bsa_kq_impl="items"``, the default; these shapes fit it), where the
    kernel adds dQ into the query-tile workspace the dq reordering (launched by the
    backward's own call with ``tailconv``, the default) and, in deterministic mode with
    the schedule order (by default where the query heads are the KV heads; these shapes
    fit the order kernel), the order kernel, a call of its own unless streamed."""
    from jax_sparse_attn.config import Switches
    from jax_sparse_attn.ffi import bsa

    ws = _ordered(ws, kw.get("deterministic", False))
    key = bsa.bwd_config(jnp.bfloat16, cfg["d"], cfg["blk"], False,
                         Switches(bsa_bwd_impl=kw.pop("impl", "sm90ws"), bsa_bwd_ws=ws), **kw)
    order = key.det_window > 0 and (not key.det_sched_auto or cfg["hq"] == cfg["hkv"])
    # streamed (``detstream``, opt-in: ``bsa.det_stream_default``; not with causal), the
    # order kernel is launched by the backward's call
    # (tail_conv: the reordering is launched by the backward's call)
    return (2 + (key.dq_tile and not key.tail_conv) + (order and not key.det_stream)
            + (not key.deterministic))


@pytest.mark.ablation
def test_bsa_bwd_ws_ablation_lowers():
    """The ablation variants (``ldwait``, two Q / dO stages, ``lpt``, ``decouple``) compile
    too."""
    # lists, preprocessing and the backward, which launches the reordering (tailconv)
    txt = _bwd_text(CONFIGS[0], ws="ldwait,stages=2")
    assert txt.count(CALL_TARGET) == 3
    # CTAs in longest-list-first order (the order follows the CSR offsets: R + 1 offsets
    # then R rows, R = B H_kv N_kv = 2 * 4 * 17), over all pairs (lpt) or within each (hlpt,
    # the default), or in grid order (nolpt: the offsets alone)
    texts = {}
    for ws in ("lpt", "hlpt", "nolpt"):
        texts[ws] = txt = _bwd_text(CONFIGS[1], ws=ws)
        assert txt.count(CALL_TARGET) == 3
        assert ("tensor<273xi32>" in txt) == (ws != "nolpt"), ws
    assert texts["lpt"] != texts["hlpt"]
    assert texts["hlpt"] == _bwd_text(CONFIGS[1], ws="nobuckets")
    # the default splits long lists: its work items (6 int32 each) follow the offsets
    assert "tensor<273xi32>" not in _bwd_text(CONFIGS[1])
    # the reordering after the backward, a call of its own
    txt = _bwd_text(CONFIGS[1], ws="notailconv")
    assert txt.count(CALL_TARGET) == 4 == _calls(CONFIGS[1], ws="notailconv")
    # the dQ slices staged in the consumed Q / dO tiles (blk 64 / D 128 does so by default)
    txt = _bwd_text(CONFIGS[0], ws="dqalias")
    assert txt.count(CALL_TARGET) == 3
    # the row-major dQ workspace (vector reductions, no reordering kernel)
    txt = _bwd_text(CONFIGS[3], dq="rows")
    assert txt.count(CALL_TARGET) == 3
    # opt-in at blk 128: each consumer warpgroup reduces the dQ of its own keys (red, no
    # query-tile workspace)
    txt = _bwd_text(CONFIGS[2], ws="decouple")
    assert txt.count(CALL_TARGET) == 3


@pytest.mark.parametrize("cfg", CONFIGS, ids=_ids)
def test_bsa_bwd_ws_deterministic_lowers(cfg):
    """``deterministic=True`` on every (D, blk) pair: the preprocessing kernel and the
    deterministic sm90ws kernel (``impl="auto"``: at blk 64 / D 128 too) with the default
    dQ writer warp (``det_writer``; without it: :func:`test_bsa_bwd_ws_deterministic_ptx`)."""
    txt = _bwd_text(cfg, impl="auto", deterministic=True, det_writer=True)
    assert txt.count(CALL_TARGET) == _calls(cfg, impl="auto", deterministic=True)


@pytest.mark.parametrize("cfg", CONFIGS[:2], ids=_ids)
def test_bsa_bwd_ws_causal_lowers(cfg):
    """``causal=True`` runs the sm90ws backward (its key carries the flag), also with
    ``deterministic=True`` (never streamed: ``detstream`` is ignored under causal)."""
    from jax_sparse_attn.config import Switches
    from jax_sparse_attn.ffi import bsa

    key = bsa.bwd_config(jnp.bfloat16, cfg["d"], cfg["blk"], False, Switches(), causal=True)
    assert key.impl == "sm90ws" and key.causal
    txt = _bwd_text(cfg, impl="auto", causal=True)
    assert txt.count(CALL_TARGET) == _calls(cfg, impl="auto", causal=True)
    det = bsa.bwd_config(jnp.bfloat16, cfg["d"], cfg["blk"], False,
                         Switches(bsa_bwd_ws="detstream"), causal=True, deterministic=True)
    assert det.causal and det.deterministic and not det.det_stream
    txt = _bwd_text(cfg, impl="auto", causal=True, deterministic=True, det_writer=True,
                    ws="detstream")
    assert txt.count(CALL_TARGET) == _calls(cfg, ws="detstream", impl="auto", causal=True,
                                            deterministic=True)


@pytest.mark.ablation
@pytest.mark.parametrize("ws,cfg", [("splitwait", CONFIGS[0]), ("decouple", CONFIGS[2]),
                                    ("dqalt", CONFIGS[0]), ("lpt,stages=2", CONFIGS[3])],
                         ids=["splitwait-blk128", "decouple-blk128", "dqalt-blk128",
                              "lpt-blk64"])
def test_bsa_bwd_ws_causal_variants_lower(ws, cfg):
    """The sm90ws backward's ablation variants compile with ``causal=True`` too (their keys
    carry the flag); the row-major dQ workspace as well."""
    from jax_sparse_attn.config import Switches
    from jax_sparse_attn.ffi import bsa

    key = bsa.bwd_config(jnp.bfloat16, cfg["d"], cfg["blk"], False,
                         Switches(bsa_bwd_impl="sm90ws", bsa_bwd_ws=ws), causal=True)
    assert key.impl == "sm90ws" and key.causal
    txt = _bwd_text(cfg, ws=ws, causal=True)
    assert txt.count(CALL_TARGET) == _calls(cfg, ws=ws, causal=True)
    txt = _bwd_text(CONFIGS[0], dq="rows", causal=True)
    assert txt.count(CALL_TARGET) == 3


@pytest.mark.ablation
@pytest.mark.parametrize("cfg,slots", [(CONFIGS[1], 2), (CONFIGS[0], 3)],
                         ids=["blk64-slots2", "blk128-slots3"])
def test_bsa_bwd_ws_dq_slots_lowers(cfg, slots):
    """``bsa_bwd_ws`` ``dqslots=N`` (deterministic, dQ writer warp): the workspace the
    backward adds into and the reordering kernel reads holds ``N`` tiles per 64-row query
    tile, and the zeroed semaphores ``N`` per query tile (B = 2, S_q = 1000: 16 tiles)."""
    txt = _bwd_text(cfg, ws=f"dqslots={slots}", impl="auto", deterministic=True,
                    det_writer=True)
    assert txt.count(CALL_TARGET) == _calls(cfg, impl="auto", deterministic=True)
    h, d = cfg["hq"], cfg["d"]
    assert f"tensor<2x{h}x{16 * slots}x{64 * d}xf32>" in txt
    assert f"tensor<2x{h}x{16 * slots}xi32>" in txt
    assert f"tensor<2x{h}x16x{64 * d}xf32>" not in txt


@pytest.mark.parametrize("kmax,slots", [(40, 2), (20, 1)], ids=["k40", "k20"])
def test_bsa_bwd_ws_dq_slots_default_lowers(kmax, slots):
    """The ordered deterministic dQ (``detorder``; the fixed-point dQ is the deterministic
    default at blk 64 and 128) at blk 64 with one query head per KV head (the schedule order)
    and the dQ writer warp, without ``dqslots=N``: two dQ accumulators per query tile where
    the metadata lists at least 32 KV blocks per row, else one (B = 2, H = 4, S = 4096: 64
    query tiles)."""
    txt = _bwd_text(CONFIGS[1], sq=4096, skv=4096, kmax=kmax, impl="auto", deterministic=True,
                    det_writer=True)
    assert f"tensor<2x4x{64 * slots}x8192xf32>" in txt
    assert f"tensor<2x4x{64 * slots}xi32>" in txt


# the PTX tests' configurations, lowered in one fresh process (tests/kept_ptx.py): name ->
# (function of this module, its positional arguments, Switches fields, keyword arguments).
# They compare kernels of one CTA per KV block ("nobuckets" is added to each, below): the
# named defaults are the default's kernel without the bucket split; the "buckets-*" entries
# are the defaults themselves (long K->Q lists split, autobuckets) and, with the
# CUTE_DSL_KEEP=ptx lowered text, serve test_bsa_bwd_ws_lowers. The variants here are those
# the default-tier tests compare the defaults with
_PTX_UNSPLIT = {
    **{_ids(c): ("_bwd_text", (c,), None, {}) for c in CONFIGS[:2]},
    "epi16-blk128": ("_bwd_text", (CONFIGS[0],), None, {"ws": "epi16"}),
    "epiregs-blk128": ("_bwd_text", (CONFIGS[0],), None, {"ws": "epiregs"}),
    "tailconv-blk64": ("_bwd_text", (CONFIGS[1],), None, {"ws": "tailconv"}),
    "notailconv-blk64": ("_bwd_text", (CONFIGS[1],), None, {"ws": "notailconv"}),
    "thrfrags-blk128": ("_bwd_text", (CONFIGS[0],), None, {"ws": "thrfrags"}),
    "nowghand-blk128": ("_bwd_text", (CONFIGS[0],), None, {"ws": "nowghand"}),
    "nofdiv-blk128": ("_bwd_text", (CONFIGS[0],), None, {"ws": "nofdiv"}),
    "noqprobe-blk128": ("_bwd_text", (CONFIGS[0],), None, {"ws": "noqprobe"}),
    "nodqlag-blk128": ("_bwd_text", (CONFIGS[0],), None, {"ws": "nodqlag"}),
    "detfixed-blk128": ("_bwd_text", (CONFIGS[0],), None,
                        {"ws": "detfixed,nodqlag", "deterministic": True}),
    "detfixed-dqlag-blk128": ("_bwd_text", (CONFIGS[0],), None,
                              {"ws": "detfixed,dqlag", "deterministic": True}),
    "nowguni-blk128": ("_bwd_text", (CONFIGS[0],), None, {"ws": "nowguni"}),
}
# the configurations of the ablation tests (opt-in variants, kept by kept_ptx_ablation; the
# defaults they compare with are read from kept_ptx)
_PTX_ABLATION_UNSPLIT = {
    "det-blk64": ("_bwd_text", (CONFIGS[1],), None, {"deterministic": True}),
    "det-blk128": ("_bwd_text", (CONFIGS[0],), None, {"deterministic": True}),
    "det-rows": ("_bwd_text", (CONFIGS[1],), None, {"deterministic": True, "dq": "rows"}),
    "det-relaxpoll-blk64": ("_bwd_text", (CONFIGS[1],), None,
                            {"deterministic": True, "ws": "relaxpoll"}),
    "det-stream-blk64": ("_bwd_text", (CONFIGS[1],), None,
                         {"deterministic": True, "ws": "detstream", "impl": "auto",
                          "det_writer": True, "sq": 4096, "skv": 4096, "kmax": 40}),
    "det-sched-blk64": ("_bwd_text", (CONFIGS[1],), None,
                        {"deterministic": True, "impl": "auto", "det_writer": True,
                         "sq": 4096, "skv": 4096, "kmax": 40, "ws": "nodetstream"}),
    "det-overlap-blk64": ("_bwd_text", (CONFIGS[1],), None,
                          {"deterministic": True, "ws": "detstream,detoverlap", "impl": "auto",
                           "det_writer": True, "sq": 4096, "skv": 4096, "kmax": 40}),
    "split-blk128": ("_bwd_text", (CONFIGS[0],), None, {"ws": "splitwait"}),
    "split-blk64": ("_bwd_text", (CONFIGS[1],), None, {"ws": "splitwait"}),
    "lselate-blk128": ("_bwd_text", (CONFIGS[0],), None, {"ws": "lselate"}),
    "dqclaim-blk64": ("_bwd_text", (CONFIGS[1],), None, {"ws": "dqclaim"}),
    "zerolag-blk64": ("_bwd_text", (CONFIGS[1],), None, {"ws": "zerolag"}),
    "pre4-blk64": ("_bwd_text", (CONFIGS[1],), None, {"pre": "kernel4"}),
    "persist-blk128": ("_bwd_text", (CONFIGS[0],), None, {"ws": "persist"}),
    "persist-epiregs-blk128": ("_bwd_text", (CONFIGS[0],), None, {"ws": "persist,epiregs"}),
    "l2hint-blk64": ("_bwd_text", (CONFIGS[1],), None, {"ws": "l2hint"}),
    "l2hint-blk128": ("_bwd_text", (CONFIGS[0],), None, {"ws": "l2hint"}),
    "l2normal-blk64": ("_bwd_text", (CONFIGS[1],), None, {"ws": "l2normal"}),
    "l2normal-blk128": ("_bwd_text", (CONFIGS[0],), None, {"ws": "l2normal"}),
    "ldscale-blk128": ("_bwd_text", (CONFIGS[0],), None, {"ws": "ldscale"}),
    "dvwait-blk128": ("_bwd_text", (CONFIGS[0],), None, {"ws": "dvwait"}),
    "dklag-blk128": ("_bwd_text", (CONFIGS[0],), None, {"ws": "dklag"}),
    "sahead-blk128": ("_bwd_text", (CONFIGS[0],), None, {"ws": "sahead"}),
    "stamp-blk128": ("_bwd_text", (CONFIGS[0],), None, {"ws": "stamp=3"}),
    "entahead-blk128": ("_bwd_text", (CONFIGS[0],), None, {"ws": "entahead"}),
    # the fixed point's per-row multipliers next to four Q / dO stages did not fit before the
    # plan counted them (the dQ slices staged in the Q / dO tiles: three stages)
    "detfixed-dqalias-blk128": ("_bwd_text", (CONFIGS[0],), None,
                                {"ws": "detfixed,dqalias", "deterministic": True}),
    "fixemu4-blk128": ("_bwd_text", (CONFIGS[0],), None,
                       {"ws": "detfixed,fixemu=4", "deterministic": True}),
    "ex2emu3-blk128": ("_bwd_text", (CONFIGS[0],), None, {"ws": "ex2emu=3"}),
    "rows-blk128": ("_bwd_text", (CONFIGS[0],), None, {"dq": "rows"}),
    "redv4-rows-blk128": ("_bwd_text", (CONFIGS[0],), None, {"ws": "redv4", "dq": "rows"}),
    "l2hint-det-blk64": ("_bwd_text", (CONFIGS[1],), None,
                         {"deterministic": True, "impl": "auto", "det_writer": True,
                          "sq": 4096, "skv": 4096, "kmax": 40, "ws": "nodetstream,l2hint"}),
}


def _nobuckets(configs):
    """``configs`` with ``nobuckets`` added to each one's ``bsa_bwd_ws`` (one CTA per KV
    block)."""
    return {name: (fn, args, fields, {**kw, "ws": ",".join(filter(None, ("nobuckets",
                                                                         kw.get("ws", ""))))})
            for name, (fn, args, fields, kw) in configs.items()}


_PTX_CONFIGS = {
    **_nobuckets(_PTX_UNSPLIT),
    # the defaults: long K->Q lists split in buckets (both block sizes, and with the
    # fixed-point deterministic dQ)
    "buckets-blk128": ("_bwd_text", (CONFIGS[0],), None, {}),
    "buckets-blk64": ("_bwd_text", (CONFIGS[1],), None, {}),
    "buckets-det-blk128": ("_bwd_text", (CONFIGS[0],), None,
                           {"ws": "detfixed", "deterministic": True}),
}
_PTX_ABLATION = _nobuckets(_PTX_ABLATION_UNSPLIT)
_DEFAULT_PTX = {_ids(CONFIGS[0]): "buckets-blk128", _ids(CONFIGS[1]): "buckets-blk64"}


@pytest.fixture(scope="module")
def kept_ptx(tmp_path_factory):
    """The directory of the PTX (and lowered text) kept while lowering :data:`_PTX_CONFIGS`
    in one fresh process (tests/kept_ptx.py)."""
    import kept_ptx as kp  # noqa: PLC0415

    return kp.keep_ptx_shared(tmp_path_factory, "test_lowering_bsa_bwd_ws",
                              "test_lowering_bsa_bwd_ws", _PTX_CONFIGS)


@pytest.fixture(scope="module")
def kept_ptx_ablation(tmp_path_factory):
    """The directory of the PTX kept while lowering :data:`_PTX_ABLATION` (the ablation
    tier's variants) in one fresh process."""
    import kept_ptx as kp  # noqa: PLC0415

    return kp.keep_ptx_shared(tmp_path_factory, "test_lowering_bsa_bwd_ws_ablation",
                              "test_lowering_bsa_bwd_ws", _PTX_ABLATION)


def _ws_ptx(kept_ptx, name):
    """The PTX of the sm90ws backward of the configuration ``name`` of :data:`_PTX_CONFIGS`
    or :data:`_PTX_ABLATION` (kept with CUTE_DSL_KEEP=ptx in a fresh process: ``kept_ptx``
    is the directory of the fixture that kept it)."""
    import kept_ptx as kp  # noqa: PLC0415

    files = kp.ptx_of(kept_ptx, name)
    ws = [t for t in files.values() if "bsa_bwd_sm90_ws" in t]
    assert len(ws) == 1, list(files)
    return ws[0]


@pytest.mark.parametrize("cfg,causal", [(CONFIGS[0], False), (CONFIGS[3], True)],
                         ids=["blk128", "blk64-d64-causal"])
def test_bsa_bwd_ws_dqclaim_key(cfg, causal):
    """``bsa_bwd_ws=dqclaim`` (opt-in): the key has it (and the dQ writer warp), causal or
    not; not with deterministic=True, without the writer (``dq_writer`` off) or with packed
    rows; the default key not (the lowering: :func:`test_bsa_bwd_ws_dqclaim_lowers`)."""
    from jax_sparse_attn.config import Switches
    from jax_sparse_attn.ffi import bsa

    def key(ws="dqclaim", **kw):
        sw = kw.pop("sw", {})
        return bsa.bwd_config(jnp.bfloat16, cfg["d"], cfg["blk"], False,
                              Switches(bsa_bwd_impl="sm90ws", bsa_bwd_ws=ws, **sw), **kw)

    assert key(causal=causal).dq_claim and key(causal=causal).dq_writer
    assert not key("", causal=causal).dq_claim
    assert not key(deterministic=True).dq_claim
    assert not key(sw={"dq_writer": "off"}).dq_claim
    assert not key(pack_gqa=2).dq_claim


@pytest.mark.ablation
@pytest.mark.parametrize("cfg,causal", [(CONFIGS[0], False), (CONFIGS[3], True)],
                         ids=["blk128", "blk64-d64-causal"])
def test_bsa_bwd_ws_dqclaim_lowers(cfg, causal):
    """``bsa_bwd_ws=dqclaim`` (opt-in) lowers (the key: :func:`test_bsa_bwd_ws_dqclaim_key`);
    the call is four launches (the lists, delta without the zeroing, the backward with the
    per-tile flags, the reordering that reads them: not with tailconv)."""
    txt = _bwd_text(cfg, ws="dqclaim", causal=causal)
    assert txt.count(CALL_TARGET) == 4 == _calls(cfg, ws="dqclaim", causal=causal)


@pytest.mark.ablation
def test_bsa_bwd_ws_dqclaim_ptx(kept_ptx, kept_ptx_ablation):
    """``dqclaim``: the dQ writer claims each staged query tile with a relaxed atomic add,
    stores it (bulk copy) or, after acquire loads and an async-proxy fence, reduce-adds it,
    and releases a stored tile with a fenced atomic add; the kernel without them (and
    without tailconv's count) has no atomic, no proxy fence and no bulk store of dQ."""
    claim = _ws_ptx(kept_ptx_ablation, "dqclaim-blk64")
    default = _ws_ptx(kept_ptx, "notailconv-blk64")
    atom = "atom.relaxed.gpu.global.add.s32"
    store = "cp.async.bulk.global.shared::cta.bulk_group"
    add = "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32"
    assert claim.count(atom) == 2 and store in claim and add in claim, claim.count(atom)
    assert "ld.acquire.gpu.global.b32" in claim and "fence.acq_rel.gpu" in claim
    assert "fence.proxy.async.global" in claim
    assert atom not in default and store not in default and add in default
    assert "fence.proxy.async.global" not in default


@pytest.mark.parametrize("cfg", [CONFIGS[0], CONFIGS[3]], ids=["blk128", "blk64-d64"])
def test_bsa_bwd_ws_zerolag_key(cfg):
    """``bsa_bwd_ws=zerolag`` (opt-in): the key has it with the dQ writer warp, not
    deterministic, unpacked, not with lpt, dqclaim or the row-major dQ workspace; the default
    key has it off (the lowering: :func:`test_bsa_bwd_ws_zerolag_lowers`)."""
    from jax_sparse_attn.config import Switches
    from jax_sparse_attn.ffi import bsa

    def key(ws="zerolag", sw=None, **kw):
        return bsa.bwd_config(jnp.bfloat16, cfg["d"], cfg["blk"], False,
                              Switches(bsa_bwd_impl="sm90ws", bsa_bwd_ws=ws, **(sw or {})),
                              **kw)

    assert key().zero_lag == bsa.ZERO_LAG and key().dq_writer
    assert key(causal=True).zero_lag == bsa.ZERO_LAG
    assert key("").zero_lag == 0
    assert key(deterministic=True).zero_lag == 0
    assert key(pack_gqa=2).zero_lag == 0
    assert key("zerolag,lpt").zero_lag == 0
    assert key("zerolag,dqclaim").zero_lag == 0 and key("zerolag,dqclaim").dq_claim
    assert key(sw={"dq_writer": "off"}).zero_lag == 0
    assert key(sw={"bsa_bwd_dq": "rows"}).zero_lag == 0


@pytest.mark.ablation
@pytest.mark.parametrize("cfg", [CONFIGS[0], CONFIGS[3]], ids=["blk128", "blk64-d64"])
def test_bsa_bwd_ws_zerolag_lowers(cfg):
    """``bsa_bwd_ws=zerolag`` (opt-in) lowers (the key: :func:`test_bsa_bwd_ws_zerolag_key`);
    the call is three launches (the lists, the preprocessing zeroing the first pairs'
    workspace, the backward launching the reordering)."""
    txt = _bwd_text(cfg, ws="zerolag")
    assert txt.count(CALL_TARGET) == 3 == _calls(cfg, ws="zerolag")


@pytest.mark.ablation
def test_bsa_bwd_ws_zerolag_ptx(kept_ptx, kept_ptx_ablation):
    """``zerolag``: warp 1 zeroes its share of a later pair's workspace, fences and counts it
    with one fenced atomic add, and waits with acquire loads for its own pair's count, then
    fences the generic proxy against its bulk reduce-adds; the kernel without them (and
    without tailconv's count) has none of these."""
    zl = _kernel_text(_ws_ptx(kept_ptx_ablation, "zerolag-blk64"), "BsaBwdSm90Ws")
    default = _ws_ptx(kept_ptx, "notailconv-blk64")
    atom = "atom.relaxed.gpu.global.add.s32"
    # zerolag's count and tailconv's (the default)
    assert zl.count(atom) == 2 and "ld.acquire.gpu.global.b32" in zl
    assert "fence.proxy.async.global" in zl and "fence.acq_rel.gpu" in zl
    assert zl.index("fence.acq_rel.gpu") < zl.index(atom)
    assert zl.count("fence.proxy.async.global") == 3
    for s in (atom, "ld.acquire.gpu", "fence.proxy.async.global", "fence.acq_rel.gpu"):
        assert s not in default, s


@pytest.mark.parametrize("cfg", [CONFIGS[0], CONFIGS[3]], ids=["blk128", "blk64-d64"])
def test_bsa_bwd_ws_tailconv_lowers(cfg):
    """``tailconv`` (the default; ``notailconv`` turns it off): with the dQ writer warp, not
    deterministic, unpacked, not with dqclaim; alone and with zerolag the call is three
    launches (the lists, the preprocessing, and one call that launches the backward and
    then the reordering that writes dq as the backward's pairs complete)."""
    from jax_sparse_attn.config import Switches
    from jax_sparse_attn.ffi import bsa

    def key(ws="tailconv", sw=None, **kw):
        return bsa.bwd_config(jnp.bfloat16, cfg["d"], cfg["blk"], False,
                              Switches(bsa_bwd_impl="sm90ws", bsa_bwd_ws=ws, **(sw or {})),
                              **kw)

    assert key().tail_conv and key().dq_writer and key().zero_lag == 0
    assert key("tailconv,lpt").tail_conv and key(causal=True).tail_conv
    both = key("zerolag,tailconv")
    assert both.tail_conv and both.zero_lag == bsa.ZERO_LAG
    assert key("").tail_conv and key("hlpt").tail_conv
    assert not key("notailconv").tail_conv
    # the ordered deterministic additions have none; the fixed-point dQ (the deterministic
    # default) runs the default mode's kernels, tail_conv included
    assert not key("tailconv,detorder", deterministic=True).tail_conv
    fixed = key(deterministic=True)
    assert fixed.tail_conv and fixed.dq_fixed
    assert not key(pack_gqa=2).tail_conv
    assert not key("tailconv,dqclaim").tail_conv
    assert not key(sw={"dq_writer": "off"}).tail_conv
    assert not key(sw={"bsa_bwd_dq": "rows"}).tail_conv
    # the reordering is launched with PDL: off with the pdl switch
    assert not key(sw={"pdl": False}).tail_conv
    for ws in ("tailconv", "zerolag,tailconv"):
        txt = _bwd_text(cfg, ws=ws)
        assert txt.count(CALL_TARGET) == 3 == _calls(cfg, ws=ws), ws


def test_bsa_bwd_ws_tailconv_ptx(kept_ptx):
    """``tailconv``: every CTA lets the next grid launch; warp 1 waits for its bulk additions
    to complete, fences the async proxy and counts the CTA with a fenced atomic; the
    reordering kernel waits for its pair's count (relaxed polls, a sleep between them, one
    fence) instead of for the backward's grid at its start, and its last CTA waits for that
    grid at its end; it is the default's kernel. With ``notailconv`` the backward lets no
    grid launch early and counts nothing."""
    import kept_ptx as kp  # noqa: PLC0415

    tc = _ws_ptx(kept_ptx, "tailconv-blk64")
    assert tc == _ws_ptx(kept_ptx, _ids(CONFIGS[1]))
    default = _ws_ptx(kept_ptx, "notailconv-blk64")
    atom = "atom.relaxed.gpu.global.add.s32"
    assert tc.count("griddepcontrol.launch_dependents") == 1 and tc.count(atom) == 1
    # the count: after a wait for complete bulk groups and an async-proxy fence
    before = tc[:tc.index(atom)]
    wait = [m.end() for m in re.finditer(r"cp\.async\.bulk\.wait_group\s+0;", before)]
    assert wait and "fence.proxy.async.global" in before[wait[-1]:]
    assert "fence.acq_rel.gpu" in before[wait[-1]:]
    assert "griddepcontrol.launch_dependents" not in default and atom not in default
    def reorder_entries(name):
        # the reordering kernel's entry (with tailconv it shares the backward's module)
        return [e for t in kp.ptx_of(kept_ptx, name).values()
                for e in t.split(".entry ")[1:] if e.startswith("kernel_cutlass_kernel_jax_"
                                                                 "sparse_attnkernelsdq_tiles")]

    conv, conv_default = reorder_entries("tailconv-blk64"), reorder_entries("notailconv-blk64")
    assert len(conv) == 1 == len(conv_default)
    c = conv[0]
    # relaxed polls with a sleep between them, one fence after the last
    assert "ld.relaxed.gpu.global.b32" in c and "nanosleep.u32" in c
    assert "fence.acq_rel.gpu" in c and "fence.proxy.async.global" in c
    assert c.count("griddepcontrol.wait") == 1
    assert c.index("ld.relaxed.gpu.global.b32") < c.index("griddepcontrol.wait")
    # only the grid's last CTA waits for the backward's grid (the others exit after their
    # tile instead of holding their SM until the backward ends)
    assert "%nctaid.z" in c[c.index("st.global"):c.index("griddepcontrol.wait")]
    assert "ld.relaxed" not in conv_default[0] and "nanosleep" not in conv_default[0]


@pytest.mark.parametrize("cfg", [CONFIGS[1], CONFIGS[0]], ids=["blk64", "blk128"])
def test_bsa_bwd_ws_default_l2_policy_ptx(kept_ptx, cfg):
    """Without ``l2hint`` / ``l2normal`` the backward's TMA copies (all loads) pass the DSL's
    constant 0 as their L2 policy operand and the writer warp's dQ bulk reduce-adds carry no
    ``.L2::cache_hint`` (the opt-in policies: :func:`test_bsa_bwd_ws_l2hint_ptx`)."""
    import kept_ptx as kp  # noqa: PLC0415

    text = _ws_ptx(kept_ptx, _ids(cfg))
    pol = kp.tma_copy_policies(text)
    assert text.count("cp.async.bulk.tensor.") == len(pol) > 0
    assert {k for k, _, _ in pol} == {"load"} and {p for _, p, _ in pol} == {"0"}, pol
    red = "cp.reduce.async.bulk.global.shared::cta.bulk_group"
    assert text.count(red + ".add.f32") > 0 and red + ".L2::cache_hint" not in text


@pytest.mark.ablation
@pytest.mark.parametrize("cfg,tag", [(CONFIGS[1], "blk64"), (CONFIGS[0], "blk128")],
                         ids=["blk64", "blk128"])
def test_bsa_bwd_ws_l2hint_ptx(kept_ptx, kept_ptx_ablation, cfg, tag):
    """``bsa_bwd_ws=l2hint``: by the kernel parameter of each load's tensor map, the K / V
    tensor loads carry an ``evict_first`` L2 policy (``createpolicy``), the Q / dO loads an
    ``evict_last`` one, and the writer warp's dQ
    bulk reduce-adds (``.L2::cache_hint``) an ``evict_last`` one; ``l2normal``:
    ``evict_normal`` on all of them. The copies and reductions are the same as the
    default's (whose policies: :func:`test_bsa_bwd_ws_default_l2_policy_ptx`)."""
    import kept_ptx as kp  # noqa: PLC0415

    text = {m: _ws_ptx(kept_ptx_ablation, f"{m}-{tag}") for m in ("l2hint", "l2normal")}
    text[""] = _ws_ptx(kept_ptx, _ids(cfg))
    pol = {m: kp.tma_copy_policies(t) for m, t in text.items()}
    for m, t in text.items():
        assert t.count("cp.async.bulk.tensor.") == len(pol[m]) > 0, m
        assert {k for k, _, _ in pol[m]} == {"load"}, m
    assert {p for _, p, _ in pol["l2normal"]} == {"evict_normal"}
    assert ([t for _, _, t in pol["l2hint"]] == [t for _, _, t in pol[""]]
            == [t for _, _, t in pol["l2normal"]])
    # by the kernel parameter of the tensor map: Q 0 and dO 2 evict_last, K 4 and V 6
    # evict_first
    want = {0: "evict_last", 2: "evict_last", 4: "evict_first", 6: "evict_first"}
    assert {t for _, _, t in pol["l2hint"]} == set(want)
    assert all(p == want[t] for _, p, t in pol["l2hint"]), pol["l2hint"]
    red = "cp.reduce.async.bulk.global.shared::cta.bulk_group"
    n = text[""].count(red + ".add.f32")
    assert n > 0
    for m in ("l2hint", "l2normal"):
        assert text[m].count(red + ".L2::cache_hint.add.f32") == n
        assert text[m].count(red + ".add.f32") == 0
    # the reductions' policy operand: evict_last with l2hint
    regs = re.findall(re.escape(red) + r"\.L2::cache_hint\.add\.f32[^;]*,\s*(%rd\d+);",
                      text["l2hint"])
    made = dict((r, p) for p, r in re.findall(
        r"createpolicy\.fractional\.L2::(evict_\w+)\.b64\s+(%rd\d+)", text["l2hint"]))
    assert regs and {made.get(r) for r in regs} == {"evict_last"}, (regs, made)


@pytest.mark.ablation
def test_bsa_bwd_ws_l2hint_deterministic_ptx(kept_ptx_ablation):
    """``l2hint`` with ``deterministic=True`` (the dQ writer warp adds each query tile in its
    turn): the same load policies, and every fp32 bulk reduce-add of the writer carries the
    ``evict_last`` policy; the bulk stores of a tile's first contribution keep theirs."""
    import kept_ptx as kp  # noqa: PLC0415

    det = _ws_ptx(kept_ptx_ablation, "det-sched-blk64")
    hint = _ws_ptx(kept_ptx_ablation, "l2hint-det-blk64")
    want = {0: "evict_last", 2: "evict_last", 4: "evict_first", 6: "evict_first"}
    pol = kp.tma_copy_policies(hint)
    assert pol and all(p == want[t] for _, p, t in pol), pol
    red = "cp.reduce.async.bulk.global.shared::cta.bulk_group"
    n = det.count(red + ".add.f32")
    assert n > 0 and hint.count(red + ".L2::cache_hint.add.f32") == n
    assert hint.count(red + ".add.f32") == 0
    assert hint.count("cp.async.bulk.global.shared::cta.bulk_group") == det.count(
        "cp.async.bulk.global.shared::cta.bulk_group")


def test_bsa_bwd_ws_uniform_frags(kept_ptx):
    """By default the consumers' shared-memory wgmma operands are partitioned with the
    warpgroup's first thread, made warp-uniform (one more ``shfl.sync.idx`` than with
    ``bsa_bwd_ws=thrfrags``, the per-thread partition); the GEMMs are the same."""
    from jax_sparse_attn.config import Switches
    from jax_sparse_attn.ffi import bsa

    def key(ws):
        return bsa.bwd_config(jnp.bfloat16, 128, 128, False,
                              Switches(bsa_bwd_impl="sm90ws", bsa_bwd_ws=ws))

    assert key(()).ws_uniform_frags and not key(("thrfrags",)).ws_uniform_frags
    uni, thr = _ws_ptx(kept_ptx, _ids(CONFIGS[0])), _ws_ptx(kept_ptx, "thrfrags-blk128")
    assert uni.count("shfl.sync.idx") == thr.count("shfl.sync.idx") + 1
    for op in ("wgmma.mma_async", "cp.async.bulk.tensor", "setmaxnreg"):
        assert uni.count(op) == thr.count(op) > 0, op


def test_bsa_bwd_ws_wghand(kept_ptx):
    """``bsa_bwd_ws=wghand`` (the default at blk 128 with the dQ writer warp and the staging
    tile): the key, off with nowghand, at blk 64, with deterministic=True (ordered), dqalt,
    dqclaim or without the writer; with the fixed-point deterministic dQ it stays (that runs
    the writer path). The PTX: each warpgroup meets the writer on its own barriers, 2 / 11
    (staged) and 5 / 10 (handed back) of 160 threads; nowghand has the 288-thread pair
    2 / 5; the same bulk reduce-adds and GEMMs."""
    from jax_sparse_attn.config import Switches, from_env
    from jax_sparse_attn.ffi import bsa

    def key(ws, blk=128, **kw):
        sw = kw.pop("sw", {})
        return bsa.bwd_config(jnp.bfloat16, 128, blk, False,
                              Switches(bsa_bwd_impl="sm90ws", bsa_bwd_ws=ws, **sw), **kw)

    assert key(()).ws_wg_hand and key(("wghand",)).ws_wg_hand
    assert not key(("nowghand",)).ws_wg_hand
    assert not key((), blk=64).ws_wg_hand
    assert not key(("detorder",), deterministic=True).ws_wg_hand
    assert key(("detfixed",), deterministic=True).ws_wg_hand
    assert not key(("dqalt",)).ws_wg_hand
    assert not key(("dqclaim",)).ws_wg_hand
    assert not key((), sw={"dq_writer": "off"}).ws_wg_hand
    assert key(("persist",)).ws_wg_hand
    with pytest.raises(ValueError, match="'wghand' and 'nowghand' contradict"):
        from_env({"JAX_SPARSE_ATTN_BSA_BWD_WS": "wghand,nowghand"})
    # (the default's dQ one step late in warpgroup 0 needs the hand-back: compared without it)
    hand, base = _ws_ptx(kept_ptx, "nodqlag-blk128"), _ws_ptx(kept_ptx, "nowghand-blk128")
    import kept_ptx as kp  # noqa: PLC0415

    kp.assert_wg_hand_barriers(hand, base)
    red = "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32"
    for op in (red, "wgmma.mma_async", "cp.async.bulk.tensor"):
        assert hand.count(op) == base.count(op) > 0, op


def test_bsa_bwd_ws_ldscale_key():
    """``bsa_bwd_ws=ldscale`` (opt-in): the key has it, the default key not; off with
    deterministic=True, where the fixed-point dQ (the deterministic default at blk 64 and
    128, and with ``detfixed``) ignores it (the kernel: :func:`test_bsa_bwd_ws_ldscale`)."""
    from jax_sparse_attn.config import Switches
    from jax_sparse_attn.ffi import bsa

    def key(ws, **kw):
        return bsa.bwd_config(jnp.bfloat16, 128, 128, False,
                              Switches(bsa_bwd_impl="sm90ws", bsa_bwd_ws=ws), **kw)

    assert key(("ldscale",)).ws_ld_scaled and not key(()).ws_ld_scaled
    assert not key(("ldscale",), deterministic=True).ws_ld_scaled
    # the fixed-point deterministic dQ (the default) runs the default mode's kernel: its
    # multipliers take the unscaled delta
    for opts, blk in ((("ldscale",), 64), (("ldscale",), 128), (("ldscale", "detfixed"), 128)):
        k = bsa.bwd_config(jnp.bfloat16, 128, blk, False,
                           Switches(bsa_bwd_impl="sm90ws", bsa_bwd_ws=opts),
                           deterministic=True)
        assert k.dq_fixed and not k.ws_ld_scaled, k


@pytest.mark.ablation
def test_bsa_bwd_ws_ldscale(kept_ptx, kept_ptx_ablation):
    """``bsa_bwd_ws=ldscale`` (opt-in; the key: :func:`test_bsa_bwd_ws_ldscale_key`): the
    kernel takes lse in the log2 domain and delta times softmax_scale, so its PTX has none of
    the per-column ``lse log2 e`` products (fewer ``mul.f32``, the same subtractions, GEMMs
    and copies)."""
    base = _ws_ptx(kept_ptx, _ids(CONFIGS[0]))
    scaled = _ws_ptx(kept_ptx_ablation, "ldscale-blk128")
    assert scaled.count("mul.f32") < base.count("mul.f32")
    assert scaled.count("sub.f32") == base.count("sub.f32") > 0
    for op in ("wgmma.mma_async", "cp.async.bulk.tensor", "ex2.approx"):
        assert scaled.count(op) == base.count(op) > 0, op


def test_bsa_bwd_ws_dvwait_key():
    """``bsa_bwd_ws=dvwait`` (opt-in): the key has it only where dQ and dK are issued
    together (not with the dQ alias of blk 64 / D 128, decouple or dqalt), the default key
    not (the kernel: :func:`test_bsa_bwd_ws_dvwait`)."""
    from jax_sparse_attn.config import Switches
    from jax_sparse_attn.ffi import bsa

    def key(ws, d=128, blk=128, **kw):
        return bsa.bwd_config(jnp.bfloat16, d, blk, False,
                              Switches(bsa_bwd_impl="sm90ws", bsa_bwd_ws=ws), **kw)

    assert key(("dvwait",)).ws_dv_wait and not key(()).ws_dv_wait
    assert key(("dvwait",), d=64, blk=64).ws_dv_wait
    assert key(("dvwait",), deterministic=True).ws_dv_wait
    for ws, blk in ((("dvwait",), 64), (("dvwait", "decouple"), 128),
                    (("dvwait", "dqalt"), 128)):
        assert not key(ws, blk=blk).ws_dv_wait, ws


@pytest.mark.ablation
def test_bsa_bwd_ws_dvwait(kept_ptx, kept_ptx_ablation):
    """``bsa_bwd_ws=dvwait`` (opt-in; the key: :func:`test_bsa_bwd_ws_dvwait_key`): the
    kernel waits once more per step (one more ``wgmma.wait_group 1``: after the dQ issue,
    before dK) with the same GEMMs, copies and reductions."""
    # (dvwait leaves the default's late dQ of warpgroup 0 off: compared with nodqlag)
    base, dvw = _ws_ptx(kept_ptx, "nodqlag-blk128"), _ws_ptx(kept_ptx_ablation, "dvwait-blk128")
    wait1 = re.compile(r"wgmma\.wait_group\.sync\.aligned\s+1;")
    assert len(wait1.findall(dvw)) > len(wait1.findall(base)) > 0
    red = "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32"
    for op in ("wgmma.mma_async", "cp.async.bulk.tensor", red, "ex2.approx"):
        assert dvw.count(op) == base.count(op) > 0, op


def test_bsa_bwd_ws_dklag_key():
    """``bsa_bwd_ws=dklag`` (opt-in): the key has it only at blk 128 on the default dQ path
    (not deterministic, dqalias, decouple, dqalt, dvwait or persist), the default key not
    (the kernel: :func:`test_bsa_bwd_ws_dklag`)."""
    from jax_sparse_attn.config import Switches
    from jax_sparse_attn.ffi import bsa

    def key(ws, d=128, blk=128, **kw):
        return bsa.bwd_config(jnp.bfloat16, d, blk, False,
                              Switches(bsa_bwd_impl="sm90ws", bsa_bwd_ws=ws), **kw)

    assert key(("dklag",)).ws_dk_lag and not key(()).ws_dk_lag
    assert key(("dklag",), d=64).ws_dk_lag
    assert not key(("dklag",), deterministic=True).ws_dk_lag
    for ws, blk in ((("dklag",), 64), (("dklag", "decouple"), 128), (("dklag", "dqalt"), 128),
                    (("dklag", "dvwait"), 128), (("dklag", "dqalias"), 128),
                    (("dklag", "persist"), 128)):
        assert not key(ws, blk=blk).ws_dk_lag, ws


@pytest.mark.ablation
def test_bsa_bwd_ws_dklag(kept_ptx, kept_ptx_ablation):
    """``bsa_bwd_ws=dklag`` (opt-in; the key: :func:`test_bsa_bwd_ws_dklag_key`). In the
    kernel each step issues the previous step's dK GEMM as a third group after its S^T /
    dP^T GEMMs (a group in every step, empty in a block's first, each branch committing its
    own, so the S^T wait becomes ``wgmma.wait_group 2``), and the block's last dK GEMM once
    more after its last step: one more dK GEMM (4 wgmma, the 64 query rows of a step in k16
    blocks) than the default's two unrolled steps, three more commits, the same copies and
    reductions; every group is committed in the basic block of its last wgmma."""
    # (dklag leaves the default's late dQ of warpgroup 0 off: compared with nodqlag)
    base, lag = _ws_ptx(kept_ptx, "nodqlag-blk128"), _ws_ptx(kept_ptx_ablation, "dklag-blk128")
    wait2 = re.compile(r"wgmma\.wait_group\.sync\.aligned\s+2;")
    assert len(wait2.findall(lag)) == 2 and not wait2.findall(base)
    assert lag.count("wgmma.mma_async") == base.count("wgmma.mma_async") + 4
    # per unrolled step a commit in each branch of the previous-dK issue, and the flush's
    assert lag.count("wgmma.commit_group") == base.count("wgmma.commit_group") + 3
    # every group is committed in the basic block of its last wgmma
    import kept_ptx as kp  # noqa: PLC0415

    for text in (base, lag):
        assert kp.assert_wgmma_groups_in_block(text) > 0
    red = "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32"
    for op in ("cp.async.bulk.tensor", red, "ex2.approx", "stmatrix"):
        assert lag.count(op) == base.count(op) > 0, op


def test_bsa_bwd_ws_sahead_key():
    """``bsa_bwd_ws=sahead`` (opt-in): the key has it only at blk 128 on the default dQ path
    (not deterministic, dqalias, decouple, dqalt, dvwait, persist, dklag or splitwait), the
    default key not (the kernel: :func:`test_bsa_bwd_ws_sahead`)."""
    from jax_sparse_attn.config import Switches
    from jax_sparse_attn.ffi import bsa

    def key(ws, d=128, blk=128, **kw):
        return bsa.bwd_config(jnp.bfloat16, d, blk, False,
                              Switches(bsa_bwd_impl="sm90ws", bsa_bwd_ws=ws), **kw)

    assert key(("sahead",)).ws_s_ahead and not key(()).ws_s_ahead
    assert key(("sahead",), d=64).ws_s_ahead
    assert not key(("sahead",), deterministic=True).ws_s_ahead
    for ws, blk in ((("sahead",), 64), (("sahead", "decouple"), 128),
                    (("sahead", "dqalt"), 128), (("sahead", "dvwait"), 128),
                    (("sahead", "dqalias"), 128), (("sahead", "persist"), 128),
                    (("sahead", "dklag"), 128), (("sahead", "splitwait"), 128)):
        assert not key(ws, blk=blk).ws_s_ahead, ws


@pytest.mark.ablation
def test_bsa_bwd_ws_sahead(kept_ptx, kept_ptx_ablation):
    """``bsa_bwd_ws=sahead`` (opt-in; the key: :func:`test_bsa_bwd_ws_sahead_key`). In the
    kernel the first 64-row step of a list entry ends without waiting for its dK GEMM and
    without releasing its Q / dO stage; the second step releases it after its S^T wait, and
    where the second step is skipped the stage is released after it: one more stage release
    (``mbarrier.arrive``) than the default, the same GEMMs, commits, waits, copies and
    reductions, every group committed in the basic block of its last wgmma."""
    # (sahead leaves the default's late dQ of warpgroup 0 off: compared with nodqlag)
    base = _ws_ptx(kept_ptx, "nodqlag-blk128")
    ahead = _ws_ptx(kept_ptx_ablation, "sahead-blk128")
    assert ahead.count("mbarrier.arrive") == base.count("mbarrier.arrive") + 1
    for op in ("wgmma.mma_async", "wgmma.commit_group", "wgmma.wait_group",
               "cp.async.bulk.tensor",
               "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32", "ex2.approx",
               "stmatrix"):
        assert ahead.count(op) == base.count(op) > 0, op
    import kept_ptx as kp  # noqa: PLC0415

    assert kp.assert_wgmma_groups_in_block(ahead) > 0


#: an SM clock read of the ``stamp=N`` diagnostics
_CLOCK = re.compile(r"mov\.u32\s+%r\d+,\s*%clock;")


def test_bsa_bwd_ws_stamps_key_and_default_ptx(kept_ptx):
    """``bsa_bwd_ws=stamp=N`` (diagnostic): the key carries the step, the default key none;
    the default kernel reads no SM clock (the stamped kernel:
    :func:`test_bsa_bwd_ws_stamps`)."""
    from jax_sparse_attn.config import Switches
    from jax_sparse_attn.ffi import bsa

    def key(ws):
        return bsa.bwd_config(jnp.bfloat16, 128, 128, False,
                              Switches(bsa_bwd_impl="sm90ws", bsa_bwd_ws=ws))

    assert key(("stamp=3",)).ws_stamps == (3,) and key(()).ws_stamps == ()
    assert not _CLOCK.findall(_ws_ptx(kept_ptx, _ids(CONFIGS[0])))


@pytest.mark.ablation
def test_bsa_bwd_ws_stamps(kept_ptx, kept_ptx_ablation):
    """``bsa_bwd_ws=stamp=N`` (diagnostic): the kernel reads the SM clock at the 14 points of
    every step and before its stage wait (two unrolled 64-row steps at blk 128) and writes
    the kept step's readings over dK with ordinary stores, without a function call (a call
    makes ptxas serialize every wgmma); the GEMMs and copies are the default's."""
    from jax_sparse_attn.kernels.bsa_bwd_sm90_ws import STAMP_MARK

    base, st = _ws_ptx(kept_ptx, _ids(CONFIGS[0])), _ws_ptx(kept_ptx_ablation, "stamp-blk128")
    # 15 points in each of the two unrolled steps, 3 per CTA
    assert len(_CLOCK.findall(st)) == 33
    assert "call" not in re.sub(r"//.*", "", st).split() and "vprintf" not in st
    assert str(STAMP_MARK) in st or hex(STAMP_MARK) in st.lower()
    for op in ("wgmma.mma_async", "wgmma.commit_group", "cp.async.bulk.tensor", "stmatrix"):
        assert st.count(op) == base.count(op) > 0, op


def test_bsa_bwd_ws_fdiv(kept_ptx):
    """The consumers split each K->Q list entry into query head and block with a multiplier
    computed once per CTA (``cute.FastDivmodDivisorV2``: a ``mul.hi.u32`` per entry) by
    default; ``nofdiv`` keeps the integer division (a ``rem.s32`` more)."""
    from jax_sparse_attn.config import Switches
    from jax_sparse_attn.ffi import bsa

    def key(ws):
        return bsa.bwd_config(jnp.bfloat16, 128, 128, False,
                              Switches(bsa_bwd_impl="sm90ws", bsa_bwd_ws=ws))

    assert key(()).ws_fast_div and not key(("nofdiv",)).ws_fast_div
    base, slow = _ws_ptx(kept_ptx, _ids(CONFIGS[0])), _ws_ptx(kept_ptx, "nofdiv-blk128")
    assert base.count("mul.hi.u32") == slow.count("mul.hi.u32") + 1
    assert base.count("rem.s32") + 1 == slow.count("rem.s32")
    for op in ("wgmma.mma_async", "cp.async.bulk.tensor", "stmatrix", "div.s32"):
        assert base.count(op) == slow.count(op), op


def test_bsa_bwd_ws_qprobe(kept_ptx):
    """By default at blk 128 with the per-warpgroup dQ hand-back (not on the ordered
    deterministic path, dqalias, dqalt, nowghand, dklag or sahead; the deterministic
    fixed-point dQ has it) each of the two unrolled steps tests the next step's
    Q / dO stage once (``mbarrier.test_wait``, acquire) and the next step skips its wait
    where the test passed; ``noqprobe`` waits at every step's start. The GEMMs, copies and
    reductions are the same."""
    from jax_sparse_attn.config import Switches
    from jax_sparse_attn.ffi import bsa

    def key(ws, blk=128, deterministic=False):
        return bsa.bwd_config(jnp.bfloat16, 128, blk, False,
                              Switches(bsa_bwd_impl="sm90ws", bsa_bwd_ws=ws),
                              deterministic=deterministic)

    assert key(()).ws_q_probe and key(("qprobe",)).ws_q_probe
    assert not key(("noqprobe",)).ws_q_probe
    assert not key(("detorder",), deterministic=True).ws_q_probe
    assert key((), deterministic=True).ws_q_probe
    for ws, blk in (((), 64), (("nowghand",), 128), (("dqalias",), 128), (("dqalt",), 128),
                    (("dklag",), 128), (("sahead",), 128), (("persist",), 128)):
        assert not key(ws, blk).ws_q_probe, (ws, blk)
    probe, wait = _ws_ptx(kept_ptx, _ids(CONFIGS[0])), _ws_ptx(kept_ptx, "noqprobe-blk128")
    test = re.compile(r"mbarrier\.test_wait\.parity\.acquire\.cta\.shared::cta\.b64")
    assert len(test.findall(probe)) == 2 and not test.findall(wait)
    for op in ("wgmma.mma_async", "wgmma.commit_group", "wgmma.wait_group",
               "cp.async.bulk.tensor", "cp.reduce.async.bulk", "stmatrix", "bar.sync"):
        assert probe.count(op) == wait.count(op) > 0, op
    import kept_ptx as kp  # noqa: PLC0415

    assert kp.assert_wgmma_groups_in_block(probe) > 0


def test_bsa_bwd_ws_dqlag(kept_ptx):
    """``dqlag`` (the default at blk 128 with the per-warpgroup dQ hand-back, not dklag,
    sahead, dvwait or persist; ``nodqlag`` the step-synchronous dQ): warpgroup 0 computes
    its dQ half of a step in the next step and once more after the last one (8 more wgmma
    than ``nodqlag``, one more staging), barrier 1 is an
    arrive / sync pair between the warpgroups, barrier 6 the other way, barrier 9 warpgroup
    1's own; the same copies and TMA loads; each wgmma group committed in its block.
    ``tests/test_barrier_protocols.py`` checks the protocol's barriers and dS^T buffers."""
    from jax_sparse_attn.config import Switches
    from jax_sparse_attn.ffi import bsa

    def key(ws, blk=128, deterministic=False):
        return bsa.bwd_config(jnp.bfloat16, 128, blk, False,
                              Switches(bsa_bwd_impl="sm90ws", bsa_bwd_ws=ws),
                              deterministic=deterministic)

    assert key(("dqlag",)).ws_dq_lag and key(()).ws_dq_lag and not key(("nodqlag",)).ws_dq_lag
    assert key(()).ws_q_probe
    assert not key(("dqlag", "detorder"), deterministic=True).ws_dq_lag
    # fixed-point dQ (the deterministic default): warpgroup 0 keeps the previous step's
    # multipliers in registers for its late half
    assert key((), deterministic=True).ws_wg_hand and key((), deterministic=True).ws_dq_lag
    assert key(("detfixed",), deterministic=True).ws_dq_lag
    assert not key(("detfixed", "nodqlag"), deterministic=True).ws_dq_lag
    for ws, blk in ((("dqlag",), 64), (("dqlag", "nowghand"), 128), (("dqlag", "dklag"), 128),
                    (("dqlag", "sahead"), 128), (("dqlag", "dvwait"), 128),
                    (("dqlag", "persist"), 128), (("dqlag", "dqalt"), 128)):
        assert not key(ws, blk).ws_dq_lag, (ws, blk)
    lag, base = _ws_ptx(kept_ptx, _ids(CONFIGS[0])), _ws_ptx(kept_ptx, "nodqlag-blk128")
    assert lag.count("wgmma.mma_async") == base.count("wgmma.mma_async") + 8
    for op in ("cp.async.bulk.tensor", "cp.reduce.async.bulk", "stmatrix"):
        assert lag.count(op) == base.count(op) > 0, op
    assert re.findall(r"bar\.arrive\s+1, 256;", lag) and re.findall(r"bar\.arrive\s+6, 256;", lag)
    assert not re.findall(r"bar\.arrive\s+[16], 256;", base)
    assert len(re.findall(r"bar\.sync\s+9, 128;", lag)) > len(re.findall(r"bar\.sync\s+9, 128;", base))
    import kept_ptx as kp  # noqa: PLC0415

    assert kp.assert_wgmma_groups_in_block(lag) > 0
    # detfixed with dqlag (its default at blk 128): the late half converted too (one more
    # slice of F2I), the same TMA loads and reductions as detfixed with nodqlag
    fl, f0 = _ws_ptx(kept_ptx, "detfixed-dqlag-blk128"), _ws_ptx(kept_ptx, "detfixed-blk128")
    cvt = re.compile(r"cvt\.rni(\.sat)?\.s32\.f32")
    assert len(cvt.findall(fl)) > len(cvt.findall(f0)) > 0
    assert fl.count("wgmma.mma_async") == f0.count("wgmma.mma_async") + 8
    for op in ("cp.async.bulk.tensor", "cp.reduce.async.bulk"):
        assert fl.count(op) == f0.count(op) > 0, op
    assert kp.assert_wgmma_groups_in_block(fl) > 0


def test_bsa_bwd_ws_wguni(kept_ptx):
    """``bsa_bwd_ws=wguni`` (the default; ``nowguni`` the old index): the key at both block
    sizes and in both modes; the consumers' warpgroup index comes from the warp-uniform warp
    index, so the kernel's text differs from ``nowguni``'s while its GEMMs, copies,
    reductions and named barriers are the same, and no wgmma is serialized."""
    from jax_sparse_attn.config import Switches, from_env
    from jax_sparse_attn.ffi import bsa

    for blk in (64, 128):
        for det in (False, True):
            def key(ws):
                return bsa.bwd_config(jnp.bfloat16, 128, blk, False,
                                      Switches(bsa_bwd_impl="sm90ws", bsa_bwd_ws=ws),
                                      deterministic=det)

            # (both modes, the fixed point and the ordered path alike)
            assert key(("wguni",)).ws_wg_uniform and key(()).ws_wg_uniform
            assert key(("wguni", "detorder")).ws_wg_uniform
            assert key(("detorder",)).ws_wg_uniform
            assert key(("detorder", "nowguni")) == bsa.dataclasses.replace(
                key(("detorder",)), ws_wg_uniform=False)
            assert not key(("nowguni",)).ws_wg_uniform
            assert key(("nowguni",)) == bsa.dataclasses.replace(key(()), ws_wg_uniform=False)
            assert key(("wguni",)) == bsa.dataclasses.replace(key(()), ws_wg_uniform=True)
    # (not with sahead: ptxas then spills more than the 8 bytes its ptxas test allows)
    assert not bsa.bwd_config(jnp.bfloat16, 128, 128, False,
                              Switches(bsa_bwd_impl="sm90ws", bsa_bwd_ws=("sahead", "wguni"))
                              ).ws_wg_uniform
    with pytest.raises(ValueError, match="'wguni' and 'nowguni' contradict"):
        from_env({"JAX_SPARSE_ATTN_BSA_BWD_WS": "wguni,nowguni"})
    uni, base = _ws_ptx(kept_ptx, _ids(CONFIGS[0])), _ws_ptx(kept_ptx, "nowguni-blk128")
    assert uni != base
    for op in ("wgmma.mma_async", "wgmma.commit_group", "wgmma.wait_group",
               "cp.async.bulk.tensor", "cp.reduce.async.bulk", "stmatrix", "bar.sync",
               "bar.arrive", "mbarrier.try_wait", "ex2.approx"):
        assert uni.count(op) == base.count(op) > 0, op
    import kept_ptx as kp  # noqa: PLC0415

    assert kp.assert_wgmma_groups_in_block(uni) > 0


def test_bsa_bwd_ws_fixemu_key():
    """``bsa_bwd_ws=fixemu=N`` (opt-in): with deterministic=True at blk 64 and 128 (the
    fixed-point dQ, the deterministic default) the key carries N in ``ws_fix_emu`` (0
    without the option) and differs from the default's key in that field only; the default
    mode and the ordered path (``detorder``) have 0 (the kernel:
    :func:`test_bsa_bwd_ws_fixemu`)."""
    from jax_sparse_attn.config import Switches
    from jax_sparse_attn.ffi import bsa

    def key(ws, blk=128, deterministic=True):
        return bsa.bwd_config(jnp.bfloat16, 128, blk, False,
                              Switches(bsa_bwd_impl="sm90ws", bsa_bwd_ws=ws),
                              deterministic=deterministic)

    for blk in (64, 128):
        assert key(("fixemu=4",), blk).ws_fix_emu == 4 and key((), blk).ws_fix_emu == 0
        assert key(("fixemu=4",), blk) == bsa.dataclasses.replace(key((), blk), ws_fix_emu=4)
        assert key(("fixemu=4",), blk, False).ws_fix_emu == 0
        assert key(("fixemu=4", "detorder"), blk).ws_fix_emu == 0


@pytest.mark.ablation
def test_bsa_bwd_ws_fixemu(kept_ptx, kept_ptx_ablation):
    """``bsa_bwd_ws=fixemu=N`` (opt-in, the fixed-point deterministic dQ; the key:
    :func:`test_bsa_bwd_ws_fixemu_key`): with N = 4 half of the kernel's ``cvt.rni``
    conversions become the float-addition form (its magic addends in the PTX), with the same
    GEMMs, copies and reductions."""
    emu = _ws_ptx(kept_ptx_ablation, "fixemu4-blk128")
    base = _ws_ptx(kept_ptx, "detfixed-dqlag-blk128")
    cvt = re.compile(r"cvt\.rni\.sat\.s32\.f32")
    assert 2 * len(cvt.findall(emu)) == len(cvt.findall(base)) > 0
    assert "0f4F400000" in emu and "0f4F400000" not in base
    for op in ("wgmma.mma_async", "cp.async.bulk.tensor", "cp.reduce.async.bulk",
               "red.relaxed.gpu.global.or.b32"):
        assert emu.count(op) == base.count(op) > 0, op


def test_bsa_bwd_ws_entahead_key():
    """``bsa_bwd_ws=entahead`` (opt-in): the key has it with qprobe and the multiplier split
    (not with noqprobe, nofdiv or dklag), the default key not (the kernel:
    :func:`test_bsa_bwd_ws_entahead`)."""
    from jax_sparse_attn.config import Switches
    from jax_sparse_attn.ffi import bsa

    def key(ws):
        return bsa.bwd_config(jnp.bfloat16, 128, 128, False,
                              Switches(bsa_bwd_impl="sm90ws", bsa_bwd_ws=ws))

    assert key(("entahead",)).ws_ent_ahead and not key(()).ws_ent_ahead
    for ws in (("entahead", "noqprobe"), ("entahead", "nofdiv"), ("entahead", "dklag")):
        assert not key(ws).ws_ent_ahead, ws


@pytest.mark.ablation
def test_bsa_bwd_ws_entahead(kept_ptx, kept_ptx_ablation):
    """``bsa_bwd_ws=entahead`` (opt-in), with qprobe and the multiplier split (not nofdiv):
    the next list entry is split at the first step's stage test (once before the entry loop,
    and where the first step does not run) instead of at each entry's start: three
    ``mul.hi.u32`` in place of one, with the same GEMMs, stage tests, copies and
    reductions."""
    ahead = _ws_ptx(kept_ptx_ablation, "entahead-blk128")
    at_start = _ws_ptx(kept_ptx, _ids(CONFIGS[0]))
    assert ahead.count("mul.hi.u32") == at_start.count("mul.hi.u32") + 3
    for op in ("wgmma.mma_async", "wgmma.commit_group", "wgmma.wait_group", "mbarrier.test_wait",
               "cp.async.bulk.tensor", "cp.reduce.async.bulk", "stmatrix", "bar.sync"):
        assert ahead.count(op) == at_start.count(op) > 0, op


def test_bsa_bwd_ws_ex2emu_key():
    """``bsa_bwd_ws=ex2emu=N`` (opt-in): the key carries N, the default key 0 (the kernel:
    :func:`test_bsa_bwd_ws_ex2emu`)."""
    from jax_sparse_attn.config import Switches
    from jax_sparse_attn.ffi import bsa

    def key(ws):
        return bsa.bwd_config(jnp.bfloat16, 128, 128, False,
                              Switches(bsa_bwd_impl="sm90ws", bsa_bwd_ws=ws))

    assert key(("ex2emu=3",)).ws_ex2_emu == 3 and key(()).ws_ex2_emu == 0


@pytest.mark.ablation
def test_bsa_bwd_ws_ex2emu(kept_ptx, kept_ptx_ablation):
    """``bsa_bwd_ws=ex2emu=N`` (opt-in): with N = 3 the first 3 of every 8 score columns of a
    thread take exp2 as the polynomial (``max.NaN`` clamps, three ``fma`` of the fraction,
    the exponent added as ``(j << 23) + bits(1.0)``): 6 of each step's 16 columns x 2 rows,
    so 24 fewer ``ex2.approx`` over the two unrolled steps and the same GEMMs."""
    base = _ws_ptx(kept_ptx, _ids(CONFIGS[0]))
    emu = _ws_ptx(kept_ptx_ablation, "ex2emu3-blk128")
    ex2 = re.compile(r"ex2\.approx(\.ftz)?\.f32")
    assert len(ex2.findall(emu)) == len(ex2.findall(base)) - 24 > 0
    assert emu.count("max.NaN.f32") == emu.count("min.NaN.f32") == 24
    assert "mad.lo.s32 sb, tb, 8388608, 1065353216;" in emu
    for op in ("wgmma.mma_async", "wgmma.commit_group", "cp.async.bulk.tensor",
               "cp.reduce.async.bulk"):
        assert emu.count(op) == base.count(op) > 0, op


def test_exp2_poly3_constants():
    """The polynomial of ``kernels.common.exp2_poly3``, evaluated in float32 as the PTX does
    (numpy model of its steps): relative error at most 1.02e-4 on [-126.5, 127.5), 0 below,
    +inf from 127.5 and for +inf, 0 for -inf, NaN for NaN, exact at integers."""
    from jax_sparse_attn.kernels.common import _EXP2_C

    c1, c2, c3 = np.array(_EXP2_C, np.uint32).view(np.float32)

    def model(x):
        x = np.asarray(x, np.float32)
        xc = np.where(np.isnan(x), x, np.clip(x, np.float32(-127), np.float32(128)))
        t = (xc + np.float32(12582912)).astype(np.float32)
        j = (t - np.float32(12582912)).astype(np.float32)
        f = (xc - j).astype(np.float32)
        p = (f * c3 + c2).astype(np.float32)
        p = (p * f + c1).astype(np.float32)
        p = (p * f + np.float32(1)).astype(np.float32)
        sb = ((t.view(np.uint32).astype(np.uint64) * 8388608 + 1065353216)
              & 0xFFFFFFFF).astype(np.uint32)
        return (p * sb.view(np.float32)).astype(np.float32)

    x = np.linspace(-126.5, 127.49, 400_001, dtype=np.float32)
    rel = np.abs(model(x) / np.exp2(x.astype(np.float64)) - 1)
    assert rel.max() <= 1.02e-4, rel.max()
    with np.errstate(invalid="ignore", over="ignore"):
        edge = model([-np.inf, -1000.0, -126.6, 127.5, 1000.0, np.inf, np.nan])
    assert edge[:3].tolist() == [0.0, 0.0, 0.0] and np.isposinf(edge[3:6]).all()
    assert np.isnan(edge[6])
    ints = np.arange(-126, 128, dtype=np.float32)
    np.testing.assert_array_equal(model(ints), np.exp2(ints.astype(np.float64)).astype(np.float32))


def test_bsa_bwd_ws_redv4_key():
    """``bsa_bwd_ws=redv4``: the key has it with ``bsa_bwd_dq="rows"``; with the default
    query-tile workspace the flag does nothing (the default key with it is the default key;
    the kernel: :func:`test_bsa_bwd_ws_redv4`)."""
    from jax_sparse_attn.config import Switches
    from jax_sparse_attn.ffi import bsa

    def key(ws, dq="tile"):
        return bsa.bwd_config(jnp.bfloat16, 128, 128, False,
                              Switches(bsa_bwd_impl="sm90ws", bsa_bwd_ws=ws, bsa_bwd_dq=dq))

    assert key(("redv4",), "rows").ws_red_v4 and not key((), "rows").ws_red_v4
    assert not key(("redv4",)).ws_red_v4 and key(("redv4",)) == key(())


@pytest.mark.ablation
def test_bsa_bwd_ws_redv4(kept_ptx_ablation):
    """``bsa_bwd_ws=redv4`` with ``bsa_bwd_dq="rows"``: the dQ rows are added with half as
    many reductions, ``red...add.v4.f32`` instead of ``.v2`` (16 per thread and step at blk
    128 / D 128 become 8)."""
    v2 = re.compile(r"red\.[a-z.]*global\.add\.v2\.f32")
    v4 = re.compile(r"red\.[a-z.]*global\.add\.v4\.f32")
    rows = _ws_ptx(kept_ptx_ablation, "rows-blk128")
    red4 = _ws_ptx(kept_ptx_ablation, "redv4-rows-blk128")
    assert len(v2.findall(rows)) == 32 and not v4.findall(rows)
    assert len(v4.findall(red4)) == 16 and not v2.findall(red4)
    assert rows.count("wgmma.mma_async") == red4.count("wgmma.mma_async") > 0


def _pre_ptx(kept, name):
    """The PTX of the preprocessing kernel kept for the configuration ``name`` (``kept``:
    the directory of the fixture that kept it)."""
    import kept_ptx as kp  # noqa: PLC0415

    files = [t for t in kp.ptx_of(kept, name).values() if "BsaPreprocess" in t]
    assert len(files) == 1
    return files[0]


def test_bsa_pre_kernel_ptx(kept_ptx):
    """The default preprocessing kernel (``bsa_pre_impl="kernel"``): each thread loads one
    row of O and dO, two 16-byte loads (``kernel4``: :func:`test_bsa_pre_kernel4_ptx`)."""
    assert _pre_ptx(kept_ptx, _ids(CONFIGS[1])).count("ld.global.v4") == 2


@pytest.mark.ablation
def test_bsa_pre_kernel4_ptx(kept_ptx_ablation):
    """``bsa_pre_impl="kernel4"``: the preprocessing thread issues the 16-byte loads of O and
    dO of its four rows (8) before its first product (the default kernel has one row's two:
    :func:`test_bsa_pre_kernel_ptx`)."""
    four = _pre_ptx(kept_ptx_ablation, "pre4-blk64")
    assert four[:four.index("fma.rn.f32")].count("ld.global.v4") == 8


@pytest.mark.ablation
def test_bsa_bwd_ws_relaxpoll_ptx(kept_ptx_ablation):
    """``relaxpoll``: the semaphore is polled with relaxed GPU-scope loads and one
    ``fence.acq_rel.gpu`` follows the poll (no acquire loads); the publication keeps its
    fence."""
    t = _ws_ptx(kept_ptx_ablation, "det-relaxpoll-blk64")
    assert "ld.relaxed.gpu.global.b32" in t and "ld.acquire.gpu" not in t
    assert len(re.findall(r"fence\.acq_rel\.gpu;", t)) >= 2
    assert "ld.acquire.gpu.global.b32" in _ws_ptx(kept_ptx_ablation, "det-blk64")


@pytest.mark.ablation
def test_bsa_bwd_ws_deterministic_ptx(kept_ptx, kept_ptx_ablation):
    """The deterministic kernel without the dQ writer warp (``det_writer`` off; with it:
    ``tests/test_lowering_det_writer.py``) waits with acquire loads, publishes after a
    GPU-scope fence and hands each query tile between warp 1 and the consumers with
    named-barrier arrivals; its dQ bulk reduce-adds (query-tile workspace; at blk 64 / D 128
    staged in the consumed Q / dO tiles) are waited for before the hand-back, or, with the
    row-major workspace, vector reductions; the non-deterministic kernel (without tailconv's
    count) has none of the acquire / release operations."""
    sync = ("ld.acquire.gpu.global.b32", "fence.acq_rel.gpu", "st.relaxed.gpu.global.b32",
            "bar.arrive")
    tile = ("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32", "st.shared.v4.f32")
    red = "red.relaxed.gpu.global.add.v2.f32"
    for name in ("blk64", "blk128"):
        text = _ws_ptx(kept_ptx_ablation, f"det-{name}")
        for needle in sync + tile:
            assert needle in text, f"{needle} missing from the deterministic sm90ws PTX ({name})"
        assert red not in text
        # the completion wait (not only the read) before the hand-back
        assert re.search(r"cp\.async\.bulk\.wait_group\s+0;", text), name
    rows = _ws_ptx(kept_ptx_ablation, "det-rows")
    for needle in sync + (red,):
        assert needle in rows, f"{needle} missing from the deterministic sm90ws PTX (rows)"
    default = _ws_ptx(kept_ptx, "notailconv-blk64")
    for needle in ("ld.acquire.gpu", "fence.acq_rel.gpu"):
        assert needle not in default


def _kernel_text(ptx: str, marker: str) -> str:
    """The part of ``ptx`` from the ``.entry`` whose name contains ``marker`` to the next
    ``.entry`` (one kernel of a module that holds several)."""
    starts = [m.start() for m in re.finditer(r"\.entry ", ptx)] + [len(ptx)]
    parts = [ptx[a:b] for a, b in zip(starts, starts[1:])]
    found = [p for p in parts if marker in p.split("(", 1)[0]]
    assert len(found) == 1, (marker, [p.split("(", 1)[0][:120] for p in parts])
    return found[0]


@pytest.mark.ablation
def test_bsa_bwd_ws_detstream_ptx(kept_ptx_ablation):
    """``detstream``: one module holds the schedule-order kernel and the backward. The order
    kernel waits for the previous grid, then lets its dependent launch, and warp 0 publishes
    the prefixes of a round's rows after a GPU-scope fence of its own; the backward does not wait for the order kernel
    before it starts: its only grid-dependency wait comes after its acquire polls (at its
    end), and it reads the entries and ranks with L1-bypassing relaxed loads. Without
    ``detstream`` (the same call) the backward waits first, the order kernel is a module
    of its own and the backward reads the entries with plain loads."""
    t = _ws_ptx(kept_ptx_ablation, "det-stream-blk64")
    order = _kernel_text(t, "BsaDetScheduleOrder")
    ws = _kernel_text(t, "BsaBwdSm90Ws")
    assert order.index("griddepcontrol.wait") < order.index("griddepcontrol.launch_dependents")
    # per round, warp 0's lanes fence (after the round's barrier), then store the counters
    assert order.count("fence.acq_rel.gpu") == 1
    assert order.index("fence.acq_rel.gpu") < order.index("st.relaxed.gpu.global.b32")
    assert ws.count("griddepcontrol.wait") == 1
    assert ws.index("ld.acquire.gpu.global.b32") < ws.index("griddepcontrol.wait")
    # the producer's and the writer's entry, the writer's rank, the consumers' entry
    assert ws.count("ld.relaxed.gpu.global.b32") >= 4
    plain = _ws_ptx(kept_ptx_ablation, "det-sched-blk64")
    assert "BsaDetScheduleOrder" not in plain
    assert plain.index("griddepcontrol.wait") < plain.index("ld.acquire.gpu.global.b32")
    assert "ld.relaxed.gpu.global.b32" not in plain
    assert "griddepcontrol.launch_dependents" not in plain


@pytest.mark.ablation
def test_bsa_bwd_ws_detoverlap_ptx(kept_ptx_ablation):
    """``detoverlap``: the call's module holds the order kernel, the preprocessing and the
    backward. The preprocessing lets its dependent launch and does not wait (it runs
    alongside the order kernel); the backward waits for it at its start, before its first
    acquire poll of the order kernel's counters, and not again."""
    t = _ws_ptx(kept_ptx_ablation, "det-overlap-blk64")
    assert t.count(".entry ") == 3
    pre = _kernel_text(t, "BsaPreprocess")
    ws = _kernel_text(t, "BsaBwdSm90Ws")
    order = _kernel_text(t, "BsaDetScheduleOrder")
    assert "griddepcontrol.launch_dependents" in pre and "griddepcontrol.wait" not in pre
    assert ws.count("griddepcontrol.wait") == 1
    assert ws.index("griddepcontrol.wait") < ws.index("ld.acquire.gpu.global.b32")
    assert order.index("griddepcontrol.wait") < order.index("griddepcontrol.launch_dependents")
    txt = _bwd_text(CONFIGS[1], ws="detstream,detoverlap", sq=4096, skv=4096, kmax=40, impl="auto",
                    deterministic=True, det_writer=True)
    # the combined call (8 results: + delta) and the reordering, no preprocessing call
    calls = re.findall(r"%\w+(?::(\d+))? = stablehlo\.custom_call @" + CALL_TARGET, txt)
    assert sorted(calls) == ["", "8"], calls


def _result_counts(txt):
    """The result counts of the CuTe DSL calls of a lowered module ("" for one result)."""
    return sorted(re.findall(r"%\w+(?::(\d+))? = stablehlo\.custom_call @" + CALL_TARGET, txt))


@pytest.mark.ablation
def test_bsa_bwd_ws_detstream_fallbacks_lower():
    """Where ``detstream`` / ``detoverlap`` cannot apply the call lowers without them: with
    an lse cotangent (``dlse``) the preprocessing stays its own call (delta minus dlse is
    XLA's) before the streamed call; with GQA under the default order (launch groups, no
    order kernel) nothing is streamed; without ``block_sizes`` the streamed call takes one
    input less."""
    kw = dict(sq=4096, skv=4096, kmax=40, impl="auto", deterministic=True, det_writer=True)
    # preprocessing (2), streamed backward (7), reordering (1)
    assert _result_counts(_bwd_text(CONFIGS[1], ws="detstream,detoverlap", dlse=True,
                                    **kw)) == ["", "2", "7"]
    gqa = dict(CONFIGS[1], hq=4, hkv=2)
    # not streamed: the preprocessing computes delta only (the first contribution to each
    # dQ tile is stored, det_store), the backward (4), the reordering
    assert _result_counts(_bwd_text(gqa, ws="detstream,detoverlap", **kw)) == ["", "", "4"]
    assert _result_counts(_bwd_text(gqa, ws="detstream,detoverlap,detzero",
                                    **kw)) == ["", "2", "4"]
    nosizes = dict(CONFIGS[1], sizes=False)
    assert _result_counts(_bwd_text(nosizes, ws="detstream", **kw)) == ["", "2", "7"]
    assert _result_counts(_bwd_text(nosizes, ws="detstream,detoverlap", **kw)) == ["", "8"]


@pytest.mark.ablation
def test_bsa_bwd_ws_detstream_lowers():
    """``detstream`` lowers to one call with the
    backward's outputs, the semaphores, the per-row published prefixes and the ordered
    entries and ranks (7 results); with ``nodetstream`` the order kernel is its own call (2
    results) before the backward (4), as by default."""
    kw = dict(sq=4096, skv=4096, kmax=40, impl="auto", deterministic=True, det_writer=True)
    stream = _bwd_text(CONFIGS[1], ws="detstream", **kw)
    plain = _bwd_text(CONFIGS[1], ws="nodetstream", **kw)
    # not streamed by default
    assert _bwd_text(CONFIGS[1], **kw) == plain
    n = 2 * 4 * 64  # B * H_kv * N_kv CSR rows: one published prefix each

    def calls(txt, results):
        return len(re.findall(r"%\w+:" + str(results) + r" = stablehlo\.custom_call @"
                              + CALL_TARGET, txt))

    assert calls(stream, 7) == 1 and calls(plain, 7) == 0
    assert f"tensor<{n}xi32>" in stream
    # not streamed: the order kernel's own call (entries, ranks) and the preprocessing of
    # delta only (det_store); streamed: the preprocessing of delta and the zeroed workspace
    assert calls(plain, 2) == 1 and calls(stream, 2) == 1
    assert calls(plain, 4) == 1 and calls(stream, 4) == 0


@pytest.mark.ablation
@pytest.mark.parametrize("cfg", [CONFIGS[0], CONFIGS[1]], ids=_ids)
def test_bsa_bwd_ws_splitwait_ptx(kept_ptx, kept_ptx_ablation, cfg):
    """``bsa_bwd_ws=splitwait`` re-checks the step's Q / dO full barrier before the dP^T wait:
    one more mbarrier try-wait per unrolled step (blk 128: two) than the default kernel, the
    same warpgroup MMAs and waits;
    ``lselate`` (the lse read while the GEMMs are issued) is a different kernel too."""
    name = "blk128" if cfg["blk"] == 128 else "blk64"
    default, split = _ws_ptx(kept_ptx, _ids(cfg)), _ws_ptx(kept_ptx_ablation, f"split-{name}")
    steps = cfg["blk"] // 64
    assert split.count("mbarrier.try_wait") == default.count("mbarrier.try_wait") + steps
    for needle in ("wgmma.mma_async", "wgmma.wait_group.sync.aligned"):
        assert split.count(needle) == default.count(needle), needle
    if name == "blk128":
        late = _ws_ptx(kept_ptx_ablation, "lselate-blk128")
        assert late != default and late.count("wgmma.mma_async") == default.count(
            "wgmma.mma_async")


def test_bsa_bwd_ws_epi_ptx(kept_ptx):
    """By default dK / dV go through shared memory: packed pairs into it (32 + 32
    st.shared.b32 per thread at D = 128), then 16-byte global stores (8 + 8), no 2- or 4-byte
    global store (blk 128 and blk 64). ``bsa_bwd_ws=epiregs`` stores them from registers as
    packed pairs: 4-byte global stores after the bf16x2 conversion, half as many as the one
    2-byte store per value of ``epi16``."""
    default, regs = _ws_ptx(kept_ptx, _ids(CONFIGS[0])), _ws_ptx(kept_ptx, "epiregs-blk128")
    epi16 = _ws_ptx(kept_ptx, "epi16-blk128")
    n16 = len(re.findall(r"st\.global\.b16", epi16))
    assert n16 > 0 and not re.findall(r"st\.global\.b16", regs)
    assert len(re.findall(r"st\.global\.b32", regs)) == n16 // 2
    assert "cvt.rn.bf16x2.f32" in regs and "cvt.rn.bf16x2.f32" in default
    for text in (default, _ws_ptx(kept_ptx, _ids(CONFIGS[1]))):
        assert not re.findall(r"st\.global\.b(16|32)", text)
    assert default.count("st.shared.b32") == regs.count("st.shared.b32") + 64
    assert default.count("st.global.v4") == regs.count("st.global.v4") + 16


@pytest.mark.parametrize("cfg", [CONFIGS[0], CONFIGS[1]], ids=_ids)
def test_bsa_bwd_ws_ptx_is_warp_specialized(kept_ptx, cfg):
    """The kernel's PTX (kept with CUTE_DSL_KEEP=ptx in a fresh process) has TMA loads,
    warpgroup MMAs, register reallocation, mbarrier waits, the cp.async copies of lse /
    delta tracked by the stage's mbarrier and the dQ reductions: bulk reduce-adds of the
    warps' slices staged with 16-byte stores (query-tile workspace), no vector reductions."""
    text = _ws_ptx(kept_ptx, _ids(cfg))
    for needle in ("cp.async.bulk.tensor", "wgmma.mma_async", "setmaxnreg.dec",
                   "setmaxnreg.inc", "mbarrier.try_wait", "cp.async.mbarrier.arrive", "stmatrix"):
        assert needle in text, f"{needle} missing from the sm90ws BSA backward PTX"
    tile = ("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32", "st.shared.v4.f32")
    red = "red.relaxed.gpu.global.add.v2.f32"
    assert all(n in text for n in tile) and red not in text
    # programmatic dependent launch (the default Switches.pdl): the backward waits once for
    # the previous grid (its module also holds the dq reordering it launches: tailconv)
    assert _kernel_text(text, "BsaBwdSm90Ws").count("griddepcontrol.wait;") == 1


@pytest.mark.parametrize("cfg", CONFIGS, ids=_ids)
def test_bsa_bwd_ws_lowers(request, cfg):
    if _ids(cfg) in _DEFAULT_PTX:  # lowered (and its text kept) by the PTX tests' process
        import kept_ptx as kp  # noqa: PLC0415

        txt = kp.lowered_text_of(request.getfixturevalue("kept_ptx"), _DEFAULT_PTX[_ids(cfg)])
    else:
        txt = _bwd_text(cfg)
    # the lists, the preprocessing kernel, and the dK/dV/dQ kernel with the dq reordering
    assert txt.count(CALL_TARGET) == _calls(cfg) == 3
    assert "\\7FELF" in txt


def test_bsa_bwd_ws_smem_plan():
    """The most Q / dO stages that fit: blk 128 (one CTA per SM, 227 KiB), blk 64 (two CTAs
    per SM, 113 KiB each); a smaller cap is honoured."""
    from jax_sparse_attn.kernels.bsa_bwd_sm90_ws import (SMEM_LIMIT, bwd_ws_q_stages,
                                                         bwd_ws_smem_bytes)

    for d, blk, want in ((128, 128, 4), (128, 64, 2), (64, 128, 4), (64, 64, 4)):
        st = bwd_ws_q_stages(d, blk)
        assert st == want, (d, blk, st)
        limit = SMEM_LIMIT[1 if blk == 128 else 2]
        assert bwd_ws_smem_bytes(d, blk, st) <= limit
        if st < 4:
            assert bwd_ws_smem_bytes(d, blk, st + 1) > limit
    assert bwd_ws_q_stages(128, 128, max_stages=2) == 2
    # the fixed-point dQ keeps a third value per row (its multiplier) next to lse and delta:
    # blk 128 / D 128 with the dQ slices staged in the Q / dO tiles then fits three stages, not
    # four; with the staging tile it stays at three
    assert bwd_ws_smem_bytes(128, 128, 4, ld_kinds=3) > SMEM_LIMIT[1]
    assert bwd_ws_q_stages(128, 128, ld_kinds=3) == 3
    assert bwd_ws_q_stages(128, 128, dq_tile=True, ld_kinds=3) == 3
    assert bwd_ws_q_stages(128, 64, ld_kinds=3) == 2
    # the kernel object's plan (built on CPU, nothing compiled): the fixed point with dQ
    # staged in the Q / dO tiles takes three stages, without the fixed point four
    import cutlass  # noqa: PLC0415

    from jax_sparse_attn.kernels.bsa_bwd_sm90_ws import BsaBwdSm90Ws  # noqa: PLC0415

    for fixed, want in ((True, 3), (False, 4)):
        kern = BsaBwdSm90Ws(cutlass.BFloat16, 128, 128, False, dq_tile=True, dq_alias=True,
                            dq_writer=True, dq_fixed=fixed)
        assert kern.dq_fixed == fixed and kern.q_stages == want, (fixed, kern.q_stages)


@pytest.mark.ablation
def test_bsa_bwd_ws_detfixed_dqalias(kept_ptx_ablation):
    """The fixed-point deterministic dQ with ``dqalias`` at blk 128 / D 128 lowers (its
    shared-memory plan counts the per-row multipliers) and converts dQ to fixed point."""
    txt = _ws_ptx(kept_ptx_ablation, "detfixed-dqalias-blk128")
    assert "cvt.rni.sat.s32.f32" in txt and "wgmma.mma_async" in txt


def test_bsa_bwd_auto_choice():
    """``bsa_bwd_impl="auto"`` (the default): sm90ws for D in {64, 128} (with
    ``bsa_bwd_dq="rows"``: sm90 at blk 64 with D = 128); pack_gqa calls run sm90ws (sm90
    with ``nopackws``, the row-major dQ workspace or ``decouple``),
    causal ones too; D in {32, 256}: sm80."""
    from jax_sparse_attn.config import Switches
    from jax_sparse_attn.ffi import bsa

    sw = Switches()
    assert sw.bsa_bwd_impl == "auto"
    got = {(d, blk): bsa.bwd_config(jnp.bfloat16, d, blk, False, sw).impl
           for d in (32, 64, 128, 256) for blk in (64, 128)}
    assert got == {(32, 64): "sm80", (32, 128): "sm80", (64, 64): "sm90ws",
                   (64, 128): "sm90ws", (128, 64): "sm90ws", (128, 128): "sm90ws",
                   (256, 64): "sm80", (256, 128): "sm80"}
    # the row-major dQ workspace: sm90 at blk 64 / D 128
    rows = Switches(bsa_bwd_dq="rows")
    assert bsa.bwd_config(jnp.bfloat16, 128, 64, False, rows).impl == "sm90"
    assert bsa.bwd_config(jnp.bfloat16, 128, 128, False, rows).impl == "sm90ws"
    ws = Switches(bsa_bwd_impl="sm90ws")
    assert bsa.bwd_config(jnp.bfloat16, 128, 64, False, ws).impl == "sm90ws"
    assert bsa.bwd_config(jnp.bfloat16, 128, 128, False, ws, pack_gqa=2).impl == "sm90ws"
    assert bsa.bwd_config(jnp.bfloat16, 128, 64, False, sw, pack_gqa=4).impl == "sm90ws"
    for other in (Switches(bsa_bwd_ws="nopackws"), rows, Switches(bsa_bwd_ws="decouple")):
        assert bsa.bwd_config(jnp.bfloat16, 128, 128, False, other, pack_gqa=2).impl == "sm90"
    # decouple applies at blk 128 only: at blk 64 packed calls keep sm90ws, as unpacked ones
    dec64 = bsa.bwd_config(jnp.bfloat16, 128, 64, False, Switches(bsa_bwd_ws="decouple"),
                           pack_gqa=2)
    assert (dec64.impl, dec64.ws_decouple, dec64.pack_gqa) == ("sm90ws", False, 2)
    assert bsa.bwd_config(jnp.bfloat16, 128, 128, False, ws, causal=True).impl == "sm90ws"
    assert bsa.bwd_config(jnp.bfloat16, 128, 64, False, sw, causal=True).impl == "sm90ws"
    key = bsa.bwd_config(jnp.float16, 64, 128, True, Switches(bsa_bwd_impl="sm90ws",
                                                               bsa_bwd_ws="ldwait,stages=3"))
    # (the default bucket split: its work items carry their own order, no CTA order)
    assert (key.ws_ld_wait, key.ws_max_stages, key.ws_lpt, key.ws_buckets) == (True, 3, False,
                                                                                -1)
    key = bsa.bwd_config(jnp.float16, 64, 128, True, Switches(bsa_bwd_ws="nolpt"))
    assert not key.ws_lpt and not key.ws_lpt_chain
    assert bsa.bwd_config(jnp.float16, 64, 128, True, Switches(bsa_bwd_ws="lpt")).ws_lpt
    assert bsa.bwd_config(jnp.float16, 128, 128, False,
                          Switches(bsa_bwd_ws="decouple")).ws_decouple


def test_kq_lpt_order():
    """``metadata.kq_lpt_order``: a permutation of the K->Q rows, longest list first, ties
    in row order."""
    import numpy as np

    from jax_sparse_attn import metadata

    rng = np.random.default_rng(0)
    b, h_q, h_kv, n_q, n_kv, k_max = 2, 4, 2, 9, 11, 5
    idx = np.stack([np.stack([np.stack([rng.permutation(n_kv)[:k_max] for _ in range(n_q)])
                              for _ in range(h_q)]) for _ in range(b)]).astype(np.int32)
    nums = rng.integers(0, k_max + 1, (b, h_q, n_q)).astype(np.int32)
    offsets, _ = metadata.build_kq_csr(jnp.asarray(idx), jnp.asarray(nums), num_kv_heads=h_kv,
                                       num_kv_blocks=n_kv)
    order = np.asarray(metadata.kq_lpt_order(offsets))
    counts = np.diff(np.asarray(offsets))
    assert order.dtype == np.int32 and sorted(order.tolist()) == list(range(b * h_kv * n_kv))
    got = [(-counts[r], r) for r in order]
    assert got == sorted(got)
    assert counts.sum() == int(np.sum(nums))
    # per chain (one (batch, KV head): n_kv rows): the chains in order, longest first
    # within each, ties in row order
    chained = np.asarray(metadata.kq_lpt_order(offsets, chain=n_kv))
    assert chained.dtype == np.int32
    want = sorted(range(b * h_kv * n_kv), key=lambda r: (r // n_kv, -counts[r], r))
    assert chained.tolist() == want
    assert chained.tolist() != order.tolist()
    for bad in (n_kv + 1, 0, 2.0):
        with pytest.raises(ValueError, match="chain must be a positive int dividing"):
            metadata.kq_lpt_order(offsets, chain=bad)


def test_bsa_bwd_ws_hlpt_key():
    """``hlpt`` (the default): the lpt kernel (its CTAs read their row from the order after
    the offsets) with the per-chain order; it excludes lpt and nolpt, keeps tailconv and
    zerolag (each pair's CTAs stay together); the ordered deterministic backward ignores it,
    the fixed-point one (the default mode's kernels) keeps it."""
    from jax_sparse_attn import config
    from jax_sparse_attn.config import Switches
    from jax_sparse_attn.ffi import bsa

    def key(ws, **kw):
        return bsa.bwd_config(jnp.bfloat16, 128, 128, False,
                              Switches(bsa_bwd_impl="sm90ws", bsa_bwd_ws=ws), **kw)

    k = key("hlpt")
    assert k.ws_lpt and k.ws_lpt_chain and k.tail_conv and k == key("nobuckets")
    assert k.ws_buckets == 0 and key("").ws_buckets == -1
    assert key("lpt").ws_lpt and not key("lpt").ws_lpt_chain
    assert not key("nolpt").ws_lpt and not key("nolpt").ws_lpt_chain
    assert key("hlpt,zerolag").zero_lag == bsa.ZERO_LAG
    d = key("hlpt,detorder", deterministic=True)
    assert not d.ws_lpt and not d.ws_lpt_chain
    assert key("hlpt", deterministic=True) == key("nobuckets", deterministic=True)
    assert key("nobuckets", deterministic=True).ws_lpt_chain
    for a, b in (("lpt", "hlpt"), ("lpt", "nolpt"), ("hlpt", "nolpt")):
        with pytest.raises(ValueError, match=f"'{a}' and '{b}' contradict"):
            config.from_env({"JAX_SPARSE_ATTN_BSA_BWD_WS": f"{a},{b}"})


@pytest.mark.parametrize("cfg", [CONFIGS[0], CONFIGS[2]], ids=["d128", "d64"])
def test_bsa_bwd_ws_persist_key(cfg):
    """``persist`` (opt-in): the key has one CTA per SM (``metadata.num_sms``) at blk 128
    with tailconv, not at blk 64, with notailconv, zerolag, dqalt, dqalias, causal,
    deterministic, packed rows or pdl off; ``persistkv=N`` sets the stages issued before an
    item's K / V; the default key has it off (the lowering:
    :func:`test_bsa_bwd_ws_persist_lowers`)."""
    from jax_sparse_attn import metadata
    from jax_sparse_attn.config import Switches
    from jax_sparse_attn.ffi import bsa

    def key(ws="persist", blk=128, sw=None, **kw):
        return bsa.bwd_config(jnp.bfloat16, cfg["d"], blk, False,
                              Switches(bsa_bwd_impl="sm90ws", bsa_bwd_ws=ws, **(sw or {})),
                              **kw)

    on = key()
    assert on.ws_persist == metadata.num_sms() > 0 and on.ws_persist_kv_at == -1 and on.tail_conv
    assert key("persist,persistkv=0").ws_persist_kv_at == 0
    assert key("persist,nolpt").ws_persist and not key("persist,nolpt").ws_lpt
    assert key("").ws_persist == 0
    for off in (key(blk=64), key("persist,notailconv"), key("persist,zerolag"),
                key("persist,dqalt"), key("persist,dqalias"), key(causal=True),
                key(deterministic=True), key(pack_gqa=2), key(sw={"pdl": False})):
        assert off.ws_persist == 0, off


@pytest.mark.ablation
@pytest.mark.parametrize("cfg", [CONFIGS[0], CONFIGS[2]], ids=["d128", "d64"])
def test_bsa_bwd_ws_persist_lowers(cfg):
    """``persist`` (opt-in; the key: :func:`test_bsa_bwd_ws_persist_key`): the backward's
    grid is one CTA per SM and its counters gain the work-item counter (``2 B H_kv + 1``
    int32). The call is the default's three launches."""
    txt = _bwd_text(cfg, ws="persist")
    assert txt.count(CALL_TARGET) == 3 == _calls(cfg, ws="persist")
    pairs = 2 * cfg["hkv"]  # b = 2
    assert f"tensor<{2 * pairs + 1}xi32>" in txt and f"tensor<{2 * pairs}xi32>" not in txt


def test_bsa_bwd_persist_option_parses():
    """``persistkv=N`` takes 0..3; other values and unknown flags name what is allowed."""
    from jax_sparse_attn.config import Switches

    assert Switches(bsa_bwd_ws="persist,persistkv=3").bsa_bwd_ws == ("persist", "persistkv=3")
    for bad in ("persistkv=4", "persistkv=-1", "persistent"):
        with pytest.raises(ValueError, match="persistkv=N"):
            Switches(bsa_bwd_ws=bad)


def test_bsa_bwd_ws_default_not_persistent_ptx(kept_ptx):
    """Without ``persist`` the blk 128 kernel (one CTA per KV block) has one relaxed atomic
    add (tailconv's count) and no L2 prefetch of K / V (the persistent kernel:
    :func:`test_bsa_bwd_ws_persist_ptx`)."""
    default = _ws_ptx(kept_ptx, _ids(CONFIGS[0]))
    assert default.count("atom.relaxed.gpu.global.add.s32") == 1
    assert "cp.async.bulk.prefetch.tensor" not in default


@pytest.mark.ablation
def test_bsa_bwd_ws_persist_ptx(kept_ptx, kept_ptx_ablation):
    """``persist``: the producer deals the work items with one more relaxed atomic add (the
    item counter, next to tailconv's count, the default's one:
    :func:`test_bsa_bwd_ws_default_not_persistent_ptx`), the item ring adds four mbarriers,
    the next item's K / V are prefetched to L2, and the dK / dV epilogue stages in the K / V
    and dS tiles; the per-warpgroup dQ hand-back (``wghand``, barrier 11) stays. The
    register-store epilogue (``epiregs``) stores dK / dV from registers in both."""
    persist = _ws_ptx(kept_ptx_ablation, "persist-blk128")
    default = _ws_ptx(kept_ptx, _ids(CONFIGS[0]))
    atom = "atom.relaxed.gpu.global.add.s32"
    assert persist.count(atom) == 2
    assert persist.count("mbarrier.init") == default.count("mbarrier.init") + 4
    assert re.search(r"bar\.sync\s+11, 160;", persist)
    for s in ("cp.async.bulk.tensor", "wgmma.mma_async", "setmaxnreg", "griddepcontrol"):
        assert s in persist, s
    # the next item's K / V prefetched to L2 (two boxes each)
    assert persist.count("cp.async.bulk.prefetch.tensor") == 4
    # the shared-memory epilogue: 16-byte global row pieces; epiregs: 4-byte pair stores
    assert "st.global.v4" in persist
    regs = _ws_ptx(kept_ptx_ablation, "persist-epiregs-blk128")
    assert regs.count(atom) == 2 and "st.global.b32" in regs and "st.global.b32" not in persist


def test_bsa_bwd_ws_wgmma_groups_in_block(kept_ptx):
    """Every kept sm90ws backward kernel commits each wgmma group in the basic block of its
    last wgmma (``kept_ptx.assert_wgmma_groups_in_block``), so its waits count the groups it
    means."""
    import kept_ptx as kp  # noqa: PLC0415

    n = kp.configs_with_groups_in_block(kept_ptx, _PTX_CONFIGS, "BsaBwdSm90Ws")
    assert n >= len(_PTX_CONFIGS) // 2, n


@pytest.mark.ablation
def test_bsa_bwd_ws_ablation_wgmma_groups_in_block(kept_ptx_ablation):
    """The same for the kept kernels of the opt-in variants (:data:`_PTX_ABLATION`)."""
    import kept_ptx as kp  # noqa: PLC0415

    n = kp.configs_with_groups_in_block(kept_ptx_ablation, _PTX_ABLATION, "BsaBwdSm90Ws")
    assert n >= len(_PTX_ABLATION) // 2, n


def test_bsa_bwd_ws_buckets_key():
    """``bsa_bwd_ws=buckets=N``: the key at both block sizes and in both modes (the
    fixed-point dQ), without the CTA order of ``lpt`` (the items carry their own); not with
    ``persist``, ``zerolag``, ``pack_gqa``, ``notailconv``, ``dklag``, ``sahead`` or the
    ordered deterministic path; N in 1..65536."""
    from jax_sparse_attn.config import Switches, from_env
    from jax_sparse_attn.ffi import bsa as fb

    def key(ws, det=False, blk=128, **kw):
        return fb.bwd_config(jnp.bfloat16, 128, blk, False,
                             Switches(bsa_bwd_impl="sm90ws", bsa_bwd_ws=ws), deterministic=det,
                             **kw)

    for blk in (64, 128):
        for det in (False, True):
            base, got = key((), det, blk), key(("buckets=8",), det, blk)
            assert got == fb.dataclasses.replace(base, ws_buckets=8, ws_lpt=False,
                                                 ws_lpt_chain=False), (blk, det)
            assert got.tail_conv and got.dq_fixed == det
    for ws in (("buckets=8", "persist"), ("buckets=8", "zerolag"), ("buckets=8", "notailconv"),
               ("buckets=8", "detorder"), ("buckets=8", "dklag"), ("sahead",)):
        assert key(ws, det="detorder" in ws).ws_buckets == 0, ws
    assert key(("buckets=8",), pack_gqa=2).ws_buckets == 0
    for bad in ("buckets=0", "buckets=65537", "bucketx=0", "bucketx=65537"):
        with pytest.raises(ValueError, match="bucket"):
            from_env({"JAX_SPARSE_ATTN_BSA_BWD_WS": bad})
    # bucketx=M caps the extra items per (batch, KV head): 4 query heads per KV head x 256
    # query blocks x K_max 32 entries over buckets of 64 = 512, at most M with the cap
    capped = key(("buckets=64", "bucketx=16"))
    assert capped == fb.dataclasses.replace(key(("buckets=64",)), ws_bucket_extra=16)
    cfg = types.SimpleNamespace(num_heads_q=8, num_heads_kv=2, bwd=key(("buckets=64",)))
    idx = jax.ShapeDtypeStruct((1, 8, 256, 32), jnp.int32)
    assert fb._bucket_extra(cfg, idx) == 512
    cfg.bwd = capped
    assert fb._bucket_extra(cfg, idx) == 16
    cfg.bwd = key(("buckets=64", "bucketx=4096"))
    assert fb._bucket_extra(cfg, idx) == 512
    # autobuckets: N twice the mean list length bound (4 x 256 x 32 entries over 128 KV
    # blocks: 256, so N = 512), at most four full lists' extra items (4 x ceil(1024 / 512));
    # with 32 KV blocks of a 4096-token sequence, 64 at least (mean 2 x 8 = 16)
    auto = key(("autobuckets",))
    assert auto == fb.dataclasses.replace(key(("buckets=64",)), ws_buckets=-1)
    cfg = types.SimpleNamespace(num_heads_q=8, num_heads_kv=2, num_kv_blocks=128, bwd=auto)
    assert fb._bucket_entries(cfg, idx) == 512 and fb._bucket_extra(cfg, idx) == 8
    cfg.bwd = key(("autobuckets", "bucketx=3"))
    assert fb._bucket_extra(cfg, idx) == 3
    cfg.num_kv_blocks = 4096
    assert fb._bucket_entries(cfg, idx) == 64
    assert fb._bucket_entries(cfg, jax.ShapeDtypeStruct((1, 8, 64, 2), jnp.int32)) == 64
    assert key(("autobuckets", "persist")).ws_buckets == 0
    # autobuckets is the default; nobuckets and an explicit CTA order (lpt, hlpt, nolpt)
    # keep one CTA per KV block
    for det in (False, True):
        assert key((), det) == key(("autobuckets",), det)
        for ws in ("nobuckets", "lpt", "hlpt", "nolpt"):
            assert key((ws,), det).ws_buckets == 0, (ws, det)
    assert key(("nobuckets",)).ws_lpt_chain
    for bad in ("autobuckets,buckets=8", "nobuckets,buckets=8", "autobuckets,nobuckets"):
        with pytest.raises(ValueError, match="bucket split"):
            from_env({"JAX_SPARSE_ATTN_BSA_BWD_WS": bad})


@pytest.mark.parametrize("name", ["buckets-blk128", "buckets-blk64", "buckets-det-blk128"])
def test_bsa_bwd_ws_buckets(kept_ptx, tmp_path, name):
    """The bucket path (the default) lowers: the items read after the offsets, the partials stored, the
    row counter's fenced atomic add and the bucket-order sum read with relaxed GPU-scope
    loads (one per accumulator value and bucket); ptxas without spills or serialized
    wgmma."""
    import shutil
    import subprocess

    ptx = _ws_ptx(kept_ptx, name)
    assert "atom.relaxed.gpu.global.add.s32" in ptx
    # dK and dV: 64 values per thread at D 128 (blk 128: two consumer warpgroups of 64 keys)
    assert ptx.count("ld.relaxed.gpu.global.f32") == 128
    assert "wgmma.mma_async" in ptx and "cp.async.bulk.tensor" in ptx
    if "det" in name:
        assert "cvt.rni.sat.s32.f32" in ptx
    if shutil.which("ptxas") is None:
        pytest.skip("ptxas is not installed")
    src = tmp_path / "k.ptx"
    src.write_text(ptx)
    a = subprocess.run(["ptxas", "-arch=sm_90a", "-v", str(src), "-o", str(tmp_path / "k.o")],
                       capture_output=True, text=True, timeout=600)
    out = a.stdout + a.stderr
    assert a.returncode == 0, out[-2000:]
    spills = [int(x) for x in re.findall(r"(\d+) bytes spill stores", out)]
    assert "serialized" not in out and spills and max(spills) == 0, out[-2000:]
