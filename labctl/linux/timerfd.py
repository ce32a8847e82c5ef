"""Sub-millisecond periodic ticks in asyncio through a Linux timerfd.

asyncio's epoll selector rounds every timeout up to whole milliseconds, so `asyncio.sleep(0.0005)` sleeps
about 1 ms; a 1 kHz carrier poll or a 5 kHz ping-pong needs finer ticks. A CLOCK_MONOTONIC timerfd added
with `loop.add_reader` fires at the kernel's timer resolution and reports how many periods elapsed.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
from collections.abc import Callable

CLOCK_MONOTONIC = 1
TFD_NONBLOCK = 0o4000
TFD_CLOEXEC = 0o2000000
TFD_TIMER_ABSTIME = 1

_libc = ctypes.CDLL(None, use_errno=True)


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


def _ts(ns: int) -> _Timespec:
    return _Timespec(ns // 1_000_000_000, ns % 1_000_000_000)


def _timerfd() -> int:
    fd = _libc.timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC)
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"timerfd_create: {os.strerror(err)}")
    return int(fd)


def _settime(fd: int, flags: int, spec: _Itimerspec) -> None:
    if _libc.timerfd_settime(fd, flags, ctypes.byref(spec), None) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"timerfd_settime: {os.strerror(err)}")


class PeriodicTimer:
    """Calls `on_tick(expirations)` on the running loop every `period_ns` until `close()`."""

    def __init__(self, period_ns: int, on_tick: Callable[[int], None]) -> None:
        if period_ns <= 0:
            raise ValueError("period must be positive")
        self.period_ns = period_ns
        self._on_tick = on_tick
        fd = _timerfd()
        self.fd: int | None = fd
        self._loop = asyncio.get_running_loop()
        try:
            _settime(fd, 0, _Itimerspec(_ts(period_ns), _ts(period_ns)))
        except OSError:
            os.close(fd)
            raise
        self._loop.add_reader(fd, self._ready)

    def _ready(self) -> None:
        if self.fd is None:
            return
        try:
            raw = os.read(self.fd, 8)
        except BlockingIOError:
            return
        self._on_tick(int.from_bytes(raw, "little"))

    def close(self) -> None:
        if self.fd is not None:
            self._loop.remove_reader(self.fd)
            os.close(self.fd)
            self.fd = None


class Alarm:
    """`await alarm.at(t_ns)` wakes at a CLOCK_MONOTONIC instant (labctl.core.clock.now_ns) to within the
    kernel's timer slack (tens of µs), where `asyncio.sleep` would wake up to 1 ms late: a sampler on an
    absolute 1 kHz schedule then keeps that millisecond as headroom against a busy loop. One timerfd, armed
    one-shot at an absolute time, re-armed per wait; `close()` releases it.

    With `on_fire`, `arm(t_ns)` calls it from the timerfd's reader callback instead: the loop turn that
    sees the timer expire runs it, one turn before a task awaiting `at()` would be woken (the future's
    wake-up is queued behind everything else that turn made ready)."""

    def __init__(self, on_fire: Callable[[], None] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        self.fd: int | None = _timerfd()
        self._waiter: asyncio.Future[None] | None = None
        self._on_fire = on_fire
        # One itimerspec, rewritten per arm: a sampler arms once a tick, and building the ctypes structures
        # each time was most of an arm's cost (it_interval stays zero: one-shot).
        self._spec = _Itimerspec()
        self._value = self._spec.it_value
        self._spec_ref = ctypes.byref(self._spec)
        self._armed = False  # armed since `_ready` called back
        self._loop.add_reader(self.fd, self._ready)

    def _ready(self) -> None:
        if self.fd is None:
            return
        if self._on_fire is not None:
            # Re-arming resets the expiration count (timerfd_settime), so a callback that arms the next
            # instant (a sampler, every tick) leaves nothing to read: the read is only made when it did
            # not, to clear the expiration (else epoll would report the fd again), one syscall a tick less.
            # A wake-up whose expiration a re-arm already cleared calls back too: the callers check the
            # time and arm again (run_ticks, ModelSchedule), as after a timer that fired a hair early.
            self._armed = False
            try:
                self._on_fire()
            finally:
                if not self._armed and self.fd is not None:
                    with contextlib.suppress(BlockingIOError):
                        os.read(self.fd, 8)
            return
        try:
            os.read(self.fd, 8)
        except BlockingIOError:
            return
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def arm(self, t_ns: int) -> None:
        """Fire once at t_ns (an instant already past fires at once)."""
        if self.fd is None:
            raise RuntimeError("alarm closed")
        # an it_value of zero would disarm the timer instead of firing it
        value = self._value
        value.tv_sec, value.tv_nsec = divmod(max(t_ns, 1), 1_000_000_000)
        self._armed = True
        if _libc.timerfd_settime(self.fd, TFD_TIMER_ABSTIME, self._spec_ref, None) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"timerfd_settime: {os.strerror(err)}")

    async def at(self, t_ns: int) -> None:
        if self._on_fire is not None:
            raise RuntimeError("this alarm calls back on fire: use arm()")
        self._waiter = waiter = self._loop.create_future()
        self.arm(t_ns)
        await waiter

    def close(self) -> None:
        if self.fd is not None:
            self._loop.remove_reader(self.fd)
            os.close(self.fd)
            self.fd = None
        if self._waiter is not None and not self._waiter.done():
            self._waiter.cancel()


async def sleep_until(t_ns: int, alarm: Alarm | None = None) -> None:
    """Sleep to the CLOCK_MONOTONIC instant t_ns (labctl.core.clock.now_ns) to within the kernel's timer
    slack, where `asyncio.sleep` wakes up to a millisecond late. Without `alarm`, a one-shot timerfd is
    made for this wait (a few syscalls, ~30 µs) and closed after it, also when the wait is cancelled."""
    own = alarm is None
    alarm = Alarm() if alarm is None else alarm
    try:
        await alarm.at(t_ns)
    finally:
        if own:
            alarm.close()
