"""The work items of a backward whose long K->Q lists are split across CTAs in buckets
(``metadata.kq_bucket_items``): every entry of every row in exactly one item, the buckets'
ranges and workspace slots, the longest-first order, the static bounds, and the numpy
definition."""

import numpy as np
import pytest

jnp = pytest.importorskip("jax.numpy")

from jax_sparse_attn import metadata as md  # noqa: E402


def _offsets(counts):
    return np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)


def _items(counts, n_kv, n, extra):
    off = _offsets(counts)
    got = np.asarray(md.kq_bucket_items(jnp.asarray(off), num_kv_blocks=n_kv,
                                        bucket_entries=n, max_extra=extra))
    ref = md.kq_bucket_items_reference(off, num_kv_blocks=n_kv, bucket_entries=n,
                                       max_extra=extra)
    np.testing.assert_array_equal(got, ref)
    return off, got


@pytest.mark.parametrize("seed", range(6))
def test_items_cover_every_entry_once(seed):
    rng = np.random.default_rng(seed)
    n_kv, pairs, n = int(rng.integers(1, 9)), int(rng.integers(1, 4)), int(rng.integers(1, 7))
    counts = rng.integers(0, 30, size=pairs * n_kv)
    counts[rng.random(counts.size) < 0.2] = 0
    counts[0] = 3 * n + 1  # one long row
    # enough extra items for every pair, or (odd seeds) fewer: such a pair is not split
    need = int(counts.reshape(pairs, n_kv).sum(1).max()) // n
    extra = need if seed % 2 == 0 else int(rng.integers(0, need + 1))
    off, items = _items(counts, n_kv, n, extra)
    assert items.shape == (pairs, n_kv + extra, 6)
    row, begin, cnt, slot, first, nb = np.moveaxis(items, -1, 0)
    seen = np.zeros(off[-1], np.int32)
    for p in range(pairs):
        slots = []
        pair_counts = counts[p * n_kv:(p + 1) * n_kv]
        pair_split = (np.where(pair_counts > n, -(-pair_counts // n), 1) - 1).sum() <= extra
        used = row[p] >= 0
        # longest first, unused items last (zero entries, no slot)
        assert (np.diff(cnt[p][used]) <= 0).all()
        assert used[:used.sum()].all() and (cnt[p][~used] == 0).all()
        assert (slot[p][~used] == -1).all() and (nb[p][~used] == 0).all()
        # each row of the pair appears (an empty row too), in its own chain
        assert set(row[p][used].tolist()) == set(range(p * n_kv, (p + 1) * n_kv))
        for i in np.flatnonzero(used):
            r = row[p, i]
            length = off[r + 1] - off[r]
            assert off[r] <= begin[p, i] and begin[p, i] + cnt[p, i] <= off[r + 1]
            seen[begin[p, i]:begin[p, i] + cnt[p, i]] += 1
            if length > n and pair_split:
                assert nb[p, i] == -(-length // n) and cnt[p, i] <= n
                assert length // nb[p, i] <= cnt[p, i] <= -(-length // nb[p, i])
                assert first[p, i] <= slot[p, i] < first[p, i] + nb[p, i]
                slots.append(slot[p, i])
            else:
                assert nb[p, i] == 1 and cnt[p, i] == length and slot[p, i] == first[p, i] == -1
        # the pair's slots: distinct, consecutive from the start of its own range
        base = 2 * p * extra
        assert sorted(slots) == list(range(base, base + len(slots)))
        assert len(slots) <= 2 * extra
    np.testing.assert_array_equal(seen, 1)


def test_buckets_are_balanced_and_ordered():
    """A row of 10 entries with buckets of at most 4: three buckets of 4, 3 and 3 entries in
    row order, slots 0..2 (the first split row); a row of 5: two buckets of 3 and 2, slots
    3..4; the empty row one item of no entries; items longest first, ties in row order. With
    one extra item fewer than the rows need, the pair is not split."""
    off, items = _items(np.array([2, 10, 0, 5]), 4, 4, 4)
    row, begin, cnt, slot, first, nb = np.moveaxis(items[0], -1, 0)
    assert row.tolist() == [1, 1, 1, 3, 0, 3, 2, -1]
    assert cnt.tolist() == [4, 3, 3, 3, 2, 2, 0, 0]
    assert slot.tolist() == [0, 1, 2, 3, -1, 4, -1, -1]
    one = {int(slot[i]): (int(begin[i]), int(cnt[i])) for i in range(8) if row[i] == 1}
    assert one == {0: (2, 4), 1: (6, 3), 2: (9, 3)}
    assert set(first[row == 1].tolist()) == {0} and set(first[row == 3].tolist()) == {3}
    assert (nb[row == 1] == 3).all() and (nb[row == 3] == 2).all() and nb[row == 0] == 1


    _, whole = _items(np.array([2, 10, 0, 5]), 4, 4, 2)
    assert whole[0, :, 0].tolist() == [1, 3, 0, 2, -1, -1]
    assert (whole[0, :4, 5] == 1).all() and (whole[0, :, 3] == -1).all()


def test_bucket_items_long_rows_and_many_pairs():
    """A row of 70000 entries in buckets of 1 (products of its length and bucket index
    would leave int32), and pairs after it keep their own slot ranges."""
    counts = np.array([70000, 3, 5, 0, 9, 2])
    off, items = _items(counts, 2, 1, 70010)
    assert items.shape == (3, 70012, 6)
    first = items[0][items[0, :, 0] == 0]
    assert len(first) == 70000 and (first[:, 2] == 1).all()
    assert sorted(first[:, 1].tolist()) == list(range(70000))
    later = items[2][items[2, :, 3] >= 0, 3]
    assert sorted(later.tolist()) == list(range(4 * 70010, 4 * 70010 + 11))


def test_bucket_items_errors():
    off = jnp.asarray(_offsets([1, 2, 3, 4]))
    for kw in (dict(num_kv_blocks=0), dict(bucket_entries=0), dict(max_extra=-1),
               dict(num_kv_blocks=3), dict(bucket_entries=2.0), dict(bucket_entries=2**31)):
        args = dict(num_kv_blocks=2, bucket_entries=2, max_extra=1) | kw
        with pytest.raises(ValueError, match="kq_bucket_items"):
            md.kq_bucket_items(off, **args)
