"""`labctl lab check` on labs that reach out: a real lab's interfaces over netlink, an agents lab's agents
through mosquitto. The checks in-process are tests/unit/test_preflight.py."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from labctl.agents.agent import Agent
from labctl.agents.broker import BrokerSettings
from labctl.agents.inspect import inspect_port
from labctl.inventory.schema import Inventory, NicPort
from labctl.labs import load
from labctl.run.preflight import Check, _port_checks, preflight
from tests.mosquitto import Mosquitto

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
