"""The named-barrier protocols of the block-sparse backward's consumer warpgroups and dQ
writer warp (``kernels/bsa_bwd_sm90_ws.py``), as a model checked over every interleaving.

Each participant is a list of barrier operations, written from the kernel's code: the two
consumer warpgroups (128 threads each), the writer warp (32) and the producer (which fills a
Q / dO stage once both warpgroups released the step that used it before). A named barrier
completes a generation when its arrivals reach the count given in the instruction; ``sync``
arrives and waits for that generation, ``arrive`` does not wait. The search visits every
reachable state and reports one where no participant can move before all are done
(a deadlock: on the GPU, a hang). The protocols modelled: the default dQ writer (both
warpgroups compute half of D per step) and ``dq_alt`` (warpgroup ``c % 2`` computes step
``c``'s whole dQ); the version of ``dq_alt`` whose last hand-back went to the warpgroup of
the next turn (it hung on the H200) must be found to deadlock.

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
    start = (tuple(0 for _ in programs), tuple(None for _ in programs), (), (), (), ())
    seen = set()
    stack = [start]
    while stack:
        state = stack.pop()
        if state in seen:
            continue
        seen.add(state)
        pcs, waits, arrivals, gens, loaded, released = state
        arrivals, gens = dict(arrivals), dict(gens)
        loaded, released = set(loaded), dict(released)
        moved = False
        for i, prog in enumerate(programs):
            pc, wait = pcs[i], waits[i]
            if wait is not None:
                bar, gen = wait
                if gens.get(bar, 0) > gen:  # the generation completed: go on
                    succ = _with(pcs, i, pc + 1), _with(waits, i, None)
                    stack.append((*succ, *_pack(arrivals, gens, loaded, released)))
                    moved = True
                continue
            if pc == len(prog):
                continue
            op = prog[pc]
            a2, g2, l2, r2 = dict(arrivals), dict(gens), set(loaded), dict(released)
            new_wait = None
            step = 1
            if op[0] in ("sync", "arrive"):
                _, bar, count, threads = op
                have, first_count = a2.get(bar, (0, count))
                if have and first_count != count:
                    return (f"barrier {bar}: count {count} where the generation has "
                            f"{first_count}, at {programs_str(pcs, programs)}")
                have += threads
                if have > count:
                    return f"barrier {bar} over its count {count} at {programs_str(pcs, programs)}"
                gen = g2.get(bar, 0)
                if have == count:
                    have = 0
                    g2[bar] = gen + 1
                a2[bar] = (have, count)
                if op[0] == "sync":
                    new_wait, step = (bar, gen), 0
            elif op[0] == "wait_load":
                if op[1] not in l2:
                    continue
            elif op[0] == "release":
                r2[op[1]] = r2.get(op[1], 0) + 1
            elif op[0] == "load":
                _, c, stages = op
                if c >= stages and r2.get(c - stages, 0) < 2:
                    continue
                l2.add(c)
            succ = _with(pcs, i, pc + step), _with(waits, i, new_wait)
            stack.append((*succ, *_pack(a2, g2, l2, r2)))
            moved = True
        done = all(pcs[i] == len(p) and waits[i] is None for i, p in enumerate(programs))
        if not moved and not done:
            return f"no participant can move at {programs_str(pcs, programs)}"
        left = {b: a for b, (a, _) in arrivals.items() if a}
        if done and left:
            return f"the run ends with arrivals left on barriers {left}"
    return None


def _with(t, i, v):
    return t[:i] + (v,) + t[i + 1:]


def _pack(arrivals, gens, loaded, released):
    return (tuple(sorted(arrivals.items())), tuple(sorted(gens.items())), tuple(sorted(loaded)),
            tuple(sorted(released.items())))


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
