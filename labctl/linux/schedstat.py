"""Where a thread's time went: on a core, waiting for one, or neither (/proc/<tid>/schedstat).

A sampler that stalls wants to know whose stall it was. The kernel keeps, per thread, the nanoseconds it ran
on a core and the nanoseconds it sat runnable in a run queue waiting for one (the first two fields of
/proc/thread-self/schedstat, CONFIG_SCHED_INFO). Over a gap between two of a sampler's ticks the rest of the
gap is time the thread slept: in epoll waiting for a timer that fired late, in a blocking call, or on a
virtual CPU the hypervisor was not running (a guest's scheduler sees neither of those as its own).
"""

from __future__ import annotations

import os
from typing import Final, Literal

StallCause = Literal["busy", "runnable", "asleep"]

STALL_CAUSES: Final[tuple[StallCause, ...]] = ("busy", "runnable", "asleep")
"""busy: the thread was on a core for most of the gap (its own work: a long callback, a collection; or the
kernel's in its name: interrupts, page faults); runnable: it waited most of the gap for a core that other
processes or kernel threads held (`--rt-priority` helps against processes, not against a kernel thread in a
section that cannot be preempted: on this VM DAMON's kdamond holds a core ~4 ms at a time); asleep: neither
(a timer delivered late, a blocking call on the loop, a virtual CPU not being run). The kernel's accounting
says which; on a virtual machine the hypervisor's time can land in any of them."""


class ThreadSchedstat:
    """The calling thread's schedstat, opened once and read with one pread (a couple of µs): per tick of a
    1 kHz sampler that is well under 1 % of a core. `read()` is None where the file is missing (not Linux,
    a kernel without CONFIG_SCHED_INFO)."""

    def __init__(self) -> None:
        try:
            # /proc/thread-self names the opening thread; the descriptor stays bound to it
            self._fd: int | None = os.open("/proc/thread-self/schedstat", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            self._fd = None

    @property
    def available(self) -> bool:
        return self._fd is not None

    def read(self) -> tuple[int, int] | None:
        """(ns on a core, ns runnable waiting for one), cumulative since the thread started."""
        return parse(self.read_raw())

    def read_raw(self) -> bytes | None:
        """The file as read (`parse` makes it `read()`'s pair): a sampler reads it every tick and needs the
        numbers only across a stall, so it parses two reads then, not every read."""
        if self._fd is None:
            return None
        try:
            return os.pread(self._fd, 64, 0)
        except OSError:
            return None

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def parse(raw: bytes | None) -> tuple[int, int] | None:
    """(ns on a core, ns runnable waiting for one) from a read of the file; None where it says neither."""
    if raw is None:
        return None
    try:
        fields = raw.split()
        return int(fields[0]), int(fields[1])
    except (ValueError, IndexError):
        return None


def stall_cause(gap_ns: int, on_cpu_ns: int, waiting_ns: int) -> StallCause:
    """Whichever share of the gap was largest: running, waiting for a core, or asleep (the rest)."""
    asleep_ns = gap_ns - on_cpu_ns - waiting_ns
    if on_cpu_ns >= waiting_ns and on_cpu_ns >= asleep_ns:
        return "busy"
    if waiting_ns >= asleep_ns:
        return "runnable"
    return "asleep"
