"""Constructions of the block-sparse backward's K->Q lists against each other, interleaved
in one process (two rounds): ``packed`` (the current one: the bitmap packed into 32-bit
words, each listed slot placed by popcounts, ``metadata._kq_csr_packed_rows``), ``rows`` (a
bitmap in the CSR rows' order with a running count over each row,
``metadata._kq_csr_dense_rows``), ``transposed`` (the earlier transposed bitmap,
``metadata._kq_csr_dense``), ``rows-offsets2`` (``rows`` with the offsets' running sum over
the R CSR rows taken in two levels, chunks of 32 then the chunk totals: XLA lowers a running
sum to a reduce-window whose work grows with the square of its length, and one fusion of the
blk-64 benchmark's lists, 4096 rows, takes 6 us). Per-kernel trace of the backward alone
(``scripts/gpu_trace.py`` cases) and the sustained ``bsa_bench`` backward rows.

    python scripts/kq_csr_ab.py --out kq_ab.json [--variants packed,rows,transposed,rows-offsets2]
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from benchmarks import bsa_bench  # noqa: E402
from jax_sparse_attn import metadata  # noqa: E402

import gpu_trace  # noqa: E402

_ROWS_NEW = metadata._kq_csr_dense_rows
_PACKED = metadata._kq_csr_packed_rows
_OFFSETS = metadata._offsets_of


def _rows_transposed(idx, active, group, n_kv_heads, n_kv):
    return metadata._kq_csr_dense(idx, active, group, n_kv_heads, n_kv, False)


def _offsets_two_level(counts, c=32):
    """``metadata._offsets_of`` with the running sum in chunks of ``c``, then the chunks'."""
    w = counts.shape[0]
    if w <= 2 * c:
        return _OFFSETS(counts)
    n = -(-w // c)
    y = jnp.cumsum(jnp.pad(counts, (0, n * c - w)).reshape(n, c), axis=-1, dtype=jnp.int32)
    tot = y[:, -1]
    run = (y + (jnp.cumsum(tot, dtype=jnp.int32) - tot)[:, None]).reshape(-1)[:w]
    return jnp.concatenate([jnp.zeros((1,), jnp.int32), run])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="kq_ab.json")
    ap.add_argument("--variants", default="packed,rows")
    ap.add_argument("--check", action="store_true",
                    help="only check that the variants build equal lists (CPU is enough)")
    a = ap.parse_args()
    impls = {"packed": (_PACKED, _OFFSETS), "rows": (_ROWS_NEW, _OFFSETS),
             "transposed": (_rows_transposed, _OFFSETS),
             "rows-offsets2": (_ROWS_NEW, _offsets_two_level)}
    names = a.variants.split(",")
    if a.check:
        idx = jax.random.randint(jax.random.PRNGKey(0), (2, 4, 300, 7), -1, 301)
        nums = jax.random.randint(jax.random.PRNGKey(1), (2, 4, 300), 0, 8)
        got = []
        for name in names:
            metadata._kq_csr_packed_rows, metadata._offsets_of = impls[name]
            got.append(metadata.build_kq_csr(idx, nums, num_kv_heads=2, num_kv_blocks=301))
        for name, (o, e) in zip(names, got):
            assert bool((o == got[0][0]).all()) and bool((e == got[0][1]).all()), name
        print("equal:", names)
        return
    res = []
    for rnd in (1, 2):
        for name in names:
            metadata._kq_csr_packed_rows, metadata._offsets_of = impls[name]
            jax.clear_caches()
            print(f"## round {rnd}: {name}", flush=True)
            for case in ("bsa_bwd_blk64", "bsa_bwd_blk128"):
                r = gpu_trace.trace_case(case, 10)
                res.append(dict(round=rnd, construction=name, **r))
            for r in bsa_bench.table([""], rows_sel=[0, 2, 3], pass_="bwd"):
                res.append(dict(round=rnd, construction=name, **r))
            with open(a.out, "w") as f:
                json.dump(res, f, indent=1, default=str)


if __name__ == "__main__":
    main()
