"""GPU: the block-sparse split-KV forward (``kv_splits``) on the kernels vs the reference.

Each case runs the public ops on the kernel backend with ``kv_splits`` in {1, 2, 7, 64,
"auto"} and checks ``out``, ``lse`` and the gradients (through the split forward: the
backward uses its combined ``out`` / ``lse``) with the rule of ``tests/attention_base.py``:
kernel error vs the float32 reference <= 2x (forward, lse) / 5x (backward) the error of the
same computation in the input dtype (the reference backend with the same ``kv_splits`` and
``compute_dtype`` = the input dtype), plus a small atol. NaN never passes.

Inputs stress the split: variable ``q2k_block_nums`` with empty rows, more splits than listed
blocks (``kv_splits`` 7 and 64 against lists of 0-12 entries: empty splits), GQA, a partial
last query block and a partial last KV block that every row lists, ``block_sizes``, NaN in
every K/V row no query block lists and past ``block_sizes`` (contributes nothing), garbage
indices past the active prefix, and outputs poisoned by a preceding all-NaN run (XLA reuses
the buffers; an unwritten partial, LSE or output would show). Cases cover the sm90ws forward
(the default ``bsa_fwd_impl="auto"`` and ``"sm90ws"`` named) at each block size and head dim
and the mma.sync forward (D 256; D 128 with ``bsa_fwd_impl="sm80"``).

Run on the H200: ``python -m pytest -m gpu tests/test_gpu_bsa_splits.py`` (shard with
``BSA_TEST_SHARD=i/n``); ``scripts/sessions/gpu_s18.sh`` runs it with the benchmark rows.
"""

from __future__ import annotations

import functools
import os

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

from attention_base import (_f32, _rows_bhs, check_bsa_garbage_clamped, check_rule,  # noqa: E402
                            check_unreached, shard)
from jax_sparse_attn.config import Switches  # noqa: E402

pytestmark = pytest.mark.gpu

SHARD = os.environ.get("BSA_TEST_SHARD", "")
SPLITS = (1, 2, 7, 64, "auto")

# (name, blk, d, dtype, layout, hq, hkv, sq, skv, kmax, sizes, impl); kmax list entries per
# row with counts in [0, kmax] (a third of the rows empty or short)
SHAPES = [
    ("ws-blk128-d128-gqa", 128, 128, "bfloat16", "bhsd", 8, 2, 300, 4001, 12, True, "auto"),
    ("ws-blk64-d64", 64, 64, "float16", "bshd", 4, 4, 1000, 999, 5, False, "auto"),
    ("ws-blk64-d128-gqa", 64, 128, "float16", "bhsd", 4, 1, 130, 2100, 9, True, "sm90ws"),
    ("ws-blk128-d64-gqa", 128, 64, "bfloat16", "bshd", 4, 2, 257, 1500, 6, False, "sm90ws"),
    # the mma.sync forward: D 256 (its default there) and D 128 with bsa_fwd_impl="sm80"
    ("mma-blk64-d256-gqa", 64, 256, "bfloat16", "bshd", 4, 2, 200, 1500, 7, True, "auto"),
    ("mma-blk128-d128", 128, 128, "float16", "bhsd", 2, 2, 300, 2100, 6, False, "sm80"),
]
# kv_splits-major: with BSA_TEST_SHARD=i/6 each shard runs one shape (one backward compile)
CASES = [(s, ks) for ks in SPLITS for s in SHAPES]


def _inputs(c, seed=0):
    """(q, k, v, do) clean, (k, v) poisoned, idx, nums, sizes (B, N_kv) or None."""
    name, blk, d, dtype, layout, hq, hkv, sq, skv, kmax, with_sizes, _ = c
    rng = np.random.default_rng(seed)
    b = 2
    nq, nkv = -(-sq // blk), -(-skv // blk)
    kmax = min(kmax, nkv)

    def t(s, h):
        shape = (b, h, s, d) if layout == "bhsd" else (b, s, h, d)
        return rng.standard_normal(shape, dtype=np.float32)

    q, k, v, do = t(sq, hq), t(skv, hkv), t(skv, hkv), t(sq, hq)
    idx = np.empty((b, hq, nq, kmax), np.int32)
    for bi in range(b):
        for h in range(hq):
            for m in range(nq):
                # the partial last KV block is listed by every row (first in a random place)
                others = rng.permutation(nkv - 1)[: kmax - 1]
                idx[bi, h, m] = rng.permutation(np.concatenate([[nkv - 1], others]))
    nums = rng.integers(0, kmax + 1, size=(b, hq, nq)).astype(np.int32)
    nums[:, :, 0] = 0  # an empty row per (batch, head)
    nums[:, 0, -1] = kmax  # a full row
    # the last KV block sits in the active prefix of the rows that have one
    last = np.argmax(idx == nkv - 1, axis=-1)
    for bi, h, m in zip(*np.nonzero((nums > 0) & (last >= nums))):
        j = rng.integers(0, nums[bi, h, m])
        idx[bi, h, m, [j, last[bi, h, m]]] = idx[bi, h, m, [last[bi, h, m], j]]
    sizes = None
    if with_sizes:
        sizes = rng.integers(1, blk + 1, size=(b, nkv)).astype(np.int32)
        sizes[:, 0] = blk
    # poison: NaN in every KV row that no query block lists, and past block_sizes
    kp, vp = k.copy(), v.copy()
    j = np.arange(kmax)[None, None, None, :]
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
            if layout == "bhsd":
                x[bi, :, rows[: x.shape[2]], :] = np.nan
            else:
                x[bi, rows[: x.shape[1]], :, :] = np.nan
    garbage = rng.choice(np.array([-7, 10**6, nkv, -1], np.int32), size=idx.shape)
    idx = np.where(j < nums[..., None], idx, garbage).astype(np.int32)
    cast = lambda x: jnp.asarray(x).astype(jnp.dtype(dtype))  # noqa: E731
    return ((cast(q), cast(k), cast(v), cast(do)), (cast(kp), cast(vp)), jnp.asarray(idx),
            jnp.asarray(nums), None if sizes is None else jnp.asarray(sizes))


def _kw(c):
    return dict(layout=c[4], sparse_block_size=c[1], softmax_scale=0.7 / np.sqrt(c[2]))


@functools.lru_cache(maxsize=None)
def _kernel_fn(c, ks):
    """Jitted: out, lse of the forward and dq, dk, dv through ``block_sparse_attention`` (its
    backward reads the split forward's combined out / lse) on the kernel backend."""
    import jax_sparse_attn as jsa

    kw = dict(_kw(c), allow_empty_block_nums=True, backend="kernel", kv_splits=ks,
              switches=Switches(bsa_fwd_impl=c[11]))

    @jax.jit
    def f(q, k, v, do, idx, nums, sizes):
        out, lse = jsa.block_sparse_attention_forward(q, k, v, idx, None, sizes, nums, **kw)
        _, vjp = jax.vjp(lambda q, k, v: jsa.block_sparse_attention(
            q, k, v, idx, None, sizes, nums, **kw), q, k, v)
        return (out, lse) + vjp(do)

    return f


@functools.lru_cache(maxsize=None)
def _reference_fn(c, ks, compute_dtype):
    """Jitted reference backend (``kv_splits=ks``, ``compute_dtype`` None = float32) on
    normalised metadata: out, lse, dq, dk, dv."""
    from jax_sparse_attn import reference

    kw = dict(_kw(c), compute_dtype=None if compute_dtype is None else jnp.dtype(compute_dtype))

    @jax.jit
    def f(q, k, v, do, idx, nums, sizes):
        out, lse = reference.block_sparse_attention_ref(q, k, v, idx, nums, sizes,
                                                        kv_splits=ks, **kw)
        return (out, lse) + tuple(reference.block_sparse_attention_bwd_ref(
            do, q, k, v, out, lse, idx, nums, sizes, **kw))

    return f


@pytest.mark.parametrize("c,ks", shard(CASES, SHARD),
                         ids=[f"{s[0]}-kv{ks}" for s, ks in shard(CASES, SHARD)])
def test_bsa_split_kv_kernel_vs_reference(c, ks):
    _check_case(c, ks)


# more than the 16 splits the combine kernel unrolls (its loop over a runtime split count)
LONG = ("ws-blk128-d64-long", 128, 64, "bfloat16", "bshd", 4, 2, 200, 6000, 40, True, "auto")


def test_bsa_split_kv_runtime_split_count_combine():
    """kv_splits=32 against 40-entry lists: the combine kernel's runtime-count variant."""
    if SHARD and int(SHARD.split("/")[0]) != 5 % int(SHARD.split("/")[1]):
        pytest.skip("BSA_TEST_SHARD: runs in another shard")
    _check_case(LONG, 32)


def _check_case(c, ks):
    from jax_sparse_attn.metadata import normalize_bsa_metadata

    (q, k, v, do), (kp, vp), idx, nums, sizes = _inputs(c)
    run = _kernel_fn(c, ks)
    # poisoned outputs: an all-NaN run first leaves NaN in buffers XLA is likely to reuse
    jax.block_until_ready(run(q * jnp.nan, kp, vp, do, idx, nums, sizes))
    got = jax.block_until_ready(run(q, kp, vp, do, idx, nums, sizes))
    meta = normalize_bsa_metadata(idx, None, sizes, nums)
    f32 = lambda x: x.astype(jnp.float32)  # noqa: E731
    truth = _reference_fn(c, 1, None)(f32(q), f32(k), f32(v), f32(do), *meta)
    base = _reference_fn(c, ks, c[3])(q, k, v, do, *meta)
    report = []
    check_rule("out", got[0], truth[0], base[0], 2.0, 2e-3, report)
    lse_g, lse_t = _f32(got[1]), np.asarray(truth[1], np.float64)
    assert not np.isnan(lse_g).any(), "lse: NaN"
    assert np.array_equal(np.isneginf(lse_g), np.isneginf(lse_t)), "lse -inf pattern differs"
    fin = np.isfinite(lse_t)
    check_rule("lse", lse_g[fin], lse_t[fin], _f32(base[1])[fin], 2.0, 1e-4, report)
    for i, name in enumerate(("dq", "dk", "dv"), start=2):
        check_rule(name, got[i], truth[i], base[i], 5.0, 5e-3, report)
    blk, layout, sq = c[1], c[4], c[7]
    empty = np.repeat(np.asarray(nums) == 0, blk, axis=-1)[..., :sq]  # (B, H, S_q)
    assert empty.any()
    assert np.all(_rows_bhs(_f32(got[0]), layout)[empty] == 0)
    assert np.all(np.isneginf(lse_g[empty]))
    assert np.all(_rows_bhs(_f32(got[2]), layout)[empty] == 0)
    # keys no row lists (NaN in kp / vp) or past block_sizes: dk = dv = 0 exactly
    check_unreached(("dk", "dv"), (got[3], got[4]), truth[4])
    print(c[0], f"kv_splits={ks}", " | ".join(report))


def test_bsa_split_kv_auto_on_this_gpu():
    """"auto" on the GPU: the split count of the compile key is the reference's rule with
    this GPU's SM count, and a call that splits lowers to the split forward and the combine
    kernel (two CuTe DSL calls)."""
    import jax_sparse_attn as jsa
    from jax_sparse_attn import metadata

    if SHARD and not SHARD.startswith("0/"):
        pytest.skip("BSA_TEST_SHARD: runs in shard 0")
    # B=1, H=4, one query block, 64 listed blocks: auto = min(num_sms // 4, 64) splits
    q = jnp.zeros((1, 4, 100, 128), jnp.bfloat16)
    kv = jnp.zeros((1, 4, 64 * 128, 128), jnp.bfloat16)
    idx = jnp.tile(jnp.arange(64, dtype=jnp.int32), (1, 4, 1, 1))
    cfg = jsa.bsa._make_config(
        q, kv, kv, idx, 64, None, None, sparse_block_size=128, softmax_scale=None,
        layout="bhsd", allow_empty_block_nums=False, backend="kernel", switches=None,
        op_name="block_sparse_attention_forward", kv_splits="auto")[0]
    want = metadata.auto_kv_splits(4, 64, metadata.num_sms())
    assert want == min(metadata.num_sms() // 4, 64) > 1
    assert cfg.fwd.kv_splits == want
    f = jax.jit(lambda q, k, v: jsa.block_sparse_attention_forward(
        q, k, v, idx, 64, sparse_block_size=128, backend="kernel", kv_splits="auto"))
    assert f.lower(q, kv, kv).as_text().count("CuteDSLRT_NvJaxCutlassCall") == 2
    out, lse = f(q, kv, kv)
    # all-zero q and k: uniform softmax over 64 * 128 keys of zero values
    assert np.all(np.asarray(out, np.float32) == 0)
    np.testing.assert_allclose(np.asarray(lse), np.log(64 * 128), rtol=1e-5)


GARBAGE = [("sm90ws", 128), ("sm90ws", 64), ("sm80", 64)]


@pytest.mark.parametrize("impl,blk", GARBAGE)
def test_bsa_split_kv_garbage_metadata_is_clamped(impl, blk):
    """Traced metadata (no eager checks) outside the contract: ids < 0 or >= N_kv inside the
    active prefix, counts < 0 or > K_max, block_sizes < 1 or > blk. The split forward reads
    nothing out of bounds and gives exactly the result of the metadata clamped as
    ``metadata.sanitize_bsa_metadata`` does (the sm90ws forward clamps in the kernel, the
    others get the sanitised metadata), and no NaN."""
    j = GARBAGE.index((impl, blk))
    if SHARD and int(SHARD.split("/")[0]) != j % int(SHARD.split("/")[1]):
        pytest.skip("BSA_TEST_SHARD: runs in another shard")
    rng = np.random.default_rng(7)
    b, h, sq, skv, d, kmax = 1, 2, 200, 1000, 128, 6
    nq, nkv = -(-sq // blk), -(-skv // blk)
    q, k, v = (jnp.asarray(rng.standard_normal((b, h, s, d), np.float32)).astype(jnp.bfloat16)
               for s in (sq, skv, skv))
    idx = jnp.asarray(rng.integers(-3, nkv + 3, size=(b, h, nq, kmax)), jnp.int32)
    nums = jnp.asarray(rng.integers(-2, kmax + 3, size=(b, h, nq)), jnp.int32)
    sizes = jnp.asarray(rng.integers(-5, blk + 20, size=(b, h, nkv)), jnp.int32)
    check_bsa_garbage_clamped(q, k, v, idx, nums, sizes, nkv, sparse_block_size=blk,
                              allow_empty_block_nums=True, backend="kernel", kv_splits=3,
                              switches=Switches(bsa_fwd_impl=impl))


CAUSAL_SHAPES = [SHAPES[0], SHAPES[1]]  # the default forward (sm90ws) at blk 128 and blk 64


@pytest.mark.parametrize("c", CAUSAL_SHAPES, ids=[s[0] for s in CAUSAL_SHAPES])
def test_bsa_split_kv_with_causal(c):
    """kv_splits=3 together with causal=True (the split forward with the causal mask; rows
    whose listed keys are all in the future give out = 0, lse = -inf), fwd + grad, against
    the float32 reference with the same rule as the grid above."""
    import jax_sparse_attn as jsa
    from jax_sparse_attn import reference
    from jax_sparse_attn.metadata import normalize_bsa_metadata

    j = 3 + [s[0] for s in CAUSAL_SHAPES].index(c[0])
    if SHARD and int(SHARD.split("/")[0]) != j % int(SHARD.split("/")[1]):
        pytest.skip("BSA_TEST_SHARD: runs in another shard")
    (q, k, v, do), (kp, vp), idx, nums, sizes = _inputs(c, seed=3)
    kw = dict(_kw(c), causal=True)
    kk = dict(kw, allow_empty_block_nums=True, backend="kernel", kv_splits=3,
              switches=Switches(bsa_fwd_impl=c[11]))

    @jax.jit
    def run(q, k, v, do):
        out, lse = jsa.block_sparse_attention_forward(q, k, v, idx, None, sizes, nums, **kk)
        _, vjp = jax.vjp(lambda q, k, v: jsa.block_sparse_attention(
            q, k, v, idx, None, sizes, nums, **kk), q, k, v)
        return (out, lse) + vjp(do)

    meta = normalize_bsa_metadata(idx, None, sizes, nums)

    def ref(ks, cdt):
        @jax.jit
        def f(q, k, v, do):
            kr = dict(kw, compute_dtype=cdt)
            out, lse = reference.block_sparse_attention_ref(q, k, v, *meta, kv_splits=ks, **kr)
            return (out, lse) + tuple(reference.block_sparse_attention_bwd_ref(
                do, q, k, v, out, lse, *meta, **kr))
        return f

    jax.block_until_ready(run(q * jnp.nan, kp, vp, do))
    got = jax.block_until_ready(run(q, kp, vp, do))
    f32 = lambda x: x.astype(jnp.float32)  # noqa: E731
    truth = ref(1, None)(f32(q), f32(k), f32(v), f32(do))
    base = ref(3, q.dtype)(q, k, v, do)
    report = []
    check_rule("out", got[0], truth[0], base[0], 2.0, 2e-3, report)
    lse_g, lse_t = _f32(got[1]), np.asarray(truth[1], np.float64)
    assert not np.isnan(lse_g).any(), "lse: NaN"
    assert np.array_equal(np.isneginf(lse_g), np.isneginf(lse_t)), "lse -inf pattern differs"
    fin = np.isfinite(lse_t)
    check_rule("lse", lse_g[fin], lse_t[fin], _f32(base[1])[fin], 2.0, 1e-4, report)
    for i, name in enumerate(("dq", "dk", "dv"), start=2):
        check_rule(name, got[i], truth[i], base[i], 5.0, 5e-3, report)
    # rows whose listed keys are all in the future or that list nothing: out = dq = 0
    # exactly (lse = -inf: the pattern check above); keys no row sees (unlisted, past
    # block_sizes, NaN in kp / vp, or listed but in every row's future): dk = dv = 0 exactly
    assert np.isneginf(lse_t).any(), "the case should have rows without visible keys"
    check_unreached(("out", "dq"), (got[0], got[2]), truth[0])
    check_unreached(("dk", "dv"), (got[3], got[4]), truth[4])
    print(c[0], "causal kv_splits=3", " | ".join(report))
