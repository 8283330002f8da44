"""The deterministic block-sparse backward's schedule order of the K->Q lists, on CPU:
``metadata.kq_schedule_starts`` against a loop, ``metadata.kq_schedule_order_reference``'s
invariants (each row's entries permuted, each query tile's ranks 0..count-1, the window
rule), their argument checks, and a discrete-event run of the
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
        mean2 = 2 * lens.sum() // len(lens)
        start = np.zeros(len(lens), np.int64)
        for r in range(held, len(lens)):
            start[r] = max(lens[:r].sum() - (held - 1) * mean2 // 4, 0) // held
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


def test_schedule_arguments_are_checked():
    """Bad ``held`` / ``num_kv_blocks`` / ``window`` / ``subrounds`` raise ValueError naming
    them (a window of 0 would otherwise never let a row start: an endless loop)."""
    off = jnp.asarray([0, 2, 3, 3, 5], jnp.int32)
    ent = np.asarray([0, 1, 1, 0, 1], np.int32)
    for kw in (dict(num_kv_blocks=2, held=0), dict(num_kv_blocks=0, held=4),
               dict(num_kv_blocks=3, held=4)):  # 4 rows are not chains of 3
        with pytest.raises(ValueError, match="num_kv_blocks"):
            metadata.kq_schedule_starts(off, **kw)
    starts = np.asarray(metadata.kq_schedule_starts(off, num_kv_blocks=2, held=4))
    for kw in (dict(window=0), dict(window=2, subrounds=0)):
        with pytest.raises(ValueError, match="window"):
            metadata.kq_schedule_order_reference(off, ent, starts, num_kv_blocks=2, **kw)
    e2, r2 = metadata.kq_schedule_order_reference(off, ent, starts, num_kv_blocks=2, window=1)
    assert sorted(r2[:3][e2[:3] == 1]) == [0, 1]


def _simulate(off, e2, r2, n_kv, slots, seed, steps=None, acc=1):
    """CTAs of the rows launched in order onto ``slots`` slots; a CTA walks its entries,
    each step waits until its tile's counter reaches the entry's rank, takes a random time
    and then publishes. ``acc`` dQ accumulators per tile (``bsa_bwd_ws=dqslots``): the
    entry of rank ``r`` waits on accumulator ``r % acc``'s counter for ``r // acc``.
    Returns the finish time; raises on a deadlock."""
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
        rank = int(r2[off[r] + p])
        key = (chain(r), int(e2[off[r] + p]), rank % acc)
        if cnt.get(key, 0) >= rank // acc:
            heapq.heappush(ev, (now + rng.uniform(0.2, 3.0), seq, "step", r)); seq += 1
        else:
            waiting.setdefault(key, {})[rank // acc] = r

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
        key = (chain(r), int(e2[off[r] + pos[r]]), int(r2[off[r] + pos[r]]) % acc)
        cnt[key] = cnt.get(key, 0) + 1
        pos[r] += 1
        w = waiting.get(key, {})
        if cnt[key] in w:
            try_step(w.pop(cnt[key]), now)
        try_step(r, now)
    if finished != n_rows:
        raise RuntimeError(f"deadlock: {finished} of {n_rows} CTAs finished")
    return end


@pytest.mark.parametrize("acc", [1, 2, 3])
@pytest.mark.parametrize("case", CASES)
def test_no_deadlock_with_window_slots(case, acc):
    """With exactly ``window`` CTA slots (the fewest the order allows) and random step
    times, every CTA finishes, with one or several dQ accumulators per tile."""
    b, h_q, h_kv, n_q, n_kv, k_max, held, window, ragged = case
    rng = np.random.default_rng(7 + sum(case[:6]))
    idx, nums = _random_lists(rng, b, h_q, h_kv, n_q, n_kv, k_max, ragged)
    off, ent, starts, e2, r2 = _order(idx, nums, h_kv, n_kv, held, window)
    for seed in range(3):
        _simulate(off, e2, r2, n_kv, window, seed, acc=acc)


def test_simulation_finds_a_deadlock():
    """The simulation can fail: one slot, and row 0 listed after row 1 on a shared tile
    (ranks swapped by hand) deadlocks."""
    off = np.array([0, 1, 2])
    e2 = np.array([0, 0])
    r2 = np.array([1, 0])  # row 0 waits for row 1, which cannot start
    with pytest.raises(RuntimeError, match="deadlock"):
        _simulate(off, e2, r2, 2, 1, 0)
    _simulate(off, e2, r2, 2, 2, 0)  # with both resident it finishes
    # with two accumulators rank 1 no longer waits for rank 0: one slot finishes
    _simulate(off, e2, r2, 2, 1, 0, acc=2)
    r3 = np.array([2, 0])  # rank 2 waits for rank 0 on the same accumulator
    with pytest.raises(RuntimeError, match="deadlock"):
        _simulate(off, e2, r3, 2, 1, 0, acc=2)


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
    """The default window is one CTA per SM (the default's order: ``det_sched_auto``),
    ``detsched`` half the CTAs the GPU holds, ``detschedfull`` all of them, the launch-group
    options none, only in deterministic mode; the order kernel's config falls back (None)
    where its shared memory does not fit."""
    from jax_sparse_attn import config as jc
    from jax_sparse_attn.ffi import bsa as fb

    sms = metadata.num_sms()
    held = {64: 2 * sms, 128: sms}
    # the default: one CTA per SM; at blk 128 half that when no GPU is visible
    auto = {64: sms, 128: sms if metadata.gpu_num_sms() else sms // 2}
    for blk in (64, 128):
        for ws, want in (("", auto[blk]), ("detsched", held[blk] // 2),
                         ("detschedfull", held[blk]), ("detlaunch", 0), ("detkv", 0),
                         ("detfull", 0), ("lselate", auto[blk])):
            # detorder: the ordered additions (the fixed-point dQ is the default)
            sw = jc.Switches(bsa_bwd_ws=",".join(filter(None, (ws, "detorder"))))
            key = fb.bwd_config(jnp.bfloat16, 128, blk, False, sw, deterministic=True)
            assert key.det_window == want and key.held_ctas == held[blk], (blk, ws, key)
            assert key.det_sched_auto == (ws in ("", "lselate")), (blk, ws, key)
            key = fb.bwd_config(jnp.bfloat16, 128, blk, False, sw)
            assert key.det_window == 0 and not key.det_sched_auto
    with pytest.raises(ValueError, match="JAX_SPARSE_ATTN_BSA_BWD_WS"):
        jc.from_env({"JAX_SPARSE_ATTN_BSA_BWD_WS": "detschedule"})

    class C:  # the BSAConfig fields det_order_config reads
        num_heads_q, num_heads_kv, num_q_blocks, num_kv_blocks, k_max = 16, 16, 256, 256, 32
        bwd = fb.bwd_config(jnp.bfloat16, 128, 64, False, jc.Switches(bsa_bwd_ws="detsched"),
                            deterministic=True)

    ocfg = fb.det_order_config(C)
    assert ocfg == fb.BsaDetOrderConfig(256, 256, 256 * 32, held[64] // 2)
    # ordfast / ordscan=N reach the order kernel's compile key (and only with deterministic)
    C.bwd = fb.bwd_config(jnp.bfloat16, 128, 64, False,
                          jc.Switches(bsa_bwd_ws="detsched,ordfast,ordscan=8"),
                          deterministic=True)
    assert fb.det_order_config(C) == fb.BsaDetOrderConfig(256, 256, 256 * 32, held[64] // 2,
                                                          scan=8, fast=True, held=held[64])
    plain = fb.bwd_config(jnp.bfloat16, 128, 64, False,
                          jc.Switches(bsa_bwd_ws="ordfast,ordscan=8"))
    assert not plain.det_order_fast and plain.det_order_scan == 4
    for bad in ("ordscan=0", "ordscan=17", "ordscan"):
        with pytest.raises(ValueError, match="ordscan=N"):
            jc.Switches(bsa_bwd_ws=bad)
    C.num_heads_q, C.num_q_blocks, C.k_max = 64, 2048, 256  # GQA 4, 131k tokens: too big
    assert fb.det_order_config(C) is None
    C.num_heads_q, C.num_q_blocks, C.num_kv_blocks, C.k_max = 16, 8, 10000, 8
    assert fb.det_order_config(C) is None  # more rows per chain than the kernel takes


def test_default_window_follows_the_visible_gpu(monkeypatch):
    """The default window is one CTA per SM of the visible GPU; traced without one, at blk
    128 (where that is every CTA the GPU holds) half of the guessed SM count."""
    from jax_sparse_attn.ffi import bsa as fb

    monkeypatch.setattr(metadata, "gpu_num_sms", lambda: 114)
    monkeypatch.setattr(metadata, "num_sms", lambda: 114)
    assert fb.det_schedule_window(128) == 114 and fb.det_schedule_window(64) == 114
    monkeypatch.setattr(metadata, "gpu_num_sms", lambda: None)
    monkeypatch.setattr(metadata, "num_sms", lambda: 132)
    assert fb.det_schedule_window(128) == 66 and fb.det_schedule_window(64) == 132
    assert fb.det_schedule_window(128, ("detschedfull",)) == 132


_LOWER = """
import sys
sys.path.insert(0, {tests!r})
import test_lowering_bsa_bwd_ws as tb
for ws in ("detsched,nodetstream", "detsched,nodetstream,ordfast"):
    for i in (0, 1):
        txt = tb._bwd_text(tb.CONFIGS[i], ws=ws, deterministic=True, det_writer=True)
        print("calls", txt.count(tb.CALL_TARGET))
"""


@pytest.mark.lowering
def test_sched_order_lowers(tmp_path):
    """The deterministic backward with ``detsched`` lowers for sm_90a with the order kernel
    as a fourth call (preprocessing, order, backward, dq reordering), with ``ordfast`` also
    the K->Q lists kernel; the order kernel's PTX has the shared-memory 64-bit atomic
    minimum of the proposals (``ordfast``: the barrier reduction) and no local memory. (A
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
    # four calls; with ordfast five: the K->Q lists kernel replaces XLA's lists
    assert r.stdout.split() == ["calls", "4"] * 2 + ["calls", "5"] * 2, r.stdout
    ptx = [open(f).read() for f in glob.glob(str(tmp_path / "*.ptx"))]
    order = [p for p in ptx if "BsaDetScheduleOrder" in p]
    assert order, "no PTX of the order kernel"  # (both configs dump to one file name)
    for p in order:
        assert "atom.shared.min.u64" in p or "bar.red.or.pred" in p
        assert "atom.shared.or.b32" in p and ".local" not in p


_LOWER_ORDER = """
import dataclasses
import jax, jax.numpy as jnp
from jax_sparse_attn.ffi import bsa as fb
ocfg = fb.BsaDetOrderConfig(256, 256, 256 * 32, 132, scan={scan}, fast={fast}, held={held})
f = jax.jit(lambda o, e: fb.det_schedule_order(o, e, ocfg, 264))
f.trace(jax.ShapeDtypeStruct((16 * 256 + 1,), jnp.int32),
        jax.ShapeDtypeStruct((16 * 256 * 32,), jnp.int32)).lower(lowering_platforms=("cuda",))
print("lowered")
"""


@pytest.mark.lowering
@pytest.mark.ablation
@pytest.mark.parametrize("fast,scan,held", [(True, 4, 264), (True, 8, 0), (False, 16, 0)])
def test_order_kernel_variants_lower(tmp_path, fast, scan, held):
    """The order kernel's ``fast`` / ``scan`` / ``held`` builds (``bsa_bwd_ws`` ``ordfast``,
    ``ordscan=N``; ``held``: the starts computed in the kernel, a call without the starts
    input) lower for sm_90a without local memory; ``fast`` has the barrier's OR
    reduction, the warp ballot and its popcount, 32-bit atomic minima for the proposals (no
    64-bit ones) and the bit reverse and leading-zero count of its prefix skip; a wider
    scan issues more independent tile-round loads per step."""
    import glob
    import subprocess
    import sys

    env = dict(os.environ, CUTE_DSL_ARCH="sm_90a", JAX_SPARSE_ATTN_FORCE_KERNEL="1",
               CUTE_DSL_KEEP="ptx", CUTE_DSL_DUMP_DIR=str(tmp_path), JAX_PLATFORMS="cpu",
               JAX_SPARSE_ATTN_CACHE_DIR=str(tmp_path / "cache"))
    r = subprocess.run([sys.executable, "-c",
                        _LOWER_ORDER.format(fast=fast, scan=scan, held=held)],
                       env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "lowered" in r.stdout, r.stderr[-3000:]
    ptx = [open(f).read() for f in glob.glob(str(tmp_path / "*.ptx"))]
    order = [p for p in ptx if "BsaDetScheduleOrder" in p]
    assert len(order) == 1, "no PTX of the order kernel"
    p = order[0]
    assert ".local" not in p and "atom.shared.or.b32" in p
    fast_ops = ("bar.red.or.pred", "vote.sync.ballot", "popc.b32", "brev.b32", "clz.b32")
    if fast:
        assert all(op in p for op in fast_ops), [op for op in fast_ops if op not in p]
        assert "atom.shared.min.u64" not in p and "atom.shared.min.s32" in p
    else:
        assert not any(op in p for op in fast_ops) and "atom.shared.min.u64" in p
    # the scan's three shared loads per entry checked at once (its coloured bit word, its
    # tile, the tile's round), beside about a dozen others
    assert p.count("ld.shared.b32") >= 3 * scan + 8, p.count("ld.shared.b32")


# ------------------------------------------------- the order kernel's phases, emulated on CPU


#: entries a proposal scan of the order kernel checks at once (kernels/bsa_det_order.SCAN)
SCAN_WIDTH = 4


def test_scan_width_is_the_kernels():
    pytest.importorskip("cutlass")
    from jax_sparse_attn.kernels import bsa_det_order

    assert bsa_det_order.SCAN == SCAN_WIDTH


def _kernel_emulation(off, ent, starts, *, n_kv, n_tiles, e_cap, window, subrounds=4,
                      max_threads=1024, seed=0, fast=False, scan=SCAN_WIDTH, held=0):
    """``kernels/bsa_det_order.py`` statement by statement in Python: one generator per
    thread that yields before each shared-memory access, a scheduler that steps the threads
    in a random interleaving up to each ``cute.arch.barrier()`` (and each warp collective),
    and a race check per barrier interval (two threads on one address with at least one
    plain write, other than equal-valued plain stores, or a plain read next to an atomic).
    ``fast`` / ``scan`` / ``held``: the kernel's options of those names (``fast``: the
    barrier's OR reduction, a warp ballot's count, 32-bit keys where they fit, the prefix
    skipped by words; ``held`` > 0: the starts computed from ``off``, ``starts`` unused,
    with C's truncating divisions). Returns ``(entries_out, ranks_out)`` (slots not written: -7) and the global
    slots written per chain."""
    rng = np.random.default_rng(seed)
    big, nt = 0x7FFFFFFF, min(max_threads, -(-n_kv // 32) * 32)
    warp = min(32, nt)
    row_bits = max(1, (n_kv - 1).bit_length())
    kbig = (1 << (31 - row_bits)) - 1
    key32 = fast and subrounds * e_cap + n_kv + 2 < kbig
    keep_tile = fast and -(-n_kv // nt) <= 4
    rpt, n_words = -(-n_kv // nt), -(-e_cap // 32)
    n_rows = len(off) - 1
    out_e = np.full(len(ent), -7, np.int64)
    out_r = np.full(len(ent), -7, np.int64)
    written = []

    def run_chain(chain):
        sm = {"round": [0] * n_tiles, "cnt": [0] * n_tiles, "prop": [0] * n_tiles,
              "edge": [0] * e_cap, "bits": [0] * n_words, "fin": [0] * n_kv, "misc": [0] * 8}
        log = []  # (tid, kind, array, index, value) of the current barrier interval
        slots = []

        def acc(tid, kind, arr, i, val=None):
            assert 0 <= i < len(sm[arr]), (arr, i)  # shared-memory bounds
            log.append((tid, kind, arr, i, val))

        def start_of(r):  # the kernel's _start (truncating divisions, as in C)
            def div(a, b):
                return int(a / b) if a * b >= 0 else -int(-a / b)
            mean2 = div(2 * (int(off[n_rows]) - int(off[0])), n_rows)
            st = div(max(int(off[r]) - int(off[0]) - div((held - 1) * mean2, 4), 0), held)
            return 0 if r < held else st

        def thread(tid):
            row0 = chain * n_kv
            e0 = int(off[row0])
            n_e = min(int(off[row0 + n_kv]) - e0, e_cap)
            rOff, rDeg, rT0, rK = [0] * rpt, [0] * rpt, [0] * rpt, [0] * rpt
            rAct, rPtr, rCand, rFirst = [0] * rpt, [0] * rpt, [0] * rpt, [0] * rpt
            rTile = [0] * rpt
            for i in range(rpt):
                n = tid + i * nt
                if n < n_kv:
                    a = int(off[row0 + n]) - e0
                    b = int(off[row0 + n + 1]) - e0
                    a = max(min(a, n_e), 0)
                    b = max(min(b, n_e), a)
                    rOff[i], rDeg[i] = a, b - a
                    rT0[i] = (start_of(row0 + n) - start_of(row0) if held > 0
                              else int(starts[row0 + n]))
                    yield acc(tid, "w", "fin", n, -1 if b == a else big)
                    sm["fin"][n] = -1 if b == a else big
            for j in range(tid, n_tiles, nt):
                no_prop = big if key32 else (1 << 63) - 1
                for arr, v in (("round", -1), ("cnt", 0), ("prop", no_prop)):
                    yield acc(tid, "w", arr, j, v)
                    sm[arr][j] = v
            for j in range(tid, n_words, nt):
                yield acc(tid, "w", "bits", j, 0)
                sm["bits"][j] = 0
            for j in range(tid, n_e, nt):
                v = max(min(int(ent[e0 + j]), n_tiles - 1), 0)
                yield acc(tid, "w", "edge", j, v)
                sm["edge"][j] = v
            if tid == 0:
                for j, v in enumerate((n_e, 0, 0, 0, big)):
                    yield acc(tid, "w", "misc", j, v)
                    sm["misc"][j] = v
            yield "bar"
            t = sc = 0
            yield acc(tid, "r", "misc", 0)
            left = sm["misc"][0]
            while left > 0:
                if tid == 0:
                    yield acc(tid, "r", "misc", 1)
                    f = sm["misc"][1]
                    while f < n_kv:
                        yield acc(tid, "r", "fin", min(f, n_kv - 1))
                        if sm["fin"][min(f, n_kv - 1)] < t:
                            f += 1
                        else:
                            break
                    yield acc(tid, "w", "misc", 1, f)
                    sm["misc"][1] = f
                yield "bar"
                yield acc(tid, "r", "misc", 1)
                fin = sm["misc"][1]
                if tid == 0:
                    yield acc(tid, "w", "misc", 4, big)
                    sm["misc"][4] = big
                for i in range(rpt):
                    n = tid + i * nt
                    act = 0
                    if n < n_kv and rK[i] < rDeg[i] and t >= rT0[i]:
                        act = 1
                        if window < n_kv and n >= window and fin < n - window + 1:
                            act = 0
                    rAct[i] = act
                    p = rFirst[i]
                    if act:
                        while p < rDeg[i]:
                            e = rOff[i] + p
                            yield acc(tid, "r", "bits", e >> 5)
                            if fast:
                                # the word's trailing ones from bit e % 32 (as int32, the
                                # arithmetic shift's sign bits clamped at the word's end)
                                w = sm["bits"][e >> 5] & 0xFFFFFFFF
                                w = (w - (1 << 32) if w >> 31 else w) >> (e & 31)
                                inv = ~w & 0xFFFFFFFF
                                ones = (inv & -inv).bit_length() - 1 if inv else 32
                                ones = min(ones, 32 - (e & 31))
                                p = min(p + ones, rDeg[i])
                                if ones < 32 - (e & 31):
                                    break
                                continue
                            if not (sm["bits"][e >> 5] >> (e & 31)) & 1:
                                break
                            p += 1
                        rFirst[i] = p
                    rPtr[i] = p
                s, go_s, any0 = 0, True, 1
                while go_s:
                    key = ((kbig - sc) << row_bits) if key32 else (big - sc) << 32
                    proposed = 0
                    for i in range(rpt):
                        rCand[i] = -1
                        if rAct[i]:
                            p, deg, base = rPtr[i], rDeg[i], rOff[i]
                            while p < deg:
                                # SCAN entries at once (past the row's end: its last entry,
                                # counted as taken), then the first free one
                                first = scan
                                for j in range(scan):
                                    e = base + min(p + j, deg - 1)
                                    yield acc(tid, "r", "bits", e >> 5)
                                    bit = (sm["bits"][e >> 5] >> (e & 31)) & 1
                                    yield acc(tid, "r", "edge", e)
                                    yield acc(tid, "r", "round", sm["edge"][e])
                                    free = (not bit and sm["round"][sm["edge"][e]] != t
                                            and p + j < deg)
                                    if free and first == scan:
                                        first = j
                                if first < scan:
                                    p += first
                                    break
                                p = min(p + scan, deg)
                            rPtr[i] = p
                            if p < deg:
                                rCand[i] = p
                                yield acc(tid, "r", "edge", base + p)
                                tile = rTile[i] = sm["edge"][base + p]  # (keep_tile)
                                yield acc(tid, "a", "prop", tile)
                                sm["prop"][tile] = min(sm["prop"][tile], key | (tid + i * nt))
                                if fast:
                                    proposed = 1
                                else:
                                    yield acc(tid, "w", "misc", 2 + (sc & 1), 1)
                                    sm["misc"][2 + (sc & 1)] = 1
                    if fast:
                        more = yield ("bar", proposed)  # bar.red.or.pred
                    else:
                        yield "bar"
                        yield acc(tid, "r", "misc", 2 + (sc & 1))
                        more = sm["misc"][2 + (sc & 1)]
                    if s == 0:
                        any0 = more
                    won = 0
                    for i in range(rpt):
                        took = 0
                        if rCand[i] >= 0:
                            n = tid + i * nt
                            e = rOff[i] + rCand[i]
                            if keep_tile:  # the proposal's tile, kept in a register
                                tile = rTile[i]
                            else:
                                yield acc(tid, "r", "edge", e)
                                tile = sm["edge"][e]
                            yield acc(tid, "r", "prop", tile)
                            if sm["prop"][tile] == (key | n):
                                yield acc(tid, "r", "cnt", tile)
                                rank = sm["cnt"][tile]
                                yield acc(tid, "w", "cnt", tile, rank + 1)
                                sm["cnt"][tile] = rank + 1
                                yield acc(tid, "w", "round", tile, t)
                                sm["round"][tile] = t
                                out = e0 + rOff[i] + rK[i]
                                slots.append(out)
                                out_e[out], out_r[out] = tile, rank
                                rK[i] += 1
                                yield acc(tid, "a", "bits", e >> 5)
                                sm["bits"][e >> 5] |= 1 << (e & 31)
                                if fast:
                                    took = 1
                                else:
                                    yield acc(tid, "a", "misc", 0)
                                    sm["misc"][0] -= 1
                                rAct[i] = 0
                                if rK[i] == rDeg[i]:
                                    yield acc(tid, "w", "fin", n, t)
                                    sm["fin"][n] = t
                            else:
                                rPtr[i] = rCand[i] + 1
                        if fast:
                            won += yield ("warp", took)  # popc of the warp's ballot
                    if fast:
                        if tid % warp == 0 and won:
                            yield acc(tid, "a", "misc", 0)
                            sm["misc"][0] -= won
                    elif tid == 0:
                        yield acc(tid, "w", "misc", 2 + ((sc + 1) & 1), 0)
                        sm["misc"][2 + ((sc + 1) & 1)] = 0
                    yield "bar"
                    s += 1
                    sc += 1
                    go_s = s < subrounds and more != 0
                    assert sc < big and (not key32 or sc <= kbig)  # the keys stay ordered
                t += 1
                if not any0:
                    # no row was active: on to the earliest start of a pending row
                    for i in range(rpt):
                        if rK[i] < rDeg[i] and rT0[i] >= t:
                            yield acc(tid, "a", "misc", 4)
                            sm["misc"][4] = min(sm["misc"][4], rT0[i])
                    yield "bar"
                    yield acc(tid, "r", "misc", 4)
                    if sm["misc"][4] != big:
                        t = max(t, sm["misc"][4])
                yield acc(tid, "r", "misc", 0)
                left = sm["misc"][0]

        def check_races():
            by_addr = {}
            for tid, kind, arr, i, val in log:
                by_addr.setdefault((arr, i), []).append((tid, kind, val))
            for addr, accs in by_addr.items():
                if len({a[0] for a in accs}) < 2:
                    continue
                kinds = {a[1] for a in accs}
                if kinds <= {"r"} or kinds <= {"a"}:
                    continue
                if kinds == {"w"} and len({a[2] for a in accs}) == 1:
                    continue  # equal-valued stores (the "some row proposed" flag)
                raise AssertionError(f"race on {addr}: {accs}")
            log.clear()

        threads = {tid: thread(tid) for tid in range(nt)}
        running = set(threads)
        intervals = 0
        reply = dict.fromkeys(threads)  # what each thread's next step receives
        while running:
            at_bar, done, at_warp = {}, set(), {}
            live = sorted(running)
            while live:
                tid = live[rng.integers(len(live))]
                try:
                    ev = threads[tid].send(reply[tid])
                except StopIteration:
                    done.add(tid)
                    live.remove(tid)
                    continue
                reply[tid] = None
                if ev == "bar" or (isinstance(ev, tuple) and ev[0] == "bar"):
                    at_bar[tid] = ev[1] if isinstance(ev, tuple) else 0
                    live.remove(tid)
                elif isinstance(ev, tuple) and ev[0] == "warp":
                    # a warp collective: every lane of the warp takes part, none at a barrier
                    w = tid // warp
                    at_warp.setdefault(w, {})[tid] = ev[1]
                    live.remove(tid)
                    lanes = [x for x in range(w * warp, min((w + 1) * warp, nt))]
                    if len(at_warp[w]) == len(lanes):
                        total = sum(1 for x in lanes if at_warp[w][x])
                        for x in lanes:
                            reply[x] = total
                            live.append(x)
                        del at_warp[w]
            assert not at_warp, "a warp collective without every lane"
            assert not (at_bar and done), "threads leave at different barriers"
            check_races()
            red = int(any(at_bar.values()))
            for tid in at_bar:
                reply[tid] = red
            running = set(at_bar)
            intervals += 1
            assert intervals < 100000, "no termination"
        written.append(slots)

    for chain in range(n_rows // n_kv):
        run_chain(chain)
    return out_e, out_r, written


EMU_CASES = [  # b, h_q, h_kv, n_q, n_kv, k_max, held, window, ragged, max_threads
    (1, 2, 2, 6, 20, 4, 8, 4, False, 1024),    # window rule, one row per thread
    (1, 4, 2, 5, 23, 5, 6, 3, True, 8),        # three rows per thread (n_kv > threads)
    (2, 2, 1, 4, 13, 13, 5, 13, True, 4),      # every block listed, window = n_kv
    (1, 1, 1, 12, 6, 6, 2, 1, False, 4),       # window 1, long rows
    (1, 2, 2, 3, 40, 2, 40, 40, True, 16),     # many empty rows
    (1, 2, 2, 8, 70, 6, 50, 30, True, 1024),   # three warps of 32 threads
    (1, 2, 2, 6, 23, 4, 8, 6, True, 4),        # six rows per thread (fast: tile reloaded)
]

#: the order kernel's (fast, scan, starts computed in the kernel) builds: the default,
#: ``ordfast`` (which computes the starts), ``ordfast,ordscan=8``, ``ordscan=3``, and the
#: starts alone
EMU_VARIANTS = [(False, SCAN_WIDTH, False), (True, SCAN_WIDTH, True), (True, 8, True),
                (False, 3, False), (False, SCAN_WIDTH, True)]


@pytest.mark.parametrize("variant", EMU_VARIANTS,
                         ids=lambda v: f"fast{int(v[0])}-scan{v[1]}-starts{int(v[2])}")
@pytest.mark.parametrize("case", EMU_CASES)
def test_kernel_emulation_matches_reference(case, variant):
    """The order kernel's statements, run with random thread interleavings between its
    barriers, give the reference's entries and ranks bit for bit, with no data race, every
    slot of the active range written once and none outside it; with each of its static
    variants."""
    fast, scan, own_starts = variant
    b, h_q, h_kv, n_q, n_kv, k_max, held, window, ragged, max_threads = case
    rng = np.random.default_rng(11 + sum(case[:6]))
    idx, nums = _random_lists(rng, b, h_q, h_kv, n_q, n_kv, k_max, ragged)
    if ragged:
        nums[..., ::2] = 0  # empty query rows: rows of zero degree and unused tiles
    off, ent, starts, e2, r2 = _order(idx, nums, h_kv, n_kv, held, window)
    n_tiles = (h_q // h_kv) * n_q
    e_cap = min(n_tiles * k_max, n_kv * n_tiles)
    end = int(off[-1])
    for seed in range(3):
        ke, kr, written = _kernel_emulation(off, ent, starts, n_kv=n_kv, n_tiles=n_tiles,
                                            e_cap=e_cap, window=window,
                                            max_threads=max_threads, seed=seed, fast=fast,
                                            scan=scan, held=held if own_starts else 0)
        np.testing.assert_array_equal(ke[:end], e2)
        np.testing.assert_array_equal(kr[:end], r2)
        assert (ke[end:] == -7).all() and (kr[end:] == -7).all()
        for c, slots in enumerate(written):
            assert sorted(slots) == list(range(off[c * n_kv], off[(c + 1) * n_kv]))


@pytest.mark.parametrize("fast", [False, True])
def test_kernel_emulation_skips_idle_rounds(fast):
    """Starts with gaps (rounds in which no row is active, which the kernel skips to the
    earliest start of a pending row) and rows held back by the window meanwhile: the
    emulated kernel still gives the reference's entries and ranks bit for bit."""
    rng = np.random.default_rng(3)
    b, h_q, h_kv, n_q, n_kv, k_max = 1, 2, 2, 6, 12, 3
    idx, nums = _random_lists(rng, b, h_q, h_kv, n_q, n_kv, k_max, True)
    off, ent = _csr(idx, nums, h_kv, n_kv)
    n_rows = len(off) - 1
    for window, gaps in ((12, (0, 0, 9, 9, 30)), (2, (0, 7, 7, 40, 41)), (1, (5, 60))):
        starts = np.sort(rng.choice(gaps, n_rows)).astype(np.int64)
        e2, r2 = metadata.kq_schedule_order_reference(off, ent, starts, num_kv_blocks=n_kv,
                                                      window=window)
        ke, kr, _ = _kernel_emulation(off, ent, starts, n_kv=n_kv, n_tiles=n_q,
                                      e_cap=n_q * k_max, window=window, max_threads=4,
                                      seed=window, fast=fast)
        end = int(off[-1])
        np.testing.assert_array_equal(ke[:end], e2)
        np.testing.assert_array_equal(kr[:end], r2)


@pytest.mark.parametrize("fast", [False, True])
def test_kernel_emulation_clamps_stay_in_bounds(fast):
    """Chains past ``e_cap`` and tiles out of range: the kernel still terminates, touches
    shared memory only in bounds (the emulation asserts it) and writes each slot of its
    chain's first ``e_cap`` at most once, none outside. (Offsets that decrease, which
    ``build_kq_csr`` never gives, can leave a row whose entries other rows coloured
    unfinished, and with it, through the window rule, the loop.)"""
    rng = np.random.default_rng(5)
    n_kv, n_tiles = 9, 5
    for trial in range(6):
        lens = rng.integers(0, 7, 2 * n_kv)
        off = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
        ent = rng.integers(-3, n_tiles + 3, int(off[-1]) + 4)
        starts = rng.integers(0, 4, 2 * n_kv)
        e_cap = int(rng.integers(1, 30))
        _, _, written = _kernel_emulation(off, ent, starts, n_kv=n_kv, n_tiles=n_tiles,
                                          e_cap=e_cap, window=3, max_threads=4, seed=trial,
                                          fast=fast)
        for c, slots in enumerate(written):
            lo, hi = off[c * n_kv], off[(c + 1) * n_kv]
            assert sorted(slots) == list(range(lo, min(hi, lo + e_cap)))


def test_order_config_holds_every_chain(monkeypatch):
    """``det_order_config``'s ``e_cap`` holds every chain that ``build_kq_csr`` can build
    from sanitized metadata, also with repeated ids (out-of-range ids clipped by
    ``sanitize_bsa_metadata``) on its sort path, which keeps repeats; a chain past
    ``e_cap`` would leave slots of ``entries_out`` / ``ranks_out`` unwritten, which the
    backward reads."""
    from jax_sparse_attn import config as jc
    from jax_sparse_attn.ffi import bsa as fb

    b, h_q, h_kv, n_q, n_kv, k_max = 1, 2, 1, 4, 3, 8  # K_max > N_kv
    idx = np.full((b, h_q, n_q, k_max), -1, np.int32)  # clipped to block 0: repeats
    nums = np.full((b, h_q, n_q), k_max, np.int32)
    sidx, snums, _ = metadata.sanitize_bsa_metadata(jnp.asarray(idx), jnp.asarray(nums), None,
                                                    num_kv_blocks=n_kv, block_size=64)
    monkeypatch.setattr(metadata, "_DENSE_CSR_MAX_ELEMS", 0)  # the sort path
    off, _ = _csr(np.asarray(sidx), np.asarray(snums), h_kv, n_kv)

    class C:
        num_heads_q, num_heads_kv, num_q_blocks, num_kv_blocks = h_q, h_kv, n_q, n_kv
        bwd = fb.bwd_config(jnp.bfloat16, 128, 64, False, jc.Switches(bsa_bwd_ws="detsched"),
                            deterministic=True)

    C.k_max = k_max
    ocfg = fb.det_order_config(C)
    chain_counts = off[n_kv::n_kv] - off[:-1:n_kv]
    assert chain_counts.max() == h_q // h_kv * n_q * k_max
    assert chain_counts.max() <= ocfg.e_cap


def test_sched_fallback_warns():
    """Where the order kernel does not fit, the backward warns and uses the launch-group order;
    where it fits, or without the switch, no warning."""
    import types
    import warnings

    from jax_sparse_attn import config as jc
    from jax_sparse_attn.ffi import bsa as fb

    def cfg(ws, n_q, n_kv, k_max, h_q=16, h_kv=16):
        bwd = fb.bwd_config(jnp.bfloat16, 128, 64, False, jc.Switches(bsa_bwd_ws=ws),
                            deterministic=True)
        return types.SimpleNamespace(num_heads_q=h_q, num_heads_kv=h_kv, num_q_blocks=n_q,
                                     num_kv_blocks=n_kv, k_max=k_max, bwd=bwd)

    with pytest.warns(UserWarning, match="schedule order does not fit"):
        assert fb._det_order_or_warn(cfg("detsched", 2048, 2048, 256, 64, 16)) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert fb._det_order_or_warn(cfg("detsched", 256, 256, 32)) is not None
        # the ordered path's default (detorder: the fixed-point dQ is the default):
        # the schedule order where it fits and the heads are the KV heads, silently the
        # launch-group order elsewhere
        assert fb._det_order_or_warn(cfg("detorder", 256, 256, 32)).window == metadata.num_sms()
        assert fb._det_order_or_warn(cfg("detorder", 256, 256, 32, 16, 4)) is None
        assert fb._det_order_or_warn(cfg("detorder", 2048, 2048, 256, 16, 16)) is None
        assert fb._det_order_or_warn(cfg("detlaunch", 256, 256, 32)) is None
        assert fb._det_order_or_warn(cfg("detsched", 256, 256, 32, 16, 4)) is not None
