"""The named-barrier protocols of the block-sparse backward's consumer warpgroups and dQ
writer warp (``kernels/bsa_bwd_sm90_ws.py``), as a model checked over every interleaving.

Each participant is a list of barrier operations, written from the kernel's code: the two
consumer warpgroups (128 threads each), the writer warp (32) and the producer (which fills a
Q / dO stage once both warpgroups released the step that used it before). A named barrier
completes a generation when its arrivals reach the count given in the instruction; ``sync``
arrives and waits for that generation, ``arrive`` does not wait. The search visits every
reachable state and reports one where no participant can move before all are done
(a deadlock: on the GPU, a hang). The protocols modelled: the dQ writer with one hand-back
for both warpgroups (both compute half of D per step), ``dq_alt`` (warpgroup ``c % 2``
computes step ``c``'s whole dQ), the per-warpgroup hand-back ``wg_hand`` (the default) and
``dq_lag`` (warpgroup 0 computes its half of step ``c``'s dQ in step ``c + 1``); the version of
``dq_alt`` whose last hand-back went to the warpgroup of the next turn (it hung on the H200)
must be found to deadlock.

For ``wg_hand`` and ``dq_lag`` the model also follows the two dS^T buffers (step ``c`` in
buffer ``c % 2``, one half per warpgroup): a dQ GEMM of step ``c`` must find both halves of
its buffer holding step ``c``, and a warpgroup may overwrite its half only once both dQ
GEMMs of the step held there have read it. Barrier operations may carry the step they are
meant for; a generation whose arrivals name different steps is an error (two arrivals of
one warpgroup completing a generation meant for both).

Scope: blk 128 (two consumer warpgroups), not deterministic, with the dQ writer warp and its
staging tile (no ``dq_alias``, no ``decouple``). Abstractions: a warpgroup is one
participant (its four warps run the same operations); the K / V load (waited for once,
before the loop) and the epilogue's per-warpgroup barriers 8 / 9 are left out; barrier 7 is
the ``epi_smem`` epilogue's (both warpgroups). A run must also end with every barrier's
arrivals balanced, and all arrivals of one barrier generation must name the same count
(PTX leaves mixed counts undefined)."""

from __future__ import annotations

import pytest

def consumer_program(w, n, alt, last_to_next_turn=False, final_sync=True):
    ops = []
    for c in range(n):
        ops.append(("wait_load", c))
        if alt:
            bar = 1 if c % 2 == 0 else 6
            mine = c % 2 == w
            ops.append(("sync" if mine else "arrive", bar, 256, 128))
            if mine:
                if c > 0:
                    ops.append(("sync", 5, 160, 128))
                ops.append(("arrive", 2, 160, 128))
        else:
            ops.append(("sync", 1, 256, 128))
            if c > 0:
                ops.append(("sync", 5, 288, 128))
            ops.append(("arrive", 2, 288, 128))
        ops.append(("release", c))
    if alt:
        takes_last_hand_back = (n % 2 == w) if last_to_next_turn else (n % 2 != w)
        if n > 0 and takes_last_hand_back and final_sync:
            ops.append(("sync", 5, 160, 128))
    elif n > 0 and final_sync:
        ops.append(("sync", 5, 288, 128))
    ops.append(("sync", 7, 256, 128))
    return ops


def writer_program(n, alt):
    count = 160 if alt else 288
    ops = []
    for _ in range(n):
        ops += [("sync", 2, count, 32), ("arrive", 5, count, 32)]
    return ops


def producer_program(n, stages):
    """Step ``c`` fills stage ``c % stages``: from ``c = stages`` on, once both warpgroups
    released step ``c - stages`` (``SmemPipeline.producer_acquire``)."""
    return [("load", c, stages) for c in range(n)]


def find_deadlock(programs):
    """Depth-first search over all interleavings. Returns None, or what went wrong: a state
    where no participant can move before all are done, an arrival whose count differs from
    the generation's, or a run that ends with arrivals left on a barrier. The state: each
    participant's program counter and, while it waits in a ``sync``, the barrier generation
    it waits for; each barrier's arrivals, count and completed generations; the loaded and
    released steps."""
    start = (tuple(0 for _ in programs), tuple(None for _ in programs), (), (), (), (), (), ())
    seen = set()
    stack = [start]
    while stack:
        state = stack.pop()
        if state in seen:
            continue
        seen.add(state)
        pcs, waits, arrivals, gens, loaded, released, ds, reads = state
        arrivals, gens = dict(arrivals), dict(gens)
        loaded, released = set(loaded), dict(released)
        ds, reads = dict(ds), dict(reads)
        moved = False
        for i, prog in enumerate(programs):
            pc, wait = pcs[i], waits[i]
            if wait is not None:
                bar, gen = wait
                if gens.get(bar, 0) > gen:  # the generation completed: go on
                    succ = _with(pcs, i, pc + 1), _with(waits, i, None)
                    stack.append((*succ, *_pack(arrivals, gens, loaded, released, ds, reads)))
                    moved = True
                continue
            if pc == len(prog):
                continue
            op = prog[pc]
            a2, g2, l2, r2 = dict(arrivals), dict(gens), set(loaded), dict(released)
            d2, rd2 = dict(ds), dict(reads)
            new_wait = None
            step = 1
            if op[0] in ("sync", "arrive"):
                _, bar, count, threads, *tag = op
                have, first_count, first_tag = a2.get(bar, (0, count, None))
                if have and first_count != count:
                    return (f"barrier {bar}: count {count} where the generation has "
                            f"{first_count}, at {programs_str(pcs, programs)}")
                if have and tag and first_tag is not None and tag[0] != first_tag:
                    return (f"barrier {bar}: a generation of steps {first_tag} and {tag[0]} "
                            f"at {programs_str(pcs, programs)}")
                if not have:
                    first_tag = tag[0] if tag else None
                have += threads
                if have > count:
                    return f"barrier {bar} over its count {count} at {programs_str(pcs, programs)}"
                gen = g2.get(bar, 0)
                if have == count:
                    have = 0
                    g2[bar] = gen + 1
                a2[bar] = (have, count, first_tag)
                if op[0] == "sync":
                    new_wait, step = (bar, gen), 0
            elif op[0] == "wait_load":
                if op[1] not in l2:
                    continue
            elif op[0] == "write":
                # warpgroup `half` stores its dS^T half of step c into buffer c % 2
                _, half, c = op
                old = d2.get((c % 2, half))
                if old is not None and rd2.get(old, 0) < 2:
                    return (f"dS^T buffer {c % 2}: warpgroup {half} overwrites step {old} "
                            f"before both dQ GEMMs read it, at {programs_str(pcs, programs)}")
                d2[(c % 2, half)] = c
            elif op[0] == "read":
                # a dQ GEMM of step c reads both halves of buffer c % 2
                _, c = op
                held = (d2.get((c % 2, 0)), d2.get((c % 2, 1)))
                if held != (c, c):
                    return (f"dS^T buffer {c % 2}: a dQ GEMM of step {c} finds steps {held}, "
                            f"at {programs_str(pcs, programs)}")
                rd2[c] = rd2.get(c, 0) + 1
            elif op[0] == "release":
                r2[op[1]] = r2.get(op[1], 0) + 1
            elif op[0] == "load":
                _, c, stages = op
                if c >= stages and r2.get(c - stages, 0) < 2:
                    continue
                l2.add(c)
            succ = _with(pcs, i, pc + step), _with(waits, i, new_wait)
            stack.append((*succ, *_pack(a2, g2, l2, r2, d2, rd2)))
            moved = True
        done = all(pcs[i] == len(p) and waits[i] is None for i, p in enumerate(programs))
        if not moved and not done:
            return f"no participant can move at {programs_str(pcs, programs)}"
        left = {b: a for b, (a, _, _) in arrivals.items() if a}
        if done and left:
            return f"the run ends with arrivals left on barriers {left}"
    return None


def _with(t, i, v):
    return t[:i] + (v,) + t[i + 1:]


def _pack(arrivals, gens, loaded, released, ds=None, reads=None):
    return (tuple(sorted(arrivals.items())), tuple(sorted(gens.items())), tuple(sorted(loaded)),
            tuple(sorted(released.items())), tuple(sorted((ds or {}).items())),
            tuple(sorted((reads or {}).items())))


def programs_str(pcs, programs):
    names = ("warpgroup 0", "warpgroup 1", "writer", "producer")
    return "; ".join(f"{names[i] if i < len(names) else f'participant {i}'}: "
                     f"{p[pc] if pc < len(p) else 'done'}"
                     for i, (pc, p) in enumerate(zip(pcs, programs)))


def _programs(n, alt, last_to_next_turn=False, stages=2, final_sync=True):
    return [consumer_program(0, n, alt, last_to_next_turn, final_sync),
            consumer_program(1, n, alt, last_to_next_turn, final_sync),
            writer_program(n, alt), producer_program(n, stages)]


@pytest.mark.parametrize("stages", [2, 3, 4])
@pytest.mark.parametrize("n", range(7))
@pytest.mark.parametrize("alt", [False, True], ids=["writer", "dq_alt"])
def test_protocol_cannot_hang(n, alt, stages):
    assert find_deadlock(_programs(n, alt, stages=stages)) is None


@pytest.mark.parametrize("alt", [False, True], ids=["writer", "dq_alt"])
def test_a_missing_last_hand_back_is_found(alt):
    why = find_deadlock(_programs(3, alt, final_sync=False))
    assert why is not None and "arrivals left on barriers {5: 32}" in why


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_dq_alt_last_hand_back_to_the_next_turn_hangs(n):
    """The first ``dq_alt``: after the last step the warpgroup that did not compute it took
    the writer's last hand-back. With one step it is the only barrier-5 sync and works; from
    two steps on it can take the place of the other warpgroup's sync."""
    why = find_deadlock(_programs(n, True, last_to_next_turn=True))
    if n == 1:
        # one step: warpgroup 1's sync is the only one on barrier 5, it has nothing to displace
        assert why is None
    else:
        assert why is not None and "no participant can move" in why


def test_the_checker_finds_bad_counts():
    two = [[("arrive", 3, 64, 32), ("arrive", 3, 64, 32)], [], [], []]
    assert find_deadlock(two) is None  # 64 completes a generation
    progs = [[("arrive", 3, 64, 32), ("arrive", 3, 64, 32), ("arrive", 3, 64, 32)], [], [], []]
    assert "arrivals left on barriers {3: 32}" in find_deadlock(progs)
    progs = [[("arrive", 3, 96, 64), ("arrive", 3, 96, 64)], [], [], []]
    assert "over its count" in find_deadlock(progs)
    progs = [[("arrive", 3, 288, 32)], [("sync", 3, 160, 128)], [], []]
    why = find_deadlock(progs)  # either arrival may come first
    assert "count 160 where the generation has 288" in why or "count 288 where the generation has 160" in why


def hand_program(w, n, lag, order_first=False):
    """Consumer warpgroup ``w`` with the per-warpgroup hand-back (barriers 2 / 11 staged,
    5 / 10 handed back, 160 threads): ``lag`` False is the default (both warpgroups sync on
    barrier 1 after storing their dS^T halves and compute their dQ halves of the step);
    ``lag`` True is ``dq_lag``: warpgroup 0 syncs barrier 6 (warpgroup 1's previous half
    stored) before storing and arrives on barrier 1, warpgroup 1 syncs barrier 1 before
    storing and arrives on barrier 6 (then its own barrier 9), warpgroup 0 computes and stages
    step ``c - 1``'s half in step ``c`` and the last one after its last step.
    ``order_first``: a broken ``dq_lag`` where warpgroup 1 stores before its barrier-1 sync."""
    staged, back = (2, 5) if w == 0 else (11, 10)
    ops = []
    n_staged = 0
    for c in range(n):
        ops.append(("wait_load", c))
        if not lag:
            ops += [("write", w, c), ("sync", 1, 256, 128, c), ("read", c)]
            mine = c
        elif w == 0:
            if c > 0:
                ops.append(("sync", 6, 256, 128, c - 1))
            ops += [("write", 0, c), ("arrive", 1, 256, 128, c)]
            mine = c - 1
            if c > 0:
                ops.append(("read", c - 1))
        else:
            if order_first:
                ops += [("write", 1, c), ("sync", 1, 256, 128, c)]
            else:
                ops += [("sync", 1, 256, 128, c), ("write", 1, c)]
            ops += [("arrive", 6, 256, 128, c), ("sync", 9, 128, 128), ("read", c)]
            mine = c
        if mine >= 0:
            if n_staged > 0:
                ops.append(("sync", back, 160, 128))
            ops.append(("arrive", staged, 160, 128))
            n_staged += 1
        ops.append(("release", c))
    if lag and w == 0 and n > 0:
        ops += [("sync", 6, 256, 128, n - 1), ("read", n - 1)]
        if n_staged > 0:
            ops.append(("sync", back, 160, 128))
        ops.append(("arrive", staged, 160, 128))
        n_staged += 1
    if n_staged > 0:
        ops.append(("sync", back, 160, 128))
    ops.append(("sync", 7, 256, 128))
    return ops


def hand_writer_program(n, lag):
    """The writer warp with the per-warpgroup hand-back: per step the two halves in turn
    (``dq_lag``: warpgroup 1's first, as warpgroup 0 stages its half one step later)."""
    ops = []
    for _ in range(n):
        for w in ((1, 0) if lag else (0, 1)):
            staged, back = (2, 5) if w == 0 else (11, 10)
            ops += [("sync", staged, 160, 32), ("arrive", back, 160, 32)]
    return ops


def _hand_programs(n, lag, stages=3, order_first=False):
    return [hand_program(0, n, lag), hand_program(1, n, lag, order_first),
            hand_writer_program(n, lag), producer_program(n, stages)]


@pytest.mark.parametrize("stages", [2, 3])
@pytest.mark.parametrize("n", range(6))
@pytest.mark.parametrize("lag", [False, True], ids=["wg_hand", "dq_lag"])
def test_hand_back_protocols_cannot_hang_or_race(n, lag, stages):
    assert find_deadlock(_hand_programs(n, lag, stages)) is None


def test_dq_lag_store_before_the_sync_is_a_race():
    """Warpgroup 1 storing its dS^T half before it syncs with warpgroup 0's half of the step
    can overwrite a half that warpgroup 0's late dQ GEMM has not read yet."""
    why = find_deadlock(_hand_programs(3, True, order_first=True))
    assert why is not None and "before both dQ GEMMs read it" in why

