"""The K->Q lists of the block-sparse backward built from a bitmap in the CSR rows' order
(``metadata._kq_csr_dense_rows``, the current construction) against the earlier transposed
bitmap (``metadata._kq_csr_dense``): per-kernel trace of the backward alone
(``scripts/gpu_trace.py`` cases) and the sustained ``bsa_bench`` backward rows, the two
constructions interleaved in one process.

    python scripts/kq_csr_ab.py --out kq_ab.json
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402

from benchmarks import bsa_bench  # noqa: E402
from jax_sparse_attn import metadata  # noqa: E402

import gpu_trace  # noqa: E402

_ROWS_NEW = metadata._kq_csr_dense_rows


def _rows_transposed(idx, active, group, n_kv_heads, n_kv):
    return metadata._kq_csr_dense(idx, active, group, n_kv_heads, n_kv, False)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="kq_ab.json")
    a = ap.parse_args()
    res = []
    for rnd in (1, 2):
        for name, impl in (("rows", _ROWS_NEW), ("transposed", _rows_transposed)):
            metadata._kq_csr_dense_rows = impl
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
