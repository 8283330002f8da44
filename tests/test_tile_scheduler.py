"""The persistent forwards' deal of work items (CPU, no kernel compile):
``tile_scheduler.snake_next`` (the alternating deal of ``SnakeLptScheduler``, the HSTU sm90ws
forward's default) hands every item to exactly one CTA, in increasing order per CTA, and
balances a longest-first list better than round robin (the model of
``benchmarks/hstu_deal_balance.py``)."""

from __future__ import annotations

import os

import pytest

# CuTe DSL reads its target arch when cutlass is first imported: set it before that
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

pytest.importorskip("cutlass")

from benchmarks.hstu_deal_balance import balance, item_costs  # noqa: E402
from jax_sparse_attn.kernels.tile_scheduler import snake_next  # noqa: E402


def _walk(c, g, n_work):
    t, out = c, []
    while t < n_work:
        out.append(t)
        t = snake_next(t, c, g)
    return out


@pytest.mark.parametrize("g,n_work", [(132, 1000), (132, 132), (132, 264), (132, 265),
                                      (5, 17), (1, 7), (3, 2), (7, 0), (132, 8192)])
def test_alternating_deal_is_a_partition(g, n_work):
    """Each item exactly once; a CTA's items increase (so the kernel's ``t < n_work`` test
    ends its walk); round k goes to CTAs 0..g-1 (k even) or g-1..0 (k odd)."""
    grid = min(g, n_work)  # the launch grid: at most one CTA per item
    seen = []
    for c in range(grid):
        items = _walk(c, grid, n_work)
        assert items == sorted(items)
        for t in items:
            k, r = divmod(t, grid)
            assert r == (c if k % 2 == 0 else grid - 1 - c), (c, t)
        seen += items
    assert sorted(seen) == list(range(n_work))


def test_alternating_deal_balances_a_longest_first_list():
    """B=8 L=4096 causal, 128 x 128 tiles, 4 heads, 132 CTAs: round robin leaves the lower
    CTAs about 11 % more work than the mean; the alternating deal is within 1 %."""
    costs = item_costs([4096] * 8, 128, 128, 4, 1.0)
    rr = balance(costs, 132, "round robin")
    alt = balance(costs, 132, "alternating")
    assert rr < 0.9 and alt > 0.99
    # jagged lengths: better, not perfect
    costs = item_costs([65, 4020, 1000, 513, 129, 2048, 77, 3000] * 4, 128, 128, 4, 1.0)
    assert balance(costs, 132, "alternating") > balance(costs, 132, "round robin")


def test_deal_balance_script_writes_its_json(tmp_path, monkeypatch, capsys):
    """benchmarks/hstu_deal_balance.py runs on CPU and records every shape and deal."""
    import json
    import sys

    from benchmarks import hstu_deal_balance

    out = tmp_path / "balance.json"
    monkeypatch.setattr(sys, "argv", ["hstu_deal_balance", "--out", str(out)])
    hstu_deal_balance.main()
    res = json.loads(out.read_text())["balance"]
    assert set(res) == set(hstu_deal_balance.CASES)
    for row in res.values():
        assert set(row) == {"round robin", "alternating", "dynamic"}
        assert all(0.5 < v <= 1.0 for v in row.values())
    assert "alternating" in capsys.readouterr().out
