"""CPU lowering of the block-sparse attention kernels for sm_90a (no GPU needed).

``jax.jit(f).trace(...).lower(lowering_platforms=("cuda",))`` runs the whole CuTe DSL
compile (MLIR -> PTX -> ptxas) and embeds the kernel object in the CuTe DSL custom call.
Every (head_dim, sparse_block_size) pair is compiled for the forward and the backward
(wgmma kernels for D in {64, 128}, mma.sync kernels for D in {32, 256}, plus two
mma.sync configurations at D in {64, 128} selected with the public ``switches`` argument, and
the XLA-fusion preprocessing alternative, between them covering
both D, blk, dtypes, layouts and ``block_sizes`` presence); dtype, layout and ``block_sizes`` presence alternate across them so that each value of
each static option is exercised. The tests of the opt-in ``bsa_fwd_ws`` variants (ablation and
tuning flags the defaults do not compile) and of the deterministic ``detoverlap`` option are
marked ``ablation`` (``pytest -m ablation``); their PTX is kept by a fixture of its own
(:func:`kept_ptx_ablation`). The checks of the defaults' own PTX that they compare with stay
in default-run tests.
"""

from __future__ import annotations

import dataclasses
import itertools
import os

import pytest

# CuTe DSL reads its target arch when cutlass is first imported: set it before that.
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

pytestmark = pytest.mark.lowering

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

cutlass_jax = pytest.importorskip("cutlass.jax")

CALL_TARGET = "CuteDSLRT_NvJaxCutlassCall"

_PAIRS = list(itertools.product((32, 64, 128, 256), (64, 128)))
CONFIGS = [
    dict(d=d, blk=blk, dtype=("bfloat16", "float16")[i % 2], layout=("bhsd", "bshd")[(i // 2) % 2],
         sizes=bool((i // 4 + i) % 2))
    for i, (d, blk) in enumerate(_PAIRS)
]
# D in {64, 128} use the wgmma kernels by default; also lower the mma.sync kernels there
CONFIGS += [
    dict(d=128, blk=64, dtype="bfloat16", layout="bshd", sizes=True, fwd_impl="sm80"),
    dict(d=64, blk=128, dtype="float16", layout="bhsd", sizes=False, fwd_impl="sm80"),
]
# the mma.sync backward at D in {64, 128} (bsa_bwd_impl="sm80") and the XLA preprocessing
# alternative (bsa_pre_impl="xla") to the kernel in kernels/bsa_pre.py
CONFIGS += [
    dict(d=128, blk=64, dtype="bfloat16", layout="bhsd", sizes=False, bwd_impl="sm80", pre_impl="xla"),
    dict(d=64, blk=128, dtype="float16", layout="bshd", sizes=True, bwd_impl="sm80", pre_impl="kernel"),
]


@pytest.fixture(autouse=True)
def _sm90_env(monkeypatch):
    monkeypatch.setenv("CUTE_DSL_ARCH", os.environ.get("CUTE_DSL_ARCH", "sm_90a"))
    monkeypatch.setenv("JAX_SPARSE_ATTN_FORCE_KERNEL", "1")


def _shapes(cfg, b=2, hq=4, hkv=2, sq=1000, skv=1025, kmax=5):
    d, blk = cfg["d"], cfg["blk"]
    dt = jnp.dtype(cfg["dtype"])
    nq, nkv = -(-sq // blk), -(-skv // blk)

    def t(s, h):
        shape = (b, h, s, d) if cfg["layout"] == "bhsd" else (b, s, h, d)
        return jax.ShapeDtypeStruct(shape, dt)

    q, k = t(sq, hq), t(skv, hkv)
    idx = jax.ShapeDtypeStruct((b, hq, nq, kmax), jnp.int32)
    nums = jax.ShapeDtypeStruct((b, hq, nq), jnp.int32)
    sizes = jax.ShapeDtypeStruct((b, hq, nkv), jnp.int32) if cfg["sizes"] else None
    lse = jax.ShapeDtypeStruct((b, hq, sq), jnp.float32)
    return q, k, idx, nums, sizes, lse


def _bwd_extra_calls(d, blk, switches=None, **kw):
    """The backward's CuTe DSL calls besides the preprocessing and the dK/dV/dQ kernel: the
    dq reordering where the backward adds dQ into the query-tile workspace (unless the
    backward's call launches it: ``tail_conv``), and the K->Q lists of the Hopper backwards
    in the default mode (``bsa_kq_impl`` ``"items"``, the default, or ``"kernel"``; these
    shapes fit it)."""
    from jax_sparse_attn.config import Switches
    from jax_sparse_attn.ffi import bsa

    sw = switches or Switches()
    key = bsa.bwd_config(jnp.bfloat16, d, blk, False, sw, **kw)
    lists = (sw.bsa_kq_impl in ("items", "kernel") and key.impl in ("sm90", "sm90ws")
             and not key.deterministic)
    return int(key.dq_tile and not key.tail_conv) + int(lists)


def _ids(cfg):
    impl = cfg.get("fwd_impl", "default")
    if "bwd_impl" in cfg:
        impl = f"bwd{cfg['bwd_impl']}-pre{cfg.get('pre_impl', 'xla')}"
    return f"{impl}-d{cfg['d']}-blk{cfg['blk']}-{cfg['dtype']}-{cfg['layout']}-{'sizes' if cfg['sizes'] else 'nosizes'}"


def _switches(cfg):
    from jax_sparse_attn.config import Switches

    fwd = cfg.get("fwd_impl", "auto")
    bwd = cfg.get("bwd_impl", "sm80" if fwd == "sm80" else "sm90")
    return Switches(bsa_fwd_impl=fwd, bsa_bwd_impl=bwd, bsa_pre_impl=cfg.get("pre_impl", "kernel"))


@pytest.mark.parametrize("cfg", CONFIGS, ids=_ids)
def test_bsa_fwd_bwd_lower_to_cutedsl_call(cfg):
    import jax_sparse_attn as jsa

    q, k, idx, nums, sizes, lse = _shapes(cfg)
    kw = dict(layout=cfg["layout"], sparse_block_size=cfg["blk"], softmax_scale=0.3,
              backend="kernel", switches=_switches(cfg))

    def fwd(q, k, v, i, n, s):
        return jsa.block_sparse_attention_forward(q, k, v, i, None, s, n, **kw)

    def bwd(do, q, k, v, o, lse, i, n, s):
        return jsa.block_sparse_attention_backward(do, q, k, v, o, lse, i, None, s, n, **kw)

    txt = jax.jit(fwd).trace(q, k, k, idx, nums, sizes).lower(lowering_platforms=("cuda",)).as_text()
    assert txt.count(CALL_TARGET) == 1
    assert "\\7FELF" in txt  # the compiled kernel object is embedded
    txt = jax.jit(bwd).trace(q, q, k, k, q, lse, idx, nums, sizes).lower(
        lowering_platforms=("cuda",)).as_text()
    # the preprocessing kernel is a second CuTe DSL call; the dq reordering and the lists
    assert txt.count(CALL_TARGET) == ((2 if cfg.get("pre_impl", "kernel") == "kernel" else 1)
                                      + _bwd_extra_calls(cfg["d"], cfg["blk"], _switches(cfg)))
    assert "\\7FELF" in txt


@pytest.mark.parametrize("d,layout,dtype", [(32, "bshd", "float16"), (256, "bhsd", "bfloat16")])
def test_bsa_preprocess_lowers_all_head_dims(d, layout, dtype):
    """kernels/bsa_pre.py for the head dims not covered by the grid above (lane groups 4, 32)."""
    import jax_sparse_attn as jsa

    shape = (2, 3, 1000, d) if layout == "bhsd" else (2, 1000, 3, d)
    o = jax.ShapeDtypeStruct(shape, jnp.dtype(dtype))
    lse = jax.ShapeDtypeStruct((2, 3, 1000), jnp.float32)
    idx = jax.ShapeDtypeStruct((2, 3, 8, 1), jnp.int32)

    def bwd(do, o, lse, i):
        return jsa.block_sparse_attention_backward(do, o, o, o, o, lse, i, 1, layout=layout,
                                                   backend="kernel")

    lowered = jax.jit(bwd).trace(o, o, lse, idx).lower(lowering_platforms=("cuda",))
    # the preprocessing kernel and the dK/dV/dQ kernel
    assert lowered.as_text().count(CALL_TARGET) == 2


def test_public_api_uses_kernel_path_when_forced():
    """block_sparse_attention(backend='auto') lowers to the CuTe DSL call (fwd and grad)."""
    import jax_sparse_attn as jsa

    cfg = dict(d=64, blk=64, dtype="bfloat16", layout="bhsd", sizes=True)
    q, k, idx, nums, sizes, _ = _shapes(cfg, sq=200, skv=300, kmax=3)

    def loss(q, k, v, i, n, s):
        o = jsa.block_sparse_attention(q, k, v, i, None, s, n, sparse_block_size=64)
        return jnp.sum(o.astype(jnp.float32))

    txt = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).trace(q, k, k, idx, nums, sizes).lower(
        lowering_platforms=("cuda",)).as_text()
    # forward + backward kernels (the backward launching the dq reordering of the
    # query-tile workspace) + the preprocessing kernel (the default) + the K->Q lists
    from jax_sparse_attn.config import Switches
    from jax_sparse_attn.ffi import bsa as ffi_bsa

    key = ffi_bsa.bwd_config(jnp.bfloat16, 64, 64, False, Switches())
    assert key.dq_tile and key.tail_conv
    assert _bwd_extra_calls(64, 64) == 1
    assert txt.count(CALL_TARGET) == 4


def test_unsupported_reason():
    from jax_sparse_attn.ffi import bsa

    ok = dict(dtype=jnp.bfloat16, head_dim=128, head_dim_v=128, sparse_block_size=128)
    assert bsa.bsa_kernel_unsupported_reason(**ok) is None
    assert "float16" in bsa.bsa_kernel_unsupported_reason(**{**ok, "dtype": jnp.float32})
    assert "D_v" in bsa.bsa_kernel_unsupported_reason(**{**ok, "head_dim_v": 64})
    assert "head dims" in bsa.bsa_kernel_unsupported_reason(**{**ok, "head_dim": 96, "head_dim_v": 96})
    assert "sparse_block_size" in bsa.bsa_kernel_unsupported_reason(**{**ok, "sparse_block_size": 32})


@pytest.mark.parametrize("construction", ["dense", "sort"])
@pytest.mark.parametrize("group", [1, 4])
def test_build_kq_csr_matches_loops(group, construction, monkeypatch):
    """The backward's K->Q lists (CSR, built with jnp on the device) against plain loops,
    for both constructions (dense bitmap for small block grids, stable sort above)."""
    import numpy as np

    from jax_sparse_attn import metadata

    monkeypatch.setattr(metadata, "_DENSE_CSR_MAX_ELEMS", 1 << 24 if construction == "dense" else 0)

    rng = np.random.default_rng(0)
    b, h_kv, n_q, n_kv, k_max = 2, 2, 7, 9, 4
    h_q = h_kv * group
    idx = np.argsort(rng.random((b, h_q, n_q, n_kv)), axis=-1)[..., :k_max].astype(np.int32)
    nums = rng.integers(0, k_max + 1, size=(b, h_q, n_q)).astype(np.int32)
    # garbage past the active prefix must be ignored
    j = np.arange(k_max)[None, None, None, :]
    idx = np.where(j < nums[..., None], idx, rng.choice([-3, 10**6, n_kv], size=idx.shape)).astype(np.int32)
    # a fresh function per test: jax.jit's trace cache would otherwise reuse the other
    # construction's trace (the threshold is read at trace time)
    fn = jax.jit(lambda i, n: metadata.build_kq_csr(i, n, num_kv_heads=h_kv, num_kv_blocks=n_kv))
    args = (jnp.asarray(idx), jnp.asarray(nums))
    assert ("stablehlo.sort" in fn.lower(*args).as_text()) == (construction == "sort")
    offsets, entries = fn(*args)
    offsets, entries = np.asarray(offsets), np.asarray(entries)
    assert offsets.shape == (b * h_kv * n_kv + 1,) and offsets[0] == 0
    for bi in range(b):
        for g in range(h_kv):
            for n in range(n_kv):
                want = [hg * n_q + m for hg in range(group) for m in range(n_q)
                        if n in idx[bi, g * group + hg, m, : nums[bi, g * group + hg, m]]]
                r = (bi * h_kv + g) * n_kv + n
                got = entries[offsets[r]:offsets[r + 1]].tolist()
                assert got == want, (bi, g, n, got, want)
    assert offsets[-1] == int(nums.sum())


# ----------------------------------------------------------------------------- sm90ws forward
# The warp-specialized forward (JAX_SPARSE_ATTN_BSA_FWD_IMPL=sm90ws, kernels/bsa_fwd_sm90_ws.py):
# every static configuration it implements (D in {64, 128} x blk in {64, 128}; dtype, layout
# and block_sizes presence alternate) plus its ablation knobs; D in {32, 256} fall back to the
# mma.sync forward (covered by the grid above).
WS_CONFIGS = [
    dict(d=128, blk=128, dtype="bfloat16", layout="bshd", sizes=False, ws=""),
    dict(d=128, blk=64, dtype="float16", layout="bhsd", sizes=True, ws=""),
    dict(d=64, blk=128, dtype="float16", layout="bhsd", sizes=True, ws=""),
    dict(d=64, blk=64, dtype="bfloat16", layout="bshd", sizes=False, ws=""),
    dict(d=128, blk=128, dtype="bfloat16", layout="bhsd", sizes=True, ws="nooverlap,nopingpong"),
    dict(d=128, blk=64, dtype="bfloat16", layout="bshd", sizes=False, ws="nooverlap"),
    dict(d=128, blk=64, dtype="float16", layout="bhsd", sizes=True, ws="oearly,sumtree"),
    dict(d=128, blk=128, dtype="bfloat16", layout="bshd", sizes=False, ws="oearly"),
    dict(d=64, blk=64, dtype="bfloat16", layout="bhsd", sizes=True, ws="sumtree,lazyrescale"),
    dict(d=128, blk=64, dtype="bfloat16", layout="bhsd", sizes=False, ws="skipload=8"),
    dict(d=128, blk=128, dtype="bfloat16", layout="bhsd", sizes=True, ws="skipload=4"),
    dict(d=128, blk=128, dtype="bfloat16", layout="bshd", sizes=False, ws="half"),
    dict(d=128, blk=128, dtype="bfloat16", layout="bhsd", sizes=True, ws="half2"),
    dict(d=128, blk=64, dtype="bfloat16", layout="bshd", sizes=True, ws="kdeep,vlag"),
    dict(d=128, blk=64, dtype="bfloat16", layout="bhsd", sizes=True, ws="pairstep"),
    dict(d=128, blk=64, dtype="float16", layout="bshd", sizes=False, ws="pairstep4"),
    dict(d=128, blk=64, dtype="bfloat16", layout="bhsd", sizes=True, ws="pairstepk3"),
    dict(d=128, blk=64, dtype="bfloat16", layout="bshd", sizes=True, ws="pairstepk4,kvwarps"),
    dict(d=64, blk=128, dtype="float16", layout="bhsd", sizes=False, ws="kvwarps"),
    dict(d=128, blk=64, dtype="bfloat16", layout="bshd", sizes=True, ws="pairbox"),
    dict(d=128, blk=64, dtype="float16", layout="bhsd", sizes=False, ws="pairbox"),
    dict(d=64, blk=128, dtype="float16", layout="bhsd", sizes=True, ws="sn64"),
    dict(d=128, blk=64, dtype="bfloat16", layout="bhsd", sizes=False, ws="nosm"),
    dict(d=128, blk=64, dtype="bfloat16", layout="bshd", sizes=True, ws="mix=2"),
    dict(d=64, blk=128, dtype="float16", layout="bhsd", sizes=False, ws="mix=8"),
    dict(d=128, blk=128, dtype="bfloat16", layout="bshd", sizes=True, ws="wgrelease"),
    dict(d=128, blk=64, dtype="bfloat16", layout="bshd", sizes=False, ws="wgrelease,pairwg"),
]


def _ws_fwd_text(cfg):
    import jax_sparse_attn as jsa
    from jax_sparse_attn.config import Switches

    q, k, idx, nums, sizes, _ = _shapes(cfg)
    kw = dict(layout=cfg["layout"], sparse_block_size=cfg["blk"], softmax_scale=0.3,
              backend="kernel", switches=Switches(bsa_fwd_impl="sm90ws", bsa_fwd_ws=cfg["ws"]),
              kv_splits=cfg.get("splits", 1))
    return jax.jit(lambda q, k, v, i, n, s: jsa.block_sparse_attention_forward(
        q, k, v, i, None, s, n, **kw)).trace(q, k, k, idx, nums, sizes).lower(
        lowering_platforms=("cuda",)).as_text()


@pytest.mark.parametrize("cfg", [pytest.param(c, marks=pytest.mark.ablation) if c["ws"] else c
                                 for c in WS_CONFIGS],
                         ids=lambda c: f"{_ids(c)}-ws{c['ws'].replace(',', '+')}")
def test_bsa_sm90ws_forward_lowers(cfg):
    txt = _ws_fwd_text(cfg)
    assert txt.count(CALL_TARGET) == 1
    assert "\\7FELF" in txt


def test_bsa_sm90ws_config_and_fallback():
    """sm90ws applies at D in {64, 128} (other head dims: the mma.sync forward); its
    variants reach the compile key; unknown names are rejected."""
    from jax_sparse_attn.config import Switches, from_env
    from jax_sparse_attn.ffi import bsa

    sw = Switches(bsa_fwd_impl="sm90ws", bsa_fwd_ws="nooverlap,q1,stages=3")
    impls = [bsa.fwd_config(jnp.bfloat16, d, 64, False, sw).impl for d in (32, 64, 128, 256)]
    assert impls == ["sm80", "sm90ws", "sm90ws", "sm80"]
    key = bsa.fwd_config(jnp.float16, 128, 128, True, sw)
    assert (key.ws_overlap, key.ws_pingpong, key.ws_q_stages, key.ws_max_stages) == (False, True, 1, 3)
    assert key.num_sms > 0
    with pytest.raises(ValueError, match="JAX_SPARSE_ATTN_BSA_FWD_IMPL"):
        from_env({"JAX_SPARSE_ATTN_BSA_FWD_IMPL": "sm91"})
    for bad in ("bn=64", "stages=1", "q1,q1", "tmao,notmao", "tmao,noepivec",
                "tmaopack,notmaopack", "tmaopack,notmao", "notmao,tmaopack",
                "tmaopack,noepivec"):
        with pytest.raises(ValueError, match="JAX_SPARSE_ATTN_BSA_WS"):
            from_env({"JAX_SPARSE_ATTN_BSA_WS": bad})
    # O by TMA stores: the default without split-KV; off with notmao, noepivec (its element
    # copies) or oalias (O staged in the Q buffer), and for packed rows with notmaopack
    for pack in (1, 2):
        tma = {ws: bsa.fwd_config(jnp.bfloat16, 128, 128, False,
                                  Switches(bsa_fwd_impl="sm90ws", bsa_fwd_ws=ws),
                                  pack_gqa=pack)
               for ws in ("", "tmao", "notmao", "noepivec", "oalias", "notmaopack")}
        got = {ws: (k.ws_tma_o, k.ws_tma_o_packed) for ws, k in tma.items()}
        on, off = (True, pack > 1), (False, False)
        assert got == {"": on, "tmao": on, "notmao": off, "noepivec": off, "oalias": off,
                       "notmaopack": on if pack == 1 else off}, (pack, got)


def test_bsa_l2hint_config():
    """``l2hint`` / ``l2normal`` reach the forward's and the backward's compile keys (1 / 2,
    0 without), at both block sizes; together they are rejected."""
    from jax_sparse_attn.config import Switches, from_env
    from jax_sparse_attn.ffi import bsa

    for blk in (64, 128):
        fwd = {ws: bsa.fwd_config(jnp.bfloat16, 128, blk, False,
                                  Switches(bsa_fwd_impl="sm90ws", bsa_fwd_ws=ws)).ws_l2_hint
               for ws in ("", "l2hint", "l2normal")}
        bwd = {ws: bsa.bwd_config(jnp.bfloat16, 128, blk, False,
                                  Switches(bsa_bwd_impl="sm90ws", bsa_bwd_ws=ws)).ws_l2_hint
               for ws in ("", "l2hint", "l2normal")}
        assert fwd == bwd == {"": 0, "l2hint": 1, "l2normal": 2}
    for var in ("JAX_SPARSE_ATTN_BSA_WS", "JAX_SPARSE_ATTN_BSA_BWD_WS"):
        with pytest.raises(ValueError, match="l2hint"):
            from_env({var: "l2hint,l2normal"})


def test_bsa_oinq_config_and_plan():
    """``oinq`` (O staged in the work item's own Q buffer, the O buffer's shared memory as a
    third V stage) is the forward's default at D 128 and off at D 64 unless asked for;
    ``nooinq`` turns it off; it is dropped where the kernel has no second Q buffer or no TMA
    O stores (q1, notmao, noepivec, oalias, ctas3k1, split-KV, pack_gqa) or another item
    walk (pairwg, streamk, cross); ``oinq`` with ``nooinq`` is rejected. The plan: two Q
    buffers, two K and three V stages at D 128 (blk 64: two CTAs of at most 113 KiB)."""
    import cutlass  # noqa: PLC0415

    from jax_sparse_attn.config import Switches, from_env
    from jax_sparse_attn.ffi import bsa
    from jax_sparse_attn.kernels.bsa_fwd_sm90_ws import (SMEM_LIMIT_2CTA, BsaFwdSm90Ws,
                                                         bsa_ws_oinq_plan)

    def on(d=128, blk=64, ws="", **kw):
        return bsa.fwd_config(jnp.bfloat16, d, blk, False,
                              Switches(bsa_fwd_impl="sm90ws", bsa_fwd_ws=ws), **kw).ws_o_in_q

    assert on() and on(blk=128) and on(ws="oinq")
    assert not on(d=64) and not on(d=64, blk=128) and on(d=64, ws="oinq")
    for ws in ("nooinq", "q1", "notmao", "noepivec", "oalias", "ctas3k1", "selfload", "pairwg",
               "streamk", "cross", "crossepi", "oinq,q1", "oinq,notmao"):
        assert not on(ws=ws), ws
    assert not on(kv_splits=2, num_rows=64, k_max=32)
    # cross needs the overlapped mainloop: with nooverlap it is off, and oinq stays on
    c = bsa.fwd_config(jnp.bfloat16, 128, 64, False,
                       Switches(bsa_fwd_impl="sm90ws", bsa_fwd_ws="nooverlap,cross"))
    assert (c.ws_cross, c.ws_o_in_q) == (0, True)
    assert not on(pack_gqa=4)
    with pytest.raises(ValueError, match="oinq"):
        from_env({"JAX_SPARSE_ATTN_BSA_WS": "oinq,nooinq"})
    plans = {}
    for blk in (64, 128):
        for o_in_q in (False, True):
            k = BsaFwdSm90Ws(cutlass.BFloat16, 128, blk, True, 132, tma_o=True, o_in_q=o_in_q)
            plans[blk, o_in_q] = (k.q_stages, k.k_stages, k.stages, k.o_alias_q, k.tma_o)
    assert plans == {(64, False): (2, 2, 2, False, True), (64, True): (2, 2, 3, True, True),
                     (128, False): (2, 2, 2, False, True), (128, True): (2, 2, 3, True, True)}
    # blk 64 / D 128: 2 Q + 2 K + 3 V tiles of 16 KiB and the mbarriers' KiB
    assert 7 * 16 * 1024 + 1024 <= SMEM_LIMIT_2CTA
    assert bsa_ws_oinq_plan(128, 64, 64, SMEM_LIMIT_2CTA) == (3, 2)
    with pytest.raises(NotImplementedError, match="O in the Q buffer"):
        bsa_ws_oinq_plan(128, 64, 64, 64 * 1024)
    with pytest.raises(NotImplementedError, match="o_in_q needs"):
        BsaFwdSm90Ws(cutlass.BFloat16, 128, 64, True, 132, tma_o=False, o_in_q=True)


def test_bsa_oearly_sumtree_keys():
    """``oearly`` (O rescaled under the next S GEMM) reaches the forward's key with the
    overlapped mainloop and is dropped with ``nooverlap`` and the chained items of ``cross``
    / ``crossepi``; ``sumtree`` (pairwise row sums) reaches it everywhere; both are off by
    default and reach the kernel object."""
    import cutlass  # noqa: PLC0415

    from jax_sparse_attn.config import Switches
    from jax_sparse_attn.ffi import bsa
    from jax_sparse_attn.kernels.bsa_fwd_sm90_ws import BsaFwdSm90Ws

    def key(ws, d=128, blk=64):
        c = bsa.fwd_config(jnp.bfloat16, d, blk, False,
                           Switches(bsa_fwd_impl="sm90ws", bsa_fwd_ws=ws))
        return c.ws_o_early, c.ws_tree_sum

    assert key("") == (False, False)
    assert key("oearly") == (True, False) and key("sumtree") == (False, True)
    assert key("oearly,sumtree", d=64, blk=128) == (True, True)
    for ws in ("oearly,nooverlap", "oearly,cross", "oearly,crossepi"):
        assert key(ws)[0] is False, ws
    k = BsaFwdSm90Ws(cutlass.BFloat16, 128, 64, True, 132, o_early=True, tree_sum=True)
    assert (k.o_early, k.tree_sum, k._o_early()) == (True, True, True)
    k = BsaFwdSm90Ws(cutlass.BFloat16, 128, 64, True, 132, overlap=False, o_early=True)
    assert not k._o_early()


def test_bsa_ablation_flag_keys():
    """The measurement flags of the sm90ws forward reach its key only where they apply:
    ``skipload=N`` (2..64, a timing ablation) and ``nosm`` everywhere, ``mix=N`` (1..8)
    with the overlapped mainloop and without ``oearly``, ``half`` / ``half2`` and ``sn64``
    at sparse_block_size 128 only (``half`` not with split-KV or ``pack_gqa``; ``half2``
    at D 128 only, without ``oinq``); out-of-range
    values are rejected with the switch's name; the kernel object takes ``half_items``
    at blk 128 only (one consumer warpgroup, one CTA per SM, two query tiles per list row;
    ``half_items=2``: two CTAs per SM with one Q, one K and two V buffers); ``wgrelease``
    reaches the key wherever a producer warp loads the stages (not with ``selfload``)."""
    import cutlass  # noqa: PLC0415

    from jax_sparse_attn.config import Switches, from_env
    from jax_sparse_attn.ffi import bsa
    from jax_sparse_attn.kernels.bsa_fwd_sm90_ws import BsaFwdSm90Ws

    def key(ws, d=128, blk=64, **kw):
        c = bsa.fwd_config(jnp.bfloat16, d, blk, False,
                           Switches(bsa_fwd_impl="sm90ws", bsa_fwd_ws=ws), **kw)
        return c.ws_skip_load, c.ws_no_softmax, c.ws_half_items, c.ws_s_n64

    def mix(ws):
        return bsa.fwd_config(jnp.bfloat16, 128, 64, False,
                              Switches(bsa_fwd_impl="sm90ws", bsa_fwd_ws=ws)).ws_mix_pv

    assert (mix(""), mix("mix=3"), mix("mix=3,oearly"), mix("mix=3,nooverlap")) == (0, 3, 0, 0)
    assert key("") == (0, False, False, False)
    assert key("skipload=8,nosm") == (8, True, False, False)
    assert key("skipload=8,vlag")[0] == 0  # the vlag producer loop does not skip
    assert key("half,sn64") == (0, False, False, False)  # blk 64: no effect
    assert key("half,sn64", blk=128) == (0, False, True, True)
    assert key("half", blk=128, pack_gqa=2) == (0, False, False, False)
    assert key("half2", blk=128) == (0, False, 2, False)
    assert key("half2", d=64, blk=128) == (0, False, 0, False)  # D 128 only
    c = bsa.fwd_config(jnp.bfloat16, 128, 128, False,
                       Switches(bsa_fwd_impl="sm90ws", bsa_fwd_ws="half2"))
    assert not c.ws_o_in_q  # half2 stages O in its one Q buffer

    def kdeep(ws, **kw):
        return bsa.fwd_config(jnp.bfloat16, 128, 64, False,
                              Switches(bsa_fwd_impl="sm90ws", bsa_fwd_ws=ws), **kw).ws_k_deep

    # kdeep re-plans the oinq rings only
    assert (kdeep(""), kdeep("kdeep,vlag"), kdeep("kdeep,nooinq"), kdeep("kdeep,q1")) == (
        False, True, False, False)
    for bad in ("skipload=1", "skipload=65", "skipload=x", "mix=0", "mix=9"):
        with pytest.raises(ValueError, match="JAX_SPARSE_ATTN_BSA_WS"):
            from_env({"JAX_SPARSE_ATTN_BSA_WS": bad})
    k = BsaFwdSm90Ws(cutlass.BFloat16, 128, 128, False, 132, o_in_q=True, tma_o=True,
                     half_items=True)
    assert (k.num_wg, k.bm, k.ctas_per_sm, k.rows_per_list) == (1, 64, 1, 2)
    assert (k.stages, k.k_stages) == (3, 3)
    with pytest.raises(NotImplementedError, match="half_items"):
        BsaFwdSm90Ws(cutlass.BFloat16, 128, 64, False, 132, half_items=True)
    k = BsaFwdSm90Ws(cutlass.BFloat16, 128, 128, False, 132, tma_o=True, half_items=2)
    assert (k.num_wg, k.bm, k.ctas_per_sm, k.rows_per_list) == (1, 64, 2, 2)
    assert (k.stages, k.k_stages, k.q_stages, k.o_alias_q) == (2, 1, 1, True)
    for blk in (64, 128):
        k0 = BsaFwdSm90Ws(cutlass.BFloat16, 128, blk, False, 132, o_in_q=True, tma_o=True)
        k1 = BsaFwdSm90Ws(cutlass.BFloat16, 128, blk, False, 132, o_in_q=True, tma_o=True,
                          k_deep=True)
        assert (k0.k_stages, k0.stages) == (2, 3) and (k1.k_stages, k1.stages) == (3, 2)
    with pytest.raises(NotImplementedError, match="half_items=2"):
        BsaFwdSm90Ws(cutlass.BFloat16, 128, 128, False, 132, o_in_q=True, tma_o=True,
                     half_items=2)

    def step(ws, d=128, blk=64, **kw):
        c = bsa.fwd_config(jnp.bfloat16, d, blk, False,
                           Switches(bsa_fwd_impl="sm90ws", bsa_fwd_ws=ws), **kw)
        return c.ws_pair_step, c.ws_o_in_q

    # pairstep: blk 64 at D 128 with the oinq plan; pairstep4: its own plan (no oinq)
    assert step("pairstep") == (1, True) and step("pairstep4") == (2, False)
    assert step("pairstep", d=64)[0] == step("pairstep", blk=128)[0] == 0
    assert step("pairstep", kv_splits=2, k_max=8)[0] == step("pairstep4", pack_gqa=2)[0] == 0
    for other in ("nooinq", "q1", "nooverlap", "qregs", "mix=2", "oearly", "pairwg",
                  "streamk", "cross", "ctas3k1"):
        assert step("pairstep," + other)[0] == 0, other
    assert step("pairstep,kdeep") == (1, True)  # kdeep's plan has two V stages: not taken
    k = BsaFwdSm90Ws(cutlass.BFloat16, 128, 64, False, 132, tma_o=True, pair_step=2)
    assert (k.stages, k.k_stages, k.q_stages, k.o_alias_q, k.ctas_per_sm) == (4, 2, 1, True, 2)
    k = BsaFwdSm90Ws(cutlass.BFloat16, 128, 64, False, 132, o_in_q=True, tma_o=True,
                     pair_step=1)
    assert (k.stages, k.k_stages, k.q_stages, k.o_alias_q) == (3, 2, 2, True)
    k = BsaFwdSm90Ws(cutlass.BFloat16, 128, 64, False, 132, pair_step=1)
    assert (k.stages, k.k_stages, k.q_stages, k.o_alias_q) == (2, 2, 2, False)
    for ws, ps, kst in (("pairstepk3", 3, 3), ("pairstepk4", 4, 4)):
        assert step(ws) == (ps, False)
        k = BsaFwdSm90Ws(cutlass.BFloat16, 128, 64, False, 132, tma_o=True, pair_step=ps)
        assert (k.k_stages, k.stages, k.q_stages) == (kst, 6 - kst, 1)
    def kvw(ws):
        return bsa.fwd_config(jnp.bfloat16, 128, 64, False,
                              Switches(bsa_fwd_impl="sm90ws", bsa_fwd_ws=ws)).ws_kv_warps

    assert (kvw(""), kvw("kvwarps"), kvw("kvwarps,pairstep4"), kvw("kvwarps,vlag"),
            kvw("kvwarps,mpre"), kvw("kvwarps,pairwg"), kvw("kvwarps,skipload=4")) == (
        False, True, True, False, False, False, False)
    def box(ws, **kw):
        c = bsa.fwd_config(jnp.bfloat16, 128, 64, False,
                           Switches(bsa_fwd_impl="sm90ws", bsa_fwd_ws=ws), **kw)
        return c.ws_pair_box, c.ws_o_in_q

    assert box("pairbox") == (True, False) and box("") == (False, True)
    for other in ("pairstep", "kvwarps", "vlag", "mpre", "nooverlap", "qregs"):
        assert box("pairbox," + other)[0] is False, other
    assert box("pairbox", kv_splits=2, k_max=8)[0] is False
    k = BsaFwdSm90Ws(cutlass.BFloat16, 128, 64, False, 132, pair_box=True)
    assert (k.bn, k.list_bn, k.stages, k.k_stages, k.q_stages, k.o_alias_q,
            k.ctas_per_sm) == (128, 64, 2, 1, 1, True, 2)
    with pytest.raises(NotImplementedError, match="pair_box"):
        BsaFwdSm90Ws(cutlass.BFloat16, 128, 64, False, 132, pair_box=True, kv_warps=True)
    with pytest.raises(NotImplementedError, match="kv_warps"):
        BsaFwdSm90Ws(cutlass.BFloat16, 128, 64, False, 132, kv_warps=True, v_lag=True)
    with pytest.raises(NotImplementedError, match="pair_step needs"):
        BsaFwdSm90Ws(cutlass.BFloat16, 128, 128, False, 132, pair_step=1)

    def wgr(ws, d=128, blk=64):
        return bsa.fwd_config(jnp.bfloat16, d, blk, False,
                              Switches(bsa_fwd_impl="sm90ws", bsa_fwd_ws=ws)).ws_wg_release

    assert (wgr(""), wgr("wgrelease"), wgr("wgrelease", 64, 128), wgr("wgrelease,pairwg"),
            wgr("wgrelease,ctas3k1"), wgr("wgrelease,selfload")) == (
        False, True, True, True, True, False)
    with pytest.raises(NotImplementedError, match="wg_release needs a producer warp"):
        BsaFwdSm90Ws(cutlass.BFloat16, 128, 64, False, 132, three_ctas=True, k_single=True,
                     self_load=True, wg_release=True)


def test_bsa_sm90ws_forward_metadata_clamped_in_kernel():
    """The sm90ws forward reads the block lists, counts and block sizes as given and
    clamps every value in the kernel (``block_info.BlockList``): its call has no XLA clamp
    before the kernel; ``xlaclamp`` and the mma.sync forward keep the XLA clamps of ids,
    counts and sizes (one max and one min each). ``tests/test_gpu_bsa.py::
    test_bsa_forward_garbage_metadata_is_clamped`` checks the results on the GPU."""
    from jax_sparse_attn.config import Switches

    def ops(impl, ws):
        import jax_sparse_attn as jsa  # noqa: PLC0415

        cfg = dict(d=128, blk=64, dtype="bfloat16", layout="bhsd", sizes=True, ws=ws)
        q, k, idx, nums, sizes, _ = _shapes(cfg)
        kw = dict(layout="bhsd", sparse_block_size=64, softmax_scale=0.3, backend="kernel",
                  switches=Switches(bsa_fwd_impl=impl, bsa_fwd_ws=ws))
        txt = jax.jit(lambda q, k, v, i, n, s: jsa.block_sparse_attention_forward(
            q, k, v, i, None, s, n, **kw)).trace(q, k, k, idx, nums, sizes).lower(
            lowering_platforms=("cuda",)).as_text()
        return txt.count("stablehlo.maximum"), txt.count("stablehlo.minimum")

    assert ops("sm90ws", "") == (0, 0)
    assert ops("sm90ws", "xlaclamp") == (3, 3)
    assert ops("sm80", "") == (3, 3)


def test_bsa_sortlists_sorts_each_active_prefix():
    """``bsa_fwd_ws=sortlists``: XLA sorts each query block's active list (its first
    ``q2k_block_nums`` entries, the count clamped to 0..K_max) into ascending order before
    the sm90ws kernel and leaves the same blocks in it, whatever the inactive entries hold;
    the traced call then has one sort, the default none; split-KV does not take it."""
    from jax_sparse_attn.config import Switches
    from jax_sparse_attn.ffi import bsa

    rng = np.random.default_rng(7)
    idx = rng.integers(-5, 40, size=(2, 3, 5, 6)).astype(np.int32)
    nums = rng.integers(-2, 9, size=(2, 3, 5)).astype(np.int32)
    got = np.asarray(bsa._sort_lists(jnp.asarray(idx), jnp.asarray(nums)))
    for pos in np.ndindex(nums.shape):
        c = int(np.clip(nums[pos], 0, 6))
        assert got[pos][:c].tolist() == sorted(idx[pos][:c].tolist()), pos
    assert (got[nums <= 0] == np.iinfo(np.int32).max).all()

    def cfg(ws, **kw):
        return bsa.fwd_config(jnp.bfloat16, 128, 64, False,
                              Switches(bsa_fwd_impl="sm90ws", bsa_fwd_ws=ws), **kw)

    assert (cfg("sortlists").ws_sort_lists, cfg("").ws_sort_lists,
            cfg("sortlists", kv_splits=2, k_max=8).ws_sort_lists) == (True, False, False)

    def sorts(ws):
        import jax_sparse_attn as jsa  # noqa: PLC0415

        c = dict(d=128, blk=64, dtype="bfloat16", layout="bhsd", sizes=False, ws=ws)
        q, k, idx, nums, _, _ = _shapes(c)
        kw = dict(layout="bhsd", sparse_block_size=64, softmax_scale=0.3, backend="kernel",
                  switches=Switches(bsa_fwd_impl="sm90ws", bsa_fwd_ws=ws))
        # the traced program (lowering would compile the kernel, which does not change)
        txt = str(jax.make_jaxpr(lambda q, k, v, i, n: jsa.block_sparse_attention_forward(
            q, k, v, i, None, None, n, **kw))(q, k, k, idx, nums))
        return txt.count(" sort[")

    assert (sorts("sortlists"), sorts("")) == (1, 0)


def test_bsa_sortlists_kernel_receives_the_sorted_lists(monkeypatch):
    """``sortlists``: the forward kernel's call is handed the sorted lists (a stand-in for the
    call builder records its block-list operand), with the same blocks in each active
    prefix, ids outside 0..N_kv-1 included; without the flag it is handed the lists as
    given."""
    from jax_sparse_attn import _cute_call
    from jax_sparse_attn.config import Switches

    import jax_sparse_attn as jsa  # noqa: PLC0415

    seen = []

    def builder(mode):
        def build(fn, *, output_shape_dtype, compile_key, **kw):
            def call(q, k, v, idx, *rest):
                jax.debug.callback(lambda x: seen.append(np.asarray(x)), idx)
                return tuple(jnp.zeros(s.shape, s.dtype) for s in output_shape_dtype)
            return call
        return build

    monkeypatch.setattr(_cute_call, "call_builder", builder)
    rng = np.random.default_rng(5)
    b, h, s, d, blk, kmax = 2, 2, 300, 128, 64, 6
    q = jnp.asarray(rng.standard_normal((b, h, s, d)), jnp.bfloat16)
    big = np.iinfo(np.int32).max
    idx = rng.choice(np.r_[np.arange(-3, 8), [big, 300]], size=(b, h, 5, kmax)).astype(np.int32)
    nums = rng.integers(-2, kmax + 3, size=(b, h, 5)).astype(np.int32)

    def run(ws):
        seen.clear()
        # traced metadata: no eager checks, so out-of-range ids and counts reach the call
        jax.jit(lambda i, n: jsa.block_sparse_attention_forward(
            q, q, q, i, None, None, n, layout="bhsd", sparse_block_size=blk,
            softmax_scale=0.3, backend="kernel",
            switches=Switches(bsa_fwd_impl="sm90ws", bsa_fwd_ws=ws)))(
                jnp.asarray(idx), jnp.asarray(nums))
        jax.effects_barrier()
        assert len(seen) == 1
        return seen[0]

    got = run("sortlists")
    assert got.shape == idx.shape
    for pos in np.ndindex(nums.shape):
        c = int(np.clip(nums[pos], 0, kmax))
        assert got[pos][:c].tolist() == sorted(idx[pos][:c].tolist()), pos
    assert not np.array_equal(got, idx)
    np.testing.assert_array_equal(run(""), idx)


def test_bsa_qahead_with_vlag_runs_as_mpre():
    """``qahead`` with ``vlag``: the vlag producer loop has no point at which it issues the
    next item's Q, so the pair compiles as ``vlag`` with ``mpre`` (the next item's Q loaded at
    its start, as without qahead); with ``qahead`` alone the key keeps it. (With both in the
    key the consumers would wait forever for a Q load that the producer never issued.)"""
    import cutlass  # noqa: PLC0415

    from jax_sparse_attn.config import Switches
    from jax_sparse_attn.ffi import bsa
    from jax_sparse_attn.kernels.bsa_fwd_sm90_ws import BsaFwdSm90Ws

    def key(ws):
        c = bsa.fwd_config(jnp.bfloat16, 128, 64, False,
                           Switches(bsa_fwd_impl="sm90ws", bsa_fwd_ws=ws))
        return c.ws_v_lag, c.ws_q_ahead, c.ws_meta_prefetch

    assert key("qahead") == (False, True, False)
    assert key("vlag,qahead") == (True, False, True)
    assert key("vlag,qahead,oinq") == (True, False, True)
    # q1 and split-KV: the kernel runs qahead as mpre there too, and the key says so
    assert key("qahead,q1") == (False, False, True)
    c = bsa.fwd_config(jnp.bfloat16, 128, 128, False,
                       Switches(bsa_fwd_impl="sm90ws", bsa_fwd_ws="qahead"), kv_splits=2,
                       num_rows=4, k_max=8)
    assert (c.kv_splits, c.ws_q_ahead, c.ws_meta_prefetch) == (2, False, True)
    k = BsaFwdSm90Ws(cutlass.BFloat16, 128, 64, True, 132, tma_o=True, v_lag=True, q_ahead=True)
    assert not k.q_ahead and k.meta_prefetch


# the PTX tests' configurations, lowered in one fresh process (tests/kept_ptx.py)
_PTX_CONFIGS = {_ids(c): ("_ws_fwd_text", (c,), None, {}) for c in WS_CONFIGS[:2]}
#: the default's O written by TMA tensor stores (bsa_fwd_ws=notmao: copied out by the
#: consumer warpgroup)
_TMAO = {"tmao-blk128": WS_CONFIGS[0], "tmao-blk64-d64": WS_CONFIGS[3]}
_PTX_CONFIGS.update({k: ("_ws_fwd_text", (c,), None, {}) for k, c in _TMAO.items()})
# the ablation tests' configurations (opt-in bsa_fwd_ws variants), kept by kept_ptx_ablation;
# the defaults they compare with are read from kept_ptx
_PTX_ABLATION = {}
#: bsa_fwd_ws=qregs: Q as the register operand of the S GEMMs
_QREGS = dict(WS_CONFIGS[1], dtype="bfloat16", ws="qregs")
_PTX_ABLATION["qregs-blk64"] = ("_ws_fwd_text", (_QREGS,), None, {})
#: bsa_fwd_ws=noepivec: the epilogue's element copies through the swizzled O layout
_NOEPIVEC = dict(WS_CONFIGS[1], ws="noepivec")
_PTX_ABLATION["noepivec-blk64"] = ("_ws_fwd_text", (_NOEPIVEC,), None, {})
_NOTMAO = {_ids(c): dict(c, ws="notmao") for c in WS_CONFIGS[:2]}
_PTX_ABLATION.update({"notmao-" + k: ("_ws_fwd_text", (c,), None, {})
                      for k, c in _NOTMAO.items()})
#: bsa_fwd_ws=pairwg: blk 64, one CTA per SM of two consumer warpgroups with items of their own
_PAIRWG = dict(d=128, blk=64, dtype="bfloat16", layout="bshd", sizes=True, ws="pairwg")
_PTX_ABLATION["pairwg-blk64"] = ("_ws_fwd_text", (_PAIRWG,), None, {})
#: bsa_fwd_ws=l2hint / l2normal: L2 policies on the TMA copies
_L2HINT = {f"{m}-{_ids(c)}": dict(c, ws=m) for c in WS_CONFIGS[:2] for m in ("l2hint", "l2normal")}
_L2HINT["l2hint-split2"] = dict(WS_CONFIGS[1], ws="l2hint", splits=2)
_PTX_ABLATION.update({k: ("_ws_fwd_text", (c,), None, {}) for k, c in _L2HINT.items()})
#: bsa_fwd_ws=wgrelease: one empty-barrier arrival per consumer warpgroup on the K / V stages
_WGREL = dict(WS_CONFIGS[1], ws="wgrelease")
_PTX_ABLATION["wgrelease-blk64"] = ("_ws_fwd_text", (_WGREL,), None, {})
_PTX_ENV = dict(JAX_SPARSE_ATTN_BSA_FWD_IMPL="sm90ws", JAX_SPARSE_ATTN_BSA_WS="")


@pytest.fixture(scope="module")
def kept_ptx(tmp_path_factory):
    import kept_ptx as kp  # noqa: PLC0415

    return kp.keep_ptx_shared(tmp_path_factory, "test_lowering_bsa", "test_lowering_bsa",
                              _PTX_CONFIGS, env=_PTX_ENV)


@pytest.fixture(scope="module")
def kept_ptx_ablation(tmp_path_factory):
    """The PTX kept while lowering :data:`_PTX_ABLATION` (the ablation tier's variants)."""
    import kept_ptx as kp  # noqa: PLC0415

    return kp.keep_ptx_shared(tmp_path_factory, "test_lowering_bsa_ablation",
                              "test_lowering_bsa", _PTX_ABLATION, env=_PTX_ENV)


@pytest.mark.parametrize("cfg", [WS_CONFIGS[0], WS_CONFIGS[1]], ids=lambda c: _ids(c))
def test_bsa_sm90ws_ptx_is_warp_specialized(kept_ptx, cfg):
    """The sm90ws forward's PTX (kept with CUTE_DSL_KEEP=ptx by a fresh process, which reads
    the variables when it imports the CuTe DSL) has TMA loads, warpgroup MMAs, mbarrier waits
    and register reallocation between the producer and the consumer warpgroups; with
    block_sizes it also has the producer's cp.async copy of partial V blocks."""
    import kept_ptx as kp  # noqa: PLC0415

    files = kp.ptx_of(kept_ptx, _ids(cfg))
    assert len(files) == 1, list(files)
    text = next(iter(files.values()))
    assert "bsa_fwd_sm90_ws" in text
    needles = ["cp.async.bulk.tensor", "wgmma.mma_async", "setmaxnreg.dec", "setmaxnreg.inc",
               "mbarrier.try_wait"]
    if cfg["sizes"]:
        needles.append("cp.async.cg.shared.global")
    for needle in needles:
        assert needle in text, f"{needle} missing from the sm90ws BSA forward PTX"
    # programmatic dependent launch (the default Switches.pdl): one wait for the previous grid
    assert text.count("griddepcontrol.wait;") == 1


# ----------------------------------------------------------------------------- causal
# causal=True (a static flag of the sm90ws forward / sm90ws and sm90 backward keys): every
# (D, blk) pair on the default kernels (sm90ws forward and backward), two more forwards with
# block_sizes at (128, 128) and (64, 64), the sm90 backward at two pairs; dtype, layout and
# block_sizes presence alternate.
CAUSAL_CONFIGS = [
    dict(d=128, blk=128, dtype="bfloat16", layout="bhsd", sizes=False),
    dict(d=64, blk=128, dtype="float16", layout="bshd", sizes=True),
    dict(d=128, blk=64, dtype="float16", layout="bhsd", sizes=True),
    dict(d=64, blk=64, dtype="bfloat16", layout="bshd", sizes=False),
    dict(d=128, blk=128, dtype="float16", layout="bshd", sizes=True, fwd_impl="sm90ws",
         fwd_only=True),
    dict(d=64, blk=64, dtype="bfloat16", layout="bhsd", sizes=True, fwd_impl="sm90ws",
         fwd_only=True),
    dict(d=128, blk=64, dtype="bfloat16", layout="bshd", sizes=False, bwd_impl="sm90"),
    dict(d=64, blk=128, dtype="float16", layout="bhsd", sizes=True, bwd_impl="sm90"),
]


@pytest.mark.parametrize("cfg", CAUSAL_CONFIGS, ids=_ids)
def test_bsa_causal_lowers(cfg):
    """causal=True lowers (forward and, unless fwd_only, backward) for sm_90a on the kernels
    the call selects, with the causal flag in their compile keys."""
    import jax_sparse_attn as jsa
    from jax_sparse_attn.config import Switches
    from jax_sparse_attn.ffi import bsa as ffi_bsa

    q, k, idx, nums, sizes, lse = _shapes(cfg)
    sw = Switches(bsa_fwd_impl=cfg.get("fwd_impl", "auto"),
                  bsa_bwd_impl=cfg.get("bwd_impl", "auto"))
    kw = dict(layout=cfg["layout"], sparse_block_size=cfg["blk"], softmax_scale=0.3,
              backend="kernel", switches=sw, causal=True)
    static = (jnp.dtype(cfg["dtype"]), cfg["d"], cfg["blk"], cfg["sizes"], sw)
    fkey = ffi_bsa.fwd_config(*static, causal=True)
    want_fwd = cfg.get("fwd_impl") or "sm90ws"
    assert fkey.causal and fkey.impl == want_fwd
    bkey = ffi_bsa.bwd_config(*static, causal=True)
    assert bkey.causal and bkey.impl == cfg.get("bwd_impl", "sm90ws") and bkey.dq_tile

    def fwd(q, k, v, i, n, s):
        return jsa.block_sparse_attention_forward(q, k, v, i, None, s, n, **kw)

    txt = jax.jit(fwd).trace(q, k, k, idx, nums, sizes).lower(lowering_platforms=("cuda",)).as_text()
    assert txt.count(CALL_TARGET) == 1 and "\\7FELF" in txt
    if cfg.get("fwd_only"):
        return

    def bwd(do, q, k, v, o, lse, i, n, s):
        return jsa.block_sparse_attention_backward(do, q, k, v, o, lse, i, None, s, n, **kw)

    txt = jax.jit(bwd).trace(q, q, k, k, q, lse, idx, nums, sizes).lower(
        lowering_platforms=("cuda",)).as_text()
    # preprocessing, dK/dV/dQ kernel, the lists and the dq reordering (a call of its own
    # after the sm90 backward, launched by the sm90ws backward's call)
    assert txt.count(CALL_TARGET) == 2 + _bwd_extra_calls(cfg["d"], cfg["blk"], sw, causal=True)
    assert "\\7FELF" in txt


def test_causal_config_keys_default_unchanged():
    """causal=False keys equal the keys built without the argument (same compile key as
    before the option existed)."""
    from jax_sparse_attn.config import Switches
    from jax_sparse_attn.ffi import bsa

    for blk in (64, 128):
        assert bsa.fwd_config(jnp.bfloat16, 128, blk, False, Switches()) == bsa.fwd_config(
            jnp.bfloat16, 128, blk, False, Switches(), causal=False)
        assert not bsa.fwd_config(jnp.bfloat16, 128, blk, False, Switches()).causal
    assert bsa.bwd_config(jnp.float16, 64, 64, True, Switches(), causal=True).causal


@pytest.mark.parametrize("why,d,sw", [
    ("d32", 32, {}),
    ("d256", 256, {}),
    ("fwd_sm80", 128, {"bsa_fwd_impl": "sm80"}),
    ("bwd_sm80", 64, {"bsa_bwd_impl": "sm80"}),
    ("portable", 128, {"kernel_family": "portable"}),
])
def test_causal_declined_where_sm80_kernels_run(why, d, sw):
    """causal=True where a pass would run a mma.sync (sm80) kernel: NotImplementedError
    naming the option (backend="kernel"); backend="auto" runs the reference."""
    import jax_sparse_attn as jsa
    from jax_sparse_attn.config import Switches
    from jax_sparse_attn.ffi import bsa

    switches = Switches(**sw)
    reason = bsa.causal_unsupported_reason(d, 64, switches=switches)
    assert reason is not None and "causal=True" in reason and "reference" in reason
    assert bsa.causal_unsupported_reason(128, 64, switches=Switches()) is None
    q = jnp.zeros((1, 2, 100, d), jnp.bfloat16)
    idx = jnp.zeros((1, 2, 2, 1), jnp.int32)
    kw = dict(sparse_block_size=64, switches=switches, causal=True)
    with pytest.raises(NotImplementedError, match="causal=True"):
        jsa.block_sparse_attention(q, q, q, idx, 1, backend="kernel", **kw)
    choice = jsa.which_backend(jsa.block_sparse_attention, q, q, q, idx, 1, **kw)
    assert choice.backend == "reference" and "causal" in choice.reason


def _s_gemm_a_operands(text):
    """The A operand of each S GEMM (m64n64k16, blk 64) of a bf16 forward's PTX: ``"{%"``
    for registers, ``"%r"`` for a shared-memory descriptor."""
    import re

    return {m.group(1)[:2] for m in re.finditer(
        r"wgmma\.mma_async\.sync\.aligned\.m64n64k16\.f32\.bf16\.bf16 \{[^}]*\}, (\S+)",
        text)}


def test_bsa_sm90ws_s_gemm_operands_ptx(kept_ptx):
    """By default (without ``bsa_fwd_ws=qregs``: :func:`test_bsa_sm90ws_qregs_ptx`) the S
    GEMMs (m64n64k16 at blk 64) read both operands through shared-memory descriptors and the
    forward has no ``ldmatrix``."""
    import kept_ptx as kp  # noqa: PLC0415

    plain = next(iter(kp.ptx_of(kept_ptx, _ids(WS_CONFIGS[1])).values()))
    assert _s_gemm_a_operands(plain.replace(".f16.f16", ".bf16.bf16")) == {"%r"}
    assert "ldmatrix" not in plain


@pytest.mark.ablation
def test_bsa_sm90ws_qregs_ptx(kept_ptx_ablation):
    """``bsa_fwd_ws=qregs``: the S GEMMs (m64n64k16 at blk 64) take Q from registers, which
    ``ldmatrix`` fills once per work item (8 x4 loads of the 64 x 128 slice; the default's
    operands: :func:`test_bsa_sm90ws_s_gemm_operands_ptx`). The PV GEMM (m64n128k16) reads P
    from registers either way."""
    import kept_ptx as kp  # noqa: PLC0415

    qregs = next(iter(kp.ptx_of(kept_ptx_ablation, "qregs-blk64").values()))
    assert _s_gemm_a_operands(qregs) == {"{%"}
    assert qregs.count("ldmatrix.sync.aligned") == 8


@pytest.mark.ablation
@pytest.mark.parametrize("cfg", [WS_CONFIGS[0], WS_CONFIGS[1]], ids=lambda c: _ids(c))
def test_bsa_sm90ws_epilogue_ptx(kept_ptx_ablation, cfg):
    """With ``bsa_fwd_ws=notmao`` the forward stages O (64 x D per consumer warpgroup, D 128:
    64 values per thread) with packed 4-byte shared stores (32 per thread) and copies it out
    with 16-byte shared loads (8 per thread), no 2-byte shared accesses; ``noepivec`` keeps
    the element copies of the swizzled layout (64 2-byte stores and 64 2-byte loads)."""
    import re

    import kept_ptx as kp  # noqa: PLC0415

    def shared_ops(text):
        ops = {}
        for m in re.finditer(r"\b(st|ld)\.shared\.([a-z0-9.]+)", text):
            ops[m.group(0)] = ops.get(m.group(0), 0) + 1
        return ops

    default = shared_ops(next(iter(kp.ptx_of(kept_ptx_ablation,
                                             "notmao-" + _ids(cfg)).values())))
    assert default.get("st.shared.b32") == 32, default
    assert default.get("ld.shared.v4.b32") == 8, default
    assert not any(op.endswith(("b16", "u16")) for op in default), default
    if cfg is WS_CONFIGS[1]:
        old = shared_ops(next(iter(kp.ptx_of(kept_ptx_ablation, "noepivec-blk64").values())))
        assert old.get("st.shared.b16") == 64 and old.get("ld.shared.b16") == 64, old
        assert "st.shared.b32" not in old, old


@pytest.mark.parametrize("name", list(_TMAO))
def test_bsa_sm90ws_tma_o_ptx(kept_ptx, name):
    """The default forward (``bsa_fwd_ws=tmao``): each consumer warpgroup stages O with
    packed 4-byte shared stores (D / 4 per thread) and no shared loads, then one thread
    writes the slice with
    TMA tensor stores (one per 64 columns), commits them as a bulk group and, before the
    next staging and at exit, waits for the group to have read shared memory (at D 128,
    where O is staged in the item's own Q buffer, ``oinq``, also before that Q buffer is
    released at the next item); a generic-to-async proxy fence orders the staging before the
    store."""
    import re

    import kept_ptx as kp  # noqa: PLC0415

    cfg = _TMAO[name]
    text = next(iter(kp.ptx_of(kept_ptx, name).values()))
    stores = re.findall(r"cp\.async\.bulk\.tensor\.4d\.global\.shared::cta\S*", text)
    assert len(stores) == cfg["d"] // 64, stores
    # the staging's proxy fence, then the warpgroup's barrier, then the stores
    first = text.index("cp.async.bulk.tensor.4d.global.shared::cta")
    fence = text.rindex("fence.proxy.async.shared::cta", 0, first)
    assert re.search(r"\bbar\.sync\b|\bbarrier\.sync\b", text[fence:first]), \
        "no barrier between the staging fence and the TMA store"
    assert "st.shared.b32" not in text[fence:first]
    assert text.count("cp.async.bulk.commit_group") == 1
    assert text.count("cp.async.bulk.wait_group.read") == (3 if cfg["d"] == 128 else 2)
    assert "fence.proxy.async.shared::cta" in text
    assert text.count("st.shared.b32") == cfg["d"] // 4
    assert "ld.shared.v4" not in text


def _tma_copies(kept, name):
    """The TMA copies of the forward kept for ``name`` as ``kept_ptx.tma_copy_policies``
    gives them (every copy found, every load's policy operand known)."""
    import kept_ptx as kp  # noqa: PLC0415

    text = next(iter(kp.ptx_of(kept, name).values()))
    got = kp.tma_copy_policies(text)
    assert text.count("cp.async.bulk.tensor.") == len(got)
    assert all(p is not None for k, _, p in got if k == "load"), got
    return got


@pytest.mark.parametrize("cfg", [WS_CONFIGS[0], WS_CONFIGS[1]], ids=lambda c: _ids(c))
def test_bsa_sm90ws_default_l2_policy_ptx(kept_ptx, cfg):
    """Without ``l2hint`` / ``l2normal`` (:func:`test_bsa_sm90ws_l2hint_ptx`) the forward
    passes the DSL's constant 0 as every TMA copy's policy operand."""
    default = _tma_copies(kept_ptx, _ids(cfg))
    assert default and {p for _, p, _ in default} == {"0"}, default


@pytest.mark.ablation
@pytest.mark.parametrize("cfg", [WS_CONFIGS[0], WS_CONFIGS[1]], ids=lambda c: _ids(c))
def test_bsa_sm90ws_l2hint_ptx(kept_ptx, kept_ptx_ablation, cfg):
    """``bsa_fwd_ws=l2hint``: each TMA copy's policy by the kernel parameter its tensor map
    comes from (Q 0, K 2, V 4): K / V loads ``evict_last`` (``createpolicy``), Q loads and
    the O tensor stores ``evict_first``; with split-KV the Q loads ``evict_last`` (one work
    item per split reads the query tile). ``l2normal``: ``evict_normal`` on every copy. Both
    have the default's copies (whose policy operand:
    :func:`test_bsa_sm90ws_default_l2_policy_ptx`)."""
    default = _tma_copies(kept_ptx, _ids(cfg))
    hint = _tma_copies(kept_ptx_ablation, "l2hint-" + _ids(cfg))
    normal = _tma_copies(kept_ptx_ablation, "l2normal-" + _ids(cfg))
    assert default
    kinds = [(k, t) for k, _, t in default]
    assert [(k, t) for k, _, t in hint] == kinds == [(k, t) for k, _, t in normal]
    want = {0: "evict_first", 2: "evict_last", 4: "evict_last"}
    assert {t for k, _, t in hint if k == "load"} == set(want)
    for k, p, t in hint:
        assert p == (want[t] if k == "load" else "evict_first"), (k, p, t)
    assert {p for _, p, _ in normal} == {"evict_normal"}
    if cfg is WS_CONFIGS[1]:
        split = _tma_copies(kept_ptx_ablation, "l2hint-split2")
        assert {(t, p) for k, p, t in split if k == "load"} == {
            (0, "evict_last"), (2, "evict_last"), (4, "evict_last")}


@pytest.mark.ablation
def test_bsa_sm90ws_pairwg_ptx(kept_ptx_ablation, tmp_path):
    """``bsa_fwd_ws=pairwg`` (blk 64): one CTA per SM of 384 threads, a producer warpgroup
    whose two warps load for one consumer warpgroup each, the consumers at 240 registers;
    the warpgroups take turns through named barriers 1 and 2 (``bar.sync`` on their own,
    ``bar.arrive`` on the other's, 256 threads) and read the turn flags from shared memory;
    ptxas assembles it without spills and without serializing a wgmma."""
    import re
    import shutil
    import subprocess

    import kept_ptx as kp  # noqa: PLC0415

    files = kp.ptx_of(kept_ptx_ablation, "pairwg-blk64")
    assert len(files) == 1, list(files)
    name, text = next(iter(files.items()))
    assert "bsa_fwd_sm90_ws" in text
    assert ".minnctapersm 1" in text
    assert re.search(r"setmaxnreg\.inc\.sync\.aligned\.u32\s+240;", text)
    assert re.search(r"setmaxnreg\.dec\.sync\.aligned\.u32\s+24;", text)
    assert "bar.arrive 1, 256;" in text  # warpgroup 0 holds the first turn
    assert len(re.findall(r"bar\.arrive %r\d+, 256;", text)) >= 3
    assert len(re.findall(r"bar\.sync \t%r\d+, 256;", text)) >= 2
    assert "ld.shared.b32" in text and "st.shared.b32" in text
    assert "cp.async.bulk.tensor" in text and "wgmma.mma_async" in text
    if shutil.which("ptxas") is None:
        return
    a = subprocess.run(["ptxas", "-arch=sm_90a", "-v",
                        str(kept_ptx_ablation / "pairwg-blk64" / name),
                        "-o", str(tmp_path / "k.cubin")], capture_output=True, text=True,
                       timeout=600)
    out = a.stdout + a.stderr
    assert a.returncode == 0, out[-3000:]
    assert "serialized" not in out, out[-3000:]  # C7512-C7515
    spills = [int(x) for x in re.findall(r"(\d+) bytes spill stores", out)]
    assert spills and max(spills) == 0, out[-3000:]


@pytest.mark.ablation
@pytest.mark.parametrize("ws,d,sizes,causal", [("pairwg", 64, True, False),
                                               ("pairwg,nopingpong", 128, False, False),
                                               ("pairwg", 128, True, True),
                                               ("pairwg,nooverlap,notmao", 64, False, True)])
def test_bsa_fwd_pairwg_lowers(ws, d, sizes, causal):
    """``bsa_fwd_ws=pairwg`` at blk 64 lowers with and without ping-pong, overlap, TMA stores of
    O, ``block_sizes`` and ``causal``."""
    import jax_sparse_attn as jsa
    from jax_sparse_attn.config import Switches
    from jax_sparse_attn.ffi import bsa as ffi_bsa

    cfg = dict(d=d, blk=64, dtype="float16", layout="bhsd", sizes=sizes)
    q, k, idx, nums, sizes_, _ = _shapes(cfg)
    sw = Switches(bsa_fwd_ws=tuple(ws.split(",")))
    assert ffi_bsa.fwd_config(jnp.float16, d, 64, sizes, sw, causal=causal).ws_pair_wg

    def fwd(q, k, v, i, n, s):
        return jsa.block_sparse_attention_forward(q, k, v, i, None, s, n, layout="bhsd",
                                                  sparse_block_size=64, softmax_scale=0.3,
                                                  backend="kernel", switches=sw, causal=causal)

    txt = jax.jit(fwd).trace(q, k, k, idx, nums, sizes_).lower(
        lowering_platforms=("cuda",)).as_text()
    assert txt.count(CALL_TARGET) == 1 and "\\7FELF" in txt


@pytest.mark.ablation
@pytest.mark.parametrize("ws,d,blk,sizes", [("cross", 128, 128, False), ("crossepi", 64, 64, True),
                                           ("cross", 128, 64, True), ("mpre", 64, 128, True),
                                           ("qahead", 128, 64, False),
                                           ("qahead,noepivec", 64, 64, True)])
def test_bsa_fwd_chained_items_lower(ws, d, blk, sizes):
    """The opt-in work-item variants of the sm90ws forward: chained items (``cross``,
    ``crossepi``), the next item's metadata (``mpre``) and Q (``qahead``) loaded during the
    current one, and the previous epilogue (``noepivec``)."""
    import jax_sparse_attn as jsa
    from jax_sparse_attn.config import Switches

    cfg = dict(d=d, blk=blk, dtype="bfloat16", layout="bshd", sizes=sizes)
    q, k, idx, nums, sizes_, _ = _shapes(cfg)
    sw = Switches(bsa_fwd_ws=tuple(ws.split(",")))

    def fwd(q, k, v, i, n, s):
        return jsa.block_sparse_attention_forward(q, k, v, i, None, s, n, layout="bshd",
                                                  sparse_block_size=blk, softmax_scale=0.3,
                                                  backend="kernel", switches=sw)

    txt = jax.jit(fwd).trace(q, k, k, idx, nums, sizes_).lower(
        lowering_platforms=("cuda",)).as_text()
    assert txt.count(CALL_TARGET) == 1 and "\\7FELF" in txt


@pytest.mark.parametrize("heads,launch_zeroes", [(3, True), (17, False)])
def test_bsa_preprocess_zeroes_large_workspace_by_xla(heads, launch_zeroes):
    """The preprocessing launch zeroes the fp32 dQ workspace only while it has at most
    ``_MAX_ZERO_ELEMS`` elements (its flat extent and vector indices are int32 in the kernel):
    17 heads of 2**20 rows at D 128 (2.28e9 elements) get XLA's zeros, 3 heads the launch's
    (its flat workspace is one of the custom call's results)."""
    from jax_sparse_attn.config import Switches
    from jax_sparse_attn.ffi import bsa as ffi_bsa
    from jax_sparse_attn.validation import check_bsa_args

    s, d = 2**20, 128
    o = jax.ShapeDtypeStruct((1, heads, s, d), jnp.bfloat16)
    idx = jax.ShapeDtypeStruct((1, heads, s // 64, 1), jnp.int32)
    sw = Switches()

    def pre(do, o, idx):
        cfg = check_bsa_args(o, o, o, idx, 1, layout="bhsd", sparse_block_size=64)
        cfg = dataclasses.replace(cfg, backend="kernel", pre=ffi_bsa.pre_config("bfloat16", d, sw),
                                  bwd=ffi_bsa.bwd_config("bfloat16", d, 64, False, sw))
        return ffi_bsa.bsa_preprocess(do, o, cfg)

    txt = jax.jit(pre).trace(o, o, idx).lower(lowering_platforms=("cuda",)).as_text()
    n = heads * s * d
    assert (n <= ffi_bsa._MAX_ZERO_ELEMS) == launch_zeroes
    assert txt.count(CALL_TARGET) == 1
    assert (f"tensor<{n}xf32>" in txt) == launch_zeroes


@pytest.mark.ablation
@pytest.mark.parametrize("heads,s,overlap", [(4, 4096, True), (33, 2**19, False)])
def test_bsa_det_overlap_needs_a_workspace_the_launch_zeroes(monkeypatch, heads, s, overlap):
    """deterministic with ``detstream,detoverlap``: the preprocessing joins the backward's
    call only while its launch may zero the dQ workspace (``_zero_fits``); 33 heads of
    2**19 rows at D 128 (2.27e9 elements) take the separate preprocessing (XLA zeroes the
    workspace) and the streamed backward without it."""
    import jax_sparse_attn as jsa
    from jax_sparse_attn.config import Switches
    from jax_sparse_attn.ffi import bsa as ffi_bsa

    seen = []
    stream, pre = ffi_bsa._bsa_bwd_det_stream, ffi_bsa.bsa_preprocess

    def spy_stream(*a, **kw):
        seen.append(("stream", kw.get("out") is not None))
        return stream(*a, **kw)

    def spy_pre(do, out, cfg, with_ws=True, **kw):
        seen.append(("pre", with_ws))
        return pre(do, out, cfg, with_ws, **kw)

    monkeypatch.setattr(ffi_bsa, "_bsa_bwd_det_stream", spy_stream)
    monkeypatch.setattr(ffi_bsa, "bsa_preprocess", spy_pre)
    d, blk = 128, 128
    q = jax.ShapeDtypeStruct((1, heads, s, d), jnp.bfloat16)
    idx = jax.ShapeDtypeStruct((1, heads, s // blk, 4), jnp.int32)
    lse = jax.ShapeDtypeStruct((1, heads, s), jnp.float32)
    sw = Switches(bsa_bwd_ws=("detstream", "detoverlap"))

    def bwd(do, q, k, v, out, lse, idx):
        return jsa.block_sparse_attention_backward(
            do, q, k, v, out, lse, idx, block_sparse_num=4, sparse_block_size=blk,
            softmax_scale=0.1, layout="bhsd", backend="kernel", deterministic=True,
            switches=sw)

    txt = jax.jit(bwd).trace(q, q, q, q, q, lse, idx).lower(
        lowering_platforms=("cuda",)).as_text()
    assert (heads * s * d <= ffi_bsa._MAX_ZERO_ELEMS) == overlap
    assert seen == ([("stream", True)] if overlap else [("pre", True), ("stream", False)])
    assert "\\7FELF" in txt


def test_bsa_sm90ws_fwd_wgmma_groups_in_block(kept_ptx):
    """Every kept sm90ws forward kernel commits each wgmma group in the basic block of its
    last wgmma (``kept_ptx.assert_wgmma_groups_in_block``), so its waits count the groups it
    means."""
    import kept_ptx as kp  # noqa: PLC0415

    n = kp.configs_with_groups_in_block(kept_ptx, _PTX_CONFIGS)
    assert n == len(_PTX_CONFIGS), n


@pytest.mark.ablation
def test_bsa_sm90ws_fwd_ablation_wgmma_groups_in_block(kept_ptx_ablation):
    """The same for the kept kernels of the opt-in variants (:data:`_PTX_ABLATION`)."""
    import kept_ptx as kp  # noqa: PLC0415

    n = kp.configs_with_groups_in_block(kept_ptx_ablation, _PTX_ABLATION)
    assert n == len(_PTX_ABLATION), n


def _mbarrier_init_counts(text):
    """{byte offset from the mbarrier array's base: arrival count} of the PTX's
    ``mbarrier.init`` instructions (counts moved into registers resolved)."""
    import re

    movs = dict(re.findall(r"mov\.[bus]32\s+(%r\d+),\s*(\d+);", text))
    out = {}
    for off, cnt in re.findall(r"mbarrier\.init\.shared\.b64\s+\[%r\d+(?:\+(\d+))?\],\s*"
                               r"(%r\d+|\d+);", text):
        out[int(off or 0)] = int(movs.get(cnt, cnt))
    return out


@pytest.mark.ablation
def test_bsa_sm90ws_wgrelease_ptx(kept_ptx, kept_ptx_ablation):
    """``bsa_fwd_ws=wgrelease`` (blk 64 / D 128: one consumer warpgroup, two K and three V
    stages): the K / V stages' empty barriers count one arrival instead of one per consumer
    warp (4); the Q stages' and every full barrier's counts are the default's, and the
    kernel has the same arrive instructions (each now run by one warp of the warpgroup)."""
    import kept_ptx as kp  # noqa: PLC0415

    default = next(iter(kp.ptx_of(kept_ptx, _ids(WS_CONFIGS[1])).values()))
    wgr = next(iter(kp.ptx_of(kept_ptx_ablation, "wgrelease-blk64").values()))
    a, b = _mbarrier_init_counts(default), _mbarrier_init_counts(wgr)
    assert a.keys() == b.keys() and len(a) == 14, (a, b)
    changed = {off: (a[off], b[off]) for off in a if a[off] != b[off]}
    assert sorted(changed.values()) == [(4, 1)] * 5, changed
    assert sorted(v for off, v in b.items() if off not in changed) == [1] * 7 + [4] * 2, b
    assert default.count("mbarrier.arrive") == wgr.count("mbarrier.arrive")
