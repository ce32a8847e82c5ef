"""The `loopback` driver: its inventory config and its registry entry (the driver is imported on use)."""

from __future__ import annotations

from typing import Literal

from labctl.inventory.config import SwitchConfig
from labctl.models.switch import SwitchModel
from labctl.ocs.protocol import EventSink
from labctl.ocs.switches import EmulatedSwitch, SwitchDriver


class LoopbackConfig(SwitchConfig):
    """A loopback switch: `size`, `timeout_s`, `owned_ports` (SwitchConfig's fields), nothing else."""

    driver: Literal["loopback"]

    @property
    def over_model(self) -> bool:
        return True  # it only ever drives the lab's model of the switch


def _emulate(name: str, config: LoopbackConfig, model: SwitchModel, emit: EventSink) -> EmulatedSwitch:
    from .connection import LoopbackConnection
    from .switch import LoopbackSwitch

    connection = LoopbackConnection(model)
    switch = LoopbackSwitch(name, config.space, connection, emit, config.timeouts(), owned=config.owned)
    return EmulatedSwitch(switch)


DRIVER = SwitchDriver(
    name="loopback",
    config=LoopbackConfig,
    description="the lab's switch model through a line protocol (the docs/extending.md example)",
    emulate=_emulate,
)
