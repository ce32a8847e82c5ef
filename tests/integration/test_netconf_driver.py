"""The polatis-netconf driver against its emulator over real SSH on 127.0.0.1: connect and hello, apply and
read back, the rpc-error line, the module revision, port-set-state, every fault of the fault plan, the
host-key policy, and a missing ncclient. Nothing may leak: tasks (the conftest guard), threads, listeners."""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from labctl.core.errors import HardwareError, InputError
from labctl.core.events import Event, Kind
from labctl.emulators.core import FaultPlan
from labctl.emulators.netconf import NetconfEmulator
from labctl.inventory.config import Secret
from labctl.inventory.mapping import PortSpace
from labctl.inventory.profiles import Profile, resolve_profile
from labctl.models.switch import SwitchModel
from labctl.ocs.drivers.polatis_netconf.connection import Endpoint, HostKeyPolicy
from labctl.ocs.drivers.polatis_netconf.switch import (
    HostKeyRefused,
    NetconfLoginRefused,
    PolatisNetconfSwitch,
)
from labctl.ocs.protocol import TimeoutPolicy

SPACE = PortSpace(8, 8)


PASSWORD = "emulator-password"


FAST = resolve_profile("fast")


def _threads() -> set[str]:
    """Threads other than the loop's default executor (asyncio_N, shut down by the loop itself)."""
    return {f"{t.name}:{t.ident}" for t in threading.enumerate() if not t.name.startswith("asyncio_")}


@dataclass
class Rig:
    model: SwitchModel
    emulator: NetconfEmulator
    switch: PolatisNetconfSwitch
    events: list[Event]

    def since(self, mark: int, kind: str) -> list[Event]:
        return [e for e in self.events[mark:] if e.kind == kind]


def _switch(
    emulator: NetconfEmulator, events: list[Event], timeout_s: float = 5.0, **kw: object
) -> PolatisNetconfSwitch:
    options: dict[str, object] = {"host_keys": HostKeyPolicy(sha256=emulator.host_key_sha256), **kw}
    return PolatisNetconfSwitch(
        "ocs1",
        SPACE,
        endpoint=Endpoint(*emulator.address),
        user="admin",
        password=Secret("TEST", PASSWORD),
        emit=events.append,
        timeouts=TimeoutPolicy(connect_s=timeout_s, operation_s=timeout_s),
        **options,  # type: ignore[arg-type]
    )


async def _rig(timeout_s: float = 5.0, switching_ms: float | None = None, **emulator_kw: object) -> Rig:
    profile = (
        FAST
        if switching_ms is None
        else Profile(**{**FAST.model_dump(), "switching_ms": (switching_ms, switching_ms)})
    )
    model = SwitchModel("ocs1", SPACE, profile, random.Random(3))
    emulator = NetconfEmulator(model, users={"admin": PASSWORD}, **emulator_kw)  # type: ignore[arg-type]
    await emulator.start()
    events: list[Event] = []
    return Rig(model, emulator, _switch(emulator, events, timeout_s), events)


async def _close(rig: Rig) -> None:
    await rig.switch.close()
    await rig.emulator.close()
    rig.model.cancel_pending()


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    threads = _threads()
    connected = await _rig()
    await connected.switch.connect()
    try:
        yield connected
    finally:
        await _close(connected)
    assert _threads() <= threads, "a thread outlived the session"


# -- connect, apply, read back ---------------------------------------------------------------------------------
async def test_connect_apply_and_read_back(rig: Rig) -> None:
    connected = [e for e in rig.events if e.kind == Kind.OCS_SESSION and e.value == "connected"]
    assert connected and connected[0].meta["base"] == "1.1" and connected[0].meta["revision"] == "2018-03-22"
    assert rig.switch.product.model_name == "N-VST-8x8-LABCTL-EMU"

    mark = len(rig.events)
    result = await rig.switch.apply({(1, 9), (2, 10), (3, 11)})
    assert result.value.mapping == {(1, 9), (2, 10), (3, 11)} == rig.model.patches
    moved = await rig.switch.apply({(1, 10), (2, 9)}, scope={1, 2, 9, 10})
    assert moved.value.added == {(1, 10), (2, 9)} and moved.value.removed == {(1, 9), (2, 10)}
    assert (await rig.switch.get_mapping()).value == {(1, 10), (2, 9), (3, 11)}
    # one edit-config per change, each wire command an ocs.io with its round trip
    io = rig.since(mark, Kind.OCS_IO)
    assert [e.meta["rpc"] for e in io].count("edit-config") == 2
    assert all(isinstance(e.value, int) and e.value > 0 and e.meta["status"] in ("ok", "data") for e in io)

    rig.model.transmitting[1] = -2.0
    await asyncio.sleep(0.05)  # the light arrives after the modeled switching time
    power = await rig.switch.port_power([1, 10, 11])
    assert power.value == {1: -2.0, 10: pytest.approx(-3.5), 11: None}


async def test_base10_only_server_and_old_revision_use_eom_and_pairs() -> None:
    rig = await _rig(bases=("1.0",), revision="2017-02-09")
    try:
        await rig.switch.connect()
        assert rig.switch.list_name == "pairs"
        assert [e.meta["base"] for e in rig.events if e.value == "connected"] == ["1.0"]
        await rig.switch.apply({(4, 12), (5, 13)})
        await rig.switch.apply({(4, 13)}, scope={4, 5, 12, 13})
        assert rig.model.patches == {(4, 13)}
    finally:
        await _close(rig)


async def test_an_rpc_error_is_one_line_with_its_error_tag(rig: Rig) -> None:
    rig.model.refusals = 10
    with pytest.raises(HardwareError) as caught:
        await rig.switch.apply({(1, 9)})
    line = str(caught.value)
    assert "edit-config refused: operation-failed (application)" in line and "\n" not in line
    errors = [e for e in rig.events if e.kind == Kind.OCS_ERROR]
    assert len(errors) == 3 and all("operation-failed" in str(e.value) for e in errors)  # 3 attempts
    assert next(e.meta.get("error_tags") for e in rig.events if e.meta.get("status") == "rpc-error") == [
        "operation-failed"
    ]
    assert rig.model.patches == frozenset()


async def test_port_set_state_enables_and_disables(rig: Rig) -> None:
    await rig.switch.disable_ports([1, 9])
    assert rig.emulator.disabled == {1, 9}
    assert (await rig.switch.port_states([1, 2, 9])).value == {1: "DISABLED", 2: "ENABLED", 9: "DISABLED"}
    await rig.switch.set_port_state(enable=[1], disable=[2])
    assert rig.emulator.disabled == {2, 9}
    with pytest.raises(InputError, match="both enabled and disabled"):
        await rig.switch.set_port_state(enable=[3], disable=[3])


async def test_port_shutter_set_state_from_a_public_client_over_its_own_session(rig: Rig) -> None:
    """The polatis-switch shutter RPC as a public client sends it (tcdona3: ncclient's `dispatch` of a raw
    RPC, its own SSH session beside the driver's): `<ok/>`, the status the driver reads, and the activity
    log naming the RPC that made the change."""
    from ncclient import manager
    from ncclient.operations import RPCError
    from ncclient.xml_ import to_ele

    plts = "http://www.polatis.com/yang/polatis-switch"
    host, port = rig.emulator.address
    await rig.switch.subscribe()
    notes = rig.switch.notifications()

    def shutter(leaves: list[str]) -> list[str]:
        replies = []
        before = set(threading.enumerate())
        with manager.connect(
            host=host,
            port=port,
            username="admin",
            password=PASSWORD,
            hostkey_verify=False,
            allow_agent=False,
            look_for_keys=False,
            timeout=5,
        ) as m:
            for leaf in leaves:
                rpc = f'<port-shutter-set-state xmlns="{plts}">{leaf}</port-shutter-set-state>'
                try:
                    replies.append(m.dispatch(to_ele(rpc)).xml)
                except RPCError as e:  # ncclient raises an rpc-error reply
                    replies.append(f"{e.tag}: {e.message}")
        for thread in set(threading.enumerate()) - before:
            if not thread.name.startswith("asyncio_"):  # ncclient's and paramiko's end after the close
                thread.join(5)
        return replies

    try:
        replies = await asyncio.to_thread(shutter, ["<port-disab>2</port-disab>", "<port-shut>2</port-shut>"])
        assert "<ok/>" in replies[0]
        assert replies[1] == "unknown-element: port-shutter-set-state has no port-shut"
        assert rig.emulator.disabled == {2}
        assert (await rig.switch.port_states([1, 2])).value == {1: "ENABLED", 2: "DISABLED"}
        note = await asyncio.wait_for(anext(notes), 5)
        assert note.fields["notification-activity"] == "port-shutter-set-state: disable 2"

        replies = await asyncio.to_thread(shutter, ["<port-enab>2</port-enab>"])
        assert "<ok/>" in replies[0] and rig.emulator.disabled == set()
        assert (await rig.switch.port_states([2])).value == {2: "ENABLED"}
    finally:
        await notes.aclose()


# -- the fault plan ------------------------------------------------------------------------------------------------
async def test_drop_mid_command_is_reconnected_and_the_change_retried(rig: Rig) -> None:
    rig.emulator.set_faults(FaultPlan(drop_after_commands=2))  # 1: the read, 2: the edit-config
    result = await rig.switch.apply({(1, 9)})
    assert result.value.mapping == {(1, 9)} == rig.model.patches
    assert result.value.attempts == 2 and rig.switch.reconnects == 1
    assert [e.value for e in rig.events if e.kind == Kind.OCS_SESSION][-2:] == ["lost", "reconnected"]


async def test_drop_mid_reply_on_a_read_is_repeated(rig: Rig) -> None:
    await rig.switch.apply({(1, 9)})
    rig.emulator.set_faults(FaultPlan(drop_mid_reply_after_commands=1))
    assert (await rig.switch.get_mapping()).value == {(1, 9)}
    assert rig.switch.reconnects == 1


async def test_drop_mid_reply_after_a_change_took_effect_is_verified(rig: Rig) -> None:
    rig.emulator.set_faults(FaultPlan(drop_mid_reply_after_commands=2))  # the edit-config's reply
    result = await rig.switch.apply({(1, 9), (2, 10)})
    # the switch made the change; the re-read after reconnecting shows it, so nothing is sent again
    assert result.value.mapping == {(1, 9), (2, 10)} and result.value.attempts == 1
    assert rig.model.commands == 1 and rig.switch.reconnects == 1


async def test_refusal_by_the_fault_plan(rig: Rig) -> None:
    rig.emulator.set_faults(FaultPlan(deny_probability=1.0))
    with pytest.raises(HardwareError, match=r"edit-config refused: operation-failed.*injected fault"):
        await rig.switch.apply({(1, 9)})
    assert rig.model.patches == frozenset()
    rig.emulator.set_faults(FaultPlan())
    assert (await rig.switch.apply({(1, 9)})).value.mapping == {(1, 9)}


@pytest.mark.parametrize("base", ["1.0", "1.1"])
async def test_garbage_inside_a_reply_is_noticed_and_the_read_repeated(base: str) -> None:
    rig = await _rig(bases=(base,))
    try:
        await rig.switch.connect()
        await rig.switch.apply({(1, 9)})  # commands 1-3: read, edit-config, read-back
        rig.emulator.set_faults(FaultPlan(garbage_every=4, garbage_position="inside"))
        for _ in range(3):
            assert (await rig.switch.get_mapping()).value == {(1, 9)}  # 1-3 clean
        # 4 is garbled: not XML, so the session is replaced at once (hello, product: 5; re-read: 6) and
        # the read repeated (7), well before the 5 s deadline
        assert (await rig.switch.get_mapping()).value == {(1, 9)}
        assert rig.switch.reconnects == 1
    finally:
        await _close(rig)


async def test_garbage_between_messages_fails_the_operation_then_recovers() -> None:
    # Bytes outside any message break base:1.1 framing: ncclient either fails on them at once or cannot
    # find the message at all (then the read waits for its deadline). Every reply garbled: the read fails
    # within its deadline, reconnecting as it goes; once the garbage stops, the next read works.
    rig = await _rig(timeout_s=1.0)
    try:
        await rig.switch.connect()
        rig.emulator.set_faults(FaultPlan(garbage_every=1, garbage_position="between"))
        with pytest.raises(HardwareError, match=r"^ocs1: "):
            async with asyncio.timeout(3.0):
                await rig.switch.get_mapping()
        rig.emulator.set_faults(FaultPlan())
        assert (await rig.switch.get_mapping()).value == frozenset()
        assert rig.switch.reconnects >= 1
        assert {"lost", "abandoned"} & {e.meta["status"] for e in rig.events if e.kind == Kind.OCS_IO}
    finally:
        await _close(rig)


async def test_state_loss_is_repaired_by_the_verified_apply(rig: Rig) -> None:
    wanted = {(1, 9), (2, 10)}
    await rig.switch.apply(wanted)
    rig.emulator.set_faults(FaultPlan(lose_state_after_commands=1))  # lost as the next read arrives
    result = await rig.switch.apply(wanted)
    assert result.value.added == wanted and result.value.mapping == wanted == rig.model.patches


async def test_a_delay_past_the_deadline_fails_then_the_session_is_replaced() -> None:
    rig = await _rig(timeout_s=0.5)
    try:
        await rig.switch.connect()
        rig.emulator.set_faults(FaultPlan(delay_ms=3000))
        with pytest.raises(HardwareError, match=r"get cross-connects did not finish within 0\.5 s"):
            await rig.switch.get_mapping()
        rig.emulator.set_faults(FaultPlan())
        assert (await rig.switch.get_mapping()).value == frozenset()
        assert rig.switch.reconnects == 1
    finally:
        await _close(rig)


async def test_slow_switching_past_the_deadline_fails_the_apply_and_the_driver_stays_usable() -> None:
    rig = await _rig(timeout_s=0.5, switching_ms=3000)
    try:
        await rig.switch.connect()
        with pytest.raises(HardwareError, match=r"apply did not finish within 0\.5 s"):
            await rig.switch.apply({(1, 9)})
        assert (await rig.switch.get_mapping()).value == {
            (1, 9)
        }  # the switch took it; a new session reads it
    finally:
        await _close(rig)


# -- host keys and logins ------------------------------------------------------------------------------------------
async def test_an_unknown_host_key_is_refused_before_logging_in(tmp_path: Path) -> None:
    rig = await _rig()
    other = NetconfEmulator(rig.model, users={})  # another key
    known = tmp_path / "known_hosts"
    host, port = rig.emulator.address
    try:
        for policy in (
            HostKeyPolicy(sha256=other.host_key_sha256),
            HostKeyPolicy(known_hosts=tmp_path / "missing"),
            HostKeyPolicy(known_hosts=_write(known, f"[{host}]:{port} {other.host_key_openssh}")),
        ):
            switch = _switch(rig.emulator, rig.events, host_keys=policy)
            with pytest.raises(HostKeyRefused, match="refusing to log in") as caught:
                await switch.connect()
            assert "\n" not in str(caught.value) and str(caught.value).startswith("switch ocs1 at ")
            await switch.close()
        assert rig.emulator.sessions_opened == 0  # no session: the password was never sent

        switch = _switch(
            rig.emulator,
            rig.events,
            host_keys=HostKeyPolicy(
                known_hosts=_write(known, f"[{host}]:{port} {rig.emulator.host_key_openssh}")
            ),
        )
        await switch.connect()
        assert (await switch.get_mapping()).value == frozenset()
        await switch.close()
    finally:
        await _close(rig)


def _write(path: Path, line: str) -> Path:
    path.write_text(line + "\n")
    return path


async def test_a_wrong_password_is_one_line_and_not_retried() -> None:
    rig = await _rig()
    switch = PolatisNetconfSwitch(
        "ocs1",
        SPACE,
        endpoint=Endpoint(*rig.emulator.address),
        user="admin",
        password=Secret("TEST", "wrong"),
        host_keys=HostKeyPolicy(sha256=rig.emulator.host_key_sha256),
        emit=rig.events.append,
    )
    try:
        with pytest.raises(
            NetconfLoginRefused,
            match=r"^switch ocs1 at 127\.0\.0\.1:\d+: authentication failed for user 'admin'",
        ):
            await switch.connect()
        assert "wrong" not in " ".join(str(e.meta) for e in rig.events)
    finally:
        await switch.close()
        await _close(rig)


async def test_a_closed_port_is_one_line() -> None:
    rig = await _rig()
    address = rig.emulator.address
    await _close(rig)
    switch = _switch(rig.emulator, [])
    switch.endpoint = Endpoint(*address)
    with pytest.raises(HardwareError, match=r"^switch ocs1 at 127\.0\.0\.1:\d+: connection refused"):
        await switch.connect()
