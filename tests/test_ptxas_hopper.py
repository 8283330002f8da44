"""CPU: ptxas (when installed) assembles the sm90ws HSTU forward for sm_90a without the
wgmma-serialization warning C7513 ("wgmma.mma_async instructions are serialized due to non
wgmma instructions defining input registers of a wgmma between start and end of the pipeline
stage") and without register spills, by default and with the packed 16-bit score function
(``hstu_fwd_ws=silu16``, whose last step writes P after the wait of the PV GEMM that reads
the previous P). A serialized wgmma runs without the overlap the kernel is built for."""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys

import pytest

pytestmark = pytest.mark.lowering

_SCRIPT = """
import os, sys
sys.path.insert(0, {root!r})
import jax, jax.numpy as jnp
import jax_sparse_attn as jsa
q = jax.ShapeDtypeStruct((300, 2, {d}), jnp.bfloat16)
cu = jax.ShapeDtypeStruct((3,), jnp.int32)
f = lambda q, k, v, cu: jsa.hstu_attention(q, k, v, cu, cu, max_seqlen_q=200, max_seqlen_k=200)
jax.jit(f).trace(q, q, q, cu).lower(lowering_platforms=("cuda",))
"""


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas is not installed")
@pytest.mark.parametrize("ws", ["", "silu16"], ids=["default", "silu16"])
def test_hstu_fwd_ws_ptxas_no_serialized_wgmma(tmp_path, ws):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_SPARSE_ATTN_")}
    env.update(CUTE_DSL_ARCH="sm_90a", JAX_SPARSE_ATTN_FORCE_KERNEL="1", CUTE_DSL_KEEP="ptx",
               CUTE_DSL_DUMP_DIR=str(tmp_path), JAX_PLATFORMS="cpu",
               JAX_SPARSE_ATTN_HSTU_WS=ws)
    r = subprocess.run([sys.executable, "-c", _SCRIPT.format(root=root, d=64)], env=env,
                       cwd=root, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    fwd = [p for p in glob.glob(str(tmp_path / "*.ptx"))
           if "HstuFwdSm90Ws" in open(p).read()]
    assert len(fwd) == 1, os.listdir(tmp_path)
    text = open(fwd[0]).read()
    if ws == "silu16":
        assert "tanh.approx.bf16x2" in text and "fma.rn.bf16x2" in text
        # h clamped at the lowest finite bf16 (0xFF7F0000) before packing: -inf scores give
        # P = 0, not -inf + inf = NaN
        assert "max.NaN.f32" in text and ("-8454144" in text or "0fFF7F0000" in text)
    a = subprocess.run(["ptxas", "-arch=sm_90a", "-v", fwd[0], "-o", str(tmp_path / "k.cubin")],
                       capture_output=True, text=True, timeout=600)
    out = a.stdout + a.stderr
    assert a.returncode == 0, out[-3000:]
    assert "C7513" not in out, out[-3000:]
    spills = [int(x) for x in re.findall(r"(\d+) bytes spill stores", out)]
    assert spills and max(spills) == 0, out[-3000:]


_BSA_BWD_SCRIPT = """
import sys
sys.path.insert(0, {root!r})
sys.path.insert(0, {tests!r})
import test_lowering_bsa_bwd_ws as t
t._bwd_text(t.CONFIGS[1], ws={ws!r}, deterministic={det!r})
"""


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
def test_bsa_bwd_dq_late_ptxas_no_serialized_wgmma(tmp_path):
    """blk 64 / D 128 (one consumer warpgroup holding dK and dV of 64 keys x 128): with dQ
    issued after the dV / dK GEMMs (the default) the dQ accumulator is not live next to P^T, dS^T and the in-flight dV / dK
    GEMMs, and ptxas assembles the kernel without serializing the wgmma for lack of
    registers (C7512) and without spills."""
    tests = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(tests)
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_SPARSE_ATTN_")}
    env.update(CUTE_DSL_ARCH="sm_90a", JAX_SPARSE_ATTN_FORCE_KERNEL="1", CUTE_DSL_KEEP="ptx",
               CUTE_DSL_DUMP_DIR=str(tmp_path), JAX_PLATFORMS="cpu")
    script = _BSA_BWD_SCRIPT.format(root=root, tests=tests, ws="", det=False)
    r = subprocess.run([sys.executable, "-c", script], env=env, cwd=root, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    ws = [p for p in glob.glob(str(tmp_path / "*.ptx")) if "BsaBwdSm90Ws" in open(p).read()]
    assert len(ws) == 1, os.listdir(tmp_path)
    a = subprocess.run(["ptxas", "-arch=sm_90a", "-v", ws[0], "-o", str(tmp_path / "k.cubin")],
                       capture_output=True, text=True, timeout=600)
    out = a.stdout + a.stderr
    assert a.returncode == 0, out[-3000:]
    assert "C7512" not in out and "C7513" not in out, out[-3000:]
    spills = [int(x) for x in re.findall(r"(\d+) bytes spill stores", out)]
    assert spills and max(spills) == 0, out[-3000:]
