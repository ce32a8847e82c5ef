"""The dicon-serial driver's serial line: the emulator's pty is a real tty at the configured settings; a
missing device and a missing pyserial are one line. The driver against its emulator over every transport
is tests/integration/test_serial_driver.py."""

from __future__ import annotations

import os
import sys

import pytest

from labctl.core.errors import HardwareError
from labctl.core.extras import MissingExtra, install_hint
from labctl.ocs.drivers.dicon_serial.port import LineSettings
from labctl.ocs.drivers.dicon_serial.switch import DiconSerialSwitch
from tests.helpers import serial_driver as helpers
from tests.helpers.serial_driver import SPACE, bench, serial_threads

transport = helpers.transport  # fixtures


# -- the line itself ------------------------------------------------------------------------------------------
async def test_the_pty_is_a_real_tty_at_the_configured_line_settings() -> None:
    import termios

    async with bench("pty") as b:
        assert b.emulator.pty_path is not None and os.isatty(b.emulator._slave or -1)
        attrs = termios.tcgetattr(b.emulator._slave or -1)
        assert attrs[4] == attrs[5] == termios.B115200
        assert attrs[2] & termios.CSIZE == termios.CS8 and not attrs[2] & termios.PARENB
        assert not attrs[3] & (termios.ICANON | termios.ECHO)  # raw: no line editing, no echo
        assert b.emulator.line_matches()


async def test_a_missing_device_is_one_line() -> None:
    switch = DiconSerialSwitch(
        "ocs1", SPACE, url="/dev/labctl-no-such-tty", settings=LineSettings(), emit=lambda e: None
    )
    with pytest.raises(
        HardwareError, match=r"^switch ocs1 at /dev/labctl-no-such-tty: cannot open the port: no such file"
    ):
        await switch.connect()
    assert not serial_threads()


async def test_missing_pyserial_is_one_line_naming_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "serial", None)  # `import serial` now raises ImportError
    switch = DiconSerialSwitch("ocs1", SPACE, url="socket://127.0.0.1:9", settings=LineSettings(), emit=print)
    with pytest.raises(MissingExtra) as info:
        await switch.connect()
    assert str(info.value) == (
        "the DiCon serial switch driver needs serial (it is not installed): " + install_hint("serial")
    )
    assert not serial_threads()
