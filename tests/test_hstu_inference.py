"""HSTU inference features on the reference backend vs the float64 oracle (CPU): grouped KV
heads (GQA/MQA, forward and backward), paged KV with shuffled page ids and NaN in unused page
slots, one query per sequence; argument validation and the kernel routing of these calls."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_sparse_attn as jsa
from jax_sparse_attn import config as jsa_config
from oracle import hstu_oracle, hstu_oracle_vjp, x64

PAGE = 128


def gqa_case(lengths_q, lengths_k, *, H, H_kv, D=8, seed=0):
    rng = np.random.default_rng(seed)
    cu_q = np.concatenate([[0], np.cumsum(lengths_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lengths_k)]).astype(np.int32)
    q = rng.standard_normal((int(cu_q[-1]), H, D))
    k = rng.standard_normal((int(cu_k[-1]), H_kv, D))
    v = rng.standard_normal((int(cu_k[-1]), H_kv, D))
    do = rng.standard_normal((int(cu_q[-1]), H, D))
    return q, k, v, do, cu_q, cu_k


@pytest.mark.parametrize("window_size", [(-1, 0), (-1, -1), (3, 2)])
@pytest.mark.parametrize("ratio", [1, 2, 4])
def test_gqa_forward_backward_match_oracle(ratio, window_size):
    H = 4
    lq, lk = [5, 0, 17, 1], [7, 3, 17, 9]
    q, k, v, do, cu_q, cu_k = gqa_case(lq, lk, H=H, H_kv=H // ratio, seed=ratio)
    opts = dict(max_seqlen_q=max(lq), max_seqlen_k=max(lk), window_size=window_size, alpha=0.6)
    with x64():
        args = [jnp.asarray(x) for x in (q, k, v)]
        cu = (jnp.asarray(cu_q), jnp.asarray(cu_k))

        def f(q_, k_, v_):
            return jsa.hstu_attention(q_, k_, v_, *cu, backend="reference", **opts)

        out, vjp = jax.vjp(f, *args)
        dq, dk, dv = vjp(jnp.asarray(do))
        res = jsa.hstu_attention_backward(jnp.asarray(do), *args, *cu, backend="reference",
                                          **opts)
    want = hstu_oracle_vjp(q, k, v, do, cu_q, cu_k, max_seqlen_q=max(lq),
                           window_size=window_size, alpha=0.6)
    assert np.abs(want[2]).max() > 0
    for got, ref in zip((out, dq, dk, dv), want):
        assert got.shape == ref.shape
        np.testing.assert_allclose(np.asarray(got), ref, rtol=1e-9, atol=1e-11)
    for got, ref in zip((res["dq_tensor"], res["dk_tensor"], res["dv_tensor"]), want[1:]):
        np.testing.assert_allclose(np.asarray(got), ref, rtol=1e-9, atol=1e-11)


def test_gqa_equals_repeated_kv_heads():
    """GQA = the MHA call with each KV head repeated over its group; dk/dv = the group sums."""
    q, k, v, do, cu_q, cu_k = gqa_case([9, 4], [12, 4], H=6, H_kv=2, seed=3)
    opts = dict(max_seqlen_q=9, max_seqlen_k=12, backend="reference")
    with x64():
        cu = (jnp.asarray(cu_q), jnp.asarray(cu_k))
        f = lambda q_, k_, v_: jsa.hstu_attention(q_, k_, v_, *cu, **opts)  # noqa: E731
        out, vjp = jax.vjp(f, *(jnp.asarray(x) for x in (q, k, v)))
        kr, vr = np.repeat(k, 3, axis=1), np.repeat(v, 3, axis=1)
        out_r, vjp_r = jax.vjp(f, *(jnp.asarray(x) for x in (q, kr, vr)))
        g, g_r = vjp(jnp.asarray(do)), vjp_r(jnp.asarray(do))
    np.testing.assert_allclose(np.asarray(out), np.asarray(out_r), rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(np.asarray(g[0]), np.asarray(g_r[0]), rtol=1e-12, atol=1e-13)
    for i in (1, 2):
        summed = np.asarray(g_r[i]).reshape(g_r[i].shape[0], 2, 3, -1).sum(2)
        np.testing.assert_allclose(np.asarray(g[i]), summed, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("h_rab", [1, 6])
def test_gqa_with_rab_equals_repeated_kv_heads(h_rab):
    """GQA with a relative attention bias = the MHA call with each KV head repeated: query
    head h takes bias head h % H_rab in both; dk/dv are the group sums, d rab the same."""
    q, k, v, do, cu_q, cu_k = gqa_case([9, 0, 4], [12, 2, 4], H=6, H_kv=2, seed=4)
    rab = np.random.default_rng(5).standard_normal((3, h_rab, 12, 12))
    opts = dict(max_seqlen_q=9, max_seqlen_k=12, window_size=(-1, 0), backend="reference")
    with x64():
        cu = (jnp.asarray(cu_q), jnp.asarray(cu_k))

        def f(q_, k_, v_, r_):
            return jsa.hstu_attention(q_, k_, v_, *cu, rab=r_, **opts)

        args = [jnp.asarray(x) for x in (q, k, v, rab)]
        out, vjp = jax.vjp(f, *args)
        kr, vr = np.repeat(k, 3, axis=1), np.repeat(v, 3, axis=1)
        out_r, vjp_r = jax.vjp(f, *(jnp.asarray(x) for x in (q, kr, vr, rab)))
        g, g_r = vjp(jnp.asarray(do)), vjp_r(jnp.asarray(do))
    assert np.abs(np.asarray(g[3])).max() > 0
    np.testing.assert_allclose(np.asarray(out), np.asarray(out_r), rtol=1e-12, atol=1e-13)
    for i in (0, 3):
        np.testing.assert_allclose(np.asarray(g[i]), np.asarray(g_r[i]), rtol=1e-12,
                                   atol=1e-13)
    for i in (1, 2):
        summed = np.asarray(g_r[i]).reshape(g_r[i].shape[0], 2, 3, -1).sum(2)
        np.testing.assert_allclose(np.asarray(g[i]), summed, rtol=1e-12, atol=1e-13)


def paged_case(lengths_q, lengths_k, *, H, H_kv, D=8, spare_pages=3, seed=0):
    """A paged cache with the sequences' pages in shuffled order, NaN in every slot past a
    sequence's keys (its last page's tail and the unused pages)."""
    rng = np.random.default_rng(seed)
    n_need = [-(-lk // PAGE) for lk in lengths_k]
    n_pages = sum(n_need) + spare_pages
    perm = rng.permutation(n_pages)
    paged = np.full((n_pages, 2, PAGE, H_kv, D), np.nan)
    page_ids, ptr = [], [0]
    keys, vals = [], []
    for b, lk in enumerate(lengths_k):
        ids = perm[ptr[-1]:ptr[-1] + n_need[b]]
        kb = rng.standard_normal((lk, H_kv, D))
        vb = rng.standard_normal((lk, H_kv, D))
        for j in range(lk):
            paged[ids[j // PAGE], 0, j % PAGE] = kb[j]
            paged[ids[j // PAGE], 1, j % PAGE] = vb[j]
        page_ids.extend(int(i) for i in ids)
        ptr.append(ptr[-1] + n_need[b])
        keys.append(kb)
        vals.append(vb)
    cu_q = np.concatenate([[0], np.cumsum(lengths_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lengths_k)]).astype(np.int32)
    q = rng.standard_normal((int(cu_q[-1]), H, D))
    return (q, paged, np.asarray(page_ids, np.int32), np.asarray(ptr, np.int32), cu_q, cu_k,
            np.concatenate(keys), np.concatenate(vals))


@pytest.mark.parametrize("ratio", [1, 2, 4])
@pytest.mark.parametrize("lengths_q,lengths_k", [
    ([1, 1, 1, 1], [1, 300, 129, 256]),  # one query (target) per sequence
    ([3, 0, 7, 64], [130, 0, 7, 400]),   # a few targets, a zero-length sequence
])
def test_paged_kv_matches_oracle(ratio, lengths_q, lengths_k):
    H = 4
    q, paged, ids, ptr, cu_q, cu_k, keys, vals = paged_case(
        lengths_q, lengths_k, H=H, H_kv=H // ratio, seed=ratio + len(lengths_q))
    mq, mk = max(lengths_q), max(lengths_k)
    with x64():
        out = np.asarray(jsa.hstu_attention(
            jnp.asarray(q), None, None, jnp.asarray(cu_q), jnp.asarray(cu_k), max_seqlen_q=mq,
            max_seqlen_k=mk, paged_kv=jnp.asarray(paged), page_ids=jnp.asarray(ids),
            page_indptrs=jnp.asarray(ptr), backend="reference"))
    assert np.isfinite(out).all()
    want = hstu_oracle(q, keys, vals, cu_q, cu_k, max_seqlen_q=mq)
    assert np.abs(want).max() > 0
    np.testing.assert_allclose(out, want, rtol=1e-10, atol=1e-12)
    # the page-walking oracle agrees (same cache, same table)
    want_p = hstu_oracle(q, None, None, cu_q, cu_k, max_seqlen_q=mq, paged_kv=paged,
                         page_ids=ids, page_indptrs=ptr)
    np.testing.assert_allclose(out, want_p, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("cache_mapped", [True, False])
def test_paged_kv_vmap_equals_loop(cache_mapped):
    """``jax.vmap`` of a paged call (mapped queries / page tables, a mapped or a shared
    cache) folds the mapped axis into one call (``_transforms.hstu_fwd_paged``; the kernel's
    cute call has no batching rule) and equals the per-item calls bit for bit, garbage page
    ids included (clamped per item, as the unmapped op does)."""
    items = [paged_case([1, 0, 5], [130, 0, 7], H=2, H_kv=1, seed=s) for s in (11, 12)]
    if not cache_mapped:  # one cache and page table, different queries per item
        items = [items[0][:1] + items[0][1:] for _ in items]
        items[1] = (items[1][0] * 2,) + items[1][1:]
    stack = [jnp.asarray(np.stack([it[i] for it in items]), jnp.float32) if i < 2
             else jnp.asarray(np.stack([it[i] for it in items])) for i in range(6)]
    ids = stack[2].at[1, 0].set(-5).at[0, 2].set(10 ** 6) if cache_mapped else stack[2]
    stack[2] = ids

    def f(q, kv, i, p, a, b):
        return jsa.hstu_attention(q, None, None, a, b, max_seqlen_q=5, max_seqlen_k=130,
                                  paged_kv=kv, page_ids=i, page_indptrs=p, backend="reference")

    axes = (0, 0 if cache_mapped else None, 0, 0, 0, 0)
    args = [x if a == 0 else x[0] for x, a in zip(stack, axes)]
    out = np.asarray(jax.jit(jax.vmap(f, in_axes=axes))(*args))
    for n in range(2):
        one = [x[n] if a == 0 else x for x, a in zip(args, axes)]
        np.testing.assert_array_equal(out[n], np.asarray(jax.jit(f)(*one)))
    # (a garbage id may select a NaN page: unspecified values, the same in both)
    assert np.nanmax(np.abs(out)) > 0 and (cache_mapped or np.isfinite(out).all())


def test_gqa_and_paged_validation_messages():
    q = jnp.zeros((4, 6, 8))
    cu = jnp.asarray([0, 4], jnp.int32)
    with pytest.raises(ValueError, match="H_kv dividing"):
        jsa.hstu_attention(q, jnp.zeros((4, 4, 8)), jnp.zeros((4, 4, 8)), cu, cu,
                           max_seqlen_q=4, max_seqlen_k=4, backend="reference")
    with pytest.raises(ValueError, match="v must have shape"):
        jsa.hstu_attention(q, jnp.zeros((4, 3, 8)), jnp.zeros((4, 2, 8)), cu, cu,
                           max_seqlen_q=4, max_seqlen_k=4, backend="reference")
    with pytest.raises(ValueError, match="H_kv dividing"):
        jsa.hstu_attention(q, None, None, cu, cu, max_seqlen_q=4, max_seqlen_k=4,
                           paged_kv=jnp.zeros((2, 2, PAGE, 4, 8)),
                           page_ids=jnp.zeros((1,), jnp.int32),
                           page_indptrs=jnp.asarray([0, 1], jnp.int32), backend="reference")


def test_paged_and_validate_accept_python_lists():
    """Python lists for the metadata (as for ``cu_seqlens`` in the op) are accepted by the
    op for the page table and by ``validate_hstu_inputs`` for every metadata argument
    (before, both raised TypeError for a list), and validated the same way."""
    q, paged, ids, ptr, cu_q, cu_k, _, _ = paged_case([1, 2], [130, 5], H=2, H_kv=1, seed=9)
    lists = [x.tolist() for x in (ids, ptr, cu_q, cu_k)]
    kw = dict(max_seqlen_q=2, max_seqlen_k=130, paged_kv=jnp.asarray(paged, jnp.float32))
    qf = jnp.asarray(q, jnp.float32)
    want = jsa.hstu_attention(qf, None, None, jnp.asarray(cu_q), jnp.asarray(cu_k),
                              page_ids=jnp.asarray(ids), page_indptrs=jnp.asarray(ptr),
                              backend="reference", **kw)
    got = jsa.hstu_attention(qf, None, None, lists[2], lists[3], page_ids=lists[0],
                             page_indptrs=lists[1], backend="reference", **kw)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    jsa.validate_hstu_inputs(qf, None, None, lists[2], lists[3], page_ids=lists[0],
                             page_indptrs=lists[1], **kw)
    jsa.validate_hstu_inputs(qf, qf, qf, [0, 3], (0, 3), max_seqlen_q=3, max_seqlen_k=3)
    with pytest.raises(ValueError, match=r"page_ids\[0\]=99 is outside"):
        jsa.validate_hstu_inputs(qf, None, None, lists[2], lists[3], page_ids=[99] + lists[0][1:],
                                 page_indptrs=lists[1], **kw)


def test_gqa_kernel_routing_names_the_option():
    """GQA needs the sm90ws forward and the sm90 backward (with rab: at D = D_v in {64, 128});
    the portable sm80 kernels decline it with a reason naming the switch (backend='kernel'
    raises it, 'auto' falls back)."""
    from jax_sparse_attn.ffi import hstu as ffi_hstu

    sw = jsa_config.Switches()
    assert ffi_hstu.gqa_unsupported_reason(128, 128, False, sw) is None
    reason = ffi_hstu.gqa_unsupported_reason(128, 128, False,
                                             jsa_config.Switches(hstu_fwd_impl="sm80"))
    assert reason and "hstu_fwd_impl" in reason
    reason = ffi_hstu.gqa_unsupported_reason(128, 128, False,
                                             jsa_config.Switches(hstu_bwd_impl="sm80"))
    assert reason and "hstu_bwd_impl" in reason
    # with a relative attention bias: the sm90 backward takes it at D = D_v in {64, 128}
    assert ffi_hstu.gqa_unsupported_reason(128, 128, True, sw) is None
    assert "relative attention bias" in ffi_hstu.gqa_unsupported_reason(256, 256, True, sw)
    assert "rabsm80" in ffi_hstu.gqa_unsupported_reason(
        64, 64, True, jsa_config.Switches(hstu_bwd_ws="rabsm80"))
    assert ffi_hstu.gqa_unsupported_reason(256, 256, False, sw) is None  # sm90 at D = 256
    reason = ffi_hstu.gqa_unsupported_reason(32, 32, False, sw)
    assert reason and "32" in reason and "(64, 128, 256)" in reason


def test_kv_splits_validation_and_reference_ignores_it():
    q, k, v, _, cu_q, cu_k = gqa_case([5, 3], [9, 4], H=2, H_kv=2, seed=5)
    args = [jnp.asarray(x, jnp.float32) for x in (q, k, v)] + [jnp.asarray(cu_q),
                                                               jnp.asarray(cu_k)]
    kw = dict(max_seqlen_q=5, max_seqlen_k=9, backend="reference")
    for bad, err in ((0, ValueError), (17, ValueError), ("many", ValueError), (2.0, TypeError),
                     (True, TypeError)):
        with pytest.raises(err, match="kv_splits"):
            jsa.hstu_attention(*args, kv_splits=bad, **kw)
    base = np.asarray(jsa.hstu_attention(*args, **kw))
    np.testing.assert_array_equal(np.asarray(jsa.hstu_attention(*args, kv_splits=3, **kw)), base)


def test_resolve_kv_splits():
    from jax_sparse_attn.ffi import hstu as ffi_hstu

    r = ffi_hstu.resolve_kv_splits
    from jax_sparse_attn import metadata

    sms = metadata.num_sms()
    # one query per sequence: B * H work items; split while they fill less than one wave
    assert r("auto", batch=8, num_heads=4, max_seqlen_q=1, max_seqlen_k=8192) == sms // 32
    assert r("auto", batch=64, num_heads=4, max_seqlen_q=1, max_seqlen_k=8192) == 1
    assert r("auto", batch=1, num_heads=1, max_seqlen_q=64, max_seqlen_k=16384) == min(16, sms)
    assert r("auto", batch=8, num_heads=4, max_seqlen_q=1, max_seqlen_k=1000) == 1  # short
    assert r("auto", batch=2, num_heads=2, max_seqlen_q=4096, max_seqlen_k=4096) == sms // 128
    assert r(5, batch=64, num_heads=4, max_seqlen_q=1, max_seqlen_k=64) == 5
    assert r(5, batch=1, num_heads=1, max_seqlen_q=1, max_seqlen_k=8192, impl="sm80") == 1


# --------------------------------------------------------------- GPU: paged-KV forward kernel
def _paged_gpu_inputs(lens_q, lens_k, heads, h_kv, d, seed, extra_slots=2, spare_pages=3,
                      dtype=jnp.bfloat16, spare_fill=(np.nan,)):
    """Paged cache (``dtype``, default bf16): each sequence's pages shuffled over the cache,
    NaN in every slot past a sequence's keys, the spare pages filled with ``spare_fill``
    (cycled: NaN by default), ``extra_slots`` garbage page ids (negative, huge, a spare
    page) after each sequence's pages; q rows past ``cu_seqlens_q[-1]`` NaN."""
    rng = np.random.default_rng(seed)
    need = [-(-lk // PAGE) for lk in lens_k]
    n_pages = sum(need) + spare_pages
    perm = rng.permutation(n_pages)
    kv = np.full((n_pages, 2, PAGE, h_kv, d), np.nan, np.float32)
    ids, ptr, used = [], [0], 0
    for b, lk in enumerate(lens_k):
        mine = perm[used:used + need[b]]
        used += need[b]
        vals = rng.standard_normal((2, lk, h_kv, d)).astype(np.float32)
        for j in range(0, lk, PAGE):
            kv[mine[j // PAGE], :, :min(PAGE, lk - j)] = vals[:, j:j + PAGE]
        garbage = rng.choice([-7, 2 ** 30, int(perm[-1])], size=extra_slots)
        ids.extend([int(x) for x in mine] + [int(x) for x in garbage])
        ptr.append(len(ids))
    cu_q = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int32)
    q = rng.standard_normal((int(cu_q[-1]) + 64, heads, d)).astype(np.float32)
    q[int(cu_q[-1]):] = np.nan
    for i, page in enumerate(perm[used:]):
        kv[page] = spare_fill[i % len(spare_fill)]
    bf = lambda x: jnp.asarray(x, dtype)  # noqa: E731
    return (bf(q), bf(kv), jnp.asarray(np.asarray(ids, np.int32)),
            jnp.asarray(np.asarray(ptr, np.int32)), jnp.asarray(cu_q), jnp.asarray(cu_k))


def _paged_kernel_fn(schedule, kv_splits, ws=(), **kw):
    from jax_sparse_attn.config import Switches

    sw = Switches(hstu_schedule=schedule, hstu_fwd_ws=ws)
    return jax.jit(lambda q, kv, i, p, a, b: jsa.hstu_attention(
        q, None, None, a, b, paged_kv=kv, page_ids=i, page_indptrs=p, backend="kernel",
        kv_splits=kv_splits, switches=sw, **kw))


@pytest.mark.gpu
@pytest.mark.parametrize("kv_splits", [1, "auto"])
@pytest.mark.parametrize("lq", [1, 7, 64, 300])
def test_paged_kernel_gpu_schedule_kernel_and_xla(lq, kv_splits):
    """Paged-KV forward on the H200 with its metadata built by the schedule kernel (page ids
    clamped by the forward kernel, the default), by XLA (``hstu_schedule="xla"``), with
    the producer's page-id prefetch (``hstu_fwd_ws="pagepf"``) and with O staged in a single
    Q buffer for 3 K/V stages (``"qalias"``): bitwise equal outputs, all within the rule of
    the float32 reference; garbage page ids
    after each sequence's pages, NaN in every unused cache slot, a sequence without queries,
    histories ending inside a page, q rows past ``cu_seqlens_q[-1]`` NaN (their outputs must
    be 0). Before the checked calls the same functions run on all-NaN inputs, so output
    buffers XLA reuses hold NaN where a kernel would leave elements unwritten."""
    from attention_base import _f32, check_rule
    from jax_sparse_attn import reference

    lens_k = [3000, 129, 1, 700, 2048, 301]
    lens_q = [min(lq, lk) for lk in lens_k]
    lens_q[3] = 0
    q, kv, ids, ptr, cu_q, cu_k = _paged_gpu_inputs(lens_q, lens_k, 4, 2, 128, seed=lq)
    n = int(cu_q[-1])
    kw = dict(max_seqlen_q=max(lens_q), max_seqlen_k=max(lens_k),
              scaling_seqlen=float(max(lens_q)), alpha=1.0 / np.sqrt(128))
    outs = {}
    for sched, ws in (("kernel", ()), ("xla", ()), ("kernel", ("pagepf",)),
                      ("kernel", ("qalias",))):
        fn = _paged_kernel_fn(sched, kv_splits, ws, **kw)
        jax.block_until_ready(fn(jnp.full_like(q, jnp.nan), jnp.full_like(kv, jnp.nan), ids,
                                 ptr, cu_q, cu_k))  # poison the buffers XLA may reuse
        outs[(sched, ws)] = np.asarray(_f32(fn(q, kv, ids, ptr, cu_q, cu_k)))
    out = outs[("kernel", ())]
    for variant, o in outs.items():
        np.testing.assert_array_equal(o, out, err_msg=str(variant))
    assert not np.any(out[n:]), "out rows past cu_seqlens_q[-1] are not zero"

    def ref(cdt):
        return jax.jit(lambda q, kv, i, p, a, b: reference.hstu_attention_ref(
            q, None, None, a, b, None, paged_kv=kv, page_ids=i, page_indptrs=p,
            compute_dtype=cdt, **kw))(q[:n], kv, ids, ptr, cu_q, cu_k)

    report = []
    check_rule("out", out[:n], ref(None), ref(jnp.bfloat16), 2.0, 2e-3, report)
    print(f"paged lq={lq} kv_splits={kv_splits} " + report[0])


_PAGED_META = {
    # cu_seqlens_q, cu_seqlens_k, page_indptrs, T_q, page slots
    "valid": ([0, 7, 8, 40], [0, 300, 556, 900], [0, 3, 5, 8], 40, 12),
    "ptr-negative": ([0, 7, 8, 40], [0, 300, 556, 900], [0, -4, 5, 8], 40, 12),
    "ptr-decreasing": ([0, 7, 8, 40], [0, 300, 556, 900], [0, 6, 2, 8], 40, 12),
    "ptr-past-P": ([0, 7, 8, 40], [0, 2000, 1 << 30, -3], [0, 3, 50, 1 << 30], 40, 12),
    "cu-garbage": ([5, 900, -3, 400], [7, -1, 3000, 20], [9, 2, 2, 1], 300, 30),
    "many-seqs": (list(np.cumsum([0] + [1] * 1000)), list(np.cumsum([0] + [300] * 1000)),
                  list(np.arange(1001) * 3), 1000, 3000),
}


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(_PAGED_META))
def test_paged_schedule_kernel_metadata_gpu(name):
    """The schedule kernel's paged mode gives the sanitised ``cu_seqlens_q`` / ``_k`` and
    ``page_indptrs`` of the jnp path bit for bit (garbage values included) and the same
    query tiles, longest work first, idle rows last."""
    from types import SimpleNamespace

    from jax_sparse_attn.ffi.hstu import _paged_metadata

    cu_q, cu_k, ptr, t_q, slots = _PAGED_META[name]
    args = [jnp.asarray(x, jnp.int32) for x in (cu_q, cu_k, ptr)]
    got = {}
    for sched in ("kernel", "xla"):
        cfg = SimpleNamespace(fwd=SimpleNamespace(block_m=128, pdl=True), schedule=sched,
                              window_size=(-1, 0), cute_call="shared")
        got[sched] = [np.asarray(x) for x in jax.jit(
            lambda a, b, c, cfg=cfg: _paged_metadata(a, b, c, cfg, t_q, slots, PAGE))(*args)]
    for i, what in enumerate(("cu_q", "cu_k", "page_indptrs")):
        np.testing.assert_array_equal(got["kernel"][i], got["xla"][i], err_msg=what)
    tiles, rtiles = got["kernel"][3], got["xla"][3]
    assert tiles.shape == rtiles.shape
    valid = tiles[:, 0] >= 0
    assert not (valid[1:] & ~valid[:-1]).any(), "idle rows last"
    key = lambda tt: sorted(map(tuple, tt[tt[:, 0] >= 0][:, :2].tolist()))  # noqa: E731
    assert key(tiles) == key(rtiles)
    assert (np.diff(_causal_work(tiles, got["kernel"][0], got["kernel"][1])) <= 0).all(), (
        "longest work first")


def _causal_work(tiles, cu_q, cu_k, bm=128):
    """Work (64-key units + 1) of each valid causal forward schedule row: the keys its rows
    see (bottom-right aligned)."""
    work = []
    for b, m in tiles[tiles[:, 0] >= 0][:, :2]:
        lq, lk = cu_q[b + 1] - cu_q[b], cu_k[b + 1] - cu_k[b]
        hi = min(min(m * bm + bm, lq) + lk - lq, lk)
        work.append(max(hi, 0) // 64 + 1)
    return np.asarray(work)


@pytest.mark.gpu
def test_paged_kernel_gpu_beyond_schedule_kernel_limits():
    """More sequences than the schedule kernel takes (``MAX_SEQS``): the jnp metadata path
    with the forward's own page-id clamp (the default key) gives the outputs of
    ``hstu_schedule="xla"`` (XLA clips the ids) bit for bit, within the reference's rule."""
    from attention_base import _f32, check_rule
    from jax_sparse_attn import reference
    from jax_sparse_attn.kernels.hstu_schedule import MAX_SEQS

    b = MAX_SEQS + 10
    lens_k = [1 + (i * 37) % 200 for i in range(b)]
    lens_q = [1] * b
    q, kv, ids, ptr, cu_q, cu_k = _paged_gpu_inputs(lens_q, lens_k, 4, 2, 128, seed=5,
                                                    extra_slots=1, spare_pages=1)
    n = int(cu_q[-1])
    kw = dict(max_seqlen_q=1, max_seqlen_k=max(lens_k), alpha=0.125)
    outs = [np.asarray(_f32(_paged_kernel_fn(s, 1, **kw)(q, kv, ids, ptr, cu_q, cu_k)))
            for s in ("kernel", "xla")]
    np.testing.assert_array_equal(outs[0], outs[1])
    assert not np.any(outs[0][n:])

    def ref(cdt):
        return jax.jit(lambda q, kv, i, p, a, c: reference.hstu_attention_ref(
            q, None, None, a, c, None, paged_kv=kv, page_ids=i, page_indptrs=p,
            compute_dtype=cdt, **kw))(q[:n], kv, ids, ptr, cu_q, cu_k)

    report = []
    check_rule("out", outs[0][:n], ref(None), ref(jnp.bfloat16), 2.0, 2e-3, report)
    print(f"paged B={b} " + report[0])


@pytest.mark.gpu
@pytest.mark.parametrize("lens_q,window,kv_splits", [
    ([1, 0, 17, 113, 1023, 4097, 300, 129], (-1, 0), 1),
    ([1, 0, 17, 113, 1023, 4097, 300, 129], (40, 3), 1),
    ([1] * 6, (-1, 0), "auto"),
], ids=["mixed-causal", "mixed-local", "one-query-split"])
def test_contiguous_q_alias_gpu(lens_q, window, kv_splits):
    """``hstu_fwd_ws="qalias"`` (one Q buffer that O is staged in, 3 K/V stages at D = 128)
    gives the default sm90ws forward's outputs bit for bit (same tiles, same summation
    order), GQA 4 -> 2 heads, histories longer than the queries, NaN rows past the last
    sequence (zeros out), buffers poisoned by an all-NaN call first."""
    from attention_base import _f32
    from jax_sparse_attn.config import Switches

    lens_k = [max(lq, 2000 + 331 * i) for i, lq in enumerate(lens_q)]
    cu_q = jnp.asarray(np.concatenate([[0], np.cumsum(lens_q)]), jnp.int32)
    cu_k = jnp.asarray(np.concatenate([[0], np.cumsum(lens_k)]), jnp.int32)
    n_q, n_k = int(cu_q[-1]), int(cu_k[-1])
    ks = jax.random.split(jax.random.PRNGKey(7), 3)
    q = jax.random.normal(ks[0], (n_q + 64, 4, 128), jnp.float32).astype(jnp.bfloat16)
    q = q.at[n_q:].set(jnp.nan)
    k, v = (jax.random.normal(kk, (n_k + 64, 2, 128), jnp.float32).astype(jnp.bfloat16)
            for kk in ks[1:])
    k, v = (x.at[n_k:].set(jnp.nan) for x in (k, v))
    outs = []
    for ws in ((), ("qalias",)):
        fn = jax.jit(lambda q, k, v, a, b, ws=ws: jsa.hstu_attention(
            q, k, v, a, b, max_seqlen_q=max(lens_q), max_seqlen_k=max(lens_k),
            window_size=window, alpha=0.1, backend="kernel", kv_splits=kv_splits,
            switches=Switches(hstu_fwd_ws=ws)))
        jax.block_until_ready(fn(jnp.full_like(q, jnp.nan), jnp.full_like(k, jnp.nan),
                                 jnp.full_like(v, jnp.nan), cu_q, cu_k))
        outs.append(np.asarray(_f32(fn(q, k, v, cu_q, cu_k))))
    assert np.isfinite(outs[0]).all() and np.abs(outs[0][:n_q]).max() > 0
    np.testing.assert_array_equal(outs[1], outs[0])
    assert not np.any(outs[0][n_q:])
