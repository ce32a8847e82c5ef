"""Shared by tests/integration/test_workload_orchestrator.py and tests/unit/test_workload_orchestrator.py."""

from __future__ import annotations

import random
from pathlib import Path

from labctl.core.events import Event
from labctl.inventory.profiles import resolve_profile
from labctl.inventory.schema import load_inventory
from labctl.models.switch import SwitchModel
from labctl.ocs.drivers.sim.switch import SimSwitch
from labctl.run.rails import RailWriter
from labctl.workload.circuits import JobCircuits, TopoState
from labctl.workload.trace import get_trace

REPO = Path(__file__).resolve().parents[2]


def _lab(switching_ms: float = 20.0) -> tuple[JobCircuits, dict[str, SimSwitch], SwitchModel, list[Event]]:
    inventory = load_inventory(REPO / "inventory.yaml")
    profile = resolve_profile("fast").model_copy(update={"switching_ms": (switching_ms, switching_ms)})
    model = SwitchModel("ocs1", inventory.switches["ocs1"].space, profile, random.Random(1))
    events: list[Event] = []
    switch = SimSwitch(model, events.append)
    circuits = JobCircuits(get_trace("opus-testbed").job, inventory)
    return circuits, {"ocs1": switch}, model, events


def writer(circuits: JobCircuits, switches: dict[str, SimSwitch], state: TopoState) -> RailWriter:
    """The run's rails as the engine hands them to a replay: each rail's switch, holding `state`."""
    return RailWriter(
        {rail: switches[circuits.switch(rail)] for rail in circuits.rails},
        current={rail: circuits.rail_mapping(rail, state) for rail in circuits.rails},
    )
