"""The Polatis SCPI driver (pyvisa, pyvisa-py, a TCPIP SOCKET resource) against the SCPI emulator over real
sockets on 127.0.0.1: every command, a 16-pair remap, the size check, switch errors as one line, every
injected fault ending in a verified state or a typed error, the emulator's grammar, a missing extra, and
no thread, task or listening port left behind."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from labctl.core.errors import HardwareError, InputError
from labctl.core.events import Event, Kind
from labctl.emulators.core import FaultPlan
from labctl.emulators.scpi import ScpiEmulator
from labctl.inventory.mapping import MappingDiff, PortSpace
from labctl.inventory.profiles import Profile
from labctl.models.switch import INSERTION_LOSS_DB
from labctl.ocs.drivers.polatis_scpi.connection import ScpiConnectionLost
from labctl.ocs.drivers.polatis_scpi.switch import PolatisScpiSwitch, ScpiCommandError, ScpiEndpoint
from labctl.ocs.protocol import OpticalSwitch, TimeoutPolicy
from tests.helpers import scpi_driver as helpers
from tests.helpers.scpi_driver import FAST, SPACE, model_of

_no_leaked_threads = helpers._no_leaked_threads  # autouse: no SCPI worker thread outlives a test

STRAIGHT = {(i, 32 + i) for i in range(1, 17)}  # 16 pairs


ROTATED = {(i, 32 + i % 16 + 1) for i in range(1, 17)}  # the same 16 ingress ports, every egress moved


@pytest.fixture
async def emulator() -> AsyncIterator[ScpiEmulator]:
    emu = ScpiEmulator(model_of())
    await emu.start()
    try:
        yield emu
    finally:
        await emu.close()
        emu.model.cancel_pending()


def driver(
    emu: ScpiEmulator, events: list[Event], *, space: PortSpace = SPACE, operation_s: float = 5.0
) -> PolatisScpiSwitch:
    return PolatisScpiSwitch(
        "ocs1",
        space,
        endpoint=ScpiEndpoint(*emu.address),
        emit=events.append,
        timeouts=TimeoutPolicy(connect_s=5.0, operation_s=operation_s),
    )


Switch = tuple[PolatisScpiSwitch, list[Event]]


@pytest.fixture
async def switch(emulator: ScpiEmulator) -> AsyncIterator[Switch]:
    events: list[Event] = []
    sw = driver(emulator, events)
    await sw.connect()
    try:
        yield sw, events
    finally:
        await sw.close()


def wire(events: list[Event]) -> list[str]:
    return [e.meta["command"] for e in events if e.kind == Kind.OCS_IO]


def session_values(events: list[Event]) -> list[object]:
    return [e.value for e in events if e.kind == Kind.OCS_SESSION]


# -- the OpticalSwitch over SCPI ------------------------------------------------------------------------------
async def test_every_command(switch: Switch, emulator: ScpiEmulator) -> None:
    sw, events = switch
    assert isinstance(sw, OpticalSwitch)
    assert sw.identity is not None and sw.identity.space == SPACE and sw.identity.manufacturer == "Polatis"
    assert (await sw.identify()).value.model == "N-OST-32x32-LA1-DMHNS"
    emulator.model.transmitting.update({1: -1.0, 2: -2.0})
    assert (await sw.get_mapping()).value == frozenset()
    applied = await sw.apply([(1, 33), (2, 34), (3, 35)])
    assert applied.value.mapping == {(1, 33), (2, 34), (3, 35)} == emulator.model.patches
    # *OPC? answered once the mirrors had settled: the light is through when apply returns
    assert emulator.model.lit == {33: 1, 34: 2, 35: 3}
    power = await sw.port_power([1, 33, 34, 40])
    assert power.value == {1: -1.0, 33: -1.0 - INSERTION_LOSS_DB, 34: -2.0 - INSERTION_LOSS_DB, 40: None}
    rx = {e.source: e.value for e in events if e.kind == Kind.RX_POWER}
    assert rx["ocs:ocs1/33"] == pytest.approx(-2.5) and rx["ocs:ocs1/40"] is None
    gone = await sw.disconnect([35])
    assert gone.value.removed == {(3, 35)} and emulator.model.patches == {(1, 33), (2, 34)}
    with pytest.raises(InputError):
        await sw.port_power([99])
    io = [e for e in events if e.kind == Kind.OCS_IO]
    assert all(e.meta["status"] == "ok" and isinstance(e.value, int) and e.value > 0 for e in io)
    assert {e.meta["reply"] for e in io if e.meta["command"] == "SYST:ERR?"} == {'0,"No error"'}
    assert session_values(events)[0] == "connected" and sw.reconnects == 0


async def test_full_16_pair_remap(switch: Switch, emulator: ScpiEmulator) -> None:
    sw, events = switch
    await sw.apply(STRAIGHT)
    events.clear()
    result = await sw.apply(ROTATED, context={"rail": 0})
    assert result.value.mapping == ROTATED == emulator.model.patches
    assert result.value.removed == STRAIGHT and result.value.added == ROTATED and result.value.attempts == 1
    ins = ",".join(str(i) for i in range(1, 17))
    # no read first (the first apply's verified read-back is the diff's base, decision 0050): the minimal
    # diff (SUB of what goes, ADD of what comes, each checked), settle, read back
    assert wire(events) == [
        f"OXC:SWIT:CONN:SUB (@{ins}),(@{','.join(str(32 + i) for i in range(1, 17))})",
        "SYST:ERR?",
        f"OXC:SWIT:CONN:ADD (@{ins}),(@{','.join(str(32 + i % 16 + 1) for i in range(1, 17))})",
        "SYST:ERR?",
        "*OPC?",
        "OXC:SWIT:CONN:STAT?",
    ]
    changes = [e for e in events if e.kind in (Kind.OCS_COMMAND, Kind.OCS_COMPLETE)]
    assert [e.kind for e in changes] == [Kind.OCS_COMMAND, Kind.OCS_COMPLETE]
    assert all(e.meta.get("rail") == 0 and e.meta["driver"] == "polatis-scpi" for e in changes)


async def test_concurrent_calls_do_not_interleave_on_the_wire(switch: Switch, emulator: ScpiEmulator) -> None:
    sw, _ = switch
    await sw.apply(STRAIGHT)
    emulator.model.transmitting.update({p: -1.0 for p in SPACE.ingress})
    applied, power, read = await asyncio.gather(
        sw.apply(ROTATED), sw.port_power(range(1, 65)), sw.get_mapping()
    )
    assert applied.value.mapping == ROTATED
    # The read may land between the apply's SUB and ADD: the switch then holds neither mapping, but each
    # reply still answers its own command (a misread reply would be a power list or a garbled mapping).
    assert len(power.value) == 64 and read.value in (STRAIGHT, frozenset(), ROTATED)
    assert sw.reconnects == 0


async def test_power_of_many_ports_is_asked_in_chunks() -> None:
    space = PortSpace(200, 200)
    emu = ScpiEmulator(model_of(space))
    await emu.start()
    events: list[Event] = []
    sw = driver(emu, events, space=space)
    try:
        await sw.connect()
        emu.model.transmitting.update({1: -1.0, 300: -5.0})  # 300 is an egress port: it reads its output
        power = await sw.port_power(range(1, 401))
    finally:
        await sw.close()
        await emu.close()
    assert [c.split(" ")[0] for c in wire(events) if "PMON" in c] == [":PMON:POW?", ":PMON:POW?"]
    assert len(power.value) == 400 and power.value[1] == -1.0
    assert [p for p, dbm in power.value.items() if dbm is not None] == [1]


# -- the size check -------------------------------------------------------------------------------------------
async def test_a_switch_of_another_size_is_refused_in_one_line() -> None:
    emu = ScpiEmulator(model_of(PortSpace(16, 16)))
    await emu.start()
    try:
        sw = driver(emu, [])
        with pytest.raises(InputError) as info:
            await sw.connect()
        assert str(info.value) == (
            "switch ocs1: the inventory says 32x32 but the switch reports 16x16 (N-OST-16x16-LA1-DMHNS)"
        )
        with pytest.raises(HardwareError, match="not connected"):
            await sw.get_mapping()
        await sw.close()
        assert emu.model.commands == 0

        emu.identity = "Polatis,Series-7000,1,2"  # a product code without <in>x<out>
        with pytest.raises(HardwareError, match=r"has no -<in>x<out>- size") as no_size:
            await sw.connect()
        assert "\n" not in str(no_size.value)
    finally:
        await emu.close()


async def test_an_unreachable_switch_is_one_line_within_the_connect_deadline() -> None:
    sw = PolatisScpiSwitch(
        "ocs1", SPACE, endpoint=ScpiEndpoint("127.0.0.1", 1), emit=lambda e: None, timeouts=TimeoutPolicy(2.0)
    )
    with pytest.raises(HardwareError, match=r"^switch ocs1 at 127\.0\.0\.1:1: connection refused"):
        await sw.connect()


# -- errors from the switch -----------------------------------------------------------------------------------
async def test_the_error_queue_is_read_after_each_change_and_reported_in_one_line(
    switch: Switch, emulator: ScpiEmulator
) -> None:
    sw, _ = switch
    await sw.apply([(1, 33)])
    cases = [
        ("OXC:SWIT:CONN:ADD (@2),(@33)", (-221,), "-221 Settings conflict;port 33 is already connected"),
        ("OXC:SWIT:CONN:ADD (@1),(@99)", (-222,), "-222 Data out of range;port 99 is not 1..64"),
        ("OXC:SWIT:CONN:ADD (@1),(@2)", (-224,), "-224 Illegal parameter value;1,2: light goes from ingress"),
        ("OXC:SWIT:CONN:SUB (@5),(@40)", (-221,), "-221 Settings conflict;5,40 is not connected"),
        ("OXC:SWIT:CONN:FROB (@5),(@40)", (-113,), "-113 Undefined header"),
        # two units on one line, the second continuing the first's path: both errors are drained
        ("OXC:SWIT:CONN:ADD (@1),(@99);ADD (@3)", (-222, -109), "-109 Missing parameter"),
    ]
    for command, codes, text in cases:
        with pytest.raises(ScpiCommandError) as info:
            await sw._change(command)
        assert info.value.codes == codes, command
        assert str(info.value).startswith(f"ocs1: {command} failed: ") and text in str(info.value)
        assert "\n" not in str(info.value)
    assert emulator.model.patches == {(1, 33)}
    assert all(emulator.errors(s) == [] for s in emulator._sessions)  # each check drained its queue


async def test_a_refused_change_is_retried_and_reported(switch: Switch, emulator: ScpiEmulator) -> None:
    sw, events = switch
    emulator.model.refusals = 1  # the switch model says no once
    result = await sw.apply([(1, 33)])
    assert result.value.attempts == 2 and emulator.model.patches == {(1, 33)}
    errors = [str(e.value) for e in events if e.kind == Kind.OCS_ERROR]
    assert len(errors) == 1 and "-200 Execution error;ocs1: change refused" in errors[0]

    emulator.set_faults(FaultPlan(deny_probability=1.0))  # the fault plan refuses every change
    events.clear()
    with pytest.raises(ScpiCommandError, match=r"-200 Execution error;injected fault") as info:
        await sw.apply(STRAIGHT)
    assert info.value.command.startswith("OXC:SWIT:CONN:SUB") or info.value.command.startswith(
        "OXC:SWIT:CONN:ADD"
    )
    assert len([e for e in events if e.kind == Kind.OCS_COMMAND]) == sw.attempts
    assert emulator.model.patches == {(1, 33)}


# -- faults ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "faults",
    [
        pytest.param(FaultPlan(drop_after_commands=2), id="drop-mid-command-sub"),
        pytest.param(FaultPlan(drop_after_commands=4), id="drop-mid-command-add"),
        pytest.param(FaultPlan(drop_after_commands=6), id="drop-at-opc"),
        pytest.param(FaultPlan(drop_mid_reply_after_commands=3), id="drop-mid-reply"),
        pytest.param(FaultPlan(drop_mid_reply_after_commands=4), id="drop-after-add-took-effect"),
        pytest.param(FaultPlan(garbage_every=5, garbage_position="inside", seed=2), id="garbage-inside"),
        pytest.param(FaultPlan(garbage_every=5, garbage_position="between", seed=2), id="garbage-between"),
        pytest.param(FaultPlan(lose_state_after_commands=5), id="state-lost-mid-apply"),
        pytest.param(FaultPlan(deny_probability=0.5, seed=1), id="random-refusal"),
        pytest.param(FaultPlan(delay_ms=40), id="delay-within-deadline"),
    ],
)
async def test_fault_ends_in_verified_state(
    switch: Switch, emulator: ScpiEmulator, faults: FaultPlan
) -> None:
    sw, events = switch
    await sw.apply(STRAIGHT)
    emulator.set_faults(faults)
    result = await sw.apply(ROTATED)
    assert result.value.mapping == ROTATED
    emulator.set_faults(FaultPlan())
    assert (await sw.get_mapping()).value == ROTATED == emulator.model.patches
    if faults.drop_after_commands or faults.drop_mid_reply_after_commands or faults.garbage_every:
        assert sw.reconnects >= 1
        assert "lost" in session_values(events) and "reconnected" in session_values(events)
        assert any(e.kind == Kind.OCS_READ and e.meta.get("after") == "reconnect" for e in events)
        assert any(e.kind == Kind.OCS_IO and e.meta["status"] == "lost" for e in events)
    if faults.lose_state_after_commands or faults.deny_probability:
        assert result.value.attempts >= 2  # the read-back found what was missing; the retry repaired it
    if faults.deny_probability:
        assert any(e.kind == Kind.OCS_ERROR and "-200 Execution error" in str(e.value) for e in events)
    if faults.delay_ms:
        assert sw.reconnects == 0 and result.value.attempts == 1


async def test_a_reply_slower_than_the_deadline_is_a_typed_timeout_and_the_driver_recovers(
    emulator: ScpiEmulator,
) -> None:
    events: list[Event] = []
    sw = driver(emulator, events, operation_s=0.3)
    await sw.connect()
    try:
        emulator.set_faults(FaultPlan(delay_ms=1500))
        with pytest.raises(HardwareError, match=r"^ocs1: apply did not finish within 0\.3 s$"):
            await sw.apply([(1, 33)])
        assert any(e.kind == Kind.OCS_IO and e.meta["status"] == "abandoned" for e in events)
        emulator.set_faults(FaultPlan())
        # The abandoned session is not reused (its late reply would answer the next query): a new one.
        assert (await sw.get_mapping()).value == emulator.model.patches
        assert sw.reconnects == 1
    finally:
        await sw.close()


async def test_a_slow_switch_is_cut_off_at_the_deadline_while_opc_waits(emulator: ScpiEmulator) -> None:
    emulator.model.profile = Profile(**{**FAST.model_dump(), "switching_ms": (8000.0, 8000.0)})
    events: list[Event] = []
    sw = driver(emulator, events, operation_s=1.0)
    await sw.connect()
    try:
        with pytest.raises(HardwareError, match=r"apply did not finish within 1 s"):
            await sw.apply([(1, 33)])
        abandoned = [
            e.meta["command"] for e in events if e.kind == Kind.OCS_IO and e.meta["status"] == "abandoned"
        ]
        assert abandoned == ["*OPC?"]  # the change and its error check were answered at once
        assert (await sw.get_mapping()).value == {(1, 33)}
    finally:
        await sw.close()
        emulator.model.cancel_pending()


async def test_state_loss_is_found_by_read_back_and_repaired(switch: Switch, emulator: ScpiEmulator) -> None:
    sw, _ = switch
    await sw.apply(STRAIGHT)
    emulator.lose_state()  # as after a reboot
    assert (await sw.get_mapping()).value == frozenset()
    repaired = await sw.apply(STRAIGHT)
    assert repaired.value.added == STRAIGHT and emulator.model.patches == STRAIGHT


async def test_a_session_the_switch_closed_while_idle_is_reopened_before_the_next_command(
    emulator: ScpiEmulator,
) -> None:
    emulator.session_timeout_s = 0.3
    events: list[Event] = []
    sw = driver(emulator, events)
    await sw.connect()
    try:
        await asyncio.sleep(1.0)  # the emulator hangs up the idle session
        result = await sw.apply([(1, 33)])  # found closed before the change went out: sent on a new one
        assert result.value.attempts == 1 and not [e for e in events if e.kind == Kind.OCS_ERROR]
        await asyncio.sleep(1.0)
        assert (await sw.get_mapping()).value == {(1, 33)}
    finally:
        await sw.close()
    assert sw.reconnects == 2 and emulator.sessions_opened == 3


async def test_a_lost_change_is_reported_in_one_line_when_it_cannot_be_retried(
    switch: Switch, emulator: ScpiEmulator
) -> None:
    sw, _ = switch
    emulator.set_faults(FaultPlan(drop_after_commands=1))
    with pytest.raises(ScpiConnectionLost) as info:
        await sw._change("OXC:SWIT:CONN:ADD (@1),(@33)")
    assert str(info.value).startswith("ocs1: session lost during OXC:SWIT:CONN:ADD (@1),(@33) (")
    assert str(info.value).endswith("; reconnected and re-read the switch; it now holds 0 connections")
    assert "\n" not in str(info.value)


# -- the emulator's grammar, over a raw socket ----------------------------------------------------------------
class Raw:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    async def ask(self, line: str) -> str:
        self.writer.write(line.encode() + b"\n")
        return (await asyncio.wait_for(self.reader.readline(), 5)).decode().rstrip("\n")

    def tell(self, line: str) -> None:
        self.writer.write(line.encode() + b"\r\n")


@pytest.fixture
async def raw(emulator: ScpiEmulator) -> AsyncIterator[Raw]:
    reader, writer = await asyncio.open_connection(*emulator.address)
    try:
        yield Raw(reader, writer)
    finally:
        writer.close()
        await writer.wait_closed()


async def test_emulator_grammar(raw: Raw, emulator: ScpiEmulator) -> None:
    assert (await raw.ask("*idn?")).startswith("Polatis,N-OST-32x32-LA1-DMHNS,")
    # long and short forms in any case; after `;` the path continues; replies of one line joined by `;`
    assert await raw.ask("oxc:switch:connect:add (@1,2),(@33,34);STATe?") == "(@1,2),(@33,34)"
    assert await raw.ask(":OXC:SWIT:CONN:PORT? 33;PORT? (@2);PORT? 5;*OPC?") == "1;34;;1"
    raw.tell("OXC:SWITC:CONN:STAT?")  # neither the short nor the long form: no reply, an error
    raw.tell("OXC:SWIT:CONN:ADD (@3),(@33)")
    raw.tell("oxc:swit:conn:add (@3),(@4)")
    raw.tell("OXC:SWIT:CONN:ADD (@3)")
    raw.tell("*IDN? now")
    assert await raw.ask("SYST:ERR:COUN?") == "5"
    assert await raw.ask("SYST:ERR?") == '-113,"Undefined header;OXC:SWITC:CONN:STAT?"'
    assert await raw.ask("syst:err:next?") == '-221,"Settings conflict;port 33 is already connected"'
    assert (await raw.ask("SYSTEM:ERROR?")).startswith('-224,"Illegal parameter value;3,4: light goes')
    assert await raw.ask("SYST:ERR?") == '-109,"Missing parameter;expected (@ingress...),(@egress...)"'
    # after `SYST:ERR?` the path is SYST: `ERR?` continues it, `SYST:ERR?` would mean SYST:SYST:ERR?
    assert await raw.ask("SYST:ERR?;ERR?") == '-108,"Parameter not allowed;now";0,"No error"'
    emulator.model.transmitting.update({1: -1.0})
    await asyncio.sleep(0.05)  # the light arrives after the modeled switching time
    assert await raw.ask("PMON:POW? (@1,33,34,40)") == "(-1.00,-2.50,-99.99,-99.99)"
    assert len((await raw.ask(":pmon:power?"))[1:-1].split(",")) == 64  # every port
    assert await raw.ask("*RST;*OPC?") == "1"  # *RST leaves the connections alone
    assert await raw.ask("OXC:SWIT:CONN:ONLY (@5),(@40);STAT?") == "(@5),(@40)"
    assert await raw.ask("OXC:SWIT:DISC:ALL;:OXC:SWIT:CONN:STAT?") == "(@),(@)"


async def test_the_error_queue_overflows_and_clears(raw: Raw) -> None:
    for _ in range(20):
        raw.tell("FROB")
    assert await raw.ask("SYST:ERR:COUN?") == "16"
    for _ in range(15):
        assert (await raw.ask("SYST:ERR?")).startswith("-113,")
    assert await raw.ask("SYST:ERR?") == '-350,"Queue overflow"'
    raw.tell("FROB")
    raw.tell("*CLS")
    assert await raw.ask("SYST:ERR?") == '0,"No error"'


async def test_each_session_has_its_own_error_queue(raw: Raw, emulator: ScpiEmulator) -> None:
    reader, writer = await asyncio.open_connection(*emulator.address)
    other = Raw(reader, writer)
    try:
        raw.tell("FROB")
        assert await raw.ask("*OPC?") == "1"
        assert await other.ask("SYST:ERR?") == '0,"No error"'
        assert (await raw.ask("SYST:ERR?")).startswith("-113,")
    finally:
        writer.close()
        await writer.wait_closed()


async def test_changes_overlap_and_opc_answers_once_the_mirrors_have_settled() -> None:
    emu = ScpiEmulator(model_of(switching_ms=1500.0))
    await emu.start()
    reader, writer = await asyncio.open_connection(*emu.address)
    raw = Raw(reader, writer)
    try:
        raw.tell("OXC:SWIT:CONN:ADD (@1),(@33)")
        assert await raw.ask("SYST:ERR?") == '0,"No error"'  # answered while the mirror still moves
        assert emu.model.patches == {(1, 33)} and 33 not in emu.model.lit
        assert await raw.ask("*OPC?") == "1"
        assert emu.model.lit == {33: 1}  # *OPC? came once the light was through
    finally:
        writer.close()
        await writer.wait_closed()
        await emu.close()
        emu.model.cancel_pending()


async def test_closing_the_emulator_mid_change_leaves_nothing_running() -> None:
    emu = ScpiEmulator(model_of(switching_ms=5000.0))
    await emu.start()
    reader, writer = await asyncio.open_connection(*emu.address)
    try:
        writer.write(b"OXC:SWIT:CONN:ADD (@1),(@33);*OPC?\n")
        await writer.drain()
        await asyncio.sleep(0.05)
        await emu.close()  # the change is still moving and *OPC? still waits
        assert await asyncio.wait_for(reader.read(), 5) == b""
    finally:
        writer.close()
        emu.model.cancel_pending()
    assert emu.model.patches == {(1, 33)}


async def test_a_switch_model_patched_elsewhere_is_read_as_it_is(
    switch: Switch, emulator: ScpiEmulator
) -> None:
    sw, _ = switch
    await emulator.model.execute(MappingDiff(remove=frozenset(), add=frozenset({(7, 40)})))
    assert (await sw.get_mapping()).value == {(7, 40)}


# -- the CLI: `labctl emulate ocs polatis-scpi` in its own process, `labctl ocs …` against it ------------------
def test_cli_emulate_and_ocs_commands(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "LABCTL_EMULATOR_PASSWORD"}  # SCPI needs none
    labctl = [sys.executable, "-m", "labctl.cli"]
    emu = subprocess.Popen(
        [*labctl, "emulate", "ocs", "polatis-scpi", "--port", "0", "--size", "4x4", "--switching-ms", "1"],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert emu.stdout is not None
        banner = emu.stdout.readline()
        m = re.search(r"listening on 127\.0\.0\.1:(\d+)", banner)
        assert m, "emulator did not start"
        assert "password" not in banner
        inventory = tmp_path / "inv.yaml"

        def write_inventory(size: str, rx: int) -> None:
            inventory.write_text(
                f"lab: cli\nswitches:\n  ocs1: {{driver: polatis-scpi, address: 127.0.0.1, port: {m[1]}, "
                f"size: {size}, timeout_s: 5}}\n"
                f"hosts:\n  a:\n    nics:\n      - {{ifname: eth0, rail: 0, switch: ocs1, tx: 1, rx: {rx}}}\n"
            )

        def run(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [*labctl, "ocs", *args, "-i", str(inventory)],
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )

        write_inventory("4x4", 5)
        connected = run("connect", "1", "5", "--json")
        assert connected.returncode == 0, connected.stderr
        assert json.loads(connected.stdout)["patches"] == [[1, 5]]
        mapping = tmp_path / "map.yaml"
        mapping.write_text("patches: [[1, 6], [2, 5]]\n")
        applied = run("apply", str(mapping))
        assert applied.returncode == 0 and "2 added" in applied.stdout and "verified" in applied.stdout
        assert json.loads(run("show", "--json").stdout)["patches"] == [[1, 6], [2, 5]]
        assert json.loads(run("disconnect", "5", "6", "--json").stdout)["patches"] == []
        write_inventory("8x8", 9)
        wrong = run("show")
        assert wrong.returncode == 2 and wrong.stderr.count("\n") == 1 and "Traceback" not in wrong.stderr
        assert "the inventory says 8x8 but the switch reports 4x4" in wrong.stderr
    finally:
        emu.terminate()
        emu.wait(10)
        if emu.stdout is not None:
            emu.stdout.close()
    assert emu.returncode == 0
