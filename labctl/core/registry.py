"""Where labctl finds every kind of lab, switch driver and probe: one table per concern, name →
`module:attribute` of its entry, imported on first use.

Adding one is a line here plus its own module(s): a switch driver brings its config model, how to open
it and how to emulate it (labctl.ocs.switches.SwitchDriver); a lab kind its check and builder
(labctl.labs.base.LabKind); a probe its signals and factory (labctl.probes.base.ProbeKind). Nothing else in
labctl branches on these names (tests/unit/test_architecture.py holds that). Entries live in their own
modules and are imported lazily, so an optional dependency is only needed by what uses it.

This module imports nothing of labctl's above errors: the typed registries are built next to their entry
types (labctl.ocs.switches, labctl.probes, labctl.labs), which keeps every import pointing one way.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from typing import Generic, Protocol, TypeVar

from labctl.core.errors import InputError

SWITCH_DRIVERS: Mapping[str, str] = {
    "sim": "labctl.ocs.drivers.sim:DRIVER",
    "polatis-tl1": "labctl.ocs.drivers.polatis_tl1:DRIVER",
    "polatis-netconf": "labctl.ocs.drivers.polatis_netconf:DRIVER",
    "polatis-scpi": "labctl.ocs.drivers.polatis_scpi:DRIVER",
    "dicon-serial": "labctl.ocs.drivers.dicon_serial:DRIVER",
}
DEFAULT_LAB_KIND = "simulated"
LAB_KINDS: Mapping[str, str] = {
    "simulated": "labctl.labs.simulated:KIND",
    "kernel": "labctl.labs.kernel:KIND",
    "agents": "labctl.labs.agents:KIND",
    "real": "labctl.labs.real:KIND",
}
DEFAULT_EXPERIMENT_KIND = "timeline"
EXPERIMENT_KINDS: Mapping[str, str] = {
    "timeline": "labctl.run.experiment:KIND",
    "replay": "labctl.workload.experiment:KIND",
}
PROBES: Mapping[str, str] = {
    "model-link": "labctl.probes.model:LINK",
    "model-traffic": "labctl.probes.model:TRAFFIC",
    "model-rc-traffic": "labctl.probes.model:RC_TRAFFIC",
    "rx-power": "labctl.probes.rxpower:PROBE",
    "carrier": "labctl.probes.carrier:PROBE",
    "traffic": "labctl.probes.traffic:PROBE",
    "rc-traffic": "labctl.probes.rdma:PROBE",
    "verbs-rc": "labctl.probes.verbs_rc:PROBE",
    "switch-power": "labctl.probes.switch_power:PROBE",
    "link-state": "labctl.probes.linkstate:PROBE",
    "power-meter": "labctl.probes.power_meter:PROBE",
}


class Named(Protocol):
    @property
    def name(self) -> str: ...


E = TypeVar("E", bound=Named)


class UnknownName(InputError):
    """A name no registry entry answers to; the message lists the known ones."""


class Registry(Generic[E]):
    """A typed, lazily loaded view of one table above."""

    def __init__(self, what: str, table: Mapping[str, str], entry_type: type[E]) -> None:
        self.what = what
        self.table = table
        self.entry_type = entry_type
        self._loaded: dict[str, E] = {}

    def names(self) -> tuple[str, ...]:
        return tuple(sorted(self.table))

    def __contains__(self, name: object) -> bool:
        return name in self.table

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def unknown(self, name: str) -> UnknownName:
        return UnknownName(f"unknown {self.what} {name!r} (known: {', '.join(self.names())})")

    def get(self, name: str) -> E:
        entry = self._loaded.get(name)
        if entry is not None:
            return entry
        where = self.table.get(name)
        if where is None:
            raise self.unknown(name)
        module_name, _, attribute = where.partition(":")
        entry = getattr(importlib.import_module(module_name), attribute)
        if not isinstance(entry, self.entry_type) or entry.name != name:
            raise TypeError(f"{where} is not the {self.what} entry {name!r}")
        self._loaded[name] = entry
        return entry

    def all(self) -> dict[str, E]:
        return {name: self.get(name) for name in self.names()}
