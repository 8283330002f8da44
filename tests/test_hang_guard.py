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
    env = {k: v for k, v in os.environ.items()
           if k not in (hang_guard.LOG_ENV, hang_guard.TIMEOUT_ENV)}
    return subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {HERE!r})\n" + code],
                          cwd=tmp_path, capture_output=True, text=True, timeout=timeout, env=env)


def test_hang_exits_with_the_stack(tmp_path):
    log = tmp_path / "hang.log"
    t0 = time.monotonic()
    r = _child("import time, hang_guard\n"
               "def stuck_kernel_wait():\n"
               f"    hang_guard.arm('tests/x.py::test_stuck[a]', 0.5, {str(log)!r})\n"
               "    time.sleep(30)\n"
               "stuck_kernel_wait()\n", tmp_path)
    assert r.returncode != 0
    assert time.monotonic() - t0 < 25
    text = log.read_text()
    assert "start tests/x.py::test_stuck[a] (pid " in text and "limit 0.5 s)" in text
    assert "stuck_kernel_wait" in text
    assert "done tests/x.py::test_stuck[a]" not in text


def test_sigterm_during_a_test_writes_the_stack(tmp_path):
    log = tmp_path / "hang.log"
    p = subprocess.Popen([sys.executable, "-c", f"import sys; sys.path.insert(0, {HERE!r})\n"
                          "import time, hang_guard\n"
                          f"hang_guard.arm('t::killed', 60, {str(log)!r})\n"
                          "def waiting_for_kernel():\n"
                          "    print('armed', flush=True)\n    time.sleep(60)\n"
                          "waiting_for_kernel()\n"],
                         cwd=tmp_path, stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "armed"
    p.terminate()
    assert p.wait(timeout=30) != 0
    text = log.read_text()
    assert "start t::killed" in text and "waiting_for_kernel" in text


def test_return_in_time_leaves_the_header_only(tmp_path):
    log = tmp_path / "hang.log"
    r = _child("import time, hang_guard\n"
               f"f = hang_guard.arm('tests/x.py::test_fast', 2, {str(log)!r})\n"
               "hang_guard.disarm(f, 'tests/x.py::test_fast')\ntime.sleep(3)\nprint('alive')\n",
               tmp_path)
    assert r.returncode == 0 and "alive" in r.stdout
    lines = log.read_text().splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("start tests/x.py::test_fast (pid ") and lines[0].endswith("limit 2 s)")
    assert lines[1].startswith("done tests/x.py::test_fast (pid ")


def test_default_log_path_is_the_working_directory(tmp_path):
    r = _child("import time, hang_guard\nhang_guard.arm('t::d', 0.3)\ntime.sleep(30)\n", tmp_path)
    assert r.returncode != 0
    assert "start t::d" in (tmp_path / "gpu_hang.log").read_text()


@pytest.mark.parametrize("raw,want", [("", 0.0), ("  ", 0.0), ("0", 0.0), ("2.5", 2.5),
                                     ("600", 600.0)])
def test_timeout_from_env(monkeypatch, raw, want):
    monkeypatch.setenv(hang_guard.TIMEOUT_ENV, raw)
    assert hang_guard.timeout_seconds() == want


def test_timeout_unset_is_off(monkeypatch):
    monkeypatch.delenv(hang_guard.TIMEOUT_ENV, raising=False)
    assert hang_guard.timeout_seconds() == 0.0


@pytest.mark.parametrize("raw", ["-3", "abc", "nan", "inf", "1s"])
def test_bad_timeout_names_the_variable(monkeypatch, raw):
    monkeypatch.setenv(hang_guard.TIMEOUT_ENV, raw)
    with pytest.raises(ValueError, match=hang_guard.TIMEOUT_ENV):
        hang_guard.timeout_seconds()


def test_bad_timeout_stops_pytest_with_a_usage_error(tmp_path):
    """An invalid limit ends the run at configuration, naming the variable, instead of
    erroring every gpu test."""
    env = dict(os.environ, **{hang_guard.TIMEOUT_ENV: "soon"})
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        os.path.join(HERE, "test_hang_guard.py"), "-k", "from_env"],
                       cwd=os.path.dirname(HERE), capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode == 4, r.stdout + r.stderr
    assert hang_guard.TIMEOUT_ENV in r.stderr
