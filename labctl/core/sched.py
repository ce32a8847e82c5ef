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


def _can_come_back() -> bool:
    """Whether this process may leave SCHED_IDLE again (root, or an RLIMIT_NICE that allows its nice value:
    the kernel's rule); an unprivileged one could not, and would stay starved behind any busy process."""
    import resource

    if os.geteuid() == 0:
        return True
    try:
        return resource.getrlimit(resource.RLIMIT_NICE)[0] >= 20 - os.getpriority(os.PRIO_PROCESS, 0)
    except (OSError, ValueError):
        return False


def background() -> None:
    """This process behind everything else while a run samples: SCHED_IDLE, so that a waking sampler takes
    the core from it at once (at nice 10 it still waited for one for 2-13 ms on 2 cores, and skipped its
    ticks), where it may come back from it (`foreground`); nice 10 elsewhere."""
    ordinary()
    if _can_come_back():
        try:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
            return
        except (OSError, AttributeError):
            pass
    with contextlib.suppress(OSError):
        os.nice(10)


def foreground(pid: int = 0, nice: int = 0) -> None:
    """`pid` (0: this process) back from `background()` to ordinary scheduling at `nice`, where allowed (an
    unprivileged process may not leave SCHED_IDLE or lower its nice value without RLIMIT_NICE: it then
    finishes in the background, which on an idle machine is as fast)."""
    with contextlib.suppress(OSError, AttributeError):
        if os.sched_getscheduler(pid) == os.SCHED_IDLE:
            os.sched_setscheduler(pid, os.SCHED_OTHER, os.sched_param(0))
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, pid, nice)
