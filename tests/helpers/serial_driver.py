"""Shared by tests/integration/test_serial_driver.py and tests/unit/test_serial_driver.py."""

from __future__ import annotations

import random
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import pytest

from labctl.core.events import Event
from labctl.emulators.core import FaultPlan
from labctl.emulators.serial import DiconSerialEmulator
from labctl.inventory.mapping import PortSpace
from labctl.inventory.profiles import resolve_profile
from labctl.models.switch import SwitchModel
from labctl.ocs.drivers.dicon_serial.port import LineSettings
from labctl.ocs.drivers.dicon_serial.switch import DiconSerialSwitch
from labctl.ocs.protocol import TimeoutPolicy

SPACE = PortSpace(8, 8)

TRANSPORTS = ("pty", "socket", "rfc2217")

DEADLINE_S = 10.0  # generous: a loaded CI machine (decision 0018)


@dataclass
class Bench:
    emulator: DiconSerialEmulator
    switch: DiconSerialSwitch
    model: SwitchModel
    events: list[Event]

    def kinds(self, kind: str) -> list[Event]:
        return [e for e in self.events if e.kind == kind]


def url_of(emulator: DiconSerialEmulator, transport: str) -> str:
    if transport == "pty":
        assert emulator.pty_path is not None
        return emulator.pty_path
    if transport == "socket":
        return f"socket://127.0.0.1:{emulator.port}"
    return f"rfc2217://127.0.0.1:{emulator.rfc2217_port}"


@asynccontextmanager
async def bench(
    transport: str,
    *,
    faults: FaultPlan | None = None,
    settings: LineSettings | None = None,
    reply_timeout_s: float = 0.25,
    connect: bool = True,
) -> AsyncIterator[Bench]:
    model = SwitchModel("ocs1", SPACE, resolve_profile("fast"), random.Random(3))
    emulator = DiconSerialEmulator(
        model, tcp=transport == "socket", pty=transport != "socket", rfc2217=transport == "rfc2217"
    )
    await emulator.start()
    events: list[Event] = []
    switch = DiconSerialSwitch(
        "ocs1",
        SPACE,
        url=url_of(emulator, transport),
        settings=settings or LineSettings(),
        emit=events.append,
        timeouts=TimeoutPolicy(connect_s=DEADLINE_S, operation_s=DEADLINE_S),
        reply_timeout_s=reply_timeout_s,
        settle_timeout_s=1.0,
    )
    try:
        if connect:
            await switch.connect()
        if faults is not None:
            emulator.set_faults(faults)
        yield Bench(emulator, switch, model, events)
    finally:
        await switch.close()
        await emulator.close()
        model.cancel_pending()


def serial_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith(("serial:", "pySerial"))]


@pytest.fixture(params=TRANSPORTS)
def transport(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name
