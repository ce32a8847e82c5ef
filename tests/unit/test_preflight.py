"""`labctl lab check` (labctl.preflight) agrees with what a run does: the owned-ports test is converge's, the
hosts' interfaces are inspected only where the agents' probes read them, and a module the Rx-power probe
refuses fails the check with the probe's words."""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from labctl.agents import inspect
from labctl.agents.agent import Agent
from labctl.agents.broker import BrokerSettings
from labctl.agents.inspect import inspect_port
from labctl.drivers.sim import DRIVER as SIM
from labctl.inventory import Inventory, NicPort
from labctl.labs import load
from labctl.mapping import MappingDiff
from labctl.models.switch import SwitchModel
from labctl.ocs import crossing_patches
from labctl.preflight import Check, _port_checks, _read_switch, preflight
from labctl.probes.rxpower import ModulePort, RxPowerProbe
from labctl.profiles import resolve_profile
from labctl.switches import emulate_switch
from labctl.transceiver import FlatImage, ModuleEeprom, PagedImage, read_dom
from tests.mosquitto import Mosquitto
from tests.unit.test_dom import cmis_pages, put, qsfp28

FAST = resolve_profile("fast")


@pytest.mark.parametrize(
    ("patches", "crossing"),
    [
        ({(1, 9), (2, 10)}, []),  # both ends owned
        ({(5, 13)}, []),  # both ends another lab's
        ({(2, 14), (5, 10), (1, 9)}, [(2, 14), (5, 10)]),  # owned ingress → foreign egress, and back
    ],
)
async def test_the_switch_check_reports_the_patches_converge_refuses_to_remove(
    patches: set[tuple[int, int]], crossing: list[tuple[int, int]]
) -> None:
    config = SIM.config.model_validate({"driver": "sim", "size": "8x8", "owned_ports": ["1-4", "9-12"]})
    owned = config.owned
    assert owned is not None
    model = SwitchModel("ocs1", config.space, FAST, random.Random(0))
    await model.execute(MappingDiff(remove=frozenset(), add=frozenset(patches)))
    out: list[Check] = []
    try:
        await _read_switch(
            "switch ocs1", config, emulate_switch("ocs1", config, model, lambda e: None), "model", out
        )
    finally:
        model.cancel_pending()
    [row] = [c for c in out if c.item == "owned ports"]
    assert crossing_patches(patches, owned) == crossing
    assert row.ok is (not crossing)
    if crossing:
        assert str(crossing) in row.detail


# -- hosts: agents online, and interfaces only where the agents' probes read real ones ---------------------------
PASSWORD_ENV = "LABCTL_TEST_PREFLIGHT_PW"


def lab(tmp_path: Path, kind: str, broker_url: str, switch: str, nics: dict[str, str]) -> Inventory:
    """Hosts h1, h2 (one NIC port each: `nics[host]` is its ifname) under a lab named after the test, so
    no retained message of another test reaches it."""
    name = "t-" + "".join(c if c.isalnum() else "-" for c in tmp_path.name)[-40:]
    path = tmp_path / "inventory.yaml"
    path.write_text(
        f"lab: {name}\nkind: {kind}\nswitches:\n  ocs1: {switch}\nbroker: {{url: '{broker_url}'}}\nhosts:\n"
        + "".join(
            f"  {host}: {{nics: [{{ifname: {ifname}, rail: 0, switch: ocs1, tx: {i}, rx: {8 + i}, "
            f"address: 10.77.0.{i}/24}}]}}\n"
            for i, (host, ifname) in enumerate(nics.items(), 1)
        )
    )
    return load(path)


@contextlib.asynccontextmanager
async def agents_on(inventory: Inventory, hosts: list[str]) -> AsyncIterator[None]:
    settings = BrokerSettings.from_inventory(inventory)
    agents = [Agent(inventory, host, settings) for host in hosts]
    tasks = [asyncio.create_task(a.run(), name=f"test-agent:{a.host}") for a in agents]
    try:
        await asyncio.wait_for(asyncio.gather(*(a.connected.wait() for a in agents)), 10)
        yield
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def table(checks: list[Check]) -> dict[str, dict[str, Check]]:
    out: dict[str, dict[str, Check]] = {}
    for c in checks:
        out.setdefault(c.subject, {})[c.item] = c
    return out


async def test_an_agents_lab_checks_its_agents_but_not_the_modeled_ports(
    mosquitto: Mosquitto, tmp_path: Path
) -> None:
    """The agents lab's ports are names in the model (p0 is no interface on any host): `lab check` must
    not fail them when `labctl run` works, yet must still fail a host whose agent is not online."""
    inventory = lab(tmp_path, "agents", mosquitto.url, "{driver: sim, size: 8x8}", {"h1": "p0", "h2": "p0"})
    async with agents_on(inventory, ["h1"]):
        rows = table(await preflight(inventory, timeout_s=2.0))
    assert not [s for s in rows if s.startswith("port ")], rows
    assert rows["host h1"]["agent"].ok is True
    assert (
        rows["host h1"]["ports"].ok is None and "modeled by the agents lab" in rows["host h1"]["ports"].detail
    )
    assert rows["host h2"]["agent"].ok is False and "not online" in rows["host h2"]["agent"].detail
    assert [c for r in rows.values() for c in r.values() if c.ok is False] == [rows["host h2"]["agent"]]


async def test_a_real_lab_inspects_each_hosts_interfaces(
    mosquitto: Mosquitto, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real lab's agents probe the hosts' own interfaces: each port is looked up there (lo exists and has
    no transceiver; nosuch0 does not exist)."""
    monkeypatch.setenv(PASSWORD_ENV, "secret")
    with (
        socket.socket() as s
    ):  # a switch address nothing listens on: its check fails at once, beside the point
        s.bind(("127.0.0.1", 0))
        closed_port = s.getsockname()[1]
    switch = (
        f"{{driver: polatis-tl1, size: 8x8, address: 127.0.0.1, port: {closed_port}, user: admin, "
        f"password: '${{{PASSWORD_ENV}}}'}}"
    )
    inventory = lab(tmp_path, "real", mosquitto.url, switch, {"h1": "lo", "h2": "nosuch0"})
    async with agents_on(inventory, ["h1", "h2"]):
        rows = table(await preflight(inventory, timeout_s=5.0))
    assert rows["host h1"]["agent"].ok is True and rows["host h2"]["agent"].ok is True
    assert rows["port h1/lo"]["interface"].ok is True
    assert rows["port h1/lo"]["module"].ok is False
    assert rows["port h2/nosuch0"]["interface"].detail == "no interface nosuch0 on the host"
    assert "ports" not in rows["host h1"]


# -- a transceiver the Rx-power probe refuses fails the check, in the probe's words -----------------------------
def sfp_without_ddm() -> bytes:
    img = bytearray(512)
    put(img, 0, "03")  # SFP
    put(img, 92, "00")  # no digital diagnostics: identity only, no lanes
    return bytes(img)


def qsfp28_one_lane_dark() -> bytes:
    return bytes(qsfp28())  # lanes 1-4: 0.8, 0.1, 0 (no light), 1.0 mW


def cmis_without_rx_monitor() -> dict[tuple[int, int, int], bytes]:
    pages = cmis_pages()
    page01 = bytearray(pages[(0x50, 0, 1)])
    put(page01, 160 - 128, "03")  # Tx bias and Tx power monitors, no Rx power monitor: lanes, unmonitored
    pages[(0x50, 0, 1)] = bytes(page01)
    return pages


def cmis_flat_memory() -> dict[tuple[int, int, int], bytes]:
    lower = bytearray(256)
    put(lower, 0, "18 40 80")  # QSFP-DD, CMIS 4.0, flat memory: no per-lane monitors at all
    return {(0x50, 0, 0): bytes(lower)}


MODULES: dict[str, Callable[[], ModuleEeprom]] = {
    "qsfp28, one lane dark": lambda: FlatImage(qsfp28_one_lane_dark()),
    "sfp without diagnostics": lambda: FlatImage(sfp_without_ddm()),
    "cmis without an rx monitor": lambda: PagedImage(cmis_without_rx_monitor()),
    "cmis flat memory": lambda: PagedImage(cmis_flat_memory()),
}


@pytest.mark.parametrize("module", MODULES)
async def test_check_and_run_agree_on_a_ports_transceiver(
    module: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the agent reports (inspect_port) and the check makes of it, against what the rx-power probe does
    with the same module at start: the probe refuses exactly the modules the check fails, for the reason
    the check gives. A lane with no light passes (the patch may simply not be made yet)."""
    open_module = MODULES[module]
    monkeypatch.setattr(inspect, "read_module", lambda ifname: read_dom(open_module()))
    port = NicPort("h1", "lo", 0, None, "ocs1", 1, 9, 100, None)  # lo: an interface every host has
    facts = await asyncio.to_thread(inspect_port, port)  # as the agent runs it: pyroute2 wants no loop
    [row] = [c for c in _port_checks(port.label, None, facts) if c.item.startswith("module")]

    probe = RxPowerProbe([ModulePort(port.source, port.host, open_module)], hz=100)
    async with probe:
        pass
    refusal = probe.unsampled.get(port.source)

    assert row.ok is (refusal is None), (row, refusal)
    if refusal is not None:
        assert refusal == f"{port.source}: {row.detail}"
        assert "has no Rx power monitor" in row.detail
    else:
        assert row.detail == "QSFP28: 4 lane(s): -0.97 dBm, -10.00 dBm, no light, 0.00 dBm"


async def test_the_module_row_names_vendor_part_and_serial(monkeypatch: pytest.MonkeyPatch) -> None:
    from labctl.models.module_eeprom import EmulatedQsfp28

    module = EmulatedQsfp28(rx_power_mw=0.5, vendor="ACME OPTICS", part_number="QSFP-X", serial="SN42")
    monkeypatch.setattr(inspect, "read_module", lambda ifname: read_dom(module))
    port = NicPort("h1", "lo", 0, None, "ocs1", 1, 9, 100, None)
    facts = await asyncio.to_thread(inspect_port, port)
    assert facts["module"]["identity"]["serial_number"] == "SN42"
    [row] = [c for c in _port_checks(port.label, None, facts) if c.item.startswith("module")]
    assert row.ok and row.detail.startswith("QSFP28 ACME OPTICS QSFP-X SN42: 4 lane(s): -3.01 dBm")


# -- what the inventory declares about a port's module (`module:`) ------------------------------------------------
def test_a_port_declared_with_a_module_fails_when_none_is_there() -> None:
    """`lo` exists on every host and carries no transceiver: declared with one (the default, as on a real NIC
    port), the check fails it in the driver's words; declared without one, the row says
    where t2 comes from, or plainly that it cannot be measured there."""
    declared = NicPort("h1", "lo", 0, None, "ocs1", 1, 9, 100, None)
    assert declared.module is True
    facts = inspect_port(declared)
    assert facts["exists"] is True and facts["module"]["present"] is False
    [row] = [c for c in _port_checks(declared.label, None, facts) if c.item == "module"]
    assert row.ok is False and row.detail.startswith("no module EEPROM on lo")

    bare = NicPort("h1", "lo", 0, None, "ocs1", 1, 9, 100, None, None, False)
    facts = inspect_port(bare)  # the agent reads what is there; the check judges it by the declaration
    [row] = [c for c in _port_checks(bare.label, None, facts, module=False) if c.item == "module"]
    assert row == Check(
        "port h1/lo",
        "module",
        None,
        "no module declared: t2 from nothing (no power meter taps its receive fiber): t2 cannot be measured "
        "on this port",
    )
    [row] = [
        c
        for c in _port_checks(bare.label, None, facts, module=False, tapped_by="power meter pm1 ch 3")
        if c.item == "module"
    ]
    assert row == Check("port h1/lo", "module", None, "no module declared: t2 from power meter pm1 ch 3")


async def test_a_real_lab_checks_what_each_port_declares(
    mosquitto: Mosquitto, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the agent, as `labctl lab check` runs it: h1's `lo` declared with a module fails (there is
    none), h2's `lo` declared without one is information naming the meter channel that taps it, and the
    meter (nothing listens at its address) fails in one line."""
    monkeypatch.setenv(PASSWORD_ENV, "secret")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed_port = s.getsockname()[1]
    switch = (
        f"{{driver: polatis-tl1, size: 8x8, address: 127.0.0.1, port: {closed_port}, user: admin, "
        f"password: '${{{PASSWORD_ENV}}}'}}"
    )
    path = lab(tmp_path, "real", mosquitto.url, switch, {"h1": "lo", "h2": "lo"}).path
    assert path is not None
    path.write_text(
        path.read_text().replace("rx: 10, address", "rx: 10, module: false, address")
        + "power_meters:\n  pm1:\n    address: 127.0.0.1\n"
        + f"    port: {closed_port}\n    timeout_s: 0.5\n    channels: {{3: {{host: h2, nic: lo}}}}\n"
    )
    inventory = load(path)
    assert [p.module for p in inventory.ports] == [True, False]
    async with agents_on(inventory, ["h1", "h2"]):
        rows = table(await preflight(inventory, timeout_s=5.0))
    assert rows["port h1/lo"]["module"].ok is False
    assert rows["port h2/lo"]["module"] == Check(
        "port h2/lo", "module", None, "no module declared: t2 from power meter pm1 ch 3"
    )
    meter = rows["power meter pm1"]["reachable, identity"]
    assert meter.ok is False and "\n" not in meter.detail, meter


def test_the_module_declaration_is_checked_like_any_field(tmp_path: Path) -> None:
    from labctl.errors import InputError
    from labctl.inventory import load_inventory

    path = tmp_path / "inventory.yaml"
    path.write_text(
        "lab: t\nswitches:\n  ocs1: {driver: sim, size: 8x8}\nhosts:\n  h1:\n    nics:\n"
        "      - {ifname: p0, rail: 0, switch: ocs1, tx: 1, rx: 9, module: perhaps}\n"
    )
    with pytest.raises(InputError) as bad:
        load_inventory(path)
    line = str(bad.value)
    assert line.startswith(f"{path}:7: hosts.h1.nics[0].module: ") and "\n" not in line, line


def test_the_rx_power_probe_leaves_ports_without_a_module_alone() -> None:
    """A port declared `module: false` is not among the rx-power probe's ports: no EEPROM is opened, no
    sampler.error is written for it."""
    from labctl.probes import PortSite, ProbeContext
    from labctl.probes.rxpower import PROBE
    from labctl.sampling import ProbeSettings

    with_module = NicPort("h1", "lo", 0, None, "ocs1", 1, 9, 100, None)
    without = NicPort("h1", "nosuch0", 0, None, "ocs1", 2, 10, 100, None, None, False)
    probe = PROBE.build(ProbeContext(ProbeSettings(), ports=[PortSite(with_module), PortSite(without)]))
    assert isinstance(probe, RxPowerProbe)
    assert [p.source for p in probe.ports] == [with_module.source]
