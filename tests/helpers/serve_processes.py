"""`labctl serve` and its workers as real processes, for the integration tier's queue tests
(tests/integration/test_scheduler.py, test_queue_shared.py): they sleep on the real clock."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest


def labctl_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "labctl.cli", *args]


def wait_for(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def pid_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # A zombie of a process we did not start still answers kill(0); look at its state.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return True


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    """The processes a test starts (serves, workers): any still running at its end is killed and reaped."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=30)
