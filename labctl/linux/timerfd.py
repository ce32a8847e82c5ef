"""Sub-millisecond periodic ticks in asyncio through a Linux timerfd.

asyncio's epoll selector rounds every timeout up to whole milliseconds, so `asyncio.sleep(0.0005)` sleeps
about 1 ms; a 1 kHz carrier poll or a 5 kHz ping-pong needs finer ticks. A CLOCK_MONOTONIC timerfd added
with `loop.add_reader` fires at the kernel's timer resolution and reports how many periods elapsed.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
from collections.abc import Callable

CLOCK_MONOTONIC = 1
TFD_NONBLOCK = 0o4000
TFD_CLOEXEC = 0o2000000

_libc = ctypes.CDLL(None, use_errno=True)


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


def _ts(ns: int) -> _Timespec:
    return _Timespec(ns // 1_000_000_000, ns % 1_000_000_000)


class PeriodicTimer:
    """Calls `on_tick(expirations)` on the running loop every `period_ns` until `close()`."""

    def __init__(self, period_ns: int, on_tick: Callable[[int], None]) -> None:
        if period_ns <= 0:
            raise ValueError("period must be positive")
        self.period_ns = period_ns
        self._on_tick = on_tick
        fd = _libc.timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC)
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"timerfd_create: {os.strerror(err)}")
        self.fd: int | None = fd
        self._loop = asyncio.get_running_loop()
        spec = _Itimerspec(_ts(period_ns), _ts(period_ns))
        if _libc.timerfd_settime(fd, 0, ctypes.byref(spec), None) != 0:
            err = ctypes.get_errno()
            os.close(fd)
            raise OSError(err, f"timerfd_settime: {os.strerror(err)}")
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
