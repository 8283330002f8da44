"""Fixed-point dQ of the deterministic block-sparse backward (``bsa_bwd_ws`` ``detfixed``):
the per-query-row multipliers (``ffi.bsa.dq_fixed_multipliers``) against the dQ
contributions they must bound, computed in float64 from their definition; the integer
pipeline's result against the float sum; the configuration and the lowering (sm_90a).
The GPU cases are in ``tests/test_gpu_dq_fixed.py``."""

from __future__ import annotations

import types

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

LIMIT = 2**30  # kernels/dq_tiles.FIXED_LIMIT


def _cfg(b, h_q, h_kv, s_q, s_kv, d, blk, scale, layout="bhsd"):
    return types.SimpleNamespace(batch=b, num_heads_q=h_q, num_heads_kv=h_kv, head_dim=d,
                                 sparse_block_size=blk, num_kv_blocks=-(-s_kv // blk),
                                 softmax_scale=scale, layout=layout, seqlen_q=s_q)


def _case(rng, b=2, h_q=4, h_kv=2, s_q=150, s_kv=200, d=32, blk=64, k_max=3, scale=0.2,
          sizes=True, mag=1.0):
    n_q, n_kv = -(-s_q // blk), -(-s_kv // blk)
    q = rng.standard_normal((b, h_q, s_q, d)) * mag
    k = rng.standard_normal((b, h_kv, s_kv, d)) * mag
    v = rng.standard_normal((b, h_kv, s_kv, d))
    do = rng.standard_normal((b, h_q, s_q, d))
    idx = np.argsort(rng.random((b, h_q, n_q, n_kv)), -1)[..., :k_max].astype(np.int32)
    nums = rng.integers(0, k_max + 1, (b, h_q, n_q)).astype(np.int32)
    bs = rng.integers(1, blk + 1, (b, h_q, n_kv)).astype(np.int32) if sizes else None
    return q, k, v, do, idx, nums, bs, n_q, n_kv


def _contributions(q, k, v, do, idx, nums, bs, blk, scale, dlse=None):
    """Per (b, h, query block m, list slot) the float64 dQ contribution of that KV block to
    the block's rows (``(..., blk, d)``; rows past S_q zero), with the forward's lse and
    delta = rowsum(dO * O) - dlse over the listed, valid keys."""
    b, h_q, s_q, d = q.shape
    h_kv, s_kv = k.shape[1], k.shape[2]
    group = h_q // h_kv
    n_q = idx.shape[2]
    out = np.zeros(idx.shape + (blk, d))
    delta_all = np.zeros((b, h_q, s_q))
    for bi in range(b):
        for h in range(h_q):
            g = h // group
            for m in range(n_q):
                rows = np.arange(m * blk, min((m + 1) * blk, s_q))
                keys = []
                for slot in range(nums[bi, h, m]):
                    n = idx[bi, h, m, slot]
                    cnt = blk if bs is None else bs[bi, h, n]
                    kk = np.arange(n * blk, min(n * blk + cnt, s_kv))
                    keys.append(kk)
                if not keys:
                    continue
                allk = np.concatenate(keys)
                s = q[bi, h, rows] @ k[bi, g, allk].T * scale
                lse = np.log(np.exp(s - s.max(1, keepdims=True)).sum(1)) + s.max(1)
                p = np.exp(s - lse[:, None])
                o = p @ v[bi, g, allk]
                delta = (do[bi, h, rows] * o).sum(1)
                if dlse is not None:
                    delta = delta - dlse[bi, h, rows]
                delta_all[bi, h, rows] = delta
                col = 0
                for slot, kk in enumerate(keys):
                    pp = p[:, col:col + len(kk)]
                    dp = do[bi, h, rows] @ v[bi, g, kk].T
                    ds = scale * pp * (dp - delta[:, None])
                    out[bi, h, m, slot, :len(rows)] = ds @ k[bi, g, kk]
                    col += len(kk)
    return out, delta_all


def _mult(k, v, do, delta, idx, nums, bs, cfg, n_tiles):
    from jax_sparse_attn.ffi import bsa as fb

    f = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
    return np.asarray(fb.dq_fixed_multipliers(
        f(k), f(v), f(do), f(delta), jnp.asarray(idx), jnp.asarray(nums),
        None if bs is None else jnp.asarray(bs), cfg, n_tiles))


@pytest.mark.parametrize("blk,sizes,mag,dlse,outlier",
                         [(64, True, 1.0, False, False), (128, False, 1.0, True, False),
                          (64, False, 30.0, False, False), (64, True, 1e-3, True, False),
                          (64, True, 1.0, False, True)])
def test_multipliers_bound_every_contribution(blk, sizes, mag, dlse, outlier):
    """Every KV block's dQ contribution and every partial sum of them, times its row's
    multiplier, stays within 2^28 (the kernel flags beyond 2^30; int32 wraps at 2^31), and
    for unit-scale inputs the multiplier leaves each row's largest contribution at least
    2^13 steps (2^19 for the median row), also next to a row whose dO is 10^4 times larger
    (``outlier``: each row has its own exponent); powers of two, inverse exact."""
    rng = np.random.default_rng(blk + int(mag * 10) + dlse)
    s_q, s_kv = (300, 400) if blk == 128 else (150, 200)
    q, k, v, do, idx, nums, bs, n_q, _ = _case(rng, blk=blk, s_q=s_q, s_kv=s_kv, sizes=sizes,
                                               mag=mag)
    if outlier:
        do[:, :, 3] *= 1e4
    dl = rng.standard_normal((q.shape[0], q.shape[1], s_q)) if dlse else None
    contrib, delta = _contributions(q, k, v, do, idx, nums, bs, blk, 0.2, dl)
    cfg = _cfg(2, 4, 2, s_q, s_kv, 32, blk, 0.2)
    n_t = -(-s_q // 64)
    mult = _mult(k, v, do, delta, idx, nums, bs, cfg, n_t)
    assert mult.shape == (2, 4, n_t, 64, 2)
    np.testing.assert_array_equal(mult[..., 0] * mult[..., 1], 1.0)
    assert (np.log2(mult[..., 0]) == np.round(np.log2(mult[..., 0]))).all()
    sub = blk // 64
    tops = []  # per row with contributions: its largest one, in steps of the fixed point
    for m in range(n_q):
        for s in range(sub):
            t = m * sub + s
            if t >= n_t:
                continue
            # (B, H, slot, row, D) times the rows' multipliers
            c = contrib[:, :, m, :, 64 * s:64 * (s + 1)] * mult[:, :, t, None, :, 0, None]
            part = np.abs(np.cumsum(c, axis=2)).max() if c.size else 0.0
            assert np.abs(c).max() <= 2**28 and part <= 2**28
            top = np.abs(c).max(axis=(2, 4))  # (B, H, row)
            if outlier and m == 0 and s == 0:
                top[:, :, 3] = 0  # the outlier row itself
            tops.append(top[top > 0])
    tops = np.log2(np.concatenate(tops))
    print(f"steps of the rows' largest contributions: log2 min {tops.min():.1f}, "
          f"median {np.median(tops):.1f}")
    if mag == 1.0:
        # unit-scale inputs (with large logits the softmax saturates and dQ cancels: small
        # contributions next to the bound's terms, which set the bf16 error anyway)
        assert np.median(tops) >= 19 and tops.min() >= 13


@pytest.mark.parametrize("d,a", [(32, 1.0), (128, 3.0), (64, 1e-3)])
def test_multipliers_hold_the_worst_case(d, a):
    """Inputs that reach the bound's order: one query row, two listed one-key blocks with
    opposite V and K, constant dO, so P is 1/2 on each, ``|dP| = |dO| |V|`` (V parallel to
    dO: Cauchy-Schwarz with equality) and the two contributions add to half the bound's
    terms. Their sum times the multiplier is in
    ``(2^26, 2^27]``: one bit of margin below the bound's 2^28, three below the kernel's
    flag limit (2^30) and four below int32's range."""
    blk = 64
    q = np.zeros((1, 1, 1, d))
    k = np.zeros((1, 1, 2 * blk, d))
    v = np.zeros((1, 1, 2 * blk, d))
    k[0, 0, 0], k[0, 0, blk] = 0.5, -0.5
    v[0, 0, 0], v[0, 0, blk] = 2.0 * a, -2.0 * a
    do = np.full((1, 1, 1, d), 1.5)
    idx = np.array([[[[0, 1]]]], np.int32)
    nums = np.array([[[2]]], np.int32)
    bs = np.ones((1, 1, 2), np.int32)
    contrib, delta = _contributions(q, k, v, do, idx, nums, bs, blk, 0.25)
    mult = _mult(k, v, do, delta, idx, nums, bs, _cfg(1, 1, 1, 1, 2 * blk, d, blk, 0.25), 1)
    total = np.abs(contrib[0, 0, 0].sum(axis=0)).max() * mult[0, 0, 0, 0, 0]
    assert 2**26 < total <= 2**27, np.log2(total)


@pytest.mark.parametrize("n_blocks,outlier", [(256, False), (1024, False), (64, True)])
def test_fixed_point_error_below_the_ds_rounding(n_blocks, outlier):
    """A 64-row query tile listing many KV blocks (D 64, blk 64, unit-normal inputs; with
    ``outlier`` one V element 100 times larger): the error of the fixed-point sum (each
    block's float64 contribution rounded after the row's multiplier, as the kernel does)
    is below half the error that the 16-bit (bf16) rounding of dS already gives the default
    mode's fp32 sum. The rounding steps are fixed by a bound that does not shrink with the
    number of blocks while the row's dq does, so this is the case where the fixed point
    loses the most against the float sum."""
    rng = np.random.default_rng(n_blocks + outlier)
    d, blk, scale = 64, 64, 64**-0.5
    s_kv = n_blocks * blk
    q = rng.standard_normal((1, 1, 64, d))
    k = rng.standard_normal((1, 1, s_kv, d))
    v = rng.standard_normal((1, 1, s_kv, d))
    do = rng.standard_normal((1, 1, 64, d))
    if outlier:
        v[0, 0, 5 * blk + 3, 7] *= 100.0
    idx = np.arange(n_blocks, dtype=np.int32)[None, None, None]
    nums = np.array([[[n_blocks]]], np.int32)
    s = q[0, 0] @ k[0, 0].T * scale
    p = np.exp(s - s.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    dp = do[0, 0] @ v[0, 0].T
    delta = (do[0, 0] * (p @ v[0, 0])).sum(1)
    ds = scale * p * (dp - delta[:, None])
    mult = _mult(k, v, do, delta[None, None], idx, nums, None,
                 _cfg(1, 1, 1, 64, s_kv, d, blk, scale), 1)[0, 0, 0]  # (64, 2)
    want = ds @ k[0, 0]
    ds16 = np.asarray(jnp.asarray(ds, jnp.bfloat16).astype(jnp.float32), np.float64)
    err16 = ds16 @ k[0, 0] - want
    parts = (ds.reshape(64, n_blocks, blk)[..., None]
             * k[0, 0].reshape(n_blocks, blk, d)[None]).sum(2)  # (row, block, D)
    ints = np.rint(parts * mult[:, None, None, 0])
    assert np.abs(ints).max() < 2**30
    errfix = ints.sum(1) * mult[:, None, 1] - want
    rms = lambda x: float(np.sqrt(np.mean(x**2)))  # noqa: E731
    print(f"blocks {n_blocks}: fixed point {rms(errfix) / rms(want):.2e}, "
          f"bf16 dS {rms(err16) / rms(want):.2e} (RMS error / RMS dq)")
    assert rms(errfix) <= 0.5 * rms(err16)


def test_multipliers_ignore_unlisted_and_masked_keys():
    """NaN / Inf and huge finite values in KV blocks no query block lists, in keys past
    ``block_sizes`` and in dO rows past S_q do not change the multipliers."""
    rng = np.random.default_rng(7)
    q, k, v, do, idx, nums, bs, n_q, n_kv = _case(rng, sizes=True)
    _, delta = _contributions(q, k, v, do, idx, nums, bs, 64, 0.2)
    cfg = _cfg(2, 4, 2, 150, 200, 32, 64, 0.2)
    want = _mult(k, v, do, delta, idx, nums, bs, cfg, 3)
    listed = np.zeros((2, 2, n_kv), bool)
    for bi, h, m, slot in np.ndindex(idx.shape):
        if slot < nums[bi, h, m]:
            listed[bi, h // 2, idx[bi, h, m, slot]] = True
    k2, v2 = k.copy(), v.copy()
    for bi, g, n in np.ndindex(listed.shape):
        lo = n * 64
        if not listed[bi, g, n]:
            k2[bi, g, lo:lo + 64] = rng.choice([np.nan, np.inf, 1e30], k2[bi, g, lo:lo + 64].shape)
            v2[bi, g, lo:lo + 64] = 1e30
        else:
            # keys past every head's block size for this block
            cut = bs[bi, 2 * g:2 * g + 2, n].max()
            k2[bi, g, lo + cut:lo + 64] = 1e30
            v2[bi, g, lo + cut:lo + 64] = np.nan
    np.testing.assert_array_equal(_mult(k2, v2, do, delta, idx, nums, bs, cfg, 3), want)


def test_fixed_point_sum_matches_the_float_sum():
    """The kernel's arithmetic in numpy: each contribution rounded to int32 after the
    row's multiplier, the int32 sum in any order, times the inverse: within 2^-11 of the
    row's largest contribution of the float64 sum, and bitwise the same in every order."""
    rng = np.random.default_rng(3)
    q, k, v, do, idx, nums, bs, n_q, _ = _case(rng, sizes=False)
    contrib, delta = _contributions(q, k, v, do, idx, nums, bs, 64, 0.2)
    mult = _mult(k, v, do, delta, idx, nums, bs, _cfg(2, 4, 2, 150, 200, 32, 64, 0.2), 3)
    c32 = contrib.astype(np.float32)  # (B, H, m, slot, row, D); blk 64: tile = block
    m = mult[:, :, :n_q, None, :, 0, None].astype(np.float32)
    ints = np.rint(c32 * m).astype(np.int64)
    assert np.abs(ints).max() < 2**30
    fwd = ints.sum(axis=3).astype(np.int32)
    rev = ints[:, :, :, ::-1].sum(axis=3).astype(np.int32)
    np.testing.assert_array_equal(fwd, rev)
    got = fwd.astype(np.float32) * mult[:, :, :n_q, :, 1, None]
    want = contrib.sum(axis=3)
    # per row: within 2^-11 of its largest contribution
    scale = np.abs(contrib).max(axis=(3, 5))[..., None] + 1e-30
    assert (np.abs(got - want) <= scale * 2.0**-11).all()


def test_detfixed_config():
    """``detfixed`` with deterministic=True gives the default mode's configuration with
    fixed-point dQ (not deterministic in the ordered sense: no order, no semaphores);
    without the dq reordering in the backward's call (``notailconv``) or without
    deterministic it changes nothing."""
    from jax_sparse_attn import config as jc
    from jax_sparse_attn.ffi import bsa as fb

    for blk in (64, 128):
        sw = jc.Switches(bsa_bwd_ws="detfixed", pdl=True)
        key = fb.bwd_config(jnp.bfloat16, 128, blk, False, sw, deterministic=True)
        base = fb.bwd_config(jnp.bfloat16, 128, blk, False, sw)
        assert key.dq_fixed and not key.deterministic and key.tail_conv
        # (with warpgroup 0's late dQ half, the default mode's default at blk 128: it keeps
        # the previous step's multipliers in registers; the warp-uniform warpgroup index as
        # in the default mode)
        assert key == fb.dataclasses.replace(base, dq_fixed=True, fix_mult_one_pass=True)
        assert key.ws_wg_uniform
        assert key.ws_dq_lag == (blk == 128)
        assert not base.dq_fixed
        for ws, lag in (("detfixed,dqlag", blk == 128), ("detfixed,nodqlag", False)):
            named = fb.bwd_config(jnp.bfloat16, 128, blk, False,
                                  jc.Switches(bsa_bwd_ws=ws, pdl=True), deterministic=True)
            assert named.dq_fixed and named.ws_dq_lag == lag, ws
        off = fb.bwd_config(jnp.bfloat16, 128, blk, False,
                            jc.Switches(bsa_bwd_ws="detfixed,notailconv", pdl=True),
                            deterministic=True)
        assert off.deterministic and not off.dq_fixed


# the lowering configurations of the PTX test (tests/kept_ptx.py): name -> (function of
# tests/test_lowering_bsa_bwd_ws.py, its positional arguments, Switches fields, keywords)
_PTX_CONFIGS = {f"detfixed-{i}": ("_bwd_text", (i,), None,
                                  {"ws": "detfixed", "deterministic": True, "det_writer": True})
                for i in range(4)}


@pytest.mark.lowering
def test_detfixed_lowers(tmp_path):
    """The deterministic backward with ``detfixed`` lowers for sm_90a at every (D, blk) of
    the kernel as three calls (preprocessing, K->Q lists, the backward with the dq
    reordering); the backward's PTX converts to int32 with rounding and saturation, adds
    with int32 bulk reductions (no fp32 ones) and flags rows with a global OR; the
    reordering converts back."""
    import kept_ptx as kp
    import test_lowering_bsa_bwd_ws as tl

    configs = {name: (fn, (tl.CONFIGS[i],), sw, kw)
               for name, (fn, (i,), sw, kw) in _PTX_CONFIGS.items()}
    out = kp.keep_ptx(tmp_path, "test_lowering_bsa_bwd_ws", configs)
    for name in configs:
        assert kp.lowered_text_of(out, name).count(tl.CALL_TARGET) == 3, name
        bwd = [p for p in kp.ptx_of(out, name).values() if "BsaBwdSm90Ws" in p]
        assert len(bwd) == 1, name
        p = bwd[0]
        assert "bulk_group.add.s32" in p and "bulk_group.add.f32" not in p
        assert "cvt.rni.sat.s32.f32" in p and "red.relaxed.gpu.global.or.b32" in p
        assert "BsaDqFromTiles" in p and "cvt.rn.f32.s32" in p
        assert ".local" not in p


def test_multipliers_do_not_depend_on_the_layout():
    """bshd tensors give the multipliers of the same bhsd ones."""
    from jax_sparse_attn.ffi import bsa as fb

    rng = np.random.default_rng(0)
    q, k, v, do, idx, nums, bs, n_q, n_kv = _case(rng)
    delta = rng.standard_normal((2, 4, 150))
    want = _mult(k, v, do, delta, idx, nums, bs, _cfg(2, 4, 2, 150, 200, 32, 64, 0.2), 3)
    f = lambda x: jnp.asarray(np.swapaxes(x, 1, 2), jnp.float32)  # noqa: E731
    got = fb.dq_fixed_multipliers(f(k), f(v), f(do), jnp.asarray(delta, jnp.float32),
                                  jnp.asarray(idx), jnp.asarray(nums), jnp.asarray(bs),
                                  _cfg(2, 4, 2, 150, 200, 32, 64, 0.2, layout="bshd"), 3)
    np.testing.assert_array_equal(np.asarray(got), want)


def test_detfixed_is_the_default():
    """``deterministic=True`` takes the fixed-point dQ by default at blk 64 and blk 128 (the
    compile key of ``detfixed`` named); ``detorder`` and every option of the ordered path
    take the ordered additions; where the fixed point does not apply (``zerolag``,
    ``persist``, ``dqclaim``) the ordered path runs."""
    from jax_sparse_attn.config import Switches
    from jax_sparse_attn.ffi import bsa as fb

    def key(blk, ws=(), d=128):
        return fb.bwd_config(jnp.bfloat16, d, blk, False, Switches(bsa_bwd_ws=tuple(ws)),
                             deterministic=True)

    for d in (64, 128):
        assert key(64, d=d).dq_fixed and not key(64, d=d).deterministic
        # the same compile key as with detfixed named (what the GPU tests ran)
        assert key(64, d=d) == key(64, ("detfixed",), d)
        assert key(128, d=d).dq_fixed and not key(128, d=d).deterministic
        assert key(128, d=d) == key(128, ("detfixed",), d)
        assert key(128, d=d) == key(128, ("detfixed", "dqlag"), d)
    for ws in (("detorder",), ("detsched",), ("detkv",), ("relaxpoll",), ("detstream",),
               ("nodetstream",), ("detzero",), ("ordfast",), ("dqslots=2",), ("ordscan=8",),
               ("zerolag",), ("dqclaim",)):
        for blk in (64, 128):
            k = key(blk, ws)
            assert k.deterministic and not k.dq_fixed, (ws, blk)
    assert not key(128, ("detfixed", "persist")).dq_fixed
    # options of the default mode keep the fixed point
    assert key(64, ("l2hint",)).dq_fixed and key(64, ("hlpt",)).dq_fixed


def _fadd_bits(y):
    """The float32 model of ``kernels.common.fixed_bits_f32_fadd`` (numpy float32 arithmetic
    rounds to nearest even, as ``add.rn.f32``): the int32 it leaves in the register."""
    from jax_sparse_attn.kernels import common

    hi = np.array(common.FIXED_MAGIC_HI, np.uint32).view(np.float32)
    lo = np.array(common.FIXED_MAGIC_LO, np.uint32).view(np.float32)
    y = np.asarray(y, np.float32)
    t = y + hi
    r = y - (t - hi)
    u = r + lo
    c = ((t.view(np.uint32).astype(np.uint64) << 8) + u.view(np.uint32)
         - common.FIXED_MAGIC_BIAS) % (1 << 32)
    return c.astype(np.uint32).view(np.int32)


def test_fadd_conversion_is_round_to_nearest_even():
    """``fixemu=N``'s conversion (``kernels.common.fixed_bits_f32_fadd``) gives the int32 of
    ``cvt.rni`` (round to nearest, ties to even) for every ``|y| <= 2^30``: random values
    over every binade of both signs, the ties ``k + 1/2`` and ``256 k + 128``, the edges
    ``+-2^30``, ``+-2^23``, ``+-2^7``, zeros and subnormals. Beyond ``2^30`` (rows the kernel
    flags) it differs, so the model can tell the two apart."""
    pytest.importorskip("cutlass")
    rng = np.random.default_rng(7)
    mag = np.exp2(rng.uniform(-30, 30, 200_000)).astype(np.float32)
    y = np.concatenate([
        mag * rng.choice([-1, 1], mag.size).astype(np.float32),
        np.arange(-4096, 4096, dtype=np.float32) + np.float32(0.5),
        (np.arange(-2**12, 2**12, dtype=np.float32) * 256 + 128),
        np.array([2**30, -2**30, 2**23, -2**23, 2**7, -2**7, 2**30 - 64, -(2**30 - 64), 0.0,
                  -0.0, 1e-40, -1e-40, 0.49999997, -0.49999997, 1.5, -2.5], np.float32)])
    y = y[np.abs(y) <= 2**30]
    want = np.rint(y.astype(np.float64)).astype(np.int64)
    got = _fadd_bits(y).astype(np.int64)
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, [(float(y[i]), int(got[i]), int(want[i])) for i in bad[:5]]
    # past the limit the result wraps (the kernel flags such rows), unlike cvt.rni.sat
    assert _fadd_bits(np.float32(2**31))[()] != np.iinfo(np.int32).max


@pytest.mark.parametrize("d", [32, 128, 256])
@pytest.mark.parametrize("one_pass", [False, True], ids=["two_pass", "mult1p"])
def test_fixed_rows_log2_bounds_the_norm(one_pass, d):
    """``fixed_rows_log2``: the Euclidean norm's log2 bound is an upper bound of the finite
    values' norm (float64) and within half a bit plus the fallback's ``log2(sqrt(D))`` of it,
    for unit rows, rows whose squares overflow or fall below float32's normal range, mixed
    magnitudes (up to 2^127) and non-finite values; -inf for rows of zeros or only
    non-finite values; the max form is the largest finite value's log2."""
    from jax_sparse_attn.ffi import bsa as fb

    rng = np.random.default_rng(3)
    rows = [rng.standard_normal(d),
            np.full(d, 2.0**127),  # the largest value's reciprocal below the normal range
            np.full(d, 2.0**-126),
            rng.standard_normal(d) * 1e30,  # squares overflow float32
            rng.standard_normal(d) * 1e-25,  # squares below the normal range
            np.concatenate([[3e38], rng.standard_normal(d - 1)]),
            np.concatenate([[1e-20], np.zeros(d - 1)]),
            np.where(rng.random(d) < 0.1, np.inf, rng.standard_normal(d)),
            np.where(rng.random(d) < 0.1, np.nan, rng.standard_normal(d) * 1e3),
            np.zeros(d), np.full(d, np.nan)]
    x = np.stack(rows).astype(np.float32)
    fin = np.where(np.isfinite(x), np.abs(x).astype(np.float64), 0.0)
    got = np.asarray(fb.fixed_rows_log2(jnp.asarray(x), True, one_pass), np.float64)
    mx = np.asarray(fb.fixed_rows_log2(jnp.asarray(x), False, one_pass), np.float64)
    norm = np.sqrt((fin ** 2).sum(-1))
    for i in range(len(rows)):
        if norm[i] == 0:
            assert got[i] == -np.inf and mx[i] == -np.inf, i
            continue
        want = np.log2(norm[i])
        # (float32 rounding of the log2: the multipliers keep a bit of margin for it)
        assert np.isfinite(got[i]) and got[i] >= want - 2e-6 * max(1.0, abs(want)), (
            i, got[i], want)
        assert got[i] <= want + 0.5 * np.log2(d) + 0.5, (i, got[i], want)
        assert abs(mx[i] - np.log2(fin[i].max())) < 1e-5, i
    # ordinary rows: within float32 rounding of the exact norm
    for i in (0, 7, 8):
        assert abs(got[i] - np.log2(norm[i])) < 1e-5, i


def test_mult1p_key():
    """``mult1p`` is the fixed-point backward's default (``bsa_bwd_ws=nomult1p``: the
    two-pass norms); without the fixed point neither flag changes anything; the multipliers
    of both forms agree within one power of two and are equal on ordinary inputs."""
    from jax_sparse_attn.config import Switches
    from jax_sparse_attn.ffi import bsa as fb

    for blk in (64, 128):
        base = fb.bwd_config(jnp.bfloat16, 128, blk, False, Switches(), deterministic=True)
        one = fb.bwd_config(jnp.bfloat16, 128, blk, False, Switches(bsa_bwd_ws=("mult1p",)),
                            deterministic=True)
        two = fb.bwd_config(jnp.bfloat16, 128, blk, False,
                            Switches(bsa_bwd_ws=("nomult1p",)), deterministic=True)
        assert base.dq_fixed and base.fix_mult_one_pass and one == base
        assert two == fb.dataclasses.replace(base, fix_mult_one_pass=False)
        for flag in ("mult1p", "nomult1p"):
            nd = fb.bwd_config(jnp.bfloat16, 128, blk, False, Switches(bsa_bwd_ws=(flag,)))
            assert nd == fb.bwd_config(jnp.bfloat16, 128, blk, False, Switches())
    rng = np.random.default_rng(5)
    q, k, v, do, idx, nums, bs, n_q, n_kv = _case(rng)
    delta = rng.standard_normal((2, 4, 150))
    cfg = _cfg(2, 4, 2, 150, 200, 32, 64, 0.2)
    two = _mult(k, v, do, delta, idx, nums, bs, cfg, 3)
    cfg.bwd = types.SimpleNamespace(fix_mult_one_pass=True)
    one = _mult(k, v, do, delta, idx, nums, bs, cfg, 3)
    assert np.abs(np.log2(one[..., 0]) - np.log2(two[..., 0])).max() <= 1
    assert (one == two).mean() > 0.99
