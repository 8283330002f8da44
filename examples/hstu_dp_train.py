"""Data-parallel training step of a small synthetic HSTU recommender on every local device.

Each device holds an equal token budget of whole user sequences (packed THD, per-shard
``cu_seqlens`` built by :func:`jax_sparse_attn.sharding.shard_cu_seqlens`); the parameters
are replicated; ``hstu_attention_sharded`` runs the attention shard-locally (no gather of
q/k/v) and ``jax.jit`` inserts only the gradient all-reduce. Next-item prediction with a
full softmax over the item vocabulary, optax Adam.

  python examples/hstu_dp_train.py --steps 20               # all local devices
  python examples/hstu_dp_train.py --bench --out run.json   # weak scaling: 1 device vs all

On CPU, ``XLA_FLAGS=--xla_force_host_platform_device_count=2`` gives two host devices.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jax_sparse_attn.sharding import assign_to_shards, hstu_attention_sharded, shard_cu_seqlens


def init_params(key, vocab, d_model, heads, head_dim):
    k1, k2, k3 = jax.random.split(key, 3)
    s = d_model ** -0.5
    return {
        "emb": jax.random.normal(k1, (vocab, d_model), jnp.float32) * s,
        "w_qkv": jax.random.normal(k2, (d_model, 3 * heads * head_dim), jnp.float32) * s,
        "w_o": jax.random.normal(k3, (heads * head_dim, d_model), jnp.float32)
        * (heads * head_dim) ** -0.5,
    }


def make_batch(rng, num_shards, tokens_per_shard, vocab, max_len):
    """Random user sequences packed into ``num_shards`` equal token budgets."""
    lengths, total = [], 0
    while total < num_shards * tokens_per_shard * 0.9:
        n = int(rng.integers(2, max_len + 1))
        lengths.append(n)
        total += n
    while True:
        try:
            order, per_shard = assign_to_shards(lengths, num_shards, tokens_per_shard)
            break
        except ValueError:
            lengths.pop()
    cu = shard_cu_seqlens(per_shard, tokens_per_shard)
    ids = rng.integers(1, vocab, size=(num_shards * tokens_per_shard,)).astype(np.int32)
    # target: the next item inside each sequence (0 = no target: last item and padding)
    tgt = np.zeros_like(ids)
    for s in range(num_shards):
        base = s * tokens_per_shard
        for b in range(cu.shape[1] - 1):
            lo, hi = base + cu[s, b], base + cu[s, b + 1]
            tgt[lo:hi - 1] = ids[lo + 1:hi]
        ids[base + cu[s, -1]: base + tokens_per_shard] = 0
    return ids, tgt, cu


def build_step(mesh, *, heads, head_dim, max_len, backend, dtype, lr=1e-3):
    import optax  # noqa: PLC0415

    opt = optax.adam(lr)

    def loss_fn(params, ids, tgt, cu):
        x = params["emb"][ids]
        qkv = (x @ params["w_qkv"]).reshape(x.shape[0], 3, heads, head_dim).astype(dtype)
        q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]
        att = hstu_attention_sharded(q, k, v, cu, cu, mesh=mesh, token_axis="data",
                                     max_seqlen_q=max_len, max_seqlen_k=max_len,
                                     alpha=1.0 / head_dim, backend=backend)
        h = x + att.reshape(x.shape[0], heads * head_dim).astype(jnp.float32) @ params["w_o"]
        logits = h @ params["emb"].T
        logp = jax.nn.log_softmax(logits)
        nll = -jnp.take_along_axis(logp, tgt[:, None], axis=1)[:, 0]
        w = (tgt > 0).astype(jnp.float32)
        return jnp.sum(nll * w) / jnp.maximum(jnp.sum(w), 1.0)

    @jax.jit
    def step(params, opt_state, ids, tgt, cu):
        loss, grads = jax.value_and_grad(loss_fn)(params, ids, tgt, cu)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return step, opt


def run(devices, *, steps, tokens_per_device, vocab=512, d_model=64, heads=2, head_dim=64,
        max_len=64, backend="auto", dtype=jnp.bfloat16, seed=0):
    """Train ``steps`` steps on ``devices``; returns losses, step times (s) and tokens/s."""
    mesh = Mesh(np.array(devices), ("data",))
    rep, tok = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
    step, opt = build_step(mesh, heads=heads, head_dim=head_dim, max_len=max_len,
                           backend=backend, dtype=dtype)
    params = jax.device_put(init_params(jax.random.PRNGKey(seed), vocab, d_model, heads,
                                        head_dim), rep)
    opt_state = jax.device_put(opt.init(params), rep)
    rng = np.random.default_rng(seed)
    losses, times = [], []
    for _ in range(steps):
        ids, tgt, cu = make_batch(rng, len(devices), tokens_per_device, vocab, max_len)
        ids, tgt, cu = (jax.device_put(a, tok) for a in (ids, tgt, cu))
        t0 = time.perf_counter()
        params, opt_state, loss = step(params, opt_state, ids, tgt, cu)
        loss = float(loss)
        times.append(time.perf_counter() - t0)
        losses.append(loss)
    warm = times[1:] or times
    return {"devices": len(devices), "losses": losses, "step_s": times,
            "tokens_per_s": len(devices) * tokens_per_device / float(np.median(warm))}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--tokens-per-device", type=int, default=8192)
    ap.add_argument("--backend", default="auto", choices=("auto", "kernel", "reference"))
    ap.add_argument("--bench", action="store_true",
                    help="also run on one device and report the weak-scaling efficiency")
    ap.add_argument("--out", default=None, help="write the results as JSON")
    args = ap.parse_args(argv)
    if args.steps < 1:
        ap.error(f"--steps must be at least 1, got {args.steps}")
    if args.tokens_per_device < 64:
        ap.error(f"--tokens-per-device must be at least 64 (the longest sequence of the random "
                 f"batches), got {args.tokens_per_device}")
    if args.backend == "kernel":
        from jax_sparse_attn import kernel_status  # noqa: PLC0415

        status = kernel_status()
        if status.backend != "kernel":
            ap.error(f"--backend kernel needs the CuTe DSL kernels, which cannot run here "
                     f"({status.reason}); use --backend auto or --backend reference")
    devs = jax.devices()
    res = {"all": run(devs, steps=args.steps, tokens_per_device=args.tokens_per_device,
                      backend=args.backend)}
    print(f"{len(devs)} device(s): loss {res['all']['losses'][0]:.4f} -> "
          f"{res['all']['losses'][-1]:.4f}, {res['all']['tokens_per_s']:.0f} tokens/s")
    if args.bench and len(devs) > 1:
        res["one"] = run(devs[:1], steps=args.steps, tokens_per_device=args.tokens_per_device,
                         backend=args.backend)
        eff = res["all"]["tokens_per_s"] / (len(devs) * res["one"]["tokens_per_s"])
        res["weak_scaling_efficiency"] = eff
        print(f"1 device: {res['one']['tokens_per_s']:.0f} tokens/s; weak scaling "
              f"{100 * eff:.1f}% of {len(devs)}x one device")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
    return res


if __name__ == "__main__":
    main()
