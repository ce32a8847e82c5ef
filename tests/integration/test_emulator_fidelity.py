"""The emulators answer what public Polatis client code sends (issue 28, decision 0064), over real sockets:
a legacy TL1 script that splits RTRV-NETYPE on whitespace, TL1 attenuator and power monitor commands (and
the TL1 driver's attenuator calls); a
NETCONF client that sets a VOA (and the Rx power the NIC's probe reads drops by it), sets and reads the
power monitors' wavelength, and subscribes to notifications of cross-connect and port changes."""

from __future__ import annotations

import asyncio
import random
import threading
import xml.etree.ElementTree as ET
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from labctl.core.clock import now_ns
from labctl.core.errors import InputError
from labctl.core.events import Event, Kind
from labctl.emulators.netconf import NetconfEmulator
from labctl.emulators.tl1 import Tl1Emulator
from labctl.inventory.config import Secret
from labctl.inventory.mapping import MappingDiff, PortSpace
from labctl.inventory.profiles import resolve_profile
from labctl.inventory.schema import Inventory, NicPort
from labctl.models.fabric import SimFabric
from labctl.models.switch import SwitchModel
from labctl.ocs.protocol import OCS_VOA, TimeoutPolicy, VariableAttenuator
from labctl.testing.harnesses import tiny_inventory

pytest.importorskip("asyncssh", reason="the NETCONF emulator needs the [netconf] extra")
pytest.importorskip("ncclient", reason="the NETCONF driver needs the [netconf] extra")

from labctl.ocs.drivers.polatis_netconf.connection import Endpoint, HostKeyPolicy
from labctl.ocs.drivers.polatis_netconf.switch import NetconfRpcError, PolatisNetconfSwitch

PASSWORD = "emulator-password"


def _threads() -> set[str]:
    return {f"{t.name}:{t.ident}" for t in threading.enumerate() if not t.name.startswith("asyncio_")}


# -- TL1: what a legacy script reads -----------------------------------------------------------------------
async def _tl1_exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, command: str) -> str:
    """A legacy script's loop: send the command with CRLF, read until a line that is only `;`."""
    writer.write(command.encode() + b"\r\n")
    await writer.drain()
    return (await asyncio.wait_for(reader.readuntil(b"\r\n;"), 5)).decode()


@pytest.fixture
async def tl1() -> AsyncIterator[tuple[Tl1Emulator, SwitchModel]]:
    model = SwitchModel("ocs1", PortSpace(4, 4), resolve_profile("fast"), random.Random(5))
    emulator = Tl1Emulator(model, users={"admin": PASSWORD})
    await emulator.start()
    try:
        yield emulator, model
    finally:
        await emulator.close()
        model.cancel_pending()


async def test_a_legacy_script_splitting_rtrv_netype_on_whitespace_reads_all_four_fields(
    tl1: tuple[Tl1Emulator, SwitchModel],
) -> None:
    emulator, _ = tl1
    reader, writer = await asyncio.open_connection(*emulator.address)
    try:
        assert "COMPLD" in await _tl1_exchange(reader, writer, f"ACT-USER::admin:1::{PASSWORD};")
        reply = await _tl1_exchange(reader, writer, "RTRV-NETYPE:::2:;")
        # as a legacy parser does it: every whitespace-separated token, the quoted one split on commas
        tokens = reply.split()
        quoted = [t for t in tokens if t.startswith('"') and t.endswith('"')]
        assert len(quoted) == 1, reply
        vendor, model, kind, version = quoted[0].strip('"').split(",")
        assert (vendor, kind) == ("POLATIS", "OCS")
        assert "4x4" in model and version
        assert all(field and not any(c.isspace() for c in field) for field in (vendor, model, kind, version))
    finally:
        writer.close()
        await writer.wait_closed()


async def test_tl1_attenuator_and_power_monitor_commands_of_public_scripts(
    tl1: tuple[Tl1Emulator, SwitchModel],
) -> None:
    """polatis_tl1.sh's SET-PORT-ATTEN and RTRV-PORT-ATTEN, a public library's `level=(5.0)` form, tcdona3's
    SET-PORT-PMON wave= and RTRV-PORT-PMON, as a transcript."""
    emulator, model = tl1
    model.transmitting[1] = 0.0
    await model.execute(MappingDiff(remove=frozenset(), add=frozenset({(1, 5)})))
    reader, writer = await asyncio.open_connection(*emulator.address)
    try:
        await _tl1_exchange(reader, writer, f"act-user::admin:1::{PASSWORD};")
        transcript = [
            ("set-port-atten::5:2:::mode=rel,level=(5.0);", "M  2 COMPLD", None),
            ("RTRV-PORT-ATTEN::5:3:;", "M  3 COMPLD", '"5:RELATIVE,5.00,0"'),
            ("RTRV-PORT-POWER::5:4:;", "M  4 COMPLD", '"5:-6.50"'),  # 0 dBm - 1.5 dB loss - 5 dB
            ("SET-PORT-ATTEN::5:5:::MODE=NONE;", "M  5 COMPLD", None),
            ("RTRV-PORT-ATTEN::5:6:;", "M  6 COMPLD", '"5:NONE,,"'),
            ("SET-PORT-ATTEN::1:7:::MODE=ABSOLUTE,LEVEL=-3;", "M  7 DENY", "IIAC"),  # an ingress port
            ("SET-PORT-PMON::1&&2:8:::wave=1310;", "M  8 COMPLD", None),
            ("RTRV-PORT-PMON::1&2:9:;", "M  9 COMPLD", '"2:1310.00,0.00,4"'),
            ("SET-PORT-PMON::1:10:::wave=900;", "M  10 DENY", "IPNV"),
        ]
        for command, status, line in transcript:
            reply = await _tl1_exchange(reader, writer, command)
            assert status in reply, (command, reply)
            if line is not None:
                assert line in reply, (command, reply)
        assert model.opm_config(1).wavelength_nm == 1310.0
    finally:
        writer.close()
        await writer.wait_closed()


async def test_the_tl1_driver_attenuates_through_the_commands_public_scripts_send(
    tl1: tuple[Tl1Emulator, SwitchModel],
) -> None:
    """The TL1 driver is a VariableAttenuator too: SET-PORT-ATTEN MODE=RELATIVE (0 dB: MODE=NONE), read
    back with RTRV-PORT-ATTEN; the switch's own power reading drops by the attenuation; an ocs.voa event per
    setting; an ingress port is refused before anything is sent."""
    from labctl.ocs.drivers.polatis_tl1.switch import PolatisTl1Switch, Tl1Endpoint

    emulator, model = tl1
    model.transmitting[1] = 0.0
    await model.execute(MappingDiff(remove=frozenset(), add=frozenset({(1, 5)})))
    events: list[Event] = []
    switch = PolatisTl1Switch(
        "ocs1",
        PortSpace(4, 4),
        endpoint=Tl1Endpoint(*emulator.address),
        user="admin",
        password=Secret("TEST_PW", PASSWORD),
        emit=events.append,
        timeouts=TimeoutPolicy(connect_s=5.0, operation_s=5.0),
    )
    await switch.connect()
    try:
        assert isinstance(switch, VariableAttenuator)
        before = (await switch.port_power([5])).value[5]
        await switch.set_attenuation([5], 5.0)
        assert (await switch.read_attenuation([5])).value == {5: 5.0}
        after = (await switch.port_power([5])).value[5]
        assert before is not None and after is not None and after == pytest.approx(before - 5.0, abs=0.02)
        await switch.set_attenuation([5], 0.0)
        assert (await switch.read_attenuation([5])).value == {5: 0.0}
        assert [e.value for e in events if e.kind == OCS_VOA] == [5.0, 0.0]
        with pytest.raises(InputError, match="ingress"):
            await switch.set_attenuation([1], 3.0)
    finally:
        await switch.close()


# -- NETCONF: VOA, OPM wavelength, notifications -------------------------------------------------------------
@dataclass
class Lab:
    inventory: Inventory
    model: SwitchModel
    fabric: SimFabric
    emulator: NetconfEmulator
    switch: PolatisNetconfSwitch
    events: list[Event]
    a: NicPort
    b: NicPort


@pytest.fixture
async def lab(tmp_path: Path) -> AsyncIterator[Lab]:
    """The tiny simulated lab (two NIC ports on a 4x4 switch) with its switch behind the NETCONF emulator,
    driven by the polatis-netconf driver over real SSH; the NIC ports' Rx power comes from SimFabric, as
    every probe of a simulated or kernel lab reads it."""
    threads = _threads()
    inv = tiny_inventory(tmp_path)
    profile = inv.profile()
    rng = random.Random(7)
    models = SwitchModel.many({name: spec.space for name, spec in inv.switches.items()}, profile, rng)
    model = models["ocs1"]
    fabric = SimFabric(inv, models, profile, rng)
    emulator = NetconfEmulator(model, users={"admin": PASSWORD})
    await emulator.start()
    events: list[Event] = []
    switch = PolatisNetconfSwitch(
        "ocs1",
        model.space,
        endpoint=Endpoint(*emulator.address),
        user="admin",
        password=Secret("TEST", PASSWORD),
        host_keys=HostKeyPolicy(sha256=emulator.host_key_sha256),
        emit=events.append,
        timeouts=TimeoutPolicy(connect_s=10, operation_s=10),
    )
    a, b = inv.ports
    try:
        await switch.connect()
        yield Lab(inv, model, fabric, emulator, switch, events, a, b)
    finally:
        await switch.close()
        await emulator.close()
        fabric.cancel_pending()
        model.cancel_pending()
    assert _threads() <= threads, "a thread outlived the session"


async def _lit(lab: Lab) -> None:
    """Patch a and b to each other and wait until the light has settled."""
    await lab.switch.apply({(lab.a.tx, lab.b.rx), (lab.b.tx, lab.a.rx)})
    settle_ms = lab.fabric.profile.optical_settle_ms[1]
    await asyncio.sleep(settle_ms / 1000 + 0.05)


def _rx_dbm(lab: Lab, port: NicPort) -> float:
    dbm = lab.fabric.rx_power_dbm(port, now_ns())
    assert dbm is not None
    return dbm


async def test_voa_set_over_netconf_lowers_the_rx_power_the_probe_reads(lab: Lab) -> None:
    await _lit(lab)
    before = _rx_dbm(lab, lab.b)
    assert isinstance(lab.switch, VariableAttenuator)
    result = await lab.switch.set_attenuation([lab.b.rx], 5.0)
    assert result.end_ns >= result.start_ns
    voa = await lab.switch.read_voa([lab.b.rx])
    assert voa.value[lab.b.rx].mode == "VOA_MODE_RELATIVE" and voa.value[lab.b.rx].level == 5.0
    assert (await lab.switch.read_attenuation([lab.b.rx])).value == {lab.b.rx: 5.0}
    after = _rx_dbm(lab, lab.b)
    # the model's resolution: its noise (peak to peak) and the DOM word's 0.1 µW
    resolution = lab.fabric.profile.rx_noise_db + 0.01
    assert after == pytest.approx(before - 5.0, abs=resolution)
    assert _rx_dbm(lab, lab.a) == pytest.approx(before, abs=1.0)  # the other direction is untouched
    # the switch's own monitor on that egress reads the attenuated light too
    power = (await lab.switch.port_power([lab.b.rx])).value[lab.b.rx]
    assert power == pytest.approx(lab.model.transmitting[lab.a.tx] - 1.5 - 5.0, abs=0.01)
    voa_events = [e for e in lab.events if e.kind == OCS_VOA]
    assert [(e.meta["port"], e.value) for e in voa_events] == [(lab.b.rx, 5.0)]
    # cleared: the light comes back to its level
    await lab.switch.set_attenuation([lab.b.rx], 0.0)
    assert (await lab.switch.read_voa([lab.b.rx])).value[lab.b.rx].mode == "VOA_MODE_NONE"
    assert _rx_dbm(lab, lab.b) == pytest.approx(before, abs=resolution)


async def test_voa_follows_the_light_through_a_repatch_and_refuses_ingress_ports(lab: Lab) -> None:
    await lab.switch.set_attenuation([lab.b.rx], 3.0)  # set while dark: applies when light comes
    await _lit(lab)
    level = lab.fabric.state(lab.b).rx_level_dbm
    assert _rx_dbm(lab, lab.b) == pytest.approx(level - 3.0, abs=lab.fabric.profile.rx_noise_db + 0.01)
    with pytest.raises(InputError, match="ingress"):
        await lab.switch.set_attenuation([lab.a.tx], 3.0)
    # a public client's edit-config: no operation attribute, ABSOLUTE to a target output power in dBm
    await lab.switch.set_voa([lab.b.rx], "VOA_MODE_ABSOLUTE", -20.0)
    power = (await lab.switch.port_power([lab.b.rx])).value[lab.b.rx]
    assert power == pytest.approx(-20.0, abs=0.01)
    # the emulator checks what the YANG says: a mode it does not have is invalid-value
    with pytest.raises(NetconfRpcError, match="invalid-value"):
        await lab.switch._rpc(
            "edit-config voa",
            "<edit-config><target><running/></target><config>"
            '<voa xmlns="http://www.polatis.com/yang/optical-switch"><port><port-id>6</port-id>'
            "<atten-mode>VOA_MODE_LOUD</atten-mode></port></voa></config></edit-config>",
            idempotent=True,
        )


async def test_opm_wavelength_set_and_read_round_trip(lab: Lab) -> None:
    before = (await lab.switch.read_opm_config([1, 5])).value
    assert before[5].wavelength_nm == 1550.0 and before[5].averaging_time == 4
    await lab.switch.set_opm_wavelength([1, 5], 1310.0)
    after = (await lab.switch.read_opm_config([1, 5, 6])).value
    assert (after[1].wavelength_nm, after[5].wavelength_nm, after[6].wavelength_nm) == (
        1310.0,
        1310.0,
        1550.0,
    )
    assert lab.model.opm_config(5).wavelength_nm == 1310.0
    with pytest.raises(InputError, match=r"1260\.\.1640"):
        await lab.switch.set_opm_wavelength([5], 900.0)
    # an offset is added to what the monitor reports (the YANG), not to the light
    await lab.switch.set_opm_config([lab.b.rx], offset_db=2.0)
    await _lit(lab)
    light = lab.model.power_dbm(lab.b.rx)
    assert light is not None
    power = (await lab.switch.port_power([lab.b.rx])).value[lab.b.rx]
    assert power == pytest.approx(light + 2.0, abs=0.01)


async def test_a_subscription_delivers_a_notification_for_a_cross_connect_change(lab: Lab) -> None:
    await lab.switch.subscribe()
    notes = lab.switch.notifications()
    try:
        await lab.switch.apply({(1, 5)})
        note = await asyncio.wait_for(anext(notes), 5)
        assert note.name == "activity-log-notification"
        assert note.namespace == "http://www.polatis.com/yang/polatis-switch"
        assert "add 1>5" in note.fields["notification-activity"]
        assert note.fields["notification-username"] == "admin" and note.event_time.endswith("Z")
        # a port change (port-set-state) is reported too
        await lab.switch.disable_ports([2])
        note = await asyncio.wait_for(anext(notes), 5)
        assert note.fields["notification-activity"] == "port-set-state: disable 2"
    finally:
        await notes.aclose()
    reports = [e for e in lab.events if e.kind == Kind.OCS_REPORT]
    assert [e.value for e in reports] == ["activity-log-notification"] * 2
    assert "add 1>5" in reports[0].meta["fields"]["notification-activity"]


async def test_a_second_session_without_a_subscription_gets_no_notification(lab: Lab) -> None:
    await lab.switch.subscribe()
    assert lab.emulator.notify(ET.Element("{http://www.polatis.com/yang/polatis-switch}system-error")) == 1
    with pytest.raises(InputError, match="already subscribed"):
        await lab.switch.subscribe()


async def test_the_subscription_is_renewed_on_a_replacement_session(lab: Lab) -> None:
    await lab.switch.subscribe()
    for conn in list(lab.emulator._connections):  # the switch hangs up
        conn.abort()
    await asyncio.sleep(0.1)
    await lab.switch.get_mapping()  # the next request replaces the session, subscribed again
    notes = lab.switch.notifications()
    try:
        await lab.switch.apply({(2, 6)})
        note = await asyncio.wait_for(anext(notes), 5)
        assert "add 2>6" in note.fields["notification-activity"]
    finally:
        await notes.aclose()
    assert any(
        e.kind == Kind.OCS_SESSION and e.value == "subscribed" and e.meta.get("after") for e in lab.events
    )
