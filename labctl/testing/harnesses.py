"""Harnesses: where a probe can run on this machine, for the probe contract (labctl.testing.probe_contract).

A harness opens a `Rig`: a `ProbeContext` the probe can run in, a `provoke()` that makes it write events
(move light, flap a link, fail a monitor), the circuits a CircuitProbe should exchange traffic on, and where
a probe writes through another sink than its own queue, that sink (`side`). A probe of yours built on the
simulated world reuses labctl's: `harness = MODEL_PORTS` in its `ProbeContract` subclass.
- MODEL_PORTS (model-link, model-traffic, rx-power): a tiny SimFabric world (2 hosts, 1 port each, one `sim`
  switch, the two ports patched to each other so there is light and traffic) from an inventory in tmp_path.
- SWITCH_MONITOR (switch-power): a connected SimSwitch over the same world's SwitchModel, watching the two
  ports' fibers.
- VETH_PAIR (carrier, traffic; rc-traffic and link-state with their variants; root): a veth pair between two
  network namespaces `lt<pid>-pc<n>-h1/h2` with an address on each end; the namespaces are always deleted,
  even when the test fails.
- POWER_METER (power-meter): the model world's receive fibers tapped by an emulated bench power meter.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import os
import random
import shutil
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from labctl.core.events import Event
from labctl.inventory.schema import Inventory, load_inventory
from labctl.models.fabric import SimFabric
from labctl.models.switch import SwitchModel
from labctl.ocs.drivers.sim.switch import SimSwitch
from labctl.probes.base import PortSite, ProbeContext
from labctl.probes.model import model_sites
from labctl.probes.sampling import ProbeSettings, RdmaSettings
from labctl.testing.support import require

__all__ = [
    "HARNESSES",
    "MODEL_PORTS",
    "MODEL_PORTS_RC",
    "NS_PREFIX",
    "POWER_METER",
    "RDMA_DEVICE",
    "SETTINGS",
    "SWITCH_MONITOR",
    "TINY",
    "VETH_PAIR",
    "VETH_PAIR_RC",
    "VETH_PAIR_WINDOW",
    "Harness",
    "Rig",
    "meter_world",
    "model_world",
    "model_world_rc",
    "namespaces_left",
    "rdma_device",
    "tiny_inventory",
    "veth_pair",
    "veth_pair_rc",
]

# Heartbeats every 20 ms (so steady probes write often), the switch monitor polled at 200 Hz; the sampling
# rates stay at their defaults (1 kHz Rx power, a ping every 1 ms).
SETTINGS = ProbeSettings(report_interval_ms=20.0, switch_power_hz=200.0)

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
    """h1's port `va` in namespace ...-h1 and h2's `vb` in ...-h2, the two ends of one veth, addressed and
    up."""
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


def namespaces_left() -> list[str]:
    """Remove every namespace the veth harnesses of this process left (a backstop for their `finally`); the
    names removed."""
    if sys.platform != "linux" or os.geteuid() != 0:
        return []
    from labctl.linux import netns

    return netns.cleanup(NS_PREFIX)


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
    against the QP model in labctl's tests/integration/test_rdma_verbs_rc.py, and on a lab's ports in
    tests/hardware."""
    pytest.skip("verbs-rc needs an RDMA device (tests/hardware runs it on a lab: --lab, transport rdma)")
    yield  # an async generator, as a harness is; never reached


def _model(view: str) -> Callable[[Path], contextlib.AbstractAsyncContextManager[Rig]]:
    return lambda tmp_path: model_world(tmp_path, view=view)


MODEL_PORTS = Harness(_model("ports"))
"""The simulated world's NIC ports (model-driven link, traffic, transceivers): a probe on `ProbeContext.ports`
and `world` (the SimFabric), like model-link, model-traffic and rx-power."""
MODEL_PORTS_RC = Harness(model_world_rc)
"""MODEL_PORTS with RDMA RC settings whose retry budget the flip outlasts (model-rc-traffic)."""
SWITCH_MONITOR = Harness(_model("switch"))
"""The simulated world's switch, read through its own monitor on the ports' fibers (switch-power)."""
POWER_METER = Harness(meter_world)
"""The simulated world's receive fibers tapped by an emulated bench power meter over TCP (power-meter)."""
VETH_PAIR = Harness(veth_pair, root=True)
"""A veth pair between two network namespaces, flapped (root): kernel probes like carrier and traffic."""
VETH_PAIR_WINDOW = Harness(veth_pair, root=True, window=True)
"""VETH_PAIR inside a reconfiguration window (link-state)."""
VETH_PAIR_RC = Harness(veth_pair_rc, root=True)
"""VETH_PAIR with RDMA RC settings whose retry budget the flap outlasts (rc-traffic)."""
RDMA_DEVICE = Harness(rdma_device)
"""A real RDMA device: skipped here (verbs-rc runs in tests/hardware on a lab)."""

HARNESSES: dict[str, Harness] = {
    "model-link": MODEL_PORTS,
    "model-traffic": MODEL_PORTS,
    "model-rc-traffic": MODEL_PORTS_RC,
    "rx-power": MODEL_PORTS,
    "switch-power": SWITCH_MONITOR,
    "carrier": VETH_PAIR,
    "traffic": VETH_PAIR,
    "rc-traffic": VETH_PAIR_RC,
    "verbs-rc": RDMA_DEVICE,
    "link-state": VETH_PAIR_WINDOW,
    "power-meter": POWER_METER,
}
"""How to run each of labctl's probes (labctl.core.registry.PROBES) in the contract suite. A probe labctl
registers needs an entry here: tests/contract/test_probe_contract.py fails until it has one."""
