"""The deterministic block-sparse backward's schedule order of the K->Q lists, on CPU:
``metadata.kq_schedule_starts`` against a loop, ``metadata.kq_schedule_order_reference``'s
invariants (each row's entries permuted, each query tile's ranks 0..count-1, colours
increasing along rows and tiles, the window rule) and a discrete-event run of the
kernel's wait protocol with only ``window`` CTA slots and random step times: every order
finishes (no deadlock) for random and adversarial lists."""

from __future__ import annotations

import heapq
import os

import jax.numpy as jnp
import numpy as np
import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

from jax_sparse_attn import metadata  # noqa: E402


def _random_lists(rng, b, h_q, h_kv, n_q, n_kv, k_max, ragged=True):
    idx = np.argsort(rng.random((b, h_q, n_q, n_kv)), axis=-1)[..., :k_max].astype(np.int32)
    nums = (rng.integers(0, k_max + 1, (b, h_q, n_q)) if ragged
            else np.full((b, h_q, n_q), k_max)).astype(np.int32)
    return idx, nums


def _csr(idx, nums, h_kv, n_kv):
    off, ent = metadata.build_kq_csr(jnp.asarray(idx), jnp.asarray(nums), num_kv_heads=h_kv,
                                     num_kv_blocks=n_kv)
    return np.asarray(off), np.asarray(ent)


def test_starts_match_a_loop():
    rng = np.random.default_rng(0)
    idx, nums = _random_lists(rng, 2, 4, 2, 12, 10, 5)
    off, _ = _csr(idx, nums, 2, 10)
    lens = np.diff(off)
    for held in (1, 3, 7, 40):
        got = np.asarray(metadata.kq_schedule_starts(jnp.asarray(off), num_kv_blocks=10,
                                                     held=held))
        start = np.zeros(len(lens), np.int64)
        for r in range(held, len(lens)):
            start[r] = start[r - held] + lens[r - held]
        want = (start.reshape(-1, 10) - start.reshape(-1, 10).min(1, keepdims=True)).ravel()
        np.testing.assert_array_equal(got, want)
        assert got.dtype == np.int32


def _order(idx, nums, h_kv, n_kv, held, window, subrounds=4):
    off, ent = _csr(idx, nums, h_kv, n_kv)
    starts = np.asarray(metadata.kq_schedule_starts(jnp.asarray(off), num_kv_blocks=n_kv,
                                                    held=held))
    e2, r2 = metadata.kq_schedule_order_reference(off, ent, starts, num_kv_blocks=n_kv,
                                                  window=window, subrounds=subrounds)
    return off, ent, starts, e2, r2


CASES = [  # b, h_q, h_kv, n_q, n_kv, k_max, held, window, ragged
    (1, 2, 2, 32, 32, 4, 16, 8, False),
    (2, 4, 2, 20, 24, 6, 10, 5, True),
    (1, 8, 2, 16, 16, 16, 8, 8, True),      # every block listed, GQA 4
    (1, 1, 1, 64, 8, 8, 4, 1, False),       # long rows, window 1
    (1, 2, 1, 9, 40, 3, 64, 64, True),
]


@pytest.mark.parametrize("case", CASES)
def test_order_invariants(case):
    b, h_q, h_kv, n_q, n_kv, k_max, held, window, ragged = case
    rng = np.random.default_rng(sum(case[:6]))
    idx, nums = _random_lists(rng, b, h_q, h_kv, n_q, n_kv, k_max, ragged)
    off, ent, starts, e2, r2 = _order(idx, nums, h_kv, n_kv, held, window)
    assert e2.shape == r2.shape == (off[-1],)
    n_rows = len(off) - 1
    for r in range(n_rows):
        assert sorted(e2[off[r]:off[r + 1]]) == sorted(ent[off[r]:off[r + 1]])
    for c0 in range(0, n_rows, n_kv):
        lo, hi = off[c0], off[c0 + n_kv]
        for tile in np.unique(e2[lo:hi]):
            assert sorted(r2[lo:hi][e2[lo:hi] == tile]) == list(range(int(np.sum(e2[lo:hi] == tile))))




def _simulate(off, e2, r2, n_kv, slots, seed, steps=None):
    """CTAs of the rows launched in order onto ``slots`` slots; a CTA walks its entries,
    each step waits until its tile's counter reaches the entry's rank, takes a random time
    and then publishes. Returns the finish time; raises on a deadlock."""
    rng = np.random.default_rng(seed)
    n_rows = len(off) - 1
    chain = lambda r: r // n_kv  # noqa: E731
    cnt = {}
    waiting = {}
    ev, seq = [], 0
    pos = {}
    nxt, free, end, finished = 0, slots, 0.0, 0

    def try_step(r, now):
        nonlocal seq
        p = pos[r]
        if p == off[r + 1] - off[r]:
            heapq.heappush(ev, (now, seq, "end", r)); seq += 1
            return
        key = (chain(r), int(e2[off[r] + p]))
        if cnt.get(key, 0) >= r2[off[r] + p]:
            heapq.heappush(ev, (now + rng.uniform(0.2, 3.0), seq, "step", r)); seq += 1
        else:
            waiting.setdefault(key, {})[int(r2[off[r] + p])] = r

    def launch(now):
        nonlocal nxt, free
        while free and nxt < n_rows:
            pos[nxt] = 0
            free -= 1
            nxt += 1
            try_step(nxt - 1, now)

    launch(0.0)
    while ev:
        now, _, kind, r = heapq.heappop(ev)
        end = max(end, now)
        if kind == "end":
            free += 1
            finished += 1
            launch(now)
            continue
        key = (chain(r), int(e2[off[r] + pos[r]]))
        cnt[key] = cnt.get(key, 0) + 1
        pos[r] += 1
        w = waiting.get(key, {})
        if cnt[key] in w:
            try_step(w.pop(cnt[key]), now)
        try_step(r, now)
    if finished != n_rows:
        raise RuntimeError(f"deadlock: {finished} of {n_rows} CTAs finished")
    return end


@pytest.mark.parametrize("case", CASES)
def test_no_deadlock_with_window_slots(case):
    """With exactly ``window`` CTA slots (the fewest the order allows) and random step
    times, every CTA finishes."""
    b, h_q, h_kv, n_q, n_kv, k_max, held, window, ragged = case
    rng = np.random.default_rng(7 + sum(case[:6]))
    idx, nums = _random_lists(rng, b, h_q, h_kv, n_q, n_kv, k_max, ragged)
    off, ent, starts, e2, r2 = _order(idx, nums, h_kv, n_kv, held, window)
    for seed in range(3):
        _simulate(off, e2, r2, n_kv, window, seed)


def test_simulation_finds_a_deadlock():
    """The simulation can fail: one slot, and row 0 listed after row 1 on a shared tile
    (ranks swapped by hand) deadlocks."""
    off = np.array([0, 1, 2])
    e2 = np.array([0, 0])
    r2 = np.array([1, 0])  # row 0 waits for row 1, which cannot start
    with pytest.raises(RuntimeError, match="deadlock"):
        _simulate(off, e2, r2, 2, 1, 0)
    _simulate(off, e2, r2, 2, 2, 0)  # with both resident it finishes


def test_window_rule_orders_far_rows():
    """A row ``window`` or more after another colours all its entries later: on a tile that
    both list, the later row's rank is higher."""
    rng = np.random.default_rng(3)
    idx, nums = _random_lists(rng, 1, 2, 1, 16, 32, 8, ragged=False)
    off, ent, starts, e2, r2 = _order(idx, nums, 1, 32, held=32, window=4)
    for r in range(32):
        for r_far in range(r + 4, 32):
            a = {int(e): int(k) for e, k in zip(e2[off[r]:off[r + 1]], r2[off[r]:off[r + 1]])}
            for e, k in zip(e2[off[r_far]:off[r_far + 1]], r2[off[r_far]:off[r_far + 1]]):
                if int(e) in a:
                    assert int(k) > a[int(e)], (r, r_far, int(e))


# ------------------------------------------------------------------ switches and lowering


def test_sched_window_and_config():
    """``detsched`` sets half the CTAs the GPU holds as the window, ``detschedfull`` all of
    them, only in deterministic mode; the order kernel's config falls back (None) where its
    shared memory does not fit."""
    from jax_sparse_attn import config as jc
    from jax_sparse_attn.ffi import bsa as fb

    held = {64: 2 * metadata.num_sms(), 128: metadata.num_sms()}
    for blk in (64, 128):
        for ws, want in (("", 0), ("detsched", held[blk] // 2), ("detschedfull", held[blk])):
            sw = jc.Switches(bsa_bwd_ws=ws)
            key = fb.bwd_config(jnp.bfloat16, 128, blk, False, sw, deterministic=True)
            assert key.det_window == want and key.held_ctas == held[blk], (blk, ws, key)
            assert fb.bwd_config(jnp.bfloat16, 128, blk, False, sw).det_window == 0
    with pytest.raises(ValueError, match="JAX_SPARSE_ATTN_BSA_BWD_WS"):
        jc.from_env({"JAX_SPARSE_ATTN_BSA_BWD_WS": "detschedule"})

    class C:  # the BSAConfig fields det_order_config reads
        num_heads_q, num_heads_kv, num_q_blocks, num_kv_blocks, k_max = 16, 16, 256, 256, 32
        bwd = fb.bwd_config(jnp.bfloat16, 128, 64, False, jc.Switches(bsa_bwd_ws="detsched"),
                            deterministic=True)

    ocfg = fb.det_order_config(C)
    assert ocfg == fb.BsaDetOrderConfig(256, 256, 256 * 32, held[64] // 2)
    C.num_heads_q, C.num_q_blocks, C.k_max = 64, 2048, 256  # GQA 4, 131k tokens: too big
    assert fb.det_order_config(C) is None
    C.num_heads_q, C.num_q_blocks, C.num_kv_blocks, C.k_max = 16, 8, 10000, 8
    assert fb.det_order_config(C) is None  # more rows per chain than the kernel takes


_LOWER = """
import sys
sys.path.insert(0, {tests!r})
import test_lowering_bsa_bwd_ws as tb
for i in (0, 1):
    txt = tb._bwd_text(tb.CONFIGS[i], ws="detsched", deterministic=True, det_writer=True)
    print("calls", txt.count(tb.CALL_TARGET))
"""


@pytest.mark.lowering
def test_sched_order_lowers(tmp_path):
    """The deterministic backward with ``detsched`` lowers for sm_90a with the order kernel
    as a fourth call (preprocessing, order, backward, dq reordering); the order kernel's PTX
    has the shared-memory 64-bit atomic minimum of the proposals and no local memory. (A
    fresh process: CuTe DSL reads its PTX dump settings at import.)"""
    import glob
    import subprocess
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, CUTE_DSL_ARCH="sm_90a", JAX_SPARSE_ATTN_FORCE_KERNEL="1",
               CUTE_DSL_KEEP="ptx", CUTE_DSL_DUMP_DIR=str(tmp_path), JAX_PLATFORMS="cpu",
               JAX_SPARSE_ATTN_CACHE_DIR=str(tmp_path / "cache"))
    r = subprocess.run([sys.executable, "-c", _LOWER.format(tests=here)], env=env,
                       capture_output=True, text=True, timeout=900, cwd=os.path.dirname(here))
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split().count("4") == 2, r.stdout
    ptx = [open(f).read() for f in glob.glob(str(tmp_path / "*.ptx"))]
    order = [p for p in ptx if "BsaDetScheduleOrder" in p]
    assert order, "no PTX of the order kernel"  # (both configs dump to one file name)
    for p in order:
        assert "atom.shared.min.u64" in p and "atom.shared.or.b32" in p
        assert ".local" not in p
