"""The sm90ws block-sparse forward's stream-K tail (``bsa_fwd_ws=streamk``, opt-in) on CPU:
lowering for sm_90a through the public API, the PTX of its partial exchange, the compile
key and the workspace sizes, and the switch values it declines.

With ``streamk`` the call has two more buffers (an fp32 partial workspace and zeroed int32
flags, one per CTA slot and consumer warpgroup); the CTA that holds the first listed blocks
of a split work item waits for the next CTA's flag with acquire loads and reads its partial
with relaxed GPU-scope loads; the other CTA stores its partial and raises the flag after a
GPU-scope fence. The default kernel has none of that (its PTX stays pinned in
``tests/ws_ptx_sha256.txt``). The GPU tests: ``tests/test_gpu_bsa.py::
test_bsa_sm90ws_forward_streamk``. The lowering and PTX tests compile only this opt-in
variant: they are marked ``ablation`` (``pytest -m ablation``); the compile key and switch
tests run by default.
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

pytest.importorskip("cutlass.jax")

CALL_TARGET = "CuteDSLRT_NvJaxCutlassCall"

# (blk, D, dtype, layout, block_sizes)
LOWER = [(128, 128, "bfloat16", "bhsd", False), (64, 64, "float16", "bshd", True),
         (64, 128, "bfloat16", "bshd", False)]


def _fwd_text(blk, d, dtype, layout, sizes, ws="streamk"):
    """The lowered text of the public forward on the sm90ws kernel with ``bsa_fwd_ws=ws``
    (the shapes of ``test_lowering_bsa_splits._args``, two batches of four heads)."""
    import jax_sparse_attn as jsa
    from jax_sparse_attn.config import Switches
    from test_lowering_bsa_splits import _args

    q, k, idx, nums, bs = _args(blk, d, dtype, layout, sizes, b=2, h=4, sq=1000, skv=1025)
    sw = Switches(bsa_fwd_impl="sm90ws", bsa_fwd_ws=tuple(filter(None, ws.split(","))))

    def f(q, k, v, i, n, s):
        return jsa.block_sparse_attention_forward(q, k, v, i, None, s, n, layout=layout,
                                                  sparse_block_size=blk, softmax_scale=0.3,
                                                  backend="kernel", switches=sw)

    return jax.jit(f).trace(q, k, k, idx, nums, bs).lower(
        lowering_platforms=("cuda",)).as_text()


_PTX_CONFIGS = {
    "streamk-blk128": ("_fwd_text", (128, 128, "bfloat16", "bhsd", False), None, {}),
    "default-blk128": ("_fwd_text", (128, 128, "bfloat16", "bhsd", False), None, {"ws": ""}),
}


@pytest.fixture(scope="module")
def kept_ptx(tmp_path_factory):
    import kept_ptx as kp  # noqa: PLC0415

    return kp.keep_ptx_shared(tmp_path_factory, "test_lowering_bsa_streamk",
                              "test_lowering_bsa_streamk", _PTX_CONFIGS)


def _fwd_ptx(kept_ptx, name):
    import kept_ptx as kp  # noqa: PLC0415

    files = kp.ptx_of(kept_ptx, name)
    assert len(files) == 1, list(files)
    return next(iter(files.values()))


@pytest.fixture
def kernel_env(monkeypatch):
    monkeypatch.setenv("CUTE_DSL_ARCH", os.environ.get("CUTE_DSL_ARCH", "sm_90a"))
    monkeypatch.setenv("JAX_SPARSE_ATTN_FORCE_KERNEL", "1")


@pytest.mark.lowering
@pytest.mark.ablation
@pytest.mark.parametrize("blk,d,dtype,layout,sizes", LOWER,
                         ids=[f"blk{c[0]}-d{c[1]}-{c[2]}-{c[3]}-{'sizes' if c[4] else 'nosizes'}"
                              for c in LOWER])
def test_bsa_streamk_forward_lowers(kernel_env, blk, d, dtype, layout, sizes):
    """One launch, as without ``streamk`` (the flags' zeroing is an XLA fusion)."""
    txt = _fwd_text(blk, d, dtype, layout, sizes)
    assert txt.count(CALL_TARGET) == 1


@pytest.mark.lowering
@pytest.mark.ablation
def test_bsa_streamk_ptx(kept_ptx):
    """The partial exchange: acquire-load wait on a flag, relaxed fp32 loads of the partial
    (never served from a stale L1 line), a GPU-scope fence before the flag's relaxed store;
    the default forward has none of these."""
    sk = _fwd_ptx(kept_ptx, "streamk-blk128")
    default = _fwd_ptx(kept_ptx, "default-blk128")
    # D 128: 64 accumulator values and two rows' max and sum per thread
    assert sk.count("ld.relaxed.gpu.global.f32") == 64 + 4
    for op in ("ld.acquire.gpu.global.b32", "fence.acq_rel.gpu", "st.relaxed.gpu.global.b32"):
        assert op in sk, op
        assert op not in default, op
    assert "ld.relaxed.gpu.global.f32" not in default


def test_bsa_streamk_config_and_sizes():
    """The compile key carries ``ws_stream_k`` only where the kernel has it (not with
    split-KV or packed GQA); the workspace size of the call equals the kernel's."""
    from jax_sparse_attn.config import Switches
    from jax_sparse_attn.ffi import bsa
    from jax_sparse_attn.kernels.bsa_fwd_sm90_ws import BsaFwdSm90Ws

    sw = Switches(bsa_fwd_impl="sm90ws", bsa_fwd_ws=("streamk",))
    for blk, d in ((128, 128), (64, 128), (64, 64), (128, 64)):
        cfg = bsa.fwd_config(jnp.bfloat16, d, blk, False, sw)
        assert cfg.ws_stream_k, (blk, d)
        kern = BsaFwdSm90Ws(bsa._cutlass_dtype(cfg.dtype), d, blk, False, cfg.num_sms,
                            three_ctas=cfg.ws_three_ctas, stream_k=True)
        n_ws, n_flags = bsa._sk_sizes(cfg)
        assert n_ws == kern.sk_floats() and n_flags == kern.sk_slots() * kern.num_wg
    assert not bsa.fwd_config(jnp.bfloat16, 128, 128, False, Switches()).ws_stream_k
    assert not bsa.fwd_config(jnp.bfloat16, 128, 128, False, sw, kv_splits=4, num_rows=8,
                              k_max=8).ws_stream_k
    assert not bsa.fwd_config(jnp.bfloat16, 128, 128, False, sw, pack_gqa=2).ws_stream_k
    with pytest.raises(NotImplementedError, match="stream_k"):
        BsaFwdSm90Ws(bsa._cutlass_dtype("bfloat16"), 128, 128, False, 132, stream_k=True,
                     kv_splits=2)


@pytest.mark.parametrize("other", ["cross", "crossepi", "mpre", "qahead"])
def test_bsa_streamk_switch_clashes(other):
    from jax_sparse_attn import config

    with pytest.raises(ValueError, match="streamk"):
        config.from_env({"JAX_SPARSE_ATTN_BSA_WS": f"streamk,{other}"})
    assert "streamk" in config.from_env({"JAX_SPARSE_ATTN_BSA_WS": "streamk"}).bsa_fwd_ws
