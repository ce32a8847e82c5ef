"""File-descriptor leak checks that hold in a shared test process: what a test opened and left open, not how
many descriptors the process has (an earlier test's leftovers closing meanwhile, as the garbage collector
or a worker thread gets to them, would change the count without this test leaking anything)."""

from __future__ import annotations

import os


def open_fds() -> dict[int, str]:
    """This process's open descriptors and what each refers to."""
    fds: dict[int, str] = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            fds[int(name)] = os.readlink(f"/proc/self/fd/{name}")
        except OSError:  # closed meanwhile, or the directory's own descriptor
            continue
    return fds


def opened_since(before: dict[int, str]) -> dict[int, str]:
    """Descriptors open now that were not open (to the same thing) at `before`."""
    return {fd: target for fd, target in open_fds().items() if before.get(fd) != target}
