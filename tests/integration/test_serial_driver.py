"""The dicon-serial driver against its emulator over real serial lines: a pty (a real tty, opened by
pyserial as a device), raw TCP (`socket://`) and RFC 2217 (`rfc2217://`); every fault of the plan, resync
after line noise, wrong line settings, a missing pyserial; nothing left behind (tasks, threads, fds)."""

from __future__ import annotations

import asyncio

import pytest

from labctl.core.errors import HardwareError, InputError
from labctl.core.events import Kind
from labctl.emulators.core import FaultPlan
from labctl.inventory.mapping import PortSpace
from labctl.ocs.drivers.dicon_serial.port import LineSettings
from labctl.ocs.protocol import TimeoutPolicy
from tests.helpers import serial_driver as helpers
from tests.helpers.fds import open_fds, opened_since
from tests.helpers.serial_driver import DEADLINE_S, bench, serial_threads

transport = helpers.transport  # fixtures


# -- apply, read back, events -----------------------------------------------------------------------------
async def test_apply_reads_back_and_every_wire_command_is_an_event(transport: str) -> None:
    fds = open_fds()
    async with bench(transport) as b:
        assert b.switch.identity[:2] == ("Dicon Fiberoptics Inc", "GP600")
        await b.switch.apply({(1, 9), (2, 10)})
        mark = len(b.events)
        result = await b.switch.apply({(1, 10), (2, 9), (3, 11)})  # a swap and a new patch
        assert result.value.mapping == {(1, 10), (2, 9), (3, 11)} == b.model.patches
        assert (await b.switch.get_mapping()).value == b.model.patches
        io = [e for e in b.events[mark:] if e.kind == Kind.OCS_IO]
        sent = [e.meta["command"] for e in io]
        assert sent.count("X1 CH 1?") == 3  # read before, read after, get_mapping
        changes = [c for c in sent if not c.endswith("?") or c == "SYST:ERR?"]
        assert changes == ["X1 CH 3 3", "X1 CH 1 0", "X1 CH 2 1", "X1 CH 1 2", "SYST:ERR?"]
        assert all(e.value >= 0 and e.meta["status"] == "ok" for e in io)
        assert b.kinds(Kind.OCS_COMPLETE)
    assert not serial_threads(), "a port thread outlived its driver"
    assert not opened_since(fds), "a file descriptor outlived the driver and emulator"


async def test_power_is_not_measured_and_says_so(transport: str) -> None:
    async with bench(transport) as b:
        timed = await b.switch.port_power([1, 9])
        assert timed.value == {1: None, 9: None}
        rx = b.kinds(Kind.RX_POWER)
        assert [e.meta["monitor"] for e in rx] == ["none", "none"]


# -- faults -------------------------------------------------------------------------------------------------
async def test_a_drop_mid_command_is_recovered_and_verified(transport: str) -> None:
    """The emulator goes silent (pty: as a device that browned out; TCP: hangs up) on the 2nd command after
    the faults are set: the read-back query that hit it is asked again, the change goes through."""
    async with bench(transport, faults=FaultPlan(drop_after_commands=2)) as b:
        result = await b.switch.apply({(1, 9), (2, 10)})
        assert result.value.mapping == {(1, 9), (2, 10)} == b.model.patches
        statuses = {e.meta["status"] for e in b.kinds(Kind.OCS_IO)}
        assert statuses & {"no reply", "lost"}
        if transport == "socket":  # TCP hangs up; a device (behind a console server or not) goes silent
            assert b.switch.reconnects >= 1


async def test_a_drop_mid_reply_is_recovered(transport: str) -> None:
    async with bench(transport, faults=FaultPlan(drop_mid_reply_after_commands=3)) as b:
        result = await b.switch.apply({(1, 9)})
        assert result.value.mapping == {(1, 9)} == b.model.patches
        assert (await b.switch.get_mapping()).value == {(1, 9)}


async def test_a_drop_of_the_acknowledgement_is_left_to_the_read_back(transport: str) -> None:
    """The change arrives, the SYST:ERR? after it is dropped: the attempt fails, the read-back shows the
    change took effect, nothing is sent twice."""
    async with bench(transport) as b:
        await b.switch.apply({(1, 9)})
        # the apply below sends 8 queries, then X1 CH 2 2, then SYST:ERR? (the 10th command)
        b.emulator.set_faults(FaultPlan(drop_after_commands=10))
        result = await b.switch.apply({(1, 9), (2, 10)})
        assert result.value.mapping == {(1, 9), (2, 10)} == b.model.patches
        assert result.value.attempts == 1
        assert b.kinds(Kind.OCS_ERROR)  # the attempt without acknowledgement is on the record


async def test_refusals_are_reported_in_the_switchs_words_and_retried(transport: str) -> None:
    async with bench(transport, faults=FaultPlan(deny_probability=1.0)) as b:
        with pytest.raises(HardwareError, match=r"-200, Execution error; injected refusal"):
            await b.switch.apply({(1, 9)})
        assert b.model.patches == frozenset()
        b.emulator.set_faults(FaultPlan())
        assert (await b.switch.apply({(1, 9)})).value.mapping == {(1, 9)}
        # an output in use is refused by the switch itself, before the model is asked
        b.model.patches = frozenset({(1, 9)})
        await b.switch._change(["X1 CH 1 1"])
        with pytest.raises(HardwareError, match=r"-221, Settings conflict; output 1 is in use by input 1"):
            await b.switch._change(["X1 CH 2 1"])


@pytest.mark.parametrize("position", ["inside", "between"])
async def test_the_driver_resynchronises_after_line_noise(transport: str, position: str) -> None:
    """Garbage with every 3rd reply (inside the reply line, or as a line of its own before it): applies
    and reads still come out right; the noise is counted and on the record."""
    plan = FaultPlan(garbage_every=3, garbage_position=position, seed=5)  # type: ignore[arg-type]
    async with bench(transport, faults=plan) as b:
        for mapping in ({(1, 9), (2, 10)}, {(1, 10), (2, 9), (5, 13)}, {(3, 11)}):
            result = await b.switch.apply(mapping, scope={1, 2, 3, 5, 9, 10, 11, 13})
            assert result.value.mapping == mapping == b.model.patches
        assert (await b.switch.get_mapping()).value == {(3, 11)}
        assert b.switch.noise_lines > 0
        assert any(e.value == "noise" for e in b.kinds(Kind.OCS_SESSION))


async def test_lost_state_is_repaired_by_a_verified_apply(transport: str) -> None:
    async with bench(transport) as b:
        await b.switch.apply({(1, 9), (2, 10)})
        b.emulator.set_faults(FaultPlan(lose_state_after_commands=1))  # reboots on the next command
        result = await b.switch.apply({(1, 9), (2, 10), (3, 11)})
        assert result.value.mapping == {(1, 9), (2, 10), (3, 11)} == b.model.patches


async def test_a_reply_later_than_the_reply_timeout_is_asked_again_and_late_ones_are_discarded(
    transport: str,
) -> None:
    async with bench(transport, reply_timeout_s=0.3) as b:
        await b.switch.apply({(1, 9)})
        b.emulator.set_faults(FaultPlan(delay_ms=2500))  # later than all three tries together
        with pytest.raises(HardwareError, match=r"no valid reply to X1 CH 1\?"):
            await b.switch.get_mapping()
        b.emulator.set_faults(FaultPlan())
        assert (await b.switch.get_mapping()).value == {(1, 9)}
        assert b.switch._line is not None
        resyncs = b.switch._line.resyncs
        await asyncio.sleep(2.5)  # the late replies of the failed tries arrive, unasked
        b.model.patches = frozenset({(2, 10)})  # the switch changed meanwhile: stale replies would lie
        assert (await b.switch.get_mapping()).value == {(2, 10)}
        assert b.switch._line.resyncs > resyncs  # the unasked bytes were discarded first


async def test_the_operation_deadline_bounds_a_slow_switch(transport: str) -> None:
    async with bench(transport) as b:
        b.switch.timeouts = TimeoutPolicy(connect_s=DEADLINE_S, operation_s=0.3)
        b.emulator.set_faults(FaultPlan(delay_ms=3000))
        with pytest.raises(HardwareError, match=r"apply did not finish within 0\.3 s"):
            await b.switch.apply({(1, 9)})
        b.emulator.set_faults(FaultPlan())
        b.switch.timeouts = TimeoutPolicy(connect_s=DEADLINE_S, operation_s=DEADLINE_S)
        assert (await b.switch.apply({(1, 9)})).value.mapping == {(1, 9)}


@pytest.mark.parametrize("transport", ["pty", "rfc2217"])
async def test_wrong_line_settings_fail_connect_in_one_line(transport: str) -> None:
    """The driver opens the line at 9600 baud where the switch runs at 115200 (on rfc2217:// the console
    server sets its port to what the client asked): what comes back is no reply."""
    async with bench(transport, settings=LineSettings(baudrate=9600), connect=False) as b:
        with pytest.raises(HardwareError, match=r"no valid reply to \*IDN\?.*9600 8N1.*line settings"):
            await b.switch.connect()
        assert b.emulator.mismatched_commands > 0
    assert not serial_threads()


async def test_a_device_that_is_not_a_dicon_matrix_of_that_size_is_refused() -> None:
    async with bench("socket", connect=False) as b:
        b.emulator.idn = "Acme Optics, SW-1, 1, 1.0"
        with pytest.raises(InputError, match="is not a DiCon switch"):
            await b.switch.connect()
    async with bench("socket", connect=False) as b:
        b.switch.space = PortSpace(16, 16)
        with pytest.raises(InputError, match="inventory says 16x16 but the switch reports 8x8"):
            await b.switch.connect()
