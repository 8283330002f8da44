"""The code blocks of docs/hstu.md and docs/bsa.md run (on the backend `auto` picks here)."""

from __future__ import annotations

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
