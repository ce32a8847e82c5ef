"""The probe contract: one suite that every probe (labctl.core.registry.PROBES, and yours) passes.

A lab that writes its own probe (a registry entry in labctl's probe registry) runs the suite from its own
tests, in a harness that opens a context the probe can run in (labctl.testing.harnesses has labctl's)::

    from labctl.testing.probe_contract import MODEL_PORTS, ProbeContract


    class TestMyProbe(ProbeContract):
        probe = "my-probe"  # its name in labctl's probe registry
        harness = MODEL_PORTS  # the simulated world's ports; or a Harness of your own

pytest then collects every case below against that probe (`probe` may also be a tuple of names, with
`harness_for(name)` giving each one's harness; or a `name` fixture the subclass defines). The fixtures come
from labctl's pytest plugin (labctl.testing.plugin, registered as the `labctl` pytest11 entry point), with
pytest-asyncio installed.

The cases, each able to fail:
1. start/stop: `async with` starts it, `events()` yields within a few seconds, leaving the block stops it
   (no task of it is left), and `events()` then ends.
2. signals: every event has a `kind` in the entry's `signals`, an int `t_ns` inside the test's window, a
   `source` of a port (or switch port) of its context with that port's host; every declared signal shows.
3. bounded queue: a QueueProbe's queue has a finite bound that holds; any probe exposes an int `dropped`.
4. drops counted: with a 2-slot queue and nobody reading, `dropped > 0` and `stats()["dropped"]` agrees.
5. entering twice is refused with a clear error, and so is entering again after exit (a probe runs once).
6. name: a non-empty str equal to, or starting with, the registry name.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path
from typing import ClassVar

import pytest
import pytest_asyncio

from labctl.core.clock import now_ns
from labctl.core.events import KINDS, Event, EventQueue, Kind
from labctl.labs.base import ReconfigWindow
from labctl.probes.base import probe_kinds
from labctl.probes.sampling import CircuitProbe, Probe, QueueProbe
from labctl.testing.harnesses import (
    MODEL_PORTS,
    MODEL_PORTS_RC,
    POWER_METER,
    SWITCH_MONITOR,
    VETH_PAIR,
    Harness,
    Rig,
    namespaces_left,
)
from labctl.testing.support import names_of

__all__ = [
    "FIRST_EVENT_S",
    "MAX_QUEUE",
    "MODEL_PORTS",
    "MODEL_PORTS_RC",
    "POWER_METER",
    "STREAM_END_S",
    "SWITCH_MONITOR",
    "VETH_PAIR",
    "Harness",
    "ProbeContract",
    "Reader",
    "Rig",
    "drained",
    "new_tasks",
    "reading",
    "tasks_left",
    "until",
    "work_done",
]

FIRST_EVENT_S = 5.0  # "events flow within a few seconds"
STREAM_END_S = 3.0  # how long events() may take to end once the probe has stopped
MAX_QUEUE = 1 << 20  # a "finite" bound: more than this many buffered events is a memory problem, not a bound


class Reader:
    """Drains `probe.events()` into `seen` from a task, as the controller's pump does."""

    def __init__(self, probe: Probe) -> None:
        self.seen: list[Event] = []
        self.task = asyncio.create_task(self._pump(probe), name="contract-reader")

    async def _pump(self, probe: Probe) -> None:
        async for event in probe.events():
            self.seen.append(event)

    async def ended(self) -> bool:
        """Whether events() ended by itself within STREAM_END_S."""
        done, _ = await asyncio.wait({self.task}, timeout=STREAM_END_S)
        if done:
            self.task.result()  # a failing events() iterator fails the test
        return bool(done)

    async def cancel(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


@contextlib.asynccontextmanager
async def reading(probe: Probe) -> AsyncIterator[Reader]:
    reader = Reader(probe)
    try:
        yield reader
    finally:
        if not reader.task.done():
            await reader.cancel()


async def until(condition: Callable[[], bool], within_s: float, failure: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while not condition():
        if loop.time() > deadline:
            pytest.fail(failure)
        await asyncio.sleep(0.01)


async def drained(probe: Probe, what: str) -> list[Event]:
    """Everything a fresh `events()` still yields; it must end by itself (the probe has stopped)."""

    async def collect() -> list[Event]:
        return [event async for event in probe.events()]

    try:
        return await asyncio.wait_for(collect(), STREAM_END_S)
    except TimeoutError:
        pytest.fail(f"{what}: events() did not end within {STREAM_END_S} s of the probe stopping")


def new_tasks(before: set[asyncio.Task[object]], *also: asyncio.Task[object]) -> list[str]:
    current = asyncio.current_task()
    return sorted(
        f"{t.get_name()} ({type(t.get_coro()).__name__})"
        for t in asyncio.all_tasks()
        if t not in before and t is not current and t not in also and not t.done()
    )


async def tasks_left(before: set[asyncio.Task[object]], *also: asyncio.Task[object]) -> list[str]:
    """Tasks still running one loop turn after a probe's block was left (the autouse guard's rule too).

    The turn matters: a sampler cancelled while it awaits inside `async for ... in ticks()` (switch-power,
    in its gather) abandons the `ticks` generator, and the loop closes that in a task of its own
    (`async_generator_athrow`) that is still pending right after `__aexit__` returns."""
    await asyncio.sleep(0)
    return new_tasks(before, *also)


def work_done(probe: Probe, rig: Rig) -> dict[str, int]:
    """Every int the probe keeps (its counters), and how much it has written to its side sink."""
    out = {key: value for key, value in vars(probe).items() if type(value) is int}
    out["<side>"] = len(rig.side or ())
    return out


class ProbeContract:
    """The suite: subclass it, name the probe (`probe = "my-probe"`) and its harness (`harness = ...`), and
    pytest runs every case on it. Every case takes the probe's registry `name` (and most the `rig` its
    harness opens) and runs once per probe named."""

    probe: ClassVar[str | Sequence[str]]
    """The registry name of the probe under test, or several; or a `name` fixture of the subclass."""
    harness: ClassVar[Harness | None] = None
    """Where the probe runs (labctl.testing.harnesses, or a Harness of your own)."""

    def harness_for(self, name: str) -> Harness | None:
        """The harness probe `name` runs in: `harness`, unless a subclass naming several says per probe."""
        return self.harness

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        """Each case once per named probe (a pytest hook: pytest calls it on the class); a case that runs the
        probe in a root harness is marked `emulated` (it runs in network namespaces)."""
        names = names_of(getattr(type(self), "probe", None))
        if names is None or "name" not in metafunc.fixturenames:
            return  # a `name` fixture of the subclass supplies it (or the case takes none)
        runs = "rig" in metafunc.fixturenames

        def param(name: str) -> object:
            harness = self.harness_for(name)
            root = runs and harness is not None and harness.root
            return pytest.param(name, id=name, marks=[pytest.mark.emulated] if root else [])

        metafunc.parametrize("name", [param(name) for name in names])

    @pytest.fixture(autouse=True)
    def _labctl_no_leaked_tasks(self, labctl_no_leaked_tasks: None) -> None:
        """No case may leave a task of the probe running (labctl.testing.plugin)."""

    # a classmethod: pytest 9.2 deprecates class-scoped fixtures defined as instance methods (removed in 10)
    @pytest.fixture(scope="class", autouse=True)
    @classmethod
    def _labctl_no_namespace_left(cls) -> Iterator[None]:
        """Backstop for the veth harnesses' `finally`: no namespace of theirs outlives the class's cases."""
        yield
        left = namespaces_left()
        assert not left, f"namespaces left behind: {left}"

    @pytest_asyncio.fixture(loop_scope="function")
    async def rig(self, name: str, tmp_path: Path) -> AsyncIterator[Rig]:
        harness = self.harness_for(name)
        if harness is None:
            pytest.fail(
                f"probe {name!r} has no harness: give {type(self).__name__} one (`harness = ...`, or "
                "`harness_for(name)`) that opens a ProbeContext the probe can run in here, so that the "
                "contract suite covers it (labctl.testing.harnesses has labctl's)"
            )
        async with harness.open(tmp_path) as opened:
            yield opened

    def build(self, name: str, rig: Rig) -> Probe:
        """Through the registry, as labs build probes; circuits set first on a CircuitProbe; a window opened
        on a probe whose harness asks for one."""
        probe = probe_kinds.get(name).build(rig.ctx)
        if isinstance(probe, CircuitProbe):
            probe.set_circuits(rig.circuits)
        harness = self.harness_for(name)
        if harness is not None and harness.window and isinstance(probe, ReconfigWindow):
            probe.open_window()
        return probe

    # -- the contract --------------------------------------------------------------------------------------
    def test_entry_declares_known_signals(self, name: str) -> None:
        entry_name = name
        entry = probe_kinds.get(entry_name)
        assert entry.name == entry_name
        assert entry.signals and isinstance(entry.signals, tuple), f"{entry_name}: declares no signals"
        unknown = sorted(set(entry.signals) - KINDS)
        assert not unknown, f"{entry_name}: signals {unknown} are not event kinds (labctl.core.events.Kind)"
        assert entry.description.strip(), f"{entry_name}: no description"

    @pytest.mark.asyncio
    async def test_start_events_stop(self, name: str, rig: Rig) -> None:
        probe = self.build(name, rig)
        before = set(asyncio.all_tasks())
        async with reading(probe) as reader:
            async with probe as entered:
                assert entered is probe, f"{name}: `async with probe as p` must give the probe itself"
                assert new_tasks(before, reader.task), f"{name}: entering started nothing"
                await rig.provoke()
                await until(
                    lambda: bool(reader.seen),
                    FIRST_EVENT_S,
                    f"{name}: no event from probe.events() within {FIRST_EVENT_S} s of starting it",
                )
                if rig.side is not None:
                    await until(lambda: bool(rig.side), FIRST_EVENT_S, f"{name}: nothing written to its sink")
            leftover = await tasks_left(before, reader.task)
            assert not leftover, f"{name}: task(s) still running after the probe's block was left: {leftover}"
            assert await reader.ended(), f"{name}: events() did not end after the probe stopped"
        assert await drained(probe, name) == [], f"{name}: a stopped probe still yields events"
        # Stopped means stopped: timers and socket readers are callbacks, not tasks, so the task check above
        # cannot see one left behind; its counters (samples, pings, polls, messages) and its sink can.
        stopped = work_done(probe, rig)
        await asyncio.sleep(0.1)
        assert work_done(probe, rig) == stopped, f"{name}: still working after it was stopped"
        assert await drained(probe, name) == []

    @pytest.mark.asyncio
    async def test_events_are_declared_signals_of_its_own_ports(self, name: str, rig: Rig) -> None:
        entry = probe_kinds.get(name)
        hosts = {site.port.source: site.port.host for site in (*rig.ctx.ports, *rig.ctx.peers)}
        for switch, ports in rig.ctx.switches:
            hosts[f"ocs:{switch.name}"] = ""
            hosts.update({f"ocs:{switch.name}/{port}": "" for port in ports})
        for meter in rig.ctx.meters:  # a bench meter's readings: its channels, on the controller (no host)
            hosts[f"pm:{meter.name}"] = ""
            hosts.update({channel.source: "" for channel in meter.channels})
        probe = self.build(name, rig)
        t0 = now_ns()
        async with reading(probe) as reader:
            async with probe:
                for _ in range(2):
                    await rig.provoke()
                    await asyncio.sleep(0.25)  # the fast profile's link-up is ~80 ms
            assert await reader.ended(), f"{name}: events() did not end after the probe stopped"
        t1 = now_ns()
        written = reader.seen + (rig.side or [])
        assert reader.seen, f"{name}: wrote nothing to probe.events() while provoked"
        if rig.side is not None:
            assert rig.side, f"{name}: wrote nothing to its sink"
        bad = []
        for e in written:
            # any sampler may report its own trouble
            if e.kind not in entry.signals and e.kind != Kind.SAMPLER_ERROR:
                bad.append(f"kind {e.kind!r} not in its signals {entry.signals}: {e}")
            # Model times may precede delivery a little (a late loop catches transitions up): 1 s of slack.
            if type(e.t_ns) is not int or not t0 - 1_000_000_000 <= e.t_ns <= t1:
                bad.append(f"t_ns {e.t_ns!r} is not an int inside the test's run [{t0}, {t1}]: {e}")
            if e.source not in hosts:
                bad.append(f"source {e.source!r} is not a port of its context ({sorted(hosts)}): {e}")
            elif e.host != hosts[e.source]:
                bad.append(f"host {e.host!r} is not {hosts[e.source]!r}, the host of {e.source}: {e}")
        assert not bad, f"{name}: {len(bad)} of {len(written)} events break the contract:\n" + "\n".join(
            bad[:10]
        )
        unseen = sorted(set(entry.signals) - {e.kind for e in written})
        assert not unseen, f"{name}: declared signal(s) {unseen} never written while provoked"

    @pytest.mark.asyncio
    async def test_queue_is_bounded(self, name: str, rig: Rig) -> None:
        probe = self.build(name, rig)
        assert type(probe.dropped) is int and probe.dropped == 0, (
            f"{name}: `dropped` must be an int, 0 at start"
        )
        if not isinstance(probe, QueueProbe):
            return  # the Probe protocol promises `dropped` only; a QueueProbe also shows its queue
        queue = probe.queue
        assert isinstance(queue, EventQueue), f"{name}: queue is a {type(queue).__name__}, not an EventQueue"
        bound = queue.maxsize
        assert type(bound) is int and 0 < bound <= MAX_QUEUE, f"{name}: queue bound {bound!r} is not finite"
        # The bound holds: one event past it evicts the oldest, and the drop is counted where the probe says.
        for i in range(bound + 1):
            queue.put(Event(t_ns=i, kind="x", source="contract"))
        assert len(queue) == bound, f"{name}: holds {len(queue)} events with a bound of {bound}"
        assert probe.dropped == 1, f"{name}: overflowing its queue by one counted {probe.dropped} drops"
        assert probe.stats()["dropped"] == 1

    @pytest.mark.asyncio
    async def test_drops_are_counted(self, name: str, rig: Rig) -> None:
        probe = self.build(name, rig)
        if not isinstance(probe, QueueProbe):
            pytest.fail(f"{name} is not a QueueProbe: give this test a way to shrink its queue")
        # Factories take no queue size (ProbeContext has none), so build through the registry as a lab does
        # and swap in a 2-slot queue before entering: QueueProbe writes and counts through `self.queue` only.
        probe.queue = EventQueue(2)
        async with probe:
            # Nobody reads; provoke until the queue must have overflowed (most probes overflow at once: an
            # initial dump or the 20 ms heartbeat of two ports; switch-power only writes on failed reads).
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 10
            while probe.dropped == 0 and loop.time() < deadline:
                await rig.provoke()
                await asyncio.sleep(0.05)
        assert probe.dropped > 0, f"{name}: a 2-slot queue nobody read in 10 s dropped nothing"
        assert len(probe.queue) == 2, f"{name}: overflowed, yet its queue holds {len(probe.queue)} events"
        stats = getattr(probe, "stats", None)
        if stats is not None:
            assert stats()["dropped"] == probe.dropped, f"{name}: stats() and `dropped` disagree"
        kept = await drained(probe, name)
        assert len(kept) == 2, f"{name}: the 2 newest events are not drained after stopping ({len(kept)})"

    @pytest.mark.asyncio
    async def test_entering_twice_is_refused(self, name: str, rig: Rig) -> None:
        probe = self.build(name, rig)
        async with reading(probe) as reader:
            async with probe:
                with pytest.raises(RuntimeError, match=rf"probe {re.escape(probe.name)} is already running"):
                    await probe.__aenter__()
                # The refusal leaves the running probe alone: it still writes, and one exit stops it.
                await rig.provoke()
                await until(
                    lambda: bool(reader.seen), FIRST_EVENT_S, f"{name}: no events after a refused enter"
                )
            assert await reader.ended(), f"{name}: events() did not end after the probe stopped"

    @pytest.mark.asyncio
    async def test_reentering_after_exit_is_refused(self, name: str, rig: Rig) -> None:
        """A probe runs once: the first exit ended its stream for good, so a second run would sample into a
        closed queue, uncounted. Entering it again is refused with a clear error, and starts nothing."""
        probe = self.build(name, rig)
        async with reading(probe) as reader:
            async with probe:
                await rig.provoke()
                await until(lambda: bool(reader.seen), FIRST_EVENT_S, f"{name}: wrote nothing")
            assert await reader.ended(), f"{name}: events() did not end after the probe stopped"
        before = set(asyncio.all_tasks())
        with pytest.raises(RuntimeError, match=rf"probe {re.escape(probe.name)} has run and stopped"):
            async with probe:
                pass
        assert not new_tasks(before), f"{name}: a refused re-entry started a task"
        assert await drained(probe, name) == []

    @pytest.mark.asyncio
    async def test_name(self, name: str, rig: Rig) -> None:
        probe = self.build(name, rig)
        assert isinstance(probe, Probe), f"{name}: {type(probe).__name__} does not satisfy the Probe protocol"
        assert isinstance(probe.name, str) and probe.name, f"{name}: probe.name {probe.name!r} is empty"
        assert probe.name == name or probe.name.startswith(name), (
            f"probe.name {probe.name!r} neither is nor starts with its registry name {name!r}"
        )
