"""The periodic ticker on the real clock: the timerfd alarm's lateness, run_ticks on schedule, through stalls
of a blocked loop and when cancelled, burst work yielding after a late tick, a model schedule through a
stall, a sampler that dies. The ticker on a fake clock is tests/unit/test_sampling.py."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable

import pytest

from labctl.core.clock import now_ns
from labctl.probes import sampling
from labctl.probes.sampling import ModelSchedule, TickCount
from tests.helpers.fds import open_fds, opened_since
from tests.helpers.sampling import _drain


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


async def test_the_timerfd_alarm_wakes_at_its_instant_not_a_millisecond_late() -> None:
    from labctl.core.clock import now_ns
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


# -- run_ticks: a synchronous tick run from the timerfd's reader callback (real clock) -------------------
async def test_run_ticks_runs_on_schedule_until_the_tick_says_stop() -> None:
    from labctl.core.clock import now_ns

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
    fds = open_fds()

    def tick(t: int) -> None:
        raise OSError(5, "module read failed")

    with pytest.raises(OSError, match="module read failed"):
        await sampling.run_ticks(1_000_000, tick)
    assert not opened_since(fds)  # the timerfd is closed


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
    # ...and said whose it was: the loop's thread slept through it (neither ran nor waited for a core).
    assert count.longest_stall_ns >= 30_000_000
    assert count.causes["asleep"] >= 1 and sum(count.causes.values()) == count.stalls, count.causes


async def test_a_stall_the_loop_spent_working_is_not_called_asleep() -> None:
    """A tick that holds the loop 30 ms on the CPU: the stall is the thread's own work (busy), or, on a
    machine whose other processes took the core meanwhile, runnable; never asleep."""
    import time

    count = sampling.TickCount()
    seen: list[int] = []

    def tick(t: int) -> bool:
        seen.append(t)
        if len(seen) == 10:
            end = time.thread_time_ns() + 30_000_000
            while time.thread_time_ns() < end:  # 30 ms of this thread's own CPU time
                pass
        return len(seen) < 20

    await sampling.run_ticks(1_000_000, tick, count=count)
    assert count.stalls >= 1 and count.longest_stall_ns >= 30_000_000
    assert count.causes["busy"] + count.causes["runnable"] >= 1, count.causes
    assert count.stats()["stalls"] == count.stalls and "stalls_busy" in count.stats()


async def test_cancelling_run_ticks_stops_its_ticks_and_closes_its_timer() -> None:
    fds = open_fds()
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
    assert not opened_since(fds)


async def test_a_late_tick_makes_burst_work_yield_sooner_until_the_schedule_catches_up() -> None:
    import time

    from labctl.core.clock import now_ns
    from labctl.linux import looplag

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


async def test_a_model_schedule_reads_no_instant_past_its_ceiling_and_skips_none_it_held() -> None:
    """A mirror's schedule with a ceiling (the model known complete only so far: decision 0086): no instant
    after it is read; once it moves on, the instants that waited are read at their own times, in order,
    none skipped as missed even when they waited longer than the catch-up budget. A ceiling that stops
    moving is given up after `hold_max_ns`, and the samplers go on."""
    schedule = ModelSchedule(catch_up_ns=5_000_000)
    start = now_ns()
    schedule.raise_ceiling(start + 3_000_000)
    got: list[int] = []
    count = TickCount()
    done = asyncio.Event()

    def tick(t: int) -> bool:
        got.append(t)
        if len(got) >= 40:
            done.set()
            return False
        return True

    async def feed() -> None:
        await asyncio.sleep(0.03)  # the ceiling waits 30 ms (past the 5 ms budget) with instants due
        assert got and max(got) <= start + 3_000_000, "nothing past the ceiling was read"
        schedule.raise_ceiling(now_ns() + 10_000_000)

    await asyncio.gather(schedule.run(1_000_000, tick, count), feed())
    assert all(b - a == 1_000_000 for a, b in itertools.pairwise(got)), "every instant, in order"
    assert count.skipped == count.stalls == 0
    assert schedule.holds >= 1 and schedule.held_longest_ns >= 20_000_000
    # A ceiling that never moves again: given up after hold_max_ns, and the sampler reads on.
    stuck = ModelSchedule(catch_up_ns=500_000_000)
    stuck.hold_max_ns = 50_000_000
    stuck.raise_ceiling(now_ns())
    after: list[int] = []

    def tick_on(t: int) -> bool:
        after.append(t)
        return len(after) < 20

    await asyncio.wait_for(stuck.run(1_000_000, tick_on), 5)
    assert len(after) == 20 and stuck.ceilings_given_up == 1 and stuck.ceiling_ns is None
