"""The periodic ticker, driven by a fake clock: its timerfd alarm wakes on time, asyncio's sleep (the
fallback where there is no timerfd) overshoots like epoll's millisecond rounding."""

from __future__ import annotations

import asyncio
import itertools
import math
import random
from pathlib import Path

import pytest

from labctl.core.events import Event
from labctl.probes import sampling
from tests.helpers.sampling import _drain


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


async def test_a_refused_second_enter_leaves_the_rx_power_probe_as_it_was() -> None:
    from labctl.models.module_eeprom import ModelDrivenQsfp28
    from labctl.probes.rxpower import RxPowerProbe
    from labctl.probes.rxpower_ports import ModulePort

    probe = RxPowerProbe([ModulePort("nic:h1/p", "h1", lambda: ModelDrivenQsfp28(lambda _t: -3.0), (1,))])
    async with probe:
        with pytest.raises(RuntimeError, match="already running"):
            await probe.__aenter__()
        assert len(probe.polled) == 1  # not opened a second time (it would then be read twice a tick)


class _Bursting(sampling.QueueProbe):
    """Reports `n` events from one tick, then stops."""

    name = "bursting"

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n

    async def _run(self) -> None:
        from labctl.core.events import Event

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


def test_the_middle_generation_waits_out_a_burst_and_is_collected_after_it() -> None:
    import gc

    from labctl.linux.looplag import BURST_GEN1_THRESHOLD, middle_generation_deferred

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


def test_work_that_is_itself_late_gets_a_longer_slice_unless_a_sampler_is_behind(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A model's timeline LATE_NS behind works LATE_SLICE_NS at a go (its readers need it caught up; events
    waiting to be recorded keep their stamps); a sampler behind its schedule still shortens every slice."""
    from labctl.linux import looplag

    monkeypatch.setattr(looplag, "now_ns", lambda: 10**12)
    monkeypatch.setattr(looplag, "_behind_until_ns", 0)
    assert looplag.slice_deadline() == 10**12 + looplag.SLICE_NS
    assert looplag.slice_deadline(looplag.LATE_NS - 1) == 10**12 + looplag.SLICE_NS
    assert looplag.slice_deadline(looplag.LATE_NS) == 10**12 + looplag.LATE_SLICE_NS
    looplag.sampler_behind(10**12 + 1)
    assert looplag.slice_deadline(looplag.LATE_NS) == 10**12 + looplag.BEHIND_SLICE_NS


async def test_the_link_probes_initial_state_is_put_in_slices_and_transitions_come_after_it(
    monkeypatch: pytest.MonkeyPatch, inventory_path: Path
) -> None:
    """The model link probe's initial dump (two events a port: hundreds at 512 ports) goes through
    `report`, a slice per loop turn; a transition while it is still being put is queued after it."""
    from labctl.core.events import Kind
    from labctl.inventory.profiles import resolve_profile
    from labctl.inventory.schema import load_inventory
    from labctl.models.fabric import SimFabric
    from labctl.models.switch import SwitchModel
    from labctl.probes.model import SimLinkProbe

    monkeypatch.setattr(sampling, "INLINE_REPORTS", 4)
    inv = load_inventory(inventory_path)
    fast, rng = resolve_profile("fast"), random.Random(1)
    fabric = SimFabric(inv, {"ocs1": SwitchModel("ocs1", inv.switches["ocs1"].space, fast, rng)}, fast, rng)
    probe = SimLinkProbe(fabric, inv.ports)
    async with probe:
        await asyncio.sleep(0)  # the probe's task put its first slice (or all of it)
        fabric._transition(inv.ports[0], Kind.CARRIER, 1, 10**12)
        got = await _drain_now(probe)
    initial = [e for e in got if e.meta.get("initial")]
    assert len(initial) == 2 * len(inv.ports)
    assert got[: len(initial)] == initial and got[-1].t_ns == 10**12 and got[-1].value == 1


async def _drain_now(probe: sampling.QueueProbe) -> list[Event]:
    """Everything the probe puts until its backlog is empty (a loop turn at a time)."""
    for _ in range(100_000):
        if not probe._backlog:
            break
        await asyncio.sleep(0)
    return probe.queue.drain()


def test_a_stall_is_whoevers_share_of_the_gap_was_largest() -> None:
    from labctl.linux.schedstat import stall_cause

    assert stall_cause(10_000_000, 8_000_000, 1_000_000) == "busy"
    assert stall_cause(10_000_000, 1_000_000, 6_000_000) == "runnable"
    assert stall_cause(10_000_000, 300_000, 0) == "asleep"  # off any core and not waiting for one


def test_tick_counts_say_how_many_stalls_of_each_cause_and_the_longest() -> None:
    count = sampling.TickCount()
    assert count.stats() == {"ticks_skipped": 0, "stalls": 0}
    count.stalled(6_800_000, 5, "asleep")
    count.stalled(3_000_000, 1, "runnable")
    count.stalled(250_000_000, 249, None)  # a model schedule's skip: no schedstat over it
    assert count.stats() == {
        "ticks_skipped": 255,
        "stalls": 3,
        "stall_longest_ns": 250_000_000,
        "stalls_busy": 0,
        "stalls_runnable": 1,
        "stalls_asleep": 1,
    }


def test_tick_counts_name_each_sampler_as_run_json_does_an_agents_own_nested() -> None:
    from labctl.probes.sampling import tick_counts

    one = {"dropped": 0, "ticks_skipped": 4, "stalls": 1, "stall_longest_ns": 5_000_000, "pings": 10}
    assert tick_counts("model-traffic", one) == {
        "model-traffic": {"ticks_skipped": 4, "stalls": 1, "stall_longest_ns": 5_000_000}
    }
    agent = {"rx-power": {"ticks_skipped": 0, "stalls": 0}, "model-link": {"dropped": 0}}
    assert tick_counts("agent:h1", {"dropped": 0, **agent}) == {
        "agent:h1/rx-power": {"ticks_skipped": 0, "stalls": 0, "stall_longest_ns": 0}
    }
    assert tick_counts("carrier", {"dropped": 0, "polls": 5}) == {}


def test_a_sampler_that_skipped_ticks_gets_a_line_saying_whose_stalls_they_were() -> None:
    from labctl.cli.tables import stall_lines

    probes = {
        "rx-power": {"ticks_skipped": 5, "stalls": 1, "stall_longest_ns": 6_840_000, "stalls_asleep": 1},
        "model-traffic": {"ticks_skipped": 0, "stalls": 0},
        "agent:h1": {"rx-power": {"ticks_skipped": 2, "stalls": 1, "stall_longest_ns": 3_100_000}},
        # as run.json holds an agent's entry: its own drop count and its mirror's `world` beside its probes
        "agent:h2": {
            "dropped": 0,
            "rx-power": {"ticks_skipped": 4, "stalls": 2, "stall_longest_ns": 5_000_000},
            "world": {"lag_ns": 250_000_000},
        },
    }
    lines = stall_lines(probes)
    assert lines[0].startswith("rx-power: 5 ticks skipped in 1 stall, longest 6.8 ms: 1 asleep (")
    assert lines[1] == "agent:h1/rx-power: 2 ticks skipped in 1 stall, longest 3.1 ms"
    assert lines[2] == "agent:h2/rx-power: 4 ticks skipped in 2 stalls, longest 5.0 ms"
    assert len(lines) == 3
