"""DiCon 3D MEMS matrix switch over RS-232 (the `dicon-serial` driver): its inventory config and registry
entry.

The switch is a DiCon GP600/GP700 with its 3D MEMS MxN matrix (`X1`), driven with the ASCII command set
of its RS-232 port (decision 0033): on a local serial device (`/dev/ttyUSB0`), or through a serial console
server (`socket://host:port` for a raw TCP port, `rfc2217://host:port` for RFC 2217). The driver
(switch.py, over port.py and codec.py) and the emulator (labctl.emulators.serial) are imported only when a
switch is opened, emulated or served; pyserial (the [serial] extra) only when a port is opened.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Literal

from pydantic import Field, model_validator

from labctl.inventory.config import NetworkSwitchConfig
from labctl.ocs.switches import EmulatedSwitch, Emulator, EmulatorFrontEnd, EmulatorOptions, SwitchDriver

if TYPE_CHECKING:  # in annotations only: loading the config union loads no switch model (numpy)
    from labctl.models.switch import SwitchModel
    from labctl.ocs.protocol import EventSink, OpticalSwitch

    from .port import LineSettings

DEFAULT_PORT = 10001  # a serial device server's raw TCP port (where a GP600 is reached over LAN, 0033)
_URL = re.compile(r"^(/dev/\S+|COM\d+|(socket|rfc2217)://[^\s/:]+:\d{1,5}(\?\S*)?)$")


class DiconSerialConfig(NetworkSwitchConfig):
    """A DiCon 3D MEMS matrix on a serial line: `url` (a device path such as /dev/ttyUSB0,
    `socket://host:port` or `rfc2217://host:port`), or `address` + `port` (default 10001) of a console
    server's raw TCP port; the line settings must be the switch's (115200 8N1, CR by default)."""

    driver: Literal["dicon-serial"] = Field(
        description="a DiCon MEMS matrix over a serial line or a console server's TCP port"
    )
    url: str | None = Field(
        default=None,
        description="pyserial URL: a device path (/dev/ttyUSB0), socket://HOST:PORT or rfc2217://HOST:PORT",
    )
    baudrate: int = Field(default=115200, ge=50, le=4_000_000, description="the line's speed, bit/s")
    bytesize: Literal[5, 6, 7, 8] = Field(default=8, description="data bits per character")
    parity: Literal["N", "E", "O"] = Field(default="N", description="parity: none, even or odd")
    stopbits: Literal[1, 2] = Field(default=1, description="stop bits per character")
    line_ending: Literal["CR", "LF", "CRLF"] = Field(default="CR", description="what ends a command")
    reply_timeout_s: float = Field(
        default=1.0, gt=0, le=60, description="how long a query waits for its reply before it is asked again"
    )
    settle_timeout_s: float = Field(
        default=2.0,
        gt=0,
        le=600,
        description="how long the acknowledgement of a change (SYST:ERR?, answered once the mirrors "
        "have settled) may take beyond reply_timeout_s before the attempt counts as failed (the read-back "
        "decides)",
    )
    emulate_transport: Literal["pty", "socket", "rfc2217"] = Field(
        default="pty",
        description="with emulate: true, how the driver reaches its emulator: a local pty (a real tty, the "
        "default), raw TCP (socket://) or RFC 2217 in front of the pty (rfc2217://)",
    )

    @model_validator(mode="after")
    def _reachable(self) -> DiconSerialConfig:  # replaces NetworkSwitchConfig's (no user needed here)
        if self.url is not None:
            if not _URL.match(self.url):
                raise ValueError(
                    f"url {self.url!r}: give a device path (/dev/ttyUSB0), socket://HOST:PORT or "
                    "rfc2217://HOST:PORT"
                )
            if self.address is not None:
                raise ValueError("give either url or address (a console server's raw TCP port), not both")
        if not self.emulate and self.url is None and self.address is None:
            raise ValueError("a dicon-serial switch needs url (or address and port), or `emulate: true`")
        return self

    @property
    def target_url(self) -> str:
        if self.url is not None:
            return self.url
        return f"socket://{self.address}:{self.port or DEFAULT_PORT}"


def _settings(config: DiconSerialConfig) -> LineSettings:
    from .port import LineSettings

    return LineSettings(
        baudrate=config.baudrate,
        bytesize=config.bytesize,
        parity=config.parity,
        stopbits=config.stopbits,
        line_ending=config.line_ending,
    )


def _open(name: str, config: DiconSerialConfig, emit: EventSink) -> OpticalSwitch:
    from .switch import DiconSerialSwitch

    return DiconSerialSwitch(
        name,
        config.space,
        url=config.target_url,
        settings=_settings(config),
        emit=emit,
        timeouts=config.timeouts(),
        reply_timeout_s=config.reply_timeout_s,
        settle_timeout_s=config.settle_timeout_s,
        owned=config.owned,
        console_login=config.user is not None or config.password is not None,
    )


def _emulate(name: str, config: DiconSerialConfig, model: SwitchModel, emit: EventSink) -> EmulatedSwitch:
    """The real driver over a real serial line to an emulator of `model`: a pty (default), raw TCP or
    RFC 2217 on 127.0.0.1, served from before the switch connects until after it has closed."""
    from labctl.emulators.serial import DiconSerialEmulator

    from .switch import DiconSerialSwitch

    transport = config.emulate_transport
    emulator = DiconSerialEmulator(
        model,
        tcp=transport == "socket",
        pty=transport in ("pty", "rfc2217"),
        rfc2217=transport == "rfc2217",
        baudrate=config.baudrate,
        bytesize=config.bytesize,
        parity=config.parity,
        stopbits=config.stopbits,
    )
    driver = DiconSerialSwitch(
        name,
        config.space,
        url="",  # known once the emulator serves
        settings=_settings(config),
        emit=emit,
        timeouts=config.timeouts(),
        reply_timeout_s=config.reply_timeout_s,
        settle_timeout_s=config.settle_timeout_s,
        owned=config.owned,
    )

    async def start() -> None:
        await emulator.start()
        if transport == "pty":
            assert emulator.pty_path is not None
            driver.url = emulator.pty_path
        elif transport == "socket":
            driver.url = f"socket://127.0.0.1:{emulator.port}"
        else:
            driver.url = f"rfc2217://127.0.0.1:{emulator.rfc2217_port}"

    return EmulatedSwitch(driver, start=start, close=emulator.close)


def _serve(model: SwitchModel, options: EmulatorOptions) -> Emulator:
    from labctl.emulators.serial import DiconSerialEmulator

    return DiconSerialEmulator(
        model,
        host=options.host,
        port=options.port,
        faults=options.faults,
        session_timeout_s=options.session_timeout_s,
        tcp=True,
        pty=True,
        rfc2217=True,
    )


DRIVER = SwitchDriver(
    name="dicon-serial",
    config=DiconSerialConfig,
    description="DiCon 3D MEMS matrix switch (GP600/GP700 X1) over RS-232: a device, socket:// or rfc2217://",
    open=_open,
    emulate=_emulate,
    emulator=EmulatorFrontEnd(
        "DiCon X1 ASCII over a pty, raw TCP and RFC 2217", DEFAULT_PORT, _serve, password_env=""
    ),
    measures_power=False,  # the X1 command set has no power monitor (decision 0033)
)
