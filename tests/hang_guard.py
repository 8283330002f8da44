"""Watchdog for the GPU tests: a kernel whose barriers deadlock never returns, and the
device scripts' outer ``timeout`` then kills pytest before it prints which test hung. With
``JAX_SPARSE_ATTN_GPU_TEST_TIMEOUT=seconds`` set (``0`` or empty: off), each ``gpu`` test
arms :func:`faulthandler.dump_traceback_later`: past the limit the Python stacks (the test
function among them) go to ``JAX_SPARSE_ATTN_GPU_HANG_LOG`` (default ``gpu_hang.log`` in the
working directory) and the process exits with status 1. The stacks are also written if the
process gets SIGTERM during the test (an outer ``timeout`` that fires first). Each test adds
a ``start`` line and, when it returns, a ``done`` line with its process id, so in a log
shared by parallel processes the hung test is the ``start`` without a ``done``. A file is used
because pytest captures file descriptor 2 while a test runs."""

from __future__ import annotations

import faulthandler
import math
import os
import signal

TIMEOUT_ENV = "JAX_SPARSE_ATTN_GPU_TEST_TIMEOUT"
LOG_ENV = "JAX_SPARSE_ATTN_GPU_HANG_LOG"


def timeout_seconds() -> float:
    """The per-test limit from the environment; 0 (off) when unset, empty or ``0``. Any other
    value that is not a finite positive number raises ``ValueError`` naming the variable."""
    raw = os.environ.get(TIMEOUT_ENV, "").strip()
    if not raw:
        return 0.0
    try:
        t = float(raw)
    except ValueError:
        t = -1.0
    if t == 0:
        return 0.0
    if not (t > 0 and math.isfinite(t)):
        raise ValueError(f"{TIMEOUT_ENV}={raw!r} is not allowed: give a finite positive number "
                         "of seconds, or 0 for no limit")
    return t


def arm(test_id: str, seconds: float, path: str | None = None):
    """Start the watchdog for ``test_id``; returns the open log file (pass it to
    :func:`disarm`)."""
    log = open(path or os.environ.get(LOG_ENV) or "gpu_hang.log", "a")  # noqa: SIM115
    log.write(f"start {test_id} (pid {os.getpid()}, limit {seconds:g} s)\n")
    log.flush()
    faulthandler.dump_traceback_later(seconds, exit=True, file=log)
    faulthandler.register(signal.SIGTERM, file=log, chain=True)
    return log


def disarm(log, test_id: str) -> None:
    faulthandler.cancel_dump_traceback_later()
    faulthandler.unregister(signal.SIGTERM)
    log.write(f"done {test_id} (pid {os.getpid()})\n")
    log.close()
