"""GPU entry point of the shared BSA grid: the CuTe DSL kernels vs the fp32 reference.

The grid and the rule live in ``tests/attention_base.py`` (kernel error vs the float32
reference <= 2x (forward, lse) / 5x (backward) the error of the same computation in the
input dtype, plus a small atol; NaN never passes; rows with no key must give out = 0,
lse = -inf and zero gradients).

Run on the H200: ``python -m pytest -m gpu tests/test_gpu_bsa.py`` (about 20 s per case,
mostly CuTe DSL + reference compiles). Shard with ``BSA_TEST_SHARD=i/n`` to run several
processes in parallel (CuTe compiles are serial inside one process). The non-grid tests
run in one shard each, spread over the shards. The default kernels are the wgmma ones for
D in {64, 128} (the sm90ws forward and backward, pack_gqa and causal included); ``BSA_TEST_IMPLS`` (a comma list) adds the grid with other switches:
``sm80``: ``Switches(bsa_fwd_impl="sm80", bsa_bwd_impl="sm80", bsa_pre_impl="xla")`` (the
mma.sync kernels at every D and the XLA preprocessing); ``sm90ws``:
``Switches(bsa_fwd_impl="sm90ws")`` (the warp-specialized forward named, as ``auto`` runs it); ``sm80_late_v``:
the mma.sync forward with ``bsa_fwd_late_v_wait=True``; ``sm80_wr32``: with
``bsa_fwd_warp_rows="32"`` (at every block size: slow where it spills, still exact);
``sm80_wr16``: with ``bsa_fwd_warp_rows="16"`` (the rows the ``auto`` default does not
run at sparse_block_size 64, D <= 128); ``bwdws``: ``Switches(bsa_bwd_impl="sm90ws")`` (the
warp-specialized backward named); ``kqxla``: the backward's K->Q lists by XLA instead of the
list kernel; ``notailconv``: the dq reordering a call of its own after the backward;
``nolpt``: the backward's CTAs in grid order instead of longest list first per (batch, KV
head); ``bwdrows``: ``Switches(bsa_bwd_dq="rows")`` (the Hopper
backwards with the row-major dQ workspace instead of the query-tile one); ``dqalt``:
``Switches(bsa_bwd_ws="dqalt")`` (blk 128: the consumer warpgroups take turns computing a
step's whole dQ); ``qregs``: ``Switches(bsa_fwd_ws="qregs")`` (the sm90ws forward with Q as
the register operand of its S GEMMs); ``mpre``: ``Switches(bsa_fwd_ws="mpre")`` (the sm90ws
forward loading the next work item's list metadata during the current one); ``qahead``:
``Switches(bsa_fwd_ws="qahead")`` (its producer issuing the next item's Q during the current
item); ``noepivec``: ``Switches(bsa_fwd_ws="noepivec")`` (its epilogue staging O through the
element copies of the swizzled layout instead of packed pair stores); ``notmao``:
``Switches(bsa_fwd_ws="notmao")`` (its consumer warpgroups copying the staged O out
themselves instead of TMA tensor stores); ``ctas3k1``: ``Switches(bsa_fwd_ws="ctas3k1")``
(three CTAs per SM at blk 64 / D 128); ``selfload``: ``Switches(bsa_fwd_ws="selfload")``
(the same without the producer warp); ``pairwg``: ``Switches(bsa_fwd_ws="pairwg")`` (blk 64:
two consumer warpgroups per CTA with work items of their own); ``l2hint`` / ``l2normal``:
``bsa_fwd_ws`` and ``bsa_bwd_ws`` with L2 eviction priorities per tensor / ``evict_normal``
on the TMA copies; ``oearly`` / ``sumtree``: ``Switches(bsa_fwd_ws=...)`` with O rescaled
under the next S GEMM / the row sums added pairwise; ``half``: ``Switches(bsa_fwd_ws="half")``
(blk 128 walked by 64-row work items); ``half2``: the same with two CTAs per SM; ``kdeep``: ``Switches(bsa_fwd_ws=("kdeep",
"vlag"))`` (three K, two V stages, K issued a tile ahead of V); ``pairstep`` / ``pairstep4``:
``Switches(bsa_fwd_ws="pairstep")`` / ``"pairstep4"`` (blk 64 / D 128 walked two listed blocks
per step), ``pairstepk3`` / ``pairstepk4`` (the same with three / four K stages); ``kvwarps``:
``Switches(bsa_fwd_ws="kvwarps")`` (one producer warp for Q and K, one for V);
``pairstepk4kv``: ``("pairstepk4", "kvwarps")``; ``pairbox``: ``Switches(bsa_fwd_ws="pairbox")`` (blk 64
/ D 128, two listed blocks per 128-row K / V stage); ``sortlists``:
``Switches(bsa_fwd_ws="sortlists")`` (each active list sorted by XLA before the kernel); ``sortbox``: the two together; ``sn64``: ``Switches(bsa_fwd_ws="sn64")`` (blk 128:
each S GEMM as two 64-column GEMMs); ``mix2`` / ``mix4``: ``Switches(bsa_fwd_ws="mix=2")`` /
``"mix=4"`` (the PV GEMM's first K steps among the next S GEMM's); ``wgrelease``:
``Switches(bsa_fwd_ws="wgrelease")`` (one empty-barrier arrival per consumer warpgroup on the
K / V stages); ``nodefault`` leaves out the grid with
the default switches.
``test_bsa_preprocess_kernel`` checks the preprocessing kernel directly.
``test_bsa_sm90ws_forward`` adds the sm90ws forward's own cases (every KV block listed, the
partial last block listed by every row, NaN in unlisted blocks and past block_sizes,
outputs poisoned by a preceding all-NaN run); ``tests/gpu_bsa_ws.sh`` runs them, the grid on
sm90ws and the benchmark in one device call. ``test_bsa_sm90ws_forward_ctas3k1`` runs the
blk 64 / D 128 ones and three more under ``bsa_fwd_ws`` flags ``BSA_TEST_K1`` (a comma
list, default ``ctas3k1``; e.g. ``selfload`` or ``ctas3k1,nooverlap``);
``test_bsa_sm90ws_forward_pairwg`` the blk 64 ones and four more (rows of varied lengths,
a CTA whose second warpgroup has no item, every block listed) under ``BSA_TEST_PAIR``
(default ``pairwg``; e.g. ``pairwg,nopingpong``).
"""

from __future__ import annotations

import dataclasses
import functools
import os

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

from attention_base import (BSA_GRID, BSACase, BSAKernelGrid, _rows_bhs, bsa_inputs,  # noqa: E402
                            check_bsa_garbage_clamped, check_rule, shard)
from attention_base import generate as pytest_generate_tests  # noqa: E402, F401
from jax_sparse_attn.config import Switches  # noqa: E402

pytestmark = pytest.mark.gpu

SHARD = os.environ.get("BSA_TEST_SHARD", "")
SM80 = Switches(bsa_fwd_impl="sm80", bsa_bwd_impl="sm80", bsa_pre_impl="xla")
SM90WS = Switches(bsa_fwd_impl="sm90ws")
BWDWS = Switches(bsa_bwd_impl="sm90ws")
BWDROWS = Switches(bsa_bwd_dq="rows")
BWDROWS4 = Switches(bsa_bwd_impl="sm90ws", bsa_bwd_dq="rows", bsa_bwd_ws=("redv4",))
DQALT = Switches(bsa_bwd_ws="dqalt")
QREGS = Switches(bsa_fwd_ws=("qregs",))
MPRE = Switches(bsa_fwd_ws=("mpre",))
QAHEAD = Switches(bsa_fwd_ws=("qahead",))
NOEPIVEC = Switches(bsa_fwd_ws=("noepivec",))
NOTMAO = Switches(bsa_fwd_ws=("notmao",))
OINQ = Switches(bsa_fwd_ws=("oinq",))
OEARLY = Switches(bsa_fwd_ws=("oearly",))
SUMTREE = Switches(bsa_fwd_ws=("sumtree",))
HALF = Switches(bsa_fwd_ws=("half",))
HALF2 = Switches(bsa_fwd_ws=("half2",))
KDEEP = Switches(bsa_fwd_ws=("kdeep", "vlag"))
PAIRSTEP = Switches(bsa_fwd_ws=("pairstep",))
PAIRSTEP4 = Switches(bsa_fwd_ws=("pairstep4",))
PAIRSTEPK3 = Switches(bsa_fwd_ws=("pairstepk3",))
PAIRSTEPK4 = Switches(bsa_fwd_ws=("pairstepk4",))
KVWARPS = Switches(bsa_fwd_ws=("kvwarps",))
PAIRSTEPK4KV = Switches(bsa_fwd_ws=("pairstepk4", "kvwarps"))
PAIRBOX = Switches(bsa_fwd_ws=("pairbox",))
SORTLISTS = Switches(bsa_fwd_ws=("sortlists",))
SORTBOX = Switches(bsa_fwd_ws=("sortlists", "pairbox"))
SN64 = Switches(bsa_fwd_ws=("sn64",))
MIX2 = Switches(bsa_fwd_ws=("mix=2",))
MIX4 = Switches(bsa_fwd_ws=("mix=4",))
WGRELEASE = Switches(bsa_fwd_ws=("wgrelease",))
CTAS3K1 = Switches(bsa_fwd_ws=("ctas3k1",))
SELFLOAD = Switches(bsa_fwd_ws=("selfload",))
PAIRWG = Switches(bsa_fwd_ws=("pairwg",))
#: L2 policies on the forward's and the backward's TMA copies (and the dQ bulk reductions)
L2HINT = Switches(bsa_fwd_ws=("l2hint",), bsa_bwd_ws=("l2hint",))
L2NORMAL = Switches(bsa_fwd_ws=("l2normal",), bsa_bwd_ws=("l2normal",))
KQXLA = Switches(bsa_kq_impl="xla")
NOTAILCONV = Switches(bsa_bwd_ws=("notailconv",))
NOLPT = Switches(bsa_bwd_ws=("nolpt",))
LDSCALE = Switches(bsa_bwd_ws=("ldscale",))
NOWGHAND = Switches(bsa_bwd_ws=("nowghand",))
SAHEAD = Switches(bsa_bwd_ws=("sahead",))
NOFDIV = Switches(bsa_bwd_ws=("nofdiv",))
NOQPROBE = Switches(bsa_bwd_ws=("noqprobe",))
ENTAHEAD = Switches(bsa_bwd_ws=("entahead",))
NODQLAG = Switches(bsa_bwd_ws=("nodqlag",))
NOWGUNI = Switches(bsa_bwd_ws=("nowguni",))
SM80_LATE_V = Switches(bsa_fwd_impl="sm80", bsa_fwd_late_v_wait=True)
SM80_WR32 = Switches(bsa_fwd_impl="sm80", bsa_fwd_warp_rows="32")
SM80_WR16 = Switches(bsa_fwd_impl="sm80", bsa_fwd_warp_rows="16")


def _only_in_shard(j):
    """Non-grid test number ``j``: runs in shard ``(len(BSA_GRID) + j) % n`` only."""
    if SHARD:
        i, n = (int(x) for x in SHARD.split("/"))
        if (len(BSA_GRID) + j) % n != i:
            pytest.skip(f"BSA_TEST_SHARD: runs in shard {(len(BSA_GRID) + j) % n}/{n}")


class TestBSAKernelGrid(BSAKernelGrid):
    #: ``BSA_TEST_IMPLS`` names and the switches each adds the grid with
    IMPLS = {"sm80": SM80, "sm90ws": SM90WS, "bwdws": BWDWS, "bwdrows": BWDROWS,
             "dqalt": DQALT, "qregs": QREGS, "mpre": MPRE, "qahead": QAHEAD,
             "noepivec": NOEPIVEC, "notmao": NOTMAO, "ctas3k1": CTAS3K1, "selfload": SELFLOAD,
             "pairwg": PAIRWG, "oinq": OINQ, "oearly": OEARLY, "sumtree": SUMTREE, "half": HALF, "half2": HALF2, "kdeep": KDEEP, "pairstep": PAIRSTEP, "pairstep4": PAIRSTEP4, "pairstepk3": PAIRSTEPK3, "pairstepk4": PAIRSTEPK4, "kvwarps": KVWARPS, "pairstepk4kv": PAIRSTEPK4KV, "pairbox": PAIRBOX, "sortlists": SORTLISTS, "sortbox": SORTBOX, "sn64": SN64, "mix2": MIX2, "mix4": MIX4, "wgrelease": WGRELEASE, "l2hint": L2HINT, "l2normal": L2NORMAL, "kqxla": KQXLA, "notailconv": NOTAILCONV, "nolpt": NOLPT,
             "ldscale": LDSCALE, "nowghand": NOWGHAND, "sahead": SAHEAD, "nofdiv": NOFDIV, "noqprobe": NOQPROBE, "entahead": ENTAHEAD, "nodqlag": NODQLAG, "nowguni": NOWGUNI, "bwdrows4": BWDROWS4, "sm80_late_v": SM80_LATE_V, "sm80_wr32": SM80_WR32,
             "sm80_wr16": SM80_WR16}

    @classmethod
    def grid(cls):
        extra = [x for x in os.environ.get("BSA_TEST_IMPLS", "").split(",") if x]
        # a name the grid does not know would otherwise be dropped silently (with
        # "nodefault": an empty grid, every test skipped, the run green)
        unknown = [x for x in extra if x != "nodefault" and x not in cls.IMPLS]
        if unknown:
            raise ValueError(f"BSA_TEST_IMPLS: unknown {unknown}; known: nodefault, "
                             f"{', '.join(cls.IMPLS)}")
        cases = [] if "nodefault" in extra else [(c, Switches()) for c in BSA_GRID]
        for name, sw in cls.IMPLS.items():
            cases += [(c, sw) for c in BSA_GRID if name in extra]
        return shard(cases, SHARD)


def _kernel_fwd_bwd(c, x, seed_do=None):
    """out, lse, dq, dk, dv of the public ops on the kernel backend for ``bsa_inputs``."""
    import jax_sparse_attn as jsa

    m = x["meta"]
    kw = dict(x["kw"], backend="kernel", **{k: v for k, v in m.items() if k != "q2k_block_index"})

    @jax.jit
    def f(q, k, v, do):
        out, lse = jsa.block_sparse_attention_forward(q, k, v, m["q2k_block_index"], **kw)
        _, vjp = jax.vjp(lambda q, k, v: jsa.block_sparse_attention(
            q, k, v, m["q2k_block_index"], **kw), q, k, v)
        return (out, lse) + vjp(do)

    return f(x["q"], x["k"], x["v"], x["do"])


def test_block_causal_equals_dense_block_causal():
    """Block-causal lower triangle == dense attention under the block-granular causal mask."""
    _only_in_shard(4)
    c = BSACase("causal-dense", blk=64, sq=512, skv=512, pattern="causal", counts="var", kmax=8,
                b=1, hq=2, hkv=2)
    x = bsa_inputs(c)
    q, k, v, do = x["q"], x["k"], x["v"], x["do"]
    scale = x["kw"]["softmax_scale"]
    got = _kernel_fwd_bwd(c, x)

    def dense(q, k, v):
        s = jnp.einsum("bhqd,bhkd->bhqk", q, k) * scale
        i = jnp.arange(c.sq)[:, None] // 64
        j = jnp.arange(c.skv)[None, :] // 64
        s = jnp.where(j <= i, s, -jnp.inf)
        return jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(s, axis=-1), v)

    f32 = [x.astype(jnp.float32) for x in (q, k, v)]
    o_ref, vjp = jax.vjp(dense, *f32)
    dq_r, dk_r, dv_r = vjp(do.astype(jnp.float32))
    for g, r, tol in ((got[0], o_ref, 2e-2), (got[2], dq_r, 5e-2), (got[3], dk_r, 5e-2), (got[4], dv_r, 5e-2)):
        g = np.asarray(g, np.float32)
        r = np.asarray(r, np.float32)
        assert not np.isnan(g).any()
        assert np.max(np.abs(g - r)) <= tol * max(1.0, np.max(np.abs(r))), np.max(np.abs(g - r))


def test_grad_through_jitted_loss_public_api():
    """jax.grad of a jitted loss through block_sparse_attention(backend='kernel')."""
    _only_in_shard(5)
    import jax_sparse_attn as jsa

    c = BSACase("grad", layout="bshd", blk=128, hq=8, hkv=2, sq=777, skv=1025, counts="var",
                sizes_rank=2, kmax=4, b=1)
    x = bsa_inputs(c)
    q, k, v = x["q"], x["k"], x["v"]
    idx, nums, sizes = (x["meta"][n] for n in ("q2k_block_index", "q2k_block_nums", "block_sizes"))

    def loss(backend):
        def f(q, k, v):
            o = jsa.block_sparse_attention(q, k, v, idx, None, sizes, nums, sparse_block_size=128,
                                           layout="bshd", backend=backend)
            return jnp.sum(jnp.sin(o.astype(jnp.float32)))
        return jax.jit(jax.grad(f, argnums=(0, 1, 2)))

    g_k = loss("kernel")(q, k, v)
    g_r = loss("reference")(*(a.astype(jnp.float32) for a in (q, k, v)))
    for a, b_ in zip(g_k, g_r):
        a = np.asarray(a, np.float32)
        b_ = np.asarray(b_, np.float32)
        assert not np.isnan(a).any()
        assert np.max(np.abs(a - b_)) <= 3e-2 * max(1.0, np.max(np.abs(b_))), np.max(np.abs(a - b_))


def test_fresh_inputs_same_shape_not_stale():
    """Two calls with different inputs of one shape: each matches its own reference."""
    _only_in_shard(6)
    c = BSACase("stale", blk=64, sq=300, skv=333, counts="var", sizes_rank=3, b=1)
    outs = []
    for seed in (3, 4):
        x = bsa_inputs(c, seed=seed)
        got = _kernel_fwd_bwd(c, x)
        grid = TestBSAKernelGrid()
        ref = grid.truth(c, x)
        for g, r in zip(got, ref):
            g = np.asarray(g, np.float32)
            r = np.asarray(r, np.float32)
            fin = np.isfinite(r)
            assert np.max(np.abs(g[fin] - r[fin])) <= 3e-2 * max(1.0, np.max(np.abs(r[fin])))
        outs.append(np.asarray(got[0], np.float32))
    assert not np.array_equal(outs[0], outs[1])


PRE_CASES = [(d, layout, dtype, ws, pre) for d, layout, dtype, ws, pre in (
    (32, "bshd", "float16", "rows", "kernel"), (64, "bhsd", "bfloat16", "tile", "kernel"),
    (128, "bshd", "bfloat16", "tile", "kernel"), (128, "bhsd", "float16", "rows", "kernel"),
    (128, "bhsd", "bfloat16", "tile", "delta"), (256, "bhsd", "float16", "rows", "kernel"),
    # four rows' loads per thread at once (a quarter of the CTAs; the tail CTA partly empty)
    (128, "bhsd", "bfloat16", "tile", "kernel4"), (64, "bshd", "float16", "rows", "kernel4"),
    (32, "bhsd", "bfloat16", "rows", "kernel4"))]


@pytest.mark.parametrize("d,layout,dtype,ws,pre", shard(PRE_CASES, SHARD))
def test_bsa_preprocess_kernel(d, layout, dtype, ws, pre):
    """kernels/bsa_pre.py: delta = rowsum(dO * O) in fp32 and an all-zero dQ workspace (the
    row-major accumulator, or the query-tile workspace of the sm90ws backward; zeroed by the
    launch, or with ``bsa_pre_impl="delta"`` by XLA; ``"kernel4"``: four rows per thread).

    B*S*H = 2*1023*3 rows is not a multiple of the rows per CTA (tail CTA), odd S (the tile
    workspace has 1024 rows per (b, h)). The allocator is first handed a NaN-filled buffer
    of the workspace's size, so an unwritten workspace would likely show NaN."""
    from jax_sparse_attn.ffi import bsa as ffi_bsa
    from jax_sparse_attn.validation import check_bsa_args

    rng = np.random.default_rng(5)
    shape = (2, 3, 1023, d) if layout == "bhsd" else (2, 1023, 3, d)
    o, do = (jnp.asarray(rng.standard_normal(shape, dtype=np.float32)).astype(dtype) for _ in range(2))
    idx = jnp.zeros((2, 3, 16, 1), jnp.int32)
    cfg = check_bsa_args(o, o, o, idx, 1, layout=layout, sparse_block_size=64)
    sw = Switches(bsa_pre_impl=pre)
    bwd = ffi_bsa.bwd_config(dtype, d, 64, False, sw) if ws == "tile" else None
    cfg = dataclasses.replace(cfg, backend="kernel", pre=ffi_bsa.pre_config(dtype, d, sw), bwd=bwd)
    assert (cfg.bwd is not None and cfg.bwd.dq_tile) == (ws == "tile")
    want_shape = ffi_bsa.dq_tile_shape(cfg) if ws == "tile" else shape
    poison = jnp.full(want_shape, jnp.nan, jnp.float32).block_until_ready()
    del poison
    f = jax.jit(functools.partial(ffi_bsa.bsa_preprocess, cfg=cfg))
    delta, dq_acc = f(do, o)
    want = jnp.sum(do.astype(jnp.float32) * o.astype(jnp.float32), axis=-1)
    want = np.asarray(_rows_bhs(want, layout))
    got = np.asarray(delta)
    assert got.shape == want.shape == (2, 3, 1023)
    assert not np.isnan(got).any()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4 * np.sqrt(d))
    acc = np.asarray(dq_acc)
    assert acc.shape == tuple(want_shape) and acc.dtype == np.float32
    assert np.all(acc == 0.0)
    # a second call with other inputs is not stale
    delta2, _ = f(o, o)
    want2 = np.asarray(_rows_bhs(jnp.sum(jnp.square(o.astype(jnp.float32)), axis=-1), layout))
    np.testing.assert_allclose(np.asarray(delta2), want2, rtol=1e-5, atol=1e-4 * np.sqrt(d))


# ----------------------------------------------------------------------------- sm90ws forward
# The warp-specialized forward (kernels/bsa_fwd_sm90_ws.py), the default at D in {64, 128}:
# the tests below select it themselves (the grid above runs the default selection).

WS_CASES = [
    # every query block lists every KV block; S_kv not a multiple of the block size
    dict(name="ws-all-blocks-blk128-d128", blk=128, d=128, dtype="bfloat16", layout="bhsd",
         hq=4, hkv=2, sq=777, skv=1000, mode="all"),
    dict(name="ws-all-blocks-blk64-d64", blk=64, d=64, dtype="float16", layout="bshd",
         hq=4, hkv=4, sq=1000, skv=999, mode="all"),
    # every row lists the partial last block (plus random others); NaN in unlisted blocks and
    # in the rows past block_sizes
    dict(name="ws-last-block-nan-blk128-d64", blk=128, d=64, dtype="float16", layout="bshd",
         hq=8, hkv=2, sq=1025, skv=1100, mode="last"),
    dict(name="ws-last-block-nan-blk64-d128", blk=64, d=128, dtype="bfloat16", layout="bhsd",
         hq=4, hkv=1, sq=300, skv=4000, mode="last"),
    dict(name="ws-last-block-nan-blk128-d128-gqa", blk=128, d=128, dtype="bfloat16",
         layout="bshd", hq=8, hkv=2, sq=4096, skv=4001, mode="last"),
    dict(name="ws-last-block-nan-blk64-d64-empty", blk=64, d=64, dtype="bfloat16",
         layout="bhsd", hq=4, hkv=2, sq=1000, skv=1001, mode="last-empty"),
]


def _ws_inputs(c, seed=3):
    """(q, k, v) clean, (k, v) poisoned, idx, nums, sizes (B, N_kv) or None."""
    rng = np.random.default_rng(seed)
    b, hq, hkv, sq, skv, d, blk = (c.get("b", 2), c["hq"], c["hkv"], c["sq"], c["skv"], c["d"],
                                   c["blk"])
    nq, nkv = -(-sq // blk), -(-skv // blk)
    dt = jnp.dtype(c["dtype"])

    def t(s, h):
        shape = (b, h, s, d) if c["layout"] == "bhsd" else (b, s, h, d)
        return rng.standard_normal(shape, dtype=np.float32)

    q, k, v = t(sq, hq), t(skv, hkv), t(skv, hkv)
    sizes = None
    if c["mode"] == "all":
        kmax = nkv
        idx = np.argsort(rng.random((b, hq, nq, nkv)), axis=-1).astype(np.int32)
        nums = np.full((b, hq, nq), nkv, np.int32)
    else:
        kmax = min(4, nkv)
        idx = np.empty((b, hq, nq, kmax), np.int32)
        for bi in range(b):
            for h in range(hq):
                for m in range(nq):
                    others = rng.permutation(nkv - 1)[: kmax - 1]
                    lst = np.concatenate([[nkv - 1], others])
                    idx[bi, h, m] = rng.permutation(lst)
        nums = np.full((b, hq, nq), kmax, np.int32)
        if c["mode"] == "last-empty":
            nums[:, :, ::3] = 0
        elif c["mode"] == "varied":
            # 0 .. kmax listed blocks per row (the active prefix), so rows take different
            # numbers of steps
            nums = rng.integers(0, kmax + 1, size=(b, hq, nq)).astype(np.int32)
        elif c["mode"] in ("even-empty", "odd-empty"):
            # the even (odd) query blocks list nothing: with one query head per KV head and
            # an even N_q, every CTA's first (second) warpgroup of pairwg gets only these
            nums[:, :, (0 if c["mode"] == "even-empty" else 1)::2] = 0
        sizes = rng.integers(1, blk + 1, size=(b, nkv)).astype(np.int32)
        sizes[:, 0] = blk
    # poison: NaN in every KV block no row lists, and in rows past block_sizes
    kp, vp = k.copy(), v.copy()
    j = np.arange(idx.shape[-1])[None, None, None, :]
    for bi in range(b):
        used = np.zeros(nkv, bool)
        used[idx[bi][np.broadcast_to(j[0] < nums[bi][..., None], idx[bi].shape)]] = True
        rows = np.zeros(skv, bool)
        for n in range(nkv):
            lo = n * blk
            if not used[n]:
                rows[lo:lo + blk] = True
            elif sizes is not None:
                rows[lo + sizes[bi, n]:lo + blk] = True
        for x in (kp, vp):
            if c["layout"] == "bhsd":
                x[bi, :, rows[: x.shape[2]], :] = np.nan
            else:
                x[bi, rows[: x.shape[1]], :, :] = np.nan
    # out-of-range garbage past the active prefix
    garbage = rng.choice(np.array([-7, 10**6, nkv, -1], np.int32), size=idx.shape)
    idx = np.where(j < nums[..., None], idx, garbage).astype(np.int32)
    cast = lambda x: jnp.asarray(x).astype(dt)  # noqa: E731
    return ((cast(q), cast(k), cast(v)), (cast(kp), cast(vp)), jnp.asarray(idx), jnp.asarray(nums),
            None if sizes is None else jnp.asarray(sizes))


def _ws_forward(q, k, v, idx, nums, sizes, switches=SM90WS, **kw):
    """The public forward on the kernel backend with the sm90ws forward."""
    import jax_sparse_attn as jsa

    f = jax.jit(lambda q, k, v: jsa.block_sparse_attention_forward(
        q, k, v, idx, None, sizes, nums, allow_empty_block_nums=True, backend="kernel",
        switches=switches, **kw))
    return jax.block_until_ready(f(q, k, v))


@pytest.mark.parametrize("c", shard(WS_CASES, SHARD), ids=lambda c: c["name"])
def test_bsa_sm90ws_forward(c):
    _check_ws_forward(c, SM90WS)


@pytest.mark.parametrize("c", shard(WS_CASES, SHARD), ids=lambda c: c["name"])
def test_bsa_sm90ws_forward_notmao(c):
    """The sm90ws forward with O copied out by the consumer warpgroup (``bsa_fwd_ws=notmao``;
    by default TMA tensor stores write it): the cases of ``test_bsa_sm90ws_forward``."""
    _check_ws_forward(c, Switches(bsa_fwd_impl="sm90ws", bsa_fwd_ws=("notmao",)))


def _check_ws_forward(c, switches):
    """The sm90ws forward under ``switches`` against the fp32 reference (2x the error of the
    16-bit reference), with poisoned outputs, NaN in unlisted keys and empty rows; returns
    ``(out, lse)``."""
    from jax_sparse_attn import reference
    from jax_sparse_attn.metadata import normalize_bsa_metadata

    (q, k, v), (kp, vp), idx, nums, sizes = _ws_inputs(c)
    idx_n, nums_n, sizes_n = normalize_bsa_metadata(idx, None, sizes, nums)
    kw = dict(layout=c["layout"], sparse_block_size=c["blk"], softmax_scale=0.6 / np.sqrt(c["d"]))
    # poisoned outputs: an all-NaN run first leaves NaN in buffers XLA is likely to reuse
    _ws_forward(q * jnp.nan, kp, vp, idx, nums, sizes, switches, **kw)
    out, lse = _ws_forward(q, kp, vp, idx, nums, sizes, switches, **kw)
    f32 = lambda x: x.astype(jnp.float32)  # noqa: E731
    out_r, lse_r = reference.block_sparse_attention_ref(f32(q), f32(k), f32(v), idx_n, nums_n,
                                                        sizes_n, **kw)
    out_b, lse_b = reference.block_sparse_attention_ref(q, k, v, idx_n, nums_n, sizes_n,
                                                        compute_dtype=q.dtype, **kw)
    report = []
    check_rule("out", out, out_r, out_b, 2, 2e-3, report)
    lse_g, lse_r, lse_b = (np.asarray(x, np.float32) for x in (lse, lse_r, lse_b))
    assert not np.isnan(lse_g).any()
    assert np.array_equal(np.isneginf(lse_g), np.isneginf(lse_r)), "lse -inf pattern differs"
    fin = np.isfinite(lse_r)
    check_rule("lse", lse_g[fin], lse_r[fin], lse_b[fin], 2, 1e-4, report)
    if c["mode"] in ("last-empty", "varied", "even-empty", "odd-empty"):
        empty = np.repeat(np.asarray(nums_n) == 0, c["blk"], axis=-1)[..., : c["sq"]]
        assert empty.any()
        o_rows = _rows_bhs(np.asarray(out, np.float32), c["layout"])
        assert np.all(o_rows[empty] == 0) and np.all(np.isneginf(lse_g[empty]))
    print(c["name"], "; ".join(report))
    return out, lse_g


# Three CTAs per SM at blk 64 / D 128 with one K buffer (bsa_fwd_ws=ctas3k1): the blk 64
# D 128 cases above, one with several waves of work items (396 CTAs), fp16 with empty rows
K1_CASES = [c for c in WS_CASES if (c["blk"], c["d"]) == (64, 128)] + [
    dict(name="k1-blk64-d128-waves", blk=64, d=128, dtype="float16", layout="bshd",
         hq=16, hkv=4, sq=4096, skv=4001, mode="last"),
    dict(name="k1-blk64-d128-empty", blk=64, d=128, dtype="float16", layout="bhsd",
         hq=8, hkv=8, sq=4000, skv=4096, mode="last-empty"),
    dict(name="k1-blk64-d128-all", blk=64, d=128, dtype="bfloat16", layout="bhsd",
         hq=4, hkv=2, sq=1000, skv=1100, mode="all"),
]
# BSA_TEST_K1: the bsa_fwd_ws flags of these tests (default "ctas3k1")
K1_FLAGS = tuple(os.environ.get("BSA_TEST_K1", "ctas3k1").split(","))


@pytest.mark.parametrize("c", shard(K1_CASES, SHARD), ids=lambda c: c["name"])
def test_bsa_sm90ws_forward_ctas3k1(c):
    """The sm90ws forward with three CTAs per SM at blk 64 / D 128 (``bsa_fwd_ws=ctas3k1``:
    one K buffer, two V buffers, O staged in the Q buffer, a one-warp producer): against the
    fp32 reference with poisoned outputs, NaN in unlisted keys and empty rows."""
    _check_ws_forward(c, Switches(bsa_fwd_impl="sm90ws", bsa_fwd_ws=K1_FLAGS))


# Two consumer warpgroups per CTA at blk 64, each with work items of its own
# (bsa_fwd_ws=pairwg): the blk 64 cases above, rows of 0 .. 4 blocks over several waves of
# items, 5 work items (3 CTAs: the last CTA's second warpgroup has none), every block listed,
# one warpgroup of every CTA with only empty rows (either one), an odd number of items over
# several waves
PAIR_CASES = [c for c in WS_CASES if c["blk"] == 64] + [
    dict(name="pair-blk64-d128-varied-waves", blk=64, d=128, dtype="float16", layout="bshd",
         hq=8, hkv=2, sq=4096, skv=4001, mode="varied"),
    dict(name="pair-blk64-d64-varied", blk=64, d=64, dtype="bfloat16", layout="bhsd",
         hq=4, hkv=4, sq=2000, skv=2100, mode="varied"),
    dict(name="pair-blk64-d128-five-items", blk=64, d=128, dtype="bfloat16", layout="bhsd",
         b=1, hq=1, hkv=1, sq=300, skv=1000, mode="last"),
    dict(name="pair-blk64-d128-all", blk=64, d=128, dtype="bfloat16", layout="bshd",
         hq=4, hkv=2, sq=1000, skv=1100, mode="all"),
    # one warpgroup of every CTA without a turn (N_q even, MHA), either one
    dict(name="pair-blk64-d128-wg0-empty", blk=64, d=128, dtype="bfloat16", layout="bhsd",
         hq=4, hkv=4, sq=4096, skv=3000, mode="even-empty"),
    dict(name="pair-blk64-d64-wg1-empty", blk=64, d=64, dtype="float16", layout="bshd",
         hq=4, hkv=4, sq=4096, skv=3000, mode="odd-empty"),
    # an odd number of items (3 x 181) over several waves
    dict(name="pair-blk64-d128-odd-items-waves", blk=64, d=128, dtype="float16",
         layout="bshd", b=1, hq=3, hkv=1, sq=11550, skv=2000, mode="varied"),
]
# bsa_fwd_ws=oinq: O staged in the work item's own Q buffer, whose stage the next item
# releases. Besides the ws cases, several items per CTA (b 2, 8 heads, S 8192: 2048 items at
# blk 64, 1024 at blk 128), so that each Q buffer holds many items' O in turn, with rows of
# 0 .. 4 blocks between them and every block listed
OINQ_CASES = WS_CASES + [
    dict(name="oinq-waves-blk64-d128-varied", blk=64, d=128, dtype="bfloat16", layout="bshd",
         hq=8, hkv=2, sq=8192, skv=8000, mode="varied"),
    dict(name="oinq-waves-blk64-d128-empty", blk=64, d=128, dtype="float16", layout="bhsd",
         hq=8, hkv=8, sq=8192, skv=8192, mode="last-empty"),
    dict(name="oinq-waves-blk128-d128-last", blk=128, d=128, dtype="bfloat16", layout="bhsd",
         hq=8, hkv=4, sq=8192, skv=8001, mode="last"),
    dict(name="oinq-waves-blk64-d64-varied", blk=64, d=64, dtype="bfloat16", layout="bshd",
         hq=8, hkv=1, sq=8192, skv=8192, mode="varied"),
    dict(name="oinq-all-blocks-blk64-d128", blk=64, d=128, dtype="bfloat16", layout="bshd",
         hq=8, hkv=4, sq=2048, skv=1999, mode="all"),
]


@pytest.mark.parametrize("c", shard(OINQ_CASES, SHARD), ids=lambda c: c["name"])
def test_bsa_sm90ws_forward_oinq(c):
    """The sm90ws forward with O staged in the work item's own Q buffer and the freed
    shared memory as a third V stage (``bsa_fwd_ws=oinq``): against the fp32 reference with
    poisoned outputs, NaN in unlisted keys and empty rows, over many items per CTA."""
    _check_ws_forward(c, Switches(bsa_fwd_impl="sm90ws", bsa_fwd_ws=("oinq",)))


@pytest.mark.parametrize("c", [c for c in OINQ_CASES if c["name"] in (
    "oinq-waves-blk64-d128-varied", "oinq-waves-blk128-d128-last")], ids=lambda c: c["name"])
def test_bsa_sm90ws_forward_vlag_qahead(c):
    """``bsa_fwd_ws=vlag,qahead`` (two opt-in producer orders, run as ``vlag`` with ``mpre``:
    the vlag loop has no point to issue the next item's Q early) over several items per CTA:
    completes, and matches the fp32 reference."""
    _check_ws_forward(c, Switches(bsa_fwd_impl="sm90ws", bsa_fwd_ws=("vlag", "qahead")))


# BSA_TEST_EARLY: the bsa_fwd_ws flags of test_bsa_sm90ws_forward_early (default
# "oearly,sumtree"; e.g. "oearly,lazyrescale" or "oearly,nooinq")
EARLY_FLAGS = tuple(os.environ.get("BSA_TEST_EARLY", "oearly,sumtree").split(","))


@pytest.mark.parametrize("c", shard(OINQ_CASES, SHARD), ids=lambda c: c["name"])
def test_bsa_sm90ws_forward_early(c):
    """The sm90ws forward with O brought to the previous tile's running max under the next
    S GEMM (``oearly``) and pairwise row sums (``sumtree``), or the flags of
    ``BSA_TEST_EARLY``: against the fp32 reference with poisoned outputs, NaN in unlisted
    keys, empty rows, one-block rows and every block listed, over many items per CTA."""
    _check_ws_forward(c, Switches(bsa_fwd_impl="sm90ws", bsa_fwd_ws=EARLY_FLAGS))


# BSA_TEST_PAIR: the bsa_fwd_ws flags of these tests (default "pairwg"; e.g.
# "pairwg,nopingpong")
PAIR_FLAGS = tuple(os.environ.get("BSA_TEST_PAIR", "pairwg").split(","))


@pytest.mark.parametrize("c", shard(PAIR_CASES, SHARD), ids=lambda c: c["name"])
def test_bsa_sm90ws_forward_pairwg(c):
    """The sm90ws forward with two consumer warpgroups per CTA at blk 64, each running work
    items of its own and taking turns at their GEMMs (``bsa_fwd_ws=pairwg``): against the
    fp32 reference with poisoned outputs, NaN in unlisted keys, empty rows and warpgroups
    whose turn counts differ (a warpgroup without items included)."""
    _check_ws_forward(c, Switches(bsa_fwd_impl="sm90ws", bsa_fwd_ws=PAIR_FLAGS))


# Stream-K tail (bsa_fwd_ws=streamk): enough work items for the persistent grid (132 CTAs at
# blk 128, 264 at blk 64 D 128, 396 at blk 64 D 64) to have a last whole wave and a partial
# one, so the tail's lists are cut between CTAs (uniform counts) or go round robin (the
# last-empty case: counts 0 and 4)
SK_CASES = [
    dict(name="sk-blk128-d128-last", blk=128, d=128, dtype="bfloat16", layout="bshd",
         hq=8, hkv=2, sq=4096, skv=4001, mode="last"),
    dict(name="sk-blk128-d128-all-partial-q", blk=128, d=128, dtype="float16", layout="bhsd",
         hq=8, hkv=8, sq=4000, skv=4096, mode="all"),
    dict(name="sk-blk64-d128-all", blk=64, d=128, dtype="float16", layout="bhsd",
         hq=8, hkv=8, sq=4096, skv=1000, mode="all"),
    dict(name="sk-blk64-d64-last", blk=64, d=64, dtype="bfloat16", layout="bhsd",
         hq=8, hkv=4, sq=4096, skv=3000, mode="last"),
    dict(name="sk-blk128-d64-empty", blk=128, d=64, dtype="bfloat16", layout="bshd",
         hq=8, hkv=2, sq=4096, skv=4001, mode="last-empty"),
]


# BSA_TEST_SK: the bsa_fwd_ws flags of these tests (default "streamk"; e.g. "streamk,oalias")
SK_FLAGS = tuple(os.environ.get("BSA_TEST_SK", "streamk").split(","))


@pytest.mark.parametrize("c", shard(SK_CASES, SHARD), ids=lambda c: c["name"])
def test_bsa_sm90ws_forward_streamk(c):
    out, lse = _check_ws_forward(c, Switches(bsa_fwd_impl="sm90ws", bsa_fwd_ws=SK_FLAGS))
    if c["mode"] != "last-empty":
        # uniform counts: the split items add a partial in another order than the default
        # kernel, so some fp32 lse differ in their last bits (the tail path ran)
        _, lse_d = _check_ws_forward(c, SM90WS)
        assert not np.array_equal(lse, lse_d), "streamk gave the default kernel's bits"


# ----------------------------------------------------------------------------- sm90ws backward
# The warp-specialized backward (kernels/bsa_bwd_sm90_ws.py), the default where it applies:
# BSA_TEST_IMPLS=bwdws runs the grid on it explicitly; the cases below add NaN in unlisted
# blocks and past block_sizes, every KV block listed, GQA 8:1 and outputs poisoned by an
# all-NaN run.

BWD_WS_CASES = WS_CASES + [
    dict(name="bwdws-gqa8-blk128-d128", blk=128, d=128, dtype="bfloat16", layout="bshd",
         hq=8, hkv=1, sq=2048, skv=2048, mode="last"),
    dict(name="bwdws-gqa8-blk64-d128-all", blk=64, d=128, dtype="float16", layout="bhsd",
         hq=8, hkv=1, sq=513, skv=700, mode="all"),
]


@pytest.mark.parametrize("c", shard(BWD_WS_CASES, SHARD), ids=lambda c: c["name"])
def test_bsa_sm90ws_backward(c):
    import jax_sparse_attn as jsa
    from jax_sparse_attn import reference
    from jax_sparse_attn.metadata import normalize_bsa_metadata

    (q, k, v), (kp, vp), idx, nums, sizes = _ws_inputs(c)
    idx_n, nums_n, sizes_n = normalize_bsa_metadata(idx, None, sizes, nums)
    kw = dict(layout=c["layout"], sparse_block_size=c["blk"], softmax_scale=0.6 / np.sqrt(c["d"]))
    do = jnp.asarray(np.random.default_rng(11).standard_normal(q.shape, np.float32)).astype(q.dtype)

    @jax.jit
    def kernel_grads(q, k, v, do):
        _, vjp = jax.vjp(lambda q, k, v: jsa.block_sparse_attention(
            q, k, v, idx, None, sizes, nums, allow_empty_block_nums=True, backend="kernel",
            switches=BWDWS, **kw), q, k, v)
        return vjp(do)

    def ref_grads(q, k, v, do, **extra):
        _, vjp = jax.vjp(lambda q, k, v: reference.block_sparse_attention_ref(
            q, k, v, idx_n, nums_n, sizes_n, **kw, **extra)[0], q, k, v)
        return vjp(do)

    # poisoned outputs: an all-NaN run first leaves NaN in buffers XLA is likely to reuse
    jax.block_until_ready(kernel_grads(q * jnp.nan, kp, vp, do * jnp.nan))
    got = jax.block_until_ready(kernel_grads(q, kp, vp, do))
    f32 = lambda x: x.astype(jnp.float32)  # noqa: E731
    truth = ref_grads(f32(q), f32(k), f32(v), f32(do))
    base = ref_grads(q, k, v, do, compute_dtype=q.dtype)
    report = []
    for name, g, t, b in zip(("dq", "dk", "dv"), got, truth, base):
        check_rule(name, g, t, b, 5, 2e-3, report)
    # dK / dV of keys that contribute nothing (unlisted, past block_sizes; NaN in the inputs
    # there) are exactly zero
    for name, g, t in zip(("dk", "dv"), got[1:], truth[1:]):
        g, t = (_rows_bhs(np.asarray(x, np.float32), c["layout"]) for x in (g, t))
        dead = np.all(t == 0, axis=-1)
        assert np.all(g[dead] == 0), f"{name}: nonzero gradient of a key that contributes nothing"
    print(c["name"], "; ".join(report))


# ----------------------------------------------------------------------------- deterministic
# deterministic=True: the sm90ws backward with the fixed-point dQ by default, with ordered dQ
# additions where a case names an option of the ordered path. Each case runs the gradient
# five times (bitwise equal) and checks it against the reference.

DET_CASES = [
    # the last KV block is chosen by every query block of a 32768-token sequence (one long
    # K->Q list: 256 entries per query head; the ordered path's case of it below)
    dict(name="det-hot-blk128-d128-32k", blk=128, d=128, dtype="bfloat16", layout="bshd",
         hq=4, hkv=2, sq=32768, skv=32768, mode="last"),
    # every KV block listed by every query block (the most contributions per query tile);
    # D = 128 at blk 64 runs sm90ws in this mode
    dict(name="det-all-blk64-d128", blk=64, d=128, dtype="float16", layout="bhsd",
         hq=4, hkv=4, sq=1000, skv=999, mode="all"),
    dict(name="det-all-blk128-d64-gqa8", blk=128, d=64, dtype="bfloat16", layout="bhsd",
         hq=8, hkv=1, sq=513, skv=700, mode="all"),
    # one query head per KV head at blk 128: the fixed-point dQ by default, and (cmp_zero) the
    # ordered path in the schedule order, det_store against detzero
    dict(name="det-all-blk128-d128-mha", blk=128, d=128, dtype="bfloat16", layout="bshd",
         hq=2, hkv=2, sq=2000, skv=1900, mode="all", cmp_zero=True),
    # empty rows, block_sizes, GQA 4:1; K->Q lists and ranks built by the sort construction
    dict(name="det-empty-blk64-d64-sortcsr", blk=64, d=64, dtype="bfloat16", layout="bshd",
         hq=8, hkv=2, sq=1000, skv=1001, mode="last-empty", sort_csr=True),
    # several fp32 dQ accumulators per query tile (bsa_bwd_ws dqslots=N): the schedule order
    # at blk 64 and 128, the launch-group order with GQA, empty rows
    dict(name="det-all-blk64-d128-slots2", blk=64, d=128, dtype="bfloat16", layout="bshd",
         hq=2, hkv=2, sq=1500, skv=1400, mode="all", ws="dqslots=2"),
    dict(name="det-all-blk128-d128-slots3", blk=128, d=128, dtype="float16", layout="bhsd",
         hq=2, hkv=2, sq=2000, skv=1900, mode="all", ws="dqslots=3"),
    # the default at blk 64 with query rows of at least 32 entries: the fixed-point dQ, and
    # (cmp_zero) the ordered path with two dQ accumulators, det_store against detzero
    dict(name="det-all-blk64-d128-k63-default", blk=64, d=128, dtype="bfloat16", layout="bhsd",
         hq=2, hkv=2, sq=4096, skv=4000, mode="all", cmp_zero=True),
    dict(name="det-all-blk64-d128-relaxpoll", blk=64, d=128, dtype="float16", layout="bshd",
         hq=2, hkv=2, sq=3000, skv=2900, mode="all", ws="relaxpoll"),
    dict(name="det-empty-blk64-d64-gqa-slots4", blk=64, d=64, dtype="bfloat16", layout="bhsd",
         hq=8, hkv=2, sq=1000, skv=1001, mode="last-empty", ws="dqslots=4", cmp_zero=True),
    # the causal mask inside the listed blocks (the sm90ws backward's per-step select)
    dict(name="det-all-blk128-d128-causal", blk=128, d=128, dtype="bfloat16", layout="bshd",
         hq=2, hkv=2, sq=2000, skv=2100, mode="all", causal=True),
    # the ordered additions (detorder) at blk 128 on the shapes above: the schedule order on
    # one long K->Q list, the launch-group order with GQA 8:1, the causal mask
    dict(name="det-hot-blk128-d128-32k-detorder", blk=128, d=128, dtype="bfloat16",
         layout="bshd", hq=4, hkv=2, sq=32768, skv=32768, mode="last", ws="detorder"),
    dict(name="det-all-blk128-d64-gqa8-detorder", blk=128, d=64, dtype="bfloat16",
         layout="bhsd", hq=8, hkv=1, sq=513, skv=700, mode="all", ws="detorder"),
    dict(name="det-all-blk128-d128-causal-detorder", blk=128, d=128, dtype="bfloat16",
         layout="bshd", hq=2, hkv=2, sq=2000, skv=2100, mode="all", causal=True,
         ws="detorder"),
    dict(name="det-all-blk64-d64-gqa-causal", blk=64, d=64, dtype="float16", layout="bhsd",
         hq=4, hkv=2, sq=1000, skv=900, mode="all", causal=True),
    # the zeroed workspace, every contribution a bulk reduce-add (bsa_bwd_ws detzero)
    dict(name="det-empty-blk128-d128-gqa-detzero", blk=128, d=128, dtype="float16",
         layout="bshd", hq=4, hkv=2, sq=1000, skv=1001, mode="last-empty", ws="detzero"),
    # detstream: the order kernel and the backward side by side, the backward reading each
    # list entry once it is published (blk 64 with two accumulators, blk 128 with one long
    # list, GQA and empty rows in the schedule order of detsched)
    dict(name="det-all-blk64-d128-k63-stream", blk=64, d=128, dtype="bfloat16", layout="bshd",
         hq=2, hkv=2, sq=4096, skv=4000, mode="all", ws="detstream"),
    dict(name="det-hot-blk128-d128-32k-stream", blk=128, d=128, dtype="bfloat16",
         layout="bhsd", hq=2, hkv=2, sq=32768, skv=32768, mode="last", ws="detstream"),
    dict(name="det-all-blk128-d64-stream", blk=128, d=64, dtype="float16", layout="bshd",
         hq=2, hkv=2, sq=2000, skv=1900, mode="all", ws="detstream"),
    dict(name="det-empty-blk64-d64-gqa-detsched-stream", blk=64, d=64, dtype="bfloat16",
         layout="bhsd", hq=8, hkv=2, sq=1000, skv=1001, mode="last-empty",
         ws="detsched,detstream"),
    # detoverlap: the preprocessing launched in the same call, alongside the order kernel
    dict(name="det-all-blk64-d128-k63-overlap", blk=64, d=128, dtype="float16", layout="bhsd",
         hq=2, hkv=2, sq=4096, skv=4000, mode="all", ws="detstream,detoverlap"),
    dict(name="det-empty-blk64-d64-gqa-overlap", blk=64, d=64, dtype="bfloat16",
         layout="bshd", hq=8, hkv=2, sq=1000, skv=1001, mode="last-empty",
         ws="detsched,detstream,detoverlap"),
    dict(name="det-hot-blk128-d128-32k-overlap", blk=128, d=128, dtype="bfloat16",
         layout="bshd", hq=2, hkv=2, sq=32768, skv=32768, mode="last",
         ws="detstream,detoverlap"),
]


@pytest.mark.parametrize("c", shard(DET_CASES, SHARD), ids=lambda c: c["name"])
def test_bsa_bwd_deterministic(c, monkeypatch):
    import jax_sparse_attn as jsa
    from jax_sparse_attn import metadata, reference
    from jax_sparse_attn.metadata import normalize_bsa_metadata

    if c.get("sort_csr"):
        monkeypatch.setattr(metadata, "_DENSE_CSR_MAX_ELEMS", 0)
    (q, k, v), (kp, vp), idx, nums, sizes = _ws_inputs(c)
    idx_n, nums_n, sizes_n = normalize_bsa_metadata(idx, None, sizes, nums)
    kw = dict(layout=c["layout"], sparse_block_size=c["blk"], softmax_scale=0.6 / np.sqrt(c["d"]))
    if c.get("causal"):
        kw["causal"] = True
    do = jnp.asarray(np.random.default_rng(12).standard_normal(q.shape, np.float32)).astype(q.dtype)
    from jax_sparse_attn.config import from_env

    env = from_env()
    # the case's options join those of the environment (the variant test modules); an option
    # both name is given once (the switch rejects repeated options)
    opts = tuple(dict.fromkeys(tuple(env.bsa_bwd_ws)
                               + (tuple(c["ws"].split(",")) if c.get("ws") else ())))

    def det_grads(options):
        """The jitted deterministic gradients (dq, dk, dv) under ``bsa_bwd_ws=options``."""
        switches = dataclasses.replace(env, bsa_bwd_ws=tuple(options))

        @jax.jit
        def grads(q, k, v, do):
            _, vjp = jax.vjp(lambda q, k, v: jsa.block_sparse_attention(
                q, k, v, idx, None, sizes, nums, allow_empty_block_nums=True,
                backend="kernel", deterministic=True, switches=switches, **kw), q, k, v)
            return vjp(do)

        return grads

    kernel_grads = det_grads(opts)
    jax.block_until_ready(kernel_grads(q * jnp.nan, kp, vp, do * jnp.nan))
    runs = [[np.asarray(g) for g in jax.block_until_ready(kernel_grads(q, kp, vp, do))]
            for _ in range(5)]
    for r in runs[1:]:
        for name, a, b in zip(("dq", "dk", "dv"), runs[0], r):
            assert np.array_equal(a.view(np.uint16), b.view(np.uint16)), \
                f"{name} differs between runs with deterministic=True"

    if "detstream" in c.get("ws", ""):
        # streamed or not, the same order and additions: bitwise the same gradients
        # (the streamed call zeroes the workspace and adds every contribution: compared with
        # the unstreamed call under detzero, the same computation)
        plain = [o for o in opts if o not in ("detstream", "detoverlap")]
        ref_run = [np.asarray(g) for g in jax.block_until_ready(
            det_grads(plain + ["nodetstream", "detzero"])(q, kp, vp, do))]
        for name, a, b in zip(("dq", "dk", "dv"), runs[0], ref_run):
            assert np.array_equal(a.view(np.uint16), b.view(np.uint16)), \
                f"{name}: detstream differs from nodetstream"

    if c.get("cmp_zero"):
        # on the ordered path, the first contribution to each dQ tile stored (det_store, its
        # default) or added to the zeroed workspace (detzero): 0 + x == x, so the same values.
        # Where the run above took the fixed-point dQ (the default, or detfixed named),
        # which stores nothing first, the ordered path is run here for the comparison.
        from jax_sparse_attn.ffi.bsa import det_fixed_wanted

        ordered = tuple(o for o in opts if o != "detfixed")
        if det_fixed_wanted(c["blk"], ordered):
            ordered += ("detorder",)
        first = runs[0] if ordered == opts else [
            np.asarray(g) for g in jax.block_until_ready(det_grads(ordered)(q, kp, vp, do))]
        assert not det_fixed_wanted(c["blk"], ordered + ("detzero",))
        zrun = [np.asarray(g) for g in jax.block_until_ready(
            det_grads(ordered + ("detzero",))(q, kp, vp, do))]
        for name, a, b in zip(("dq", "dk", "dv"), first, zrun):
            assert np.array_equal(a.astype(np.float32), b.astype(np.float32)), \
                f"{name}: the stored first contributions differ from detzero"

    def ref_grads(q, k, v, do, **extra):
        _, vjp = jax.vjp(lambda q, k, v: reference.block_sparse_attention_ref(
            q, k, v, idx_n, nums_n, sizes_n, **kw, **extra)[0], q, k, v)
        return vjp(do)

    f32 = lambda x: x.astype(jnp.float32)  # noqa: E731
    truth = ref_grads(f32(q), f32(k), f32(v), f32(do))
    base = ref_grads(q, k, v, do, compute_dtype=q.dtype)
    report = []
    for name, g, t, b in zip(("dq", "dk", "dv"), runs[0], truth, base):
        check_rule(name, jnp.asarray(g), t, b, 5, 2e-3, report)
    print(c["name"], "; ".join(report))


# Metadata outside the contract, without split-KV: the sm90ws forward clamps what it reads in
# the kernel (no XLA clamp before it), xlaclamp and the mma.sync forward get the sanitised
# metadata; GQA with pack_gqa (lists per KV head) and causal rows included
GARBAGE_FWD = [
    dict(impl="sm90ws", blk=64, d=128, ws="", hq=2, hkv=2),
    dict(impl="sm90ws", blk=128, d=128, ws="", hq=2, hkv=2),
    dict(impl="sm90ws", blk=64, d=64, ws="", hq=2, hkv=2),
    dict(impl="sm90ws", blk=64, d=128, ws="nooinq", hq=2, hkv=2),
    dict(impl="sm90ws", blk=128, d=128, ws="", hq=4, hkv=2, pack=True),
    dict(impl="sm90ws", blk=64, d=128, ws="", hq=2, hkv=2, causal=True),
    dict(impl="sm90ws", blk=64, d=128, ws="xlaclamp", hq=2, hkv=2),
    dict(impl="sm90ws", blk=64, d=128, ws="sortlists", hq=2, hkv=2),
    dict(impl="sm90ws", blk=64, d=128, ws="sortlists,pairbox", hq=2, hkv=2),
    dict(impl="sm80", blk=64, d=128, ws="", hq=2, hkv=2),
]


@pytest.mark.parametrize("c", shard(GARBAGE_FWD, SHARD),
                         ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items() if v != ""))
def test_bsa_forward_garbage_metadata_is_clamped(c):
    """Traced metadata (no eager checks) outside the contract: ids < 0 or >= N_kv inside the
    active prefix, counts < 0 or > K_max, block_sizes < 1 or > blk, S_kv not a multiple of
    the block. The forward (kv_splits=1) reads nothing out of bounds and gives exactly the
    result of the metadata clamped as ``metadata.sanitize_bsa_metadata`` does, and no NaN;
    the outputs are poisoned by a preceding all-NaN run."""
    rng = np.random.default_rng(11)
    blk, d, kmax = c["blk"], c["d"], 6
    b, sq, skv = 2, 1000, 1100
    nq, nkv = -(-sq // blk), -(-skv // blk)
    q = jnp.asarray(rng.standard_normal((b, c["hq"], sq, d), np.float32)).astype(jnp.bfloat16)
    k, v = (jnp.asarray(rng.standard_normal((b, c["hkv"], skv, d), np.float32)).astype(
        jnp.bfloat16) for _ in range(2))
    # metadata rows: (B, H_q, N_q) or, with pack_gqa, (B, H_kv, N_qp) over packed rows
    hm, nm = ((c["hkv"], -(-sq * (c["hq"] // c["hkv"]) // blk)) if c.get("pack")
              else (c["hq"], nq))
    idx = jnp.asarray(rng.integers(-3, nkv + 3, size=(b, hm, nm, kmax)), jnp.int32)
    nums = jnp.asarray(rng.integers(-2, kmax + 3, size=(b, hm, nm)), jnp.int32)
    sizes = jnp.asarray(rng.integers(-5, blk + 20, size=(b, hm, nkv)), jnp.int32)
    check_bsa_garbage_clamped(
        q, k, v, idx, nums, sizes, nkv, poison=True, sparse_block_size=blk,
        allow_empty_block_nums=True, backend="kernel", causal=c.get("causal", False),
        pack_gqa=c.get("pack", False),
        switches=Switches(bsa_fwd_impl=c["impl"], bsa_fwd_ws=c["ws"]))
