"""First-use frictions: argument forms a new user passes naturally either work or get a
message saying what to do."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_sparse_attn import block_sparse_attention, hstu_attention

ROOT = pathlib.Path(__file__).resolve().parents[1]

q4 = jnp.asarray(np.random.default_rng(0).standard_normal((1, 2, 128, 32)), jnp.float32)
idx = jnp.zeros((1, 2, 1, 1), jnp.int32)
qh = jnp.asarray(np.random.default_rng(1).standard_normal((10, 1, 8)), jnp.float32)
cu = jnp.array([0, 4, 10], jnp.int32)
HKW = dict(max_seqlen_q=6, max_seqlen_k=6, backend="reference")


def test_counts_array_in_block_sparse_num_slot_says_q2k_block_nums():
    nums = jnp.ones((1, 2, 1), jnp.int32)
    with pytest.raises(TypeError, match=r"pass the array as q2k_block_nums="):
        block_sparse_attention(q4, q4, q4, idx, nums)


@pytest.mark.parametrize("name", ["alpha", "scaling_seqlen", "max_seqlen_q", "window_size",
                                  "softmax_scale", "block_sparse_num"])
def test_traced_static_options_get_one_consistent_message(name):
    def call(x):
        if name == "softmax_scale":
            return block_sparse_attention(q4, q4, q4, idx, 1, softmax_scale=x, backend="reference")
        if name == "block_sparse_num":
            return block_sparse_attention(q4, q4, q4, idx, x, backend="reference")
        kw = dict(HKW)
        kw[name] = (x, 0) if name == "window_size" else x
        return hstu_attention(qh, qh, qh, cu, cu, **kw)

    val = 1 if name in ("max_seqlen_q", "window_size", "block_sparse_num") else 0.5
    with pytest.raises(TypeError, match=r"must be a static Python (int|number) \(a compile-time "
                                        r"constant\), got a traced value.*static_argnames"):
        jax.jit(call)(val)


def test_concrete_jnp_scalars_accepted_for_alpha_and_softmax_scale():
    a = hstu_attention(qh, qh, qh, cu, cu, alpha=jnp.float32(0.5), **HKW)
    b = hstu_attention(qh, qh, qh, cu, cu, alpha=0.5, **HKW)
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    a = block_sparse_attention(q4, q4, q4, idx, 1, softmax_scale=jnp.asarray(0.25),
                               backend="reference")
    b = block_sparse_attention(q4, q4, q4, idx, 1, softmax_scale=0.25, backend="reference")
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_python_list_cu_seqlens_and_block_sizes_are_converted():
    a = hstu_attention(qh, qh, qh, [0, 4, 10], [0, 4, 10], **HKW)
    b = hstu_attention(qh, qh, qh, cu, cu, **HKW)
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    a = block_sparse_attention(q4, q4, q4, idx, 1, [100], backend="reference")
    b = block_sparse_attention(q4, q4, q4, idx, 1, jnp.array([100], jnp.int32), backend="reference")
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_python_list_metadata_outside_int32_are_rejected_not_wrapped():
    """A Python list entry outside int32 (2**32 + 10 wraps to 10 in int32) is checked with
    its own value, as the same entry in a NumPy int64 array is: ValueError naming it."""
    from jax_sparse_attn import validate_bsa_metadata, validate_hstu_inputs

    big = 2**32 + 10
    with pytest.raises(ValueError, match=rf"cu_seqlens_q\[-1\]={big} exceeds"):
        hstu_attention(qh, qh, qh, [0, 4, big], [0, 4, 10], **HKW)
    with pytest.raises(ValueError, match=rf"cu_seqlens_k\[-1\]={big} exceeds"):
        validate_hstu_inputs(qh, qh, qh, [0, 4, 10], (0, 4, big), max_seqlen_q=6,
                             max_seqlen_k=6)
    pages = jnp.zeros((2, 2, 128, 1, 8), jnp.float32)
    with pytest.raises(ValueError, match=rf"page_ids\[0\]={2**32} is outside"):
        hstu_attention(qh, None, None, [0, 4, 10], [0, 4, 10], paged_kv=pages,
                       page_ids=[2**32, 1], page_indptrs=[0, 1, 2], **HKW)
    with pytest.raises(ValueError, match=rf"block_sizes\[\(0,\)\]={2**32 + 100} is outside"):
        block_sparse_attention(q4, q4, q4, idx, 1, [2**32 + 100], backend="reference")
    with pytest.raises(ValueError, match=r"block_sizes\[\(0,\)\]=-4294967196 is outside"):
        validate_bsa_metadata(q4, q4, q4, idx, 1, [100 - 2**32])


def test_python_list_metadata_with_traced_entries_work_under_jit():
    """cu_seqlens=[0, n, 10] with a traced n (inside jax.jit) raised
    TracerArrayConversionError from the list conversion: such a list is a traced array."""
    f = jax.jit(lambda n: hstu_attention(qh, qh, qh, [0, n, 10], (0, n, 10), **HKW))
    np.testing.assert_array_equal(np.asarray(f(4)),
                                  np.asarray(hstu_attention(qh, qh, qh, cu, cu, **HKW)))


def test_layout_mismatch_names_layout():
    with pytest.raises(ValueError, match=r"layout='bshd'.*pass layout='bhsd'"):
        block_sparse_attention(q4, q4, q4, idx, 1, layout="bshd", backend="reference")


def test_docstrings_do_not_cite_development_history():
    bad = []
    for p in (ROOT / "jax_sparse_attn").rglob("*.py"):
        text = p.read_text()
        for word in ("issue 2", "issue 3", "issue 4", "Issue 2", "floor of the issue"):
            if word in text:
                bad.append(f"{p.relative_to(ROOT)}: {word!r}")
    assert not bad, bad


def test_demo_runs_and_reports_backend():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-c", "import jax_sparse_attn as j; print(j.kernel_status())"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("kernels: ")
