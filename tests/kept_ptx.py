"""PTX of several CPU lowerings, kept by one fresh process (no GPU needed).

The CuTe DSL reads ``CUTE_DSL_KEEP`` / ``CUTE_DSL_DUMP_DIR`` (and ``CUTE_DSL_ARCH``) when it
is imported, so a PTX test lowers in a fresh process that has them set. :func:`keep_ptx`
runs one such process for several configurations, so that the jax and DSL imports are paid
once:

* each configuration's PTX files move to a directory of their own (two kernels with the
  same signature write the same file name);
* the compile caches are emptied after each configuration, so that the next one compiles,
  and keeps the PTX of, every kernel it lowers, as a process of its own would;
* a configuration equal to an earlier one (the same function, argument values with the
  defaults filled in, ``Switches`` compared by value) shares that one's PTX;
* a function that returns a string (the lowered module's text) leaves it in
  ``lowered.txt`` (:func:`lowered_text_of`);
* a configuration whose lowering raises leaves its traceback in ``error.txt``, which
  :func:`ptx_of` and :func:`lowered_text_of` turn into the failure of the tests that read it.

A configuration is ``(function, positional arguments, Switches fields or None, keyword
arguments)``: ``function`` is the name of a function of the test module that lowers it;
with Switches fields, ``Switches(**fields)`` is passed after the positional arguments.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)

# argv: the output directory, the test module, the script to run first ("" for none) and
# its arguments (JSON), the configurations (JSON)
_SCRIPT = """
import contextlib, inspect, io, json, os, runpy, shutil, sys, traceback

out_root, module, first, first_args = sys.argv[1:5]
configs = json.loads(sys.argv[5])
sys.path[:0] = [{root!r}, {tests!r}]
if first:
    # before anything imports the DSL: the script may set the DSL's variables itself (its
    # own dump directory: the PTX of the configurations below lands there then)
    buf = io.StringIO()
    sys.argv = [first, *json.loads(first_args)]
    try:
        with contextlib.redirect_stdout(buf):
            runpy.run_path(first, run_name="__main__")
    except BaseException:
        buf.write("ERROR " + traceback.format_exc())
    with open(os.path.join(out_root, "first.txt"), "w") as f:
        f.write(buf.getvalue())

import importlib

import jax
from cutlass.jax import compile as cjc

from jax_sparse_attn import _cute_call
from jax_sparse_attn.config import Switches

t = importlib.import_module(module)
dump = os.environ["CUTE_DSL_DUMP_DIR"]
done = []
for name, (fn_name, args, fields, kwargs) in configs.items():
    out = os.path.join(out_root, name)
    os.mkdir(out)
    try:
        fn = getattr(t, fn_name)
        args = [*args, Switches(**fields)] if fields is not None else args
        bound = inspect.signature(fn).bind(*args, **kwargs)
        bound.apply_defaults()
        call = (fn_name, bound.arguments)
        same = next((d for c, d in done if c == call), None)
        if same is not None:
            shutil.copytree(same, out, dirs_exist_ok=True)
            continue
        result = fn(*bound.args, **bound.kwargs)
        if isinstance(result, str):
            with open(os.path.join(out, "lowered.txt"), "w") as f:
                f.write(result)
        done.append((call, out))
    except Exception:
        with open(os.path.join(out, "error.txt"), "w") as f:
            f.write(traceback.format_exc())
    for p in os.listdir(dump):
        if p.endswith(".ptx"):
            shutil.move(os.path.join(dump, p), out)
    _cute_call.reset_compile_stats(clear_memory_cache=True)
    cjc.release_compile_cache()
    jax.clear_caches()
if dump != os.path.join(out_root, "dump"):
    shutil.rmtree(dump, ignore_errors=True)  # the first script's own dump directory
"""


def keep_ptx(out, module, configs, *, env=None, first=None, timeout=1800):
    """Lower ``configs`` ({name: configuration}) of the test module ``module`` (a module name
    importable from tests/ or the repository root) in one fresh process for sm_90a with
    ``CUTE_DSL_KEEP=ptx``; returns ``out`` (a directory), which then holds one directory per
    configuration (:func:`ptx_of`).

    ``env``: variables set on top of this process's environment without its
    ``JAX_SPARSE_ATTN_*`` variables (``JAX_SPARSE_ATTN_FORCE_KERNEL=1``, ``CUTE_DSL_ARCH=sm_90a``
    and ``JAX_PLATFORMS=cpu`` are set). ``first``: ``(script path, argument list)`` run first
    in the process as ``__main__``; its output is in ``out / "first.txt"``, with ``ERROR``
    and the traceback where it raised."""
    out = pathlib.Path(out)
    dump = out / "dump"
    dump.mkdir(parents=True)  # the CuTe DSL writes elsewhere when the directory does not exist
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_SPARSE_ATTN_")}
    full_env.update(CUTE_DSL_ARCH="sm_90a", JAX_SPARSE_ATTN_FORCE_KERNEL="1",
                    CUTE_DSL_KEEP="ptx", CUTE_DSL_DUMP_DIR=str(dump), JAX_PLATFORMS="cpu")
    full_env.update(env or {})
    script = _SCRIPT.format(root=ROOT, tests=TESTS)
    first_path, first_args = first or ("", [])
    r = subprocess.run([sys.executable, "-c", script, str(out), module, first_path,
                        json.dumps(list(first_args)), json.dumps(configs)],
                       env=full_env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stderr[-3000:]
    return out


def keep_ptx_shared(tmp_path_factory, key, module, configs, **kw):
    """:func:`keep_ptx` once per test session for ``key`` (the calling test file), shared by
    the pytest-xdist workers: the first worker to get here lowers into a directory under the
    workers' common temporary root while holding a file lock, the others wait for the lock
    and read the same directory (a failed attempt leaves no ``done`` marker, so the next one
    lowers again)."""
    import fcntl  # noqa: PLC0415
    import shutil  # noqa: PLC0415

    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    out = root / f"kept_ptx_{key}"
    with open(root / f"kept_ptx_{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if (out / "done").exists():
                return out
            shutil.rmtree(out, ignore_errors=True)
            keep_ptx(out, module, configs, **kw)
            (out / "done").write_text("")
            return out
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _config_dir(out, name):
    d = pathlib.Path(out) / name
    err = d / "error.txt"
    assert not err.exists(), err.read_text()[-3000:]
    return d


def ptx_of(out, name):
    """{file name: PTX text} kept while lowering the configuration ``name`` (an
    AssertionError with the traceback where its lowering raised)."""
    d = _config_dir(out, name)
    return {p.name: p.read_text() for p in sorted(d.iterdir()) if p.suffix == ".ptx"}


def lowered_text_of(out, name):
    """The string the configuration's function returned (the lowered module's text)."""
    return (_config_dir(out, name) / "lowered.txt").read_text()


def tma_copy_policies(text):
    """The TMA tensor copies of a PTX text as ``(kind, policy, param)``: ``kind`` "load" or
    "store", ``policy`` the ``createpolicy`` priority of the copy's cache-policy operand
    (``"evict_first"`` ...) or ``"0"`` for the constant the DSL passes by default, ``param``
    the index of the kernel parameter its tensor map comes from (``cvta.param`` of a
    ``mov`` of ``..._param_N``; None if not found). Registers are looked up within each
    ``.entry``."""
    out = []
    for entry in text.split(".entry ")[1:]:
        made = {m.group(2): m.group(1) for m in re.finditer(
            r"createpolicy\.fractional\.L2::(evict_\w+)\.b64\s+(%rd\d+)", entry)}
        made.update({m.group(1): m.group(2) for m in re.finditer(
            r"mov\.b64\s+(%rd\d+),\s*(0);", entry)})
        params = {m.group(1): int(m.group(2)) for m in re.finditer(
            r"mov\.b64\s+(%rd\d+),\s*\w+_param_(\d+);", entry)}
        maps = {m.group(1): params.get(m.group(2)) for m in re.finditer(
            r"cvta\.param\.u64\s+(%rd\d+),\s*(%rd\d+);", entry)}
        for m in re.finditer(r"cp\.async\.bulk\.tensor\.\d+d\.(\S+?)\.(\S*?)"
                             r"L2::cache_hint([^;]*?),\s*(%rd\d+);", entry):
            kind = "store" if m.group(1).startswith("global") else "load"
            tmap = re.search(r"\[(%rd\d+),\s*\{", m.group(3))
            out.append((kind, made.get(m.group(4)), maps.get(tmap.group(1)) if tmap else None))
    return out


def assert_wgmma_groups_in_block(text):
    """Every ``wgmma.commit_group`` of the PTX ``text`` that follows a ``wgmma.mma_async``
    (since the previous commit) is in the basic block of the last of them (no branch label
    between): ptxas closes a wgmma group at the last wgmma of its basic block, so a commit
    past a label becomes an extra empty group and every ``wgmma.wait_group N`` after it
    waits for one group more than the kernel means. Returns the number of commits."""
    segs = re.split(r"wgmma\.commit_group", text)[:-1]
    for seg in segs:
        tail = seg.rsplit("wgmma.mma_async", 1)
        if len(tail) == 2:
            assert not re.search(r"^\$L__BB\w+:", tail[1], re.M), tail[1][-400:]
    return len(segs)


def configs_with_groups_in_block(out, names, needle="wgmma.mma_async"):
    """:func:`assert_wgmma_groups_in_block` on every kept PTX file of the configurations
    ``names`` that holds ``needle``; returns how many configurations had such a file."""
    n = 0
    for name in names:
        texts = [t for t in ptx_of(out, name).values() if needle in t]
        n += bool(texts) and all(assert_wgmma_groups_in_block(t) > 0 for t in texts)
    return n


def assert_wg_hand_barriers(hand, base):
    """The dQ writer's per-warpgroup hand-back in the PTX ``hand``: named barriers 2 / 11
    (staged) and 5 / 10 (handed back) synced and arrived on with 128 + 32 threads, none of
    them in ``base``, whose writer meets both warpgroups on the 288-thread pair 2 / 5 that
    ``hand`` does not have."""
    for b in (2, 5):
        assert re.search(rf"bar\.(sync|arrive)\s+{b}, 288;", base), b
        assert not re.search(rf"bar\.(sync|arrive)\s+{b}, 288;", hand), b
    for b in (2, 5, 10, 11):
        assert re.search(rf"bar\.sync\s+{b}, 160;", hand), b
        assert re.search(rf"bar\.arrive\s+{b}, 160;", hand), b
        assert not re.search(rf"bar\.(sync|arrive)\s+{b}, 160;", base), b
