"""The lab contract: what the controller drives (`Lab`), what a lab is built from (`LabContext`), and the
registry entry of a kind of lab (`LabKind`).

A lab kind checks an inventory (everything it would refuse to build, so that `labctl inventory check`
and `labctl run` accept exactly the same files) and builds a `Lab` from it. The controller only sees
`OpticalSwitch`es and `Probe`s and never asks which kind it has. Nothing here imports a lab kind.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from labctl.core.errors import InputError
from labctl.inventory.profiles import Profile
from labctl.inventory.schema import Inventory
from labctl.ocs.protocol import EventSink, OpticalSwitch

if TYPE_CHECKING:  # the probe contract and the behaviour model, named in types only (they import numpy)
    from labctl.models.fabric import SimFabric
    from labctl.nic.settings import LinkControl
    from labctl.probes.base import ProbeContext
    from labctl.probes.sampling import CircuitProbe, Probe, ProbeSettings

__all__ = [  # the public surface (docs/architecture.md, "Public surface"); the rest is internal
    "FaultLatch",
    "Lab",
    "LabContext",
    "LabKind",
    "ReconfigWindow",
    "SwitchAware",
    "require_transport",
]


@runtime_checkable
class ReconfigWindow(Protocol):
    """A probe that samples or reports harder while a reconfiguration is in flight (the carrier poll, dense
    Rx-power reports until the light is seen back)."""

    def open_window(self, sources: Collection[str] | None = None) -> None: ...

    def close_window(self) -> None: ...


@runtime_checkable
class SwitchAware(Protocol):
    """A probe told the moment a switch acknowledged a change (t1), for the ports it moved: the Rx-power
    poller reports each one's next sample, so a dark gap that fell between samples still gets its optical
    mark right after t1 (without reporting every port densely until then)."""

    def expect_switch_acks(self) -> None:
        """Called once before the first reconfiguration: `switched` will follow every switch change, so
        whatever the probe does in its place (dense reports while light moves) is not needed."""
        ...

    def switched(self, sources: Collection[str]) -> None: ...


class FaultLatch:
    """Where a lab reports a fault it notices outside any driver call (an agent gone): the controller waits
    on it, stops the sequence, restores the baseline and fails the run with the reason (raising
    labctl.core.errors.LabFault). Latched: the first reason wins."""

    def __init__(self) -> None:
        import asyncio  # here: the lab contract loads with an inventory check, which needs no asyncio

        self.reason: str | None = None
        self._raised = asyncio.Event()

    def raise_(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason
            self._raised.set()

    async def wait(self) -> str:
        await self._raised.wait()
        assert self.reason is not None
        return self.reason


@dataclass
class Lab:
    switches: dict[str, OpticalSwitch] = field(default_factory=dict)
    probes: list[Probe] = field(default_factory=list)
    close_hooks: list[Callable[[], None]] = field(default_factory=list)
    """Run by `close()` once the run is over: cancel what the lab's models still have scheduled."""
    start_hooks: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    """Run in order before any switch connects: what the lab hosts (a kernel fabric, emulators, a hub)."""
    async_close_hooks: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    """Run in reverse order by `aclose()`, after the switches have closed."""
    meta: dict[str, Any] = field(default_factory=dict)
    """Merged into run.json at the end of the run (e.g. agents' `clock_offsets`)."""
    fault: FaultLatch = field(default_factory=FaultLatch)
    link_control: LinkControl | None = None
    """Reads and applies the NIC ports' link settings (a tune experiment), where the lab offers it."""

    @property
    def circuit_probes(self) -> list[CircuitProbe]:
        """Probes that must be told which peer each port should reach (traffic)."""
        from labctl.probes.sampling import CircuitProbe  # here: checking an inventory loads no probe

        return [p for p in self.probes if isinstance(p, CircuitProbe)]

    @property
    def switch_aware_probes(self) -> list[SwitchAware]:
        return [p for p in self.probes if isinstance(p, SwitchAware)]

    @property
    def window_probes(self) -> list[ReconfigWindow]:
        """Probes told when each reconfiguration starts and ends (affected port sources)."""
        return [p for p in self.probes if isinstance(p, ReconfigWindow)]

    def close(self) -> None:
        for hook in self.close_hooks:
            hook()

    async def start(self) -> None:
        for hook in self.start_hooks:
            await hook()

    async def aclose(self) -> None:
        for hook in reversed(self.async_close_hooks):
            await hook()


@dataclass(frozen=True)
class LabContext:
    inventory: Inventory
    profile: Profile
    rng: random.Random
    emit: EventSink
    probes: ProbeSettings


@dataclass(frozen=True)
class LabKind:
    """A kind of lab's registry entry (labctl.core.registry.LAB_KINDS)."""

    name: str
    description: str
    check: Callable[[Inventory], None]
    """Raise InputError (`file:line: field: problem`) for anything `build` would refuse."""
    build: Callable[[LabContext], Lab]
    agent_probes: tuple[str, ...] = ()
    """Probes a `labctl agent` runs for this kind of lab (empty: the kind runs no agents)."""
    agents_probe_interfaces: bool = False
    """Whether those probes read the host's own NIC interfaces (netlink, module EEPROM), so that `labctl lab
    check` inspects them there. False where agents run modeled probes: the inventory's ports are then names
    in the model, not interfaces a host has."""
    agent_context: Callable[[Inventory, str, ProbeSettings, SimFabric | None], ProbeContext] | None = None
    """Where an agent's probes look, on its host: (inventory, host, settings, the agent's mirror of the
    controller's behaviour model, fed by its `_world` messages; None where the probes read the host's own
    interfaces, `agents_probe_interfaces`) → their ProbeContext."""
    agent_link_control: Callable[[Inventory, str, str], LinkControl] | None = None
    """The LinkControl a `labctl agent` answers its `link` command with, for its host's ports: (inventory,
    host, the broker's host name: its management path) → it. None: this kind's agents set no link
    settings (decision 0079)."""
    no_link_control: str | None = "this lab kind offers no link settings control"
    """Why a tune experiment cannot run on this kind of lab (checked before anything is built); None where
    its `Lab.link_control` reads and applies link settings."""


def require_transport(settings: ProbeSettings, kind: str, supported: tuple[str, ...] = ("udp",)) -> None:
    """One line if the experiment's `probes.transport` is one this lab kind cannot carry."""
    if settings.transport not in supported:
        raise InputError(
            f"probes.transport: {settings.transport!r} is not available on lab kind {kind} (it carries "
            f"{', '.join(supported)}); the RC transport runs on the simulated lab (through the NIC model), "
            "the kernel lab (over UDP on the fabric's veths) and the real lab (verbs on its RDMA devices)"
        )
