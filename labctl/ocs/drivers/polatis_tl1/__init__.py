"""Polatis TL1 (the `polatis-tl1` driver): its inventory config and its registry entry.

This is all labctl needs to know the driver exists (the inventory loads it to validate switch entries);
the driver (switch.py, over connection.py and codec.py) and its emulator (labctl.emulators.tl1) are
imported only when a switch is opened, emulated or served. docs/extending.md walks through this package
as the example of adding a driver.
"""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING, Literal

from pydantic import Field

from labctl.inventory.config import NetworkSwitchConfig, Secret, SecretRef
from labctl.ocs.switches import EmulatedSwitch, Emulator, EmulatorFrontEnd, EmulatorOptions, SwitchDriver

if TYPE_CHECKING:  # in annotations only: loading the config union loads no switch model (numpy)
    from labctl.models.switch import SwitchModel
    from labctl.ocs.protocol import EventSink, OpticalSwitch

DEFAULT_PORT = 3082  # TL1-RAW on Polatis (reference §1.1)


class PolatisTl1Config(NetworkSwitchConfig):
    """A Polatis switch over TL1: `address`, `port` (default 3082), `user`, `password: ${ENV}`."""

    driver: Literal["polatis-tl1"] = Field(
        description="a Polatis switch over TL1 (TCP, port 3082 by default)"
    )
    pipeline_depth: int = Field(
        default=16, ge=1, le=64, description="ENT-PATCH commands in flight at once (1: one at a time)"
    )


def _open(name: str, config: PolatisTl1Config, emit: EventSink) -> OpticalSwitch:
    from .switch import PolatisTl1Switch, Tl1Endpoint

    assert config.address is not None and config.user is not None  # the config requires them
    return PolatisTl1Switch(
        name,
        config.space,
        endpoint=Tl1Endpoint(config.address, config.port or DEFAULT_PORT),
        user=config.user,
        password=config.password,
        emit=emit,
        timeouts=config.timeouts(),
        pipeline_depth=config.pipeline_depth,
        owned=config.owned,
    )


def _emulate(name: str, config: PolatisTl1Config, model: SwitchModel, emit: EventSink) -> EmulatedSwitch:
    """The real TL1 driver over TCP to a TL1 emulator of `model` (127.0.0.1, ephemeral port), which serves
    from before the switch connects until after it has closed. Without `user`/`password` a one-time
    password is generated for the run, so the login path is always exercised."""
    from labctl.emulators.tl1 import Tl1Emulator

    from .switch import PolatisTl1Switch, Tl1Endpoint

    user = config.user or "admin"
    password: SecretRef | Secret = config.password or Secret(
        "LABCTL_EMULATOR_ONE_TIME_PASSWORD", secrets.token_urlsafe(18)
    )
    emulator = Tl1Emulator(model, users={})
    driver = PolatisTl1Switch(
        name,
        config.space,
        endpoint=Tl1Endpoint("127.0.0.1", 0),
        user=user,
        password=password,
        emit=emit,
        timeouts=config.timeouts(),
        pipeline_depth=config.pipeline_depth,
        owned=config.owned,
    )

    async def start() -> None:
        secret = password.resolve(f"switch {name}") if isinstance(password, SecretRef) else password
        emulator.add_user(user, secret.reveal())
        await emulator.start()
        driver.endpoint = Tl1Endpoint(*emulator.address)

    return EmulatedSwitch(driver, start=start, close=emulator.close)


def _serve(model: SwitchModel, options: EmulatorOptions) -> Emulator:
    from labctl.emulators.tl1 import Tl1Emulator

    return Tl1Emulator(
        model,
        users=options.users,
        host=options.host,
        port=options.port,
        faults=options.faults,
        session_timeout_s=options.session_timeout_s,
    )


DRIVER = SwitchDriver(
    name="polatis-tl1",
    config=PolatisTl1Config,
    description="Polatis optical switch over TL1 (TCP, port 3082)",
    open=_open,
    emulate=_emulate,
    emulator=EmulatorFrontEnd("TL1 over TCP", DEFAULT_PORT, _serve, password_env="POLATIS_PASSWORD"),
)
