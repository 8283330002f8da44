"""Static configuration: the implementation switches and the per-op configs.

Two kinds of frozen (hashable) dataclasses live here:

* :class:`Switches`: which kernel implementation and tiles the kernel backend uses. The
  public ops take ``switches=`` (default :func:`from_env`, which reads the
  ``JAX_SPARSE_ATTN_*`` environment variables listed in :data:`SWITCHES` and validates
  every value). Switches only matter on the kernel backend; the reference backend
  computes the same without them (the ``JAX_SPARSE_ATTN_*`` variables are still read and
  validated on every call, so an invalid value raises ``ValueError`` there too).
* :class:`HSTUConfig` / :class:`BSAConfig`: everything static about one call of an op,
  built once by the public layer (``hstu.py`` / ``bsa.py``) from the validated
  arguments and the switches, and passed as the ``custom_vjp`` non-differentiable
  argument to the backend. On the kernel backend they carry the kernel compile keys of
  each pass (``fwd``, ``bwd``, ``pre``): frozen dataclasses of static kernel properties
  only (dtype, head dims, tiles, implementation, presence flags), derived in
  ``ffi/hstu.py`` / ``ffi/bsa.py``. Runtime values (alpha, window sizes, scalings,
  lengths) stay out of those keys.

Adding an implementation (e.g. a new HSTU forward kernel) is one entry in
the ``allowed`` tuple of its :data:`SWITCHES` row (the first entry is the default) plus
the branch that builds the kernel in the ffi adapter; docs/design.md lists the switches
in one table (:func:`switches_table`).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping

__all__ = [
    "Switch",
    "SWITCHES",
    "Switches",
    "from_env",
    "force_kernel",
    "HSTUConfig",
    "BSAConfig",
]

_TRUE = ("1", "true")
_FALSE = ("0", "false")


def _parse_choice(allowed):
    def parse(var, raw):
        if raw not in allowed:
            raise ValueError(f"{var}={raw!r} is not one of the allowed values {allowed}")
        return raw

    return parse


def _parse_bool(var, raw):
    low = raw.lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise ValueError(f"{var}={raw!r} is not one of the allowed values {_TRUE + _FALSE}")


def _parse_count(var, raw):
    try:
        n = int(raw)
    except ValueError:
        n = -1
    if n < 0 or str(n) != raw.strip():
        raise ValueError(f"{var}={raw!r} is not allowed: give a non-negative integer")
    return n


def _parse_option_list(flags, key, key_ok, allowed):
    """Parser of a comma list of ``flags`` and ``key=N`` (``N`` a plain non-negative decimal
    with ``key_ok(N)``; ``key`` may also be a dict ``{key: key_ok}`` of several such
    options, ``key_ok`` then ``None``), each at most once, returned as a tuple in the given
    order; ``allowed`` describes the values in the error messages."""
    keys = key if isinstance(key, dict) else {key: key_ok}

    def parse(var, raw):
        opts = tuple(o.strip() for o in raw.split(",") if o.strip())
        for o in opts:
            ok = o in flags
            for name, name_ok in keys.items():
                if o.startswith(name + "="):
                    n = o[len(name) + 1:]
                    ok = n.isdigit() and str(int(n)) == n and name_ok(int(n))
            if not ok:
                raise ValueError(f"{var}={raw!r}: {o!r} is not allowed; allowed: {allowed}")
        names = [o.split("=")[0] for o in opts]
        if len(set(names)) != len(names):
            raise ValueError(f"{var}={raw!r} names an option twice; allowed: {allowed}")
        return opts

    return parse


#: the flags of the sm90ws forward's tuning switch (JAX_SPARSE_ATTN_HSTU_WS); ``bn=N`` is
#: the fifth entry
WS_FLAGS = ("nooverlap", "nopingpong", "q1", "silu16", "tanh16", "pagepf", "qalias",
            "cross", "crossepi", "vlag", "headouter", "roundrobin", "dynamic", "static", "qscale",
            "noqscale", "wg3", "wg2", "plate", "splitwait", "epivec", "noepivec", "tmao",
            "notmao", "rabpf")
_WS_ALLOWED = ("comma list of " + ", ".join(WS_FLAGS)
               + ", bn=N (block_n: a multiple of 16 in 16..256), chunk=N (KiB of K / V per "
               "sequence chunk of the tile schedule: 0..1048576, 0 = off)")
_parse_ws_opts = _parse_option_list(WS_FLAGS, {"bn": lambda n: n % 16 == 0 and 16 <= n <= 256,
                                               "chunk": lambda n: 0 <= n <= 1 << 20},
                                    None, _WS_ALLOWED)


def _parse_ws(var, raw):
    """Parser of JAX_SPARSE_ATTN_HSTU_WS: :data:`WS_FLAGS`, ``bn=N`` and ``chunk=N``; the
    deal flags ``dynamic`` and ``static`` / ``roundrobin`` exclude each other, and so do
    ``qscale`` and ``noqscale``, ``wg3`` and ``wg2``, ``epivec`` and ``noepivec``, ``tmao``
    and ``noepivec``, ``tmao`` and ``notmao``."""
    opts = _parse_ws_opts(var, raw)
    if "dynamic" in opts and ("static" in opts or "roundrobin" in opts):
        raise ValueError(f"{var}={raw!r}: 'dynamic' cannot be combined with 'static' or "
                         f"'roundrobin' (the static deals); allowed: {_WS_ALLOWED}")
    if "wg3" in opts and "wg2" in opts:
        raise ValueError(f"{var}={raw!r}: 'wg3' and 'wg2' exclude each other; "
                         f"allowed: {_WS_ALLOWED}")
    if "qscale" in opts and "noqscale" in opts:
        raise ValueError(f"{var}={raw!r}: 'qscale' and 'noqscale' exclude each other; "
                         f"allowed: {_WS_ALLOWED}")
    for a, b in (("epivec", "noepivec"), ("tmao", "noepivec"), ("tmao", "notmao")):
        if a in opts and b in opts:
            raise ValueError(f"{var}={raw!r}: {a!r} and {b!r} exclude each other; "
                             f"allowed: {_WS_ALLOWED}")
    return opts

#: the flags of the sm90ws BSA forward's tuning switch (JAX_SPARSE_ATTN_BSA_WS), plus
#: ``stages=N`` (at most N K/V stages, 2..8), ``skipload=N`` (2..64) and ``mix=N`` (1..8)
BSA_WS_FLAGS = ("nooverlap", "nopingpong", "q1", "headinner", "lazyrescale", "ctas2", "oalias",
                "cross", "crossepi", "vlag", "splitwait", "nosplitwait", "qregs", "mpre", "qahead", "noepivec",
                "streamk", "tmao", "notmao", "tmaopack", "notmaopack", "ctas3k1", "selfload",
                "pairwg", "l2hint", "l2normal", "oinq", "nooinq", "oearly", "sumtree", "xlaclamp", "half", "half2", "sn64", "nosm", "kdeep", "pairstep", "pairstep4", "pairstepk3", "pairstepk4", "kvwarps", "pairbox", "sortlists", "wgrelease")
_BSA_WS_ALLOWED = ("comma list of " + ", ".join(BSA_WS_FLAGS)
                   + ", stages=N (most K/V shared-memory stages: 2..8), skipload=N (timing "
                   "ablation, wrong results: 2..64), mix=N (PV K steps among the S GEMM's: "
                   "1..8); at most one of "
                   "splitwait, nosplitwait; tmao and tmaopack exclude notmao and noepivec, "
                   "tmaopack excludes notmaopack, l2hint excludes l2normal, oinq excludes "
                   "nooinq")
_parse_bsa_ws_opts = _parse_option_list(BSA_WS_FLAGS, {"stages": lambda n: 2 <= n <= 8,
                                                       "skipload": lambda n: 2 <= n <= 64,
                                                       "mix": lambda n: 1 <= n <= 8},
                                        None, _BSA_WS_ALLOWED)


def _parse_bsa_ws(var, raw):
    """Parser of JAX_SPARSE_ATTN_BSA_WS: :data:`BSA_WS_FLAGS`, ``stages=N``, ``skipload=N``
    and ``mix=N``;
    ``splitwait`` and ``nosplitwait`` exclude each other, and so do ``tmao`` and
    ``tmaopack`` with ``notmao`` and with ``noepivec``, ``tmaopack`` with
    ``notmaopack``, and ``l2hint`` with ``l2normal``; ``streamk`` excludes the chained-item and prefetch flags."""
    opts = _parse_bsa_ws_opts(var, raw)
    for a, b in (("splitwait", "nosplitwait"), ("tmao", "notmao"), ("tmao", "noepivec"),
                 ("tmaopack", "notmao"), ("tmaopack", "noepivec"),
                 ("tmaopack", "notmaopack"), ("l2hint", "l2normal"), ("oinq", "nooinq")):
        if a in opts and b in opts:
            raise ValueError(f"{var}={raw!r}: {a!r} and {b!r} exclude each other; "
                             f"allowed: {_BSA_WS_ALLOWED}")
    clash = [o for o in ("cross", "crossepi", "mpre", "qahead") if o in opts]
    if "streamk" in opts and clash:
        raise ValueError(f"{var}={raw!r}: 'streamk' cannot be combined with {clash[0]!r} "
                         f"(cross, crossepi, mpre, qahead); allowed: {_BSA_WS_ALLOWED}")
    return opts

#: the flags of the sm90 HSTU backward's tuning switch (JAX_SPARSE_ATTN_HSTU_BWD_WS)
HSTU_BWD_WS_FLAGS = ("splitwait", "epi16", "detzero", "dqclaim", "xlazero", "wgskip",
                     "revheads", "epiregs", "thrfrags", "wghand", "rabsm80", "norabfast",
                     "norabpf", "drabpf", "nodrabs", "rabpf2", "rabfast64", "qprobe")
_HSTU_BWD_WS_ALLOWED = ("comma list of " + ", ".join(HSTU_BWD_WS_FLAGS)
                        + ", convert=N (query rows: 1..65536), chunk=N (KiB: 0..1048576)")
_parse_hstu_bwd_ws = _parse_option_list(HSTU_BWD_WS_FLAGS,
                                        {"convert": lambda n: 1 <= n <= 65536,
                                         "chunk": lambda n: 0 <= n <= 1 << 20}, None,
                                        _HSTU_BWD_WS_ALLOWED)

#: the flags of the sm90ws BSA backward's tuning switch (JAX_SPARSE_ATTN_BSA_BWD_WS), plus
#: ``stages=N`` (at most N Q / dO stages, 2..4)
BSA_BWD_WS_FLAGS = ("ldwait", "lpt", "decouple", "detkv", "detfull", "detlaunch", "dqalias",
                    "dqearly", "lselate", "splitwait", "epi16", "epiregs", "dqalt", "detsched",
                    "detschedfull", "relaxpoll", "detstream", "nodetstream",
                    "detoverlap", "detzero", "packws", "nopackws", "dqclaim", "zerolag",
                    "tailconv", "notailconv", "hlpt", "nolpt", "persist",
                    "nokvpf", "ordfast", "detfixed", "detorder", "l2hint", "l2normal",
                    "thrfrags", "wghand", "nowghand", "ldscale", "dvwait", "dklag", "sahead",
                    "redv4", "fdiv", "nofdiv", "qprobe",
                    "noqprobe", "entahead", "dqlag", "nodqlag", "wguni",
                    "nowguni", "mult1p", "nomult1p", "autobuckets", "nobuckets")
#: the flags among :data:`BSA_BWD_WS_FLAGS` that choose the deterministic dQ order (at most
#: one of them)
BSA_DET_ORDER_FLAGS = ("detkv", "detfull", "detlaunch", "detsched", "detschedfull")
_BSA_BWD_WS_ALLOWED = ("comma list of " + ", ".join(BSA_BWD_WS_FLAGS)
                       + ", stages=N (most Q / dO shared-memory stages: 2..4), dqslots=N "
                       "(deterministic: fp32 accumulators per query tile, 1..4), persistkv=N "
                       "(persist: Q / dO stages issued before an item's K / V, 0..3), stamp=N "
                       "(diagnostic, not with persist: each consumer warpgroup of CTAs 0..15 prints "
                       "the SM clock at fixed points of its step N, 0..1048576), ordscan=N "
                       "(deterministic schedule order: entries a proposal scan checks at once, "
                       "1..16), ex2emu=N (of every 8 score columns of a consumer thread, N "
                       "take exp2 as a polynomial on the FMA pipes instead of the MUFU unit, "
                       "0..8; relative error 1.02e-4), fixemu=N (deterministic fixed-point "
                       "dQ: of every 8 dQ values of a consumer thread, N converted to int32 "
                       "by float additions instead of a conversion, 0..8; the same bits), "
                       "buckets=N (K->Q lists of more than N entries split across CTAs, "
                       "1..65536), bucketx=M (with buckets=N: at most M extra work items per "
                       "(batch, KV head), 1..65536); at most one "
                       "of " + ", ".join(BSA_DET_ORDER_FLAGS) + "; at most one of detstream, "
                       "nodetstream; at most one of packws, nopackws; at most one of tailconv, "
                       "notailconv; at most one of wghand, nowghand; at most one of wguni, "
                       "nowguni; at most one of mult1p, nomult1p; at most one of lpt, hlpt, "
                       "nolpt; at most one of autobuckets, nobuckets, buckets=N")
_parse_bsa_bwd_ws_opts = _parse_option_list(BSA_BWD_WS_FLAGS,
                                             {"stages": lambda n: 2 <= n <= 4,
                                              "dqslots": lambda n: 1 <= n <= 4,
                                              "persistkv": lambda n: 0 <= n <= 3,
                                              "ordscan": lambda n: 1 <= n <= 16,
                                              "stamp": lambda n: 0 <= n <= 1 << 20,
                                              "ex2emu": lambda n: 0 <= n <= 8,
                                              "fixemu": lambda n: 0 <= n <= 8,
                                              "buckets": lambda n: 1 <= n <= 65536,
                                              "bucketx": lambda n: 1 <= n <= 65536},
                                             None, _BSA_BWD_WS_ALLOWED)


def _parse_bsa_bwd_ws(var, raw):
    """Parser of JAX_SPARSE_ATTN_BSA_BWD_WS: :data:`BSA_BWD_WS_FLAGS`, ``stages=N`` and
    ``dqslots=N``; at most one of the deterministic order flags
    (:data:`BSA_DET_ORDER_FLAGS`), at most one of ``detstream`` / ``nodetstream`` and at most
    one of ``packws`` / ``nopackws``, ``l2hint`` / ``l2normal`` and the other pairs of
    contradicting flags."""
    opts = _parse_bsa_bwd_ws_opts(var, raw)
    chosen = [o for o in opts if o in ("autobuckets", "nobuckets") or o.startswith("buckets=")]
    if len(chosen) > 1:
        raise ValueError(f"{var}={raw!r}: {' and '.join(map(repr, chosen))} each choose the "
                         f"bucket split; give at most one; allowed: {_BSA_BWD_WS_ALLOWED}")
    orders = [o for o in opts if o in BSA_DET_ORDER_FLAGS]
    if len(orders) > 1:
        raise ValueError(f"{var}={raw!r}: {' and '.join(map(repr, orders))} each choose the "
                         f"deterministic dQ order; give at most one; allowed: "
                         f"{_BSA_BWD_WS_ALLOWED}")
    for on, off in (("detstream", "nodetstream"), ("packws", "nopackws"),
                    ("tailconv", "notailconv"), ("lpt", "hlpt"), ("lpt", "nolpt"),
                    ("hlpt", "nolpt"), ("l2hint", "l2normal"),
                    ("wghand", "nowghand"), ("fdiv", "nofdiv"), ("qprobe", "noqprobe"),
                    ("dqlag", "nodqlag"), ("wguni", "nowguni"),
                    ("mult1p", "nomult1p")):
        if on in opts and off in opts:
            raise ValueError(f"{var}={raw!r}: {on!r} and {off!r} contradict each other; "
                             f"give at most one; allowed: {_BSA_BWD_WS_ALLOWED}")
    return opts


def _parse_kb(var, raw):
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if not 16 <= n <= 227 or str(n) != raw.strip():
        raise ValueError(f"{var}={raw!r} is not allowed: give an integer number of KiB in 16..227")
    return n


def _parse_tile(var, raw):
    parts = raw.split(",")
    try:
        tile = tuple(int(p) for p in parts)
    except ValueError:
        tile = ()
    if len(tile) != 3 or any(t <= 0 for t in tile):
        raise ValueError(f"{var}={raw!r} is not allowed: give 'block_m,block_n,num_warps' "
                         "(three positive integers)")
    return tile


@dataclasses.dataclass(frozen=True)
class Switch:
    """One implementation switch: its field of :class:`Switches`, environment variable,
    allowed values (a tuple, or a description for the docs table), parser, default and
    meaning."""

    field: str
    env: str
    allowed: tuple | str
    parse: Callable[[str, str], object]
    default: object
    doc: str


def _choice(field, env, allowed, doc):
    """A switch choosing one of ``allowed``; the first one is the default."""
    return Switch(field, env, tuple(allowed), _parse_choice(tuple(allowed)), allowed[0], doc)


_TILE = "block_m,block_n,num_warps"

#: The implementation switches, one row each. To add an implementation, add its name to
#: the ``allowed`` tuple of its row (the first name is the default).
SWITCHES = (
    _choice("hstu_fwd_impl", "JAX_SPARSE_ATTN_HSTU_FWD_IMPL", ("sm90ws", "sm80"),
            "HSTU forward kernel: sm90ws (warp-specialized: TMA producer warp, two wgmma "
            "consumer warpgroups, persistent grid), sm80 (mma.sync, cp.async); both add rab"),
    Switch("hstu_fwd_ws", "JAX_SPARSE_ATTN_HSTU_WS", _WS_ALLOWED, _parse_ws, (),
           "sm90ws forward variants (tuning / ablation; the sm80 forward ignores them): "
           "nooverlap (no intra-warpgroup overlap of S = QK^T and O += PV), nopingpong "
           "(consumer warpgroups in lockstep), q1 (single-buffered Q), tanh16 (one "
           "tanh.approx.f16x2 per two scores, the rest fp32), silu16 (score "
           "function in packed 16-bit arithmetic), pagepf (paged KV: the producer loads "
           "each KV tile's page id one tile ahead), qalias (one Q buffer that O is staged "
           "in, the freed shared memory to K/V stages: 3 instead of 2 at D = 128), cross "
           "(a CTA's consecutive work items chained: the next item's first S = QK^T issued "
           "with this item's last PV GEMM, the epilogue after the next item's first score "
           "tile; slower on the H200), crossepi (chained, the epilogue during that S = QK^T), "
           "vlag (the producer issues V tile j after K tile j + 1), headouter (the "
           "persistent CTAs take every schedule row of one head before the next head), "
           "dynamic (the default with contiguous K / V without rab: after its first item "
           "each CTA takes the next from an atomic counter zeroed per call), static (the CTAs "
           "take the rounds of the longest-first items dealt in alternating direction, as "
           "with rab or paged K / V), roundrobin (static, CTA c takes work items c, c + G, "
           "...), qscale (each consumer warpgroup scales its Q tile by alpha / 2 in shared "
           "memory once per work item, so no score is multiplied; one more rounding of q "
           "to the 16-bit type; the default at head dims up to 64 in bf16, where the "
           "score function bounds the kernel; not with rab or paged K / V), noqscale (every "
           "score multiplied by alpha / 2 in fp32, also at head dims up to 64), wg3 (three "
           "consumer warpgroups, 192-row query tiles, 160 registers per consumer thread; at "
           "head dims up to 64 and bn up to 128, not with rab, paged K / V or chained items; "
           "the default there when max_seqlen_q >= 2048 without a func mask or split "
           "keys), wg2 (two consumer "
           "warpgroups, 128-row query tiles), plate (fp16: P converted to 16 bit after the wait of the previous PV GEMM, so "
           "that ptxas does not serialize the wgmmas (C7513); measured no faster), "
           "splitwait (each consumer warpgroup re-checks the V tile's full barrier before it "
           "waits for the PV GEMM, so that ptxas keeps that wait below the next score tile "
           "instead of hoisting it above; measured within 1 % on the H200), "
           "epivec (the default: the epilogue stages O with packed 4-byte shared stores "
           "into a row-swizzled tile copied out in 16-byte pieces, as the block-sparse "
           "forward does), noepivec (the epilogue stages O through the element copies of "
           "the swizzled O layout, 2-byte shared-memory stores and loads), "
           "tmao (the default: query tiles that end inside their sequence stage O in the "
           "128-byte-swizzled operand layout and one thread per consumer warpgroup writes it "
           "with TMA tensor stores that the warpgroup does not wait for; a sequence's last, "
           "partial tile keeps the pair-store copy; not with split-KV or qalias; Dv a "
           "multiple of 64; excludes notmao and noepivec), "
           "notmao (every query tile copies its staged O out in 16-byte pieces; also implied "
           "by noepivec), "
           "rabpf (with a relative attention bias: the producer warp prefetches each KV "
           "tile's bias rows into L2 after that tile's K / V loads; contiguous K / V, not "
           "with vlag or cross), "
           "bn=N (keys per tile; default 128, 64 at "
           "D = 256), chunk=N (with the "
           "dynamic deal: the tile schedule orders the query tiles by sequence chunks of "
           "about N KiB of K / V over all KV heads, longest work first within a chunk, so "
           "the CTAs running at one time read K / V that fit the L2 cache; default 16384, "
           "0 = one longest-first order)"),
    Switch("hstu_fwd_tile", "JAX_SPARSE_ATTN_HSTU_FWD_TILE", _TILE, _parse_tile, None,
           "HSTU sm80 forward tile override (tuning; unset: the kernel's tiles for the head "
           "dims); with sm90ws it is an error (bn=N of JAX_SPARSE_ATTN_HSTU_WS sets its "
           "block_n)"),
    _choice("hstu_schedule", "JAX_SPARSE_ATTN_HSTU_SCHEDULE", ("kernel", "xla"),
            "how the HSTU forward's tile schedule (sanitised cu_seqlens + query tiles "
            "longest work first; paged KV: also the sanitised page_indptrs) is built: "
            "kernel (one single-CTA CuTe DSL launch, kernels/hstu_schedule.py; up to 1022 "
            "sequences and 8192 query tiles, and no func mask, else xla; paged KV: the "
            "forward kernel clamps the page ids), xla (jnp ops: a sort, scans, gathers; "
            "paged KV: XLA clips the page ids)"),
    _choice("hstu_bwd_impl", "JAX_SPARSE_ATTN_HSTU_BWD_IMPL", ("sm90", "sm80"),
            "HSTU backward kernel: sm90 (warp-specialized TMA producer warp + two wgmma "
            "consumer warpgroups; D = D_v in {64, 128, 256} without rab, D = D_v in {64, 128} "
            "with rab unless hstu_bwd_ws has 'rabsm80'; other calls run sm80 and "
            "the compile key records it), sm80 (mma.sync, cp.async; every head dim, with rab)"),
    _choice("hstu_bwd_dq", "JAX_SPARSE_ATTN_HSTU_BWD_DQ",
            ("tile", "red", "bulk", "red4"),
            "dQ reduction of the sm90 HSTU backward (tuning / ablation; sm80 ignores it): tile "
            "(each consumer warp stores its dQ accumulator slice in register order to shared "
            "memory and adds it with one 4 KB cp.reduce.async.bulk into a query-tile "
            "workspace, which a second kernel reorders into dq; at D = 256 each warp stages "
            "its slice in the step's consumed Q / dO tiles once both warpgroups' GEMMs are "
            "done and adds it as two 4 KB blocks), red (red.global.add.v2.f32 from registers), bulk (fp32 "
            "rows staged in shared memory, one cp.reduce.async.bulk add per row; D <= 128, "
            "else red), red4 (red.global.add.v4.f32: lane pairs swap halves with shuffles)"),
    _choice("hstu_bwd_order", "JAX_SPARSE_ATTN_HSTU_BWD_ORDER", ("auto", "hlpt", "lpt", "seq"),
            "launch order of the sm90 HSTU backward's KV tiles (tuning / ablation): auto "
            "(lpt for deterministic=True at D <= 64 and for a relative attention bias shared "
            "by the heads (H_rab = 1 < H) without deterministic=True, else hlpt), hlpt "
            "(longest work first within each head, one head after the other: concurrent CTAs "
            "share one head's Q, dO and dQ in L2), lpt (longest work first over all sequences, "
            "a tile's heads consecutive), seq "
            "(canonical order, the KV tiles of one sequence and head consecutive: concurrent "
            "CTAs share Q, dO and dQ in L2)"),
    Switch("hstu_bwd_ws", "JAX_SPARSE_ATTN_HSTU_BWD_WS", _HSTU_BWD_WS_ALLOWED,
           _parse_hstu_bwd_ws, (),
           "sm90 HSTU backward variants (tuning / ablation; the sm80 backward ignores them): "
           "splitwait (where SiLU / SiLU' of S^T run while the dP^T GEMM does, head dims "
           "with 64-query tiles: the step's Q / dO stage's full barrier re-checked right "
           "before the wait of the dP^T GEMM, so that ptxas keeps that wait below the "
           "tanh instead of hoisting it above most of them; slower on the H200), epi16 (dK and "
           "dV stored from registers one 2-byte store per value, implies epiregs; epiregs "
           "stores packed pairs, one 4-byte store per two adjacent columns, faster), detzero "
           "(deterministic=True with the dQ tile workspace and the writer warp: XLA zeroes "
           "the fp32 workspace and every KV tile adds its dQ; by default the first KV tile "
           "in each query tile's order stores its dQ instead, the workspace is not zeroed and "
           "the reordering kernel zeroes query tiles no KV tile covers, 1-3 % faster on the "
           "H200), dqclaim (not deterministic, with the dQ tile "
           "workspace: turns the dQ writer warp on, which claims each query tile with an "
           "atomic add; the first claimer stores its dQ, later ones add once that store is "
           "complete, so the fp32 workspace is not zeroed first; within noise of the default "
           "on the H200, slower at D = 64 and 256), convert=N "
           "(not deterministic, with the dQ tile workspace, D <= 128: the last CTA of a "
           "sequence and KV head to finish writes that sequence's dq from the workspace "
           "when it has at most N queries, and the reordering kernel skips those "
           "sequences; slower on the H200), xlazero (the fp32 dQ workspace zeroed by an XLA "
           "memset; by default the tile-schedule launch zeroes it with extra CTAs, so "
           "nothing runs between that launch and the backward), chunk=N (the hlpt order: "
           "each head's KV tiles ordered by sequence chunks of N KiB of Q, dO and fp32 dq "
           "rows first, longest work first within a chunk; not faster on the H200), wgskip "
           "(D = 128: a consumer warpgroup whose keys the mask hides from a whole query tile, "
           "or that lie past L_k, skips that step's GEMMs but dQ), revheads (with the dQ "
           "tile workspace: the reordering kernel reads the heads last to first, those the "
           "backward walked last first), epiregs (D <= 128: dK and dV stored straight from "
           "registers as packed 4-byte pairs; by default they are staged in shared memory "
           "and written in coalesced 16-byte row pieces, 3-13 % faster on the H200, most "
           "at short sequences), thrfrags (the consumers' shared-memory GEMM operands "
           "partitioned per thread, so every wgmma descriptor is computed in "
           "ordinary registers and moved to a uniform register before its GEMM; by default "
           "they are partitioned with the warpgroup's first thread, a warp-uniform value), "
           "wghand (with the dQ writer warp (dq_writer on; at D = 256 it is the default) and "
           "the dQ tile workspace at D <= 128, not dqclaim: the writer takes each consumer "
           "warpgroup's half of the staged dQ tile on its own and hands it back once its "
           "bulk reductions have read it, so a warpgroup never waits at a barrier for the "
           "other one's dQ; opt-in: level with the default on the H100), qprobe (not "
           "deterministic, with the dQ tile workspace at D <= 128: after staging its dQ "
           "slice a consumer tests whether the next step's Q / dO stage is full and "
           "computes its index, so that the next step starts without the wait where the "
           "test passed, as the block-sparse backward's default at blk 128; opt-in: level "
           "with the default on the H100), "
           "rabsm80 (calls with a "
           "relative attention bias run the sm80 backward; by default they run the sm90 "
           "backward at D = D_v in {64, 128} (else sm80): each consumer thread loads its bias "
           "elements in the accumulator layout after issuing the score GEMMs and writes d rab "
           "as sm80 does (direct stores with H_rab = H or deterministic=True, fp32 red.add "
           "into the shared workspace with H_rab = 1 < H); with rab the dq workspace is zeroed, "
           "so detzero is implied and dqclaim / convert=N are ignored; on an H100 the sm90 "
           "backward with rab is 1.23-1.59x sm80's speed at D 128, 1.07x at D 64 with "
           "H_rab = H and level with it at D 64 with H_rab = 1; since then the two defaults "
           "below made the sm90 backward with rab 1.2-1.4x faster at D 128), norabfast (by "
           "default, with rab at D 128, a step whose query rows and keys all have a bias loads "
           "it through the thread's partition of the tile and writes d rab without clamps or "
           "range selects; norabfast clamps and checks every value, as before), norabpf (by "
           "default, with rab, the producer warp prefetches each step's bias rows into L2 when "
           "it loads the step's Q / dO; norabpf: no prefetches), drabpf (opt-in: the same "
           "prefetches for the rows of the shared fp32 d rab workspace, H_rab = 1 < H), "
           "nodrabs (by default, with H_rab = 1 < H, the steps of the fast path add d rab with "
           "one scalar red.add per value; nodrabs: 16-byte adds after a lane transpose, as "
           "before), rabpf2 (opt-in: each step's bias prefetches issued one step earlier), "
           "rabfast64 (opt-in: the fast path at D 64 too, where its 64 loads per thread make "
           "ptxas spill)"),
    Switch("hstu_bwd_tile", "JAX_SPARSE_ATTN_HSTU_BWD_TILE", _TILE, _parse_tile, None,
           "HSTU sm80 backward tile override (tuning; with sm90, the default, it is an error "
           "except for calls that sm90 routes to sm80: set hstu_bwd_impl=sm80 as well)"),
    _choice("bsa_fwd_impl", "JAX_SPARSE_ATTN_BSA_FWD_IMPL", ("auto", "sm90ws", "sm80"),
            "BSA forward kernel: auto (sm90ws), sm90ws (warp-specialized TMA producer warp + "
            "wgmma consumer warpgroups, persistent grid; D in {64, 128}, other D use sm80), "
            "sm80 (mma.sync, every D)"),
    Switch("bsa_fwd_ws", "JAX_SPARSE_ATTN_BSA_WS", _BSA_WS_ALLOWED, _parse_bsa_ws, (),
           "sm90ws BSA forward variants (tuning / ablation; other forwards ignore them): "
           "nooverlap (no overlap of the PV GEMM with the next block's softmax), nopingpong "
           "(blk 128: consumer warpgroups in lockstep), q1 (single-buffered Q), headinner "
           "(work items query block major, heads fastest, instead of KV head major), "
           "lazyrescale (the online softmax keeps a row's max and skips the O rescale until "
           "the max grows by more than 2^8; slower on the H200), ctas2 (blk 64 D 64: two CTAs "
           "per SM instead of three), ctas3k1 (blk 64 D 128: three CTAs per SM, each with "
           "one K buffer, two V buffers and O staged in its single Q buffer, 64 KiB, "
           "instead of two CTAs with double-buffered Q and two K/V stages; q1, oalias, "
           "stages=N and the chaining of cross / crossepi do not apply; ignored at other blk "
           "/ D), selfload (ctas3k1 without the producer warp: the consumer warpgroup's "
           "first warp issues the TMA loads as the warpgroup frees the stages, 128 threads "
           "per CTA; with split-KV, pack_gqa, nooverlap, streamk, cross, crossepi, mpre or "
           "qahead it runs as ctas3k1), oalias (O staged in a single Q buffer, for more K/V "
           "stages), cross (a CTA's consecutive work items chained: the next item's first "
           "S = QK^T issued with this item's last PV GEMM, the epilogue after the next "
           "item's first score tile; slower on the H200; ignored with nooverlap), crossepi "
           "(chained, the epilogue during that S = QK^T), vlag (the producer issues V tile j after K tile j + 1), "
           "splitwait (the consumer warpgroup re-checks the V tile's full barrier before it "
           "waits for the PV GEMM, so that ptxas keeps that wait below the next block's "
           "softmax instead of hoisting it above; the default at blk 64 with D 128), "
           "nosplitwait (never), "
           "qregs (each consumer warpgroup copies its Q slice into registers once per work "
           "item; the S = Q K^T GEMMs then read only K from shared memory; ignored with cross "
           "and crossepi), "
           "mpre (the producer warp and the consumer warpgroups load the next work item's "
           "listed-block count, the producer also its first list entry, while the current "
           "item runs, instead of at the item's start), "
           "qahead (the producer warp issues the next work item's Q load during the current "
           "item, once the current item's first K/V stages are issued, instead of at the "
           "next item's start; implies mpre; with split-KV, q1, oalias, ctas3k1 or "
           "selfload, whose single Q buffer holds the current item until its epilogue, and "
           "with vlag it runs as mpre), "
           "noepivec (the epilogue stages O through the element copies of the swizzled O "
           "layout, 2-byte shared-memory stores and loads, instead of the default's packed "
           "4-byte stores into a row-swizzled tile copied out in 16-byte pieces), "
           "streamk (the work items past the last whole wave but one have their listed "
           "blocks cut into equal contiguous ranges, one per CTA, when they all list the "
           "same number of blocks; a work item split between two CTAs is finished by the "
           "one holding its first blocks, which adds the other's fp32 partial output; not "
           "with split-KV, pack_gqa, cross, crossepi, mpre or qahead; slower on the H200), "
           "tmao (the default: the epilogue stages O in the 128-byte-swizzled operand "
           "layout and one thread per consumer warpgroup writes it with TMA tensor stores "
           "that the warpgroup does not wait for; not with split-KV or oalias; packed rows "
           "as tmaopack says; excludes notmao and noepivec), "
           "notmao (the consumer warpgroup copies the staged O out itself in 16-byte "
           "pieces, packed rows too; also implied by noepivec), "
           "tmaopack (the default: with pack_gqa the packed rows are written by TMA tensor "
           "stores too, boxes of (D, r, 64 / r) as the packed Q loads; excludes notmaopack), "
           "notmaopack (packed rows copied out by the consumer warpgroup as with notmao; "
           "unpacked rows keep the TMA stores), "
           "pairwg (blk 64: one CTA per SM of two consumer warpgroups, each with work items "
           "of its own (its own 64-row query block, block list, Q / K / V rings and producer "
           "warp), taking turns at their GEMMs (ping-pong; in lockstep-free order with "
           "nopingpong), instead of two CTAs of one consumer warpgroup; not with split-KV, "
           "pack_gqa, ctas3k1, selfload, streamk, cross, crossepi, mpre, qahead or oalias, "
           "where it is ignored), "
           "l2hint (L2 eviction priorities on the TMA copies: Q loads and O stores "
           "evict_first (Q evict_last with split-KV or streamk, where several work items "
           "read a query block), K / V loads evict_last, which other query blocks of the head "
           "read again), l2normal (evict_normal policies on every TMA copy; the default passes "
           "the copies' default policy operand), "
           "oinq (the default at D 128: the epilogue stages O for its TMA stores in the "
           "work item's own Q buffer of the two, released at the CTA's next item once the "
           "store has read it, and the O buffer's shared memory becomes further V stages: "
           "two K and three V stages at D 128 (stages=N caps both rings); with the TMA O "
           "stores, without split-KV, "
           "pack_gqa, q1, notmao, noepivec, ctas3k1, selfload, pairwg, streamk, cross, "
           "crossepi or oalias, where it is ignored), nooinq (O in its own buffer, at D 128 two K / V stages), "
           "oearly (the overlapped mainloop rescales O to the previous tile's running max "
           "right after issuing the next tile's S = QK^T, under that GEMM, instead of after "
           "the PV GEMM that precedes it has completed; ignored with nooverlap, cross and "
           "crossepi), sumtree (the online softmax adds a thread's probabilities of a row "
           "pairwise, depth log2 of their number, instead of in one chain), xlaclamp (XLA "
           "clamps the block lists, counts and block sizes before the kernel, as for the "
           "other forwards; by default the sm90ws kernel clamps every value it reads), "
           "sortlists (XLA sorts each query block's active list into ascending block "
           "order before the kernel, so that the work items running at once read nearby "
           "K / V blocks; not with split-KV), "
           "half (sparse_block_size 128: 64-row work items, one consumer warpgroup and one "
           "CTA per SM, both halves of a query block reading its one list; ignored with "
           "split-KV, pack_gqa, pairwg, streamk, cross, crossepi, ctas3k1, selfload; with "
           "causal the first half's diagonal V blocks load by the row copy, not TMA), "
           "half2 (half with two CTAs per SM, each with one Q buffer that O is staged in, "
           "one K and two V stages: the shared memory two 64 x 128 steps per SM have; D 128 "
           "only, ignored elsewhere), "
           "pairstep (blk 64 at D 128: the consumer walks a query block's list two entries "
           "per step, 64 x 128 score tiles over two 64-row K / V ring stages (the producer "
           "issues a step's two K tiles, then its two V tiles), an odd "
           "list's last step with its second half masked; the plan of oinq (two K and "
           "three V stages; ignored without oinq), ignored with nooverlap, split-KV, pack_gqa, qregs, mix=N, oearly, "
           "pairwg, streamk, cross, crossepi, ctas3k1, selfload, and elsewhere), "
           "pairstep4, pairstepk3, pairstepk4 (pairstep with one Q buffer that O is "
           "staged in and two K and four V, three K and three V, four K and two V stages; "
           "their O stores are not TMA's), "
           "pairbox (blk 64 at D 128: a query block's list walked two entries per step "
           "into K / V stages of 128 rows, each half loaded by its own 64-row TMA box under "
           "one barrier, one 64 x 128 S GEMM per step; one Q buffer that O is staged in, one "
           "K and two V stages; ignored with pairstep and where pairstep is, and with "
           "kvwarps, vlag, mpre, qahead and skipload=N), "
           "kvwarps (two producer warps: one issues Q and the K tiles, the other the V "
           "tiles, so that no K load waits behind a V stage; ignored with vlag, mpre, "
           "qahead, pairwg, ctas3k1, selfload, streamk and skipload=N), "
           "wgrelease (each consumer warpgroup frees a K / V stage with one arrival on its "
           "empty barrier, by its first warp after the wgmma wait that covers the stage's "
           "reads, instead of one arrival per consumer warp, as FlashAttention-3's pipelines "
           "do; ignored with selfload), "
           "kdeep (with oinq the shared-memory stage beyond the K / V pairs goes to the K "
           "ring instead of V: three K and two V stages at blk 64 / D 128; K loads further "
           "ahead with vlag, whose producer issues K tile j + 1 before V tile j), "
           "sn64 (an ablation at sparse_block_size 128: each S = Q K^T as two 64-column "
           "GEMMs over the K tile's row halves; ignored with qregs), "
           "mix=N (the overlapped mainloop issues the first N K steps of the previous "
           "tile's PV GEMM between the K steps of the next S = QK^T, in its wgmma group, "
           "the rest after it: the two GEMMs' instruction chains interleaved; 1..8, the PV "
           "GEMM has sparse_block_size / 16 K steps and the S GEMM D / 16, at most the "
           "smaller of the two interleave; ignored with nooverlap, oearly, sn64 and qregs), "
           "nosm (a timing ablation whose results are wrong: the score tiles skip the "
           "online-softmax step, P is the masked scores, O is still multiplied by "
           "correction factors of 1), "
           "skipload=N (a timing ablation whose results are wrong: the producer skips the "
           "K and V loads of every N-th K/V tile it issues (2..64), the consumers read what "
           "the stages held before; it measures how the kernel's time follows its L2 "
           "traffic; ignored with vlag and selfload), "
           "stages=N "
           "(most K/V stages)"),
    _choice("bsa_bwd_impl", "JAX_SPARSE_ATTN_BSA_BWD_IMPL", ("auto", "sm90", "sm90ws", "sm80"),
            "BSA backward kernel: auto (the faster one on the H200: sm90ws; sm90 at "
            "sparse_block_size 64 with D 128 under bsa_bwd_dq=rows), sm90 (wgmma, one "
            "warpgroup per 64-key tile, cp.async; D in "
            "{64, 128}, other D use sm80), sm90ws (warp-specialized: TMA producer warp + one "
            "wgmma consumer warpgroup per 64 keys of a whole KV block; D in {64, 128}; "
            "pack_gqa calls too, on the packed rows; sm90 with bsa_bwd_ws nopackws or decouple "
            "or bsa_bwd_dq rows), sm80 (mma.sync, every D)"),
    _choice("bsa_bwd_dq", "JAX_SPARSE_ATTN_BSA_BWD_DQ", ("tile", "rows"),
            "dQ reduction of the Hopper BSA backwards (tuning / ablation; sm80 ignores it): "
            "tile (each consumer warp stores its dQ accumulator slice in register order to "
            "shared memory and adds it with one cp.reduce.async.bulk per 64 (blk 128 / D 64: "
            "32) columns into a workspace of 64-row query tiles, which a second kernel "
            "reorders into dq; the sm90ws backward at blk 64 / D 128, where a staging tile "
            "does not fit, stages in the step's consumed Q / dO tiles; its pack_gqa calls use "
            "a tile workspace of packed rows, those of sm90 use rows), rows (a row-major fp32 "
            "workspace: sm90 one bulk reduce-add per row, sm90ws red.global.add.v2.f32)"),
    Switch("bsa_bwd_ws", "JAX_SPARSE_ATTN_BSA_BWD_WS", _BSA_BWD_WS_ALLOWED, _parse_bsa_bwd_ws,
           (), "sm90ws BSA backward variants (tuning / ablation; other backwards ignore "
               "them): ldwait (the producer waits for each step's lse / delta copies before "
               "it issues the step's TMA loads, instead of the mbarrier tracking them), "
               "lpt (CTAs take the KV blocks longest K->Q list first over all (batch, KV "
               "head) pairs; slower on the H200: the CTAs running at one time then span every "
               "head), hlpt (CTAs take the KV blocks longest "
               "K->Q list first within each (batch, KV head), the pairs in grid order; 6 % "
               "faster with GQA 16:4 on the H200, within +-1.5 % elsewhere; the bucket "
               "split's work items keep this order), nolpt (CTAs take "
               "the KV blocks in grid order); each of lpt, hlpt and nolpt means one CTA per "
               "KV block (no bucket split), decouple (blk 128: each consumer warpgroup adds the dQ of its own 64 "
               "keys, without the barrier between the warpgroups; slower on the H200), "
               "deterministic=True on the ordered path (detorder, below) orders the dQ "
               "additions to a query tile by default with "
               "the schedule order (a greedy edge colouring of the K->Q lists along the "
               "estimated launch schedule, computed on the GPU, with a window of one CTA per "
               "SM: at blk 128 every CTA the GPU holds, so under an MPS limit or green "
               "context use detsched or detlaunch) where the query heads are the KV heads "
               "and the order kernel fits, else "
               "with the launch-group order (detlaunch); the options choose one: detlaunch "
               "(the order in which the CTAs of a launch group of half the GPU reach the "
               "tile at blk 128, ascending KV block at blk 64), detkv (ascending KV block "
               "order), detfull (launch groups of every CTA the GPU holds at once), detsched "
               "(the schedule order with a window of half the CTAs the GPU holds, also with "
               "GQA; where the order kernel does not fit (shared memory, more than 8192 KV "
               "blocks) the launch-group order, with a UserWarning), detschedfull (detsched "
               "with a window of every CTA the GPU holds), dqalias (bsa_bwd_dq=tile: the dQ slices "
               "staged in the step's consumed Q / dO tiles instead of a staging tile of "
               "their own; always at blk 64 / D 128, where that tile does not fit), "
               "dqearly (where the dQ slices are staged in the Q / dO tiles: dQ = dS K issued "
               "with the dK GEMM, before the dV / dK GEMMs complete; by default dQ waits for "
               "them, so fewer registers are live at once and ptxas does not serialize the "
               "wgmma (C7512) at blk 64 / D 128; slower on the H200), "
               "lselate (each step's lse read from shared memory while its S / dP GEMMs are "
               "issued; by default it is read before they are issued, so ptxas "
               "does not stall the GEMM issue on that load), "
               "splitwait (P^T masked and converted before the wait of the dP^T GEMM, and the "
               "Q / dO stage's full barrier re-checked right before that wait, so that ptxas "
               "keeps the wait below the exp2s instead of hoisting it above most of them; "
               "slower on the H200), "
               "epi16 (dK and dV stored from registers one 2-byte store per value, implies "
               "epiregs; epiregs stores packed pairs, one 4-byte store per two adjacent "
               "columns, faster), epiregs (dK and dV stored straight from registers; by "
               "default they are staged in shared memory and written in coalesced 16-byte "
               "row pieces, 1-3 % faster on the H200), "
               "dqalt (blk 128, not deterministic, with the dQ writer warp and the staging "
               "tile: the two consumer warpgroups take turns computing a step's whole dQ = dS "
               "K, m64 n=D, instead of each computing half of D every step; the other one "
               "does not wait for the step's dS), "
               "stages=N (most Q / dO stages), "
               "dqslots=N (deterministic with the dQ writer warp: N fp32 accumulators per "
               "64-row query tile; the contribution of rank r goes to accumulator r % N and "
               "waits only for rank r - N, and the reordering kernel sums the N in order; "
               "N times the workspace; by default 2 at blk 64 in the default schedule order "
               "with K_max >= 32, else 1), "
               "packws (the default: pack_gqa=True runs this backward, with Q / dO of the "
               "packed rows in 5-D TMA boxes, lse / delta per packed row and a dQ tile "
               "workspace of packed rows, causal=True included; with bsa_bwd_dq=rows or "
               "decouple pack_gqa runs the sm90 backward), "
               "nopackws (pack_gqa=True runs the sm90 backward; 1.5x slower on the H200), "
               "detzero (deterministic with the dQ writer warp: the fp32 dQ workspace is "
               "zeroed by the preprocessing launch and every contribution is a bulk "
               "reduce-add; by default the first contribution to each accumulator tile (rank "
               "< dqslots) is a bulk store, so the workspace is not zeroed, and the "
               "reordering kernel writes zeros for tiles whose semaphore is still 0), "
               "dqclaim (not deterministic, with the dQ writer warp, unpacked rows: the "
               "writer claims each query tile with an atomic add on a zeroed int32 flag per "
               "tile; the first claimer stores its dQ, later ones add once that store is "
               "complete, so the fp32 workspace is not zeroed; the reordering kernel writes "
               "zeros for unclaimed tiles; opt-in: on the H200 3-5 % slower at blk 64, level "
               "at blk 128), "
               "zerolag (not deterministic, with the dQ writer warp, unpacked rows, not with "
               "lpt (hlpt, the default order, keeps each pair's CTAs together) or dqclaim: the preprocessing launch zeroes the fp32 dQ workspace of the "
               "first two (batch, KV head) pairs only, and the writer warp of each CTA zeroes "
               "a slice of the workspace of the pair two after its own before its first "
               "addition, counted on a zeroed int32 per pair that the writers of that pair "
               "wait for; opt-in: on the H200 1 % faster at blk 128, 4 % slower at blk 64), "
               "tailconv (the default where it applies: not on the ordered deterministic "
               "path, with the dQ "
               "writer warp, unpacked rows and pdl; every CTA lets the dq reordering launch "
               "once it has started, and counts its pair's completed dQ additions on a "
               "zeroed int32 per (batch, KV head) pair; the reordering's CTAs wait for their "
               "pair's count instead of the whole backward, so they run on the SMs the "
               "backward's last wave leaves free; 1.5 % faster at blk 128 on the H200), "
               "notailconv (the reordering launched after the backward has completed), "
               "persist (opt-in, blk 128 with tailconv, not causal, zerolag, dqalt, "
               "dqalias or decouple: a persistent grid of one CTA per SM takes the KV blocks as work "
               "items from an atomic counter, in the hlpt / lpt order, loading an item's "
               "first Q / dO stages and then its K / V while the previous item ends, and "
               "stages dK / dV in the K / V and dS tiles; on the H200 1 % faster in a "
               "burst, level at the power cap), persistkv=N (with persist: the "
               "Q / dO stages of an item issued before its K / V, 0..3; default: the most "
               "Q / dO stages less one), nokvpf (with persist: no L2 prefetch of the next "
               "item's K / V), "
               "detfixed (deterministic=True without ordering the dQ additions, the default "
               "unless an option of the ordered path is given: the "
               "default mode's kernels (with the dQ writer warp, tailconv, unpacked rows, "
               "not dqalt, dqclaim, decouple, zerolag or persist; else the ordered "
               "deterministic backward; ldscale, dklag and sahead ignored) with each dQ "
               "contribution "
               "converted to int32 fixed point by a power-of-two multiplier per query row, "
               "from a bound on its values, and added with int32 bulk reductions, whose "
               "sum does not depend on their order; rows whose values leave the bound or "
               "are not finite give NaN; at blk 128 (with dqlag, wguni and mult1p) 0.88-0.92x "
               "the default mode on the H100, where the schedule order read 0.83-0.86x before "
               "wguni), "
               "detorder (deterministic=True with ordered dQ additions; so "
               "does any option of the ordered path: detkv, detfull, detlaunch, detsched, "
               "detschedfull, relaxpoll, detstream, nodetstream, detoverlap, detzero, "
               "ordfast, dqslots=N, ordscan=N), "
               "l2hint (L2 eviction priorities: the K / V loads evict_first, the Q / dO "
               "loads and the dQ writer warp's bulk reduce-adds evict_last, since the other "
               "KV blocks listing a query block read it again; opt-in: within noise of the "
               "default on the H100), "
               "l2normal (evict_normal policies on those copies; the default passes the "
               "copies' default policy operand), "
               "thrfrags (the consumers' shared-memory GEMM operands partitioned per thread, "
               "so every wgmma descriptor is computed in ordinary registers and "
               "moved to a uniform register before its GEMM; by default they are "
               "partitioned with the warpgroup's first thread, a warp-uniform value, and "
               "the descriptors stay in uniform registers), "
               "wghand (the default where it applies: blk 128, not on the ordered "
               "deterministic path, with the dQ "
               "writer warp and the staging tile, not dqalt / dqclaim: the writer warp takes "
               "each consumer warpgroup's staged half of the step's dQ on its own and hands "
               "it back once its bulk reductions have read it, so a warpgroup never waits at "
               "a barrier for the other one's dQ; 0.5-2 % faster on the H100), "
               "nowghand (one barrier pair over both warpgroups per step for the staged dQ), "
               "ldscale (not with deterministic=True: XLA scales the kernel's lse by log2 e "
               "and delta by softmax_scale before the call, so each score's P^T takes one "
               "FFMA and its dS^T one FFMA and one FMUL; opt-in: level on the H100), "
               "dvwait (each step issues dQ, waits for the dV GEMM, then issues dK, instead of "
               "issuing dQ and dK back to back, so the dK issue rather than the wait for dQ "
               "meets the tensor pipe's backlog; where dQ and dK are issued together: not "
               "dqalias, decouple or dqalt; opt-in: level on the H100), "
               "dklag (blk 128, not deterministic, dqalias, decouple, dqalt, dvwait or "
               "persist: a "
               "step's dK GEMM is issued in the next step of its KV block, right after that "
               "step's S^T / dP^T GEMMs, so the tensor pipe runs it while the consumers "
               "compute P^T and dS^T; the step's dS^T stays in registers of its own and its "
               "Q / dO stage is released once that GEMM has completed; opt-in: 4 % slower on "
               "the H100), "
               "fdiv (the default: the consumers split each K->Q list entry into query head "
               "and query block with a multiplier precomputed per CTA; 0.7 % faster at blk 128 "
               "S 32768 on the H100, level at S 16384; not with sahead, which then spills), "
               "nofdiv (an integer division per entry), "
               "qprobe (the default at blk 128 with the per-warpgroup dQ hand-back, not "
               "with dklag, sahead or persist: after staging its dQ slice a consumer tests whether the "
               "next step's Q / dO stage is full and computes its index, so that the next "
               "step starts without the wait where the test passed; 1.1-1.9 % faster at "
               "blk 128 on the H100), "
               "noqprobe (every step waits for its stage at its start), "
               "entahead (with qprobe, not with nofdiv: the next K->Q list entry is split into "
               "query head and block, and with block_sizes its key count read, at the first "
               "step's stage test instead of at the entry's start; opt-in: 1.5-2.4 % slower "
               "than qprobe alone on the H100), "
               "dqlag (the default at blk 128 with the per-warpgroup dQ hand-back, not with "
               "dklag, sahead, dvwait or persist: consumer warpgroup 0 computes its half of a "
               "step's dQ in the next step, from the other dS^T buffer, so the warpgroups do "
               "not meet at a dS^T barrier every step and run about a third of a step apart; "
               "1.0-1.4 % faster at blk 128 on the H100; with deterministic=True (the "
               "fixed-point dQ) too, warpgroup 0 then keeping the previous step's fixed-point "
               "multipliers in registers), "
               "nodqlag (both warpgroups compute their dQ halves in the step, after a dS^T "
               "barrier over both), "
               "wguni (the default, not with sahead, whose kernel then spills 24 bytes: the "
               "consumers' warpgroup index taken from the warp index "
               "made warp-uniform (make_warp_uniform) instead of the thread index, so that "
               "ptxas keeps the values derived from it, such as dqlag's dS^T buffer index, in "
               "uniform registers; the same arithmetic; 1.6-1.8 % faster at blk 128 on the "
               "H100, 2-3 % with deterministic=True), "
               "nowguni (the warpgroup index from the thread index), "
               "fixemu=N (with the fixed-point deterministic dQ; opt-in: of "
               "every 8 dQ values of a consumer thread, N are converted to int32 by four "
               "float additions, a shift-add and an add (t = y + 1.5 * 2^31, r = y - (t - "
               "1.5 * 2^31), u = r + 1.5 * 2^23, 256 bits(t) + bits(u) less a constant) on the "
               "FP32 and integer pipes instead of cvt.rni on the conversion unit, which also "
               "runs the exponentials; bitwise the same values; slower on the H100: 0.8-2.1 % "
               "for N = 4, 3.5-5.2 % for N = 8), "
               "buckets=N (not with persist, zerolag, "
               "pack_gqa, notailconv, stamp=N, dklag, sahead or the ordered deterministic "
               "path: a K->Q list of "
               "more than N entries "
               "is split into ceil(L / N) buckets of consecutive entries, each a CTA of its "
               "own (metadata.kq_bucket_items), so a KV block that many query blocks list does "
               "not run as one long CTA; each bucket stores its float32 dK / dV partial to a "
               "workspace slot, and the bucket that completes the row's count sums the slots "
               "in bucket order, so dK / dV stay bitwise reproducible; the items run longest "
               "first within each (batch, KV head); on the H100 at S 32768 blk 128 with KV "
               "block 0 listed by every query block, N = 64 took 1.77x less time than one "
               "CTA per KV block with 2 heads and 8 % less with 16), "
               "autobuckets (the default where buckets=N applies: N from the lists' static "
               "shape, twice the mean K->Q list length bound, the group's query heads x query "
               "blocks x K_max over the KV blocks, at least 64, and without bucketx=M at most "
               "the extra items of four lists that hold every query block of the group; on the "
               "H100 with KV block 0 in every list 1.10-1.87x faster than one CTA per KV "
               "block, with random lists 0.3-1.4 % slower: its work-item metadata), "
               "nobuckets (one CTA per KV block, whatever the lists' lengths), "
               "bucketx=M (with buckets=N or autobuckets: a (batch, KV head) pair's grid "
               "holds at most M extra work items instead of its entries over N, so fewer idle CTAs and a "
               "smaller partial workspace (2 M slots of 2 blk D float32 per pair); a pair "
               "whose long lists need more keeps every list whole), "
               "mult1p (the default with the fixed-point deterministic dQ: the "
               "multipliers' bounds take the Euclidean norms of the dO and V rows in one pass "
               "over them, the largest value and the unscaled float32 sum of squares side by "
               "side (where the sum overflows or is below 2^-100, sqrt(D) times the largest "
               "value), instead of two passes, the largest value and then the sum of the "
               "squares scaled by it; 3-4 % faster deterministic backward on the H100), "
               "nomult1p (the two passes), "
               "ex2emu=N (of every 8 score columns of a consumer thread, N take exp2 as a "
               "degree-3 polynomial on the FMA pipes instead of the MUFU unit, relative "
               "error 1.02e-4; opt-in: 1-3 % slower at blk 128 and 0.5 % at blk 64 on the "
               "H100 for N = 2..4), "
               "redv4 (with bsa_bwd_dq=rows: the dQ rows added with one "
               "red.global.add.v4.f32 per 4 values, two lanes swapping a pair, instead of one "
               ".v2 per 2), "
               "sahead (blk 128 where dklag applies, not with dklag or splitwait: the first "
               "64-row step of a list entry ends without waiting for its dK GEMM; the second "
               "step issues its S^T / dP^T GEMMs behind it and releases the first step's "
               "Q / dO stage after its S^T wait; opt-in: 0.4-1.4 % "
               "slower on the H100), "
               "ordfast (deterministic in the schedule order: the same order from fewer "
               "launches and fewer serialized shared-memory operations: the K->Q lists "
               "kernel instead of XLA's lists, the rows' estimated starts computed in the "
               "order kernel, which uses barrier reductions for its flags, one counter "
               "update per warp, 32-bit proposal keys and skips coloured prefixes a bit word "
               "at a time; opt-in: 1.4 % faster at blk 64, 1 % slower at blk 128 on the H100), "
               "ordscan=N (the entries each proposal scan of the order kernel "
               "checks at once, 1..16, default 4; the same order), "
               "relaxpoll (deterministic: the query tile's semaphore is polled with relaxed "
               "loads and one fence after them, instead of acquire loads; slower on the "
               "H200), "
               "detstream (deterministic in the schedule order, not with causal=True: the "
               "order kernel and the "
               "backward are launched by one call, with pdl the backward as its programmatic "
               "dependent as soon as the order kernel starts, and each CTA reads its list "
               "entries and ranks as the order kernel publishes them, instead of after it "
               "completes), nodetstream (the order kernel completes before the backward "
               "starts; the default), "
               "detoverlap (with detstream, without causal=True and an lse cotangent, with the "
               "preprocessing kernel that zeroes the workspace and one dtype for q, do and "
               "out; ignored otherwise: the preprocessing launch (delta, the zeroed dQ "
               "workspace) joins that call between the order kernel and the backward; "
               "measured no faster)"),
    _choice("bsa_pre_impl", "JAX_SPARSE_ATTN_BSA_PRE_IMPL", ("kernel", "kernel4", "delta", "xla"),
            "BSA backward preprocessing (delta = rowsum(dO*O), zeroed fp32 dQ workspace): "
            "kernel (one CuTe DSL launch computes delta and zeroes the workspace), kernel4 (that "
            "launch with each thread's loads of four rows issued together, a quarter of the "
            "CTAs; opt-in, slower on the H200), delta (the launch computes delta, an XLA memset "
            "zeroes the workspace) or xla (XLA fusions)"),
    _choice("bsa_kq_impl", "JAX_SPARSE_ATTN_BSA_KQ_IMPL", ("items", "kernel", "xla"),
            "K->Q block lists of the Hopper BSA backwards (default mode): items (one CuTe "
            "DSL launch, one thread-block cluster: kernels/bsa_kq_lists.py, which also "
            "computes the work items of the sm90ws backward's bucket split where a (batch, "
            "KV head) has at most 2048 items, else XLA fusions compute them; where its "
            "shared memory does not hold a (batch, KV head)'s bitmap or the row lengths, "
            "the XLA lists), kernel (that launch, the work items from XLA fusions) or xla "
            "(XLA fusions, metadata.build_kq_csr)"),
    Switch("bsa_fwd_q_in_regs", "JAX_SPARSE_ATTN_BSA_FWD_Q_IN_REGS", _TRUE + _FALSE,
           _parse_bool, True, "BSA sm80 forward keeps Q fragments in registers for D <= 128"),
    Switch("bsa_fwd_min_blocks", "JAX_SPARSE_ATTN_BSA_FWD_MIN_BLOCKS", "integer >= 0",
           _parse_count, 0, "BSA sm80 forward: minimum resident CTAs per SM hint (0 = none)"),
    _choice("bsa_fwd_warp_rows", "JAX_SPARSE_ATTN_BSA_FWD_WARP_ROWS", ("auto", "16", "32"),
            "BSA sm80 forward: query rows per warp (16: blk/16 warps; 32: blk/32 warps, each "
            "warp reads K and V from shared memory once for twice the rows; it fits the "
            "registers only at sparse_block_size 64 with D <= 128, elsewhere it spills); auto: "
            "32 at sparse_block_size 64 with D in {64, 128}, else 16"),
    Switch("bsa_fwd_late_v_wait", "JAX_SPARSE_ATTN_BSA_FWD_LATE_V_WAIT", _TRUE + _FALSE,
           _parse_bool, False, "BSA sm80 forward: the online softmax of a block runs before "
                               "the wait for its V block (the next K load starts after it)"),
    Switch("bsa_bwd_min_blocks", "JAX_SPARSE_ATTN_BSA_BWD_MIN_BLOCKS", "integer >= 0",
           _parse_count, None, "BSA sm80 backward: minimum resident CTAs per SM hint "
                               "(unset: 2 for D <= 128, else 1)"),
    _choice("kernel_family", "JAX_SPARSE_ATTN_KERNEL_FAMILY",
            ("auto", "portable", "portable_sm8x"),
            "kernel family of the kernel backend: auto (the best family of the GPU: the Hopper "
            "kernels of the *_impl switches on compute capability 9.0, the portable mma.sync "
            "sm80 kernels on 8.0, 8.6, 8.9, 10.0, 10.3, 12.0), portable (the sm80 kernels for "
            "every op and pass whatever the *_impl switches say; runs them on an H100/H200 "
            "for testing and comparison), portable_sm8x (portable with the sm_8x code path: "
            "scalar fp32 red.global.add in place of the sm_90+ vector form; with "
            "smem_limit_kb=99 an H200 runs the configuration of compute capability 8.6/8.9)"),
    Switch("smem_limit_kb", "JAX_SPARSE_ATTN_SMEM_LIMIT_KB", "integer KiB in 16..227",
           _parse_kb, None, "shared memory per block the portable kernels' tiles must fit "
           "(testing: 99 on an H200 selects the tiles of compute capability 8.6/8.9/12.0, "
           "163 those of 8.0); unset: the GPU's own limit. Never raises the GPU's limit"),
    _choice("cute_call", "JAX_SPARSE_ATTN_CUTE_CALL", ("shared", "per_shape"),
            "how the kernel calls are built and compiled: shared (jax_sparse_attn._cute_call: "
            "one CuTe DSL compile per compile key for every shape, optional on-disk cache), "
            "per_shape (plain cutlass.jax.cutlass_call: one compile per shape, the generated "
            "code of the kernels as validated before the shared layer)"),
    Switch("pdl", "JAX_SPARSE_ATTN_PDL", _TRUE + _FALSE, _parse_bool, True,
           "programmatic dependent launch of the Hopper kernels (sm90ws / sm90 forwards and "
           "backwards, the HSTU tile schedule, the block-sparse preprocessing and the dQ "
           "reordering kernels): each is launched with CUDA's programmatic stream "
           "serialization attribute and waits (griddepcontrol.wait) for the previous grid "
           "before its first global memory access, so its launch overlaps the previous "
           "kernel's end; the tile schedule and the preprocessing let their dependents "
           "launch at once. The portable kernels ignore it"),
    Switch("det_writer", "JAX_SPARSE_ATTN_DET_WRITER", _TRUE + _FALSE, _parse_bool, True,
           "deterministic=True on the Hopper backwards with the dQ tile workspace (HSTU sm90 "
           "with hstu_bwd_dq=tile at D <= 128, BSA sm90ws with bsa_bwd_dq=tile; tuning / "
           "ablation): on, the ordering warp also issues each query tile's bulk reductions "
           "once the tile's semaphore allows, as FlashAttention-3's dQ writer warp does, so "
           "the consumer warpgroups stage a tile's dQ and go on instead of waiting for their "
           "turn; off, the consumers wait for their turn and add the tile themselves"),
    _choice("dq_writer", "JAX_SPARSE_ATTN_DQ_WRITER", ("auto", "on", "off"),
            "deterministic=False on the Hopper backwards with the dQ tile workspace (HSTU sm90 "
            "with hstu_bwd_dq=tile, BSA sm90ws with bsa_bwd_dq=tile; tuning / ablation): "
            "where it is used, warp 1 of the producer warpgroup issues every step's bulk "
            "reductions of the staged dQ (and, where the dQ is staged in the step's Q / dO "
            "stage, hands the stage back to the producer), so the consumer warpgroups stage a "
            "step's dQ and go on instead of waiting until the bulk copies have read it; "
            "otherwise each consumer warp adds its own slice. auto: the block-sparse "
            "backward at every block size and head dim, the HSTU backward at D = 256 (its dQ "
            "staged in the Q / dO stage); on: also the HSTU backward at D <= 128; off: "
            "nowhere"),
    Switch("force_kernel", "JAX_SPARSE_ATTN_FORCE_KERNEL", _TRUE + _FALSE, _parse_bool, False,
           "skip the GPU check of backend selection, so that a CPU machine lowers the kernel "
           "path for lowering_platforms=('cuda',) (target arch: CUTE_DSL_ARCH, default "
           "sm_90a)"),
)
_FORCE_KERNEL = SWITCHES[-1]
_DEFAULT = {sw.field: sw.default for sw in SWITCHES}


@dataclasses.dataclass(frozen=True)
class Switches:
    """Implementation switches of the kernel backend (see :data:`SWITCHES`).

    ``None`` tiles / min-block counts mean the kernel's default for the call's head dims.
    Build with :func:`from_env` or directly, e.g. ``Switches(hstu_fwd_impl="sm80")``;
    field values are validated like the environment variables. Each field takes its Python
    value (a bool, an int, a tuple such as ``hstu_fwd_tile=(64, 64, 4)`` or a tuple of
    option names such as ``hstu_fwd_ws=("nopingpong", "bn=64")``) or the environment
    variable's text for it (``"true"``, ``"64,64,4"``, ``"nopingpong,bn=64"``), which is
    parsed into that value; a list is taken as a tuple. Raises ``ValueError`` for a value
    the switch does not allow.
    """

    hstu_fwd_impl: str = _DEFAULT["hstu_fwd_impl"]
    hstu_fwd_ws: tuple = _DEFAULT["hstu_fwd_ws"]
    hstu_fwd_tile: tuple | None = _DEFAULT["hstu_fwd_tile"]
    hstu_schedule: str = _DEFAULT["hstu_schedule"]
    hstu_bwd_impl: str = _DEFAULT["hstu_bwd_impl"]
    hstu_bwd_dq: str = _DEFAULT["hstu_bwd_dq"]
    hstu_bwd_order: str = _DEFAULT["hstu_bwd_order"]
    hstu_bwd_tile: tuple | None = _DEFAULT["hstu_bwd_tile"]
    bsa_fwd_impl: str = _DEFAULT["bsa_fwd_impl"]
    bsa_fwd_ws: tuple = _DEFAULT["bsa_fwd_ws"]
    bsa_bwd_impl: str = _DEFAULT["bsa_bwd_impl"]
    bsa_bwd_dq: str = _DEFAULT["bsa_bwd_dq"]
    bsa_bwd_ws: tuple = _DEFAULT["bsa_bwd_ws"]
    hstu_bwd_ws: tuple = _DEFAULT["hstu_bwd_ws"]
    bsa_pre_impl: str = _DEFAULT["bsa_pre_impl"]
    bsa_kq_impl: str = _DEFAULT["bsa_kq_impl"]
    bsa_fwd_q_in_regs: bool = _DEFAULT["bsa_fwd_q_in_regs"]
    bsa_fwd_min_blocks: int = _DEFAULT["bsa_fwd_min_blocks"]
    bsa_fwd_late_v_wait: bool = _DEFAULT["bsa_fwd_late_v_wait"]
    bsa_fwd_warp_rows: str = _DEFAULT["bsa_fwd_warp_rows"]
    bsa_bwd_min_blocks: int | None = _DEFAULT["bsa_bwd_min_blocks"]
    kernel_family: str = _DEFAULT["kernel_family"]
    smem_limit_kb: int | None = _DEFAULT["smem_limit_kb"]
    cute_call: str = _DEFAULT["cute_call"]
    pdl: bool = _DEFAULT["pdl"]
    det_writer: bool = _DEFAULT["det_writer"]
    dq_writer: str = _DEFAULT["dq_writer"]

    def __post_init__(self):
        for sw in _switches_of(Switches):
            val = getattr(self, sw.field)
            where = f"Switches.{sw.field} (environment variable {sw.env})"
            if isinstance(val, list):
                val = tuple(val)
                object.__setattr__(self, sw.field, val)
            if isinstance(val, str) and not isinstance(sw.default, str):
                # the environment variable's text ("true", "64,64,4") -> its value
                val = sw.parse(where, val)
                object.__setattr__(self, sw.field, val)
            if sw.parse in (_parse_ws, _parse_bsa_ws, _parse_bsa_bwd_ws,
                            _parse_hstu_bwd_ws):
                if isinstance(val, str):
                    # "nopingpong,bn=64" -> tuple
                    val = sw.parse(where, val)
                    object.__setattr__(self, sw.field, val)
                elif isinstance(val, tuple) and all(isinstance(o, str) for o in val):
                    # a tuple of options: the parser's own message (unknown or
                    # contradicting options) when it is not allowed
                    sw.parse(where, _raw(val))
            if val is None and sw.default is None:
                continue
            ok = isinstance(val, bool) if sw.parse is _parse_bool else not isinstance(val, bool)
            try:
                ok = ok and sw.parse(sw.env, _raw(val)) == val
            except ValueError:
                ok = False
            if not ok:
                raise ValueError(f"{where} = {val!r} is not allowed; allowed: "
                                 f"{_allowed_text(sw)}{_python_type_hint(sw)}")


def _raw(val) -> str:
    if isinstance(val, bool):
        return "1" if val else "0"
    if isinstance(val, tuple):
        return ",".join(map(str, val))
    return str(val)


def _python_type_hint(sw) -> str:
    """How :class:`Switches` takes the value of ``sw`` besides the environment text."""
    if sw.parse is _parse_bool:
        return " (a Python bool, or that text)"
    if isinstance(sw.default, tuple) or sw.parse is _parse_tile:
        return " (a tuple, or that text)"
    if isinstance(sw.default, int) or sw.default is None:
        return " (a Python value, or that text)"
    return ""


def _allowed_text(sw) -> str:
    return ", ".join(sw.allowed) if isinstance(sw.allowed, tuple) else sw.allowed


def _switches_of(cls):
    names = {f.name for f in dataclasses.fields(cls)}
    return [sw for sw in SWITCHES if sw.field in names]


def _read(sw, env):
    raw = env.get(sw.env, "")
    return None if raw == "" else sw.parse(sw.env, raw)


def from_env(environ: Mapping[str, str] | None = None) -> Switches:
    """The :class:`Switches` set by the environment (``os.environ`` by default).

    Unset or empty variables keep the defaults. Raises ``ValueError`` naming the variable
    and its allowed values for any other value of any variable in :data:`SWITCHES`
    (``JAX_SPARSE_ATTN_FORCE_KERNEL`` included, which :func:`force_kernel` reads).
    """
    env = os.environ if environ is None else environ
    force_kernel(env)
    vals = {sw.field: _read(sw, env) for sw in _switches_of(Switches)}
    return Switches(**{k: v for k, v in vals.items() if v is not None})


def force_kernel(environ: Mapping[str, str] | None = None) -> bool:
    """``JAX_SPARSE_ATTN_FORCE_KERNEL``: skip the device check of backend selection (CPU
    lowering of the kernel path); ValueError for a value outside 0/1/true/false."""
    env = os.environ if environ is None else environ
    return bool(_read(_FORCE_KERNEL, env))


def switches_table() -> str:
    """The switches as a Markdown table (docs/design.md embeds it)."""
    rows = ["| variable | `Switches` field | allowed | default | meaning |",
            "|---|---|---|---|---|"]
    fields = {sw.field for sw in _switches_of(Switches)}
    for sw in SWITCHES:
        field = f"`{sw.field}`" if sw.field in fields else "(environment only)"
        default = "unset" if sw.default is None else (_raw(sw.default) or "empty")
        rows.append(f"| `{sw.env}` | {field} | {_allowed_text(sw)} | {default} | {sw.doc} |")
    return "\n".join(rows)


# ----------------------------------------------------------------------------- op configs


@dataclasses.dataclass(frozen=True)
class HSTUConfig:
    """Static options of one HSTU call (the ``custom_vjp`` nondiff argument).

    The first group comes from the validated arguments (:func:`~jax_sparse_attn.validation.
    check_hstu_args`); ``backend``, the padded head dims and the kernel compile keys are
    filled by the public layer once the backend is chosen. ``head_dim_pad`` /
    ``head_dim_v_pad`` are the head dims the kernels run at (q/k/v zero-padded, the output
    sliced back); they equal the true dims on the reference backend.
    """

    dtype: str
    head_dim: int
    head_dim_v: int
    max_seqlen_q: int
    max_seqlen_k: int
    scaling_seqlen: float
    window_size: tuple
    alpha: float
    paged: bool
    func_n: int  # endpoint rows of func; 0 without func
    backend: str = "reference"  # resolved: "kernel" or "reference"
    head_dim_pad: int = 0
    head_dim_v_pad: int = 0
    fwd: object = None  # ffi.hstu.HstuFwdConfig (kernel backend)
    bwd: object = None  # ffi.hstu.HstuBwdConfig (kernel backend, not paged)
    # relative attention bias: H_rab (0 = no rab: the kernels compile without bias code)
    # and rab's dtype name ("" without rab)
    rab_heads: int = 0
    rab_per_head: bool = False  # H_rab == H
    rab_dtype: str = ""
    cute_call: str = "shared"  # kernel backend: Switches.cute_call (how kernel calls compile)
    # kernel backend: the target arch (CuTe DSL name, e.g. "sm_86") and the kernel family
    # chosen for it ("sm90": Hopper kernels; "portable": the mma.sync sm80 kernels)
    kernel_arch: str = ""
    kernel_family: str = ""
    # bitwise reproducible backward (fixed order of the dq / shared-head drab additions);
    # the backward compile key ``bwd`` carries it too
    deterministic: bool = False
    schedule: str = "kernel"  # kernel backend: Switches.hstu_schedule (forward tile schedule)
    # query heads H and key/value heads H_kv (H_kv divides H; H_kv < H: GQA/MQA, query head h
    # reads KV head h // (H / H_kv)); 0 = not recorded
    num_heads: int = 0
    num_heads_kv: int = 0
    # kernel backend: the split-KV setting of the forward (1 = no split)
    kv_splits: int = 1

    @property
    def kv_group(self) -> int:
        """Query heads per KV head (1 without GQA)."""
        return self.num_heads // self.num_heads_kv if self.num_heads_kv else 1

    @property
    def has_func(self) -> bool:
        return self.func_n > 0

    @property
    def has_rab(self) -> bool:
        return self.rab_heads > 0


@dataclasses.dataclass(frozen=True)
class BSAConfig:
    """Static options of one block-sparse attention call (the ``custom_vjp`` nondiff
    argument). Shapes are in bhsd order whatever the layout. ``num_q_blocks`` counts the
    query blocks of the metadata rows: ``N_q = ceil(S_q / blk)``, or with ``pack_gqa``
    ``N_qp = ceil(S_q r / blk)`` (rows per KV head, ``r = H_q / H_kv``). ``kv_splits`` is
    the requested int or ``"auto"``. ``fwd`` / ``bwd`` / ``pre`` are the kernel compile keys
    (kernel backend; ``pre`` None = XLA preprocessing)."""

    dtype: str
    layout: str
    sparse_block_size: int
    softmax_scale: float
    block_sparse_num: int | None
    allow_empty_block_nums: bool
    has_block_sizes: bool
    batch: int
    num_heads_q: int
    num_heads_kv: int
    seqlen_q: int
    seqlen_kv: int
    head_dim: int
    head_dim_v: int
    num_q_blocks: int
    num_kv_blocks: int
    k_max: int
    kv_splits: int | str = 1
    pack_gqa: bool = False
    causal: bool = False
    # bitwise reproducible backward (ordered dQ additions; the reference is deterministic)
    deterministic: bool = False
    backend: str = "reference"
    fwd: object = None  # ffi.bsa.BsaFwdConfig
    bwd: object = None  # ffi.bsa.BsaBwdConfig
    pre: object = None  # ffi.bsa.BsaPreConfig, or None for the XLA preprocessing
    # the backward's K->Q lists by the one-launch kernel (Switches.bsa_kq_impl "items" or
    # "kernel")
    kq_kernel: bool = False
    # with kq_kernel: the bucket split's work items by the same launch (bsa_kq_impl="items")
    kq_items: bool = False
    cute_call: str = "shared"  # kernel backend: Switches.cute_call (how kernel calls compile)
    kernel_arch: str = ""  # kernel backend: target arch and kernel family, as in HSTUConfig
    kernel_family: str = ""
