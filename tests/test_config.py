"""The implementation-switch registry (jax_sparse_attn.config)."""

from __future__ import annotations

import re

import jax.numpy as jnp
import numpy as np
import pytest

import jax_sparse_attn as jsa
from jax_sparse_attn import config
from jax_sparse_attn.ffi.hstu import ws_options

BAD = {"JAX_SPARSE_ATTN_HSTU_FWD_TILE": "128,64", "JAX_SPARSE_ATTN_HSTU_BWD_TILE": "a,b,c",
       "JAX_SPARSE_ATTN_BSA_FWD_MIN_BLOCKS": "-1", "JAX_SPARSE_ATTN_BSA_BWD_MIN_BLOCKS": "two",
       "JAX_SPARSE_ATTN_HSTU_WS": "nopingpong,sm99", "JAX_SPARSE_ATTN_SMEM_LIMIT_KB": "300"}


@pytest.mark.parametrize("sw", config.SWITCHES, ids=lambda sw: sw.env)
def test_unknown_switch_value_names_variable_and_allowed_values(sw, monkeypatch):
    bad = BAD.get(sw.env, "sm99")
    allowed = ", ".join(sw.allowed) if isinstance(sw.allowed, tuple) else sw.allowed
    with pytest.raises(ValueError, match=re.escape(sw.env)) as e:
        config.from_env({sw.env: bad})
    text = str(e.value)
    assert bad in text
    if isinstance(sw.allowed, tuple):
        assert all(a in text for a in sw.allowed), text
    else:
        assert "integer" in text or sw.allowed in text, text
    # the public ops read the environment on every call (any backend) and fail the same way
    monkeypatch.setenv(sw.env, bad)
    q = jnp.ones((4, 1, 8), jnp.float32)
    cu = np.array([0, 4], np.int32)
    with pytest.raises(ValueError, match=re.escape(sw.env)):
        jsa.hstu_attention(q, q, q, cu, cu, max_seqlen_q=4, max_seqlen_k=4)
    assert allowed  # the docs table has something to show


def test_from_env_reads_every_switch():
    env = {"JAX_SPARSE_ATTN_HSTU_FWD_IMPL": "sm80", "JAX_SPARSE_ATTN_HSTU_FWD_TILE": "64,64,4",
           "JAX_SPARSE_ATTN_HSTU_BWD_TILE": "64,64,8", "JAX_SPARSE_ATTN_HSTU_BWD_IMPL": "sm90",
           "JAX_SPARSE_ATTN_HSTU_BWD_DQ": "bulk", "JAX_SPARSE_ATTN_HSTU_SCHEDULE": "xla",
           "JAX_SPARSE_ATTN_HSTU_BWD_ORDER": "seq", "JAX_SPARSE_ATTN_HSTU_BWD_WS": "splitwait",
           "JAX_SPARSE_ATTN_BSA_FWD_IMPL": "sm80",
           "JAX_SPARSE_ATTN_BSA_BWD_IMPL": "sm80", "JAX_SPARSE_ATTN_BSA_PRE_IMPL": "xla",
           "JAX_SPARSE_ATTN_BSA_KQ_IMPL": "xla",
           "JAX_SPARSE_ATTN_BSA_FWD_Q_IN_REGS": "0", "JAX_SPARSE_ATTN_BSA_FWD_MIN_BLOCKS": "2",
           "JAX_SPARSE_ATTN_BSA_FWD_LATE_V_WAIT": "1", "JAX_SPARSE_ATTN_BSA_FWD_WARP_ROWS": "32",
           "JAX_SPARSE_ATTN_BSA_BWD_MIN_BLOCKS": "1", "JAX_SPARSE_ATTN_FORCE_KERNEL": "true",
           "JAX_SPARSE_ATTN_HSTU_WS": "nopingpong, bn=64", "JAX_SPARSE_ATTN_BSA_WS": "q1,stages=3",
           "JAX_SPARSE_ATTN_BSA_BWD_WS": "ldwait,stages=2", "JAX_SPARSE_ATTN_BSA_BWD_DQ": "rows",
           "JAX_SPARSE_ATTN_CUTE_CALL": "per_shape", "JAX_SPARSE_ATTN_KERNEL_FAMILY": "portable",
           "JAX_SPARSE_ATTN_SMEM_LIMIT_KB": "99", "JAX_SPARSE_ATTN_PDL": "0",
           "JAX_SPARSE_ATTN_DET_WRITER": "1", "JAX_SPARSE_ATTN_DQ_WRITER": "off"}
    assert set(env) == {sw.env for sw in config.SWITCHES}
    assert config.from_env(env) == config.Switches(
        hstu_fwd_impl="sm80", hstu_fwd_ws=("nopingpong", "bn=64"), hstu_fwd_tile=(64, 64, 4),
        hstu_bwd_tile=(64, 64, 8), hstu_bwd_impl="sm90", hstu_bwd_dq="bulk",
        hstu_bwd_order="seq", hstu_bwd_ws=("splitwait",), hstu_schedule="xla", bsa_fwd_impl="sm80", bsa_fwd_ws=("q1", "stages=3"), bsa_bwd_impl="sm80",
        bsa_bwd_ws=("ldwait", "stages=2"), bsa_bwd_dq="rows",
        bsa_pre_impl="xla", bsa_kq_impl="xla", bsa_fwd_q_in_regs=False, bsa_fwd_min_blocks=2, bsa_bwd_min_blocks=1,
        bsa_fwd_late_v_wait=True, bsa_fwd_warp_rows="32", cute_call="per_shape", kernel_family="portable", smem_limit_kb=99,
        pdl=False, det_writer=True, dq_writer="off")
    assert config.force_kernel(env) and not config.force_kernel({})
    assert config.from_env({}) == config.Switches()
    assert config.from_env({"JAX_SPARSE_ATTN_HSTU_FWD_IMPL": ""}) == config.Switches()


@pytest.mark.parametrize("field,value", [("hstu_fwd_impl", "sm99"), ("hstu_fwd_impl", "sm90pp"),
                                         ("hstu_bwd_impl", "sm90ws"), ("hstu_bwd_dq", "tma"),
                                         ("hstu_schedule", "gpu"),
                                         ("cute_call", "per-shape"),
                                         ("hstu_fwd_ws", ("bn=70",)), ("hstu_fwd_ws", "q1,q1"),
                                         ("hstu_fwd_ws", ["q1", "q1"]), ("bsa_pre_impl", None),
                                         ("hstu_fwd_tile", (1, 2)), ("bsa_fwd_q_in_regs", 1),
                                         ("bsa_bwd_min_blocks", -2), ("bsa_fwd_min_blocks", True),
                                         ("bsa_fwd_impl", "sm90pp"), ("bsa_fwd_ws", "bn=64"),
                                         ("bsa_fwd_ws", "stages=9"), ("bsa_fwd_ws", "q1,q1"),
                                         ("bsa_bwd_ws", "stages=5"), ("bsa_bwd_ws", "q1"),
                                         ("bsa_bwd_dq", "red"),
                                         ("kernel_family", "sm80"), ("smem_limit_kb", 228),
                                         ("smem_limit_kb", "228"), ("smem_limit_kb", True),
                                         ("bsa_fwd_q_in_regs", "maybe"),
                                         ("hstu_fwd_tile", "64,64")])
def test_switches_fields_are_validated(field, value):
    env = next(sw.env for sw in config.SWITCHES if sw.field == field)
    with pytest.raises(ValueError, match=re.escape(env)):
        config.Switches(**{field: value})


@pytest.mark.parametrize("field,value,want", [
    ("bsa_fwd_q_in_regs", "true", True), ("pdl", "0", False),
    ("hstu_fwd_tile", "64,64,4", (64, 64, 4)), ("hstu_fwd_tile", [64, 64, 4], (64, 64, 4)),
    ("hstu_fwd_ws", ["q1"], ("q1",)), ("bsa_bwd_ws", "nowghand", ("nowghand",)),
    ("smem_limit_kb", "99", 99), ("bsa_bwd_min_blocks", "2", 2)])
def test_switches_fields_take_the_environment_text(field, value, want):
    """A field takes its Python value or the environment variable's text for it (parsed
    into that value); a list is taken as a tuple, so the Switches stay hashable."""
    sw = config.Switches(**{field: value})
    assert getattr(sw, field) == want and type(getattr(sw, field)) is type(want)
    hash(sw)


def test_switches_type_error_message_names_the_python_type():
    """A value of the wrong Python type: the message says what the field takes."""
    with pytest.raises(ValueError, match=r"a Python bool, or that text"):
        config.Switches(bsa_fwd_q_in_regs=3)
    with pytest.raises(ValueError, match=r"a tuple, or that text"):
        config.Switches(hstu_fwd_tile=(64, 64))


@pytest.mark.parametrize("raw,want", [("", None), ("splitwait", True), ("nosplitwait", False),
                                      ("q1,splitwait,stages=3", True)])
def test_bsa_split_wait_option(raw, want):
    """bsa_fwd_ws's splitwait / nosplitwait force the re-check of the V barrier before the
    PV wait; unset, the compile key takes it at blk 64 with D 128 only; both is an error."""
    from jax_sparse_attn.ffi import bsa as ffi_bsa  # noqa: PLC0415

    sw = config.from_env({"JAX_SPARSE_ATTN_BSA_WS": raw})
    assert ffi_bsa.bsa_ws_options(sw.bsa_fwd_ws)["split_wait"] is want
    sw = config.Switches(bsa_fwd_impl="sm90ws", bsa_fwd_ws=raw)
    for blk, d in ((64, 128), (128, 128), (64, 64), (128, 64)):
        cfg = ffi_bsa.fwd_config(jnp.bfloat16, d, blk, False, sw)
        assert cfg.ws_split_wait is (want if want is not None else (blk, d) == (64, 128))
    with pytest.raises(ValueError, match="JAX_SPARSE_ATTN_BSA_WS.*exclude each other"):
        config.from_env({"JAX_SPARSE_ATTN_BSA_WS": "splitwait,nosplitwait"})


@pytest.mark.parametrize("raw", ["", "splitwait", " splitwait , "])
def test_hstu_bwd_ws_option(raw):
    """hstu_bwd_ws takes splitwait, which the sm90 backward's compile key keeps at the head
    dims with 64-query tiles (D 128, 256) and drops at D 64 (128-query tiles, no overlap of
    the score function with the dP^T GEMM)."""
    from jax_sparse_attn.ffi import hstu as fh  # noqa: PLC0415

    sw = config.from_env({"JAX_SPARSE_ATTN_HSTU_BWD_WS": raw})
    want = "splitwait" in raw
    assert sw.hstu_bwd_ws == (("splitwait",) if want else ()) == config.Switches(
        hstu_bwd_ws=raw).hstu_bwd_ws
    for d in (64, 128, 256):
        key = fh.bwd_config("bfloat16", d, d, 0, sw)
        assert key.impl == "sm90" and key.split_wait is (want and d > 64), d
    assert not fh.bwd_config("bfloat16", 128, 128, 0, config.Switches(
        hstu_bwd_ws="splitwait,epi16")).epi_pairs
    assert fh.bwd_config("bfloat16", 128, 128, 0, sw).epi_pairs
    assert fh.bwd_config("bfloat16", 128, 128, 0, sw).epi_smem
    for bad in ("splitwait,splitwait", "split", "nosplitwait", "stages=2"):
        with pytest.raises(ValueError, match="JAX_SPARSE_ATTN_HSTU_BWD_WS.*splitwait"):
            config.from_env({"JAX_SPARSE_ATTN_HSTU_BWD_WS": bad})


@pytest.mark.parametrize("raw,split,lse_early", [("", False, True), ("splitwait", True, True),
                                                 ("lselate", False, False),
                                                 ("splitwait,lselate,stages=3", True, False)])
def test_bsa_bwd_ws_split_and_lse_options(raw, split, lse_early):
    """bsa_bwd_ws's splitwait (P^T before the dP^T wait in its own basic block; opt-in) and
    lselate (the lse read while the GEMMs are issued; the default reads it before) reach the
    sm90ws backward's compile key at every block size and head dim; dK / dV go through
    shared memory unless epiregs or epi16, as packed pairs unless epi16."""
    from jax_sparse_attn.ffi import bsa as ffi_bsa  # noqa: PLC0415

    sw = config.from_env({"JAX_SPARSE_ATTN_BSA_BWD_WS": raw, "JAX_SPARSE_ATTN_BSA_BWD_IMPL":
                          "sm90ws"})
    for blk, d in ((64, 128), (128, 128), (64, 64), (128, 64)):
        key = ffi_bsa.bwd_config(jnp.bfloat16, d, blk, False, sw)
        assert (key.impl, key.ws_split_wait, key.ws_lse_early) == ("sm90ws", split, lse_early)
        assert key.ws_epi_pairs is True and key.ws_epi_smem is True
    key = ffi_bsa.bwd_config(jnp.bfloat16, 128, 64, False, config.Switches(
        bsa_bwd_impl="sm90ws", bsa_bwd_ws="epi16," + raw if raw else "epi16"))
    assert not key.ws_epi_pairs and not key.ws_epi_smem and key.ws_split_wait is split
    key = ffi_bsa.bwd_config(jnp.bfloat16, 128, 64, False, config.Switches(
        bsa_bwd_impl="sm90ws", bsa_bwd_ws="epiregs," + raw if raw else "epiregs"))
    assert key.ws_epi_pairs and not key.ws_epi_smem and key.ws_split_wait is split


def test_removed_sm90_bsa_forward_is_rejected():
    """The cp.async wgmma BSA forward (bsa_fwd_impl="sm90") was removed: the value is an error
    naming the allowed ones (the BSA backward keeps its "sm90")."""
    env = "JAX_SPARSE_ATTN_BSA_FWD_IMPL"
    assert config.Switches().bsa_fwd_impl == "auto"
    with pytest.raises(ValueError, match=re.escape(env) + ".*auto, sm90ws, sm80"):
        config.Switches(bsa_fwd_impl="sm90")
    with pytest.raises(ValueError, match=re.escape(env) + ".*'auto', 'sm90ws', 'sm80'"):
        config.from_env({env: "sm90"})
    assert config.Switches(bsa_bwd_impl="sm90").bsa_bwd_impl == "sm90"


@pytest.mark.parametrize("raw", ["nooverlap", "nopingpong", "q1", "epivec", "silu16", "tanh16", "pagepf",
                                 "qalias", "cross", "crossepi", "vlag", "headouter", "roundrobin", "dynamic",
                                 "bn=16",
                                 "bn=256",
                                 "bn=80,q1", "nooverlap,nopingpong,q1,silu16,bn=192", " q1 , ",
                                 "chunk=1", "dynamic,chunk=24576,bn=64", "static", "chunk=0",
                                 "static,chunk=64", "roundrobin,q1", "qscale",
                                 "qscale,static,bn=64", "noqscale", "noqscale,q1", "wg3",
                                 "wg3,static,noqscale,bn=64", "wg2", "plate,wg2",
                                 "splitwait", "splitwait,wg3", "noepivec", "noepivec,wg3",
                                 "tmao", "tmao,wg3,static", "notmao", "notmao,wg3",
                                 "rabpf", "rabpf,vlag"])
def test_sm90ws_variants_parse(raw):
    """Every option of hstu_fwd_ws is accepted alone and combined; the string form of a
    Switches field is the environment's; ffi.hstu.ws_options reads them."""
    sw = config.from_env({"JAX_SPARSE_ATTN_HSTU_WS": raw})
    opts = tuple(o.strip() for o in raw.split(",") if o.strip())
    assert sw.hstu_fwd_ws == opts == config.Switches(hstu_fwd_ws=raw).hstu_fwd_ws
    got = ws_options(sw.hstu_fwd_ws)
    bn = [int(o[3:]) for o in opts if o.startswith("bn=")]
    # the dynamic deal is the default; the chunked order (16 MiB default) goes with it
    dynamic = "static" not in opts and "roundrobin" not in opts
    chunk = int(raw.split("chunk=")[1].split(",")[0]) if "chunk=" in raw else 16384
    chunk = chunk if dynamic else 0
    assert got == {"overlap": "nooverlap" not in opts, "pingpong": "nopingpong" not in opts,
                   "q_stages": 1 if "q1" in opts else 2, "silu16": "silu16" in opts,
                   "tanh16": "tanh16" in opts, "page_prefetch": "pagepf" in opts,
                   "q_alias": "qalias" in opts,
                   "cross": 2 if "crossepi" in opts else 1 if "cross" in opts else 0,
                   "v_lag": "vlag" in opts, "head_outer": "headouter" in opts,
                   "snake": "roundrobin" not in opts, "dynamic": dynamic,
                   "q_scale": (True if "qscale" in opts else False if "noqscale" in opts
                               else None),
                   "num_wg": 3 if "wg3" in opts else 2 if "wg2" in opts else None,
                   "p_late": "plate" in opts, "split_wait": "splitwait" in opts,
                   "epi_vec": "noepivec" not in opts,
                   "tma_o": "notmao" not in opts and "noepivec" not in opts,
                   "rab_prefetch": "rabpf" in opts,
                   "bn": bn[0] if bn else 0, "chunk": chunk}


@pytest.mark.parametrize("raw", ["bn=0", "bn=8", "bn=272", "bn=64x", "bn=", "bn", "q2",
                                 "nopingpong,nopingpong", "bn=64,bn=128", "NOOVERLAP",
                                 "chunk=-1", "chunk=1048577", "chunk=2,chunk=4", "chunk=1k",
                                 "dynamic,static", "roundrobin,dynamic",
                                 "qscale,noqscale", "wg2,wg3", "epivec,noepivec",
                                 "tmao,noepivec", "tmao,notmao"])
def test_sm90ws_variants_reject(raw):
    with pytest.raises(ValueError, match="JAX_SPARSE_ATTN_HSTU_WS") as e:
        config.from_env({"JAX_SPARSE_ATTN_HSTU_WS": raw})
    assert all(f in str(e.value) for f in config.WS_FLAGS) and "bn=N" in str(e.value) and "chunk=N" in str(e.value)


@pytest.mark.parametrize("raw", ["dqslots=0", "dqslots=5", "dqslots=2,dqslots=3", "dqslots",
                                 "detsched,detlaunch", "detkv,detfull", "detsched,detschedfull",
                                 "stages=1", "detstream,nodetstream",
                                 "packws,nopackws"])
def test_bsa_bwd_ws_rejects(raw):
    """dqslots=N takes 1..4, once; at most one deterministic order flag (they each choose
    the order); the message names the variable and every allowed value."""
    with pytest.raises(ValueError, match="JAX_SPARSE_ATTN_BSA_BWD_WS") as e:
        config.from_env({"JAX_SPARSE_ATTN_BSA_BWD_WS": raw})
    msg = str(e.value)
    assert all(f in msg for f in config.BSA_BWD_WS_FLAGS) and "dqslots=N" in msg
    # the same message for the Switches field, given as a string or as a tuple of options
    for val in (raw, tuple(raw.split(","))):
        with pytest.raises(ValueError, match=r"Switches\.bsa_bwd_ws") as e:
            config.Switches(bsa_bwd_ws=val)
        assert str(e.value).split(": ", 1)[1] == msg.split(": ", 1)[1]


@pytest.mark.parametrize("raw", ["dqslots=1", "dqslots=4", "detsched,dqslots=2",
                                 "detlaunch,stages=3,dqslots=2", "detstream", "nodetstream",
                                 "detsched,detstream,dqslots=2", "detoverlap",
                                 "nopackws", "packws,lpt"])
def test_bsa_bwd_ws_accepts(raw):
    assert config.from_env({"JAX_SPARSE_ATTN_BSA_BWD_WS": raw}).bsa_bwd_ws == tuple(raw.split(","))


def test_public_ops_reject_non_switches():
    q = jnp.ones((4, 1, 8), jnp.float32)
    cu = np.array([0, 4], np.int32)
    with pytest.raises(TypeError, match="switches must be"):
        jsa.hstu_attention(q, q, q, cu, cu, max_seqlen_q=4, max_seqlen_k=4,
                           switches={"hstu_fwd_impl": "sm80"})


def test_docs_table_lists_every_switch():
    import os  # noqa: PLC0415

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "docs", "design.md")) as f:
        text = f.read()
    assert config.switches_table() in text


@pytest.mark.parametrize("want,blk,d,rows", [
    ("auto", 64, 128, 32), ("auto", 64, 64, 32), ("auto", 128, 128, 16), ("auto", 64, 256, 16),
    ("auto", 64, 32, 16), ("16", 64, 128, 16), ("32", 128, 64, 32)])
def test_bsa_sm80_warp_rows_rule(want, blk, d, rows):
    """``bsa_fwd_warp_rows="auto"`` gives the sm80 forward 32 query rows per warp only where
    they fit the registers (sparse_block_size 64, D <= 128); explicit values are kept."""
    from jax_sparse_attn.ffi import bsa as ffi_bsa
    sw = config.Switches(kernel_family="portable", bsa_fwd_warp_rows=want)
    cfg = ffi_bsa.fwd_config(jnp.bfloat16, d, blk, False, sw)
    assert (cfg.impl, cfg.warp_rows) == ("sm80", rows)


def test_pdl_switch_reaches_the_hopper_compile_keys():
    """Switches.pdl (default on) sets the programmatic-dependent-launch flag of every Hopper
    compile key (HSTU forward / backward, block-sparse forward / backward / preprocessing);
    pdl=False and the portable kernel family clear it."""
    from jax_sparse_attn.ffi import bsa as fb  # noqa: PLC0415
    from jax_sparse_attn.ffi import hstu as fh  # noqa: PLC0415

    assert config.Switches().pdl is True
    for sw, want in ((config.Switches(), True), (config.Switches(pdl=False), False),
                     (config.Switches(kernel_family="portable"), False)):
        keys = (fh.fwd_config("bfloat16", 128, 128, 0, sw),
                fh.bwd_config("bfloat16", 128, 128, 0, sw),
                fb.fwd_config("bfloat16", 128, 64, False, sw),
                fb.bwd_config("bfloat16", 128, 64, False, sw),
                fb.pre_config("bfloat16", 128, sw))
        assert [k.pdl for k in keys] == [want] * 5, (sw, keys)
    with pytest.raises(ValueError, match="JAX_SPARSE_ATTN_PDL"):
        config.from_env({"JAX_SPARSE_ATTN_PDL": "maybe"})


def test_hstu_bwd_rab_calls_run_sm90_unless_rabsm80():
    """Backward calls with a relative attention bias run the sm90 kernel at D = D_v in
    {64, 128} (the compile key keeps rab's presence, H_rab == H and dtype; the dq workspace
    is zeroed: no det_store, dq_claim or in-kernel conversion); with the hstu_bwd_ws flag
    "rabsm80", and at other head dims, they run sm80 (the key records the replaced sm90);
    keys without rab do not change with the flag. The launch order "auto" is lpt for a bias
    shared by the heads without deterministic=True."""
    from jax_sparse_attn.ffi import hstu as fh  # noqa: PLC0415

    off = config.from_env({"JAX_SPARSE_ATTN_HSTU_BWD_WS": "rabsm80"})
    assert off.hstu_bwd_ws == ("rabsm80",) == config.Switches(hstu_bwd_ws="rabsm80").hstu_bwd_ws
    on = config.Switches()
    assert "rabsm80" not in on.hstu_bwd_ws
    with pytest.raises(ValueError, match="JAX_SPARSE_ATTN_HSTU_BWD_WS.*rabsm80"):
        config.from_env({"JAX_SPARSE_ATTN_HSTU_BWD_WS": "rab"})
    for d in (64, 128):
        for per_head, rdt in ((True, "bfloat16"), (False, "float32")):
            key = fh.bwd_config("bfloat16", d, d, 0, on, has_rab=True, rab_per_head=per_head,
                                rab_dtype=rdt)
            assert (key.impl, key.replaced_impl) == ("sm90", ""), d
            assert (key.has_rab, key.rab_per_head, key.rab_dtype) == (True, per_head, rdt)
            assert key.dq_tile and not key.dq_claim and not key.dq_convert_rows
            assert key.bwd_order == ("hlpt" if per_head else "lpt"), (d, per_head)
            base = fh.bwd_config("bfloat16", d, d, 0, off, has_rab=True,
                                 rab_per_head=per_head, rab_dtype=rdt)
            assert (base.impl, base.replaced_impl) == ("sm80", "sm90"), d
            assert base.has_rab and base.rab_per_head == per_head
            assert fh.bwd_sm90_unsupported_reason(d, d, True) is None
            assert "rabsm80" in fh.bwd_sm90_unsupported_reason(d, d, True, True)
            # an explicit order stays
            pinned = fh.bwd_config("bfloat16", d, d, 0, config.Switches(hstu_bwd_order="hlpt"),
                                   has_rab=True, rab_per_head=per_head, rab_dtype=rdt)
            assert pinned.bwd_order == "hlpt"
        # without rab the flag changes nothing
        assert fh.bwd_config("float16", d, d, 3, on) == fh.bwd_config("float16", d, d, 3, off)
        det = fh.bwd_config("bfloat16", d, d, 0, on, has_rab=True, rab_dtype="float32",
                            deterministic=True)
        assert det.impl == "sm90" and det.deterministic and not det.det_store
        assert det.bwd_order == ("lpt" if d == 64 else "hlpt")
        assert fh.bwd_config("bfloat16", d, d, 0, on, deterministic=True).det_store
    # the variants that leave the workspace unzeroed or convert in-kernel are dropped
    sw = config.Switches(hstu_bwd_ws="dqclaim,convert=512")
    key = fh.bwd_config("bfloat16", 128, 128, 0, sw, has_rab=True, rab_dtype="float32")
    assert key.impl == "sm90" and not key.dq_claim and key.dq_convert_rows == 0
    # D = 256, D != D_v and D = 32 run sm80 with rab
    for d, dv in ((256, 256), (64, 128), (32, 32)):
        key = fh.bwd_config("bfloat16", d, dv, 0, on, has_rab=True, rab_dtype="float32")
        assert (key.impl, key.replaced_impl) == ("sm80", "sm90"), (d, dv)
        assert fh.bwd_sm90_unsupported_reason(d, dv, True) is not None
    # hstu_bwd_impl="sm80" runs sm80 without recording a replacement
    key = fh.bwd_config("bfloat16", 128, 128, 0, config.Switches(hstu_bwd_impl="sm80"),
                        has_rab=True, rab_dtype="float32")
    assert (key.impl, key.replaced_impl) == ("sm80", "")


def test_hstu_bwd_rab_fast_path_flags():
    """The sm90 backward with rab takes the fast path of steps inside the bias, the producer's
    L2 prefetches of the bias rows and (H_rab = 1) scalar d rab adds by default; the
    hstu_bwd_ws flags norabfast / norabpf / nodrabs turn them off, drabpf adds prefetches of
    the shared d rab workspace. Keys without rab (and the sm80 keys) do not change with them."""
    from jax_sparse_attn.ffi import hstu as fh  # noqa: PLC0415

    flags = ("rab_fast", "rab_prefetch", "drab_prefetch", "drab_scalar")
    off = config.Switches(hstu_bwd_ws="norabfast,norabpf,nodrabs,drabpf")
    assert config.from_env({"JAX_SPARSE_ATTN_HSTU_BWD_WS": "norabfast,norabpf,nodrabs,drabpf"}
                           ).hstu_bwd_ws == off.hstu_bwd_ws
    for old in ("rabfast", "rabpf", "drabs"):
        with pytest.raises(ValueError, match="JAX_SPARSE_ATTN_HSTU_BWD_WS"):
            config.from_env({"JAX_SPARSE_ATTN_HSTU_BWD_WS": old})
    for d in (64, 128):
        for per_head, rdt in ((True, "bfloat16"), (False, "float32")):
            kw = dict(has_rab=True, rab_per_head=per_head, rab_dtype=rdt)
            key = fh.bwd_config("bfloat16", d, d, 0, config.Switches(), **kw)
            assert tuple(getattr(key, f) for f in flags) == (True, True, False, True)
            key = fh.bwd_config("bfloat16", d, d, 0, off, **kw)
            assert tuple(getattr(key, f) for f in flags) == (False, False, True, False)
        assert fh.bwd_config("bfloat16", d, d, 0, off) == fh.bwd_config(
            "bfloat16", d, d, 0, config.Switches())
        plain = fh.bwd_config("bfloat16", d, d, 0, config.Switches())
        assert not any(getattr(plain, f) for f in flags)
    sm80 = fh.bwd_config("bfloat16", 128, 128, 0, config.Switches(hstu_bwd_ws="rabsm80"),
                         has_rab=True, rab_dtype="float32")
    assert sm80.impl == "sm80" and not any(getattr(sm80, f) for f in flags)
    # the measured opt-ins: prefetches one step earlier, the fast path at D 64
    sw = config.Switches(hstu_bwd_ws="rabpf2,rabfast64")
    key = fh.bwd_config("bfloat16", 64, 64, 0, sw, has_rab=True, rab_dtype="float32")
    assert key.rab_pf_ahead and key.rab_fast_wide
    plain = fh.bwd_config("bfloat16", 64, 64, 0, sw)
    assert not plain.rab_pf_ahead and not plain.rab_fast_wide
