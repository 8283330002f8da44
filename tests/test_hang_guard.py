"""The GPU tests' watchdog (``tests/hang_guard.py``), on CPU: a call that does not return
within the limit ends the process with the test's name and its Python stack in the log; one
that returns leaves only the header line; the limit's environment variable is validated."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

import hang_guard

HERE = os.path.dirname(os.path.abspath(__file__))


def _child(code, tmp_path, timeout=60):
    return subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {HERE!r})\n" + code],
                          cwd=tmp_path, capture_output=True, text=True, timeout=timeout)


def test_hang_exits_with_the_stack(tmp_path):
    log = tmp_path / "hang.log"
    t0 = time.monotonic()
    r = _child("import time, hang_guard\n"
               f"hang_guard.arm('tests/x.py::test_stuck[a]', 0.5, {str(log)!r})\n"
               "def stuck_kernel_wait():\n    time.sleep(30)\n"
               "stuck_kernel_wait()\n", tmp_path)
    assert r.returncode != 0
    assert time.monotonic() - t0 < 25
    text = log.read_text()
    assert "=== tests/x.py::test_stuck[a]: no return within 0.5 s" in text
    assert "stuck_kernel_wait" in text


def test_return_in_time_leaves_the_header_only(tmp_path):
    log = tmp_path / "hang.log"
    r = _child("import time, hang_guard\n"
               f"f = hang_guard.arm('tests/x.py::test_fast', 2, {str(log)!r})\n"
               "hang_guard.disarm(f)\ntime.sleep(3)\nprint('alive')\n", tmp_path)
    assert r.returncode == 0 and "alive" in r.stdout
    assert log.read_text().strip() == "=== tests/x.py::test_fast: no return within 2 s"


def test_default_log_path_is_the_working_directory(tmp_path):
    r = _child("import time, hang_guard\nhang_guard.arm('t::d', 0.3)\ntime.sleep(30)\n", tmp_path)
    assert r.returncode != 0
    assert "=== t::d" in (tmp_path / "gpu_hang.log").read_text()


@pytest.mark.parametrize("raw,want", [("", 0.0), ("  ", 0.0), ("2.5", 2.5), ("600", 600.0)])
def test_timeout_from_env(monkeypatch, raw, want):
    monkeypatch.setenv(hang_guard.TIMEOUT_ENV, raw)
    assert hang_guard.timeout_seconds() == want


def test_timeout_unset_is_off(monkeypatch):
    monkeypatch.delenv(hang_guard.TIMEOUT_ENV, raising=False)
    assert hang_guard.timeout_seconds() == 0.0


@pytest.mark.parametrize("raw", ["0", "-3", "abc", "nan", "inf", "1s"])
def test_bad_timeout_names_the_variable(monkeypatch, raw):
    monkeypatch.setenv(hang_guard.TIMEOUT_ENV, raw)
    with pytest.raises(ValueError, match=hang_guard.TIMEOUT_ENV):
        hang_guard.timeout_seconds()
