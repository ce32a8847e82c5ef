"""Shared by tests/unit/test_sim_switch.py and tests/integration/test_sim_switch.py."""

from __future__ import annotations

import random

from labctl.core.events import Event
from labctl.inventory.mapping import PortSpace
from labctl.inventory.profiles import resolve_profile
from labctl.models.switch import SwitchModel
from labctl.ocs.drivers.sim.switch import SimSwitch
from labctl.ocs.protocol import TimeoutPolicy

FAST = resolve_profile("fast")

SPACE = PortSpace(8, 8)


def make_switch(events: list[Event], timeouts: TimeoutPolicy | None = None) -> SimSwitch:
    model = SwitchModel("ocs1", SPACE, FAST, random.Random(1))
    return SimSwitch(model, events.append, timeouts)
