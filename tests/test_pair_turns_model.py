"""CPU: the turn protocol of two consumer warpgroups with work items of their own
(``kernels/pipeline.PairTurns``, the block-sparse forward's ``bsa_fwd_ws=pairwg``), checked
on a model over every interleaving.

Each warpgroup is one process (its 128 threads take the same branches: the flags they read
are stable while they read them). A named barrier of 256 threads is modelled by the number
of arrivals (``bar.arrive`` by the other warpgroup, or warpgroup 0's initial credit) not yet
matched by a ``bar.sync`` of its owner: a ``bar.sync`` blocks while there is none, and a
second pending arrival would complete the barrier without its owner (an error), as would an
arrival still pending when both warpgroups have exited. The model runs the protocol's four
operations as ``PairTurns`` does (``start``; per turn ``wait`` then ``pass_turn``;
``finish``), for every pair of turn counts up to 4 (0: a warpgroup with no work or only
empty items), and checks: no deadlock, no barrier over-arrival, no pending arrival at the
end, never both warpgroups holding the turn, and strict alternation of the GEMM turns while
both have turns left. A variant that reads the other's ``done`` flag before its
``bar.sync`` (outside the turn) must fail the check, so the checker can fail.
"""

from __future__ import annotations

import itertools

import pytest


def _program(w, turns, early_read=False):
    """Warpgroup ``w``'s operations: ``("start",)``, per turn ``("wait",)``, ``("gemm",)``,
    ``("pass",)``, then ``("finish",)``; each op is expanded by :func:`_step`."""
    return [("start",)] + [("wait",), ("gemm",), ("pass",)] * turns + [("finish",)]


def _explore(t0, t1, early_read=False):
    """Every reachable state of the two warpgroups running ``t0`` / ``t1`` turns; returns
    the list of violations found (empty: the protocol holds)."""
    progs = (_program(0, t0), _program(1, t1))
    # state: (pc0, sub0, pc1, sub1, arr0, arr1, done0, done1, mine0, mine1, hold0, hold1,
    #         last_gemm)
    init = (0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0, -1)
    seen = set()
    stack = [init]
    errors = []
    while stack:
        s = stack.pop()
        if s in seen:
            continue
        seen.add(s)
        moves = []
        for w in (0, 1):
            r = _step(s, w, progs[w], early_read)
            if r is None:
                continue
            if isinstance(r, str):
                errors.append((r, s, w))
                continue
            moves.append(r)
        if not moves:
            pc = (s[0], s[2])
            if pc != (len(progs[0]), len(progs[1])):
                errors.append(("deadlock", s, None))
            elif s[4] or s[5]:
                errors.append(("pending arrival at exit", s, None))
        stack.extend(moves)
    return errors


def _step(s, w, prog, early_read):
    """One atomic step of warpgroup ``w`` from state ``s``: the new state, None when it
    is blocked or done, or an error string."""
    (pc0, sub0, pc1, sub1, a0, a1, d0, d1, m0, m1, h0, h1, last) = s
    pc, sub = (pc0, sub0) if w == 0 else (pc1, sub1)
    if pc >= len(prog):
        return None
    arr = [a0, a1]
    done = [d0, d1]
    mine = [m0, m1]
    hold = [h0, h1]
    o = 1 - w
    op = prog[pc][0]
    nxt_pc, nxt_sub = pc + 1, 0

    def arrive(b):
        arr[b] += 1
        return "over-arrival" if arr[b] > 1 else None

    def take_turn():
        """The bar.sync on this warpgroup's barrier: "blocked" while no arrival is pending,
        else the turn is held (an error if the other holds it too)."""
        if arr[w] == 0:
            return "blocked"
        arr[w] -= 1
        hold[w] = 1
        return "both hold the turn" if hold[o] else None

    if op == "start":
        mine[w] = 1
        if w == 0:
            err = arrive(0)
            if err:
                return err
            # warpgroup 0 holds the first turn once it syncs
    elif op == "wait":
        if sub == 0:
            if early_read and done[o]:
                mine[w] = 0  # the faulty variant: decides outside the turn
            if not mine[w]:
                nxt_pc = pc + 1
            else:
                nxt_pc, nxt_sub = pc, 1
        else:  # sub 1: the bar.sync, then the read of the other's flag
            err = take_turn()
            if err:
                return None if err == "blocked" else err
            if done[o]:
                mine[w] = 0
    elif op == "gemm":
        if mine[w]:
            if not hold[w]:
                return "GEMM turn without holding it"
            if last == w and not done[o]:
                return "two turns in a row"
            last = w
    elif op == "pass":
        if mine[w]:
            hold[w] = 0
            err = arrive(o)
            if err:
                return err
    elif op == "finish":
        if sub == 0:
            if not mine[w]:
                nxt_pc = pc + 1
            else:
                nxt_pc, nxt_sub = pc, 1
        else:
            err = take_turn()
            if err:
                return None if err == "blocked" else err
            done[w] = 1
            if not done[o]:
                err = arrive(o)
                if err:
                    return err
            hold[w] = 0
    if w == 0:
        pc0, sub0 = nxt_pc, nxt_sub
    else:
        pc1, sub1 = nxt_pc, nxt_sub
    return (pc0, sub0, pc1, sub1, arr[0], arr[1], done[0], done[1], mine[0], mine[1],
            hold[0], hold[1], last)


@pytest.mark.parametrize("t0,t1", list(itertools.product(range(5), range(5))))
def test_pair_turns_protocol_holds(t0, t1):
    errors = _explore(t0, t1)
    assert not errors, errors[:3]


def test_pair_turns_model_catches_a_flag_read_outside_the_turn():
    """Reading the other warpgroup's ``done`` flag before the ``bar.sync`` (outside the
    turn) leaves the other's last hand-over pending at exit or skips a needed wait."""
    bad = [(t0, t1) for t0 in range(4) for t1 in range(4) if _explore(t0, t1, early_read=True)]
    assert bad, "the faulty variant passed every case"
