"""CPU checks of the one-launch K->Q list kernel of the block-sparse backward
(``kernels/bsa_kq_lists.py``, switch ``bsa_kq_impl="kernel"``): which calls it takes, its
sm_90a lowering alone and inside the public backward, and its PTX (no GPU needed; the GPU
comparison with ``metadata.build_kq_csr`` is ``tests/test_gpu_kq_lists.py``)."""

from __future__ import annotations

import os

import pytest

# CuTe DSL reads its target arch when cutlass is first imported: set it before that.
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

CALL_TARGET = "CuteDSLRT_NvJaxCutlassCall"


def test_kq_config_takes_and_refuses():
    """The compile key carries the sizes; symbolic / empty sizes and bitmaps or row counts
    past the kernel's shared memory go to ``build_kq_csr`` (None)."""
    from jax_sparse_attn.ffi import bsa
    from jax_sparse_attn.kernels import bsa_kq_lists as kq

    c = bsa.kq_config((2, 8, 40, 7), 2, 50)
    assert c == bsa.BsaKqConfig(n_chains=4, group=4, n_q=40, n_kv=50, k_max=7)
    assert hash(c) == hash(bsa.BsaKqConfig(4, 4, 40, 50, 7))
    # the benchmark shapes fit: blk64 / blk128 at S = 16384 and 32768, H = 16, GQA 32:4
    for shape, hkv, nkv in [((1, 16, 256, 32), 16, 256), ((1, 16, 256, 32), 16, 256),
                            ((1, 16, 512, 64), 16, 512), ((1, 32, 256, 32), 4, 256)]:
        assert bsa.kq_config(shape, hkv, nkv) is not None, shape
    assert bsa.kq_config((1, 4, 0, 3), 4, 5) is None            # no query block
    assert bsa.kq_config((1, 4, 3, 3), 4, 0) is None            # no KV block
    assert bsa.kq_config((1, 4, 3, 0), 4, 5) is None            # no list slot
    assert bsa.kq_config((1, 6, 3, 3), 4, 5) is None            # H_q not a multiple of H_kv
    # a chain's bitmap past MAX_WORDS words: N_kv * ceil(G N_q / 32)
    assert bsa.kq_config((1, 8, 4096, 4), 1, 200) is None
    assert not kq.fits(200, 8, 4096, 200)
    # more CSR rows than the scan holds
    assert bsa.kq_config((64, 32, 8, 4), 32, 16) is None        # 64 * 32 * 16 rows
    assert not kq.fits(16, 1, 8, 64 * 32 * 16)
    assert kq.fits(16, 1, 8, kq.MAX_ROWS) and not kq.fits(16, 1, 8, kq.MAX_ROWS + 1)
    # more list slots than int32 indexing allows (a slot index past the last plus the
    # cluster's threads stays below 2**31)
    assert bsa.kq_config((1, 1, 1, kq.MAX_SLOTS + 1), 1, 1) is None
    assert bsa.kq_config((1, 1, 1, kq.MAX_SLOTS), 1, 1) is not None
    assert kq.MAX_SLOTS + 2 * kq.CLUSTER * kq.NUM_THREADS < 2 ** 31


def test_kq_lists_falls_back_to_build_kq_csr():
    """Without the kernel (``kernel=False``), or with it for a call it does not take (a
    chain's bitmap past its shared memory), the lists are ``metadata.build_kq_csr``'s of the
    clamped metadata (``sanitize_bsa_metadata``), bit for bit (this runs on the CPU: no
    kernel is launched)."""
    import numpy as np

    from jax_sparse_attn import metadata
    from jax_sparse_attn.ffi import bsa

    rng = np.random.default_rng(3)
    for shape, hkv, nkv, kernel in [((2, 4, 6, 5), 2, 10, False),
                                    ((1, 8, 4096, 1), 1, 200, True)]:
        idx = jnp.asarray(rng.integers(-2, nkv + 2, shape), jnp.int32)
        nums = jnp.asarray(rng.integers(-1, shape[-1] + 2, shape[:-1]), jnp.int32)
        si, sn, _ = metadata.sanitize_bsa_metadata(idx, nums, None, num_kv_blocks=nkv,
                                                   block_size=64)
        want = metadata.build_kq_csr(si, sn, num_kv_heads=hkv, num_kv_blocks=nkv)
        # out-of-range ids are clipped, not skipped: the lists differ from the raw ones
        raw = metadata.build_kq_csr(idx, nums, num_kv_heads=hkv, num_kv_blocks=nkv)
        assert int(raw[0][-1]) < int(want[0][-1])
        got = jax.jit(lambda i, n, hkv=hkv, nkv=nkv, kernel=kernel: bsa.kq_lists(
            i, n, num_kv_heads=hkv, num_kv_blocks=nkv, kernel=kernel))(idx, nums)
        assert int(want[0][-1]) > 0
        for g, w in zip(got, want):
            np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


def test_kq_config_with_items():
    """With ``bucket_entries`` the key carries it and ``max_extra``; a chain of more than
    ``MAX_ITEMS`` work items gets no items key (the lists alone: the items in XLA)."""
    from jax_sparse_attn.ffi import bsa
    from jax_sparse_attn.kernels import bsa_kq_lists as kq

    c = bsa.kq_config((1, 16, 256, 32), 16, 256, 64, 12)
    assert c == bsa.BsaKqConfig(16, 1, 256, 256, 32, 64, 12) != bsa.kq_config(
        (1, 16, 256, 32), 16, 256)
    assert bsa.kq_config((1, 16, 256, 32), 16, 256, 0, 12).bucket_entries == 0
    n_kv = 300
    assert bsa.kq_config((1, 2, 64, 8), 2, n_kv, 64, kq.MAX_ITEMS - n_kv) is not None
    assert bsa.kq_config((1, 2, 64, 8), 2, n_kv, 64, kq.MAX_ITEMS - n_kv + 1) is None
    assert not kq.fits(n_kv, 1, 64, 2 * n_kv, 1, n_kv - 1)  # fewer items than rows
    for n_b, extra in ((-1, 0), (2**31, 0), (4, -1)):
        with pytest.raises(ValueError, match="bucket_entries"):
            kq.BsaKqLists(1, 1, 4, 4, 2, n_b, extra)
    # the largest bitmap, row count and item count together fit the shared memory
    n_kv = kq.MAX_ITEMS
    n_words = kq.MAX_WORDS // n_kv
    assert kq.smem_bytes(n_kv, n_words, kq.MAX_ROWS, kq.MAX_ITEMS) <= kq.SMEM_LIMIT
    assert kq.fits(n_kv, 1, 32 * n_words, kq.MAX_ROWS, 1, kq.MAX_ITEMS)


def test_kq_lists_items_in_xla_match_the_definition():
    """``kq_lists`` with ``bucket_entries`` and no kernel: the offsets followed by
    ``metadata.kq_bucket_items`` (numpy definition), long rows split, on the CPU."""
    import numpy as np

    from jax_sparse_attn import metadata
    from jax_sparse_attn.ffi import bsa

    rng = np.random.default_rng(5)
    b, hq, hkv, nq, nkv, kmax = 2, 4, 2, 30, 12, 8
    idx = jnp.asarray(np.argsort(rng.random((b, hq, nq, nkv)), -1)[..., :kmax], jnp.int32)
    idx = idx.at[..., 0].set(3)  # KV block 3 listed by every query block: split
    nums = jnp.asarray(rng.integers(0, kmax + 1, (b, hq, nq)), jnp.int32)
    n_rows = b * hkv * nkv
    off, _ = bsa.kq_lists(idx, nums, num_kv_heads=hkv, num_kv_blocks=nkv, kernel=False,
                          bucket_entries=16, max_extra=9)
    off = np.asarray(off)
    want = metadata.kq_bucket_items_reference(off[:n_rows + 1], num_kv_blocks=nkv,
                                              bucket_entries=16, max_extra=9)
    np.testing.assert_array_equal(off[n_rows + 1:].reshape(want.shape), want)
    assert (want[..., 5] > 1).any()


def _kq_text(b=2, hq=4, hkv=2, nq=40, nkv=50, kmax=7, bucket_entries=0, max_extra=0):
    """The lowered text of the K->Q list kernel alone (with ``bucket_entries``, the launch
    that computes the work items too)."""
    from jax_sparse_attn.ffi import bsa

    def f(idx, nums):
        return bsa.kq_lists(idx, nums, num_kv_heads=hkv, num_kv_blocks=nkv,
                            bucket_entries=bucket_entries, max_extra=max_extra,
                            kernel_items=bucket_entries > 0)

    return jax.jit(f).trace(jax.ShapeDtypeStruct((b, hq, nq, kmax), jnp.int32),
                            jax.ShapeDtypeStruct((b, hq, nq), jnp.int32)).lower(
        lowering_platforms=("cuda",)).as_text()


def _bwd_text(kq="kernel", blk=128, d=128, b=2, hq=4, hkv=2, sq=1000, skv=1025, kmax=5,
              **switches):
    """The lowered text of the public block-sparse backward with ``bsa_kq_impl=kq`` (and
    the other ``switches`` fields)."""
    import jax_sparse_attn as jsa
    from jax_sparse_attn.config import Switches

    nq, nkv = -(-sq // blk), -(-skv // blk)
    dt = jnp.bfloat16
    q = jax.ShapeDtypeStruct((b, hq, sq, d), dt)
    k = jax.ShapeDtypeStruct((b, hkv, skv, d), dt)
    idx = jax.ShapeDtypeStruct((b, hq, nq, kmax), jnp.int32)
    nums = jax.ShapeDtypeStruct((b, hq, nq), jnp.int32)
    lse = jax.ShapeDtypeStruct((b, hq, sq), jnp.float32)
    kw = dict(layout="bhsd", sparse_block_size=blk, softmax_scale=0.3, backend="kernel",
              switches=Switches(bsa_kq_impl=kq, **switches))

    def bwd(do, q, k, v, o, lse, i, n):
        return jsa.block_sparse_attention_backward(do, q, k, v, o, lse, i, None, None, n, **kw)

    return jax.jit(bwd).trace(q, q, k, k, q, lse, idx, nums).lower(
        lowering_platforms=("cuda",)).as_text()


_PTX_CONFIGS = {
    "kq": ("_kq_text", (), None, {}),
    "kq-gqa-many-rows": ("_kq_text", (), None, dict(b=3, hq=24, hkv=3, nq=70, nkv=900,
                                                    kmax=9)),
    "kq-items": ("_kq_text", (), None, dict(b=3, hq=8, hkv=2, nq=70, nkv=90, kmax=9,
                                            bucket_entries=64, max_extra=40)),
}


@pytest.fixture(scope="module")
def kept_ptx(tmp_path_factory):
    """The PTX kept while lowering :data:`_PTX_CONFIGS` in one fresh process."""
    import kept_ptx as kp  # noqa: PLC0415

    return kp.keep_ptx_shared(tmp_path_factory, "test_kq_lists", "test_kq_lists",
                              _PTX_CONFIGS)


def _kq_ptx(kept_ptx, name):
    import kept_ptx as kp  # noqa: PLC0415

    files = [t for t in kp.ptx_of(kept_ptx, name).values() if "BsaKqLists" in t]
    assert len(files) == 1
    return files[0]


@pytest.mark.lowering
@pytest.mark.parametrize("name", list(_PTX_CONFIGS))
def test_kq_lists_ptx(kept_ptx, name):
    """One cluster barrier (arrive, then wait) after a GPU-scope fence, the bitmap set with
    shared-memory atomic ORs, the row lengths by popcount, the scan with warp shuffles; no
    global atomics (nothing in global memory needs zeroing first)."""
    import re

    t = _kq_ptx(kept_ptx, name)
    arrive, wait, fence = (t.index(s) for s in ("barrier.cluster.arrive", "barrier.cluster.wait",
                                                "fence.acq_rel.gpu"))
    assert fence < arrive < wait
    assert t.count("barrier.cluster.arrive") == 1 == t.count("barrier.cluster.wait")
    assert "atom.shared.or.b32" in t and "popc.b32" in t and "shfl.sync.up.b32" in t
    assert not re.search(r"\b(atom|red)\.(\w+\.)*global", t)
    if name == "kq-items":
        # the items step: two more block-wide scans (each two barriers and the shuffles),
        # after the lists' one
        plain = _kq_ptx(kept_ptx, "kq")
        assert t.count("shfl.sync.up.b32") == 3 * plain.count("shfl.sync.up.b32")
        assert t.count("bar.sync") > plain.count("bar.sync")


@pytest.mark.lowering
def test_kq_lists_in_the_backward(monkeypatch):
    """With ``bsa_kq_impl="kernel"`` the Hopper backward's call has one CuTe
    DSL launch more (the lists) than with the XLA lists (preprocessing, the backward that
    launches the dq reordering), at blk 128 and blk 64; the portable kernels
    (``kernel_family="portable"``) keep the XLA lists."""
    monkeypatch.setenv("JAX_SPARSE_ATTN_FORCE_KERNEL", "1")
    for blk in (128, 64):
        assert _bwd_text("xla", blk=blk).count(CALL_TARGET) == 2
        assert _bwd_text("kernel", blk=blk).count(CALL_TARGET) == 3
    port = [_bwd_text(kq, kernel_family="portable").count(CALL_TARGET)
            for kq in ("xla", "kernel")]
    assert port[0] == port[1] >= 1, port


@pytest.mark.lowering
def test_kq_items_in_the_backward(monkeypatch):
    """``bsa_kq_impl="items"`` (the default): where the sm90ws backward splits long K->Q
    lists in buckets
    (its default), the list launch computes the work items and XLA sorts nothing; the same
    calls otherwise. Without the split (``nobuckets``) it is the ``kernel`` lowering."""
    monkeypatch.setenv("JAX_SPARSE_ATTN_FORCE_KERNEL", "1")
    for blk in (128, 64):
        kern, items = _bwd_text("kernel", blk=blk), _bwd_text("items", blk=blk)
        assert kern.count(CALL_TARGET) == items.count(CALL_TARGET) == 3
        assert "stablehlo.sort" in kern and "stablehlo.sort" not in items
    plain = [_bwd_text(kq, bsa_bwd_ws="nobuckets") for kq in ("kernel", "items")]
    assert plain[0] == plain[1]


@pytest.mark.lowering
@pytest.mark.ablation
def test_backward_with_every_outside_opt_in_lowers(monkeypatch):
    """The list kernel, ``zerolag``, ``tailconv`` and the four-row preprocessing together
    (blk 64, D 128, GQA 4:1, ``block_sizes``): the backward is three calls (preprocessing,
    lists, the backward with the reordering it launches), and ``jax.grad`` through the
    public op adds the forward."""
    import jax_sparse_attn as jsa
    from jax_sparse_attn.config import Switches

    monkeypatch.setenv("JAX_SPARSE_ATTN_FORCE_KERNEL", "1")
    sw = Switches(bsa_kq_impl="kernel", bsa_bwd_ws="zerolag,tailconv", bsa_pre_impl="kernel4")
    b, hq, hkv, s, d, blk, kmax = 3, 8, 2, 1000, 128, 64, 5
    n = -(-s // blk)
    q = jax.ShapeDtypeStruct((b, hq, s, d), jnp.bfloat16)
    k = jax.ShapeDtypeStruct((b, hkv, s, d), jnp.bfloat16)
    idx = jax.ShapeDtypeStruct((b, hq, n, kmax), jnp.int32)
    nums = jax.ShapeDtypeStruct((b, hq, n), jnp.int32)
    sizes = jax.ShapeDtypeStruct((b, hq, n), jnp.int32)
    lse = jax.ShapeDtypeStruct((b, hq, s), jnp.float32)
    kw = dict(layout="bhsd", sparse_block_size=blk, softmax_scale=0.3, backend="kernel",
              switches=sw)

    def bwd(do, q, k, v, o, lse, i, n_, sz):
        return jsa.block_sparse_attention_backward(do, q, k, v, o, lse, i, None, sz, n_, **kw)

    txt = jax.jit(bwd).trace(q, q, k, k, q, lse, idx, nums, sizes).lower(
        lowering_platforms=("cuda",)).as_text()
    assert txt.count(CALL_TARGET) == 3

    def loss(q, k, v, i, n_, sz):
        return jsa.block_sparse_attention(q, k, v, i, None, sz, n_, **kw).astype(
            jnp.float32).sum()

    txt = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).trace(q, k, k, idx, nums, sizes).lower(
        lowering_platforms=("cuda",)).as_text()
    assert txt.count(CALL_TARGET) == 4
