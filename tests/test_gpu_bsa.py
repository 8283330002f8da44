"""GPU tests of the block-sparse attention CuTe DSL kernels against the fp32 reference.

Rule (project standard): kernel error vs the float32 reference <= 2x (forward) / 5x
(backward) the error of the same computation done in the input dtype
(``compute_dtype=q.dtype`` of ``jax_sparse_attn.reference``), plus a small atol.
NaN never passes; rows with no key must give out = 0, lse = -inf and zero gradients.

Run on the H200: ``python -m pytest -m gpu tests/test_gpu_bsa.py`` (about 20 s per case,
mostly CuTe DSL + reference compiles; 7 minutes in one process). Shard with
``BSA_TEST_SHARD=i/n`` to run several processes in parallel (CuTe compiles are serial
inside one process; 4 processes finish the grid in about 100 s). The non-grid tests run
in one shard each, spread over the shards. The default kernels are
the wgmma ones for D in {64, 128}; set ``JAX_SPARSE_ATTN_BSA_FWD_IMPL=sm80`` and
``JAX_SPARSE_ATTN_BSA_BWD_IMPL=sm80`` to test the mma.sync kernels there, and
``JAX_SPARSE_ATTN_BSA_PRE_IMPL=xla`` for the XLA preprocessing alternative
(``test_bsa_preprocess_kernel`` checks the preprocessing kernel directly whatever the
variables say). ``JAX_SPARSE_ATTN_BSA_FWD_IMPL=sm90ws`` runs the grid on the warp-specialized
forward; ``test_bsa_sm90ws_forward`` adds its own cases (every KV block listed, the partial
last block listed by every row, NaN in unlisted blocks and past block_sizes, outputs
poisoned by a preceding all-NaN run); ``tests/gpu_bsa_ws.sh`` runs both and the benchmark.
"""

from __future__ import annotations

import functools
import os

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

pytestmark = pytest.mark.gpu


# ----------------------------------------------------------------------------- cases


def _case(name, *, dtype="bfloat16", layout="bhsd", blk=64, hq=4, hkv=4, sq=1000, skv=1025,
          d=128, counts="fixed", sizes_rank=0, pattern="random", kmax=4, b=2):
    return dict(name=name, dtype=dtype, layout=layout, blk=blk, hq=hq, hkv=hkv, sq=sq, skv=skv,
                d=d, counts=counts, sizes_rank=sizes_rank, pattern=pattern, kmax=kmax, b=b)


CASES = [
    _case("bf16-bhsd-64-mha-fixed", sq=1000, skv=1025),
    _case("fp16-bshd-128-gqa-var-r3", dtype="float16", layout="bshd", blk=128, hq=8, hkv=2,
          sq=1025, skv=1000, d=64, counts="var", sizes_rank=3),
    _case("bf16-bshd-64-gqa-var-r1", layout="bshd", hq=8, hkv=2, sq=63, skv=4096,
          counts="var", sizes_rank=1, kmax=8),
    _case("fp16-bhsd-128-mha-fixed-r2", dtype="float16", blk=128, sq=4096, skv=63,
          sizes_rank=2, kmax=1),
    _case("bf16-bhsd-128-q1", blk=128, sq=1, skv=1000, counts="var", kmax=8),
    _case("fp16-bshd-64-q64-kv1", dtype="float16", layout="bshd", sq=64, skv=1, kmax=1),
    _case("bf16-bhsd-64-kv64-r3-gqa", hq=8, hkv=2, sq=1025, skv=64, sizes_rank=3, kmax=1,
          counts="var"),
    _case("fp16-bhsd-64-gqa-fixed-r2", dtype="float16", hq=8, hkv=2, sq=4096, skv=1000,
          sizes_rank=2, kmax=6),
    _case("bf16-bshd-128-mha-var-4096", layout="bshd", blk=128, sq=4096, skv=1025,
          counts="var", kmax=5),
    _case("bf16-bhsd-64-empty-rows", hq=8, hkv=2, sq=1000, skv=1025, counts="empty"),
    _case("fp16-bshd-128-empty-rows-r3", dtype="float16", layout="bshd", blk=128, sq=1025,
          skv=4096, counts="empty", sizes_rank=3, kmax=8),
    _case("bf16-bhsd-128-block-causal", blk=128, sq=1024, skv=1024, pattern="causal",
          counts="var", kmax=8, b=1),
    _case("fp16-bshd-64-block-causal-gqa", dtype="float16", layout="bshd", hq=8, hkv=2,
          sq=1000, skv=1000, pattern="causal", counts="var", kmax=16, b=1),
    _case("bf16-bhsd-64-all-same-block", sq=4096, skv=1000, pattern="same", kmax=3),
    _case("fp16-bshd-128-all-same-block-gqa-r1", dtype="float16", layout="bshd", blk=128,
          hq=8, hkv=2, sq=4096, skv=1025, pattern="same", sizes_rank=1, kmax=2),
    _case("bf16-bshd-64-d32", layout="bshd", d=32, sq=1025, skv=1000, counts="var"),
    _case("fp16-bhsd-128-d256-r3", dtype="float16", blk=128, d=256, sq=1000, skv=1025,
          sizes_rank=3, b=1),
    _case("bf16-bshd-64-d256-gqa", layout="bshd", d=256, hq=8, hkv=2, sq=1025, skv=4096,
          counts="var", b=1),
    _case("fp16-bhsd-64-d64-var", dtype="float16", d=64, sq=4096, skv=4096, counts="var",
          kmax=16, b=1),
    _case("bf16-bhsd-128-d64-r1", blk=128, d=64, sq=63, skv=1025, sizes_rank=1),
]


def _shard(cases):
    spec = os.environ.get("BSA_TEST_SHARD")
    if not spec:
        return cases
    i, n = (int(x) for x in spec.split("/"))
    return [c for j, c in enumerate(cases) if j % n == i]


def _only_in_shard(j):
    """Non-grid test number ``j``: runs in shard ``(len(CASES) + j) % n`` only (spread out)."""
    spec = os.environ.get("BSA_TEST_SHARD")
    if spec:
        i, n = (int(x) for x in spec.split("/"))
        if (len(CASES) + j) % n != i:
            pytest.skip(f"BSA_TEST_SHARD: runs in shard {(len(CASES) + j) % n}/{n}")


# ----------------------------------------------------------------------------- inputs


def make_inputs(c, seed=0):
    rng = np.random.default_rng(seed)
    b, hq, hkv, sq, skv, d, blk = c["b"], c["hq"], c["hkv"], c["sq"], c["skv"], c["d"], c["blk"]
    nq, nkv = -(-sq // blk), -(-skv // blk)
    kmax = min(c["kmax"], nkv) if c["pattern"] == "random" else c["kmax"]
    dt = jnp.dtype(c["dtype"])

    def t(s, h):
        shape = (b, h, s, d) if c["layout"] == "bhsd" else (b, s, h, d)
        return jnp.asarray(rng.standard_normal(shape, dtype=np.float32)).astype(dt)

    q, k, v = t(sq, hq), t(skv, hkv), t(skv, hkv)
    idx = np.empty((b, hq, nq, kmax), np.int32)
    if c["pattern"] == "random":
        order = np.argsort(rng.random((b, hq, nq, nkv)), axis=-1)[..., :kmax]
        idx[...] = order
        if c["counts"] == "fixed":
            nums = np.full((b, hq, nq), kmax, np.int32)
        elif c["counts"] == "var":
            nums = rng.integers(1, kmax + 1, size=(b, hq, nq)).astype(np.int32)
        else:  # empty rows allowed: about a third of the rows are empty
            nums = rng.integers(0, kmax + 1, size=(b, hq, nq)).astype(np.int32)
            nums[..., 0] = 0
    elif c["pattern"] == "causal":
        # block-causal lower triangle (bottom-right aligned by block count), all blocks listed
        off = nkv - nq
        nums = np.empty((b, hq, nq), np.int32)
        for m in range(nq):
            hi = min(max(m + off, 0), nkv - 1)
            lst = rng.permutation(hi + 1)[:kmax]
            lst = np.concatenate([lst, np.zeros(kmax - len(lst), np.int64)])
            idx[:, :, m, :] = lst
            nums[:, :, m] = min(hi + 1, kmax)
        assert kmax >= nkv, "causal case must list the whole triangle"
    else:  # every query block selects the same KV block (plus others for kmax > 1)
        same = nkv // 2
        for m in range(nq):
            others = [n for n in rng.permutation(nkv) if n != same][: kmax - 1]
            idx[:, :, m, :] = [same] + others + [0] * (kmax - 1 - len(others))
        nums = np.full((b, hq, nq), min(kmax, nkv), np.int32)
    # out-of-range garbage past the active prefix
    j = np.arange(kmax)[None, None, None, :]
    garbage = rng.choice(np.array([-7, 10**6, nkv, -1], np.int32), size=idx.shape)
    idx = np.where(j < nums[..., None], idx, garbage).astype(np.int32)

    sizes = None
    if c["sizes_rank"]:
        shape = {1: (nkv,), 2: (b, nkv), 3: (b, hq, nkv)}[c["sizes_rank"]]
        sizes = rng.integers(1, blk + 1, size=shape).astype(np.int32)
        sizes[..., 0] = blk  # at least one full block
        sizes = jnp.asarray(sizes)
    return q, k, v, jnp.asarray(idx), jnp.asarray(nums), sizes


# ----------------------------------------------------------------------------- runners


@functools.partial(jax.jit, static_argnames=("layout", "blk", "scale"))
def _kernel_fwd_bwd(q, k, v, idx, nums, sizes, do, *, layout, blk, scale):
    from jax_sparse_attn.ffi import bsa as ffi_bsa

    out, lse = ffi_bsa.bsa_fwd(q, k, v, idx, nums, sizes, layout=layout,
                               sparse_block_size=blk, softmax_scale=scale)
    dq, dk, dv = ffi_bsa.bsa_bwd(do, q, k, v, out, lse, idx, nums, sizes, layout=layout,
                                 sparse_block_size=blk, softmax_scale=scale)
    return out, lse, dq, dk, dv


@functools.partial(jax.jit, static_argnames=("layout", "blk", "scale", "cdt"))
def _ref_fwd_bwd(q, k, v, idx, nums, sizes, do, *, layout, blk, scale, cdt):
    from jax_sparse_attn import reference

    kw = dict(layout=layout, sparse_block_size=blk, softmax_scale=scale,
              compute_dtype=None if cdt == "float32" else jnp.dtype(cdt))
    out, lse = reference.block_sparse_attention_ref(q, k, v, idx, nums, sizes, **kw)
    if cdt == "float32":
        # fp32 oracle: also keep the fp32 output for the backward
        kw32 = dict(kw)
        out32, lse32 = reference.block_sparse_attention_ref(
            q.astype(jnp.float32), k.astype(jnp.float32), v.astype(jnp.float32),
            idx, nums, sizes, **kw32)
        dq, dk, dv = reference.block_sparse_attention_bwd_ref(
            do.astype(jnp.float32), q.astype(jnp.float32), k.astype(jnp.float32),
            v.astype(jnp.float32), out32, lse32, idx, nums, sizes, **kw32)
        return out32, lse32, dq, dk, dv
    dq, dk, dv = reference.block_sparse_attention_bwd_ref(do, q, k, v, out, lse, idx, nums,
                                                          sizes, **kw)
    return out, lse, dq, dk, dv


def _err(a, b):
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b))) if a.size else 0.0


def _check(name, got, ref, base, mult, rel_atol):
    got = np.asarray(jnp.asarray(got, jnp.float32))
    ref = np.asarray(jnp.asarray(ref, jnp.float32))
    base = np.asarray(jnp.asarray(base, jnp.float32))
    assert got.shape == ref.shape, (name, got.shape, ref.shape)
    assert not np.isnan(got).any(), f"{name}: NaN in kernel output"
    err, berr = _err(got, ref), _err(base, ref)
    atol = rel_atol * max(1e-3, float(np.max(np.abs(ref))) if ref.size else 1.0)
    assert err <= mult * berr + atol, f"{name}: err {err:.3e} > {mult}x baseline {berr:.3e} + {atol:.1e}"
    return err, berr


def _rows_bhs(x, layout):
    """(B, H, S, ...) view of a q-shaped tensor."""
    return x if layout == "bhsd" else jnp.swapaxes(x, 1, 2)


@pytest.mark.parametrize("c", _shard(CASES), ids=lambda c: c["name"])
def test_bsa_kernel_matches_reference(c):
    q, k, v, idx, nums, sizes = make_inputs(c)
    scale = 0.7 / np.sqrt(c["d"])  # not the default, so softmax_scale is exercised
    kw = dict(layout=c["layout"], blk=c["blk"], scale=float(scale))
    do = jnp.asarray(np.random.default_rng(1).standard_normal(q.shape[:-1] + (v.shape[-1],),
                                                                dtype=np.float32)).astype(q.dtype)
    from jax_sparse_attn.reference import normalize_bsa_metadata

    idx_n, nums_n, sizes_n = normalize_bsa_metadata(idx, None, sizes, nums)
    got = _kernel_fwd_bwd(q, k, v, idx_n, nums_n, sizes_n, do, **kw)
    ref = _ref_fwd_bwd(q, k, v, idx_n, nums_n, sizes_n, do, cdt="float32", **kw)
    base = _ref_fwd_bwd(q, k, v, idx_n, nums_n, sizes_n, do, cdt=c["dtype"], **kw)
    out, lse, dq, dk, dv = got
    report = {}
    report["out"] = _check("out", out, ref[0], base[0], 2, 2e-3)
    # lse: same -inf pattern, finite values within the rule
    lse_g, lse_r, lse_b = (np.asarray(x, np.float32) for x in (lse, ref[1], base[1]))
    assert not np.isnan(lse_g).any()
    assert np.array_equal(np.isneginf(lse_g), np.isneginf(lse_r)), "lse -inf pattern differs"
    fin = np.isfinite(lse_r)
    report["lse"] = _check("lse", lse_g[fin], lse_r[fin], lse_b[fin], 2, 1e-4)
    report["dq"] = _check("dq", dq, ref[2], base[2], 5, 5e-3)
    report["dk"] = _check("dk", dk, ref[3], base[3], 5, 5e-3)
    report["dv"] = _check("dv", dv, ref[4], base[4], 5, 5e-3)
    if c["counts"] == "empty":
        empty = np.repeat(np.asarray(nums_n) == 0, c["blk"], axis=-1)[..., : c["sq"]]  # (B,H,S)
        assert empty.any()
        o_rows = np.asarray(_rows_bhs(out, c["layout"]), np.float32)
        dq_rows = np.asarray(_rows_bhs(dq, c["layout"]), np.float32)
        assert np.all(o_rows[empty] == 0) and np.all(np.isneginf(lse_g[empty]))
        assert np.all(dq_rows[empty] == 0)
    print(c["name"], {k_: f"{e:.2e}/{b_:.2e}" for k_, (e, b_) in report.items()})


def test_block_causal_equals_dense_block_causal():
    """Block-causal lower triangle == dense attention under the block-granular causal mask."""
    _only_in_shard(4)
    c = _case("causal-dense", blk=64, sq=512, skv=512, pattern="causal", counts="var", kmax=8, b=1,
              hq=2, hkv=2)
    q, k, v, idx, nums, _ = make_inputs(c)
    scale = 1.0 / np.sqrt(c["d"])
    do = jnp.asarray(np.random.default_rng(2).standard_normal(q.shape, dtype=np.float32)).astype(q.dtype)
    got = _kernel_fwd_bwd(q, k, v, idx, nums, None, do, layout="bhsd", blk=64, scale=float(scale))

    def dense(q, k, v):
        s = jnp.einsum("bhqd,bhkd->bhqk", q, k) * scale
        i = jnp.arange(c["sq"])[:, None] // 64
        j = jnp.arange(c["skv"])[None, :] // 64
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
    from jax_sparse_attn import reference

    c = _case("grad", layout="bshd", blk=128, hq=8, hkv=2, sq=777, skv=1025, counts="var",
              sizes_rank=2, kmax=4, b=1)
    q, k, v, idx, nums, sizes = make_inputs(c)

    def loss(backend):
        def f(q, k, v):
            o = jsa.block_sparse_attention(q, k, v, idx, None, sizes, nums, sparse_block_size=128,
                                           layout="bshd", backend=backend)
            return jnp.sum(jnp.sin(o.astype(jnp.float32)))
        return jax.jit(jax.grad(f, argnums=(0, 1, 2)))

    g_k = loss("kernel")(q, k, v)
    g_r = loss("reference")(*(x.astype(jnp.float32) for x in (q, k, v)))
    del reference
    for a, b_ in zip(g_k, g_r):
        a = np.asarray(a, np.float32)
        b_ = np.asarray(b_, np.float32)
        assert not np.isnan(a).any()
        assert np.max(np.abs(a - b_)) <= 3e-2 * max(1.0, np.max(np.abs(b_))), np.max(np.abs(a - b_))


def test_fresh_inputs_same_shape_not_stale():
    """Two calls with different inputs of one shape: each matches its own reference."""
    _only_in_shard(6)
    c = _case("stale", blk=64, sq=300, skv=333, counts="var", sizes_rank=3, b=1)
    outs = []
    for seed in (3, 4):
        q, k, v, idx, nums, sizes = make_inputs(c, seed=seed)
        do = jnp.ones(q.shape, q.dtype)
        got = _kernel_fwd_bwd(q, k, v, idx, nums, sizes, do, layout="bhsd", blk=64, scale=0.125)
        ref = _ref_fwd_bwd(q, k, v, idx, nums, sizes, do, layout="bhsd", blk=64, scale=0.125,
                           cdt="float32")
        for g, r in zip(got, ref):
            g = np.asarray(g, np.float32)
            r = np.asarray(r, np.float32)
            fin = np.isfinite(r)
            assert np.max(np.abs(g[fin] - r[fin])) <= 3e-2 * max(1.0, np.max(np.abs(r[fin])))
        outs.append(np.asarray(got[0], np.float32))
    assert not np.array_equal(outs[0], outs[1])


PRE_CASES = [(d, layout, dtype) for d, layout, dtype in (
    (32, "bshd", "float16"), (64, "bhsd", "bfloat16"), (128, "bshd", "bfloat16"), (256, "bhsd", "float16"))]


@pytest.mark.parametrize("d,layout,dtype", _shard(PRE_CASES))
def test_bsa_preprocess_kernel(d, layout, dtype):
    """kernels/bsa_pre.py: delta = rowsum(dO * O) in fp32 and an all-zero dq accumulator.

    B*S*H = 2*1023*3 rows is not a multiple of the rows per CTA (tail CTA), odd S."""
    from jax_sparse_attn.ffi import bsa as ffi_bsa

    rng = np.random.default_rng(5)
    shape = (2, 3, 1023, d) if layout == "bhsd" else (2, 1023, 3, d)
    o, do = (jnp.asarray(rng.standard_normal(shape, dtype=np.float32)).astype(dtype) for _ in range(2))
    f = jax.jit(functools.partial(ffi_bsa.bsa_preprocess, layout=layout))
    delta, dq_acc = f(do, o)
    want = jnp.sum(do.astype(jnp.float32) * o.astype(jnp.float32), axis=-1)
    want = np.asarray(_rows_bhs(want, layout))
    got = np.asarray(delta)
    assert got.shape == want.shape == (2, 3, 1023)
    assert not np.isnan(got).any()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4 * np.sqrt(d))
    acc = np.asarray(dq_acc)
    assert acc.shape == shape and acc.dtype == np.float32
    assert np.all(acc == 0.0)
    # a second call with other inputs is not stale
    delta2, _ = f(o, o)
    want2 = np.asarray(_rows_bhs(jnp.sum(jnp.square(o.astype(jnp.float32)), axis=-1), layout))
    np.testing.assert_allclose(np.asarray(delta2), want2, rtol=1e-5, atol=1e-4 * np.sqrt(d))


# ----------------------------------------------------------------------------- sm90ws forward
# The warp-specialized forward (kernels/bsa_fwd_sm90_ws.py) is opt-in: the whole grid above runs
# on it with JAX_SPARSE_ATTN_BSA_FWD_IMPL=sm90ws; the tests below select it themselves.

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
    b, hq, hkv, sq, skv, d, blk = 2, c["hq"], c["hkv"], c["sq"], c["skv"], c["d"], c["blk"]
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


def _bsa_fwd_impl(impl, q, k, v, idx, nums, sizes, **kw):
    """The forward kernel with ``JAX_SPARSE_ATTN_BSA_FWD_IMPL=impl`` (read at trace time: a
    fresh jit per call)."""
    from jax_sparse_attn.ffi import bsa as ffi_bsa

    old = os.environ.get("JAX_SPARSE_ATTN_BSA_FWD_IMPL")
    os.environ["JAX_SPARSE_ATTN_BSA_FWD_IMPL"] = impl
    try:
        fn = jax.jit(lambda q, k, v, i, n, s: ffi_bsa.bsa_fwd(q, k, v, i, n, s, **kw))
        return jax.block_until_ready(fn(q, k, v, idx, nums, sizes))
    finally:
        if old is None:
            os.environ.pop("JAX_SPARSE_ATTN_BSA_FWD_IMPL", None)
        else:
            os.environ["JAX_SPARSE_ATTN_BSA_FWD_IMPL"] = old


@pytest.mark.parametrize("c", _shard(WS_CASES), ids=lambda c: c["name"])
def test_bsa_sm90ws_forward(c):
    from jax_sparse_attn import reference
    from jax_sparse_attn.reference import normalize_bsa_metadata

    (q, k, v), (kp, vp), idx, nums, sizes = _ws_inputs(c)
    idx_n, nums_n, sizes_n = normalize_bsa_metadata(idx, None, sizes, nums)
    scale = 0.6 / np.sqrt(c["d"])
    kw = dict(layout=c["layout"], sparse_block_size=c["blk"], softmax_scale=float(scale))
    # poisoned outputs: an all-NaN run first leaves NaN in buffers XLA is likely to reuse
    jax.block_until_ready(_bsa_fwd_impl("sm90ws", q * jnp.nan, kp, vp, idx_n, nums_n, sizes_n, **kw))
    out, lse = _bsa_fwd_impl("sm90ws", q, kp, vp, idx_n, nums_n, sizes_n, **kw)
    f32 = lambda x: x.astype(jnp.float32)  # noqa: E731
    out_r, lse_r = reference.block_sparse_attention_ref(f32(q), f32(k), f32(v), idx_n, nums_n,
                                                        sizes_n, **kw)
    out_b, lse_b = reference.block_sparse_attention_ref(q, k, v, idx_n, nums_n, sizes_n,
                                                        compute_dtype=q.dtype, **kw)
    e_o = _check("out", out, out_r, out_b, 2, 2e-3)
    lse_g, lse_r, lse_b = (np.asarray(x, np.float32) for x in (lse, lse_r, lse_b))
    assert not np.isnan(lse_g).any()
    assert np.array_equal(np.isneginf(lse_g), np.isneginf(lse_r)), "lse -inf pattern differs"
    fin = np.isfinite(lse_r)
    e_l = _check("lse", lse_g[fin], lse_r[fin], lse_b[fin], 2, 1e-4)
    if c["mode"] == "last-empty":
        empty = np.repeat(np.asarray(nums_n) == 0, c["blk"], axis=-1)[..., : c["sq"]]
        assert empty.any()
        o_rows = np.asarray(_rows_bhs(out, c["layout"]), np.float32)
        assert np.all(o_rows[empty] == 0) and np.all(np.isneginf(lse_g[empty]))
    print(c["name"], f"out {e_o[0]:.2e}/{e_o[1]:.2e} lse {e_l[0]:.2e}/{e_l[1]:.2e}")
