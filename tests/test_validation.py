"""Eager value validators: every documented bad value raises ValueError naming its position."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_sparse_attn as jsa
from jax_sparse_attn import validate_bsa_metadata, validate_hstu_inputs


def hstu_args(T=10, H=2, D=4, cu=(0, 3, 3, 10)):
    z = jnp.zeros((T, H, D), jnp.bfloat16)
    cu = jnp.asarray(cu, jnp.int32)
    return z, z, z, cu, cu


def test_hstu_valid_inputs_pass():
    q, k, v, cu, _ = hstu_args()
    validate_hstu_inputs(q, k, v, cu, cu, max_seqlen_q=7, max_seqlen_k=7)
    func = jnp.zeros((1, 3, 10 + 256), jnp.int32).at[0, 0, :10].set(7)
    validate_hstu_inputs(q, k, v, cu, cu, max_seqlen_q=7, max_seqlen_k=7, window_size=(-1, -1), func=func)


def test_hstu_validator_takes_every_keyword_option_of_the_op():
    """validate_hstu_inputs says "same arguments as the op", but the op's backend,
    switches, debug_checks, deterministic and kv_splits raised TypeError (unexpected
    keyword), so validating with the op's own **options failed. They are accepted and
    checked like the op checks them."""
    q, k, v, cu, _ = hstu_args()
    opts = dict(max_seqlen_q=7, max_seqlen_k=7, backend="reference", switches=None,
                debug_checks=True, deterministic=True, kv_splits=4)
    validate_hstu_inputs(q, k, v, cu, cu, **opts)
    jsa.hstu_attention(q, k, v, cu, cu, **opts)
    for name, bad, exc in [("backend", "cuda", ValueError), ("switches", {}, TypeError),
                           ("debug_checks", 1, TypeError), ("deterministic", "yes", TypeError),
                           ("kv_splits", 0, ValueError)]:
        with pytest.raises(exc, match=name):
            validate_hstu_inputs(q, k, v, cu, cu, **dict(opts, **{name: bad}))
        with pytest.raises(exc, match=name):
            jsa.hstu_attention(q, k, v, cu, cu, **dict(opts, **{name: bad}))


@pytest.mark.parametrize("cu,match", [
    ((1, 3, 3, 10), r"cu_seqlens_q\[0\] must be 0"),
    ((0, 5, 3, 10), r"non-decreasing: cu_seqlens_q\[2\]=3 < cu_seqlens_q\[1\]=5"),
    ((0, 3, 3, 11), r"cu_seqlens_q\[-1\]=11 exceeds the number of tokens 10"),
])
def test_hstu_bad_cu_seqlens(cu, match):
    q, k, v, good, _ = hstu_args()
    bad = jnp.asarray(cu, jnp.int32)
    with pytest.raises(ValueError, match=match):
        validate_hstu_inputs(q, k, v, bad, good, max_seqlen_q=8, max_seqlen_k=8)
    # the op runs the same check eagerly on concrete metadata
    with pytest.raises(ValueError, match=match):
        jsa.hstu_attention(q, k, v, bad, good, max_seqlen_q=8, max_seqlen_k=8)


def test_hstu_bad_cu_seqlens_k_and_max_seqlen():
    q, k, v, cu, _ = hstu_args()
    with pytest.raises(ValueError, match=r"cu_seqlens_k\[0\] must be 0"):
        validate_hstu_inputs(q, k, v, cu, jnp.asarray([2, 3, 3, 10]), max_seqlen_q=7, max_seqlen_k=7)
    with pytest.raises(ValueError, match=r"max_seqlen_q=6 is smaller than sequence 2's length 7"):
        validate_hstu_inputs(q, k, v, cu, cu, max_seqlen_q=6, max_seqlen_k=7)
    with pytest.raises(ValueError, match=r"max_seqlen_k=5 is smaller than sequence 2's length 7"):
        validate_hstu_inputs(q, k, v, cu, cu, max_seqlen_q=7, max_seqlen_k=5)
    # the first sequence over the bound is named, not the longest
    q, k, v, cu, _ = hstu_args(cu=(0, 4, 10))
    with pytest.raises(ValueError, match=r"max_seqlen_q=3 is smaller than sequence 0's length 4"):
        validate_hstu_inputs(q, k, v, cu, cu, max_seqlen_q=3, max_seqlen_k=6)


def test_hstu_bad_func_endpoints():
    q, k, v, cu, _ = hstu_args()
    func = np.zeros((1, 3, 266), np.int32)
    func[0, 2, 4] = 8  # > max_seqlen_k = 7
    with pytest.raises(ValueError, match=r"func\[0, 2, 4\]=8 is outside \[0, max_seqlen_k=7\]"):
        validate_hstu_inputs(q, k, v, cu, cu, max_seqlen_q=7, max_seqlen_k=7, window_size=(-1, -1),
                             func=jnp.asarray(func))
    func[0, 2, 4] = 0
    func[0, 1, 9] = -1
    with pytest.raises(ValueError, match=r"func\[0, 1, 9\]=-1"):
        validate_hstu_inputs(q, k, v, cu, cu, max_seqlen_q=7, max_seqlen_k=7, window_size=(-1, -1),
                             func=jnp.asarray(func))
    func[0, 1, 9] = 0
    func[0, 1, 200] = -5  # rows past the last sequence are not read
    validate_hstu_inputs(q, k, v, cu, cu, max_seqlen_q=7, max_seqlen_k=7, window_size=(-1, -1),
                         func=jnp.asarray(func))


def _paged(ptr=(0, 1, 1, 3), ids=(2, 0, 1), n_pages=3, cu_k=(0, 100, 100, 250)):
    q = jnp.zeros((6, 2, 4), jnp.float16)
    cu_q = jnp.asarray([0, 2, 2, 6], jnp.int32)
    pkv = jnp.zeros((n_pages, 2, 128, 2, 4), jnp.float16)
    return (q, None, None, cu_q, jnp.asarray(cu_k, jnp.int32)), dict(
        max_seqlen_q=4, max_seqlen_k=150, paged_kv=pkv, page_ids=jnp.asarray(ids, jnp.int32),
        page_indptrs=jnp.asarray(ptr, jnp.int32))


def test_paged_valid_values_pass():
    args, kw = _paged()
    validate_hstu_inputs(*args, **kw)


@pytest.mark.parametrize("bad,match", [
    (dict(ptr=(1, 1, 1, 3)), r"page_indptrs\[0\] must be 0"),
    (dict(ptr=(0, 2, 1, 3)), r"page_indptrs must be non-decreasing: page_indptrs\[2\]=1 < page_indptrs\[1\]=2"),
    (dict(ptr=(0, 1, 1, 4)), r"page_indptrs\[-1\]=4 exceeds len\(page_ids\)=3"),
    (dict(ptr=(0, 1, 1, 2)), r"sequence 2 has 150 keys and needs 2 pages"),
    (dict(ids=(2, 0, 3)), r"page_ids\[2\]=3 is outside \[0, num_pages=3\)"),
])
def test_paged_bad_values(bad, match):
    args, kw = _paged(**bad)
    with pytest.raises(ValueError, match=match):
        validate_hstu_inputs(*args, **kw)


# ----------------------------------------------------------------------------- BSA


def bsa_shapes(B=1, Hq=2, Hkv=1, Sq=130, Skv=200, D=8):
    s = jax.ShapeDtypeStruct
    return (s((B, Hq, Sq, D), jnp.bfloat16), s((B, Hkv, Skv, D), jnp.bfloat16),
            s((B, Hkv, Skv, D), jnp.bfloat16))


def test_bsa_valid_metadata_passes_and_ignores_past_prefix():
    q, k, v = bsa_shapes()
    idx = np.full((1, 2, 3, 3), 99, np.int32)  # garbage...
    idx[..., 0] = 0
    idx[..., 1] = 3  # ...past a prefix of 2 (N_kv = 4 with blk 64)
    validate_bsa_metadata(q, k, v, idx, block_sparse_num=2, sparse_block_size=64)
    nums = np.ones((1, 2, 3), np.int32)
    validate_bsa_metadata(q, k, v, idx, q2k_block_nums=nums, sparse_block_size=64,
                          block_sizes=np.array([64, 1, 64, 8], np.int32))


def test_bsa_bad_counts():
    q, k, v = bsa_shapes()
    idx = np.zeros((1, 2, 3, 2), np.int32)
    idx[..., 1] = 1
    nums = np.ones((1, 2, 3), np.int32)
    nums[0, 1, 2] = 0
    with pytest.raises(ValueError, match=r"q2k_block_nums\[\(0, 1, 2\)\]=0 is outside \[1, K_max=2\].*allow_empty"):
        validate_bsa_metadata(q, k, v, idx, q2k_block_nums=nums, sparse_block_size=64)
    validate_bsa_metadata(q, k, v, idx, q2k_block_nums=nums, sparse_block_size=64,
                          allow_empty_block_nums=True)
    nums[0, 1, 2] = 3
    with pytest.raises(ValueError, match=r"q2k_block_nums\[\(0, 1, 2\)\]=3 is outside \[0, K_max=2\]"):
        validate_bsa_metadata(q, k, v, idx, q2k_block_nums=nums, sparse_block_size=64,
                              allow_empty_block_nums=True)


def test_bsa_bad_indices_and_duplicates():
    q, k, v = bsa_shapes()
    idx = np.zeros((1, 2, 3, 3), np.int32)
    idx[..., 1] = 1
    idx[..., 2] = 2
    idx[0, 1, 1, 1] = 4  # N_kv = 4 -> out of range
    with pytest.raises(ValueError, match=r"q2k_block_index\[\(0, 1, 1, 1\)\]=4 is outside \[0, N_kv=4\)"):
        validate_bsa_metadata(q, k, v, idx, block_sparse_num=2, sparse_block_size=64)
    idx[0, 1, 1, 1] = -1
    with pytest.raises(ValueError, match=r"=-1 is outside"):
        validate_bsa_metadata(q, k, v, idx, block_sparse_num=3, sparse_block_size=64)
    idx[0, 1, 1, 1] = 1
    idx[0, 0, 2, 2] = 0  # duplicate of entry 0
    with pytest.raises(ValueError, match=r"q2k_block_index\[\(0, 0, 2, 2\)\]=0 repeats a block"):
        validate_bsa_metadata(q, k, v, idx, block_sparse_num=3, sparse_block_size=64)
    validate_bsa_metadata(q, k, v, idx, block_sparse_num=2, sparse_block_size=64)  # past prefix: fine
    # the op checks concrete metadata eagerly too
    z = [jnp.zeros(s.shape, s.dtype) for s in (q, k, v)]
    with pytest.raises(ValueError, match="repeats a block"):
        jsa.block_sparse_attention(*z, jnp.asarray(idx), block_sparse_num=3, sparse_block_size=64)


def test_bsa_bad_block_sizes():
    q, k, v = bsa_shapes()
    idx = np.zeros((1, 2, 3, 1), np.int32)
    with pytest.raises(ValueError, match=r"block_sizes\[\(2,\)\]=0 is outside \[1, sparse_block_size=64\]"):
        validate_bsa_metadata(q, k, v, idx, block_sparse_num=1, sparse_block_size=64,
                              block_sizes=np.array([1, 64, 0, 3], np.int32))
    with pytest.raises(ValueError, match=r"block_sizes\[\(0, 1, 3\)\]=65"):
        bs = np.full((1, 2, 4), 64, np.int32)
        bs[0, 1, 3] = 65
        validate_bsa_metadata(q, k, v, idx, block_sparse_num=1, sparse_block_size=64, block_sizes=bs)


def test_bsa_block_sizes_as_a_list_like_the_op():
    """validate_bsa_metadata and block_sparse_attention_sharded take block_sizes as a Python
    list, as the op does (converted to int32), and check its values."""
    from jax_sparse_attn.sharding import block_sparse_attention_sharded

    q, k, v = (jnp.zeros(s.shape, s.dtype) for s in bsa_shapes())
    idx = np.zeros((1, 2, 3, 1), np.int32)
    kw = dict(block_sparse_num=1, sparse_block_size=64)
    validate_bsa_metadata(q, k, v, idx, block_sizes=[64, 1, 64, 8], **kw)
    with pytest.raises(ValueError, match=r"block_sizes\[\(2,\)\]=0 is outside"):
        validate_bsa_metadata(q, k, v, idx, block_sizes=[1, 64, 0, 3], **kw)
    mesh = jax.make_mesh((1,), ("b",))
    out = block_sparse_attention_sharded(q, k, v, jnp.asarray(idx), block_sizes=[64, 1, 64, 8],
                                         mesh=mesh, batch_axis="b", **kw)
    ref = jsa.block_sparse_attention(q, k, v, jnp.asarray(idx), block_sizes=[64, 1, 64, 8], **kw)
    np.testing.assert_array_equal(np.asarray(out, np.float32), np.asarray(ref, np.float32))


def test_bsa_backward_requires_forward_results():
    """block_sparse_attention_backward without o / lse / do: a ValueError naming the missing
    argument (not a shape mismatch against ())."""
    import jax_sparse_attn as jsa

    q = jnp.zeros((1, 2, 128, 16), jnp.float32)
    idx = jnp.zeros((1, 2, 2, 1), jnp.int32)
    lse = jnp.zeros((1, 2, 128), jnp.float32)
    for name, (do, o, l_) in (("o", (q, None, lse)), ("lse", (q, q, None)), ("do", (None, q, lse))):
        with pytest.raises(ValueError, match=f"{name} is required"):
            jsa.block_sparse_attention_backward(do, q, q, q, o, l_, idx, 1, None,
                                                sparse_block_size=64)


def test_numpy_float64_inputs_under_grad_without_x64():
    """NumPy float64 q / k / v are float32 arrays to JAX when x64 is off: under jax.grad
    (q a float32 tracer, k and v still NumPy float64) both ops run and match the eager
    float32 call, instead of reporting a dtype mismatch."""
    assert not jax.config.jax_enable_x64
    rng = np.random.default_rng(0)
    x = rng.standard_normal((6, 2, 8))
    cu = np.array([0, 6], np.int32)

    def hstu(q):
        return jsa.hstu_attention(q, x, x, cu, cu, max_seqlen_q=6, max_seqlen_k=6,
                                  backend="reference").sum()

    g = jax.grad(hstu)(x)
    assert g.dtype == jnp.float32 and np.isfinite(np.asarray(g)).all()
    np.testing.assert_allclose(g, jax.grad(hstu)(x.astype(np.float32)), rtol=1e-6, atol=1e-6)
    y = rng.standard_normal((1, 2, 64, 8))
    idx = np.zeros((1, 2, 1, 1), np.int32)

    def bsa(q):
        return jsa.block_sparse_attention(q, y, y, idx, 1, sparse_block_size=64,
                                          backend="reference").sum()

    g = jax.grad(bsa)(y)
    assert g.dtype == jnp.float32 and np.isfinite(np.asarray(g)).all()


def test_bsa_static_options_take_numpy_and_0d_values():
    """allow_empty_block_nums takes a NumPy bool like the other bool options;
    sparse_block_size a concrete 0-d integer array; a non-integer sparse_block_size is a
    TypeError, an integer outside (64, 128) a ValueError."""
    q = jnp.zeros((1, 2, 64, 8), jnp.float32)
    idx = jnp.zeros((1, 2, 1, 1), jnp.int32)
    nums = jnp.zeros((1, 2, 1), jnp.int32)
    out = jsa.block_sparse_attention(q, q, q, idx, None, None, nums, sparse_block_size=64,
                                     allow_empty_block_nums=np.bool_(True), backend="reference")
    assert np.all(np.asarray(out) == 0)
    out = jsa.block_sparse_attention(q, q, q, idx, 1, sparse_block_size=jnp.int32(64),
                                     backend="reference")
    assert out.shape == q.shape
    for bad in ("64", 64.0, True):
        with pytest.raises(TypeError, match="sparse_block_size must be a static Python int"):
            jsa.block_sparse_attention(q, q, q, idx, 1, sparse_block_size=bad,
                                       backend="reference")
    with pytest.raises(ValueError, match=r"sparse_block_size must be one of \(64, 128\), got 96"):
        jsa.block_sparse_attention(q, q, q, idx, 1, sparse_block_size=96, backend="reference")


def test_window_sides_past_int32_and_empty_bounds():
    """A window side of 2**31 - 1 or more reaches every key whatever the bounds, so it is
    the unbounded -1 (an int32 side); with max_seqlen_q = max_seqlen_k = 0 (no query rows)
    smaller sides are kept, so a paged call with the default causal window is accepted."""
    from jax_sparse_attn.validation import _unbounded_window  # noqa: PLC0415

    m = 2**31 - 1
    assert _unbounded_window((2**31, 0), m, m) == (-1, 0)
    assert _unbounded_window((2**31 - 2, 2**40), m, m) == (2**31 - 2, -1)
    assert _unbounded_window((5, 3), 4, 4) == (5, 3)
    assert _unbounded_window((8, 0), 4, 4) == (-1, 0)
    assert _unbounded_window((-1, 0), 0, 0) == (-1, 0)
    assert _unbounded_window((2**31, 7), 0, 0) == (-1, 7)
    with pytest.raises(TypeError, match="q dtype must be .* got int64"):
        jsa.hstu_attention(np.zeros((4, 1, 8), np.int64), np.zeros((4, 1, 8), np.int64),
                           np.zeros((4, 1, 8), np.int64), np.array([0, 4], np.int32),
                           np.array([0, 4], np.int32), max_seqlen_q=4, max_seqlen_k=4,
                           backend="reference")
    q = jnp.zeros((0, 4, 128), jnp.bfloat16)
    kv = jnp.zeros((1, 2, 128, 2, 128), jnp.bfloat16)
    cu = jnp.zeros((4,), jnp.int32)
    out = jsa.hstu_attention(q, None, None, cu, cu, paged_kv=kv, page_ids=jnp.zeros((0,), jnp.int32),
                             page_indptrs=cu, max_seqlen_q=0, max_seqlen_k=0,
                             backend="reference")
    assert out.shape == (0, 4, 128)


def test_validators_reject_traced_metadata_with_a_pointer_to_debug_checks():
    """The validators read values on the host: traced metadata (inside jax.jit) raise a
    TypeError naming the array and pointing to the op's debug_checks=True."""
    q, k, v, cu, _ = hstu_args()
    with pytest.raises(TypeError, match="cu_seqlens_q is traced.*debug_checks=True"):
        jax.jit(lambda c: validate_hstu_inputs(q, k, v, c, cu, max_seqlen_q=7,
                                               max_seqlen_k=7))(cu)
    qb = jax.ShapeDtypeStruct((1, 2, 256, 8), jnp.bfloat16)
    idx = jnp.zeros((1, 2, 2, 1), jnp.int32)
    with pytest.raises(TypeError, match="q2k_block_index is traced.*debug_checks=True"):
        jax.jit(lambda i: validate_bsa_metadata(qb, qb, qb, i, 1))(idx)
    validate_bsa_metadata(qb, qb, qb, idx, 1)  # concrete: checked


def test_concrete_cu_seqlens_are_checked_when_func_or_the_page_table_is_traced():
    """debug_checks doc: the metadata values "are always checked eagerly when they are
    concrete". With concrete cu_seqlens but a traced func (jax.jit over func only) or a
    traced page table, no check ran: a too small max_seqlen passed silently (unspecified
    output). The concrete cu_seqlens are checked; the traced arrays are not."""
    q, k, v, cu, _ = hstu_args()
    opts = dict(max_seqlen_q=6, max_seqlen_k=7, window_size=(-1, -1))
    func = jnp.full((1, 3, 10 + 256), 99, jnp.int32)  # out of range, but traced: unchecked
    f = jax.jit(lambda fn, **o: jsa.hstu_attention(q, k, v, cu, cu, func=fn, **o),
                static_argnames=tuple(opts))
    with pytest.raises(ValueError, match=r"max_seqlen_q=6 is smaller than sequence 2's length 7"):
        f(func, **opts)
    assert f(func, **dict(opts, max_seqlen_q=7)).shape == q.shape
    cu2 = jnp.asarray([[0, 3, 5], [0, 5, 5]], jnp.int32)  # per-shard: 2 shards of 5 tokens
    f2 = jax.jit(lambda fn, **o: jsa.hstu_attention(q, k, v, cu2, cu2, func=fn, **o),
                 static_argnames=tuple(opts))
    with pytest.raises(ValueError, match=r"shard 1 .*max_seqlen_q=4 is smaller"):
        f2(jnp.zeros((2, 3, 5 + 256), jnp.int32), **dict(opts, max_seqlen_q=4))
    pages = jnp.zeros((2, 2, 128, 2, 4), jnp.bfloat16)
    ptr = jnp.asarray([0, 1, 1, 2], jnp.int32)

    def paged(ids, max_seqlen_k):
        return jsa.hstu_attention(q, None, None, cu, cu, paged_kv=pages, page_ids=ids,
                                  page_indptrs=ptr, max_seqlen_q=7, max_seqlen_k=max_seqlen_k)

    g = jax.jit(paged, static_argnames="max_seqlen_k")
    with pytest.raises(ValueError, match=r"max_seqlen_k=5 is smaller than sequence 2's length 7"):
        g(jnp.asarray([0, 9], jnp.int32), 5)
    assert g(jnp.asarray([0, 9], jnp.int32), 7).shape == q.shape


def test_bsa_validator_takes_every_keyword_option_of_the_op():
    """validate_bsa_metadata says it "takes the same arguments as block_sparse_attention",
    but the op's backend, switches, debug_checks and deterministic raised TypeError
    (unexpected keyword), so validating with the op's own **options failed. They are
    accepted and checked like the op checks them."""
    q = jnp.zeros((1, 2, 130, 8), jnp.float32)
    idx = jnp.zeros((1, 2, 2, 1), jnp.int32)
    opts = dict(sparse_block_size=128, layout="bhsd", allow_empty_block_nums=False,
                softmax_scale=0.5, pack_gqa=False, kv_splits=2, causal=False,
                backend="reference", switches=None, debug_checks=True, deterministic=True)
    validate_bsa_metadata(q, q, q, idx, 1, **opts)
    jsa.block_sparse_attention(q, q, q, idx, 1, **opts)
    jsa.block_sparse_attention_forward(q, q, q, idx, 1, **opts)
    for name, bad, exc in [("backend", "cuda", ValueError), ("switches", {}, TypeError),
                           ("debug_checks", 1, TypeError), ("deterministic", "yes", TypeError)]:
        with pytest.raises(exc, match=name):
            validate_bsa_metadata(q, q, q, idx, 1, **dict(opts, **{name: bad}))
        with pytest.raises(exc, match=name):
            jsa.block_sparse_attention(q, q, q, idx, 1, **dict(opts, **{name: bad}))


def test_bsa_concrete_metadata_are_checked_when_other_metadata_are_traced():
    """The op's docs: the metadata "are checked eagerly when concrete". With some metadata
    traced (jax.jit over block_sizes only, or over q2k_block_index only) no check ran: a
    bad concrete q2k_block_index, q2k_block_nums or block_sizes passed silently
    (unspecified output). The concrete ones are checked; q2k_block_index is checked where
    its active prefixes are known (block_sparse_num or concrete q2k_block_nums)."""
    q = jnp.zeros((1, 2, 256, 8), jnp.float32)
    good_idx = jnp.zeros((1, 2, 2, 2), jnp.int32).at[..., 1].set(1)
    bad_idx = good_idx.at[0, 1, 1, 0].set(5)  # N_kv = 2
    sizes = jnp.full((2,), 128, jnp.int32)
    nums = jnp.full((1, 2, 2), 2, jnp.int32)
    kw = dict(backend="reference")

    def by_sizes(idx, bsn=None, nums_=None):
        return jax.jit(lambda s: jsa.block_sparse_attention(q, q, q, idx, bsn, s, nums_, **kw))

    with pytest.raises(ValueError, match=r"q2k_block_index\[\(0, 1, 1, 0\)\]=5 is outside"):
        by_sizes(bad_idx, 2)(sizes)
    with pytest.raises(ValueError, match=r"q2k_block_index\[\(0, 1, 1, 0\)\]=5 is outside"):
        by_sizes(bad_idx, None, nums)(sizes)
    with pytest.raises(ValueError, match=r"q2k_block_nums\[\(0, 0, 1\)\]=3 is outside"):
        by_sizes(good_idx, None, nums.at[0, 0, 1].set(3))(sizes)
    assert by_sizes(good_idx, 2)(sizes).shape == q.shape
    bad_sizes = sizes.at[1].set(129)
    with pytest.raises(ValueError, match=r"block_sizes\[\(1,\)\]=129 is outside"):
        jax.jit(lambda i: jsa.block_sparse_attention(q, q, q, i, 2, bad_sizes, **kw))(good_idx)
    # traced counts beside a concrete index: the counts are left to debug_checks
    with pytest.raises(jax.errors.JaxRuntimeError, match=r"q2k_block_nums.*=3 is outside"):
        jax.block_until_ready(jax.jit(lambda n: jsa.block_sparse_attention(
            q, q, q, good_idx, q2k_block_nums=n, debug_checks=True, **kw))(
                nums.at[0, 0, 1].set(3)))
    # the sharded helper checks its concrete global metadata likewise
    from jax.sharding import Mesh  # noqa: PLC0415

    from jax_sparse_attn.sharding import block_sparse_attention_sharded  # noqa: PLC0415

    mesh = Mesh(np.array(jax.devices()[:1]), ("data",))
    with pytest.raises(ValueError, match=r"q2k_block_index\[\(0, 1, 1, 0\)\]=5 is outside"):
        jax.jit(lambda s: block_sparse_attention_sharded(
            q, q, q, bad_idx, 2, s, mesh=mesh, batch_axis="data", **kw))(sizes)


def test_shape_dtype_struct_metadata_raise_a_type_error_naming_the_argument():
    """Metadata given as jax.ShapeDtypeStruct (which the validators take for q, k, v) gave
    int()'s TypeError about a 'ShapeDtypeStruct' from inside the value checks. The ops and
    the validators raise a TypeError naming the argument and saying an array is needed."""
    S = jax.ShapeDtypeStruct
    q, k, v, cu, _ = hstu_args()
    opts = dict(max_seqlen_q=7, max_seqlen_k=7)
    sds = S((4,), jnp.int32)
    msg = r"must be an array with values .* got a jax.ShapeDtypeStruct"
    for fn in (jsa.hstu_attention, validate_hstu_inputs):
        with pytest.raises(TypeError, match="cu_seqlens_q " + msg):
            fn(q, k, v, sds, cu, **opts)
        with pytest.raises(TypeError, match="cu_seqlens_k " + msg):
            fn(q, k, v, cu, sds, **opts)
        with pytest.raises(TypeError, match="func " + msg):
            fn(q, k, v, cu, cu, func=S((1, 3, 10 + 256), jnp.int32), window_size=(-1, -1),
               **opts)
        pages = jnp.zeros((2, 2, 128, 2, 4), jnp.bfloat16)
        with pytest.raises(TypeError, match="page_ids " + msg):
            fn(q, None, None, cu, cu, paged_kv=pages, page_ids=S((2,), jnp.int32),
               page_indptrs=jnp.asarray([0, 1, 1, 2], jnp.int32), **opts)
    with pytest.raises(TypeError, match="cu_seqlens_q " + msg):  # per-shard (num_shards, B+1)
        jsa.hstu_attention(q, k, v, S((2, 3), jnp.int32), S((2, 3), jnp.int32), **opts)
    qb = jnp.zeros((1, 2, 130, 8), jnp.float32)
    idx = jnp.zeros((1, 2, 2, 1), jnp.int32)
    for fn in (jsa.block_sparse_attention, validate_bsa_metadata):
        with pytest.raises(TypeError, match="q2k_block_index " + msg):
            fn(qb, qb, qb, S(idx.shape, jnp.int32), 1)
        with pytest.raises(TypeError, match="block_sizes " + msg):
            fn(qb, qb, qb, idx, 1, S((2,), jnp.int32))
        with pytest.raises(TypeError, match="q2k_block_nums " + msg):
            fn(qb, qb, qb, idx, q2k_block_nums=S((1, 2, 2), jnp.int32))


def test_concrete_cu_seqlens_are_checked_eagerly_also_with_debug_checks():
    """debug_checks doc: the metadata values "are always checked eagerly when they are
    concrete; with debug_checks=True they are also checked when traced". With concrete
    cu_seqlens beside a traced func and debug_checks=True, the cu_seqlens were only checked
    in the run-time callback (a JaxRuntimeError when run, not the eager ValueError). They
    are checked eagerly; the traced func is still checked at run time."""
    q, k, v, cu, _ = hstu_args()
    opts = dict(max_seqlen_q=6, max_seqlen_k=7, window_size=(-1, -1), debug_checks=True,
                backend="reference")
    f = jax.jit(lambda fn, **o: jsa.hstu_attention(q, k, v, cu, cu, func=fn, **o),
                static_argnames=tuple(opts))
    with pytest.raises(ValueError, match=r"max_seqlen_q=6 is smaller than sequence 2's length 7"):
        f(jnp.zeros((1, 3, 10 + 256), jnp.int32), **opts)  # at trace time
    with pytest.raises(jax.errors.JaxRuntimeError, match=r"func\[0, 0, 0\]=99 is outside"):
        jax.block_until_ready(f(jnp.full((1, 3, 10 + 256), 99, jnp.int32),
                                **dict(opts, max_seqlen_q=7)))
