"""Real-time scheduling for the controller's event loop while an experiment runs (opt-in).

On a shared machine another process can hold the controller's core for a few milliseconds when a 1 kHz
sampler's timer fires; the tick then runs late, and past 2 ms it is skipped (bench/scale.py: one such stall
in one run of every 2-5 at 512-576 ports, with no callback of labctl's over 1 ms around it). SCHED_FIFO
lets the loop's thread preempt ordinary processes the moment its timer fires, as linuxptp's daemons and
real-time lab controllers do. The kernel's RT throttling (95 % of each second by default) keeps a runaway
loop from locking a core. Only the loop's thread changes, and the threads it starts meanwhile (the event
log's fsync): the figure workers (started before, and reset to ordinary if a parent passed it on) and the
analysis after the run keep ordinary scheduling.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator

from labctl.core.errors import HardwareError, InputError

MAX_PRIORITY = 99


def check_priority(priority: int) -> None:
    if not 1 <= priority <= MAX_PRIORITY:
        raise InputError(f"rt priority {priority}: SCHED_FIFO priorities are 1..{MAX_PRIORITY}")


@contextlib.contextmanager
def realtime(priority: int | None) -> Iterator[dict[str, object] | None]:
    """This thread at SCHED_FIFO `priority` inside the block (None: as it is), then back to what it was.
    Yields what run.json records. Not permitted: one HardwareError line saying what it needs."""
    if priority is None:
        yield None
        return
    check_priority(priority)
    policy, param = os.sched_getscheduler(0), os.sched_getparam(0)
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(priority))
    except PermissionError:
        raise HardwareError(
            f"rt priority {priority}: SCHED_FIFO needs root, CAP_SYS_NICE or an RLIMIT_RTPRIO of at least "
            f"{priority} (ulimit -r); run without it"
        ) from None
    try:
        yield {"policy": "SCHED_FIFO", "priority": priority}
    finally:
        with contextlib.suppress(OSError):
            os.sched_setscheduler(0, policy, param)


def permitted(priority: int) -> None:
    """HardwareError now, before anything is written, if `realtime(priority)` would be refused."""
    with realtime(priority):
        pass


def ordinary() -> None:
    """This process back to ordinary scheduling (a child of a real-time thread inherits its policy; lowering
    one's own needs no privilege)."""
    with contextlib.suppress(OSError):
        if os.sched_getscheduler(0) in (os.SCHED_FIFO, os.SCHED_RR):
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))


def background() -> None:
    """This process behind the experiment's own while both run: ordinary scheduling (never real-time) at nice
    10. Not SCHED_IDLE: a process with threads (numpy's BLAS pool) cannot be brought back from it as a whole,
    and beside busy processes its threads starved (the figure workers' tests timed out); nor could an
    unprivileged one leave it at all. `foreground(pid)` undoes it where allowed."""
    ordinary()
    with contextlib.suppress(OSError):
        os.nice(10)


def foreground(pid: int = 0, nice: int = 0) -> None:
    """`pid` (0: this process) back to `nice` where allowed (an unprivileged process may not lower its nice
    value without RLIMIT_NICE: it then finishes niced, which on an idle machine is as fast)."""
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, pid, nice)


IDLE_FALLBACK_NICE = 10
"""Where SCHED_IDLE is refused: how much `idle_thread` raises the thread's nice value instead."""


def idle_thread() -> str:
    """The calling thread (not its process) below every ordinary thread: SCHED_IDLE, which any ordinary
    thread that wakes preempts at once (a nice value alone lets the running thread finish its slice first: a
    few ms under EEVDF, past a 1 kHz sampler's catch-up budget). For a thread that must never delay a run
    and may wait for a free core (the dashboard's, decision 0085), unlike `background`'s workers, whose
    threads starved under it. Where refused, nice +IDLE_FALLBACK_NICE. Returns "idle", "nice" or "" (neither
    permitted)."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))  # 0: the calling thread
        return "idle"
    except (OSError, AttributeError):
        pass
    tid = threading.get_native_id()  # Linux: each thread has its own nice value
    try:
        niceness = min(19, os.getpriority(os.PRIO_PROCESS, tid) + IDLE_FALLBACK_NICE)
        os.setpriority(os.PRIO_PROCESS, tid, niceness)
        return "nice"
    except OSError:
        return ""
