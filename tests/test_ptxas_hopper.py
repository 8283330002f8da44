"""CPU: ptxas (when installed) assembles the sm90ws HSTU forward for sm_90a without the
wgmma-serialization warning C7513 ("wgmma.mma_async instructions are serialized due to non
wgmma instructions defining input registers of a wgmma between start and end of the pipeline
stage") and without register spills, by default, with the packed 16-bit score function
(``hstu_fwd_ws=silu16``, whose last step writes P after the wait of the PV GEMM that reads
the previous P), with three consumer warpgroups and in fp16 with ``hstu_fwd_ws=plate`` (P
converted to 16 bit after that wait; the default fp16 kernel converts it before and ptxas
serializes every wgmma of it, which measured no slower on the H200). A serialized wgmma runs
without the overlap the kernel is built for. The opt-in variants (``silu16``, ``plate``, the
block-sparse backward's ``dklag``, ``sahead``, ``noqprobe``, ``nodqlag``) are checked in the
``ablation`` tier (``pytest -m ablation``), from the PTX of :func:`kept_ptx_ablation`."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

pytestmark = pytest.mark.lowering


def _ablation(value):
    """A parameter of the ablation tier."""
    return pytest.param(value, marks=pytest.mark.ablation)


def _hstu_fwd_text(switches, d=64, dtype="bfloat16", max_seqlen=200):
    """The lowered text of the HSTU forward (default D = 64, bf16, max_seqlen 200: two
    consumer warpgroups) on the kernel backend."""
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415

    import jax_sparse_attn as jsa  # noqa: PLC0415

    q = jax.ShapeDtypeStruct((max_seqlen + 100, 2, d), jnp.dtype(dtype))
    cu = jax.ShapeDtypeStruct((3,), jnp.int32)

    def f(q, k, v, cu):
        return jsa.hstu_attention(q, k, v, cu, cu, max_seqlen_q=max_seqlen,
                                  max_seqlen_k=max_seqlen, switches=switches)

    return jax.jit(f).trace(q, q, q, cu).lower(lowering_platforms=("cuda",)).as_text()


def _bsa_bwd_text(cfg_index, **kw):
    """The lowered text of the block-sparse backward of tests/test_lowering_bsa_bwd_ws.py on
    its configuration ``cfg_index``."""
    import test_lowering_bsa_bwd_ws as t  # noqa: PLC0415

    return t._bwd_text(t.CONFIGS[cfg_index], **kw)


# the configurations assembled here, lowered in one fresh process (tests/kept_ptx.py): name ->
# (function of this module, its positional arguments, Switches fields, keyword arguments)
_PTX_CONFIGS = {
    "hstu-fwd-default": ("_hstu_fwd_text", (), {}, {}),
    # three consumer warpgroups (the default at D <= 64 from max_seqlen_q 2048)
    "hstu-fwd-wg3": ("_hstu_fwd_text", (), {}, {"max_seqlen": 4096}),
    # blk 64 / D 128, the default backward (dQ issued after the dV / dK GEMMs)
    "bsa-bwd-blk64": ("_bsa_bwd_text", (1,), None, {"ws": "", "deterministic": False}),
    # blk 128 / D 128, the default (the next step's stage tested ahead)
    "bsa-bwd-blk128": ("_bsa_bwd_text", (0,), None, {"ws": ""}),
}
# the opt-in variants (the ablation tier), kept by kept_ptx_ablation
_PTX_ABLATION = {
    "hstu-fwd-silu16": ("_hstu_fwd_text", (), {"hstu_fwd_ws": "silu16"}, {}),
    # fp16 with P converted after the PV wait (hstu_fwd_ws=plate), at D = 128 and D = 64 with
    # three consumer warpgroups
    "hstu-fwd-fp16": ("_hstu_fwd_text", (), {"hstu_fwd_ws": "plate"},
                      {"d": 128, "dtype": "float16"}),
    "hstu-fwd-fp16-wg3": ("_hstu_fwd_text", (), {"hstu_fwd_ws": "plate,wg3"},
                          {"dtype": "float16", "max_seqlen": 4096}),
    # blk 128 / D 128 with the previous step's dK GEMM issued after the S^T / dP^T GEMMs
    "bsa-bwd-blk128-dklag": ("_bsa_bwd_text", (0,), None, {"ws": "dklag"}),
    "bsa-bwd-blk128-sahead": ("_bsa_bwd_text", (0,), None, {"ws": "sahead"}),
    # blk 128 / D 128 without the default's stage test ahead and late dQ of warpgroup 0
    "bsa-bwd-blk128-noqprobe": ("_bsa_bwd_text", (0,), None, {"ws": "noqprobe"}),
    "bsa-bwd-blk128-nodqlag": ("_bsa_bwd_text", (0,), None, {"ws": "nodqlag"}),
}


@pytest.fixture(scope="module")
def kept_ptx(tmp_path_factory):
    """The directory of the PTX kept while lowering :data:`_PTX_CONFIGS`."""
    import kept_ptx as kp  # noqa: PLC0415

    return kp.keep_ptx_shared(tmp_path_factory, "test_ptxas_hopper", "test_ptxas_hopper",
                              _PTX_CONFIGS)


@pytest.fixture(scope="module")
def kept_ptx_ablation(tmp_path_factory):
    """The directory of the PTX kept while lowering :data:`_PTX_ABLATION`."""
    import kept_ptx as kp  # noqa: PLC0415

    return kp.keep_ptx_shared(tmp_path_factory, "test_ptxas_hopper_ablation",
                              "test_ptxas_hopper", _PTX_ABLATION)


def _kept(request, name):
    """The directory of the fixture that keeps the configuration ``name``."""
    return request.getfixturevalue("kept_ptx_ablation" if name in _PTX_ABLATION else "kept_ptx")


def _kernel_ptx(kept_ptx, name, kernel):
    """(path, text) of the one PTX file of the configuration ``name`` that holds ``kernel``."""
    import kept_ptx as kp  # noqa: PLC0415

    files = kp.ptx_of(kept_ptx, name)
    hits = [f for f, t in files.items() if kernel in t]
    assert len(hits) == 1, list(files)
    return str(kept_ptx / name / hits[0]), files[hits[0]]


def _ptxas(ptx, tmp_path):
    """ptxas -v output of ``ptx`` for sm_90a (asserting that it assembles)."""
    a = subprocess.run(["ptxas", "-arch=sm_90a", "-v", ptx, "-o", str(tmp_path / "k.cubin")],
                       capture_output=True, text=True, timeout=600)
    out = a.stdout + a.stderr
    assert a.returncode == 0, out[-3000:]
    return out


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas is not installed")
@pytest.mark.parametrize("ws", ["", _ablation("silu16"), "wg3", _ablation("fp16"),
                                _ablation("fp16-wg3")],
                         ids=["default", "silu16", "wg3", "fp16", "fp16-wg3"])
def test_hstu_fwd_ws_ptxas_no_serialized_wgmma(request, tmp_path, ws):
    name = f"hstu-fwd-{ws or 'default'}"
    path, text = _kernel_ptx(_kept(request, name), name, "HstuFwdSm90Ws")
    if "wg3" in ws:
        assert ".reqntid 512" in text
        assert re.search(r"setmaxnreg\.inc\.sync\.aligned\.u32\s+160;", text)
    if ws == "silu16":
        assert "tanh.approx.bf16x2" in text and "fma.rn.bf16x2" in text
        # h clamped at the lowest finite bf16 (0xFF7F0000) before packing: -inf scores give
        # P = 0, not -inf + inf = NaN
        assert "max.NaN.f32" in text and ("-8454144" in text or "0fFF7F0000" in text)
    out = _ptxas(path, tmp_path)
    assert "serialized" not in out, out[-3000:]  # C7512-C7515
    spills = [int(x) for x in re.findall(r"(\d+) bytes spill stores", out)]
    assert spills and max(spills) == 0, out[-3000:]


def test_bsa_bwd_dq_late_key():
    """The sm90ws backward issues dQ after the dV / dK GEMMs (``ws_dq_late``) wherever the dQ
    slices are staged in the Q / dO stage (blk 64 / D 128 always; ``dqalias`` elsewhere);
    ``bsa_bwd_ws=dqearly`` turns it off."""
    import jax.numpy as jnp

    from jax_sparse_attn.config import Switches
    from jax_sparse_attn.ffi import bsa as fb

    early = Switches(bsa_bwd_ws="dqearly")
    for det in (False, True):
        key = fb.bwd_config(jnp.bfloat16, 128, 64, False, Switches(), deterministic=det)
        assert key.ws_dq_alias and key.ws_dq_late
        key = fb.bwd_config(jnp.bfloat16, 128, 64, False, early, deterministic=det)
        assert key.ws_dq_alias and not key.ws_dq_late
    # blk 128 stages in its own tile unless dqalias
    assert not fb.bwd_config(jnp.bfloat16, 128, 128, False, Switches()).ws_dq_late
    assert fb.bwd_config(jnp.bfloat16, 128, 128, False, Switches(bsa_bwd_ws="dqalias")).ws_dq_late
    both = Switches(bsa_bwd_ws="dqalias,dqearly")
    assert not fb.bwd_config(jnp.bfloat16, 128, 128, False, both).ws_dq_late


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas is not installed")
def test_bsa_bwd_dq_late_ptxas_no_serialized_wgmma(kept_ptx, tmp_path):
    """blk 64 / D 128 (one consumer warpgroup holding dK and dV of 64 keys x 128): with dQ
    issued after the dV / dK GEMMs (the default) the dQ accumulator is not live next to P^T, dS^T and the in-flight dV / dK
    GEMMs, and ptxas assembles the kernel without serializing the wgmma for lack of
    registers (C7512) and without spills."""
    path, _ = _kernel_ptx(kept_ptx, "bsa-bwd-blk64", "BsaBwdSm90Ws")
    out = _ptxas(path, tmp_path)
    assert "serialized" not in out, out[-3000:]  # C7512-C7515
    spills = [int(x) for x in re.findall(r"(\d+) bytes spill stores", out)]
    assert spills and max(spills) == 0, out[-3000:]


@pytest.mark.ablation
@pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas is not installed")
def test_bsa_bwd_dklag_ptxas_no_serialized_wgmma(kept_ptx_ablation, tmp_path):
    """blk 128 / D 128 with ``bsa_bwd_ws=dklag``: the previous step's dS^T fragment (16 more
    registers) is live next to the S^T / dP^T accumulators and read by the dK GEMM in flight
    under the step's score work; ptxas assembles it without serializing the wgmma (C7512,
    C7513) and without spills."""
    path, text = _kernel_ptx(kept_ptx_ablation, "bsa-bwd-blk128-dklag", "BsaBwdSm90Ws")
    assert re.search(r"wgmma\.wait_group\.sync\.aligned\s+2;", text)
    out = _ptxas(path, tmp_path)
    assert "serialized" not in out, out[-3000:]  # C7512-C7515
    spills = [int(x) for x in re.findall(r"(\d+) bytes spill stores", out)]
    assert spills and max(spills) == 0, out[-3000:]


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas is not installed")
@pytest.mark.parametrize("name", ["bsa-bwd-blk128", _ablation("bsa-bwd-blk128-noqprobe"),
                                  _ablation("bsa-bwd-blk128-nodqlag")])
def test_bsa_bwd_qprobe_ptxas_no_serialized_wgmma(request, tmp_path, name):
    """blk 128 / D 128 by default: the next step's stage test and index and the next
    entry's split between the dQ staging stores and their fence, and the step's wait behind
    a branch; ptxas assembles it without serializing the wgmma and without spills, as
    without them (``noqprobe``); the default has warpgroup 0's dQ one step late (``dqlag``:
    its barriers and staging behind branches on the warpgroup, its last dQ GEMM in one),
    ``nodqlag`` both warpgroups' dQ in the step."""
    path, _ = _kernel_ptx(_kept(request, name), name, "BsaBwdSm90Ws")
    out = _ptxas(path, tmp_path)
    assert "serialized" not in out, out[-3000:]  # C7510-C7515
    spills = [int(x) for x in re.findall(r"(\d+) bytes spill stores", out)]
    assert spills and max(spills) == 0, out[-3000:]


@pytest.mark.ablation
@pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas is not installed")
def test_bsa_bwd_sahead_ptxas_no_serialized_wgmma(kept_ptx_ablation, tmp_path):
    """blk 128 / D 128 with ``bsa_bwd_ws=sahead``: the first step of a list entry ends with
    its dK GEMM in flight and the second step's S^T / dP^T GEMMs go behind it. ptxas
    serializes every wgmma of a kernel when a GEMM is in flight where a branch region it was
    issued in ends (C7514 / C7515; the first step is therefore static); here it does not
    serialize (no "serialized" note) and spills at most one register (8 bytes of spill
    stores, read back outside the GEMMs)."""
    path, _ = _kernel_ptx(kept_ptx_ablation, "bsa-bwd-blk128-sahead", "BsaBwdSm90Ws")
    out = _ptxas(path, tmp_path)
    assert "serialized" not in out, out[-3000:]
    spills = [int(x) for x in re.findall(r"(\d+) bytes spill stores", out)]
    assert spills and max(spills) <= 8, out[-3000:]
