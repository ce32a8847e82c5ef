"""Probes, one module per signal: async sources of `labctl.core.events.Event`s (labctl.probes.sampling.Probe).

Each has a registry entry (`ProbeKind`, labctl.core.registry.PROBES) whose factory builds it from a
`ProbeContext`: the ports it observes as `PortSite`s, their possible peers, the experiment's settings,
the lab's behaviour model or its switches. Labs and agents run probes by name through `probe_kinds`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from labctl.core.errors import InputError
from labctl.core.registry import Registry
from labctl.inventory.schema import MeterChannel, NicPort, PowerMeterSpec
from labctl.linux.transceiver import ModuleEeprom
from labctl.models.fabric import SimFabric
from labctl.ocs.protocol import OpticalSwitch
from labctl.probes.sampling import ModelSchedule, Probe, ProbeSettings

__all__ = [  # the public surface (docs/architecture.md, "Public surface"); the rest is internal
    "MeterSite",
    "PortSite",
    "ProbeContext",
    "ProbeKind",
    "RxPowerBatch",
    "probe_kinds",
]


@dataclass(frozen=True)
class PortSite:
    """Where one NIC port can be observed from here: its network namespace (None: this one), its IPv4
    address (for traffic), and how to open its transceiver's EEPROM (a live module, or one a behaviour
    model drives)."""

    port: NicPort
    netns: str | None = None
    ip: str | None = None
    open_eeprom: Callable[[], ModuleEeprom] | None = None
    """None: the live module behind the interface (ethtool)."""
    rx_lanes: tuple[int, ...] | None = None
    """Lanes to report Rx power for (None: all the module has)."""
    rx_batch: tuple[RxPowerBatch, int] | None = None
    """A model that reports this port's Rx power (at this slot) together with its other ports' in one
    vectorized read; None: read the port's module on its own."""


@runtime_checkable
class RxPowerBatch(Protocol):
    """Rx power of many modeled modules in one call (labctl.models.fabric.SimFabric)."""

    def rx_power_mw(self, slots: np.ndarray, t_ns: int) -> np.ndarray:
        """mW per slot at t_ns (0: no light), as each module's register reads."""
        ...


@dataclass(frozen=True)
class MeterSite:
    """A bench power meter the power-meter probe polls: its inventory entry, its channels, and where to
    reach it (`endpoint()`, asked at start: an emulated meter's port exists once the lab started it)."""

    name: str
    spec: PowerMeterSpec
    channels: Sequence[MeterChannel]
    endpoint: Callable[[], tuple[str, int]]


@dataclass(frozen=True)
class ProbeContext:
    """Everything a probe factory may draw on; each uses what its signal needs."""

    settings: ProbeSettings
    ports: Sequence[PortSite] = ()
    """The ports this probe observes."""
    peers: Sequence[PortSite] = ()
    """Every port a circuit may reach (a traffic probe's possible peers); default: `ports`."""
    world: SimFabric | None = None
    """The lab's behaviour model, for probes that read it directly."""
    switches: Sequence[tuple[OpticalSwitch, Sequence[int]]] = ()
    """Switches and the ports on each to watch (the switches' own power monitors)."""
    meters: Sequence[MeterSite] = ()
    """Bench power meters (labctl.probes.power_meter)."""
    schedule: ModelSchedule | None = None
    """Where the model is advanced only by its readers (an agent's mirror): the schedule its samplers share,
    each sampling at its own instants, in time order (labctl.probes.sampling.ModelSchedule); None: sample
    now."""

    @property
    def report_interval_ns(self) -> int:
        return round(self.settings.report_interval_ms * 1e6)

    def require_world(self, probe: str) -> SimFabric:
        if self.world is None:
            raise InputError(f"probe {probe} reads the lab's behaviour model, and this lab has none")
        return self.world


@dataclass(frozen=True)
class ProbeKind:
    """A probe's registry entry (labctl.core.registry.PROBES): the event kinds it writes and its factory."""

    name: str
    signals: tuple[str, ...]
    description: str
    build: Callable[[ProbeContext], Probe]


probe_kinds: Registry[ProbeKind] = Registry("probe", "labctl.probes", ProbeKind)
