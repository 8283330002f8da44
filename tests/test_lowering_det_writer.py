"""CPU: the dQ writer warp of the deterministic Hopper backwards (``Switches.det_writer``,
``JAX_SPARSE_ATTN_DET_WRITER``): which compile keys carry it, and the PTX of the HSTU sm90 and
the block-sparse sm90ws backwards lowered with it for sm_90a (no GPU needed). The GPU run is
``tests/test_gpu_det_writer.py``."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

from jax_sparse_attn.config import Switches, from_env  # noqa: E402


def test_det_writer_switch_and_keys():
    """On by default; read from the environment; set in a backward key only in the
    deterministic mode of a kernel with the dQ tile workspace (HSTU sm90 at every head dim,
    BSA sm90ws with bsa_bwd_dq=tile), and then part of the compile key."""
    from jax_sparse_attn.ffi import bsa as fb
    from jax_sparse_attn.ffi import hstu as fh

    assert Switches().det_writer is True
    assert from_env({"JAX_SPARSE_ATTN_DET_WRITER": "1"}).det_writer is True
    assert from_env({"JAX_SPARSE_ATTN_DET_WRITER": "0"}).det_writer is False
    assert from_env({}).det_writer is True
    with pytest.raises(ValueError, match="JAX_SPARSE_ATTN_DET_WRITER"):
        from_env({"JAX_SPARSE_ATTN_DET_WRITER": "sometimes"})

    on = Switches(det_writer=True)
    off = Switches(det_writer=False)
    for d in (64, 128, 256):
        det = fh.bwd_config("bfloat16", d, d, 0, on, deterministic=True)
        assert det.det_writer and det.dq_tile and det.impl == "sm90"
        assert det != fh.bwd_config("bfloat16", d, d, 0, off, deterministic=True)
        assert not fh.bwd_config("bfloat16", d, d, 0, on).det_writer
    # (D = 256 stages dQ in the Q / dO tiles, which the writer hands back to the producer);
    # red / red4 have no staged tile
    red = Switches(det_writer=True, hstu_bwd_dq="red")
    assert not fh.bwd_config("bfloat16", 128, 128, 0, red, deterministic=True).det_writer

    # the ordered additions (detorder: the fixed-point dQ is the default)
    on_order = Switches(det_writer=True, bsa_bwd_ws=("detorder",))
    off_order = Switches(det_writer=False, bsa_bwd_ws=("detorder",))
    for d in (64, 128):
        for blk in (64, 128):
            det = fb.bwd_config(jnp.bfloat16, d, blk, False, on_order, deterministic=True)
            assert det.det_writer and det.dq_tile and det.impl == "sm90ws", (d, blk)
            assert det != fb.bwd_config(jnp.bfloat16, d, blk, False, off_order,
                                        deterministic=True)
            assert not fb.bwd_config(jnp.bfloat16, d, blk, False, on).det_writer
    rows = Switches(det_writer=True, bsa_bwd_dq="rows")
    assert not fb.bwd_config(jnp.bfloat16, 128, 128, False, rows, deterministic=True).det_writer


_SCRIPT = """
import sys
sys.path.insert(0, {root!r})
sys.path.insert(0, {tests!r})
import test_lowering_hstu as th
import test_lowering_bsa_bwd_ws as tb
from jax_sparse_attn.config import Switches
th._bwd_text(128, "bfloat16", "causal", Switches(hstu_bwd_dq="tile", det_writer=True),
             deterministic=True)
# blk 128, D 128: staging tile; blk 64, D 128: staged in the step's Q / dO stage
tb._bwd_text(tb.CONFIGS[0], deterministic=True, det_writer=True)
tb._bwd_text(tb.CONFIGS[1], ws="detorder", deterministic=True, det_writer=True)
"""

# blk 64 with the zeroed workspace (every contribution a reduce-add); a process and dump
# directory of its own (the kept PTX files are named by the call's argument types)
_SCRIPT_ZERO = """
import sys
sys.path.insert(0, {root!r})
sys.path.insert(0, {tests!r})
import test_lowering_bsa_bwd_ws as tb
tb._bwd_text(tb.CONFIGS[1], ws="detzero,detorder", deterministic=True, det_writer=True)
"""


@pytest.mark.lowering
def test_det_writer_ptx(tmp_path):
    """With the switch on, warp 1 issues every bulk reduce-add of a query tile after the
    consumers' arrival on named barrier 2 and hands the staging buffer back on barrier 5;
    barrier 3 (the consumers' report of their own additions) is gone. Warp 1 hands the
    buffer back once the bulk reads are done and publishes once the additions are complete.
    HSTU (D 128): 8 bulk reduce-adds of 4 KB. BSA blk 128:
    8 blocks for each of the two 64-row query tiles of a block; blk 64 / D 128 (slices in
    the step's Q / dO stage): 8 blocks, and warp 1 releases the stage to the producer.
    BSA ``det_store`` (the default): the same blocks also as bulk stores (a tile's first
    contribution); ``detzero``: no bulk store."""
    tests = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(tests)
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_SPARSE_ATTN_")}
    env.update(CUTE_DSL_ARCH="sm_90a", JAX_SPARSE_ATTN_FORCE_KERNEL="1", CUTE_DSL_KEEP="ptx",
               CUTE_DSL_DUMP_DIR=str(tmp_path), JAX_PLATFORMS="cpu")
    r = subprocess.run([sys.executable, "-c", _SCRIPT.format(root=root, tests=tests)], env=env,
                       cwd=root, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    texts = [p.read_text() for p in tmp_path.iterdir() if p.suffix == ".ptx"]
    zdir = tmp_path / "zero"
    zdir.mkdir()
    r = subprocess.run([sys.executable, "-c", _SCRIPT_ZERO.format(root=root, tests=tests)],
                       env=dict(env, CUTE_DSL_DUMP_DIR=str(zdir)), cwd=root,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    zeroed = [t for t in (p.read_text() for p in zdir.iterdir() if p.suffix == ".ptx")
              if "bsa_bwd_sm90_ws" in t]
    bulk = r"cp\.reduce\.async\.bulk\.global\.shared::cta\.bulk_group\.add\.f32"
    complete = r"cp\.async\.bulk\.wait_group\s+0;"
    read = r"cp\.async\.bulk\.wait_group\.read\s+0;"

    def bar(kind, bid, n):
        return rf"bar\.{kind}\s+{bid}, {n};"

    hstu = [t for t in texts if "HstuBwdSm90" in t]
    assert len(hstu) == 1, [p.name for p in tmp_path.iterdir()]
    h = hstu[0]
    assert len(re.findall(bulk, h)) == 8
    # the writer waits for the reads (then hands the tile back), then for the completion
    # (then publishes); the consumers' wait before exit
    assert len(re.findall(complete, h)) == 2
    assert len(re.findall(read, h)) == 1
    for kind, bid in (("sync", 2), ("arrive", 2), ("sync", 5), ("arrive", 5)):
        assert re.search(bar(kind, bid, 288), h), (kind, bid)
    assert not re.search(r"bar\.(sync|arrive)\s+3, 288;", h)
    assert "ld.acquire.gpu.global.b32" in h and "fence.acq_rel.gpu" in h

    store = r"cp\.async\.bulk\.global\.shared::cta\.bulk_group\s"
    assert len(zeroed) == 1 and re.search(bar("sync", 2, 160), zeroed[0])
    assert len(re.findall(bulk, zeroed[0])) == 8 and not re.search(store, zeroed[0])
    ws = [t for t in texts if "bsa_bwd_sm90_ws" in t]
    assert len(ws) == 2, [p.name for p in tmp_path.iterdir()]
    by_threads = {n: [t for t in ws if re.search(bar("sync", 2, n), t)] for n in (288, 160)}
    assert len(by_threads[288]) == 1 and len(by_threads[160]) == 1
    # bulk reduce-adds; writer read / complete waits (one per 64-row query tile of a block)
    # plus the consumers' complete-wait before exit
    for n, want, tiles in ((288, 16, 2), (160, 8, 1)):
        t = by_threads[n][0]
        assert len(re.findall(bulk, t)) == want, n
        assert len(re.findall(store, t)) == want, n
        assert len(re.findall(read, t)) == tiles, n
        assert len(re.findall(complete, t)) == tiles + 1, n
        for kind, bid in (("arrive", 2), ("sync", 5), ("arrive", 5)):
            assert re.search(bar(kind, bid, n), t), (n, kind, bid)
        assert not re.search(rf"bar\.(sync|arrive)\s+3, {n};", t), n
        assert "ld.acquire.gpu.global.b32" in t and "st.relaxed.gpu.global.b32" in t
    # blk 64 / D 128: warp 1 hands the stage back to the producer, one arrival per consumer
    # warp (4) on its empty mbarrier
    alias = by_threads[160][0]
    assert len(re.findall(r"mbarrier\.arrive\.shared\.b64", alias)) >= 4
