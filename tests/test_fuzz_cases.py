"""CPU checks of the case generator of the GPU fuzz test (``tests/test_gpu_fuzz.py``).

The generator is pure Python / NumPy: these tests list the default cases (seed 2026, 24 per
op) without a GPU and check that they are reproducible, cover the inputs the fuzz test is
for (zero-length and length-1 sequences, empty BSA rows, GQA, both dtypes, every HSTU mask
kind, every BSA option) and follow the ops' metadata contracts (the eager validators accept
every case, so a GPU failure is the kernels', not the generator's).
"""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")

from test_gpu_fuzz import (  # noqa: E402
    BSA_PROFILES,
    DEFAULT_N,
    DEFAULT_SEED,
    HSTU_KV_SPLITS,
    HSTU_MASKS,
    HSTU_PROFILES,
    bsa_metadata,
    cases,
    describe,
    hstu_metadata,
    static_key,
)


@pytest.fixture(scope="module")
def default_cases():
    return {op: cases(op, DEFAULT_SEED, DEFAULT_N) for op in ("hstu", "bsa")}


def test_cases_deterministic_and_prefix_stable(default_cases):
    for op, cs in default_cases.items():
        assert len(cs) == DEFAULT_N
        assert cases(op, DEFAULT_SEED, DEFAULT_N) == cs
        assert cases(op, DEFAULT_SEED, 7) == cs[:7]  # case i does not depend on n
        assert cases(op, DEFAULT_SEED + 1, DEFAULT_N) != cs
        assert len({c["id"] for c in cs}) == len({describe(c) for c in cs}) == DEFAULT_N
    c = default_cases["bsa"][0]
    a, b = bsa_metadata(c), bsa_metadata(c)
    for name in ("idx", "nums_full", "seen"):
        assert np.array_equal(a[name], b[name])


def test_hstu_cases_cover(default_cases):
    cs = default_cases["hstu"]
    lens = [n for c in cs for n in c["lens_q"] + c["lens_k"]]
    assert 0 in lens and 1 in lens
    assert any(n % 2 for n in lens) and any(n > 1024 for n in lens)
    assert any(n % 64 in (63, 1) and n > 1 for n in lens) and 128 in lens
    assert {c["dtype"] for c in cs} == {"bfloat16", "float16"}
    assert {c["d"] for c in cs} == {64, 128, 256}
    assert {c["mask"] for c in cs} == {m for ms in HSTU_MASKS.values() for m in ms}
    assert any(c["heads"] > c["kv_heads"] for c in cs)
    assert {c["lens_mode"] for c in cs} == {"self", "fewer_q", "any"}
    assert any(lq > lk for c in cs for lq, lk in zip(c["lens_q"], c["lens_k"]))
    assert {c["kv_splits"] for c in cs} == set(HSTU_KV_SPLITS)
    assert any(c["scaling_seqlen"] is None for c in cs)
    assert any(c["scaling_seqlen"] not in (None, float(c["max_seqlen_q"])) for c in cs)
    assert any(c["max_seqlen_k"] > max(c["lens_k"]) for c in cs)
    assert any(c["tail_q"] == 0 for c in cs) and any(c["tail_q"] > 0 for c in cs)
    assert {c["profile"] for c in cs} == set(range(len(HSTU_PROFILES)))


def test_bsa_cases_cover(default_cases):
    cs = default_cases["bsa"]
    metas = [bsa_metadata(c) for c in cs]
    assert any((m["nums_full"] == 0).any() for m in metas), "no empty row"
    assert any((~m["seen"]).any() for m in metas), "no poisoned key"
    assert any(c["hq"] > c["hkv"] and not c["pack_gqa"] for c in cs)
    assert {c["hq"] // c["hkv"] for c in cs} == {1, 2, 4, 8}
    assert {c["dtype"] for c in cs} == {"bfloat16", "float16"}
    assert {c["d"] for c in cs} == {64, 128} and {c["blk"] for c in cs} == {64, 128}
    assert {c["layout"] for c in cs} == {"bhsd", "bshd"}
    assert {c["kv_splits"] for c in cs} == {1, 2, 7, "auto"}
    assert {c["sizes_rank"] for c in cs} == {0, 1, 2, 3}
    assert {c["counts"] for c in cs} == {"fixed", "var"}
    for flag in ("causal", "pack_gqa", "dlse"):
        assert {c[flag] for c in cs} == {False, True}
    assert any(c["sq"] % 2 and c["skv"] % 2 and c["sq"] != c["skv"] for c in cs)
    assert {c["profile"] for c in cs} == set(range(len(BSA_PROFILES)))


def test_static_configurations_are_few(default_cases):
    """Static options come from the profile lists: the HSTU ones add only the kv_splits
    option, the BSA ones only block_sizes' presence (fixed per profile) and, with
    pack_gqa, the kv_splits option (1 or "auto")."""
    hstu = {static_key(c) for c in default_cases["hstu"]}
    bsa = {static_key(c)[:-1] for c in default_cases["bsa"]}
    assert len(hstu) <= len(HSTU_PROFILES) * len(set(HSTU_KV_SPLITS))
    assert len(bsa) == len(BSA_PROFILES)


def test_cases_follow_the_contract(default_cases):
    """The eager validators accept every default case (shapes as ShapeDtypeStructs)."""
    import jax_sparse_attn as jsa

    sds = jax.ShapeDtypeStruct
    for c in default_cases["hstu"]:
        # the target masks come from masks.hstu_target_func (tests/test_masks.py); building
        # them here would compile one JAX computation per case
        cu_q, cu_k, func, kw = hstu_metadata(c, target_func=False)
        t_q, t_k = int(cu_q[-1]) + c["tail_q"], int(cu_k[-1]) + c["tail_k"]
        dt = np.dtype(jax.numpy.dtype(c["dtype"]))
        jsa.validate_hstu_inputs(sds((t_q, c["heads"], c["d"]), dt),
                                 sds((t_k, c["kv_heads"], c["d"]), dt),
                                 sds((t_k, c["kv_heads"], c["d"]), dt), cu_q, cu_k, func=func,
                                 **kw)
        assert (func is None) == (c["mask"] != "intervals")
        if func is not None:
            assert func.shape == (1, c["func_n"], t_q + 256)
    for c in default_cases["bsa"]:
        m = bsa_metadata(c)
        dt = jax.numpy.dtype(c["dtype"])

        def shape(h, s):
            return (c["b"], h, s, c["d"]) if c["layout"] == "bhsd" else (c["b"], s, h, c["d"])

        jsa.validate_bsa_metadata(
            sds(shape(c["hq"], c["sq"]), dt), sds(shape(c["hkv"], c["skv"]), dt),
            sds(shape(c["hkv"], c["skv"]), dt), m["idx"], m["block_sparse_num"], m["sizes"],
            m["nums"], sparse_block_size=c["blk"], layout=c["layout"],
            allow_empty_block_nums=True, softmax_scale=c["softmax_scale"],
            pack_gqa=c["pack_gqa"], kv_splits=c["kv_splits"], causal=c["causal"])
