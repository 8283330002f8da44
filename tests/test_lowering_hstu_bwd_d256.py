"""CPU: ``hstu_bwd_dq="tile"`` at D = 256 — the sm90 HSTU backward adds dQ through the
query-tile workspace, each consumer warp staging its slice in the step's consumed Q / dO
tiles (``kernels/hstu_bwd_sm90.py``, ``dq_alias``), and ``kernels/hstu_dq_tiles.py`` reorders
the 16-block tiles into dq. Compile keys, lowering for sm_90a and the PTX (no GPU needed);
the GPU run is ``tests/test_gpu_hstu_bwd_d256.py``, the host statement of the workspace order
``tests/test_hstu_dq_tiles.py``."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

jax = pytest.importorskip("jax")

from jax_sparse_attn.config import Switches  # noqa: E402


def test_d256_dq_keys():
    """hstu_bwd_dq=tile (the default) sets dq_tile at every sm90 head dim, in both modes; red
    does not; the dQ writer warp (det_writer) stays off at D = 256."""
    from jax_sparse_attn.ffi import hstu as fh

    for sw in (Switches(), Switches(hstu_bwd_dq="tile")):
        for d in (64, 128, 256):
            key = fh.bwd_config("bfloat16", d, d, 0, sw)
            assert key.impl == "sm90" and key.dq_tile and not key.dq_bulk, d
        assert fh.bwd_config("bfloat16", 256, 256, 0, sw, deterministic=True).dq_tile
    red = Switches(hstu_bwd_dq="red")
    assert not fh.bwd_config("bfloat16", 256, 256, 0, red).dq_tile
    assert not fh.bwd_config("bfloat16", 256, 256, 0, Switches(hstu_bwd_dq="bulk")).dq_tile
    w = Switches(det_writer=True)
    assert not fh.bwd_config("bfloat16", 256, 256, 0, w, deterministic=True).det_writer
    assert fh.bwd_config("bfloat16", 128, 128, 0, w, deterministic=True).det_writer


def test_dq_tiles_kernel_shapes():
    """The reordering kernel takes the three tile shapes of the sm90 backward and rejects
    others by name."""
    pytest.importorskip("cutlass")
    import cutlass

    from jax_sparse_attn.kernels.hstu_dq_tiles import HstuDqFromTiles

    assert HstuDqFromTiles(cutlass.BFloat16, 64, 256).num_threads == 512
    assert HstuDqFromTiles(cutlass.BFloat16, 64, 128).num_threads == 256
    assert HstuDqFromTiles(cutlass.BFloat16, 128, 64).num_threads == 256
    with pytest.raises(NotImplementedError, match="block_m, head_dim"):
        HstuDqFromTiles(cutlass.BFloat16, 64, 96)


_SCRIPT = """
import sys
sys.path.insert(0, {root!r})
sys.path.insert(0, {tests!r})
import test_lowering_hstu as th
from jax_sparse_attn.config import Switches
txt = th._bwd_text(256, "bfloat16", {mask!r}, Switches(hstu_bwd_dq="tile"),
                   deterministic={det!r})
print("CALLS", txt.count("CuteDSLRT_NvJaxCutlassCall"))
"""


@pytest.mark.lowering
@pytest.mark.parametrize("det", [False, True], ids=["default", "deterministic"])
def test_d256_tile_ptx(tmp_path, det):
    """The D = 256 backward lowers with the schedule, the backward and the reordering kernel
    (512 threads); the backward adds dQ with two bulk reduce-adds per consumer warp from the
    Q / dO stage after a barrier of the consumer warpgroups (no red.global.add), and waits for
    their reads before it releases the stage (deterministic: for their completion, between
    the ordering barriers 2 and 3)."""
    tests = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(tests)
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_SPARSE_ATTN_")}
    env.update(CUTE_DSL_ARCH="sm_90a", JAX_SPARSE_ATTN_FORCE_KERNEL="1", CUTE_DSL_KEEP="ptx",
               CUTE_DSL_DUMP_DIR=str(tmp_path), JAX_PLATFORMS="cpu")
    mask = "causal" if det else "window"
    script = _SCRIPT.format(root=root, tests=tests, mask=mask, det=det)
    r = subprocess.run([sys.executable, "-c", script], env=env, cwd=root, capture_output=True,
                       text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "CALLS 3" in r.stdout, r.stdout[-2000:]
    texts = [p.read_text() for p in tmp_path.iterdir() if p.suffix == ".ptx"]
    bwd = [t for t in texts if "HstuBwdSm90" in t]
    tiles = [t for t in texts if "hstu_dq_tilesHstuDqFromTiles" in t]
    assert len(bwd) == 1 and len(tiles) == 1, [p.name for p in tmp_path.iterdir()]
    b = bwd[0]
    assert len(re.findall(r"cp\.reduce\.async\.bulk\.global\.shared::cta\.bulk_group\.add\.f32",
                          b)) == 2
    assert "red.relaxed.gpu.global.add" not in b and "red.global.add" not in b
    assert re.search(r"bar\.sync\s+4, 256;", b)
    complete = len(re.findall(r"cp\.async\.bulk\.wait_group\s+0;", b))
    read = len(re.findall(r"cp\.async\.bulk\.wait_group\.read\s+0;", b))
    if det:
        assert (complete, read) == (2, 0)
        for kind, bid in (("sync", 2), ("arrive", 2), ("sync", 3), ("arrive", 3)):
            assert re.search(rf"bar\.{kind}\s+{bid}, 288;", b), (kind, bid)
    else:
        assert (complete, read) == (1, 1)
        assert "ld.acquire.gpu" not in b
    assert re.search(r"\.reqntid 512, 1, 1", tiles[0])
