"""Polatis SCPI (the `polatis-scpi` driver): its inventory config and its registry entry.

The driver (switch.py, over connection.py and codec.py) needs pyvisa and pyvisa-py (the `[scpi]`
extra); it and its emulator (labctl.emulators.scpi) are imported only when a switch is opened, emulated
or served, so an inventory naming this driver loads without the extra. Decision 0032.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field, model_validator

from labctl.inventory.config import NetworkSwitchConfig
from labctl.ocs.switches import EmulatedSwitch, Emulator, EmulatorFrontEnd, EmulatorOptions, SwitchDriver

if TYPE_CHECKING:  # in annotations only: loading the config union loads no switch model (numpy)
    from labctl.models.switch import SwitchModel
    from labctl.ocs.protocol import EventSink, OpticalSwitch

DEFAULT_PORT = 5025  # SCPI over a raw socket on Polatis (reference §3.1)


class PolatisScpiConfig(NetworkSwitchConfig):
    """A Polatis switch over SCPI (raw TCP socket): `address`, `port` (default 5025). SCPI on this port
    has no login, so `user` and `password` are not needed (and not used)."""

    driver: Literal["polatis-scpi"] = Field(
        description="a Polatis switch over SCPI (raw TCP, port 5025 by default)"
    )

    @model_validator(mode="after")
    def _reachable(self) -> PolatisScpiConfig:  # replaces NetworkSwitchConfig's: no user to require
        if not self.emulate and self.address is None:
            raise ValueError(
                f"a {self.driver} switch needs address (or `emulate: true` to drive its emulator)"
            )
        return self


def _open(name: str, config: PolatisScpiConfig, emit: EventSink) -> OpticalSwitch:
    from .switch import PolatisScpiSwitch, ScpiEndpoint

    assert config.address is not None  # the config requires it
    return PolatisScpiSwitch(
        name,
        config.space,
        endpoint=ScpiEndpoint(config.address, config.port or DEFAULT_PORT),
        emit=emit,
        timeouts=config.timeouts(),
        owned=config.owned,
    )


def _emulate(name: str, config: PolatisScpiConfig, model: SwitchModel, emit: EventSink) -> EmulatedSwitch:
    """The real SCPI driver over pyvisa to an SCPI emulator of `model` (127.0.0.1, ephemeral port), which
    serves from before the switch connects until after it has closed."""
    from labctl.emulators.scpi import ScpiEmulator

    from .switch import PolatisScpiSwitch, ScpiEndpoint

    driver = PolatisScpiSwitch(
        name,
        config.space,
        endpoint=ScpiEndpoint("127.0.0.1", 0),
        emit=emit,
        timeouts=config.timeouts(),
        owned=config.owned,
    )
    emulator = ScpiEmulator(model)

    async def start() -> None:
        await emulator.start()
        driver.endpoint = ScpiEndpoint(*emulator.address)

    return EmulatedSwitch(driver, start=start, close=emulator.close)


def _serve(model: SwitchModel, options: EmulatorOptions) -> Emulator:
    from labctl.emulators.scpi import ScpiEmulator

    return ScpiEmulator(
        model,
        host=options.host,
        port=options.port,
        faults=options.faults,
        session_timeout_s=options.session_timeout_s,
    )


DRIVER = SwitchDriver(
    name="polatis-scpi",
    config=PolatisScpiConfig,
    description="Polatis optical switch over SCPI (pyvisa, raw TCP socket, port 5025)",
    open=_open,
    emulate=_emulate,
    emulator=EmulatorFrontEnd(
        "SCPI over TCP (no login)",
        DEFAULT_PORT,
        _serve,
        password_env="",  # "": no password to ask for
    ),
)
