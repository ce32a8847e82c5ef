"""`labctl lab check`: is this lab ready for a run? Every switch and every host, one row per fact.

Switches: reachable and logged in (connect), the size the inventory declares (the driver refuses a
mismatch at connect), the patches it holds now, and on a shared switch no patch joining an owned port to
a foreign one. Hosts of a lab with agents: the broker reachable, each agent online and its version; where
the agents' probes read real interfaces (LabKind.agents_probe_interfaces), every NIC port's interface
present, its carrier and operstate, the inventory's address configured on it, and what it declares about a
transceiver (`module:`): one declared must be present with Rx power monitored on every lane; a port
declared without one says where its t2 comes from (the power-meter channel tapping its receive fiber, or
nowhere). Power meters at an address: reachable, an N77xx, its error queue empty, each mapped channel read
once. Nothing is changed anywhere: switches and meters are only read, agents only `inspect`.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import asdict, dataclass
from typing import Any

from labctl.core.errors import HardwareError, LabctlError
from labctl.core.events import Event
from labctl.core.version import __version__
from labctl.inventory.config import SwitchConfig
from labctl.inventory.schema import Inventory, MeterChannel, NicPort, PowerMeterSpec
from labctl.labs import check
from labctl.linux.transceiver import mw_to_dbm
from labctl.models.switch import SwitchModel
from labctl.ocs.protocol import OpticalSwitch, crossing_patches
from labctl.ocs.switches import emulate_switch, open_switch


@dataclass(frozen=True)
class Check:
    subject: str  # "switch ocs1", "host h1", "port h1/ens1f0np0"
    item: str  # what was checked
    ok: bool | None  # None: information, not a pass or a failure
    detail: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


async def _check_switch(name: str, spec: SwitchConfig, inventory: Inventory, out: list[Check]) -> None:
    subject = f"switch {name}"
    events: list[Event] = []
    model: SwitchModel | None = None
    switch: OpticalSwitch
    try:
        if spec.over_model:  # a model of the lab's: connect to it as a run would (its emulator, if any)
            model = SwitchModel(name, spec.space, inventory.profile(), random.Random(0))
            switch = emulate_switch(name, spec, model, events.append)
        else:
            switch = open_switch(name, spec, events.append)
    except LabctlError as e:
        out.append(Check(subject, "driver", False, str(e)))
        return
    where = "the lab's model" if spec.over_model else f"{getattr(spec, 'address', '?')}"
    try:
        await _read_switch(subject, spec, switch, where, out)
    finally:
        if model is not None:
            model.cancel_pending()


async def _read_switch(
    subject: str, spec: SwitchConfig, switch: OpticalSwitch, where: str, out: list[Check]
) -> None:
    try:
        await switch.connect()
    except LabctlError as e:
        out.append(Check(subject, "reachable, login, size", False, str(e)))
        await switch.close()
        return
    try:
        out.append(Check(subject, "reachable, login, size", True, f"{spec.driver} at {where}, {spec.space}"))
        patches = (await switch.get_mapping()).value
        listed = " ".join(f"{a}→{b}" for a, b in sorted(patches)) or "none"
        out.append(Check(subject, "patches", None, f"{len(patches)}: {listed}"))
        owned = spec.owned
        if owned is not None:
            crossing = crossing_patches(patches, owned)  # the very test `converge` refuses by
            detail = (
                f"patch(es) {crossing} join owned ports to another lab's"
                if crossing
                else f"{len(owned)} owned, no patch crosses"
            )
            out.append(Check(subject, "owned ports", not crossing, detail))
    except LabctlError as e:
        out.append(Check(subject, "read patches", False, str(e)))
    finally:
        await switch.close()


def _port_checks(
    label: str,
    expected_address: str | None,
    facts: dict[str, Any],
    *,
    module: bool = True,
    tapped_by: str | None = None,
) -> list[Check]:
    """One port's rows. `module`: whether the inventory declares a transceiver there (`module:`);
    `tapped_by`: the power-meter channel measuring its receive fiber, if any ("power meter pm1 ch 3")."""
    subject = f"port {label}"
    if not facts.get("exists"):
        return [Check(subject, "interface", False, f"no interface {facts.get('ifname')} on the host")]
    rows = [Check(subject, "interface", True, str(facts.get("ifname")))]
    carrier = facts.get("carrier")
    state = {True: "up", False: "down", None: "unknown (interface down?)"}[carrier]
    rows.append(Check(subject, "carrier", None, f"{state}, operstate {facts.get('operstate')}"))
    if expected_address is not None:
        ok = bool(facts.get("address_configured"))
        have = ", ".join(facts.get("addresses") or []) or "none"
        rows.append(
            Check(
                subject,
                "address",
                ok,
                f"{expected_address} " + ("configured" if ok else f"missing (has {have})"),
            )
        )
    module_facts = facts.get("module") or {}
    if not module:
        row = _undeclared_module_check(subject, tapped_by)
        if module_facts.get("present"):  # read anyway (one pass, read-only): a declaration to revisit
            row = Check(
                subject,
                row.item,
                None,
                f"{row.detail} ({module_facts.get('identifier')} module present: declare `module: true` to "
                "read its DOM)",
            )
        rows.append(row)
        return rows
    if not module_facts.get("present"):
        rows.append(Check(subject, "module", False, str(module_facts.get("error", "no module"))))
    else:
        rows.append(_module_check(subject, module_facts))
    return rows


def _undeclared_module_check(subject: str, tapped_by: str | None) -> Check:
    """A port the inventory declares without a module (`module: false`): nothing to read on the host. Not a
    failure either way: without a meter the run still measures the switch, carrier and traffic and leaves t2
    empty (never wrong), which is what the inventory says this lab can do; the row says so in plain words."""
    if tapped_by is not None:
        return Check(subject, "module", None, f"no module declared: t2 from {tapped_by}")
    return Check(
        subject,
        "module",
        None,
        "no module declared: t2 from nothing (no power meter taps its receive fiber): t2 cannot be "
        "measured on this port",
    )


def meter_taps(inventory: Inventory) -> dict[NicPort, str]:
    """Each NIC port whose receive fiber a power-meter channel measures → "power meter pm1 ch 3"."""
    taps: dict[NicPort, str] = {}
    for name in inventory.model.power_meters:
        for ch in inventory.meter_channels(name):
            if ch.nic is not None:
                taps.setdefault(ch.nic, f"power meter {name} ch {ch.channel}")
    return taps


async def _check_meter(
    name: str, spec: PowerMeterSpec, channels: list[MeterChannel], out: list[Check]
) -> None:
    """A meter at its address: reachable, an N77xx, nothing in its error queue, and one reading of each
    mapped channel (FETC only: the probe configures the meter when a run starts, the check changes nothing).
    An emulated meter exists only while a run of a model-backed lab serves it."""
    subject = f"power meter {name}"
    if spec.emulate:
        out.append(Check(subject, "reachable", None, "emulated: served by the lab while a run uses it"))
        return
    assert spec.address is not None
    try:
        facts = await asyncio.to_thread(_read_meter, name, spec, channels)
    except (LabctlError, OSError, ValueError) as e:
        out.append(Check(subject, "reachable, identity", False, str(e)))
        return
    except Exception as e:  # pyvisa's own errors (a timeout, a refused connection): one line, never a trace
        out.append(Check(subject, "reachable, identity", False, f"{spec.address}:{spec.port}: {e}"))
        return
    idn, readings = facts
    out.append(Check(subject, "reachable, identity", True, f"{idn} at {spec.address}:{spec.port}"))
    shown = ", ".join(
        f"ch {ch.channel} ({ch.label}) {reading}" for ch, reading in zip(channels, readings, strict=True)
    )
    out.append(Check(subject, "channels", None, shown))


def _read_meter(name: str, spec: PowerMeterSpec, channels: list[MeterChannel]) -> tuple[str, list[str]]:
    from labctl.probes.power_meter import NO_LIGHT_DBM, ScpiSession, check_errors, resource_name

    session = ScpiSession(resource_name(str(spec.address), spec.port), spec.timeout_s)
    try:
        idn = session.query("*IDN?")
        fields = [f.strip() for f in idn.split(",")]
        if len(fields) < 2 or not fields[1].upper().startswith("N77"):
            raise HardwareError(f"*IDN? answered {idn!r}, not an N77xx")
        check_errors(session, name, "its error queue")
        readings = []
        for ch in channels:
            dbm = float(session.query(f"FETC{ch.channel}:CHAN1:POW?"))
            readings.append(f"{dbm:.2f} dBm" if NO_LIGHT_DBM <= dbm < 1e30 else "no light")
        return idn, readings
    finally:
        session.close()


def _module_check(subject: str, module: dict[str, Any]) -> Check:
    """Fails exactly what the rx-power probe refuses at start, in its words: a module without an Rx power
    monitor (no DOM lanes at all, or lanes whose Rx power is not monitored). A lane without light passes:
    the patch may simply not be made yet."""
    identifier = module.get("identifier")
    if "rx_power_mw" not in module:  # an agent of another labctl version (the agent row says which)
        return Check(subject, "module, Rx power", False, f"{identifier}: the agent sent no Rx power in mW")
    lanes: list[float | None] = module["rx_power_mw"] or []
    monitored = [mw for mw in lanes if mw is not None]
    if not lanes or len(monitored) < len(lanes):
        return Check(subject, "module, Rx power", False, f"{identifier} module has no Rx power monitor")
    shown = ", ".join(_dbm_text(mw) for mw in monitored)
    identity = module.get("identity") or {}
    made = " ".join(filter(None, (identity.get(k) for k in ("vendor_name", "part_number", "serial_number"))))
    what = f"{identifier} {made}" if made else str(identifier)
    return Check(subject, "module, Rx power", True, f"{what}: {len(lanes)} lane(s): {shown}")


def _dbm_text(mw: float) -> str:
    dbm = mw_to_dbm(mw)
    return "no light" if dbm is None else f"{dbm:.2f} dBm"


async def _check_hosts(
    inventory: Inventory, out: list[Check], timeout_s: float, *, interfaces: bool, kind_name: str
) -> None:
    """The broker and every host's agent; with `interfaces`, every NIC port as the agent finds it."""
    from labctl.agents.broker import BrokerSettings
    from labctl.agents.hub import AgentHub

    taps = meter_taps(inventory)
    hub = AgentHub(inventory, BrokerSettings.from_inventory(inventory))
    try:
        await hub.start(timeout_s)
    except LabctlError as e:
        out.append(Check("broker", "reachable", False, str(e)))
        return
    try:
        out.append(Check("broker", "reachable", True, f"{hub.broker.hostname}:{hub.broker.port}"))

        async def one(host: str) -> list[Check]:
            rows: list[Check] = []
            try:
                await hub.wait_online(host, min(timeout_s, 3.0))
                reply = await hub.request(host, "inspect", {}, timeout_s=timeout_s)
            except LabctlError as e:
                return [Check(f"host {host}", "agent", False, str(e))]
            data = reply.data or {}
            version = data.get("version")
            same = version == __version__
            rows.append(
                Check(
                    f"host {host}",
                    "agent",
                    same,
                    f"online, labctl {version}" + ("" if same else f" (controller: {__version__})"),
                )
            )
            if not interfaces:  # the agent's probes read the model, not the host's interfaces
                rows.append(
                    Check(f"host {host}", "ports", None, f"modeled by the {kind_name} lab: nothing to check")
                )
                return rows
            ports = data.get("ports", {})
            for port in (p for p in inventory.ports if p.host == host):
                facts = ports.get(port.source, {"exists": False})
                rows.extend(
                    _port_checks(
                        port.label, port.address, facts, module=port.module, tapped_by=taps.get(port)
                    )
                )
            return rows

        for rows in await asyncio.gather(*(one(host) for host in inventory.hosts)):
            out.extend(rows)
    finally:
        await hub.stop()


async def preflight(inventory: Inventory, *, timeout_s: float = 10.0) -> list[Check]:
    """Every check, in inventory order. Raises InputError only for an inventory its lab kind refuses."""
    kind = check(inventory)
    out: list[Check] = []
    for name, spec in inventory.switches.items():
        await _check_switch(name, spec, inventory, out)
    for name, meter in inventory.model.power_meters.items():
        await _check_meter(name, meter, inventory.meter_channels(name), out)
    if kind.agent_probes:  # agents run either way; only some read real interfaces worth inspecting
        await _check_hosts(
            inventory, out, timeout_s, interfaces=kind.agents_probe_interfaces, kind_name=kind.name
        )
    else:
        for host in inventory.hosts:
            out.append(
                Check(f"host {host}", "ports", None, f"modeled by the {kind.name} lab: nothing to check")
            )
    return out
