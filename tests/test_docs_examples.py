"""The code blocks of docs/hstu.md and docs/bsa.md run (on the backend `auto` picks here);
the signature listings of docs/design.md name the current parameters."""

from __future__ import annotations

import ast
import importlib
import inspect
import os
import re

import pytest

DOCS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs")
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def _blocks():
    out = []
    for name in ("hstu.md", "bsa.md"):
        path = os.path.join(DOCS, name)
        if not os.path.exists(path):
            continue
        with open(path) as f:
            text = f.read()
        for i, m in enumerate(_BLOCK.finditer(text)):
            out.append(pytest.param(name, m.group(1), id=f"{name}-{i}"))
    return out


def test_docs_have_examples():
    names = {p.values[0] for p in _blocks()}
    assert names == {"hstu.md", "bsa.md"}
    assert len(_blocks()) >= 8


@pytest.mark.parametrize("name,code", _blocks())
def test_doc_example_runs(name, code):
    exec(compile(code, f"<{name}>", "exec"), {"__name__": "__doc_example__"})


def _design_signatures():
    """``(module, name, positional params, keyword-only params)`` of every call signature
    in the python blocks of docs/design.md (signature listings, not runnable code)."""
    with open(os.path.join(DOCS, "design.md")) as f:
        text = f.read()
    out = []
    for block in _BLOCK.finditer(text):
        headings = [ln for ln in text[:block.start()].splitlines() if ln.startswith("#")]
        module = re.search(r"`jax_sparse_attn/([\w/]+)\.py`", headings[-1]).group(1)
        code = block.group(1)
        for m in re.finditer(r"^(?:def\s+)?([A-Za-z_]\w*)\(", code, re.M):
            i, depth = m.end(), 1
            while depth:
                depth += (code[i] in "([{") - (code[i] in ")]}")
                i += 1
            args = ast.parse(f"def f({code[m.end():i - 1]}): pass").body[0].args
            out.append((module.replace("/", "."), m.group(1),
                        [a.arg for a in args.posonlyargs + args.args],
                        [a.arg for a in args.kwonlyargs]))
    return out


def test_design_md_signatures_are_current():
    sigs = _design_signatures()
    assert len(sigs) >= 14 and {s[0] for s in sigs} == {"ffi.hstu", "ffi.bsa", "reference"}
    for module, name, pos, kwonly in sigs:
        try:
            mod = importlib.import_module(f"jax_sparse_attn.{module}")
        except ImportError as e:  # the ffi modules need CuTe DSL
            pytest.skip(f"jax_sparse_attn.{module} not importable: {e}")
        params = [p for p in inspect.signature(getattr(mod, name)).parameters.values()
                  if not p.name.startswith("_")]
        want_pos = [p.name for p in params if p.kind != p.KEYWORD_ONLY]
        want_kw = [p.name for p in params if p.kind == p.KEYWORD_ONLY]
        assert (pos, kwonly) == (want_pos, want_kw), f"docs/design.md: {module}.{name}"
