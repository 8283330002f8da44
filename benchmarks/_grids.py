"""Benchmark configurations, FLOP counts and input generation.

FLOP conventions (the kernel issues define them; every implementation of a configuration,
anchors included, is credited with the *same* effective FLOPs, so TFLOP/s columns compare
directly and a faster implementation always shows a larger number):

* HSTU forward: ``2 · pairs · (D + D_v)`` where ``pairs`` counts the (query, key) pairs
  the mask lets through, with the usual convention that a causal mask lets through
  ``L²/2`` pairs of a length-L sequence and a full mask ``L²``. With D = D_v this is
  ``2·Σ_b L_b²·H·D`` (causal) and twice that (full). Local windows count their pairs
  exactly. Backward = 2.5 × forward; forward+backward = 3.5 × forward.
* BSA forward: ``4 · D · Σ_{b,h,m} rows_m · keys_{b,h,m}`` where ``rows_m`` is the number of
  query rows in query block m and ``keys`` the number of key tokens its active KV blocks
  hold; for full blocks this is ``4·B·H_q·S_q·D·(selected keys per query)``.
  Backward = 2.5 × forward; forward+backward = 3.5 × forward.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

__all__ = [
    "HSTUConfig",
    "BSAConfig",
    "hstu_lengths",
    "hstu_pairs",
    "hstu_fwd_flops",
    "bsa_topk_index",
    "bsa_fwd_flops",
    "grid",
    "PASS_FLOP_FACTOR",
    "FLOORS",
    "floor_report",
]

PASS_FLOP_FACTOR = {"fwd": 1.0, "bwd": 2.5, "fwdbwd": 3.5}


# ----------------------------------------------------------------------------- HSTU
@dataclass(frozen=True)
class HSTUConfig:
    """One HSTU benchmark point. ``tokens`` is the target total T (sum of lengths)."""

    max_seqlen: int
    head_dim: int = 128
    heads: int = 4
    tokens: int = 32768
    # "uniform" (every sequence max_seqlen) | "jagged" (log-uniform) | "canonical" (the
    # canonical jagged batch of canonical_jagged_lengths(); tokens / seed unused)
    dist: str = "uniform"
    mask: str = "causal"  # "causal" | "full" | "local"
    window: tuple[int, int] = (-1, 0)
    dtype: str = "bfloat16"
    seed: int = 0

    @property
    def label(self) -> str:
        w = "" if self.mask != "local" else f"{self.window[0]},{self.window[1]}"
        return f"hstu D{self.head_dim} H{self.heads} {self.dist} {self.mask}{w} L{self.max_seqlen}"

    @property
    def series(self) -> str:
        """Plot series: everything but the sequence length."""
        w = "" if self.mask != "local" else f"({self.window[0]},{self.window[1]})"
        return f"D{self.head_dim} {self.dist} {self.mask}{w}"

    def as_dict(self) -> dict:
        return asdict(self)


def hstu_lengths(cfg: HSTUConfig) -> np.ndarray:
    """Sequence lengths of a configuration (deterministic in ``cfg.seed``).

    uniform: ``max(1, tokens // L)`` sequences of length L. jagged: lengths drawn
    log-uniformly from [min(16, L), L] until they sum to ``tokens`` (the first is L so that
    ``max_seqlen`` is attained), the last one trimmed.
    """
    L = cfg.max_seqlen
    if cfg.dist == "uniform":
        return np.full(max(1, cfg.tokens // L), L, dtype=np.int64)
    if cfg.dist == "canonical":
        return canonical_jagged_lengths()
    if cfg.dist != "jagged":
        raise ValueError(f"dist must be 'uniform', 'jagged' or 'canonical', got {cfg.dist!r}")
    rng = np.random.default_rng(cfg.seed)
    lo = min(16, L)
    lens = [L]
    total = L
    while total < cfg.tokens:
        x = int(round(math.exp(rng.uniform(math.log(lo), math.log(L)))))
        x = max(1, min(L, x, cfg.tokens - total))
        lens.append(x)
        total += x
    return np.asarray(lens, dtype=np.int64)


def canonical_jagged_lengths() -> np.ndarray:
    """The canonical jagged HSTU batch: 32 sequences, lengths ``clip(exp(U(ln 64, ln 4096)),
    64, 4096)`` drawn with ``numpy.random.default_rng(7)`` (T = 32100); measured at H=4, D=128,
    causal."""
    rng = np.random.default_rng(7)
    x = np.exp(rng.uniform(math.log(64), math.log(4096), size=32))
    return np.clip(x, 64, 4096).astype(np.int64)


def hstu_pairs(lengths: np.ndarray, window: tuple[int, int]) -> float:
    """Valid (query, key) pairs summed over sequences (L_q = L_k), FLOP convention above."""
    lengths = np.asarray(lengths, dtype=np.float64)
    left, right = window
    if left < 0 and right < 0:
        return float(np.sum(lengths**2))
    if left < 0 and right == 0:
        return float(np.sum(lengths**2) / 2.0)
    total = 0.0
    for L in lengths.astype(np.int64):
        i = np.arange(L, dtype=np.int64)
        lo = np.zeros_like(i) if left < 0 else np.maximum(0, i - left)
        hi = np.full_like(i, L - 1) if right < 0 else np.minimum(L - 1, i + right)
        total += float(np.sum(np.maximum(0, hi - lo + 1)))
    return total


def hstu_fwd_flops(lengths, heads: int, head_dim: int, window, head_dim_v: int | None = None) -> float:
    dv = head_dim if head_dim_v is None else head_dim_v
    return 2.0 * hstu_pairs(lengths, window) * heads * (head_dim + dv)


# ----------------------------------------------------------------------------- BSA
@dataclass(frozen=True)
class BSAConfig:
    """One block-sparse benchmark point (S_q = S_kv = ``seqlen``, fixed top-k per row)."""

    seqlen: int
    density: float = 0.125  # share of KV blocks each query block selects
    blk: int = 64
    heads_q: int = 16
    heads_kv: int = 16
    head_dim: int = 128
    batch: int = 1
    layout: str = "bhsd"
    dtype: str = "bfloat16"
    seed: int = 0

    @property
    def n_blocks(self) -> int:
        return -(-self.seqlen // self.blk)

    @property
    def topk(self) -> int:
        return max(1, min(self.n_blocks, int(round(self.density * self.n_blocks))))

    @property
    def label(self) -> str:
        return (
            f"bsa blk{self.blk} top{self.topk}/{self.n_blocks} H{self.heads_q}/{self.heads_kv} "
            f"D{self.head_dim} S{self.seqlen}"
        )

    @property
    def series(self) -> str:
        mode = "MHA" if self.heads_q == self.heads_kv else f"GQA{self.heads_q // self.heads_kv}"
        return f"blk{self.blk} {self.density:.1%} {mode} D{self.head_dim}"

    def as_dict(self) -> dict:
        d = asdict(self)
        d["topk"] = self.topk
        d["n_blocks"] = self.n_blocks
        return d


def bsa_topk_index(cfg: BSAConfig) -> np.ndarray:
    """Random top-k metadata: ``(B, H_q, N_q, topk) int32``, unique KV blocks per row."""
    rng = np.random.default_rng(cfg.seed)
    n = cfg.n_blocks
    keys = rng.random((cfg.batch, cfg.heads_q, n, n), dtype=np.float32)
    idx = np.argpartition(keys, cfg.topk - 1, axis=-1)[..., : cfg.topk]
    return np.sort(idx, axis=-1).astype(np.int32)


def bsa_fwd_flops(cfg: BSAConfig, index: np.ndarray, head_dim_v: int | None = None) -> float:
    """Effective forward FLOPs of a fixed-count (``topk``) pattern with full blocks."""
    dv = cfg.head_dim if head_dim_v is None else head_dim_v
    S, blk = cfg.seqlen, cfg.blk
    n = cfg.n_blocks
    rows = np.minimum(blk, S - np.arange(n) * blk).astype(np.float64)  # (N_q,)
    sizes = rows  # S_q = S_kv and full blocks: key block sizes equal query block sizes
    keys = sizes[index[..., : cfg.topk]].sum(-1)  # (B, H, N_q)
    return 2.0 * (cfg.head_dim + dv) * float(np.sum(keys * rows[None, None, :]))


# ----------------------------------------------------------------------------- floors
# The kernel issues' performance floors on the H200 (bf16, effective TFLOP/s), by label.
FLOORS = {
    # forward: the warp-specialized SM90 forward's floors (FBGEMM-level); backward: the first kernels' floor
    "hstu D128 H4 uniform causal L4096": {"fwd": 540.0, "bwd": 175.0},  # B=8
    "hstu D128 H4 uniform causal L1024": {"fwd": 330.0},  # B=32
    "hstu D128 H4 canonical causal L4096": {"fwd": 420.0},  # canonical jagged, T=32100
    "hstu D64 H4 uniform causal L4096": {"fwd": 400.0},  # B=8
    "hstu D256 H4 uniform causal L4096": {"fwd": 600.0},  # B=8
    "bsa blk64 top32/256 H16/16 D128 S16384": {"fwd": 310.0, "bwd": 230.0},  # the first BSA kernels' floors
    "bsa blk128 top16/128 H16/16 D128 S16384": {"fwd": 340.0},  # the first BSA kernels' floors
}


def floor_report(rows: list[dict]) -> list[dict]:
    """Kernel rows (bf16) of the floor shapes against the issues' floors."""
    out = []
    for r in rows:
        if r.get("impl") != "kernel" or r.get("config", {}).get("dtype") != "bfloat16":
            continue
        floor = FLOORS.get(r["label"], {}).get(r["pass"])
        if floor is None:
            continue
        got = r.get("tflops") if r.get("status") == "ok" else None
        out.append({"label": r["label"], "pass": r["pass"], "floor_tflops": floor, "tflops": got,
                    "meets": None if got is None else bool(got >= floor)})
    return out


# ----------------------------------------------------------------------------- grids
def _hstu_grid(name: str) -> list[HSTUConfig]:
    if name == "quick":
        return [  # the forward floor shapes: B=32 L=1024, B=8 L=4096 at D=64/128/256 (H=4),
            # and the canonical jagged batch
            HSTUConfig(max_seqlen=1024, head_dim=128),
            HSTUConfig(max_seqlen=4096, head_dim=128),
            HSTUConfig(max_seqlen=4096, head_dim=128, dist="canonical"),
            HSTUConfig(max_seqlen=4096, head_dim=64),
            HSTUConfig(max_seqlen=4096, head_dim=256),
        ]
    if name == "full":
        out = []
        for d in (64, 128, 256):
            for dist in ("uniform", "jagged"):
                for mask, window in (("causal", (-1, 0)), ("local", (256, 0))):
                    for L in (512, 1024, 2048, 4096, 8192):
                        out.append(HSTUConfig(L, head_dim=d, dist=dist, mask=mask, window=window))
        return out
    if name == "tiny":  # CPU smoke test
        return [
            HSTUConfig(max_seqlen=32, head_dim=32, heads=2, tokens=64),
            HSTUConfig(max_seqlen=64, head_dim=32, heads=2, tokens=128, dist="jagged"),
            HSTUConfig(max_seqlen=64, head_dim=32, heads=2, tokens=128, mask="local", window=(8, 0)),
        ]
    raise ValueError(f"grid must be 'quick', 'full' or 'tiny', got {name!r}")


def _bsa_grid(name: str) -> list[BSAConfig]:
    if name == "quick":
        return [
            BSAConfig(16384, density=0.125, blk=64),  # the BSA floor shape: top-32 of 256
            BSAConfig(16384, density=0.125, blk=128),  # top-16 of 128
            BSAConfig(16384, density=0.125, blk=64, heads_kv=4),  # GQA 4
        ]
    if name == "full":
        out = []
        for blk in (64, 128):
            for hkv in (16, 4):
                for density in (0.05, 0.125, 0.25, 0.5):
                    for S in (4096, 8192, 16384, 32768):
                        out.append(BSAConfig(S, density=density, blk=blk, heads_kv=hkv))
        return out
    if name == "tiny":
        return [
            BSAConfig(128, density=0.5, blk=64, heads_q=2, heads_kv=2, head_dim=32),
            BSAConfig(256, density=0.25, blk=64, heads_q=4, heads_kv=2, head_dim=32),
        ]
    raise ValueError(f"grid must be 'quick', 'full' or 'tiny', got {name!r}")


def grid(op: str, name: str) -> list:
    """The configurations of ``op`` ('hstu' | 'bsa') in grid ``name`` ('quick' | 'full' | 'tiny')."""
    if op == "hstu":
        return _hstu_grid(name)
    if op == "bsa":
        return _bsa_grid(name)
    raise ValueError(f"op must be 'hstu' or 'bsa', got {op!r}")
