"""CPU (CI) lowering tests of the HSTU kernel path for sm_90a.

With ``CUTE_DSL_ARCH=sm_90a`` and ``JAX_SPARSE_ATTN_FORCE_KERNEL=1``,
``jax.jit(...).trace(...).lower(lowering_platforms=("cuda",))`` runs the full CuTe DSL
compile (MLIR -> PTX -> cubin) on a machine without a GPU. Every static configuration
the public API can select (dtype x padded head dim x mask kind x fwd/bwd) must lower and
the lowered module must contain the CuTe DSL custom call, i.e. the kernel (not an XLA
fallback) is what runs on the GPU.

The tests of opt-in ablation and tuning variants of the switches (``hstu_fwd_ws``,
``hstu_bwd_ws``, ``hstu_bwd_dq``, ``hstu_bwd_order``, ``dq_writer``, ``det_writer`` off)
that the defaults do not compile are marked ``ablation`` (``pytest -m ablation``); their PTX
is kept by a fixture of its own (:func:`kept_ptx_ablation`). Their compile keys and the
checks of the defaults' own PTX stay in default-run tests.
"""

from __future__ import annotations

import os
import re

import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

pytestmark = pytest.mark.lowering

T = 300
B = 3


def _have_cutedsl():
    try:
        import cutlass.jax  # noqa: F401, PLC0415
    except Exception:  # pragma: no cover
        return False
    return True


@pytest.fixture(autouse=True)
def _force_kernel(monkeypatch):
    if not _have_cutedsl():
        pytest.skip("CuTe DSL not importable")
    monkeypatch.setenv("JAX_SPARSE_ATTN_FORCE_KERNEL", "1")
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")


def _lower(fn, *args):
    lowered = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",))
    return lowered.as_text()


def _target():
    from cutlass.jax.ffi import _register_and_get_default_ffi_call_target  # noqa: PLC0415

    try:
        return _register_and_get_default_ffi_call_target(True)
    except Exception:  # pragma: no cover - fall back to the stable prefix
        return "CuteDSLRT"


# every (head dim, mask, direction) once; the dtype alternates so that each head dim, mask
# and direction lowers in both dtypes (the full dtype product doubles the CI time for
# kernels whose 16-bit dtype is only a type parameter)
CONFIGS = [
    (("bfloat16", "float16")[(mask == "func") ^ (direction == "bwd") ^ (d in (64, 256))], d,
     mask, direction)
    for d in (32, 64, 128, 256)
    for mask in ("window", "func")
    for direction in ("fwd", "bwd")
]


@pytest.mark.parametrize("dtype,head_dim,mask,direction", CONFIGS,
                         ids=["-".join(map(str, c)) for c in CONFIGS])
def test_hstu_kernel_lowers(dtype, head_dim, mask, direction):
    import jax_sparse_attn as jsa  # noqa: PLC0415

    dt = jnp.dtype(dtype)
    # D one below the supported dim for the smaller dims: exercises the zero-padding path
    d = head_dim - 8 if head_dim in (64, 256) else head_dim
    q = jax.ShapeDtypeStruct((T, 2, d), dt)
    v = jax.ShapeDtypeStruct((T, 2, d), dt)
    cu = jax.ShapeDtypeStruct((B + 1,), jnp.int32)
    func = jax.ShapeDtypeStruct((1, 3, T + 256), jnp.int32) if mask == "func" else None
    window = (-1, -1) if mask == "func" else (-1, 0)

    def fwd(q, k, v, cu, func):
        return jsa.hstu_attention(q, k, v, cu, cu, max_seqlen_q=200, max_seqlen_k=200,
                                  window_size=window, alpha=0.3, func=func, backend="kernel")

    if direction == "fwd":
        txt = _lower(fwd, q, q, v, cu, func)
    else:
        def loss(q, k, v, cu, func):
            return jnp.sum(fwd(q, k, v, cu, func).astype(jnp.float32))

        txt = _lower(jax.grad(loss, argnums=(0, 1, 2)), q, q, v, cu, func)
    target = _target()
    n_calls = _attention_calls(txt)
    # forward: 1 kernel; grad of a sum: only the backward kernel (the forward's output is not
    # needed, so XLA drops that call)
    assert n_calls == 1, f"expected one {target} attention call in the lowering, got {n_calls}"
    # window masks: the tile schedule is one more kernel launch; func masks: jnp ops
    assert (_SCHEDULE_KERNEL in txt) == (mask == "window")
    assert "\\7FELF" in txt, "no embedded cubin in the lowered module"


_SCHEDULE_KERNEL = "hstu_scheduleHstuSchedule"  # in the name of the schedule kernel
_DQ_TILES_KERNEL = "hstu_dq_tilesHstuDqFromTiles"  # the dq reordering of hstu_bwd_dq="tile"


def _attention_calls(txt):
    """The number of kernel calls in a lowering other than the tile-schedule kernel's
    (``kernels/hstu_schedule.py``) and the dq reordering kernel's
    (``kernels/hstu_dq_tiles.py``)."""
    return sum(_SCHEDULE_KERNEL not in seg and _DQ_TILES_KERNEL not in seg
               for seg in txt.split(_target())[1:])


def test_hstu_kernel_lowers_dv_ne_d_and_window_values():
    """D != D_v and different window values share one compiled configuration."""
    import jax_sparse_attn as jsa  # noqa: PLC0415

    q = jax.ShapeDtypeStruct((T, 2, 64), jnp.bfloat16)
    v = jax.ShapeDtypeStruct((T, 2, 128), jnp.bfloat16)
    cu = jax.ShapeDtypeStruct((B + 1,), jnp.int32)
    texts = []
    for window in ((-1, 0), (63, 17)):
        def f(q, k, v, cu, window=window):
            return jsa.hstu_attention(q, k, v, cu, cu, max_seqlen_q=100, max_seqlen_k=100,
                                      scaling_seqlen=100.0, window_size=window, backend="kernel")

        texts.append(_lower(f, q, q, v, cu))
    assert all(_target() in t for t in texts)


def _fwd_impls():
    from jax_sparse_attn.config import SWITCHES  # noqa: PLC0415

    return next(sw.allowed for sw in SWITCHES if sw.field == "hstu_fwd_impl")


def _fwd_text(head_dim, head_dim_v, func_n, dtype, switches=None):
    """The lowered text of the public forward (kernel backend) with the given switches."""
    import jax_sparse_attn as jsa  # noqa: PLC0415

    q = jax.ShapeDtypeStruct((T, 2, head_dim), jnp.dtype(dtype))
    v = jax.ShapeDtypeStruct((T, 2, head_dim_v), jnp.dtype(dtype))
    cu = jax.ShapeDtypeStruct((B + 1,), jnp.int32)
    func = jax.ShapeDtypeStruct((1, func_n, T + 256), jnp.int32) if func_n else None
    window = (-1, -1) if func_n else (-1, 0)

    def f(q, k, v, cu, func):
        return jsa.hstu_attention(q, k, v, cu, cu, func=func, max_seqlen_q=100, max_seqlen_k=100,
                                  window_size=window, backend="kernel", switches=switches)

    return _lower(f, q, q, v, cu, func)


# Every forward of the hstu_fwd_impl switch at every head dim (D = 256 uses 64-key tiles; for
# sm90ws also one Q stage and the O staging buffer inside Q's), with func masks, fp16 and
# D != D_v. The default forward's configurations that the two tests above already compile
# are left out here.
_IMPL_CONFIGS = ((128, 128, 0, "bfloat16"), (64, 64, 3, "float16"), (32, 32, 0, "bfloat16"),
                 (256, 256, 7, "bfloat16"), (64, 128, 0, "bfloat16"))
FWD_LOWER = [(impl, d, dv, fn, dt) for impl in _fwd_impls()
             for d, dv, fn, dt in _IMPL_CONFIGS
             if impl != _fwd_impls()[0] or fn == 7]


@pytest.mark.parametrize("impl,head_dim,head_dim_v,func_n,dtype", FWD_LOWER,
                         ids=["-".join(map(str, c)) for c in FWD_LOWER])
def test_hstu_forward_impls_lower(impl, head_dim, head_dim_v, func_n, dtype):
    """Every value of the hstu_fwd_impl switch (sm90ws, the default; the mma.sync sm80; any
    added later) has a forward that compiles for sm_90a; the forward is chosen through the
    public ``switches`` argument."""
    from jax_sparse_attn.config import Switches  # noqa: PLC0415

    txt = _fwd_text(head_dim, head_dim_v, func_n, dtype, Switches(hstu_fwd_impl=impl))
    assert _target() in txt and "\\7FELF" in txt


# the sm90ws forward's variants (hstu_fwd_ws / JAX_SPARSE_ATTN_HSTU_WS: ablation and tuning)
WS_LOWER = [(ws, 128, 0, "bfloat16") for ws in ("nooverlap", "nopingpong", "q1", "silu16",
                                                 "cross")]
WS_LOWER += [("bn=80", 256, 0, "float16"), ("crossepi", 64, 3, "float16"),
             ("headouter", 64, 0, "bfloat16"), ("roundrobin", 128, 3, "bfloat16"),
             ("static", 128, 0, "bfloat16"), ("dynamic", 256, 3, "float16"),
             ("chunk=1024", 128, 0, "bfloat16"), ("chunk=0", 64, 0, "bfloat16"),
             ("qscale", 64, 0, "bfloat16"), ("qscale", 128, 3, "float16"),
             ("qscale", 256, 0, "bfloat16"), ("noqscale", 64, 0, "bfloat16"),
             ("noqscale,static", 32, 3, "float16"), ("wg3", 64, 0, "bfloat16"),
             ("wg3,noqscale", 64, 3, "float16"), ("wg3,static,q1", 32, 0, "bfloat16")]
#: the variants of WS_LOWER whose kernel a default call compiles too (the dynamic deal, qscale
#: at D 64 in bf16, three warpgroups from max_seqlen_q 2048 at D <= 64); the others are ablation
_WS_DEFAULT_KERNELS = {("dynamic", 256), ("qscale", 64), ("wg3", 64)}


def test_hstu_sm90ws_tma_o_key_only_where_the_kernel_stores_by_tma():
    """The O stores by TMA (the default; ``notmao`` off) are in the compile key only where
    the kernel takes them: not with split keys, where O is staged in the Q buffer (D 256,
    ``qalias``), at a D_v that is not a multiple of 64 or with ``noepivec``; there the
    default and ``notmao`` give one key (one compile)."""
    import dataclasses  # noqa: PLC0415

    from jax_sparse_attn.config import Switches  # noqa: PLC0415
    from jax_sparse_attn.ffi import hstu as fh  # noqa: PLC0415

    sw, off = Switches(), Switches(hstu_fwd_ws="notmao")
    for d, dv, kw, want in ((128, 128, {}, True), (64, 64, {}, True), (64, 128, {}, True),
                            (64, 64, {"max_seqlen_q": 8192}, True),
                            (128, 128, {"has_rab": True, "rab_dtype": "float32"}, True),
                            (128, 128, {"paged": True}, True), (256, 256, {}, False),
                            (128, 128, {"kv_splits": 4}, False), (96, 96, {}, False),
                            (32, 32, {}, False)):
        key = fh.fwd_config("bfloat16", d, dv, 0, sw, **kw)
        assert key.ws_tma_o is want, (d, dv, kw)
        plain = fh.fwd_config("bfloat16", d, dv, 0, off, **kw)
        assert not plain.ws_tma_o
        assert (key == plain) is (not want), (d, dv, kw)
        assert dataclasses.replace(key, ws_tma_o=False) == plain
    assert not fh.fwd_config("bfloat16", 128, 128, 0, Switches(hstu_fwd_ws="qalias")).ws_tma_o
    assert not fh.fwd_config("bfloat16", 128, 128, 0,
                             Switches(hstu_fwd_ws="noepivec")).ws_tma_o


def test_hstu_sm90ws_three_consumer_warpgroups_key():
    """hstu_fwd_ws=wg3: 192-row query tiles and 16 warps in the compile key at head dims up
    to 64; above, with rab or paged K / V the key is the two-warpgroup one. Without wg2 /
    wg3 the static max_seqlen_q picks it."""
    import dataclasses  # noqa: PLC0415

    from jax_sparse_attn.config import Switches  # noqa: PLC0415
    from jax_sparse_attn.ffi import hstu as fh  # noqa: PLC0415

    wg3, wg2 = Switches(hstu_fwd_ws="wg3"), Switches(hstu_fwd_ws="wg2")
    k = fh.fwd_config("bfloat16", 64, 64, 0, wg3)
    assert (k.block_m, k.num_warps, k.ws_num_wg) == (192, 16, 3)
    assert fh.fwd_config("float16", 32, 32, 3, wg3).block_m == 192
    base = fh.fwd_config("bfloat16", 64, 64, 0, wg2)
    assert (base.block_m, base.num_warps, base.ws_num_wg) == (128, 12, 2)
    assert dataclasses.replace(k, block_m=128, num_warps=12, ws_num_wg=2) == base
    for d, kw in ((128, {}), (256, {}), (64, {"has_rab": True, "rab_dtype": "float32"}),
                  (64, {"paged": True})):
        key = fh.fwd_config("bfloat16", d, d, 0, wg3, **kw)
        assert (key.block_m, key.num_warps, key.ws_num_wg) == (128, 12, 2), (d, kw)
    # unless wg2 / wg3 says otherwise: three warpgroups from max_seqlen_q = 2048 at D <= 64
    sw = Switches()
    assert fh.WS_WG3_MIN_SEQLEN_Q == 2048
    for d, lq, n in ((64, 2048, 3), (64, 2047, 2), (32, 4096, 3), (64, 0, 2), (128, 8192, 2),
                     (256, 8192, 2)):
        assert fh.fwd_config("bfloat16", d, d, 0, sw, max_seqlen_q=lq).ws_num_wg == n, (d, lq)
    assert fh.fwd_config("bfloat16", 64, 64, 0, wg2, max_seqlen_q=8192).ws_num_wg == 2
    # not by default with a func mask (explicitly, yes), split keys or block_n > 128; wg3
    # with block_n > 128 is an error
    assert fh.fwd_config("bfloat16", 64, 64, 3, sw, max_seqlen_q=8192).ws_num_wg == 2
    assert fh.fwd_config("bfloat16", 64, 64, 3, wg3).ws_num_wg == 3
    assert fh.fwd_config("bfloat16", 64, 64, 0, sw, max_seqlen_q=8192,
                         kv_splits=2).ws_num_wg == 2
    big = Switches(hstu_fwd_ws="bn=192")
    assert fh.fwd_config("bfloat16", 64, 64, 0, big, max_seqlen_q=8192).ws_num_wg == 2
    assert fh.fwd_config("bfloat16", 64, 64, 0, Switches(hstu_fwd_ws="bn=128,wg3")).block_m == 192
    with pytest.raises(ValueError, match="wg3.*bn=144.*block_n <= 128"):
        fh.fwd_config("bfloat16", 64, 64, 0, Switches(hstu_fwd_ws="wg3,bn=144"))
    # three warpgroups by default in both 16-bit types (fp16 without qscale)
    key16 = fh.fwd_config("float16", 64, 64, 0, sw, max_seqlen_q=8192)
    assert (key16.ws_num_wg, key16.block_m, key16.ws_q_scale) == (3, 192, False)
    assert fh.fwd_config("float16", 64, 64, 0, sw, max_seqlen_q=1024).ws_num_wg == 2
    assert fh.fwd_config("float16", 64, 64, 0, wg3, max_seqlen_q=8192).ws_num_wg == 3
    # qscale by default at D <= 64 in bf16 only (fp16: q * alpha / 2 could overflow)
    assert fh.fwd_config("bfloat16", 64, 64, 0, sw).ws_q_scale
    assert not fh.fwd_config("float16", 64, 64, 0, sw).ws_q_scale
    assert fh.fwd_config("float16", 64, 64, 0, Switches(hstu_fwd_ws="qscale")).ws_q_scale
    assert not fh.fwd_config("bfloat16", 128, 128, 0, sw).ws_q_scale
    assert fh.fwd_config("bfloat16", 64, 64, 0, wg3, max_seqlen_q=1).ws_num_wg == 3
    assert fh.fwd_config("bfloat16", 64, 64, 0, sw, max_seqlen_q=8192, has_rab=True,
                         rab_dtype="float32").ws_num_wg == 2


def test_hstu_fwd_chunked_schedule_takes_the_chunk_size():
    """With the dynamic deal (the default) the schedule kernel gets a seventh parameter (keys
    per chunk, from chunk=N KiB, 16384 by default, over the call's KV heads and padded head
    dims); the static deal and chunk=0 have six."""
    from jax_sparse_attn.config import Switches  # noqa: PLC0415
    from jax_sparse_attn.ffi import hstu as fh  # noqa: PLC0415

    chunked = _fwd_text(128, 128, 0, "bfloat16",
                        Switches(hstu_fwd_impl="sm90ws", hstu_fwd_ws=("dynamic", "chunk=1024")))
    default = _fwd_text(128, 128, 0, "bfloat16", Switches(hstu_fwd_impl="sm90ws"))
    for off in (("static", "chunk=1024"), ("chunk=0",), ("headouter",), ("cross",)):
        txt = _fwd_text(128, 128, 0, "bfloat16", Switches(hstu_fwd_impl="sm90ws", hstu_fwd_ws=off))
        assert "tensor<6xi32>" in txt and "tensor<7xi32>" not in txt, off
        # chunk=0 keeps the dynamic deal (its counter aliased), the others deal statically
        assert ("output_operand_alias" in txt) == (off == ("chunk=0",)), off
    sm80 = _fwd_text(128, 128, 0, "bfloat16", Switches(hstu_fwd_impl="sm80"))
    assert "tensor<7xi32>" not in sm80 and "output_operand_alias" not in sm80
    # the seventh parameter is the keys per chunk: N KiB over 2 KV heads x (128 + 128) x 2 B
    assert "dense<[300, 300, -1, 0, 6, 8, 1024]> : tensor<7xi32>" in chunked
    assert "dense<[300, 300, -1, 0, 6, 8, 16384]> : tensor<7xi32>" in default
    key = fh.fwd_config("bfloat16", 128, 128, 0,
                        Switches(hstu_fwd_impl="sm90ws", hstu_fwd_ws=("chunk=1024",)))
    assert key.schedule_chunk_kib == 1024
    # 1 MiB over 2 KV heads x (128 + 128) x 2 bytes per key = 1024 keys
    assert fh.schedule_tokens_per_chunk(key, 2, 2) == 1024
    assert fh.schedule_tokens_per_chunk(fh.fwd_config(
        "bfloat16", 128, 128, 0, Switches(hstu_fwd_impl="sm90ws")), 2, 2) == 16384
    assert fh.schedule_tokens_per_chunk(fh.fwd_config(
        "bfloat16", 128, 128, 0, Switches(hstu_fwd_impl="sm90ws", hstu_fwd_ws="static")),
        2, 2) == 0


def test_hstu_sm90ws_dynamic_deal_passes_an_aliased_counter():
    """The dynamic deal (the default): the forward call takes an int32 counter aliased to an
    output, and that counter is the tile-schedule call's fourth result (the schedule launch
    zeroes it: no XLA copy of a zero constant between the two launches); the static deal has
    no aliased buffer."""
    from jax_sparse_attn.config import Switches  # noqa: PLC0415

    dyn = _fwd_text(128, 128, 0, "bfloat16", Switches(hstu_fwd_impl="sm90ws"))
    static = _fwd_text(128, 128, 0, "bfloat16",
                       Switches(hstu_fwd_impl="sm90ws", hstu_fwd_ws=("static",)))
    assert "output_operand_alias" in dyn
    assert "output_operand_alias" not in static
    # the counter: one int32 operand of the forward call, one int32 result aliased to it
    assert "tensor<1xi32>) -> (tensor<300x2x128xbf16>, tensor<1xi32>)" in dyn
    calls = [ln for ln in dyn.splitlines() if "stablehlo.custom_call" in ln]
    sched = re.match(r"\s*(%\w+):4 = stablehlo.custom_call", calls[0])
    assert sched, calls[0][:200]
    fwd_operands = calls[1].split("(", 1)[1].split(")", 1)[0].split(", ")
    assert fwd_operands[-1] == sched.group(1) + "#3", fwd_operands


@pytest.mark.parametrize("ws,head_dim,func_n,dtype",
                         [c if c[:2] in _WS_DEFAULT_KERNELS
                          else pytest.param(*c, marks=pytest.mark.ablation) for c in WS_LOWER],
                         ids=[c[0].replace("=", "") for c in WS_LOWER])
def test_hstu_sm90ws_variants_lower(ws, head_dim, func_n, dtype):
    from jax_sparse_attn.config import Switches  # noqa: PLC0415

    txt = _fwd_text(head_dim, head_dim, func_n, dtype,
                    Switches(hstu_fwd_impl="sm90ws", hstu_fwd_ws=tuple(ws.split(","))))
    assert _target() in txt and "\\7FELF" in txt


def test_hstu_fwd_tile_switch_is_validated():
    """The tile override reaches the sm80 compile key; a tile the sm80 forward cannot run, or
    any tile with sm90ws (which takes block_n from hstu_fwd_ws), is a ValueError naming the
    switch."""
    from jax_sparse_attn.config import Switches  # noqa: PLC0415
    from jax_sparse_attn.ffi import hstu as fh  # noqa: PLC0415

    key = fh.fwd_config("bfloat16", 128, 128, 3, Switches(hstu_fwd_impl="sm80",
                                                           hstu_fwd_tile=(64, 64, 4)))
    assert (key.block_m, key.block_n, key.num_warps, key.impl, key.has_func, key.func_n) == (
        64, 64, 4, "sm80", True, 3)
    for sw in (Switches(hstu_fwd_tile=(128, 64, 12)),
               Switches(hstu_fwd_impl="sm80", hstu_fwd_tile=(48, 64, 4))):
        with pytest.raises(ValueError, match="JAX_SPARSE_ATTN_HSTU_FWD_TILE"):
            fh.fwd_config("bfloat16", 128, 128, 0, sw)


def test_hstu_sm90ws_config_from_switches():
    """The sm90ws compile key: 128 x 128 tiles (64 keys at D = 256), 12 warps, the variants of
    hstu_fwd_ws; a block_n that does not fit shared memory is a ValueError naming the switch."""
    from jax_sparse_attn.config import Switches  # noqa: PLC0415
    from jax_sparse_attn.ffi import hstu as fh  # noqa: PLC0415

    key = fh.fwd_config("float16", 128, 128, 0, Switches())
    assert (key.impl, key.dtype, key.block_m, key.block_n, key.num_warps) == (
        "sm90ws", "float16", 128, 128, 12)
    assert (key.ws_overlap, key.ws_pingpong, key.ws_q_stages, key.ws_silu16) == (
        True, True, 2, False)
    assert key.num_sms > 0
    assert fh.fwd_config("bfloat16", 256, 256, 7, Switches()).block_n == 64
    key = fh.fwd_config("bfloat16", 64, 128, 0, Switches(
        hstu_fwd_ws=("nooverlap", "nopingpong", "q1", "silu16", "bn=64")))
    assert (key.block_n, key.ws_overlap, key.ws_pingpong, key.ws_q_stages, key.ws_silu16) == (
        64, False, False, 1, True)
    # the sm80 forward ignores the sm90ws variants: its compile key is the default one
    assert fh.fwd_config("bfloat16", 128, 128, 0, Switches(
        hstu_fwd_impl="sm80", hstu_fwd_ws=("q1",))) == fh.fwd_config(
        "bfloat16", 128, 128, 0, Switches(hstu_fwd_impl="sm80"))
    with pytest.raises(ValueError, match="JAX_SPARSE_ATTN_HSTU_WS"):
        fh.fwd_config("bfloat16", 256, 256, 0, Switches(hstu_fwd_ws=("bn=256",)))


# relative attention bias: the forwards with rab (sm90ws, the default, with its variants, and
# sm80), the backward with H_rab = 1 (fp32 workspace + red.add) and H_rab = H (direct
# stores), rab in q's dtype and in float32, window and func masks, an odd max_seqlen_k
RAB_LOWER = [
    ("fwd", "sm90ws", "bfloat16", 64, "window", 1, "q"),
    ("fwd", "sm90ws", "float16", 128, "func", 2, "f32"),
    ("fwd", "sm90ws", "bfloat16", 256, "window", 2, "q"),
    ("fwd", "sm80", "bfloat16", 32, "func", 1, "f32"),
    ("fwd", "sm90ws:nooverlap,bn=64", "float16", 64, "window", 2, "f32"),
    ("bwd", "sm90ws", "bfloat16", 128, "window", 2, "f32"),
    ("bwd", "sm90ws", "float16", 32, "func", 2, "q"),
    ("bwd", "sm90ws", "float16", 256, "func", 1, "f32"),
]


@pytest.mark.parametrize("direction,impl,dtype,head_dim,mask,h_rab,rab_dt",
                         [pytest.param(*c, marks=pytest.mark.ablation) if ":" in c[1] else c
                          for c in RAB_LOWER],
                         ids=["-".join(map(str, c)) for c in RAB_LOWER])
def test_hstu_rab_lowers(direction, impl, dtype, head_dim, mask, h_rab, rab_dt):
    import jax_sparse_attn as jsa  # noqa: PLC0415
    from jax_sparse_attn.config import Switches  # noqa: PLC0415

    dt = jnp.dtype(dtype)
    ws = impl.partition(":")[2]
    mk = 201
    q = jax.ShapeDtypeStruct((T, 2, head_dim), dt)
    cu = jax.ShapeDtypeStruct((B + 1,), jnp.int32)
    rab = jax.ShapeDtypeStruct((B, h_rab, mk, mk), dt if rab_dt == "q" else jnp.float32)
    func = jax.ShapeDtypeStruct((1, 3, T + 256), jnp.int32) if mask == "func" else None
    window = (-1, -1) if mask == "func" else (-1, 0)

    def fwd(q, k, v, cu, func, rab):
        return jsa.hstu_attention(q, k, v, cu, cu, max_seqlen_q=mk, max_seqlen_k=mk,
                                  window_size=window, alpha=0.3, func=func, backend="kernel",
                                  rab=rab, switches=Switches(hstu_fwd_impl=impl.split(":")[0],
                                                             hstu_fwd_ws=ws))

    if direction == "fwd":
        txt = _lower(fwd, q, q, q, cu, func, rab)
    else:
        def loss(q, k, v, cu, func, rab):
            return jnp.sum(fwd(q, k, v, cu, func, rab).astype(jnp.float32))

        txt = _lower(jax.grad(loss, argnums=(0, 1, 2, 5)), q, q, q, cu, func, rab)
    assert _attention_calls(txt) == 1 and "\\7FELF" in txt


# the sm90 backward with rab (the default at D = D_v in {64, 128}): D 64 (128 x 128 tiles) and 128
# (64 x 128), H_rab = 1 (fp32 workspace + red.add) and H_rab = H (direct stores), rab in
# q's dtype and in float32, causal / local window / func masks, deterministic=True (per-head
# drab workspace, ordered dq additions); an odd max_seqlen_k (201)
RAB_SM90_BWD_LOWER = [
    (128, "bfloat16", "causal", 2, "f32", False),
    (128, "float16", "func", 1, "q", False),
    (64, "bfloat16", "window", 1, "f32", False),
    (64, "float16", "causal", 2, "q", False),
    (128, "bfloat16", "window", 1, "f32", True),
    (64, "bfloat16", "func", 2, "q", True),
]


@pytest.mark.parametrize("head_dim,dtype,mask,h_rab,rab_dt,det", RAB_SM90_BWD_LOWER,
                         ids=["-".join(map(str, c[:5])) + ("-det" if c[5] else "")
                              for c in RAB_SM90_BWD_LOWER])
def test_hstu_rab_bwd_sm90_lowers(head_dim, dtype, mask, h_rab, rab_dt, det):
    """The backward with rab lowers to the sm90 kernel (and the dq tile reordering kernel),
    not the sm80 one; with the hstu_bwd_ws flag "rabsm80" to the sm80 one."""
    import jax_sparse_attn as jsa  # noqa: PLC0415
    from jax_sparse_attn.config import Switches  # noqa: PLC0415

    dt = jnp.dtype(dtype)
    mk = 201
    q = jax.ShapeDtypeStruct((T, 2, head_dim), dt)
    cu = jax.ShapeDtypeStruct((B + 1,), jnp.int32)
    rab = jax.ShapeDtypeStruct((B, h_rab, mk, mk), dt if rab_dt == "q" else jnp.float32)
    func = jax.ShapeDtypeStruct((1, 3, T + 256), jnp.int32) if mask == "func" else None

    def loss(q, k, v, cu, func, rab):
        out = jsa.hstu_attention(q, k, v, cu, cu, max_seqlen_q=mk, max_seqlen_k=mk,
                                 window_size=_BWD_WINDOWS[mask], alpha=0.3, func=func,
                                 backend="kernel", rab=rab, deterministic=det,
                                 switches=sw)
        return jnp.sum(out.astype(jnp.float32))

    sw = Switches()
    txt = _lower(jax.grad(loss, argnums=(0, 1, 2, 5)), q, q, q, cu, func, rab)
    assert _attention_calls(txt) == 1 and "\\7FELF" in txt
    assert "HstuBwdSm90" in txt and "HstuBwdSm80" not in txt
    assert _DQ_TILES_KERNEL in txt
    if head_dim == 128 and not det:  # the same call with the flag: sm80
        sw = Switches(hstu_bwd_ws="rabsm80")
        txt = _lower(jax.grad(loss, argnums=(0, 1, 2, 5)), q, q, q, cu, func, rab)
        assert "HstuBwdSm80" in txt and "HstuBwdSm90" not in txt



@pytest.mark.parametrize("empty", ["max_seqlen_k_0", "batch_0"])
def test_hstu_rab_bwd_sm90_empty_rab_lowers(empty):
    """A bias without elements (max_seqlen_k = 0, or no sequence)
    takes the backward launch without the bias, whose sm90 kernel then has no bias either
    (the compile key still records it)."""
    import jax_sparse_attn as jsa  # noqa: PLC0415
    from jax_sparse_attn.config import Switches  # noqa: PLC0415

    q = jax.ShapeDtypeStruct((T, 2, 128), jnp.bfloat16)
    if empty == "max_seqlen_k_0":
        cu, mk = jax.ShapeDtypeStruct((B + 1,), jnp.int32), 0
        rab = jax.ShapeDtypeStruct((B, 1, 0, 0), jnp.float32)
    else:
        cu, mk = jax.ShapeDtypeStruct((1,), jnp.int32), 64
        rab = jax.ShapeDtypeStruct((0, 1, mk, mk), jnp.float32)

    def loss(q, k, v, cu, rab):
        out = jsa.hstu_attention(q, k, v, cu, cu, max_seqlen_q=64, max_seqlen_k=mk,
                                 window_size=(-1, 0), alpha=0.3, backend="kernel", rab=rab,
                                 switches=Switches())
        return jnp.sum(out.astype(jnp.float32))

    txt = _lower(jax.grad(loss, argnums=(0, 1, 2, 4)), q, q, q, cu, rab)
    assert "HstuBwdSm90" in txt and "HstuBwdSm80" not in txt

def test_hstu_rab_keeps_the_selected_forward():
    """Both forwards have the bias: with rab the compile key keeps the selected forward
    (sm90ws by default, with its tiles and variants; sm80 with its tiles); the rab presence,
    H_rab == H and rab's dtype are part of both compile keys; a tile override with sm90ws is
    an error with rab as without."""
    import dataclasses  # noqa: PLC0415

    from jax_sparse_attn import config  # noqa: PLC0415
    from jax_sparse_attn.ffi import hstu as fh  # noqa: PLC0415

    assert set(fh.RAB_FWD_IMPLS) == {"sm90ws", "sm80"}
    sw = config.Switches()
    assert sw.hstu_fwd_impl == "sm90ws"
    key = fh.fwd_config("bfloat16", 64, 64, 0, sw, has_rab=True, rab_per_head=True,
                        rab_dtype="float32")
    assert key.impl == "sm90ws" and key.has_rab and key.rab_per_head
    assert key.rab_dtype == "float32"
    # without rab the D = 64 forward scales Q in shared memory (qscale: h = (alpha s + rab)
    # / 2 needs the per-score multiply with rab)
    assert not key.ws_q_scale
    assert dataclasses.replace(key, has_rab=False, rab_per_head=False, rab_dtype="",
                               ws_q_scale=True) == fh.fwd_config("bfloat16", 64, 64, 0, sw)
    ws = fh.fwd_config("bfloat16", 64, 64, 0, config.Switches(hstu_fwd_ws="silu16,bn=64"),
                       has_rab=True, rab_dtype="bfloat16")
    assert (ws.impl, ws.block_n, ws.ws_silu16, ws.has_rab) == ("sm90ws", 64, True, True)
    with pytest.raises(ValueError, match="JAX_SPARSE_ATTN_HSTU_FWD_TILE"):
        fh.fwd_config("bfloat16", 64, 64, 0, config.Switches(hstu_fwd_tile=(64, 64, 4)),
                      has_rab=True, rab_dtype="float32")
    explicit = fh.fwd_config("bfloat16", 64, 64, 0, config.Switches(hstu_fwd_impl="sm80"),
                             has_rab=True, rab_dtype="float32")
    assert explicit.impl == "sm80" and explicit.has_rab and not explicit.rab_per_head
    assert (explicit.block_m, explicit.block_n, explicit.num_warps) == (128, 64, 4)
    base = fh.fwd_config("bfloat16", 64, 64, 0, config.Switches())
    assert base.impl == "sm90ws" and not base.has_rab
    assert base != dataclasses.replace(base, has_rab=True)
    assert key != fh.fwd_config("bfloat16", 64, 64, 0, sw, has_rab=True, rab_dtype="bfloat16")
    b0 = fh.bwd_config("bfloat16", 64, 64, 0, config.Switches())
    b1 = fh.bwd_config("bfloat16", 64, 64, 0, config.Switches(), has_rab=True,
                       rab_per_head=True, rab_dtype="bfloat16")
    assert not b0.has_rab and b1.has_rab and b1.rab_per_head and b0 != b1


# the sm90 backward (hstu_bwd_impl="sm90", the default): every head dim, both dtypes, window /
# causal / func masks; D = 64 runs 128 x 128 tiles, D = 128 64 x 128 tiles, D = 256 64 x 64
BWD_SM90_LOWER = [(128, "bfloat16", "causal"), (64, "float16", "func"),
                  (128, "float16", "window"), (64, "bfloat16", "full"),
                  (256, "float16", "func"), (256, "bfloat16", "window")]
_BWD_WINDOWS = {"causal": (-1, 0), "func": (-1, -1), "window": (63, 17), "full": (-1, -1)}


def _bwd_text(head_dim, dtype, mask, switches, head_dim_v=None, lq=None, deterministic=False):
    """The lowered text of jax.grad through the public op (kernel backend); ``lq`` rows of q
    (default T: L_q = L_k)."""
    import jax_sparse_attn as jsa  # noqa: PLC0415

    dt = jnp.dtype(dtype)
    q = jax.ShapeDtypeStruct((lq or T, 2, head_dim), dt)
    k = jax.ShapeDtypeStruct((T, 2, head_dim), dt)
    v = jax.ShapeDtypeStruct((T, 2, head_dim_v or head_dim), dt)
    cu = jax.ShapeDtypeStruct((B + 1,), jnp.int32)
    func = jax.ShapeDtypeStruct((1, 3, (lq or T) + 256), jnp.int32) if mask == "func" else None

    def loss(q, k, v, cu_q, cu_k, func):
        out = jsa.hstu_attention(q, k, v, cu_q, cu_k, max_seqlen_q=200, max_seqlen_k=200,
                                 window_size=_BWD_WINDOWS[mask], alpha=0.3, func=func,
                                 backend="kernel", switches=switches,
                                 deterministic=deterministic)
        return jnp.sum(out.astype(jnp.float32))

    return _lower(jax.grad(loss, argnums=(0, 1, 2)), q, k, v, cu, cu, func)


def _rab_fwd_text(head_dim, h_rab, rab_dtype, switches):
    """The lowered text of the forward with a relative attention bias (bf16, causal,
    max_seqlen 201)."""
    import jax_sparse_attn as jsa  # noqa: PLC0415

    mk = 201
    q = jax.ShapeDtypeStruct((T, 2, head_dim), jnp.bfloat16)
    cu = jax.ShapeDtypeStruct((B + 1,), jnp.int32)
    rab = jax.ShapeDtypeStruct((B, h_rab, mk, mk), jnp.dtype(rab_dtype))

    def fwd(q, k, v, cu, rab):
        return jsa.hstu_attention(q, k, v, cu, cu, max_seqlen_q=mk, max_seqlen_k=mk,
                                  window_size=(-1, 0), alpha=0.3, backend="kernel", rab=rab,
                                  switches=switches)

    return _lower(fwd, q, q, q, cu, rab)


def _rab_bwd_text(head_dim, h_rab, rab_dtype, switches):
    """The lowered text of jax.grad through the public op with a relative attention bias
    (bf16, causal, max_seqlen 201; d rab too)."""
    import jax_sparse_attn as jsa  # noqa: PLC0415

    mk = 201
    q = jax.ShapeDtypeStruct((T, 2, head_dim), jnp.bfloat16)
    cu = jax.ShapeDtypeStruct((B + 1,), jnp.int32)
    rab = jax.ShapeDtypeStruct((B, h_rab, mk, mk), jnp.dtype(rab_dtype))

    def loss(q, k, v, cu, rab):
        out = jsa.hstu_attention(q, k, v, cu, cu, max_seqlen_q=mk, max_seqlen_k=mk,
                                 window_size=(-1, 0), alpha=0.3, backend="kernel", rab=rab,
                                 switches=switches)
        return jnp.sum(out.astype(jnp.float32))

    return _lower(jax.grad(loss, argnums=(0, 1, 2, 4)), q, q, q, cu, rab)


@pytest.mark.parametrize("head_dim,dtype,mask", BWD_SM90_LOWER,
                         ids=["-".join(map(str, c)) for c in BWD_SM90_LOWER])
def test_hstu_bwd_sm90_lowers(head_dim, dtype, mask):
    from jax_sparse_attn.config import Switches  # noqa: PLC0415

    txt = _bwd_text(head_dim, dtype, mask, Switches(hstu_bwd_impl="sm90"))
    assert _attention_calls(txt) == 1 and "\\7FELF" in txt


@pytest.mark.ablation
def test_hstu_bwd_sm90_dq_bulk_lowers():
    """The sm90 backward with dQ staged in shared memory and added by bulk reduce-adds
    (hstu_bwd_dq="bulk") lowers; the compile key carries the choice."""
    from jax_sparse_attn.config import Switches  # noqa: PLC0415
    from jax_sparse_attn.ffi import hstu as fh  # noqa: PLC0415

    sw = Switches(hstu_bwd_impl="sm90", hstu_bwd_dq="bulk")
    assert fh.bwd_config("bfloat16", 128, 128, 0, sw).dq_bulk
    assert not fh.bwd_config("bfloat16", 128, 128, 0, Switches(hstu_bwd_impl="sm90")).dq_bulk
    txt = _bwd_text(64, "bfloat16", "window", sw)
    assert _attention_calls(txt) == 1 and "\\7FELF" in txt


def test_hstu_bwd_sm90_lowers_lq_ne_lk():
    """L_q != L_k (fewer query rows than keys) with a window: one configuration."""
    from jax_sparse_attn.config import Switches  # noqa: PLC0415

    txt = _bwd_text(128, "bfloat16", "window", Switches(hstu_bwd_impl="sm90"), lq=170)
    assert _attention_calls(txt) == 1 and "\\7FELF" in txt


def test_hstu_bwd_sm90_config_routes_to_sm80():
    """hstu_bwd_impl="sm90" puts the sm90 kernel in the compile key for D = D_v in
    {64, 128, 256} without rab and D = D_v in {64, 128} with rab; D = 32, D != D_v and rab
    at D = 256 run sm80 (the key records the replaced switch value); the sm80 tile override with sm90 is a ValueError naming the
    switch."""
    from jax_sparse_attn.config import Switches  # noqa: PLC0415
    from jax_sparse_attn.ffi import hstu as fh  # noqa: PLC0415

    sw = Switches(hstu_bwd_impl="sm90")
    assert Switches().hstu_bwd_impl == "sm90"  # the default
    k128 = fh.bwd_config("bfloat16", 128, 128, 0, sw)
    assert (k128.impl, k128.block_m, k128.block_n, k128.replaced_impl) == ("sm90", 64, 128, "")
    k64 = fh.bwd_config("float16", 64, 64, 3, sw)
    assert (k64.impl, k64.block_m, k64.has_func, k64.func_n) == ("sm90", 128, True, 3)
    k256 = fh.bwd_config("bfloat16", 256, 256, 0, Switches(hstu_bwd_impl="sm90",
                                                           hstu_bwd_dq="bulk"))
    # D = 256: 64 x 64 tiles; bulk (rows staged in shared memory) becomes red there
    assert (k256.impl, k256.block_m, k256.block_n, k256.dq_bulk) == ("sm90", 64, 64, False)
    for d, dv, rab in ((32, 32, False), (128, 256, False), (64, 128, False), (256, 256, True)):
        key = fh.bwd_config("bfloat16", d, dv, 0, sw, has_rab=rab,
                            rab_dtype="bfloat16" if rab else "")
        assert (key.impl, key.replaced_impl) == ("sm80", "sm90"), (d, dv, rab)
        assert fh.bwd_sm90_unsupported_reason(d, dv, rab)
    assert fh.bwd_config("bfloat16", 128, 128, 0, Switches()).impl == "sm90"
    assert fh.bwd_config("bfloat16", 128, 128, 0, Switches(hstu_bwd_impl="sm80")).impl == "sm80"
    with pytest.raises(ValueError, match="JAX_SPARSE_ATTN_HSTU_BWD_TILE"):
        fh.bwd_config("bfloat16", 128, 128, 0, Switches(hstu_bwd_impl="sm90",
                                                        hstu_bwd_tile=(64, 64, 8)))
    # routed configurations keep honouring the sm80 tile override
    assert fh.bwd_config("bfloat16", 32, 32, 0, Switches(
        hstu_bwd_impl="sm90", hstu_bwd_tile=(64, 64, 8))).block_n == 64


# ---------------------------------------------------------- inference: GQA/MQA, paged KV
GQA_LOWER = [("fwd", "bfloat16", 128, 4, "causal", 0), ("fwd", "float16", 64, 8, "func", 0),
             ("bwd", "bfloat16", 128, 2, "causal", 0), ("bwd", "float16", 64, 8, "window", 0),
             ("bwd", "bfloat16", 128, 4, "causal", 1), ("bwd", "float16", 64, 8, "func", 8)]


@pytest.mark.parametrize("direction,dtype,head_dim,ratio,mask,h_rab", GQA_LOWER,
                         ids=["-".join(map(str, c[:5])) + (f"-rab{c[5]}" if c[5] else "")
                              for c in GQA_LOWER])
def test_hstu_gqa_lowers(direction, dtype, head_dim, ratio, mask, h_rab):
    """Grouped KV heads (8 query heads, 8 / ratio KV heads; ratio 8 = MQA): the sm90ws forward
    and the sm90 backward (one custom call each), also with a relative attention bias of
    ``h_rab`` heads (fp32)."""
    import jax_sparse_attn as jsa  # noqa: PLC0415

    dt = jnp.dtype(dtype)
    q = jax.ShapeDtypeStruct((T, 8, head_dim), dt)
    k = jax.ShapeDtypeStruct((T, 8 // ratio, head_dim), dt)
    cu = jax.ShapeDtypeStruct((B + 1,), jnp.int32)
    func = jax.ShapeDtypeStruct((1, 3, T + 256), jnp.int32) if mask == "func" else None
    rab = jax.ShapeDtypeStruct((B, h_rab, 200, 200), jnp.float32) if h_rab else None

    def fwd(q, k, v, cu, func, rab):
        return jsa.hstu_attention(q, k, v, cu, cu, max_seqlen_q=200, max_seqlen_k=200,
                                  window_size=_BWD_WINDOWS[mask], func=func, rab=rab,
                                  backend="kernel")

    if direction == "fwd":
        txt = _lower(fwd, q, k, k, cu, func, rab)
    else:
        txt = _lower(jax.grad(lambda *a: jnp.sum(fwd(*a).astype(jnp.float32)),
                              argnums=(0, 1, 2)), q, k, k, cu, func, rab)
        assert "HstuBwdSm90" in txt and "HstuBwdSm80" not in txt
    assert _attention_calls(txt) == 1 and "\\7FELF" in txt


def test_hstu_gqa_on_sm80_raises_naming_the_switch():
    import jax_sparse_attn as jsa  # noqa: PLC0415
    from jax_sparse_attn.config import Switches  # noqa: PLC0415

    q = jnp.zeros((16, 4, 64), jnp.bfloat16)
    k = jnp.zeros((16, 2, 64), jnp.bfloat16)
    cu = jnp.asarray([0, 16], jnp.int32)
    for sw, name in ((Switches(hstu_fwd_impl="sm80"), "hstu_fwd_impl"),
                     (Switches(hstu_bwd_impl="sm80"), "hstu_bwd_impl")):
        with pytest.raises(NotImplementedError, match=name):
            jsa.hstu_attention(q, k, k, cu, cu, max_seqlen_q=16, max_seqlen_k=16,
                               backend="kernel", switches=sw)


PAGED_LOWER = [("bfloat16", 128, 4), ("float16", 64, 1), ("bfloat16", 256, 2),
               ("float16", 100, 2)]


@pytest.mark.parametrize("dtype,head_dim,h_kv", PAGED_LOWER,
                         ids=["-".join(map(str, c)) for c in PAGED_LOWER])
def test_hstu_paged_lowers(dtype, head_dim, h_kv):
    """The paged-KV forward (sm90ws with the page table; D = 256: two 64-key tiles per page;
    D = 100 is zero-padded to 128): one custom call, and its compile key is the paged one."""
    import jax_sparse_attn as jsa  # noqa: PLC0415

    dt = jnp.dtype(dtype)
    q = jax.ShapeDtypeStruct((40, 4, head_dim), dt)
    kv = jax.ShapeDtypeStruct((20, 2, 128, h_kv, head_dim), dt)
    cu = jax.ShapeDtypeStruct((5,), jnp.int32)
    ids = jax.ShapeDtypeStruct((18,), jnp.int32)

    def fwd(q, kv, ids, ptr, cu_q, cu_k):
        return jsa.hstu_attention(q, None, None, cu_q, cu_k, max_seqlen_q=20,
                                  max_seqlen_k=2000, paged_kv=kv, page_ids=ids,
                                  page_indptrs=ptr, backend="kernel")

    txt = _lower(fwd, q, kv, ids, cu, cu, cu)
    assert _attention_calls(txt) == 1 and "\\7FELF" in txt
    # the schedule kernel (paged mode) sanitises cu_seqlens and page_indptrs and builds the
    # tile schedule; the forward kernel clamps the page ids
    assert _SCHEDULE_KERNEL in txt


@pytest.mark.parametrize("cache_mapped", [False, True])
def test_hstu_paged_vmap_lowers(cache_mapped):
    """``jax.vmap`` of a paged call on the kernel path (3 items; a shared cache or one per
    item) folds into one call of the paged forward (the cute call has no batching rule);
    here at D = 256 (two 64-key tiles per page), MQA and 3 KV splits."""
    import jax_sparse_attn as jsa  # noqa: PLC0415

    dt = jnp.bfloat16
    q = jax.ShapeDtypeStruct((3, 40, 4, 256), dt)
    kv = jax.ShapeDtypeStruct(((3,) if cache_mapped else ()) + (20, 2, 128, 1, 256), dt)
    cu = jax.ShapeDtypeStruct((3, 5), jnp.int32)
    ids = jax.ShapeDtypeStruct((3, 18), jnp.int32)

    def fwd(q, kv, ids, ptr, cu_q, cu_k):
        return jsa.hstu_attention(q, None, None, cu_q, cu_k, max_seqlen_q=20,
                                  max_seqlen_k=2000, paged_kv=kv, page_ids=ids,
                                  page_indptrs=ptr, kv_splits=3, backend="kernel")

    axes = (0, 0 if cache_mapped else None, 0, 0, 0, 0)
    txt = _lower(jax.vmap(fwd, in_axes=axes), q, kv, ids, cu, cu, cu)
    assert _attention_calls(txt) == 1 and _SCHEDULE_KERNEL in txt and "\\7FELF" in txt


_XLA_METADATA_OPS = ("stablehlo.sort", "stablehlo.reduce_window", "stablehlo.scatter",
                     "stablehlo.clamp", "stablehlo.maximum", "stablehlo.minimum",
                     "stablehlo.gather", "stablehlo.concatenate")


@pytest.mark.parametrize("kv_splits", [1, 3])
def test_hstu_paged_metadata_in_one_launch(kv_splits):
    """A paged call lowers to two kernel launches (the schedule kernel and the forward) and
    no XLA metadata op with ``hstu_schedule="kernel"`` (the default): no sort, scan, scatter,
    gather, concatenation or clamp (split-KV adds only the elementwise sum of the partials);
    ``"xla"`` keeps the jnp schedule and the XLA page-id clip, and the forward's compile key
    says who clamps the page ids."""
    import jax_sparse_attn as jsa  # noqa: PLC0415
    from jax_sparse_attn.config import Switches  # noqa: PLC0415
    from jax_sparse_attn.ffi import hstu as fh  # noqa: PLC0415

    q = jax.ShapeDtypeStruct((40, 4, 128), jnp.bfloat16)
    kv = jax.ShapeDtypeStruct((20, 2, 128, 2, 128), jnp.bfloat16)
    cu = jax.ShapeDtypeStruct((5,), jnp.int32)
    ids = jax.ShapeDtypeStruct((18,), jnp.int32)
    texts = {}
    for sched in ("kernel", "xla"):
        def fwd(q, kv, ids, ptr, cu_q, cu_k, sched=sched):
            return jsa.hstu_attention(q, None, None, cu_q, cu_k, max_seqlen_q=20,
                                      max_seqlen_k=2000, paged_kv=kv, page_ids=ids,
                                      page_indptrs=ptr, backend="kernel", kv_splits=kv_splits,
                                      switches=Switches(hstu_schedule=sched))

        texts[sched] = _lower(fwd, q, kv, ids, cu, cu, cu)
        assert _attention_calls(texts[sched]) == 1
    txt = texts["kernel"]
    assert txt.count(_target()) == 2 and _SCHEDULE_KERNEL in txt
    assert not [op for op in _XLA_METADATA_OPS if op in txt], txt[:3000]
    assert _SCHEDULE_KERNEL not in texts["xla"]
    assert "stablehlo.sort" in texts["xla"] and "func.func private @clip" in texts["xla"]
    assert fh.fwd_config("bfloat16", 128, 128, 0, Switches(), paged=True).page_id_clamp
    assert not fh.fwd_config("bfloat16", 128, 128, 0, Switches(hstu_schedule="xla"),
                             paged=True).page_id_clamp
    assert not fh.fwd_config("bfloat16", 128, 128, 0, Switches()).page_id_clamp


def test_hstu_paged_page_prefetch_key():
    """``hstu_fwd_ws="pagepf"`` (opt-in): the paged forward's key has it, the default paged
    key not; contiguous calls ignore the option (their key is the default's; the lowering:
    :func:`test_hstu_paged_page_prefetch_lowers`)."""
    from jax_sparse_attn.config import Switches  # noqa: PLC0415
    from jax_sparse_attn.ffi import hstu as fh  # noqa: PLC0415

    sw = Switches(hstu_fwd_ws="pagepf")
    assert fh.fwd_config("bfloat16", 128, 128, 0, sw, paged=True).ws_page_prefetch
    assert not fh.fwd_config("bfloat16", 128, 128, 0, Switches(), paged=True).ws_page_prefetch
    assert fh.fwd_config("bfloat16", 128, 128, 0, sw) == fh.fwd_config(
        "bfloat16", 128, 128, 0, Switches())


@pytest.mark.ablation
def test_hstu_paged_page_prefetch_lowers():
    """``hstu_fwd_ws="pagepf"`` (the paged producer loads each KV tile's page id one tile
    ahead; the key: :func:`test_hstu_paged_page_prefetch_key`) compiles a paged forward of
    its own."""
    import jax_sparse_attn as jsa  # noqa: PLC0415
    from jax_sparse_attn.config import Switches  # noqa: PLC0415

    sw = Switches(hstu_fwd_ws="pagepf")
    q = jax.ShapeDtypeStruct((40, 4, 64), jnp.float16)
    kv = jax.ShapeDtypeStruct((20, 2, 128, 1, 64), jnp.float16)
    cu = jax.ShapeDtypeStruct((5,), jnp.int32)
    ids = jax.ShapeDtypeStruct((18,), jnp.int32)

    def fwd(q, kv, ids, ptr, cu_q, cu_k):
        return jsa.hstu_attention(q, None, None, cu_q, cu_k, max_seqlen_q=20,
                                  max_seqlen_k=2000, paged_kv=kv, page_ids=ids,
                                  page_indptrs=ptr, backend="kernel", switches=sw)

    txt = _lower(fwd, q, kv, ids, cu, cu, cu)
    assert _attention_calls(txt) == 1 and _SCHEDULE_KERNEL in txt


def test_hstu_fwd_smem_plan_and_q_alias_key():
    """The sm90ws forward's shared-memory plan at D = 128: by default 2 K/V stages, 2 Q
    stages and O in a buffer of its own; with ``hstu_fwd_ws="qalias"`` (opt-in) 3 K/V stages
    and one Q stage that O is staged in. The contiguous and the paged keys carry qalias, the
    default keys not (the lowering: :func:`test_hstu_q_alias_lowers`)."""
    from jax_sparse_attn.config import Switches  # noqa: PLC0415
    from jax_sparse_attn.ffi import hstu as fh  # noqa: PLC0415
    from jax_sparse_attn.kernels.hstu_fwd_sm90_ws import ws_smem_plan  # noqa: PLC0415

    assert ws_smem_plan(128, 128, 128) == (2, 2, False)
    assert ws_smem_plan(128, 128, 128, q_alias=True) == (3, 1, True)
    sw = Switches(hstu_fwd_ws="qalias")
    assert fh.fwd_config("bfloat16", 128, 128, 0, sw).ws_q_alias
    assert fh.fwd_config("bfloat16", 128, 128, 0, sw, paged=True).ws_q_alias
    assert not fh.fwd_config("bfloat16", 128, 128, 0, Switches()).ws_q_alias
    assert not fh.fwd_config("bfloat16", 128, 128, 0, Switches(), paged=True).ws_q_alias


@pytest.mark.ablation
def test_hstu_q_alias_lowers():
    """``hstu_fwd_ws="qalias"`` (the plan and the key:
    :func:`test_hstu_fwd_smem_plan_and_q_alias_key`): the contiguous and the paged forward
    lower with it."""
    import jax_sparse_attn as jsa  # noqa: PLC0415
    from jax_sparse_attn.config import Switches  # noqa: PLC0415

    sw = Switches(hstu_fwd_ws="qalias")
    q = jax.ShapeDtypeStruct((40, 4, 128), jnp.bfloat16)
    kv = jax.ShapeDtypeStruct((20, 2, 128, 2, 128), jnp.bfloat16)
    k = jax.ShapeDtypeStruct((300, 2, 128), jnp.bfloat16)
    cu = jax.ShapeDtypeStruct((5,), jnp.int32)
    ids = jax.ShapeDtypeStruct((18,), jnp.int32)
    kw = dict(max_seqlen_q=20, max_seqlen_k=2000, backend="kernel", switches=sw)
    txt = _lower(lambda q, kv, ids, ptr, cu_q, cu_k: jsa.hstu_attention(
        q, None, None, cu_q, cu_k, paged_kv=kv, page_ids=ids, page_indptrs=ptr, **kw),
        q, kv, ids, cu, cu, cu)
    assert _attention_calls(txt) == 1
    txt = _lower(lambda q, k, v, cu_q, cu_k: jsa.hstu_attention(q, k, v, cu_q, cu_k, **kw),
                 q, k, k, cu, cu)
    assert _attention_calls(txt) == 1


def test_hstu_paged_config_and_routing():
    from jax_sparse_attn.config import Switches  # noqa: PLC0415
    from jax_sparse_attn.ffi import hstu as fh  # noqa: PLC0415

    key = fh.fwd_config("bfloat16", 128, 128, 0, Switches(), paged=True)
    assert key.paged and key.impl == "sm90ws" and key.block_n == 128
    assert key != fh.fwd_config("bfloat16", 128, 128, 0, Switches())
    assert "hstu_fwd_impl" in fh.paged_unsupported_reason(128, 128,
                                                          Switches(hstu_fwd_impl="sm80"))
    assert "bn=96" in fh.paged_unsupported_reason(128, 128, Switches(hstu_fwd_ws=("bn=96",)))
    with pytest.raises(NotImplementedError, match="hstu_fwd_impl"):
        fh.fwd_config("bfloat16", 128, 128, 0, Switches(hstu_fwd_impl="sm80"), paged=True)


SPLIT_LOWER = [("bfloat16", 128, "causal", False), ("float16", 64, "func", False),
               ("bfloat16", 128, "window", True)]


@pytest.mark.parametrize("dtype,head_dim,mask,rab", SPLIT_LOWER,
                         ids=["-".join(map(str, c)) for c in SPLIT_LOWER])
def test_hstu_split_kv_lowers(dtype, head_dim, mask, rab):
    """Split-KV sm90ws forward (kv_splits=4: fp32 partials (4, T, H, D) + a fixed-order sum):
    one custom call; with a func mask and with rab too."""
    import jax_sparse_attn as jsa  # noqa: PLC0415

    dt = jnp.dtype(dtype)
    q = jax.ShapeDtypeStruct((T, 4, head_dim), dt)
    # GQA (2 KV heads)
    k = jax.ShapeDtypeStruct((T, 2, head_dim), dt)
    cu = jax.ShapeDtypeStruct((B + 1,), jnp.int32)
    func = jax.ShapeDtypeStruct((1, 3, T + 256), jnp.int32) if mask == "func" else None
    r = jax.ShapeDtypeStruct((B, 1, 200, 200), jnp.float32) if rab else None

    def fwd(q, k, v, cu, func, r):
        return jsa.hstu_attention(q, k, v, cu, cu, max_seqlen_q=200, max_seqlen_k=200,
                                  window_size=_BWD_WINDOWS[mask], func=func, rab=r,
                                  kv_splits=4, backend="kernel")

    txt = _lower(fwd, q, k, k, cu, func, r)
    assert _attention_calls(txt) == 1 and "\\7FELF" in txt


def test_hstu_split_kv_config():
    """kv_splits reaches the sm90ws compile key ("auto": split only below one wave)."""
    from jax_sparse_attn import hstu  # noqa: PLC0415
    from jax_sparse_attn.config import Switches  # noqa: PLC0415

    def cfg(b, lq, lk, kv_splits, paged=False, sw=None):
        q = jax.ShapeDtypeStruct((b * lq, 4, 128), jnp.bfloat16)
        k = jax.ShapeDtypeStruct((b * lk, 4, 128), jnp.bfloat16)
        cu = jax.ShapeDtypeStruct((b + 1,), jnp.int32)
        kv = jax.ShapeDtypeStruct((b * (-(-lk // 128)), 2, 128, 4, 128), jnp.bfloat16)
        ids = jax.ShapeDtypeStruct((kv.shape[0],), jnp.int32)
        got = []

        def trace(q, k, cu, kv, ids):  # traced metadata: no eager value checks
            got.append(hstu._make_config(
                q, None if paged else k, None if paged else k, cu, cu, None,
                kv if paged else None, ids if paged else None, cu if paged else None,
                max_seqlen_q=lq, max_seqlen_k=lk, scaling_seqlen=None, window_size=(-1, 0),
                alpha=1.0, backend="kernel", switches=sw, op_name="t", kv_splits=kv_splits))
            return q

        jax.eval_shape(trace, q, k, cu, kv, ids)
        return got[0]

    assert cfg(8, 1, 8192, "auto").fwd.kv_splits == 4
    assert cfg(8, 1, 8192, "auto", paged=True).fwd.kv_splits == 4
    assert cfg(64, 1, 8192, "auto").fwd.kv_splits == 1
    assert cfg(64, 1, 8192, 6).fwd.kv_splits == 6
    assert cfg(8, 1, 8192, 6, sw=Switches(hstu_fwd_impl="sm80")).fwd.kv_splits == 1


# deterministic=True (ordered dq additions): the sm90 backward (both head dims, causal /
# window / func) and the sm80 backward it routes other configurations to (D = 32, 256, rab
# with H_rab = 1 and per head)
DET_LOWER = [(128, "bfloat16", "causal", 0), (64, "float16", "func", 0),
             (256, "bfloat16", "func", 0), (32, "float16", "window", 0),
             (128, "bfloat16", "causal", 1), (64, "float16", "func", 2)]


@pytest.mark.parametrize("head_dim,dtype,mask,h_rab", DET_LOWER,
                         ids=["-".join(map(str, c)) for c in DET_LOWER])
def test_hstu_bwd_deterministic_lowers(head_dim, dtype, mask, h_rab):
    """Every deterministic configuration lowers to one attention kernel call. The tile
    schedule comes from the schedule kernel except with func masks and, for the sm90
    backward, windows with a finite left edge (their longest-first order is not ascending per
    sequence: the jnp schedule with the deterministic sort key)."""
    from jax_sparse_attn.config import Switches  # noqa: PLC0415

    if not h_rab:
        txt = _bwd_text(head_dim, dtype, mask, Switches(), deterministic=True)
        assert _attention_calls(txt) == 1 and "\\7FELF" in txt
        sm90 = head_dim in (64, 128)
        want_sched = mask in ("causal", "full") or (mask == "window" and not sm90)
        assert (_SCHEDULE_KERNEL in txt) == want_sched, (head_dim, mask)
        return
    import jax_sparse_attn as jsa  # noqa: PLC0415

    dt = jnp.dtype(dtype)
    q = jax.ShapeDtypeStruct((T, 2, head_dim), dt)
    cu = jax.ShapeDtypeStruct((B + 1,), jnp.int32)
    rab = jax.ShapeDtypeStruct((B, h_rab, 201, 201), jnp.float32)
    func = jax.ShapeDtypeStruct((1, 3, T + 256), jnp.int32) if mask == "func" else None

    def loss(q, k, v, cu, func, rab):
        out = jsa.hstu_attention(q, k, v, cu, cu, max_seqlen_q=201, max_seqlen_k=201,
                                 window_size=_BWD_WINDOWS[mask], alpha=0.3, func=func, rab=rab,
                                 backend="kernel", deterministic=True)
        return jnp.sum(out.astype(jnp.float32))

    txt = _lower(jax.grad(loss, argnums=(0, 1, 2, 5)), q, q, q, cu, func, rab)
    assert _attention_calls(txt) == 1 and "\\7FELF" in txt


def test_hstu_bwd_sm90_order_and_dq_keys():
    """The sm90 backward's compile key carries the launch order (hstu_bwd_order: auto, the
    default, is hlpt here; lpt and seq keys of their own) and the 16-byte dQ reduction
    (hstu_bwd_dq="red4", in both modes; not in the default key). The lowering:
    :func:`test_hstu_bwd_sm90_order_and_dq_variants`."""
    from jax_sparse_attn.config import Switches  # noqa: PLC0415
    from jax_sparse_attn.ffi import hstu as fh  # noqa: PLC0415

    assert Switches().hstu_bwd_order == "auto"
    keys = {o: fh.bwd_config("bfloat16", 128, 128, 0, Switches(hstu_bwd_order=o))
            for o in ("auto", "hlpt", "lpt", "seq")}
    assert {k.bwd_order for k in keys.values()} == {"hlpt", "lpt", "seq"}
    assert len(set(keys.values())) == 3 and keys["auto"] == keys["hlpt"]
    red4 = fh.bwd_config("bfloat16", 64, 64, 0, Switches(hstu_bwd_dq="red4"))
    assert red4.dq_vec4 and not red4.dq_bulk
    assert not fh.bwd_config("bfloat16", 64, 64, 0, Switches()).dq_vec4
    det = fh.bwd_config("bfloat16", 128, 128, 0, Switches(hstu_bwd_dq="red4"),
                        deterministic=True)
    assert det.deterministic and det.dq_vec4


@pytest.mark.ablation
def test_hstu_bwd_sm90_order_and_dq_variants():
    """The sm90 backward's launch orders (hstu_bwd_order lpt, seq; head-major grid for
    seq, the schedule sorted for lpt) and the 16-byte dQ reduction (hstu_bwd_dq="red4")
    lower (their keys: :func:`test_hstu_bwd_sm90_order_and_dq_keys`)."""
    from jax_sparse_attn.config import Switches  # noqa: PLC0415

    for d, mask, sw in ((128, "causal", Switches(hstu_bwd_order="lpt", hstu_bwd_dq="red4")),
                        (64, "func", Switches(hstu_bwd_order="seq")),
                        (256, "window", Switches(hstu_bwd_dq="red4"))):
        txt = _bwd_text(d, "bfloat16", mask, sw)
        assert _attention_calls(txt) == 1 and "\\7FELF" in txt


def test_hstu_bwd_sm90_auto_order_and_chunks():
    """hstu_bwd_order="auto" resolves to lpt for the deterministic backward at D <= 64 and
    (tests/test_config.py) for a bias shared by the heads, to hlpt elsewhere (an explicit
    order stays); hstu_bwd_ws "chunk=N" sets the hlpt
    schedule's chunk size (KiB; ignored by lpt / seq), and the chunked schedule launch takes
    the query rows per chunk as its seventh parameter."""
    from jax_sparse_attn.config import Switches, from_env  # noqa: PLC0415
    from jax_sparse_attn.ffi import hstu as fh  # noqa: PLC0415

    def key(d, det=False, **sw):
        return fh.bwd_config("bfloat16", d, d, 0, Switches(**sw), deterministic=det)

    assert key(64, det=True).bwd_order == "lpt"
    assert key(64).bwd_order == "hlpt"
    assert key(128, det=True).bwd_order == key(256, det=True).bwd_order == "hlpt"
    assert key(64, det=True, hstu_bwd_order="hlpt").bwd_order == "hlpt"
    assert key(128).sched_chunk_kib == fh.BWD_SCHEDULE_CHUNK_KIB
    assert key(128, hstu_bwd_ws=("chunk=4096",)).sched_chunk_kib == 4096
    assert key(128, hstu_bwd_ws=("chunk=0",)).sched_chunk_kib == 0
    for order in ("lpt", "seq"):
        assert key(128, hstu_bwd_order=order, hstu_bwd_ws=("chunk=4096",)).sched_chunk_kib == 0
    k = key(128, hstu_bwd_ws=("chunk=4096",))
    # Q and dO (2 x 128 x 2 bytes) and fp32 dq (128 x 4 bytes) per query row of one head
    assert fh.bwd_tokens_per_chunk(k) == 4096 * 1024 // 1024
    with pytest.raises(ValueError, match="chunk"):
        from_env({"JAX_SPARSE_ATTN_HSTU_BWD_WS": "chunk=-1"})

    pytest.importorskip("cutlass")
    txt = _bwd_text(128, "bfloat16", "causal", Switches(hstu_bwd_ws=("chunk=1",)))
    assert _attention_calls(txt) == 1 and "\\7FELF" in txt
    # the backward schedule's parameter: [T_q, T_k, left, right, slots, pow2, rows per
    # chunk] (1 KiB: one row); the forward's chunked schedule has its own seventh entry
    assert re.search(r"dense<\[300, 300, -1, 0, \d+, \d+, 1\]> : tensor<7xi32>", txt), txt[:0]


def test_hstu_bwd_sm90_wg_skip_key():
    """hstu_bwd_ws "wgskip" (D = 128 only: 64-query tiles): the key carries wg_skip, in
    both modes (PTX: test_hstu_bwd_sm90_wg_skip_ptx)."""
    from jax_sparse_attn.config import Switches  # noqa: PLC0415
    from jax_sparse_attn.ffi import hstu as fh  # noqa: PLC0415

    sw = Switches(hstu_bwd_ws=("wgskip",))
    assert fh.bwd_config("bfloat16", 128, 128, 0, sw).wg_skip
    assert fh.bwd_config("bfloat16", 128, 128, 0, sw, deterministic=True).wg_skip
    assert not fh.bwd_config("bfloat16", 128, 128, 0, Switches(hstu_bwd_ws=())).wg_skip
    for d in (64, 256):
        assert not fh.bwd_config("bfloat16", d, d, 0, sw).wg_skip


def test_hstu_bwd_sm90_rev_heads_key():
    """hstu_bwd_ws "revheads" (opt-in; the dQ tile workspace only): the key carries
    dq_rev_heads in both modes, the default key not, nor with hstu_bwd_dq="red" (the
    lowering: :func:`test_hstu_bwd_sm90_rev_heads_lowering`)."""
    from jax_sparse_attn.config import Switches  # noqa: PLC0415
    from jax_sparse_attn.ffi import hstu as fh  # noqa: PLC0415

    sw = Switches(hstu_bwd_ws=("revheads",))
    for d in (64, 128, 256):
        assert fh.bwd_config("bfloat16", d, d, 0, sw).dq_rev_heads
        assert fh.bwd_config("bfloat16", d, d, 0, sw, deterministic=True).dq_rev_heads
        assert not fh.bwd_config("bfloat16", d, d, 0, Switches(hstu_bwd_ws=())).dq_rev_heads
    assert not fh.bwd_config("bfloat16", 128, 128, 0,
                             Switches(hstu_bwd_ws=("revheads",), hstu_bwd_dq="red")).dq_rev_heads


@pytest.mark.ablation
def test_hstu_bwd_sm90_rev_heads_lowering():
    """hstu_bwd_ws "revheads" (the key: :func:`test_hstu_bwd_sm90_rev_heads_key`): the
    backward with its reordering kernel lowers in both modes."""
    from jax_sparse_attn.config import Switches  # noqa: PLC0415

    sw = Switches(hstu_bwd_ws=("revheads",))
    pytest.importorskip("cutlass")
    for det in (False, True):
        txt = _bwd_text(128, "bfloat16", "causal", sw, deterministic=det)
        assert _attention_calls(txt) == 1 and "\\7FELF" in txt and _DQ_TILES_KERNEL in txt


def test_hstu_bwd_sm90_epi_smem_key_and_lowering():
    """The sm90 backward stages dK / dV through shared memory by default at D <= 128 (the key
    carries epi_smem in both modes); hstu_bwd_ws "epiregs" or "epi16" store them from
    registers; D = 256 (split head dim) never stages. Both epilogues lower (PTX:
    test_hstu_bwd_sm90_epi_smem_ptx)."""
    from jax_sparse_attn.config import Switches  # noqa: PLC0415
    from jax_sparse_attn.ffi import hstu as fh  # noqa: PLC0415

    sw = Switches(hstu_bwd_ws=())
    for d in (64, 128):
        assert fh.bwd_config("bfloat16", d, d, 0, sw).epi_smem
        assert fh.bwd_config("bfloat16", d, d, 0, sw, deterministic=True).epi_smem
        for off in ("epiregs", "epi16"):
            assert not fh.bwd_config("bfloat16", d, d, 0, Switches(hstu_bwd_ws=(off,))).epi_smem
    assert not fh.bwd_config("bfloat16", 256, 256, 0, sw).epi_smem
    pytest.importorskip("cutlass")
    for s in (sw, Switches(hstu_bwd_ws=("epiregs",))):
        txt = _bwd_text(64, "bfloat16", "window", s)
        assert _attention_calls(txt) == 1 and "\\7FELF" in txt


def test_hstu_bwd_sm90_uniform_frags_key_and_lowering():
    """The sm90 backward partitions the consumers' shared-memory wgmma operands with the
    warpgroup's first thread by default (uniform descriptors); hstu_bwd_ws "thrfrags" keeps
    the per-thread partition. Both lower at D = 128 (two consumer warpgroups of 64 keys)."""
    from jax_sparse_attn.config import Switches  # noqa: PLC0415
    from jax_sparse_attn.ffi import hstu as fh  # noqa: PLC0415

    for d in (64, 128, 256):
        assert fh.bwd_config("bfloat16", d, d, 0, Switches()).uniform_frags
        assert not fh.bwd_config("bfloat16", d, d, 0,
                                 Switches(hstu_bwd_ws=("thrfrags",))).uniform_frags
    pytest.importorskip("cutlass")
    for s in (Switches(), Switches(hstu_bwd_ws=("thrfrags",))):
        txt = _bwd_text(128, "bfloat16", "window", s)
        assert _attention_calls(txt) == 1 and "\\7FELF" in txt


def test_hstu_bwd_sm90_dq_tile_key_and_lowering():
    """hstu_bwd_dq="tile": the key carries dq_tile at D = 64 / 128 / 256, also in the
    deterministic mode; the kernel lowers and its PTX adds each warp's dQ slice with one 4 KB
    bulk reduce-add at D <= 128 (PTX: the deterministic PTX test; D = 256:
    tests/test_lowering_hstu_bwd_d256.py)."""
    from jax_sparse_attn.config import Switches  # noqa: PLC0415
    from jax_sparse_attn.ffi import hstu as fh  # noqa: PLC0415

    sw = Switches(hstu_bwd_dq="tile")
    for d in (64, 128, 256):
        key = fh.bwd_config("bfloat16", d, d, 0, sw)
        assert key.dq_tile and not key.dq_bulk and not key.dq_vec4
    assert not fh.bwd_config("bfloat16", 256, 256, 0, Switches(hstu_bwd_dq="red")).dq_tile
    assert fh.bwd_config("bfloat16", 128, 128, 0, sw, deterministic=True).dq_tile
    assert fh.bwd_config("bfloat16", 128, 128, 0, Switches()).dq_tile  # the default
    assert not fh.bwd_config("bfloat16", 128, 128, 0, Switches(hstu_bwd_dq="red")).dq_tile
    # D = 128 (and its PTX): test_hstu_bwd_sm90_deterministic_ptx. The backward and the dq
    # reordering (kernels/hstu_dq_tiles.py)
    txt = _bwd_text(64, "bfloat16", "window", sw)
    assert _attention_calls(txt) == 1 and "\\7FELF" in txt
    assert _DQ_TILES_KERNEL in txt


# ------------------------------------------------------------ PTX (CUTE_DSL_KEEP=ptx)
# The PTX tests read the PTX kept by one fresh process that lowers every configuration below
# (tests/kept_ptx.py; after scripts/ws_ptx_hashes.py quick, for the hash test). name ->
# (function of this module, its positional arguments before the switches, Switches fields,
# keyword arguments)
_PTX_CONFIGS = {
    "fwd-128-0-bfloat16": ("_fwd_text", (128, 128, 0, "bfloat16"),
                           {"hstu_fwd_impl": "sm90ws"}, {}),
    "fwd-256-3-float16": ("_fwd_text", (256, 256, 3, "float16"),
                          {"hstu_fwd_impl": "sm90ws"}, {}),
    "fwd-64-0-bfloat16": ("_fwd_text", (64, 64, 0, "bfloat16"), {"hstu_fwd_impl": "sm90ws"}, {}),
    "fwd-128-0-bfloat16-noepivec": ("_fwd_text", (128, 128, 0, "bfloat16"),
                                    {"hstu_fwd_impl": "sm90ws", "hstu_fwd_ws": "noepivec"},
                                    {}),
    "fwd-128-0-bfloat16-notmao": ("_fwd_text", (128, 128, 0, "bfloat16"),
                                  {"hstu_fwd_impl": "sm90ws", "hstu_fwd_ws": "notmao"}, {}),
    "fwd-64-0-bfloat16-noqscale": ("_fwd_text", (64, 64, 0, "bfloat16"),
                                   {"hstu_fwd_impl": "sm90ws", "hstu_fwd_ws": "noqscale"}, {}),
    "bwd-128-bfloat16-causal": ("_bwd_text", (128, "bfloat16", "causal"),
                                {"hstu_bwd_impl": "sm90"}, {}),
    "bwd-256-bfloat16-causal": ("_bwd_text", (256, "bfloat16", "causal"),
                                {"hstu_bwd_impl": "sm90"}, {}),
    "bwd-128-bfloat16-causal-tile-default": ("_bwd_text", (128, "bfloat16", "causal"),
                                             {"hstu_bwd_dq": "tile"},
                                             {"deterministic": False}),
    "bwd-128-bfloat16-causal-epiregs": ("_bwd_text", (128, "bfloat16", "causal"),
                                        {"hstu_bwd_ws": "epiregs"}, {}),
    "bwd-128-rab1-float32": ("_rab_bwd_text", (128, 1, "float32"), {}, {}),
    "bwd-128-rab1-float32-slow": ("_rab_bwd_text", (128, 1, "float32"),
                                  {"hstu_bwd_ws": "norabfast,norabpf,nodrabs"}, {}),
    "bwd-128-rabh-bfloat16": ("_rab_bwd_text", (128, 2, "bfloat16"), {}, {}),
    "bwd-64-rab1-float32": ("_rab_bwd_text", (64, 1, "float32"), {}, {}),
    "fwd-128-rab1-float32": ("_rab_fwd_text", (128, 1, "float32"), {}, {}),
}
# the configurations of the ablation tests (opt-in variants), kept by kept_ptx_ablation; the
# defaults they compare with are read from kept_ptx
_PTX_ABLATION = {
    "bwd-128-bfloat16-causal-tile-deterministic": ("_bwd_text", (128, "bfloat16", "causal"),
                                                   {"hstu_bwd_dq": "tile",
                                                    "det_writer": False},
                                                   {"deterministic": True}),
    "bwd-128-bfloat16-causal-wgskip": ("_bwd_text", (128, "bfloat16", "causal"),
                                       {"hstu_bwd_ws": "wgskip"}, {}),
    "bwd-128-bfloat16-causal-writer": ("_bwd_text", (128, "bfloat16", "causal"),
                                       {"hstu_bwd_dq": "tile", "dq_writer": "on"}, {}),
    "bwd-128-bfloat16-causal-wghand": ("_bwd_text", (128, "bfloat16", "causal"),
                                       {"hstu_bwd_dq": "tile", "dq_writer": "on",
                                        "hstu_bwd_ws": "wghand"}, {}),
    "bwd-128-bfloat16-causal-qprobe": ("_bwd_text", (128, "bfloat16", "causal"),
                                       {"hstu_bwd_dq": "tile", "hstu_bwd_ws": "qprobe"},
                                       {"deterministic": False}),
    "bwd-64-bfloat16-window-wghand": ("_bwd_text", (64, "bfloat16", "window"),
                                      {"hstu_bwd_dq": "tile", "dq_writer": "on",
                                       "hstu_bwd_ws": "wghand"}, {}),
    "fwd-128-rab1-float32-rabpf": ("_rab_fwd_text", (128, 1, "float32"),
                                   {"hstu_fwd_ws": "rabpf"}, {}),
}


def _recorded_ws_hashes():
    """(CuTe DSL version, {configuration: sha256 prefix}) of tests/ws_ptx_sha256.txt."""
    tests = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(tests, "ws_ptx_sha256.txt")) as f:
        lines = f.read().splitlines()
    want = dict(ln.split(" ", 1) for ln in lines[1:] if ln and not ln.startswith("#"))
    return lines[0].split()[2], want


def _ws_hashes_apply():
    """Whether the installed CuTe DSL is the version the recorded hashes were made with."""
    import importlib.metadata  # noqa: PLC0415

    return importlib.metadata.version("nvidia-cutlass-dsl") == _recorded_ws_hashes()[0]


@pytest.fixture(scope="module")
def kept_ptx(tmp_path_factory):
    """The directory of the PTX kept while lowering :data:`_PTX_CONFIGS` (tests/kept_ptx.py)
    and, where the recorded hashes apply, ``first.txt``: the output of
    ``scripts/ws_ptx_hashes.py quick``, run first in that process."""
    if not _have_cutedsl():
        pytest.skip("CuTe DSL not importable")
    import kept_ptx as kp  # noqa: PLC0415

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    first = ((os.path.join(root, "scripts", "ws_ptx_hashes.py"), ["quick"])
             if _ws_hashes_apply() else None)
    return kp.keep_ptx_shared(tmp_path_factory, "test_lowering_hstu", "test_lowering_hstu",
                              _PTX_CONFIGS, first=first)


@pytest.fixture(scope="module")
def kept_ptx_ablation(tmp_path_factory):
    """The directory of the PTX kept while lowering :data:`_PTX_ABLATION` (the ablation
    tier's variants) in one fresh process."""
    if not _have_cutedsl():
        pytest.skip("CuTe DSL not importable")
    import kept_ptx as kp  # noqa: PLC0415

    return kp.keep_ptx_shared(tmp_path_factory, "test_lowering_hstu_ablation",
                              "test_lowering_hstu", _PTX_ABLATION)


def _kept(kept_ptx, name):
    """{file name: PTX text} kept while lowering the configuration ``name``."""
    import kept_ptx as kp  # noqa: PLC0415

    return kp.ptx_of(kept_ptx, name)


def _fwd_ptx(kept_ptx, name):
    """The PTX of the forward kernel kept for ``name`` (the tile-schedule kernel left out)."""
    files = _kept(kept_ptx, name)
    texts = [t for t in files.values() if _SCHEDULE_KERNEL not in t]
    assert len(texts) == 1, list(files)
    return texts[0]


def test_hstu_sm90ws_epivec_ptx(kept_ptx):
    """The default epilogue (``epivec``, as in the block-sparse forward): the 64 x 128 O
    slice of each consumer thread goes to shared memory as 32 packed 4-byte stores and
    comes back as 8 16-byte loads; ``hstu_fwd_ws=noepivec``'s element copies are 64 2-byte
    stores and 64 2-byte loads."""
    import re

    def shared_ops(name):
        ops = {}
        for m in re.finditer(r"\b(st|ld)\.shared\.([a-z0-9.]+)", _fwd_ptx(kept_ptx, name)):
            ops[m.group(0)] = ops.get(m.group(0), 0) + 1
        return ops

    vec, old = shared_ops("fwd-128-0-bfloat16-notmao"), shared_ops("fwd-128-0-bfloat16-noepivec")
    assert old.get("st.shared.b16") == 64 and old.get("ld.shared.b16") == 64, old
    assert not any(op.endswith(("b16", "u16")) for op in vec), vec
    assert vec.get("st.shared.b32", 0) == old.get("st.shared.b32", 0) + 32, (old, vec)
    assert vec.get("ld.shared.v4.b32", 0) == old.get("ld.shared.v4.b32", 0) + 8, (old, vec)


def test_hstu_sm90ws_tma_o_ptx(kept_ptx):
    """The default (``hstu_fwd_ws=tmao``): a query tile that ends inside its sequence stages O
    in the 128-byte-swizzled layout and one thread writes it with TMA tensor stores (two
    64-column boxes at D 128) as one bulk group, waited for (read) before the next staging,
    before the pair-store copy of a sequence's last tile and at exit (three waits); the copy
    keeps its 8 16-byte loads, and the staging has one set of 32 packed 4-byte stores more
    than ``hstu_fwd_ws=notmao``, which has no TMA store."""
    import re

    tma = _fwd_ptx(kept_ptx, "fwd-128-0-bfloat16")
    vec = _fwd_ptx(kept_ptx, "fwd-128-0-bfloat16-notmao")
    stores = re.findall(r"cp\.async\.bulk\.tensor\.3d\.global\.shared::cta\S*", tma)
    assert len(stores) == 2, stores
    assert tma.count("cp.async.bulk.commit_group") == 1
    assert tma.count("cp.async.bulk.wait_group.read") == 3
    assert "fence.proxy.async.shared::cta" in tma
    assert tma.count("ld.shared.v4.b32") == vec.count("ld.shared.v4.b32")
    assert tma.count("st.shared.b32") == vec.count("st.shared.b32") + 32
    assert "cp.async.bulk.tensor.3d.global.shared" not in vec


def test_hstu_sm90ws_qscale_ptx_drops_the_per_score_multiply(kept_ptx):
    """qscale, the default at D = 64, against hstu_fwd_ws=noqscale: the consumer warpgroups
    scale their Q slice once per item (two fp32 multiplies per 32-bit word of the 64 x 64
    slice, a fence for the async proxy and one more named barrier), and the score tiles lose
    their multiply by alpha / 2 (one per tanh)."""
    base = _fwd_ptx(kept_ptx, "fwd-64-0-bfloat16-noqscale")
    qs = _fwd_ptx(kept_ptx, "fwd-64-0-bfloat16")
    count = lambda t, needle: t.count(needle)  # noqa: E731
    tanh = count(base, "tanh.approx.f32")
    assert tanh > 0 and count(qs, "tanh.approx.f32") == tanh
    scale_muls = 2 * (64 * 64 // 2 // 128)
    assert count(qs, "mul.f32") <= count(base, "mul.f32") - tanh + scale_muls
    assert (count(qs, "fence.proxy.async.shared::cta")
            == count(base, "fence.proxy.async.shared::cta") + 1)
    assert count(qs, "cvt.rn.bf16x2.f32") >= count(base, "cvt.rn.bf16x2.f32") + scale_muls // 2


@pytest.mark.parametrize("head_dim,func_n,dtype", [(128, 0, "bfloat16"), (256, 3, "float16")])
def test_hstu_sm90ws_ptx_is_warp_specialized(kept_ptx, head_dim, func_n, dtype):
    """The sm90ws forward's PTX has TMA loads, warpgroup MMAs and register reallocation
    between the producer and the consumer warpgroups."""
    import re  # noqa: PLC0415

    text = _fwd_ptx(kept_ptx, f"fwd-{head_dim}-{func_n}-{dtype}")
    for needle in ("cp.async.bulk.tensor", "wgmma.mma_async", "setmaxnreg.dec",
                   "setmaxnreg.inc", "mbarrier.try_wait"):
        assert needle in text, f"{needle} missing from the sm90ws PTX"
    # programmatic dependent launch (the default Switches.pdl): the forward waits once for
    # the previous grid; the schedule kernel lets it launch at once and waits itself
    assert len(re.findall(r"griddepcontrol\.wait;", text)) == 1
    assert "griddepcontrol.launch_dependents" not in text
    sched = [t for t in _kept(kept_ptx, f"fwd-{head_dim}-{func_n}-{dtype}").values()
             if _SCHEDULE_KERNEL in t]
    # (a func mask takes the XLA schedule)
    assert len(sched) == (0 if func_n else 1)
    assert all("griddepcontrol.launch_dependents;" in t and "griddepcontrol.wait;" in t
               for t in sched)


@pytest.mark.parametrize("head_dim,n_wgmma", [(128, 32), (256, 44)])
def test_hstu_bwd_sm90_ptx_is_warp_specialized(kept_ptx, head_dim, n_wgmma):
    """The sm90 backward's PTX has TMA loads, warpgroup MMAs (S^T, dP^T, dV, dK, dQ per tile:
    32 at D = 128; 44 at D = 256, where S^T and dP^T are m64n32 slices over 16 k-steps),
    register reallocation between producer and consumers, mbarrier waits and the dQ
    reductions (the default hstu_bwd_dq="tile": bulk reduce-adds, with the dq reordering
    kernel), and no mma.sync."""
    import re  # noqa: PLC0415

    files = _kept(kept_ptx, f"bwd-{head_dim}-bfloat16-causal")
    texts = list(files.values())
    assert sum(_DQ_TILES_KERNEL in t for t in texts) == 1
    # without the tile-schedule kernel and the dq reordering kernel
    ptx = [t for t in texts if _SCHEDULE_KERNEL not in t and _DQ_TILES_KERNEL not in t]
    assert len(ptx) == 1, list(files)
    text = ptx[0]
    assert "HstuBwdSm90" in text
    dq_needle = "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32"
    for needle in ("cp.async.bulk.tensor", "setmaxnreg.dec", "setmaxnreg.inc",
                   "mbarrier.try_wait", dq_needle):
        assert needle in text, f"{needle} missing from the sm90 backward PTX"
    assert len(re.findall(r"wgmma\.mma_async", text)) == n_wgmma
    assert "mma.sync" not in text
    # programmatic dependent launch (the default): every kernel of the backward (schedule,
    # backward, dq reordering) waits for the previous grid
    assert len(re.findall(r"griddepcontrol\.wait;", text)) == 1
    assert all("griddepcontrol.wait;" in t for t in texts)


@pytest.mark.parametrize("det", [pytest.param(True, marks=pytest.mark.ablation), False],
                         ids=["deterministic", "default"])
def test_hstu_bwd_sm90_deterministic_ptx(request, det):
    """deterministic=True without the dQ writer warp (det_writer=False; with it:
    tests/test_lowering_det_writer.py): the sm90 backward's PTX spins on acquire loads,
    publishes with a GPU-scope fence + store, hands over between the spin warp and the
    consumers on named barriers 2 and 3. Both modes add dQ with hstu_bwd_dq="tile" (bulk reduce-adds of 16-byte
    shared-memory stores, no red.global.add; the deterministic mode waits for each one to
    complete) and run the dq reordering kernel; the default PTX has none of the semaphore
    code."""
    import re  # noqa: PLC0415

    mode = "deterministic" if det else "default"
    kept = request.getfixturevalue("kept_ptx_ablation" if det else "kept_ptx")
    files = _kept(kept, f"bwd-128-bfloat16-causal-tile-{mode}")
    texts = list(files.values())
    # the tile-schedule kernel; the dq reordering kernel of the tile workspace (default mode)
    assert sum(_DQ_TILES_KERNEL in t for t in texts) == 1
    ptx = [t for t in texts if _SCHEDULE_KERNEL not in t and _DQ_TILES_KERNEL not in t]
    assert len(ptx) == 1, list(files)
    text = ptx[0]
    assert "HstuBwdSm90" in text
    det_needles = ("ld.acquire.gpu.global.b32", "fence.acq_rel.gpu",
                   "st.relaxed.gpu.global.b32", "bar.arrive 2, 288", "bar.arrive 3, 288")
    assert "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32" in text
    assert "st.shared.v4.f32" in text
    assert "red.relaxed.gpu.global.add" not in text
    # complete-waits: the one before exit, and (deterministic) the one per tile
    assert len(re.findall(r"cp\.async\.bulk\.wait_group\s+0;", text)) == (2 if det else 1)
    if det:
        for needle in det_needles:
            assert needle in text, f"{needle} missing from the deterministic sm90 backward PTX"
    else:
        for needle in det_needles:
            assert needle not in text, f"{needle} in the default sm90 backward PTX"


def test_sm90ws_forwards_without_rab_keep_their_ptx(request):
    """The HSTU sm90ws forward without rab and the BSA sm90ws forward (one configuration each,
    ``scripts/ws_ptx_hashes.py quick``, run first in the process of :func:`kept_ptx`) still
    compile to the PTX recorded in tests/ws_ptx_sha256.txt (sha256 of the PTX without
    ``.loc``/``.file`` lines and comments): the rab presence flag and the shared
    warp-specialized base add no code to them. Skipped with another CuTe DSL version than the
    one the hashes were made with."""
    version, want = _recorded_ws_hashes()
    if not _ws_hashes_apply():
        pytest.skip(f"hashes recorded with nvidia-cutlass-dsl {version}")
    out = (request.getfixturevalue("kept_ptx") / "first.txt").read_text()
    got = dict(ln.split(" ", 1) for ln in out.splitlines() if ln.startswith(("hstu", "bsa")))
    assert len(got) == 2, out[-3000:]
    for name, h in got.items():
        assert h == want[name], f"{name}: PTX sha256 {h} != recorded {want[name]}"


def _bwd_ptx(kept_ptx, name):
    """The sm90 backward kernel's PTX kept while lowering the configuration ``name``."""
    files = _kept(kept_ptx, name)
    ptx = [t for t in files.values() if "HstuBwdSm90" in t]
    assert len(ptx) == 1, list(files)
    return ptx[0]


@pytest.mark.ablation
def test_hstu_bwd_sm90_wg_skip_ptx(kept_ptx, kept_ptx_ablation):
    """hstu_bwd_ws "wgskip": the backward's PTX has the skipped step's lone dQ GEMM besides
    the full step's (eight more wgmma: 40 instead of 32)."""
    base = _bwd_ptx(kept_ptx, "bwd-128-bfloat16-causal")
    skip = _bwd_ptx(kept_ptx_ablation, "bwd-128-bfloat16-causal-wgskip")
    assert base.count("wgmma.mma_async") == 32
    assert skip.count("wgmma.mma_async") == 40


def test_hstu_bwd_sm90_epi_smem_ptx(kept_ptx):
    """The default backward's dK / dV leave as packed pairs into shared memory (32 + 32
    st.shared.b32 per thread at D = 128) and 16-byte global stores (8 + 8), no 4-byte global
    store remains; hstu_bwd_ws "epiregs" stores them from registers (64 st.global.b32)."""
    base = _bwd_ptx(kept_ptx, "bwd-128-bfloat16-causal")
    regs = _bwd_ptx(kept_ptx, "bwd-128-bfloat16-causal-epiregs")
    assert regs.count("st.global.b32") == 64 and base.count("st.global.b32") == 0
    assert base.count("st.shared.b32") == regs.count("st.shared.b32") + 64
    assert base.count("st.global.v4") == regs.count("st.global.v4") + 16


def test_hstu_bwd_sm90_wghand_key():
    """hstu_bwd_ws "wghand" (opt-in): the key has it with the dQ writer warp and the tile
    workspace at D <= 128, not at D = 256, with dqclaim, deterministic=True, without the
    writer or without the option (the kernel: :func:`test_hstu_bwd_sm90_wghand_ptx`)."""
    from jax_sparse_attn.config import Switches  # noqa: PLC0415
    from jax_sparse_attn.ffi import hstu as fh  # noqa: PLC0415

    def key(d=128, deterministic=False, **sw):
        return fh.bwd_config("bfloat16", d, d, 0, Switches(**sw), deterministic=deterministic)

    on = dict(hstu_bwd_dq="tile", dq_writer="on")
    assert key(**on, hstu_bwd_ws=("wghand",)).wg_hand
    assert key(64, **on, hstu_bwd_ws=("wghand",)).wg_hand
    assert not key(**on).wg_hand
    assert not key(hstu_bwd_dq="tile", hstu_bwd_ws=("wghand",), dq_writer="off").wg_hand
    assert not key(256, **on, hstu_bwd_ws=("wghand",)).wg_hand
    assert not key(**on, hstu_bwd_ws=("wghand", "dqclaim")).wg_hand
    assert not key(**on, hstu_bwd_ws=("wghand",), deterministic=True).wg_hand


@pytest.mark.ablation
def test_hstu_bwd_sm90_wghand_ptx(kept_ptx_ablation):
    """hstu_bwd_ws "wghand" (the key: :func:`test_hstu_bwd_sm90_wghand_key`): warp 1 meets
    each consumer warpgroup on its own barriers, 2 / 11 (staged) and 5 / 10 (handed back) of
    128 + 32 threads, where the writer alone has the 288-thread pair 2 / 5; the same eight
    4 KB bulk reduce-adds and GEMMs. D = 64 (128-row query tiles, the warpgroups split the
    rows) lowers with it too."""
    base = _bwd_ptx(kept_ptx_ablation, "bwd-128-bfloat16-causal-writer")
    hand = _bwd_ptx(kept_ptx_ablation, "bwd-128-bfloat16-causal-wghand")
    import kept_ptx as kp  # noqa: PLC0415

    kp.assert_wg_hand_barriers(hand, base)
    red = "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32"
    assert hand.count(red) == base.count(red) == 8
    assert hand.count("wgmma.mma_async") == base.count("wgmma.mma_async") > 0
    assert re.search(r"bar\.sync\s+11, 160;",
                     _bwd_ptx(kept_ptx_ablation, "bwd-64-bfloat16-window-wghand"))


#: the stage test of hstu_bwd_ws "qprobe"
_STAGE_TEST = re.compile(r"mbarrier\.test_wait\.parity\.acquire\.cta\.shared::cta\.b64")


def test_hstu_bwd_sm90_qprobe_key_and_default_ptx(kept_ptx):
    """hstu_bwd_ws "qprobe" (opt-in): the key has it with the dQ tile workspace at D <= 128,
    not deterministic, the default key not; the default backward (D = 128, the tile
    workspace) tests no Q / dO stage (the probing kernel:
    :func:`test_hstu_bwd_sm90_qprobe_ptx`)."""
    from jax_sparse_attn.config import Switches  # noqa: PLC0415
    from jax_sparse_attn.ffi import hstu as fh  # noqa: PLC0415

    def key(d=128, deterministic=False, **sw):
        return fh.bwd_config("bfloat16", d, d, 0, Switches(**sw), deterministic=deterministic)

    assert key(hstu_bwd_dq="tile", hstu_bwd_ws=("qprobe",)).q_probe
    # D 256 stages dQ in the step's Q / dO stage (dq_alias): no test there
    assert not key(256, hstu_bwd_dq="tile", hstu_bwd_ws=("qprobe",)).q_probe
    assert not key(hstu_bwd_dq="tile").q_probe
    assert not key(hstu_bwd_dq="red", hstu_bwd_ws=("qprobe",)).q_probe
    assert not key(hstu_bwd_dq="tile", hstu_bwd_ws=("qprobe",), deterministic=True).q_probe
    assert not _STAGE_TEST.findall(_bwd_ptx(kept_ptx, "bwd-128-bfloat16-causal-tile-default"))


@pytest.mark.ablation
def test_hstu_bwd_sm90_qprobe_ptx(kept_ptx, kept_ptx_ablation):
    """hstu_bwd_ws "qprobe" (opt-in; the key:
    :func:`test_hstu_bwd_sm90_qprobe_key_and_default_ptx`): each step tests the next step's
    Q / dO stage once (``mbarrier.test_wait``, acquire) after its dQ staging stores and skips
    its wait where the test passed; the same GEMMs and bulk reduce-adds as without it."""
    base = _bwd_ptx(kept_ptx, "bwd-128-bfloat16-causal-tile-default")
    probe = _bwd_ptx(kept_ptx_ablation, "bwd-128-bfloat16-causal-qprobe")
    assert len(_STAGE_TEST.findall(probe)) >= 1
    red = "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32"
    for op in ("wgmma.mma_async", "wgmma.commit_group", red, "cp.async.bulk.tensor"):
        assert probe.count(op) == base.count(op) > 0, op


def test_hstu_wgmma_groups_in_block(kept_ptx):
    """Every kept Hopper HSTU kernel (forward and backward) commits each wgmma group in the
    basic block of its last wgmma (``kept_ptx.assert_wgmma_groups_in_block``), so its waits
    count the groups it means."""
    import kept_ptx as kp  # noqa: PLC0415

    n = kp.configs_with_groups_in_block(kept_ptx, _PTX_CONFIGS)
    assert n >= len(_PTX_CONFIGS) // 2, n


@pytest.mark.ablation
def test_hstu_ablation_wgmma_groups_in_block(kept_ptx_ablation):
    """The same for the kept kernels of the opt-in variants (:data:`_PTX_ABLATION`)."""
    import kept_ptx as kp  # noqa: PLC0415

    n = kp.configs_with_groups_in_block(kept_ptx_ablation, _PTX_ABLATION)
    assert n >= len(_PTX_ABLATION) // 2, n


def _rab_bwd_ptx(kept_ptx, name):
    """The PTX of the sm90 backward kernel with rab kept for ``name``."""
    texts = [t for t in _kept(kept_ptx, name).values() if "HstuBwdSm90" in t]
    assert len(texts) == 1, name
    return texts[0]


def test_hstu_rab_bwd_sm90_fast_path_ptx(kept_ptx):
    """The sm90 backward with rab at D 128: by default the producer warp issues L2 prefetches
    of the bias rows (rows of 512 bytes at fp32: five addresses per row, 64 rows over 32
    lanes: ten per step), steps inside the bias load it with 32 more unclamped loads per
    thread and (H_rab = 1) add d rab with scalar red.add next to the 16-byte adds of the other
    steps; hstu_bwd_ws "norabfast,norabpf,nodrabs" gives the kernel without any of them. At
    D 64 (128-query tiles) the fast path is off and the prefetches stay (20 per step)."""
    fast = _rab_bwd_ptx(kept_ptx, "bwd-128-rab1-float32")
    slow = _rab_bwd_ptx(kept_ptx, "bwd-128-rab1-float32-slow")
    per_head = _rab_bwd_ptx(kept_ptx, "bwd-128-rabh-bfloat16")
    d64 = _rab_bwd_ptx(kept_ptx, "bwd-64-rab1-float32")

    def count(pattern, text):
        return len(re.findall(pattern, text))

    assert count(r"prefetch\.global\.L2 ", fast) == 10
    assert count(r"prefetch\.global\.L2 ", per_head) == 6  # 256-byte rows: three per row
    assert count(r"prefetch\.global\.L2 ", d64) == 20
    assert count(r"prefetch\.global\.L2 ", slow) == 0
    scalar = r"red\.relaxed\.gpu\.global\.add\.f32 "
    vec4 = r"red\.relaxed\.gpu\.global\.add\.v4\.f32 "
    assert count(scalar, fast) == 32 and count(vec4, fast) == count(vec4, slow) > 0
    assert count(scalar, slow) == 0 and count(scalar, per_head) == 0
    assert count(scalar, d64) == 0
    assert count(r"ld\.global\.b32", fast) == count(r"ld\.global\.b32", slow) + 32
    assert count(r"ld\.global\.b16", per_head) == 64


def test_hstu_rab_fwd_default_ptx_has_no_prefetch(kept_ptx):
    """The default sm90ws forward with rab prefetches no bias rows into L2 (hstu_fwd_ws
    "rabpf": :func:`test_hstu_rab_fwd_prefetch_ptx`)."""
    assert "prefetch.global.L2" not in _fwd_ptx(kept_ptx, "fwd-128-rab1-float32")


@pytest.mark.ablation
def test_hstu_rab_fwd_prefetch_ptx(kept_ptx_ablation):
    """hstu_fwd_ws "rabpf": the sm90ws forward's producer prefetches each KV tile's bias rows
    (128 query rows over 32 lanes, five addresses per 512-byte fp32 row: 20 per lane)."""
    pf = _fwd_ptx(kept_ptx_ablation, "fwd-128-rab1-float32-rabpf")
    assert len(re.findall(r"prefetch\.global\.L2 ", pf)) == 20

