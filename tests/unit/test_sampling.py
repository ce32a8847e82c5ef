"""The periodic ticker, driven by a fake clock: its timerfd alarm wakes on time, asyncio's sleep (the
fallback where there is no timerfd) overshoots like epoll's millisecond rounding."""

from __future__ import annotations

import asyncio
import itertools
import math
from collections.abc import Callable

import pytest

from labctl import sampling
from labctl.clock import now_ns
from labctl.sampling import ModelSchedule, TickCount


class FakeClock:
    """epoll waits whole milliseconds, rounded up, and each wake-up costs the loop `turn_ns`."""

    def __init__(self, turn_ns: int = 60_000) -> None:
        self.t = 1_000_000_000
        self.turn_ns = turn_ns
        self.stall_at: int | None = None
        self.stall_ns = 0

    def now_ns(self) -> int:
        return self.t

    async def sleep(self, seconds: float) -> None:
        self._advance(self.t + math.ceil(seconds * 1e3) * 1_000_000)

    def _advance(self, to_ns: int) -> None:
        self.t = max(self.t, to_ns) + self.turn_ns
        if self.stall_at is not None and self.t >= self.stall_at:
            self.t += self.stall_ns  # the loop was busy elsewhere
            self.stall_at = None


class FakeAlarm:
    """labctl.linux.timerfd.Alarm on the fake clock: wakes at the instant asked (plus the loop's turn)."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.closed = False

    async def at(self, t_ns: int) -> None:
        self.clock._advance(t_ns)

    def close(self) -> None:
        self.closed = True


@pytest.fixture(params=["timerfd", "asyncio-sleep"])
def clock(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(sampling, "now_ns", fake.now_ns)
    monkeypatch.setattr(sampling.asyncio, "sleep", fake.sleep)
    alarm = FakeAlarm(fake) if request.param == "timerfd" else None
    monkeypatch.setattr(sampling, "_alarm", lambda: alarm)
    return fake


async def take(period_ns: int, until_ns: int) -> list[int]:
    out: list[int] = []
    async for t in sampling.ticks(period_ns):
        if t >= until_ns:
            break
        out.append(t)
    return out


async def test_late_wakeups_do_not_cost_ticks(clock: FakeClock) -> None:
    start = clock.t
    ticks = await take(1_000_000, start + 1_000_000_000)
    assert len(ticks) in (999, 1000, 1001)  # 1 kHz over one second, although sleeps wake late
    assert ticks == sorted(ticks)


async def test_a_long_stall_skips_missed_ticks_instead_of_bursting(clock: FakeClock) -> None:
    start = clock.t
    clock.stall_at, clock.stall_ns = start + 100_000_000, 50_000_000
    ticks = await take(1_000_000, start + 1_000_000_000)
    gaps = [b - a for a, b in itertools.pairwise(ticks)]
    assert max(gaps) >= 50_000_000  # the stall shows as one gap...
    assert len(ticks) < 1000 - 40  # ...and its ~50 ticks are not replayed afterwards
    assert sum(g == 0 for g in gaps) == 0  # never two ticks at the same instant


async def _drain(probe: sampling.QueueProbe) -> list[object]:
    return [e async for e in probe.events()]


class _Crashing(sampling.QueueProbe):
    name = "crashing"

    async def _run(self) -> None:
        await asyncio.sleep(0.01)
        raise OSError(19, "No such device")


async def test_a_sampler_that_dies_ends_its_stream_and_raises_at_exit() -> None:
    """Whoever reads events() must not wait forever for a sampler that is gone."""
    probe = _Crashing()
    await probe.__aenter__()
    got = await asyncio.wait_for(_drain(probe), 5)  # ends when the sampler dies, not at exit
    assert got == []
    with pytest.raises(OSError, match="No such device"):
        await probe.__aexit__(None, None, None)
    assert probe._task is None
    with pytest.raises(RuntimeError, match="probe crashing has run and stopped; build a new one"):
        async with probe:
            pass


async def test_a_refused_second_enter_leaves_the_rx_power_probe_as_it_was() -> None:
    from labctl.models.module_eeprom import ModelDrivenQsfp28
    from labctl.probes.rxpower import ModulePort, RxPowerProbe

    probe = RxPowerProbe([ModulePort("nic:h1/p", "h1", lambda: ModelDrivenQsfp28(lambda _t: -3.0), (1,))])
    async with probe:
        with pytest.raises(RuntimeError, match="already running"):
            await probe.__aenter__()
        assert len(probe.polled) == 1  # not opened a second time (it would then be read twice a tick)


async def test_the_timerfd_alarm_wakes_at_its_instant_not_a_millisecond_late() -> None:
    from labctl.clock import now_ns
    from labctl.linux.timerfd import Alarm

    alarm = Alarm()
    try:
        late = []
        for _ in range(20):
            due = now_ns() + 300_000  # asyncio.sleep(0.0003) would wake >= 1 ms later (epoll rounds up)
            await alarm.at(due)
            late.append(now_ns() - due)
        assert min(late) >= 0  # never early
        assert sorted(late)[len(late) // 2] < 1_000_000  # the median is not epoll's millisecond
    finally:
        alarm.close()
    assert alarm.fd is None


class _Bursting(sampling.QueueProbe):
    """Reports `n` events from one tick, then stops."""

    name = "bursting"

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n

    async def _run(self) -> None:
        from labctl.events import Event

        events = (Event(t_ns=i + 1, kind="x", source=f"p{i}", host="h") for i in range(self.n))
        self.report(events, self.n)
        await asyncio.sleep(3600)


async def test_a_burst_of_reports_is_put_in_order_in_slices_and_none_is_lost_at_stop() -> None:
    few = _Bursting(sampling.INLINE_REPORTS)
    async with few:
        await asyncio.sleep(0)
        assert len(few.queue) == sampling.INLINE_REPORTS  # a few: put by the tick itself
    burst = _Bursting(5_000)
    async with burst:
        for _ in range(3):
            await asyncio.sleep(0)
        assert 0 < len(burst.queue) < 5_000  # a burst: a slice per loop turn, not all in the tick's
    got = await _drain(burst)  # stopped mid-burst: the rest was put before the stream ended
    assert [e.t_ns for e in got] == list(range(1, 5_001))  # type: ignore[attr-defined]


# -- run_ticks: a synchronous tick run from the timerfd's reader callback (real clock) -------------------
async def test_run_ticks_runs_on_schedule_until_the_tick_says_stop() -> None:
    from labctl.clock import now_ns

    seen: list[int] = []

    def tick(t: int) -> bool:
        seen.append(t)
        return len(seen) < 50

    start = now_ns()
    await sampling.run_ticks(1_000_000, tick)
    assert len(seen) == 50
    assert seen == sorted(seen) and seen[0] >= start
    # an absolute schedule: 50 ticks span about 49 periods (generous: a loaded machine stalls now and then)
    assert 45_000_000 <= seen[-1] - seen[0] < 500_000_000


async def test_run_ticks_raises_what_the_tick_raised_and_releases_its_timer() -> None:
    import os

    fds = len(os.listdir("/proc/self/fd"))

    def tick(t: int) -> None:
        raise OSError(5, "module read failed")

    with pytest.raises(OSError, match="module read failed"):
        await sampling.run_ticks(1_000_000, tick)
    assert len(os.listdir("/proc/self/fd")) == fds  # the timerfd is closed


async def test_run_ticks_counts_what_a_stall_skipped_and_does_not_replay_it() -> None:
    import time

    count = sampling.TickCount()
    seen: list[int] = []

    def tick(t: int) -> bool:
        seen.append(t)
        if len(seen) == 10:
            time.sleep(0.030)  # the loop is held for 30 ms: ~30 ticks cannot be taken on time
        return len(seen) < 40

    await sampling.run_ticks(1_000_000, tick, count=count)
    assert count.stalls >= 1
    assert count.skipped >= 20  # counted as missed samples...
    after = [b - a for a, b in itertools.pairwise(seen[10:])]
    assert sum(g < 200_000 for g in after) < 5  # ...not taken back to back afterwards


async def test_cancelling_run_ticks_stops_its_ticks_and_closes_its_timer() -> None:
    import os

    fds = len(os.listdir("/proc/self/fd"))
    seen: list[int] = []
    five = asyncio.Event()

    def tick(t: int) -> None:
        seen.append(t)
        if len(seen) == 5:
            five.set()

    task = asyncio.create_task(sampling.run_ticks(1_000_000, tick))
    await asyncio.wait_for(five.wait(), 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    n = len(seen)
    await asyncio.sleep(0.01)
    assert len(seen) == n
    assert len(os.listdir("/proc/self/fd")) == fds


def test_the_middle_generation_waits_out_a_burst_and_is_collected_after_it() -> None:
    import gc

    from labctl.looplag import BURST_GEN1_THRESHOLD, middle_generation_deferred

    before = gc.get_threshold()
    collections = []

    def seen(phase: str, info: dict[str, int]) -> None:
        if phase == "stop":
            collections.append(info["generation"])

    with middle_generation_deferred():
        assert gc.get_threshold()[1] == max(before[1], BURST_GEN1_THRESHOLD)
        with middle_generation_deferred():  # nested (two rails, two runs): the outermost decides
            pass
        assert gc.get_threshold()[1] == max(before[1], BURST_GEN1_THRESHOLD)
        gc.callbacks.append(seen)
    try:
        assert gc.get_threshold() == before
        assert collections and collections[-1] >= 1  # collected once the burst is over
    finally:
        gc.callbacks.remove(seen)


async def test_a_late_tick_makes_burst_work_yield_sooner_until_the_schedule_catches_up() -> None:
    import time

    from labctl import looplag
    from labctl.clock import now_ns

    looplag._behind_until_ns = 0
    t = now_ns()
    assert looplag.slice_deadline() - t >= looplag.SLICE_NS  # nobody behind: the full slice
    seen: list[int] = []

    def tick(t_ns: int) -> bool:
        seen.append(t_ns)
        if len(seen) == 3:
            time.sleep(0.0015)  # the next tick comes ~0.5 ms late: more than a quarter period
        return len(seen) < 6

    await sampling.run_ticks(1_000_000, tick)
    assert looplag._behind_until_ns > t  # the late tick said so...
    now = now_ns()
    if now < looplag._behind_until_ns:  # ...and while it holds, a slice is the short one
        assert looplag.slice_deadline() - now < looplag.SLICE_NS
    looplag._behind_until_ns = 0
    assert looplag.slice_deadline() - now_ns() >= looplag.SLICE_NS - 50_000


async def test_a_model_schedule_reads_every_instant_in_time_order_through_a_stall() -> None:
    """Two samplers of one model (periods 1 and 2 ms) on one `ModelSchedule`: every instant of each is
    sampled, at the instant itself, all in time order, even across a 15 ms stall of the loop; a stall
    longer than the catch-up budget skips what it missed and says so."""
    schedule = ModelSchedule(catch_up_ns=500_000_000, wake_ns=3_000_000)
    seen: list[tuple[int, str]] = []
    counts = {"a": TickCount(), "b": TickCount()}

    def sampler(name: str, n: int) -> Callable[[int], bool]:
        def tick(t: int) -> bool:
            seen.append((t, name))
            return len([s for s in seen if s[1] == name]) < n

        return tick

    async def stall(ns: int) -> None:
        await asyncio.sleep(0.004)
        end = now_ns() + ns
        while now_ns() < end:  # the loop blocked: no tick can run
            pass

    await asyncio.gather(
        schedule.run(1_000_000, sampler("a", 30), counts["a"]),
        schedule.run(2_000_000, sampler("b", 15), counts["b"]),
        stall(15_000_000),
    )
    times = [t for t, _ in seen]
    assert times == sorted(times), "every sampler's instants in one time order"
    for name, period in (("a", 1_000_000), ("b", 2_000_000)):
        mine = [t for t, n in seen if n == name]
        assert all(b - a == period for a, b in itertools.pairwise(mine)), (name, mine)
    assert counts["a"].caught_up > 0 and counts["a"].skipped == counts["a"].stalls == 0
    # Behind by more than the budget: skipped, counted, and the schedule goes on from now.
    late = ModelSchedule(catch_up_ns=5_000_000)
    got: list[int] = []
    count = TickCount()

    def tick(t: int) -> bool:
        got.append(t)
        return len(got) < 10

    await asyncio.gather(late.run(1_000_000, tick, count), stall(30_000_000))
    assert count.stalls >= 1 and count.skipped >= 20
    assert got == sorted(got) and len(got) == 10
