"""The sampler's per-tick system pieces, without waiting on a clock: an Alarm re-armed tick after tick
(one itimerspec it rewrites) sets the absolute instant each arm asks for, and the thread's schedstat read
raw every tick parses, across a stall, to what `read()` says."""

from __future__ import annotations

import asyncio
import ctypes
import os

import pytest

from labctl.core.clock import now_ns
from labctl.linux import schedstat, timerfd


def _remaining_ns(fd: int) -> tuple[int, int]:
    """timerfd_gettime: (ns until it fires, interval ns); (0, 0) disarmed."""
    spec = timerfd._Itimerspec()
    assert timerfd._libc.timerfd_gettime(fd, ctypes.byref(spec)) == 0
    value, interval = spec.it_value, spec.it_interval
    return value.tv_sec * 1_000_000_000 + value.tv_nsec, interval.tv_sec * 1_000_000_000 + interval.tv_nsec


async def test_an_alarm_re_armed_fires_once_at_each_instant_asked() -> None:
    fired: list[int] = []
    alarm = timerfd.Alarm(lambda: fired.append(1))
    assert alarm.fd is not None
    try:
        for ahead_s in (30, 7, 12):  # later, earlier, later: each arm replaces the last, one-shot
            t = now_ns() + ahead_s * 1_000_000_000
            alarm.arm(t)
            remaining, interval = _remaining_ns(alarm.fd)
            assert interval == 0
            assert ahead_s * 1_000_000_000 - 1_000_000_000 < remaining <= ahead_s * 1_000_000_000
        alarm.arm(0)  # an instant already past (0 would disarm: armed at 1 ns instead) fires at once
        assert int.from_bytes(os.read(alarm.fd, 8), "little") == 1
        assert _remaining_ns(alarm.fd) == (0, 0)
    finally:
        alarm.close()
    with pytest.raises(RuntimeError):
        alarm.arm(now_ns())
    await asyncio.sleep(0)
    assert not fired  # read by hand above: the loop never saw it ready


def _readable(fd: int) -> bool:
    try:
        os.read(fd, 8)
    except BlockingIOError:
        return False
    return True


@pytest.mark.parametrize("rearm", [True, False])
async def test_an_alarm_that_fired_is_not_reported_again_whether_or_not_its_callback_re_armed(
    rearm: bool,
) -> None:
    """The expiration is cleared by the callback's re-arm (timerfd_settime resets it), or, where the
    callback did not arm, read by the alarm: either way epoll has nothing more to report."""
    calls: list[int] = []

    def fired() -> None:
        calls.append(1)
        if rearm:
            alarm.arm(now_ns() + 30_000_000_000)

    alarm = timerfd.Alarm(fired)
    assert alarm.fd is not None
    try:
        alarm.arm(1)  # long past: expired at once
        alarm._ready()  # what the loop calls when epoll reports the fd
        assert calls == [1]
        assert not _readable(alarm.fd)
        assert _remaining_ns(alarm.fd)[0] > (20_000_000_000 if rearm else -1)
        if not rearm:
            assert _remaining_ns(alarm.fd) == (0, 0)
    finally:
        alarm.close()


def test_schedstat_read_raw_parses_to_what_read_says() -> None:
    stat = schedstat.ThreadSchedstat()
    if not stat.available:
        pytest.skip("no /proc/thread-self/schedstat here")
    try:
        raw = stat.read_raw()
        assert isinstance(raw, bytes)
        on_cpu, waiting = schedstat.parse(raw) or (-1, -1)
        now = stat.read()
        assert now is not None and now[0] >= on_cpu >= 0 and now[1] >= waiting >= 0
    finally:
        stat.close()
    assert stat.read_raw() is None and stat.read() is None  # closed


@pytest.mark.parametrize(
    ("raw", "pair"),
    [
        (b"123 456 7\n", (123, 456)),
        (b"5 6", (5, 6)),
        (b"", None),
        (b"12\n", None),
        (b"x 1 2\n", None),
        (None, None),
    ],
)
def test_schedstat_parse(raw: bytes | None, pair: tuple[int, int] | None) -> None:
    assert schedstat.parse(raw) == pair
