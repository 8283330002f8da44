"""CPU: ``hstu_bwd_dq="tile"`` at D = 256 — the sm90 HSTU backward adds dQ through the
query-tile workspace, each consumer warp staging its slice in the step's consumed Q / dO
tiles (``kernels/hstu_bwd_sm90.py``, ``dq_alias``), and ``kernels/hstu_dq_tiles.py`` reorders
the 16-block tiles into dq. Compile keys, lowering for sm_90a and the PTX (no GPU needed);
the GPU run is ``tests/test_gpu_hstu_bwd_d256.py``, the host statement of the workspace order
``tests/test_hstu_dq_tiles.py``. The PTX tests of the opt-in ``hstu_bwd_ws`` variants
(``splitwait``, ``epiregs`` / ``epi16``, ``detzero``, ``dqclaim``, ``convert=N``) are marked
``ablation`` (``pytest -m ablation``) and read the PTX of :func:`kept_ptx_ablation`."""

from __future__ import annotations

import os
import re

import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

jax = pytest.importorskip("jax")

from jax_sparse_attn.config import Switches  # noqa: E402


def test_d256_dq_keys():
    """hstu_bwd_dq=tile (the default) sets dq_tile at every sm90 head dim, in both modes; red
    does not; the dQ writer warp runs at D = 256 in both modes (dq_writer "auto" / det_writer)
    and, not deterministic, at D <= 128 only with dq_writer="on"."""
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
    assert fh.bwd_config("bfloat16", 256, 256, 0, w, deterministic=True).det_writer
    assert fh.bwd_config("bfloat16", 128, 128, 0, w, deterministic=True).det_writer
    assert not fh.bwd_config("bfloat16", 256, 256, 0, Switches(det_writer=False),
                             deterministic=True).det_writer
    for d in (64, 128, 256):
        auto = fh.bwd_config("bfloat16", d, d, 0, Switches())
        assert auto.dq_writer == (d == 256) and not auto.det_writer, d
        assert fh.bwd_config("bfloat16", d, d, 0, Switches(dq_writer="on")).dq_writer
        assert not fh.bwd_config("bfloat16", d, d, 0, Switches(dq_writer="off")).dq_writer
        assert not fh.bwd_config("bfloat16", d, d, 0, Switches(dq_writer="on"),
                                 deterministic=True).dq_writer


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


# the PTX tests' configurations (functions of tests/test_lowering_hstu.py), lowered in one
# fresh process (tests/kept_ptx.py): the default mode with the window mask at D = 256 and
# D = 128, and the deterministic mode (first contributions stored, the default): D = 256
# (blocks staged in the Q / dO stage) with the causal mask, D = 128 (the staging tile) with a
# func mask, D = 64 with the window
_PTX_CONFIGS = {
    "default": ("_bwd_text", (256, "bfloat16", "window"), {"hstu_bwd_dq": "tile"},
                {"deterministic": False}),
    "default-d128": ("_bwd_text", (128, "bfloat16", "window"), {"hstu_bwd_dq": "tile"}, {}),
    "detstore-d256": ("_bwd_text", (256, "bfloat16", "causal"),
                      {"hstu_bwd_dq": "tile"},
                      {"deterministic": True}),
    "detstore-d128": ("_bwd_text", (128, "bfloat16", "func"),
                      {"hstu_bwd_dq": "tile"},
                      {"deterministic": True}),
    "detstore-d64": ("_bwd_text", (64, "float16", "window"),
                     {"hstu_bwd_dq": "tile"},
                     {"deterministic": True}),
}
# the ablation tests' configurations (opt-in hstu_bwd_ws variants), kept by kept_ptx_ablation:
# the deterministic mode with the causal mask and the zeroed workspace (detzero), splitwait at
# the head dims with 64-query tiles, the register epilogues, dqclaim, convert=N
_PTX_ABLATION = {
    "deterministic": ("_bwd_text", (256, "bfloat16", "causal"),
                      {"hstu_bwd_dq": "tile", "hstu_bwd_ws": "detzero"},
                      {"deterministic": True}),
    "split-d256": ("_bwd_text", (256, "bfloat16", "window"),
                   {"hstu_bwd_dq": "tile", "hstu_bwd_ws": "splitwait"}, {}),
    "split-d128": ("_bwd_text", (128, "bfloat16", "window"),
                   {"hstu_bwd_dq": "tile", "hstu_bwd_ws": "splitwait"}, {}),
    "epi16-d128": ("_bwd_text", (128, "bfloat16", "window"),
                   {"hstu_bwd_dq": "tile", "hstu_bwd_ws": "epi16"}, {}),
    "epiregs-d128": ("_bwd_text", (128, "bfloat16", "window"),
                     {"hstu_bwd_dq": "tile", "hstu_bwd_ws": "epiregs"}, {}),
    # dqclaim (not deterministic): D = 256 causal, D = 128 func, D = 64 window
    "dqclaim-d256": ("_bwd_text", (256, "bfloat16", "causal"),
                     {"hstu_bwd_dq": "tile", "hstu_bwd_ws": "dqclaim"}, {}),
    "dqclaim-d128": ("_bwd_text", (128, "bfloat16", "func"),
                     {"hstu_bwd_dq": "tile", "hstu_bwd_ws": "dqclaim"}, {}),
    "dqclaim-d64": ("_bwd_text", (64, "float16", "window"),
                    {"hstu_bwd_dq": "tile", "hstu_bwd_ws": "dqclaim"}, {}),
    # convert=N: D = 128 window, D = 64 (fp16) with dqclaim
    "convert-d128": ("_bwd_text", (128, "bfloat16", "window"),
                     {"hstu_bwd_dq": "tile", "hstu_bwd_ws": "convert=1024"}, {}),
    "convert-claim-d64": ("_bwd_text", (64, "float16", "window"),
                          {"hstu_bwd_dq": "tile", "hstu_bwd_ws": "dqclaim,convert=512"}, {}),
}


@pytest.fixture(scope="module")
def kept_ptx(tmp_path_factory):
    """The directory of the PTX and lowered text kept while lowering :data:`_PTX_CONFIGS`."""
    import kept_ptx as kp  # noqa: PLC0415

    return kp.keep_ptx_shared(tmp_path_factory, "test_lowering_hstu_bwd_d256",
                              "test_lowering_hstu", _PTX_CONFIGS)


@pytest.fixture(scope="module")
def kept_ptx_ablation(tmp_path_factory):
    """The directory of the PTX and lowered text kept while lowering :data:`_PTX_ABLATION`."""
    import kept_ptx as kp  # noqa: PLC0415

    return kp.keep_ptx_shared(tmp_path_factory, "test_lowering_hstu_bwd_d256_ablation",
                              "test_lowering_hstu", _PTX_ABLATION)


@pytest.mark.lowering
@pytest.mark.ablation
@pytest.mark.parametrize("d", [128, 256])
def test_bwd_splitwait_ptx(kept_ptx, kept_ptx_ablation, d):
    """``hstu_bwd_ws=splitwait`` re-checks the step's Q / dO full barrier right before the
    dP^T wait: one more mbarrier try-wait in the backward than without it, the same
    warpgroup MMAs and waits."""
    import kept_ptx as kp  # noqa: PLC0415

    def bwd(kept, name):
        b = [t for t in kp.ptx_of(kept, name).values() if "HstuBwdSm90" in t]
        assert len(b) == 1
        return b[0]

    default = bwd(kept_ptx, "default" if d == 256 else "default-d128")
    split = bwd(kept_ptx_ablation, f"split-d{d}")
    assert split.count("mbarrier.try_wait") == default.count("mbarrier.try_wait") + 1
    for needle in ("wgmma.mma_async", "wgmma.wait_group.sync.aligned"):
        assert split.count(needle) == default.count(needle), needle


@pytest.mark.lowering
@pytest.mark.ablation
def test_bwd_epi_pairs_ptx(kept_ptx, kept_ptx_ablation):
    """From registers (``hstu_bwd_ws=epiregs``) dK / dV go out as packed pairs: 4-byte
    global stores after a bf16x2 conversion, half as many as the one 2-byte store per value
    of ``epi16``; the default (through shared memory) has neither."""
    import kept_ptx as kp  # noqa: PLC0415

    def bwd(kept, name):
        b = [t for t in kp.ptx_of(kept, name).values() if "HstuBwdSm90" in t]
        assert len(b) == 1
        return b[0]

    pairs, epi16 = bwd(kept_ptx_ablation, "epiregs-d128"), bwd(kept_ptx_ablation, "epi16-d128")
    n16 = len(re.findall(r"st\.global\.b16", epi16))
    assert n16 > 0 and not re.findall(r"st\.global\.b16", pairs)
    assert len(re.findall(r"st\.global\.b32", pairs)) == n16 // 2
    assert "cvt.rn.bf16x2.f32" in pairs
    assert not re.findall(r"st\.global\.b(16|32)", bwd(kept_ptx, "default-d128"))


def _d256_kernels(kept_ptx, name):
    """The PTX of the backward and of the reordering kernel of the D = 256 configuration
    ``name``, whose call launches the schedule, the backward and the reordering (nothing
    else)."""
    import kept_ptx as kp  # noqa: PLC0415

    calls = kp.lowered_text_of(kept_ptx, name).count("CuteDSLRT_NvJaxCutlassCall")
    assert calls == 3, calls
    files = kp.ptx_of(kept_ptx, name)
    bwd = [t for t in files.values() if "HstuBwdSm90" in t]
    tiles = [t for t in files.values() if "hstu_dq_tilesHstuDqFromTiles" in t]
    assert len(bwd) == 1 and len(tiles) == 1, list(files)
    # the reordering kernel: 512 threads at D = 256
    assert re.search(r"\.reqntid 512, 1, 1", tiles[0])
    return bwd[0]


def _assert_writer_hand_off(b):
    """The dQ writer warp's protocol in the D = 256 backward's PTX ``b``: two bulk
    reduce-adds per consumer warp (8 warps x 2 = 16) and no per-element atomics; the
    consumer warpgroups meet (bar 4, 256 threads) before staging their slices in the Q / dO
    stage, so that no warp overwrites a tile another one still reads; they hand the slices
    to the writer (bar 2) and the writer hands the stage back once its bulk operations have
    read it (bar 5): 256 consumer + 32 writer threads, both synced and arrived on, and no
    third 288-thread barrier (3). Returns the bulk reduce-adds' matches."""
    adds = re.findall(r"cp\.reduce\.async\.bulk\.global\.shared::cta\.bulk_group\.add\.f32", b)
    assert len(adds) == 16, len(adds)
    assert "red.relaxed.gpu.global.add" not in b and "red.global.add" not in b
    assert re.search(r"bar\.sync\s+4, 256;", b)
    for kind, bid in (("sync", 2), ("arrive", 2), ("sync", 5), ("arrive", 5)):
        assert re.search(rf"bar\.{kind}\s+{bid}, 288;", b), (kind, bid)
    assert not re.search(r"bar\.(sync|arrive)\s+3, 288;", b)
    return adds


def _bulk_waits(b):
    """The counts of ``cp.async.bulk.wait_group 0`` (completion) and of
    ``cp.async.bulk.wait_group.read 0`` (reads) in the PTX ``b``."""
    return (len(re.findall(r"cp\.async\.bulk\.wait_group\s+0;", b)),
            len(re.findall(r"cp\.async\.bulk\.wait_group\.read\s+0;", b)))


@pytest.mark.lowering
@pytest.mark.parametrize("det", [False, pytest.param(True, marks=pytest.mark.ablation)],
                         ids=["default", "deterministic"])
def test_d256_tile_ptx(request, det):
    """The D = 256 backward lowers with the schedule, the backward and the reordering kernel
    (512 threads); the consumer warps stage their dQ slices in the Q / dO stage after a
    barrier of the consumer warpgroups (bar 4) and hand them to the writer warp (bar 2), which
    adds them with two bulk reduce-adds per consumer warp (16, no red.global.add), waits for
    their reads, releases the stage and hands the slices back (bar 5); deterministic: it also
    waits for the previous KV tile's additions (acquire loads) and for the completion of its
    own before it publishes (with ``hstu_bwd_ws=detzero``, the zeroed workspace)."""
    name = "deterministic" if det else "default"
    b = _d256_kernels(request.getfixturevalue("kept_ptx_ablation" if det else "kept_ptx"), name)
    _assert_writer_hand_off(b)
    if det:
        assert _bulk_waits(b) == (2, 1)
        assert "ld.acquire.gpu" in b
    else:
        assert _bulk_waits(b) == (1, 1)
        assert "ld.acquire.gpu" not in b


@pytest.mark.lowering
def test_detstore_d256_sync_ptx(kept_ptx):
    """The default deterministic D = 256 backward (first contributions stored,
    ``detstore-d256`` of :data:`_PTX_CONFIGS`) keeps the synchronization of the ablation
    ``test_d256_tile_ptx[deterministic]`` (``hstu_bwd_ws=detzero``): the same named barriers
    (4 of the consumer warpgroups, the 288-thread pair 2 / 5 with the writer warp), the
    acquire wait for the previous KV tile's additions and the wait counts (2, 1), and the
    publish after the completion of its own additions. Its PTX differs from detzero's only
    by the bulk store path next to the reduce-adds: 16 bulk stores and 16 bulk reduce-adds
    (detzero: 16 reduce-adds, no stores) and the async-proxy fence after the acquire; the
    equality of the two counts and the reordering kernel's zero select are
    :func:`test_detstore_ptx`'s."""
    b = _d256_kernels(kept_ptx, "detstore-d256")
    adds = _assert_writer_hand_off(b)
    # as many bulk stores as reduce-adds: a query tile's first contribution is stored
    stores = re.findall(r"cp\.async\.bulk\.global\.shared::cta\.bulk_group \[", b)
    assert len(stores) == 16, len(stores)
    # one wait for the bulk reads before the stage goes back (bar 5), and two for the
    # completion: the one before the writer publishes its tile, the one at its exit
    assert _bulk_waits(b) == (2, 1), _bulk_waits(b)
    # the writer waits (acquire loads of the tile's counter) for the previous KV tile's
    # additions; only then the async-proxy fence, and only then the stage hand-off (bar 2)
    # and the bulk stores / adds, which the fence orders after the acquire
    acq = [m.start() for m in re.finditer(r"ld\.acquire\.gpu\.global\.b32", b)]
    assert acq, "ld.acquire.gpu"
    fence = b.find("fence.proxy.async.global")
    hand = re.search(r"bar\.sync\s+2, 288;", b).start()
    first_bulk = min(b.find(stores[0]), b.find(adds[0]))
    assert max(acq) < fence < hand < first_bulk, (acq, fence, hand, first_bulk)
    # the counter is published (fence.acq_rel + relaxed store, i.e. a release) only after
    # its own bulk operations completed: the next KV tile's acquire then sees them in dQ
    pub = re.search(r"fence\.acq_rel\.gpu;\s*st\.relaxed\.gpu\.global\.b32", b)
    assert pub
    bulk_before = re.findall(r"cp\.(?:reduce\.)?async\.bulk\.\S+", b[:pub.start()])
    assert bulk_before[-1] == "cp.async.bulk.wait_group", bulk_before[-3:]


def test_dqclaim_keys():
    """``hstu_bwd_ws=dqclaim`` turns the dQ writer warp on and reaches the compile key in the
    default (not deterministic) mode with the dQ tile workspace, at every head dim, whatever
    ``dq_writer`` says; not with ``red`` and not in deterministic mode."""
    from jax_sparse_attn.ffi import hstu as fh

    for d in (64, 128, 256):
        for writer in ("auto", "on", "off"):
            key = fh.bwd_config("bfloat16", d, d, 0, Switches(hstu_bwd_ws="dqclaim",
                                                              dq_writer=writer))
            assert key.dq_claim and key.dq_writer, (d, writer)
        assert not fh.bwd_config("bfloat16", d, d, 0, Switches()).dq_claim
        assert not fh.bwd_config("bfloat16", d, d, 0, Switches(hstu_bwd_ws="dqclaim"),
                                 deterministic=True).dq_claim
        key = fh.bwd_config("bfloat16", d, d, 0, Switches(hstu_bwd_ws="dqclaim",
                                                          hstu_bwd_dq="red"))
        assert not key.dq_claim and not key.dq_writer, d


@pytest.mark.lowering
@pytest.mark.ablation
@pytest.mark.parametrize("d", [64, 128, 256])
def test_dqclaim_ptx(kept_ptx, kept_ptx_ablation, d):
    """With ``dqclaim`` the writer warp claims each query tile with an atomic add, waits with
    acquire loads, publishes after a GPU-scope fence, and has a bulk store path next to its
    bulk reduce-adds (the same blocks), with an async-proxy fence after the acquire; the
    reordering kernel zeroes the tiles nobody claimed."""
    import kept_ptx as kp  # noqa: PLC0415

    files = kp.ptx_of(kept_ptx_ablation, f"dqclaim-d{d}")
    bwd = [t for t in files.values() if "HstuBwdSm90" in t]
    assert len(bwd) == 1
    text = bwd[0]
    for needle in ("atom.relaxed.gpu.global.add.s32", "ld.acquire.gpu.global.b32",
                   "fence.acq_rel.gpu", "st.relaxed.gpu.global.b32"):
        assert needle in text, needle
    copies = re.findall(r"cp\.async\.bulk\.global\.shared::cta\.bulk_group \[", text)
    adds = re.findall(r"cp\.reduce\.async\.bulk\.global\.shared::cta\.bulk_group\.add\.f32",
                      text)
    assert copies and len(copies) == len(adds), (len(copies), len(adds))
    # after the acquire, before the additions
    assert "fence.proxy.async.global" in text
    _assert_reorder_zero_select(kept_ptx, files)


def test_convert_keys():
    """``hstu_bwd_ws=convert=N`` reaches the compile key in the default mode with the dQ
    tile workspace at D <= 128 (the staging tile), not at D = 256, with ``red`` or in
    deterministic mode; N outside 1..65536 is a ValueError naming the switch."""
    from jax_sparse_attn import config
    from jax_sparse_attn.ffi import hstu as fh

    sw = Switches(hstu_bwd_ws="convert=700")
    for d in (64, 128):
        assert fh.bwd_config("bfloat16", d, d, 0, sw).dq_convert_rows == 700, d
        assert fh.bwd_config("bfloat16", d, d, 0, sw, deterministic=True).dq_convert_rows == 0
        assert fh.bwd_config("bfloat16", d, d, 0, Switches(
            hstu_bwd_ws="convert=700", hstu_bwd_dq="red")).dq_convert_rows == 0
        assert fh.bwd_config("bfloat16", d, d, 0, Switches()).dq_convert_rows == 0
    assert fh.bwd_config("bfloat16", 256, 256, 0, sw).dq_convert_rows == 0
    for bad in ("convert=0", "convert=70000", "convert=x", "convert"):
        with pytest.raises(ValueError, match="JAX_SPARSE_ATTN_HSTU_BWD_WS.*convert=N"):
            config.from_env({"JAX_SPARSE_ATTN_HSTU_BWD_WS": bad})


@pytest.mark.lowering
@pytest.mark.ablation
@pytest.mark.parametrize("name,atoms", [("convert-d128", 1), ("convert-claim-d64", 2)])
def test_convert_ptx(kept_ptx_ablation, name, atoms):
    """With ``convert=N`` the consumers count the CTA as finished (one fenced atomic add; with
    ``dqclaim`` the writer's claims too) and the last one converts the workspace tiles
    through shared memory with the consumer-only named barrier 7; the writer warp (with
    ``dqclaim``) arrives on barrier 6 once its additions are complete."""
    import kept_ptx as kp  # noqa: PLC0415

    files = kp.ptx_of(kept_ptx_ablation, name)
    bwd = [t for t in files.values() if "HstuBwdSm90" in t]
    assert len(bwd) == 1
    text = bwd[0]
    assert text.count("atom.relaxed.gpu.global.add.s32") >= atoms
    assert re.search(r"fence\.acq_rel\.gpu;\s*atom\.relaxed\.gpu\.global\.add\.s32"
                     r"[^;]*;\s*fence\.acq_rel\.gpu;", text)
    assert re.search(r"bar\.sync\s+7", text) and re.search(r"bar\.sync\s+6", text)
    if atoms == 2:
        assert re.search(r"bar\.arrive\s+6", text)
    assert len([t for t in files.values() if "HstuDqFromTiles" in t]) == 1


def test_detstore_keys():
    """The deterministic backward stores each query tile's first dQ contribution (det_store)
    by default with the dQ tile workspace and the writer warp (det_writer, the default), at
    every head dim; ``hstu_bwd_ws=detzero`` turns it off; never in the default mode."""
    from jax_sparse_attn.ffi import hstu as fh

    for d in (64, 128, 256):
        key = fh.bwd_config("bfloat16", d, d, 0, Switches(), deterministic=True)
        assert key.det_writer and key.det_store, d
        assert not fh.bwd_config("bfloat16", d, d, 0, Switches()).det_store, d
        assert not fh.bwd_config("bfloat16", d, d, 0, Switches(hstu_bwd_ws="detzero"),
                                 deterministic=True).det_store, d
        assert not fh.bwd_config("bfloat16", d, d, 0, Switches(det_writer=False),
                                 deterministic=True).det_store
        assert not fh.bwd_config("bfloat16", d, d, 0, Switches(hstu_bwd_dq="red"),
                                 deterministic=True).det_store
    with pytest.raises(ValueError, match="detzero"):
        Switches(hstu_bwd_ws="detstore")


@pytest.mark.lowering
@pytest.mark.parametrize("d", [64, 128, 256])
def test_detstore_ptx(kept_ptx, d):
    """By default the deterministic backward's writer warp has a bulk store path next
    to its bulk reduce-adds (one store per reduce-add: the same blocks) and an async-proxy
    fence after the acquire, and the reordering kernel zeroes the tiles nobody covered."""
    import kept_ptx as kp  # noqa: PLC0415

    files = kp.ptx_of(kept_ptx, f"detstore-d{d}")
    bwd = [t for t in files.values() if "HstuBwdSm90" in t]
    assert len(bwd) == 1
    copies = re.findall(r"cp\.async\.bulk\.global\.shared::cta\.bulk_group \[", bwd[0])
    adds = re.findall(r"cp\.reduce\.async\.bulk\.global\.shared::cta\.bulk_group\.add\.f32",
                      bwd[0])
    assert copies and len(copies) == len(adds), (len(copies), len(adds))
    assert "fence.proxy.async.global" in bwd[0]
    _assert_reorder_zero_select(kept_ptx, files)


def _assert_reorder_zero_select(kept_ptx, files):
    """The reordering kernel of a configuration without zeroed workspace selects 0 for the
    loaded values (tiles whose counter is 0), which the default one never does."""
    import kept_ptx as kp  # noqa: PLC0415

    zero_sel = re.compile(r"selp\.(b32|f32)\s+%r\d+, (0|0f00000000), %r\d+")
    reorder = [t for t in files.values() if "HstuDqFromTiles" in t]
    assert len(reorder) == 1 and zero_sel.search(reorder[0])
    default = [t for t in kp.ptx_of(kept_ptx, "default-d128").values() if "HstuDqFromTiles" in t]
    assert len(default) == 1 and not zero_sel.search(default[0])


@pytest.mark.lowering
@pytest.mark.parametrize("d", [64, 128, 256])
def test_schedule_launch_zeroes_dq_workspace(d, monkeypatch):
    """By default the sm90 backward's fp32 dQ tile workspace comes zeroed from the
    tile-schedule launch (a flat fp32 output of it, no XLA broadcast of zeros in the
    workspace's shape); ``hstu_bwd_ws=xlazero`` zeroes it with an XLA broadcast, and the
    deterministic mode (first contributions stored) zeroes it nowhere."""
    import test_lowering_hstu as tl  # noqa: PLC0415

    if not tl._have_cutedsl():
        pytest.skip("CuTe DSL not importable")
    monkeypatch.setenv("JAX_SPARSE_ATTN_FORCE_KERNEL", "1")
    bm = 128 if d <= 64 else 64
    ws = re.compile(rf"broadcast_in_dim %\w+, dims = \[\] : \(tensor<f32>\) -> "
                    rf"tensor<\d+x2x{bm * d}xf32>")
    flat = re.compile(r"-> \(tensor<\d+xi32>, tensor<\d+xi32>, tensor<\d+x2xi32>, "
                      r"tensor<\d+xi32>, tensor<\d+xf32>\)")
    base = {"hstu_bwd_dq": "tile"}
    default = tl._bwd_text(d, "bfloat16", "causal", Switches(**base))
    assert not ws.search(default) and flat.search(default)
    # the flat output covers the whole workspace (reshaped to it)
    m = re.search(rf"reshape %\S+ : \(tensor<(\d+)xf32>\) -> tensor<(\d+)x2x{bm * d}xf32>",
                  default)
    assert m and int(m.group(1)) == int(m.group(2)) * 2 * bm * d, m
    xla = tl._bwd_text(d, "bfloat16", "causal", Switches(**base, hstu_bwd_ws="xlazero"))
    assert ws.search(xla) and not flat.search(xla)
    det = tl._bwd_text(d, "bfloat16", "causal", Switches(**base), deterministic=True)
    assert not ws.search(det) and not flat.search(det)
