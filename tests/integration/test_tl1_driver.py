"""The Polatis TL1 driver against the TL1 emulator over real sockets on 127.0.0.1: every command, a full
16-pair remap, every injected fault ending in a verified state or a typed error, state loss repaired, and
no password anywhere."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from labctl.core.clock import Timebase
from labctl.core.errors import HardwareError, InputError, MappingError
from labctl.core.events import Event, EventLog
from labctl.emulators.core import FaultPlan
from labctl.emulators.tl1 import Tl1Emulator
from labctl.inventory.config import Secret
from labctl.inventory.mapping import MappingDiff, PortSpace
from labctl.inventory.profiles import resolve_profile
from labctl.models.switch import INSERTION_LOSS_DB, SwitchModel
from labctl.ocs.drivers.polatis_tl1.switch import PolatisTl1Switch, Tl1Deny, Tl1Endpoint, Tl1LoginRefused
from labctl.ocs.protocol import OpticalSwitch, TimeoutPolicy

SPACE = PortSpace(32, 32)


PW = "c0rrect-Horse-Battery"


USER = "admin"


STRAIGHT = {(i, 32 + i) for i in range(1, 17)}  # 16 pairs


ROTATED = {(i, 32 + i % 16 + 1) for i in range(1, 17)}  # the same 16 ingress ports, every egress moved


@pytest.fixture
async def emulator() -> AsyncIterator[Tl1Emulator]:
    model = SwitchModel("ocs1", SPACE, resolve_profile("fast"), random.Random(3))
    emu = Tl1Emulator(model, users={USER: PW})
    await emu.start()
    try:
        yield emu
    finally:
        await emu.close()
        model.cancel_pending()


def driver(
    emu: Tl1Emulator,
    events: list[Event],
    *,
    password: str = PW,
    pipeline_depth: int = 16,
    keepalive_s: float | None = None,
    operation_s: float = 5.0,
    owned: frozenset[int] | None = None,
) -> PolatisTl1Switch:
    return PolatisTl1Switch(
        "ocs1",
        SPACE,
        endpoint=Tl1Endpoint(*emu.address),
        user=USER,
        password=Secret("TEST_PW", password),
        emit=events.append,
        timeouts=TimeoutPolicy(connect_s=5.0, operation_s=operation_s),
        pipeline_depth=pipeline_depth,
        keepalive_s=keepalive_s,
        owned=owned,
    )


@pytest.fixture
async def switch(emulator: Tl1Emulator) -> AsyncIterator[tuple[PolatisTl1Switch, list[Event]]]:
    events: list[Event] = []
    sw = driver(emulator, events)
    await sw.connect()
    try:
        yield sw, events
    finally:
        await sw.close()


Switch = tuple[PolatisTl1Switch, list[Event]]


async def test_every_command(switch: Switch, emulator: Tl1Emulator) -> None:
    sw, events = switch
    assert isinstance(sw, OpticalSwitch)
    emulator.model.transmitting.update({1: -1.0, 2: -2.0})
    assert (await sw.retrieve_header()).value == "( nil )"
    assert (await sw.retrieve_size()).value == SPACE
    assert (await sw.retrieve_netype()).value[0] == "POLATIS"
    assert (await sw.get_mapping()).value == frozenset()
    entered = await sw.enter_patch(1, 33)
    assert entered.end_ns > entered.start_ns
    await sw.enter_patch(2, 34)
    await sw.enter_patch(3, 35)
    assert (await sw.retrieve_patches([1, 34])).value == {(1, 33), (2, 34)}
    await asyncio.sleep(0.01)  # light arrives after the modeled switching time
    power = await sw.port_power([1, 33, 34, 40])
    assert power.value == {1: -1.0, 33: -1.0 - INSERTION_LOSS_DB, 34: -2.0 - INSERTION_LOSS_DB, 40: None}
    rx = {e.source: e.value for e in events if e.kind == "rx_power"}
    assert rx["ocs:ocs1/33"] == pytest.approx(-2.5) and rx["ocs:ocs1/40"] is None
    await sw.close_shutters([1, 2, 3])
    await sw.open_shutters([2])
    assert (await sw.shutter_states([1, 2, 3, 4])).value == {1: "CLOSED", 2: "OPEN", 3: "CLOSED", 4: "OPEN"}
    await sw.delete_patches([1, 2])
    assert emulator.model.patches == {(3, 35)}
    await sw.delete_patches("ALL")
    assert emulator.model.patches == frozenset()
    await sw.apply([(5, 40)])
    result = await sw.disconnect([40])
    assert result.value.removed == {(5, 40)} and emulator.model.patches == frozenset()
    with pytest.raises(InputError):
        await sw.port_power([99])


@pytest.mark.parametrize("depth", [16, 1], ids=["pipelined", "one-at-a-time"])
async def test_full_16_pair_remap(emulator: Tl1Emulator, depth: int) -> None:
    events: list[Event] = []
    sw = driver(emulator, events, pipeline_depth=depth)
    await sw.connect()
    try:
        await sw.apply(STRAIGHT)
        events.clear()
        result = await sw.apply(ROTATED, context={"rail": 0})
    finally:
        await sw.close()
    assert result.value.mapping == ROTATED == emulator.model.patches
    assert result.value.removed == STRAIGHT and result.value.added == ROTATED and result.value.attempts == 1
    io = [e for e in events if e.kind == "ocs.io"]
    commands = [e.meta["command"].split(":")[0] for e in io]
    # no read first (the first apply's verified read-back is the diff's base, decision 0050): one
    # DLT-PATCH for all 16 ingress ports, 16 ENT-PATCH, read back
    assert commands == ["DLT-PATCH", *["ENT-PATCH"] * 16, "RTRV-PATCH", "CANC-USER"]
    assert io[0].meta["command"].startswith("DLT-PATCH::1&&16:")
    assert len({e.meta["ctag"] for e in io}) == len(io)
    kinds = [e.kind for e in events if e.kind in ("ocs.command", "ocs.complete")]
    assert kinds == ["ocs.command", "ocs.complete"]
    assert all(e.meta.get("rail") == 0 for e in events if e.kind in ("ocs.command", "ocs.complete"))


async def test_deny_codes_are_typed(switch: Switch, emulator: Tl1Emulator) -> None:
    sw, _ = switch
    await sw.enter_patch(1, 33)
    cases = [
        (lambda: sw.enter_patch(2, 33), "SAIS", "ENT-PATCH::2,33:"),  # egress already in use
        (lambda: sw.enter_patch(1, 33), "IEAE", "ENT-PATCH::1,33:"),  # patch exists
        (lambda: sw.enter_patch(1, 2), "IDNV", "ENT-PATCH::1,2:"),  # ingress to ingress
        (lambda: sw.delete_patches([7]), "IENE", "DLT-PATCH::7:"),  # nothing to delete
        (lambda: sw._call("ENT-PATCH", "1,99", idempotent=False), "IIAC", "ENT-PATCH::1,99:"),  # range
        (lambda: sw._call("FROB-PATCH", idempotent=True), "IICM", "FROB-PATCH:::"),  # unknown command
        (lambda: sw._call("RTRV-EQPT", "FAN", idempotent=True), "IIAC", "RTRV-EQPT::FAN:"),
    ]
    for call, code, command in cases:
        with pytest.raises(Tl1Deny) as info:
            await call()
        assert info.value.code == code, command
        assert info.value.command.startswith(command)
        assert code in str(info.value)


async def test_a_shared_switch_refuses_direct_commands_reaching_another_labs_ports(
    emulator: Tl1Emulator,
) -> None:
    """ENT-PATCH and DLT-PATCH bypass apply-with-verify, so they hold the owned-ports rule themselves: no
    foreign port named, no DLT-PATCH ALL, and no DLT-PATCH of an owned port whose patch goes to a foreign
    one (it is the other lab's patch too; `converge` refuses the same removal). Nothing reaches the switch."""
    model = emulator.model
    sw = driver(emulator, [], owned=frozenset({1, 2, 3, 4, 33, 34, 35, 36}))
    await sw.connect()
    try:
        await model.execute(
            MappingDiff(remove=frozenset(), add=frozenset({(6, 33), (2, 34)}))
        )  # 6→33 crosses
        commands = model.commands
        with pytest.raises(
            MappingError, match=r"ENT-PATCH names port\(s\) \[40\] that this lab does not own"
        ):
            await sw.enter_patch(1, 40)
        with pytest.raises(MappingError, match=r"DLT-PATCH names port\(s\) \[6\]"):
            await sw.delete_patches([6])
        with pytest.raises(InputError, match="DLT-PATCH ALL on a shared switch"):
            await sw.delete_patches("ALL")
        for ports in ([33], [2, 33]):  # the crossing patch alone, or with one of our own
            with pytest.raises(HardwareError, match=r"\(6, 33\).*another lab"):
                await sw.delete_patches(ports)
        assert model.commands == commands and model.patches == {(6, 33), (2, 34)}
        await sw.delete_patches([2])  # our own patch goes
        assert model.patches == {(6, 33)}
    finally:
        await sw.close()


async def raw_session(emulator: Tl1Emulator, *lines: bytes, replies: int | None = None) -> bytes:
    reader, writer = await asyncio.open_connection(*emulator.address)
    try:
        for line in lines:
            writer.write(line)
        await writer.drain()
        data = b""
        while data.count(b"\r\n;") < (len(lines) if replies is None else replies):
            data += await asyncio.wait_for(reader.read(4096), 5)
        return data
    finally:
        writer.close()
        await writer.wait_closed()


async def test_emulator_grammar_login_case_and_line_endings(emulator: Tl1Emulator) -> None:
    data = await raw_session(emulator, b"RTRV-PATCH:::1:;\r\n")
    assert b"M  1 DENY\r\n   PLNA" in data  # not logged in
    data = await raw_session(emulator, b"act-user::admin:2::nope;\n")
    assert b"M  2 DENY\r\n   PIUC" in data and b"nope" not in data  # bad password
    data = await raw_session(emulator, b"ACT-USER::root:3::x;")
    assert b"M  3 DENY\r\n   PIUI" in data  # unknown user
    data = await raw_session(
        emulator,
        f"act-user::{USER}:4::{PW};\n".encode(),
        b"ent-patch::1,33:5:;\n",
        b"Rtrv-Patch:::6:;\r\n",
        b"ENT-PATCH::1,33",
        b"",
        b"RTRV-PATCH:::7",  # no terminator yet: nothing happens
        replies=3,
    )
    assert b"M  4 COMPLD" in data and b"M  5 COMPLD" in data and b'M  6 COMPLD\r\n   "1,33"\r\n;' in data
    data = await raw_session(emulator, b"ENT-PATCH;", b"RTRV-PATCH:::#!:;")
    assert b"M  0 DENY\r\n   IISP" in data and b"M  0 DENY\r\n   IICT" in data


async def test_patch_changes_reach_other_sessions_as_rept(emulator: Tl1Emulator) -> None:
    a_events: list[Event] = []
    b_events: list[Event] = []
    a, b = driver(emulator, a_events), driver(emulator, b_events)
    await a.connect()
    await b.connect()
    try:
        await a.apply([(1, 33), (2, 34)])
        await b.get_mapping()  # a round trip on b: the REPT sent before it has arrived
    finally:
        await a.close()
        await b.close()
    reports = [e for e in b_events if e.kind == "ocs.report"]
    assert reports and reports[0].value == "REPT DBCHG"
    assert {line for e in reports for line in e.meta["lines"]} == {"ENT-PATCH:1,33", "ENT-PATCH:2,34"}
    assert not [e for e in a_events if e.kind == "ocs.report"]


# -- faults ---------------------------------------------------------------------------------------------------
def session_values(events: list[Event]) -> list[object]:
    return [e.value for e in events if e.kind == "ocs.session"]


@pytest.mark.parametrize(
    "faults",
    [
        pytest.param(FaultPlan(drop_after_commands=4), id="drop-after-n"),
        pytest.param(FaultPlan(drop_mid_reply_after_commands=5), id="drop-mid-reply"),
        pytest.param(FaultPlan(garbage_every=6, garbage_position="inside"), id="garbage-inside-reply"),
        pytest.param(FaultPlan(lose_state_after_commands=8), id="state-lost-mid-apply"),
        pytest.param(FaultPlan(deny_probability=0.1, seed=5), id="random-deny"),
    ],
)
async def test_fault_ends_in_verified_state(switch: Switch, emulator: Tl1Emulator, faults: FaultPlan) -> None:
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
        assert any(e.kind == "ocs.read" and e.meta.get("after") == "reconnect" for e in events)
    if faults.lose_state_after_commands or faults.deny_probability:
        assert result.value.attempts >= 2  # the read-back found what was missing; the retry repaired it
    if faults.deny_probability:
        assert any(e.kind == "ocs.error" and "SROF" in str(e.value) for e in events)


async def test_garbage_between_messages_is_skipped_without_reconnecting(
    switch: Switch, emulator: Tl1Emulator
) -> None:
    sw, events = switch
    emulator.set_faults(FaultPlan(garbage_every=2, garbage_position="between", seed=1))
    result = await sw.apply(ROTATED)
    assert result.value.mapping == ROTATED and result.value.attempts == 1
    assert sw.reconnects == 0 and "noise" in session_values(events)


async def test_deny_always_is_a_typed_error_after_bounded_retries(
    switch: Switch, emulator: Tl1Emulator
) -> None:
    sw, events = switch
    emulator.set_faults(FaultPlan(deny_probability=1.0))
    with pytest.raises(Tl1Deny) as info:
        await sw.apply(STRAIGHT)
    assert info.value.code == "SROF" and info.value.command.startswith("ENT-PATCH::")
    assert len([e for e in events if e.kind == "ocs.command"]) == sw.attempts
    assert emulator.model.patches == frozenset()


async def test_delayed_replies_within_the_deadline_are_fine_and_ack_in_progress(
    emulator: Tl1Emulator,
) -> None:
    emulator.ack_after_s = 0.02
    emulator.set_faults(FaultPlan(delay_ms=40))
    events: list[Event] = []
    sw = driver(emulator, events)
    await sw.connect()
    try:
        result = await sw.apply([(1, 33)])
    finally:
        await sw.close()
    assert result.value.mapping == {(1, 33)}
    acks = [e for e in events if e.kind == "ocs.session" and e.value == "ack"]
    assert acks and all(e.meta["code"] == "IP" for e in acks)


async def test_reply_slower_than_the_policy_is_a_typed_timeout_and_the_late_reply_is_ignored(
    emulator: Tl1Emulator,
) -> None:
    events: list[Event] = []
    sw = driver(emulator, events, operation_s=0.3)
    await sw.connect()
    try:
        emulator.set_faults(FaultPlan(delay_ms=600))
        with pytest.raises(HardwareError, match=r"apply did not finish within 0\.3 s"):
            await sw.apply([(1, 33)])
        emulator.set_faults(FaultPlan())
        await asyncio.sleep(0.6)  # the late replies arrive and match nothing in flight
        assert (await sw.get_mapping()).value == emulator.model.patches
    finally:
        await sw.close()
    assert "unmatched-reply" in session_values(events)


async def test_state_loss_is_found_by_read_back_and_repaired(switch: Switch, emulator: Tl1Emulator) -> None:
    sw, _ = switch
    await sw.apply(STRAIGHT)
    emulator.lose_state()  # as after a reboot
    assert (await sw.get_mapping()).value == frozenset()
    repaired = await sw.apply(STRAIGHT)
    assert repaired.value.added == STRAIGHT and emulator.model.patches == STRAIGHT


async def test_keepalive_holds_the_session_open(emulator: Tl1Emulator) -> None:
    emulator.session_timeout_s = 0.25
    events: list[Event] = []
    sw = driver(emulator, events, keepalive_s=0.08)
    await sw.connect()
    try:
        await asyncio.sleep(0.8)
        assert (await sw.get_mapping()).value == frozenset()
    finally:
        await sw.close()
    assert emulator.sessions_opened == 1 and sw.reconnects == 0
    assert any(e.kind == "ocs.io" and e.meta["command"].startswith("RTRV-HDR") for e in events)


async def test_session_timed_out_without_keepalive_is_reconnected_transparently(
    emulator: Tl1Emulator,
) -> None:
    emulator.session_timeout_s = 0.1
    events: list[Event] = []
    sw = driver(emulator, events, keepalive_s=None)
    await sw.connect()
    try:
        await asyncio.sleep(0.3)
        assert (await sw.get_mapping()).value == frozenset()
    finally:
        await sw.close()
    assert sw.reconnects == 1 and emulator.sessions_opened == 2


async def test_unreachable_switch_is_a_typed_error_within_the_connect_deadline() -> None:
    events: list[Event] = []
    sw = PolatisTl1Switch(
        "ocs1",
        SPACE,
        endpoint=Tl1Endpoint("127.0.0.1", 1),
        user=USER,
        password=Secret("P", PW),
        emit=events.append,
        timeouts=TimeoutPolicy(connect_s=1.0),
        keepalive_s=None,
    )
    with pytest.raises(HardwareError, match=r"^switch ocs1 at 127\.0\.0\.1:1: connection refused"):
        await sw.connect()


async def test_no_password_in_logs_exceptions_or_run_dir(
    emulator: Tl1Emulator, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    log = EventLog(tmp_path / "events.jsonl", Timebase.capture())
    texts: list[str] = []
    wrong = "Wr0ng-" + PW
    bad = driver(emulator, [], password=wrong)
    with pytest.raises(Tl1LoginRefused) as info:
        await bad.connect()
    texts += [str(info.value), repr(info.value)]
    sw = PolatisTl1Switch(
        "ocs1",
        SPACE,
        endpoint=Tl1Endpoint(*emulator.address),
        user=USER,
        password=Secret("TEST_PW", PW),
        emit=log.record,
        timeouts=TimeoutPolicy(connect_s=5.0, operation_s=5.0),
        keepalive_s=0.05,
    )
    await sw.connect()
    try:
        emulator.set_faults(FaultPlan(drop_after_commands=2, garbage_every=7))
        await sw.apply(STRAIGHT)  # reconnects, i.e. logs in again
        emulator.set_faults(
            FaultPlan(deny_probability=1.0, deny_verbs=["ENT-PATCH", "DLT-PATCH", "RTRV-PATCH"])
        )
        with pytest.raises(Tl1Deny) as info2:
            await sw.get_mapping()
        texts.append(str(info2.value))
        emulator.set_faults(FaultPlan())
        await asyncio.sleep(0.2)  # keep-alives
    finally:
        await sw.close()
        log.close()
    assert sw.reconnects >= 1
    dump = (tmp_path / "events.jsonl").read_text()
    assert "ACT-USER::admin:" in dump and "********" in dump  # logins were recorded, redacted
    for text in [*texts, dump, caplog.text]:
        assert PW not in text and wrong not in text
    assert not files_containing(tmp_path, PW.encode())


def files_containing(root: Path, needle: bytes) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and needle in p.read_bytes()]


# -- the CLI: `labctl emulate ocs` in its own process, `labctl ocs …` against it -------------------------------
def test_cli_emulate_and_ocs_commands(tmp_path: Path) -> None:
    import json
    import os
    import re
    import subprocess
    import sys

    env = {**os.environ, "POLATIS_PASSWORD": PW}
    labctl = [sys.executable, "-m", "labctl.cli"]
    emu = subprocess.Popen(
        [
            *labctl,
            "emulate",
            "ocs",
            "polatis-tl1",
            "--port",
            "0",
            "--size",
            "4x4",
            "--switching-ms",
            "1",
        ],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert emu.stdout is not None
        m = re.search(r"listening on 127\.0\.0\.1:(\d+)", emu.stdout.readline())
        assert m, "emulator did not start"
        inventory = tmp_path / "inv.yaml"
        inventory.write_text(
            "lab: cli\nswitches:\n  ocs1: {driver: polatis-tl1, address: 127.0.0.1, port: "
            + m[1]
            + ', user: admin, password: "${POLATIS_PASSWORD}", size: 4x4, timeout_s: 5}\n'
            "hosts:\n  a:\n    nics:\n      - {ifname: eth0, rail: 0, switch: ocs1, tx: 1, rx: 5}\n"
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

        connected = run("connect", "1", "5", "--json")
        assert connected.returncode == 0, connected.stderr
        assert json.loads(connected.stdout)["patches"] == [[1, 5]]
        mapping = tmp_path / "map.yaml"
        mapping.write_text("patches: [[1, 6], [2, 5]]\n")
        applied = run("apply", str(mapping))
        assert applied.returncode == 0 and "2 added" in applied.stdout and "verified" in applied.stdout
        shown = run("show", "--json")
        assert json.loads(shown.stdout)["patches"] == [[1, 6], [2, 5]]
        gone = run("disconnect", "5", "6", "--json")
        assert json.loads(gone.stdout)["patches"] == []
        bad = run("connect", "1", "2")
        assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "not an egress port" in bad.stderr
        env["POLATIS_PASSWORD"] = "wrong-" + PW
        denied = run("show")
        assert denied.returncode == 1 and "PIUC" in denied.stderr and PW not in denied.stderr
        assert "authentication failed for user" in denied.stderr and denied.stderr.count("\n") == 1
        assert "Traceback" not in denied.stderr
    finally:
        emu.terminate()
        emu.wait(10)
        if emu.stdout is not None:
            emu.stdout.close()
    assert emu.returncode == 0


async def test_a_change_behind_the_drivers_back_is_still_converged(emulator: Tl1Emulator) -> None:
    """The second apply diffs against the first's read-back; the switch changed since (another client):
    the stale diff fails or misses, the read-back says so, and the retry converges from what was read."""
    events: list[Event] = []
    sw = driver(emulator, events)
    await sw.connect()
    try:
        await sw.apply(STRAIGHT)
        emulator.model.patches = frozenset()  # as after another client's DLT-PATCH::ALL
        result = await sw.apply(ROTATED)
    finally:
        await sw.close()
    assert result.value.mapping == ROTATED == emulator.model.patches
