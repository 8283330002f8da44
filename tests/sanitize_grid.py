"""Garbage-metadata grid for compute-sanitizer: no metadata value may make a kernel read
or write out of bounds.

Run on the H200 from the repo root (after ``source .devcache/setup.sh``)::

    compute-sanitizer --tool memcheck --error-exitcode 9 python3 tests/sanitize_grid.py

Every case runs forward + backward of the public ops under ``jax.jit`` (so the eager
value checks cannot see the metadata) on ``backend="kernel"``, for every kernel
implementation (:class:`jax_sparse_attn.config.Switches`), with metadata the validators
would reject: BSA counts above K_max and negative, block ids past N_kv and negative,
block sizes negative and above the block size; HSTU cu_seqlens negative, decreasing and
past T (also with grouped KV heads); paged KV with page_indptrs negative, decreasing and past
the page table, cu_seqlens_k past the pages, page ids negative / past num_pages / huge in the
used slots and after each sequence's pages. The inputs are finite, so the outputs must be finite too (any value, since the
metadata are invalid). Exits non-zero if a case fails; compute-sanitizer reports the
memory errors (``--error-exitcode``). ``--quick`` runs one implementation per op.
"""

from __future__ import annotations

import argparse
import itertools
import sys

import jax
import jax.numpy as jnp
import numpy as np

from jax_sparse_attn import block_sparse_attention_forward, hstu_attention
from jax_sparse_attn.config import SWITCHES, Switches

BACKEND = "kernel"  # --backend reference: a CPU smoke run of the grid itself


def _allowed(field):
    return next(s.allowed for s in SWITCHES if s.field == field)


def _garbage_metadata(rng, B, H, rows, n, blk, kmax):
    """Block lists ``(B, H, rows, kmax)`` over ``n`` KV blocks with ids past N_kv and
    negative, counts above K_max and negative, and block sizes negative and above ``blk``."""
    idx = rng.integers(0, n, (B, H, rows, kmax)).astype(np.int32)
    idx[0, 0, 1, :] = [999, -5, 2]
    idx[0, 1, 3, :] = [-1, 7, 1 << 30]
    nums = np.full((B, H, rows), 2, np.int32)
    nums[0, 0, 2] = 50
    nums[0, 1, 5] = -7
    nums[0, 1, 6] = 0
    sizes = np.full((n,), blk, np.int32)
    sizes[1], sizes[2], sizes[3] = -3, 1000, 17
    return idx, nums, sizes


def bsa_cases(quick):
    B, H, S, D, blk, kmax = 1, 2, 512, 64, 64, 3
    n = S // blk
    idx, nums, sizes = _garbage_metadata(np.random.default_rng(0), B, H, n, n, blk, kmax)
    impls = list(itertools.product(_allowed("bsa_fwd_impl"), _allowed("bsa_bwd_impl")))
    # (D, block sizes, layout, H_kv) per implementation pair; D = 32 runs the sm80 kernels
    shapes = [(64, True, "bhsd", 1), (64, False, "bshd", 2), (128, True, "bshd", 2),
              (32, True, "bhsd", 2)]
    if quick:
        impls, shapes = impls[:1], shapes[:1]
    for (fwd, bwd), (d, use_sizes, layout, hkv) in itertools.product(impls, shapes):
        yield (f"bsa fwd={fwd} bwd={bwd} D={d} sizes={use_sizes} {layout} H_kv={hkv}",
               dict(B=B, H=H, hkv=hkv, S=S, D=d, blk=blk, idx=idx, nums=nums,
                    sizes=sizes if use_sizes else None, layout=layout,
                    switches=Switches(bsa_fwd_impl=fwd, bsa_bwd_impl=bwd)))
    # deterministic=True (the sm90ws backward with the fixed-point dQ, the default; repeated
    # ids in a row included), K->Q lists from both constructions
    for (d, use_sizes, layout, hkv), sort_csr in itertools.product(
            shapes[:1] if quick else shapes[:3], (False, True)):
        yield (f"bsa deterministic D={d} sizes={use_sizes} {layout} H_kv={hkv} "
               f"csr={'sort' if sort_csr else 'dense'}",
               dict(B=B, H=H, hkv=hkv, S=S, D=d, blk=blk, idx=idx, nums=nums,
                    sizes=sizes if use_sizes else None, layout=layout, switches=Switches(),
                    deterministic=True, sort_csr=sort_csr))
    # deterministic=True with fixed-point dQ (bsa_bwd_ws detfixed: per-row multipliers and
    # row flags beside the default mode's kernels) and with the order path's ordfast
    for (d, use_sizes, layout, hkv), ws in itertools.product(
            shapes[:1] if quick else shapes[:3], ("detfixed", "ordfast")):
        yield (f"bsa deterministic {ws} D={d} sizes={use_sizes} {layout} H_kv={hkv}",
               dict(B=B, H=H, hkv=hkv, S=S, D=d, blk=blk, idx=idx, nums=nums,
                    sizes=sizes if use_sizes else None, layout=layout,
                    switches=Switches(bsa_bwd_ws=ws), deterministic=True))


def _bsa_option_cases(quick):
    """pack_gqa (packed metadata rows), causal and kv_splits on the sm90 kernels, with the
    garbage metadata of :func:`bsa_cases`."""
    B, S, blk, kmax = 1, 512, 64, 3
    n = S // blk
    rng = np.random.default_rng(2)
    opts = [(64, 4, True, 1), (128, 2, False, 3), (64, 8, True, 3), (128, 1, True, 2)]
    for d, r, causal, splits in opts[:1] if quick else opts:
        hkv = 2
        rows = -(-S * r // blk)  # packed blocks (r = 1: unpacked query blocks)
        # metadata rows per (batch, KV head) when packed; r = 1: H_q = H_kv
        idx, nums, sizes = _garbage_metadata(rng, B, hkv, rows, n, blk, kmax)
        yield (f"bsa options D={d} pack_gqa r={r} causal={causal} kv_splits={splits}",
               dict(B=B, H=hkv * r, hkv=hkv, S=S, D=d, blk=blk, idx=idx, nums=nums,
                    sizes=sizes, layout="bshd" if r % 4 else "bhsd", switches=Switches(),
                    pack=r > 1, causal=causal, kv_splits=splits))


def run_bsa(c):
    from jax_sparse_attn import metadata

    # the sort construction of the K->Q lists (else the dense one at these sizes)
    metadata._DENSE_CSR_MAX_ELEMS = 0 if c.get("sort_csr") else 1 << 22
    rng = np.random.default_rng(1)
    shp = lambda h: (c["B"], h, c["S"], c["D"]) if c["layout"] == "bhsd" else (c["B"], c["S"], h, c["D"])  # noqa: E731
    q = jnp.asarray(rng.standard_normal(shp(c["H"])), jnp.bfloat16)
    k = jnp.asarray(rng.standard_normal(shp(c["hkv"])), jnp.bfloat16)
    v = jnp.asarray(rng.standard_normal(shp(c["hkv"])), jnp.bfloat16)
    idx, nums = jnp.asarray(c["idx"]), jnp.asarray(c["nums"])
    sizes = None if c["sizes"] is None else jnp.asarray(c["sizes"])

    @jax.jit
    def f(q, k, v, idx, nums, sizes):
        def loss(q, k, v):
            o, lse = block_sparse_attention_forward(
                q, k, v, idx, q2k_block_nums=nums, block_sizes=sizes,
                sparse_block_size=c["blk"], layout=c["layout"], allow_empty_block_nums=True,
                backend=BACKEND, switches=c["switches"],
                deterministic=c.get("deterministic", False), pack_gqa=c.get("pack", False),
                causal=c.get("causal", False), kv_splits=c.get("kv_splits", 1))
            return jnp.sum(o.astype(jnp.float32)) + jnp.sum(jnp.where(jnp.isfinite(lse), lse, 0))
        return jax.value_and_grad(loss, argnums=(0, 1, 2))(q, k, v)

    val, grads = jax.block_until_ready(f(q, k, v, idx, nums, sizes))
    return [val, *grads]


def hstu_cases(quick):
    T, H = 400, 2
    cus = {
        "negative": [0, -50, 250, 400],
        "decreasing": [0, 300, 200, 400],
        "past_T": [0, 100, 200, 999],
        "start_past_T": [500, 600, 700, 800],
        "huge": [0, 1 << 30, -(1 << 30), 400],
    }
    impls = _allowed("hstu_fwd_impl")
    windows = [(-1, 0), (-1, -1), (16, 0), (-1, 0), (3, 5)]
    if quick:
        impls = impls[:1]
    for impl in impls:
        for (name, cu), window in zip(cus.items(), windows):
            for d in ((64,) if quick else (64, 128)):
                yield (f"hstu fwd={impl} cu={name} D={d} window={window}",
                       dict(T=T, H=H, D=d, cu=np.asarray(cu, np.int32), window=window,
                            switches=Switches(hstu_fwd_impl=impl)))
    # the sm90ws forward with three consumer warpgroups (192-row tiles, hstu_fwd_ws wg3)
    for (name, cu), window in zip(cus.items(), windows) if not quick else ():
        yield (f"hstu fwd=sm90ws wg3 cu={name} D=64 window={window}",
               dict(T=T, H=H, D=64, cu=np.asarray(cu, np.int32), window=window,
                    switches=Switches(hstu_fwd_impl="sm90ws", hstu_fwd_ws=("wg3",))))
    # the non-default backwards of the hstu_bwd_impl switch on the same
    # garbage lengths
    for bwd in _allowed("hstu_bwd_impl")[1:] if not quick else ():
        for (name, cu), window in zip(cus.items(), windows):
            for d in (64, 128):
                yield (f"hstu bwd={bwd} cu={name} D={d} window={window}",
                       dict(T=T, H=H, D=d, cu=np.asarray(cu, np.int32), window=window,
                            switches=Switches(hstu_bwd_impl=bwd)))
    # the default backward at D = 256 (sm90: 64 x 64 tiles, head dim split between the
    # consumer warpgroups) on the same garbage lengths
    for (name, cu), window in zip(cus.items(), windows) if not quick else ():
        yield (f"hstu bwd=default cu={name} D=256 window={window}",
               dict(T=T, H=H, D=256, cu=np.asarray(cu, np.int32), window=window,
                    switches=Switches()))
    # relative attention bias (each forward with rab, alternating, and the backward writing
    # drab): rab rows and columns come from the garbage lengths; H_rab = 1 (fp32 drab
    # workspace with vector reductions) and H_rab = H (direct drab stores)
    all_impls = _allowed("hstu_fwd_impl")
    for i, ((name, cu), window) in enumerate(zip(cus.items(), windows)):
        rab_heads = 1 if i % 2 == 0 else H
        impl = all_impls[i % len(all_impls)]
        yield (f"hstu rab fwd={impl} H_rab={rab_heads} cu={name} D=64 window={window}",
               dict(T=T, H=H, D=64, cu=np.asarray(cu, np.int32), window=window,
                    switches=Switches(hstu_fwd_impl=impl), rab_heads=rab_heads))
    # the same at D 128, where the sm90 backward's steps inside the bias take the unclamped
    # path: the garbage lengths, then valid lengths with L_q > L_k and L_q < L_k
    cus128 = [(n, cu, cu) for n, cu in cus.items()]
    cus128.append(("q_gt_k_and_q_lt_k", [0, 190, 260, 400], [0, 120, 300, 400]))
    for i, (name, cu, cu_k) in enumerate(cus128):
        if quick and i:
            break
        rab_heads = 1 if i % 2 == 0 else H
        yield (f"hstu rab128 H_rab={rab_heads} cu={name} D=128 window={windows[i % 5]}",
               dict(T=T, H=H, D=128, cu=np.asarray(cu, np.int32),
                    cu_k=np.asarray(cu_k, np.int32), window=windows[i % 5],
                    switches=Switches(), rab_heads=rab_heads))
    # grouped KV heads (H = 4 query heads over H_kv = 2 / 1): sm90ws forward + sm90 backward
    for i, ((name, cu), window) in enumerate(zip(cus.items(), windows)):
        if quick and i:
            break
        yield (f"hstu gqa H=4 H_kv={2 - i % 2} cu={name} D=128 window={window}",
               dict(T=T, H=4, H_kv=2 - i % 2, D=128, cu=np.asarray(cu, np.int32),
                    window=window, switches=Switches()))
    # grouped KV heads with rab (sm90 backward with the bias): H_rab = 1 and H_rab = H
    for i, ((name, cu), window) in enumerate(zip(cus.items(), windows)):
        if quick and i:
            break
        yield (f"hstu gqa+rab H=4 H_kv=1 H_rab={1 + 3 * (i % 2)} cu={name} D=64 "
               f"window={window}",
               dict(T=T, H=4, H_kv=1, D=64, cu=np.asarray(cu, np.int32), window=window,
                    switches=Switches(), rab_heads=1 + 3 * (i % 2)))


def paged_cases(quick):
    """Paged-KV forward: garbage cu_seqlens_k / page_indptrs (negative, decreasing, past the
    page table) and garbage page ids (negative, past num_pages, huge) in the used slots and
    past each sequence's pages."""
    ptrs = {
        "valid": [0, 3, 5, 8],
        "negative": [0, -4, 5, 8],
        "decreasing": [0, 6, 2, 8],
        "past_P": [0, 3, 50, 1 << 30],
    }
    cu_ks = {"valid": [0, 300, 556, 900], "past_pages": [0, 2000, 1 << 30, -3]}
    ids = np.asarray([4, 0, 6, -1, 1 << 30, 2, 9, 7, 5, 3, -(1 << 30), 99], np.int32)
    items = list(itertools.product(ptrs.items(), cu_ks.items()))
    for (pn, ptr), (kn, cu_k) in items[:1] if quick else items:
        for d, h_kv in ((128, 2), (64, 1)) if not quick else ((128, 2),):
            yield (f"hstu paged ptr={pn} cu_k={kn} D={d} H_kv={h_kv}",
                   dict(ptr=np.asarray(ptr, np.int32), cu_k=np.asarray(cu_k, np.int32),
                        ids=ids, D=d, H_kv=h_kv))
    if not quick:
        # the producer's page-id prefetch (hstu_fwd_ws "pagepf") and the jnp metadata path
        for (pn, kn), ws, sched in ((("past_P", "past_pages"), ("pagepf",), "kernel"),
                                    (("decreasing", "valid"), ("pagepf",), "kernel"),
                                    (("past_P", "past_pages"), (), "xla")):
            yield (f"hstu paged {'+'.join(ws) or 'default'} schedule={sched} ptr={pn} "
                   f"cu_k={kn} D=128 H_kv=2",
                   dict(ptr=np.asarray(ptrs[pn], np.int32), cu_k=np.asarray(cu_ks[kn], np.int32),
                        ids=ids, D=128, H_kv=2,
                        switches=Switches(hstu_fwd_ws=ws, hstu_schedule=sched)))


def run_hstu_paged(c):
    rng = np.random.default_rng(3)
    n_pages, H, T_q = 10, 4, 40
    kv = jnp.asarray(rng.standard_normal((n_pages, 2, 128, c["H_kv"], c["D"])) * 0.3,
                     jnp.bfloat16)
    q = jnp.asarray(rng.standard_normal((T_q, H, c["D"])) * 0.3, jnp.bfloat16)
    cu_q = jnp.asarray([0, 7, 8, 40], jnp.int32)

    @jax.jit
    def f(q, kv, ids, ptr, cu_q, cu_k):
        return hstu_attention(q, None, None, cu_q, cu_k, max_seqlen_q=32, max_seqlen_k=1024,
                              paged_kv=kv, page_ids=ids, page_indptrs=ptr, backend=BACKEND,
                              switches=c.get("switches"))

    return [jax.block_until_ready(f(q, kv, jnp.asarray(c["ids"]), jnp.asarray(c["ptr"]), cu_q,
                                    jnp.asarray(c["cu_k"])))]


def run_hstu(c):
    rng = np.random.default_rng(2)
    q = jnp.asarray(rng.standard_normal((c["T"], c["H"], c["D"])) * 0.3, jnp.bfloat16)
    k, v = (jnp.asarray(rng.standard_normal((c["T"], c.get("H_kv", c["H"]), c["D"])) * 0.3,
                        jnp.bfloat16) for _ in range(2))
    cu = jnp.asarray(c["cu"])
    cu_k = jnp.asarray(c.get("cu_k", c["cu"]))
    rh = c.get("rab_heads", 0)
    rab = (jnp.asarray(rng.standard_normal((len(c["cu"]) - 1, rh, 200, 200)) * 0.3,
                       jnp.bfloat16) if rh else None)

    @jax.jit
    def f(q, k, v, cu, cu_k, rab):
        def loss(q, k, v, rab):
            o = hstu_attention(q, k, v, cu, cu_k, max_seqlen_q=200, max_seqlen_k=200,
                               window_size=c["window"], backend=BACKEND,
                               switches=c["switches"], rab=rab)
            return jnp.sum(o.astype(jnp.float32))
        return jax.value_and_grad(loss, argnums=(0, 1, 2, 3) if rh else (0, 1, 2))(q, k, v, rab)

    val, grads = jax.block_until_ready(f(q, k, v, cu, cu_k, rab))
    return [val, *grads]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="one implementation and shape per op")
    p.add_argument("--backend", default="kernel", choices=("kernel", "reference"))
    p.add_argument("--shard", default="0/1", help="i/n: run every n-th case starting at i")
    p.add_argument("--list", action="store_true", help="print the case names and exit")
    p.add_argument("--only", default="", help="run the cases whose name contains this text")
    args = p.parse_args(argv)
    try:
        shard_i, shard_n = (int(x) for x in args.shard.split("/"))
        if not 0 <= shard_i < shard_n:
            raise ValueError
    except ValueError:
        p.error(f"--shard must be i/n with 0 <= i < n, got {args.shard!r}")
    global BACKEND
    BACKEND = args.backend
    failed = 0
    cases = [(n, run_bsa, c) for n, c in bsa_cases(args.quick)]
    cases += [(n, run_bsa, c) for n, c in _bsa_option_cases(args.quick)]
    cases += [(n, run_hstu, c) for n, c in hstu_cases(args.quick)]
    cases += [(n, run_hstu_paged, c) for n, c in paged_cases(args.quick)]
    cases = [c for c in cases if args.only in c[0]][shard_i::shard_n]
    if args.list:
        print("\n".join(name for name, _, _ in cases))
        return 0
    for name, run, c in cases:
        try:
            outs = run(c)
            bad = [i for i, x in enumerate(outs) if not np.all(np.isfinite(np.asarray(x, np.float32)))]
            status = "ok" if not bad else f"NON-FINITE outputs {bad}"
            failed += bool(bad)
        except Exception as e:  # noqa: BLE001 (report every case, then fail)
            status = f"ERROR {type(e).__name__}: {str(e).splitlines()[0][:200]}"
            failed += 1
        print(f"{status:>8}  {name}", flush=True)
    print(f"sanitize_grid: {len(cases) - failed}/{len(cases)} cases ok", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
