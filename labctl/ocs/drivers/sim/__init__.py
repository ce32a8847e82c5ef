"""The `sim` driver: a switch that exists only as the lab's behaviour model, driven in-process.

Its config and registry entry; the driver itself (switch.py) is imported when a lab drives a model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field

from labctl.inventory.config import SwitchConfig
from labctl.ocs.switches import EmulatedSwitch, SwitchDriver

if TYPE_CHECKING:  # in annotations only: loading the config union loads no switch model (numpy)
    from labctl.models.switch import SwitchModel
    from labctl.ocs.protocol import EventSink


class SimSwitchConfig(SwitchConfig):
    """A switch that exists only as the lab's behaviour model (no address, no protocol)."""

    driver: Literal["sim"] = Field(description="the simulated switch: labctl's switch model, in process")

    @property
    def over_model(self) -> bool:
        return True


def _over_model(name: str, config: SimSwitchConfig, model: SwitchModel, emit: EventSink) -> EmulatedSwitch:
    from .switch import SimSwitch

    switch = SimSwitch(model, emit, config.timeouts(), name=name, space=config.space, owned=config.owned)
    return EmulatedSwitch(switch)


DRIVER = SwitchDriver(
    name="sim",
    config=SimSwitchConfig,
    description="the lab's switch model, driven in-process (no transport, no codec)",
    emulate=_over_model,
)
