"""The probe contract: one suite that every registered probe (labctl.core.registry.PROBES) passes.

Every case is parametrized over `probe_kinds.names()`, so a probe enters the suite by being registered;
`test_every_registered_probe_has_a_harness` then fails until HARNESSES below says how to run it here.

A harness opens a `Rig`: a `ProbeContext` the probe can run in on this machine, a `provoke()` that makes
it write events (move light, flap a link, fail a monitor), the circuits a CircuitProbe should exchange
traffic on, and where a probe writes through another sink than its own queue, that sink (`side`).
- model-link, model-traffic, rx-power: a tiny SimFabric world (2 hosts, 1 port each, one `sim` switch,
  the two ports patched to each other so there is light and traffic) from an inventory in tmp_path.
- switch-power: a connected SimSwitch over the same world's SwitchModel, watching the two ports' fibers.
- carrier, traffic, rc-traffic (`emulated`, root): a veth pair between two network namespaces `lt<pid>-pc<n>-h1/h2`
  with an address on each end; the namespaces are always deleted, even when the test fails.

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
import dataclasses
import itertools
import os
import random
import re
import shutil
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from labctl.core.clock import now_ns
from labctl.core.events import KINDS, Event, EventQueue
from labctl.inventory.schema import Inventory, load_inventory
from labctl.labs.base import ReconfigWindow
from labctl.models.fabric import SimFabric
from labctl.models.switch import SwitchModel
from labctl.ocs.drivers.sim.switch import SimSwitch
from labctl.probes.base import PortSite, ProbeContext, probe_kinds
from labctl.probes.model import model_sites
from labctl.probes.sampling import CircuitProbe, Probe, ProbeSettings, QueueProbe, RdmaSettings
from tests.conftest import require

# Heartbeats every 20 ms (so steady probes write often), the switch monitor polled at 200 Hz; the sampling
# rates stay at their defaults (1 kHz Rx power, a ping every 1 ms).
SETTINGS = ProbeSettings(report_interval_ms=20.0, switch_power_hz=200.0)
FIRST_EVENT_S = 5.0  # "events flow within a few seconds"
STREAM_END_S = 3.0  # how long events() may take to end once the probe has stopped
MAX_QUEUE = 1 << 20  # a "finite" bound: more than this many buffered events is a memory problem, not a bound

TINY = textwrap.dedent(
    """
    lab: contract
    switches:
      ocs1: {{driver: sim, size: 4x4}}
    profile: fast
    hosts:
      h1:
        nics:
          - {{ifname: {a}, rail: 0, switch: ocs1, tx: 1, rx: 5, address: 10.77.0.1/24}}
      h2:
        nics:
          - {{ifname: {b}, rail: 0, switch: ocs1, tx: 2, rx: 6, address: 10.77.0.2/24}}
    """
)


def tiny_inventory(tmp_path: Path, a: str = "ens1f0np0", b: str = "ens1f0np0") -> Inventory:
    path = tmp_path / "inventory.yaml"
    path.write_text(TINY.format(a=a, b=b))
    return load_inventory(path)


@dataclass
class Rig:
    ctx: ProbeContext
    provoke: Callable[[], Awaitable[None]]
    """One stimulus after which the probe has written events (and the lab is back as it was)."""
    circuits: dict[str, str | None]
    side: list[Event] | None = None
    """Events the probe causes through another sink than its queue (None: it has none)."""


@dataclass(frozen=True)
class Harness:
    open: Callable[[Path], contextlib.AbstractAsyncContextManager[Rig]]
    root: bool = False
    window: bool = False
    """Run it inside a reconfiguration window, as the controller does while ports move (a probe that samples
    only then, like link-state, is otherwise quiet after its first reading)."""


# -- the simulated world: model-link, model-traffic, rx-power, switch-power --------------------------------
@contextlib.asynccontextmanager
async def model_world(tmp_path: Path, *, view: str) -> AsyncIterator[Rig]:
    """2 hosts x 1 port on one sim switch, patched to each other. `view`: "ports" (the NIC ports, model-driven
    transceivers and the model itself, as the simulated lab gives them) or "switch" (the switch's own
    monitor on the two ports' fibers, as the controller gives it)."""
    inv = tiny_inventory(tmp_path)
    profile = inv.profile()
    rng = random.Random(11)
    models = SwitchModel.many({name: spec.space for name, spec in inv.switches.items()}, profile, rng)
    fabric = SimFabric(inv, models, profile, rng)
    model = models["ocs1"]
    control = SimSwitch(model, lambda _e: None)  # the experiment's driver session
    side: list[Event] = []
    monitor = SimSwitch(model, side.append)  # the session the switch-power probe reads through
    a, b = inv.ports
    circuit = [(a.tx, b.rx), (b.tx, a.rx)]
    fibers = sorted({a.tx, a.rx, b.tx, b.rx})

    async def flip() -> None:
        await control.disconnect(fibers)
        await asyncio.sleep(0.01)
        await control.apply(circuit)

    async def monitor_outage() -> None:
        # The probe's own queue carries only failed reads (`ocs.error`); a working monitor's readings go out
        # through the driver's sink (`side`). A short outage of its driver session makes a few polls fail.
        await flip()
        await monitor.close()
        await asyncio.sleep(0.05)
        await monitor.connect()

    await control.connect()
    await monitor.connect()
    try:
        await control.apply(circuit)
        if view == "ports":
            ctx = ProbeContext(SETTINGS, ports=model_sites(fabric, inv.ports), world=fabric)
            yield Rig(ctx, flip, {a.source: b.source, b.source: a.source})
        else:
            yield Rig(ProbeContext(SETTINGS, switches=[(monitor, fibers)]), monitor_outage, {}, side)
    finally:
        await monitor.close()
        await control.close()
        fabric.cancel_pending()
        for m in models.values():
            m.cancel_pending()


# -- a bench power meter: power-meter ------------------------------------------------------------------------
METER = """
power_meters:
  pm1:
    emulate: true
    averaging_time_ms: 1
    channels:
      1: {host: h1, nic: ens1f0np0}
      2: {switch: ocs1, port: 6}
"""


@contextlib.asynccontextmanager
async def meter_world(tmp_path: Path) -> AsyncIterator[Rig]:
    """The model world's two receive fibers tapped by an emulated N77xx (one by NIC port, one by switch
    port) over real TCP; the flip darkens and relights both."""
    pytest.importorskip("pyvisa", reason="the power-meter probe needs the [scpi] extra")
    from labctl.emulators.power_meter import meter_emulator
    from labctl.ocs.drivers.sim.switch import SimSwitch as Control
    from labctl.probes.base import MeterSite

    path = tmp_path / "inventory.yaml"
    path.write_text(TINY.format(a="ens1f0np0", b="ens1f0np0") + METER)
    inv = load_inventory(path)
    profile = inv.profile()
    rng = random.Random(11)
    models = SwitchModel.many({name: spec.space for name, spec in inv.switches.items()}, profile, rng)
    fabric = SimFabric(inv, models, profile, rng)
    control = Control(models["ocs1"], lambda _e: None)
    a, b = inv.ports
    circuit = [(a.tx, b.rx), (b.tx, a.rx)]

    async def flip() -> None:
        await control.disconnect(sorted({a.tx, a.rx, b.tx, b.rx}))
        await asyncio.sleep(0.01)
        await control.apply(circuit)

    channels = inv.meter_channels("pm1")
    emulator = meter_emulator("pm1", channels, models)
    await control.connect()
    await emulator.start()
    try:
        await control.apply(circuit)
        site = MeterSite("pm1", inv.model.power_meters["pm1"], channels, lambda: emulator.address)
        yield Rig(ProbeContext(SETTINGS, meters=[site]), flip, {})
    finally:
        await emulator.close()
        await control.close()
        fabric.cancel_pending()
        for m in models.values():
            m.cancel_pending()


# -- the kernel: carrier, traffic over a veth pair between two namespaces ------------------------------------
_rigs = itertools.count()
NS_PREFIX = f"lt{os.getpid()}-pc"


def ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


@contextlib.asynccontextmanager
async def veth_pair(tmp_path: Path) -> AsyncIterator[Rig]:
    """h1's port `va` in namespace ...-h1 and h2's `vb` in ...-h2, the two ends of one veth, addressed and up."""
    require(sys.platform == "linux", "needs Linux")
    require(os.geteuid() == 0, "needs root for network namespaces and veth pairs")
    require(shutil.which("ip") is not None, "needs iproute2 (ip)")
    inv = tiny_inventory(tmp_path, "va", "vb")
    prefix = f"{NS_PREFIX}{next(_rigs)}-"
    spaces = [f"{prefix}{port.host}" for port in inv.ports]
    created: list[str] = []
    try:
        for ns in spaces:
            ip("netns", "add", ns)
            created.append(ns)
        (a, b), (ns_a, ns_b) = inv.ports, spaces
        ip("-n", ns_a, "link", "add", a.ifname, "type", "veth", "peer", "name", b.ifname, "netns", ns_b)
        for port, ns in zip(inv.ports, spaces, strict=True):
            assert port.address is not None
            ip("-n", ns, "addr", "add", port.address, "dev", port.ifname)
            ip("-n", ns, "link", "set", port.ifname, "up")
        sites = [
            PortSite(port, netns=ns, ip=str(port.address).split("/")[0])
            for port, ns in zip(inv.ports, spaces, strict=True)
        ]

        async def flap() -> None:
            # Admin-down of one end takes the carrier of both (veth) and stops the traffic between them.
            await asyncio.to_thread(ip, "-n", ns_a, "link", "set", a.ifname, "down")
            await asyncio.sleep(0.05)
            await asyncio.to_thread(ip, "-n", ns_a, "link", "set", a.ifname, "up")

        yield Rig(ProbeContext(SETTINGS, ports=sites), flap, {a.source: b.source, b.source: a.source})
    finally:
        delete_namespaces(created)


def delete_namespaces(names: list[str]) -> None:
    """Blocking on purpose: teardown that awaited could be cancelled halfway and leave namespaces behind.
    Deleting a namespace deletes the veth end inside it, and with it its peer."""
    for ns in reversed(names):
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)


@pytest.fixture(scope="module", autouse=True)
def _no_namespace_left() -> Iterator[None]:
    """Backstop for the finally above: no namespace of this module outlives it."""
    yield
    if sys.platform == "linux" and os.geteuid() == 0:
        from labctl.linux import netns

        left = netns.cleanup(NS_PREFIX)
        assert not left, f"namespaces left behind: {left}"


@contextlib.asynccontextmanager
async def veth_pair_rc(tmp_path: Path) -> AsyncIterator[Rig]:
    """The veth pair, with queue pairs whose retry budget (4.096 us x 2^8 x 2, ~2 ms) the 50 ms flap
    outlasts: the QP errors, and under `reconnect` is reset; every RC signal gets written."""
    rdma = RdmaSettings(timeout=8, retry_cnt=1, policy="reconnect")
    async with veth_pair(tmp_path) as rig:
        settings = rig.ctx.settings.model_copy(update={"transport": "rdma", "rdma": rdma})
        yield dataclasses.replace(rig, ctx=dataclasses.replace(rig.ctx, settings=settings))


@contextlib.asynccontextmanager
async def model_world_rc(tmp_path: Path) -> AsyncIterator[Rig]:
    """The model world, with queue pairs whose retry budget (~2 ms) the flip's dark gap and link-up outlast:
    every RC signal gets written (error, QP state, reconnect under `reconnect`)."""
    rdma = RdmaSettings(timeout=8, retry_cnt=1, policy="reconnect")
    async with model_world(tmp_path, view="ports") as rig:
        settings = rig.ctx.settings.model_copy(update={"transport": "rdma", "rdma": rdma})
        yield dataclasses.replace(rig, ctx=dataclasses.replace(rig.ctx, settings=settings))


@contextlib.asynccontextmanager
async def rdma_device(tmp_path: Path) -> AsyncIterator[Rig]:
    """verbs-rc needs an RDMA device, which neither CI nor the development machines have: its logic runs
    against the QP model in tests/integration/test_rdma_verbs_rc.py, and on a lab's ports in tests/hardware."""
    pytest.skip("verbs-rc needs an RDMA device (tests/hardware runs it on a lab: --lab, transport rdma)")
    yield  # type: ignore[unreachable]


def _model(view: str) -> Callable[[Path], contextlib.AbstractAsyncContextManager[Rig]]:
    return lambda tmp_path: model_world(tmp_path, view=view)


HARNESSES: dict[str, Harness] = {
    "model-link": Harness(_model("ports")),
    "model-traffic": Harness(_model("ports")),
    "model-rc-traffic": Harness(model_world_rc),
    "rx-power": Harness(_model("ports")),
    "switch-power": Harness(_model("switch")),
    "carrier": Harness(veth_pair, root=True),
    "traffic": Harness(veth_pair, root=True),
    "rc-traffic": Harness(veth_pair_rc, root=True),
    "verbs-rc": Harness(rdma_device),
    "link-state": Harness(veth_pair, root=True, window=True),
    "power-meter": Harness(meter_world),
}


def _param(name: str) -> object:
    harness = HARNESSES.get(name)
    return pytest.param(name, id=name, marks=[pytest.mark.emulated] if harness and harness.root else [])


NAMES = [_param(name) for name in probe_kinds.names()]


# -- fixtures and helpers ------------------------------------------------------------------------------------
@pytest.fixture(params=NAMES)
def name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def rig(name: str, tmp_path: Path) -> AsyncIterator[Rig]:
    harness = HARNESSES.get(name)
    if harness is None:
        pytest.fail(f"probe {name!r} is registered but has no harness: add it to HARNESSES in {__file__}")
    async with harness.open(tmp_path) as opened:
        yield opened


def build(name: str, rig: Rig) -> Probe:
    """Through the registry, as labs build probes; circuits set first on a CircuitProbe; a window opened on
    a probe whose harness asks for one."""
    probe = probe_kinds.get(name).build(rig.ctx)
    if isinstance(probe, CircuitProbe):
        probe.set_circuits(rig.circuits)
    if HARNESSES[name].window and isinstance(probe, ReconfigWindow):
        probe.open_window()
    return probe


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


# -- the contract --------------------------------------------------------------------------------------------
def test_every_registered_probe_has_a_harness() -> None:
    registered = set(probe_kinds.names())
    missing = sorted(registered - set(HARNESSES))
    assert not missing, (
        f"registered probe(s) {missing} have no harness in {__file__}: add an entry to HARNESSES that opens "
        "a ProbeContext the probe can run in here, so that the contract suite covers it"
    )
    stale = sorted(set(HARNESSES) - registered)
    assert not stale, f"HARNESSES has entries for probes that are not registered: {stale}"


@pytest.mark.parametrize("entry_name", probe_kinds.names())
def test_entry_declares_known_signals(entry_name: str) -> None:
    entry = probe_kinds.get(entry_name)
    assert entry.name == entry_name
    assert entry.signals and isinstance(entry.signals, tuple), f"{entry_name}: declares no signals"
    unknown = sorted(set(entry.signals) - KINDS)
    assert not unknown, f"{entry_name}: signals {unknown} are not event kinds (labctl.core.events.Kind)"
    assert entry.description.strip(), f"{entry_name}: no description"


async def test_start_events_stop(name: str, rig: Rig) -> None:
    probe = build(name, rig)
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


async def test_events_are_declared_signals_of_its_own_ports(name: str, rig: Rig) -> None:
    entry = probe_kinds.get(name)
    hosts = {site.port.source: site.port.host for site in (*rig.ctx.ports, *rig.ctx.peers)}
    for switch, ports in rig.ctx.switches:
        hosts[f"ocs:{switch.name}"] = ""
        hosts.update({f"ocs:{switch.name}/{port}": "" for port in ports})
    for meter in rig.ctx.meters:  # a bench meter's readings: its channels, on the controller (no host)
        hosts[f"pm:{meter.name}"] = ""
        hosts.update({channel.source: "" for channel in meter.channels})
    probe = build(name, rig)
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
        if (
            e.kind not in entry.signals and e.kind != "sampler.error"
        ):  # any sampler may report its own trouble
            bad.append(f"kind {e.kind!r} not in its signals {entry.signals}: {e}")
        # Model times may precede delivery a little (a late loop catches transitions up): 1 s of slack.
        if type(e.t_ns) is not int or not t0 - 1_000_000_000 <= e.t_ns <= t1:
            bad.append(f"t_ns {e.t_ns!r} is not an int inside the test's run [{t0}, {t1}]: {e}")
        if e.source not in hosts:
            bad.append(f"source {e.source!r} is not a port of its context ({sorted(hosts)}): {e}")
        elif e.host != hosts[e.source]:
            bad.append(f"host {e.host!r} is not {hosts[e.source]!r}, the host of {e.source}: {e}")
    assert not bad, f"{name}: {len(bad)} of {len(written)} events break the contract:\n" + "\n".join(bad[:10])
    unseen = sorted(set(entry.signals) - {e.kind for e in written})
    assert not unseen, f"{name}: declared signal(s) {unseen} never written while provoked"


async def test_queue_is_bounded(name: str, rig: Rig) -> None:
    probe = build(name, rig)
    assert type(probe.dropped) is int and probe.dropped == 0, f"{name}: `dropped` must be an int, 0 at start"
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


async def test_drops_are_counted(name: str, rig: Rig) -> None:
    probe = build(name, rig)
    if not isinstance(probe, QueueProbe):
        pytest.fail(f"{name} is not a QueueProbe: give this test a way to shrink its queue")
    # Factories take no queue size (ProbeContext has none), so build through the registry as a lab does and
    # swap in a 2-slot queue before entering: QueueProbe writes and counts through `self.queue` only.
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


async def test_entering_twice_is_refused(name: str, rig: Rig) -> None:
    probe = build(name, rig)
    async with reading(probe) as reader:
        async with probe:
            with pytest.raises(RuntimeError, match=rf"probe {re.escape(probe.name)} is already running"):
                await probe.__aenter__()
            # The refusal leaves the running probe alone: it still writes, and one exit stops it.
            await rig.provoke()
            await until(lambda: bool(reader.seen), FIRST_EVENT_S, f"{name}: no events after a refused enter")
        assert await reader.ended(), f"{name}: events() did not end after the probe stopped"


async def test_reentering_after_exit_is_refused(name: str, rig: Rig) -> None:
    """A probe runs once: the first exit ended its stream for good, so a second run would sample into a
    closed queue, uncounted. Entering it again is refused with a clear error, and starts nothing."""
    probe = build(name, rig)
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


async def test_name(name: str, rig: Rig) -> None:
    probe = build(name, rig)
    assert isinstance(probe, Probe), f"{name}: {type(probe).__name__} does not satisfy the Probe protocol"
    assert isinstance(probe.name, str) and probe.name, f"{name}: probe.name {probe.name!r} is empty"
    assert probe.name == name or probe.name.startswith(name), (
        f"probe.name {probe.name!r} neither is nor starts with its registry name {name!r}"
    )
