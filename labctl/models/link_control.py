"""The simulated lab's `LinkControl`: each modeled NIC port's link settings, and their effect on its
firmware link-up (the profile's `link` model, labctl.inventory.profiles.LinkModel).

A behavioural model behind the same Protocol a real lab's ethtool netlink control implements: it refuses
what the port does not support (`LinkSettingUnsupported`), applies, reads back, and raises
`LinkSettingMismatch` where the read-back differs. A port's settings show at its next link-up (the fabric
draws that link's firmware delay from them); a link that is up is not retrained by an apply. Model labs
carry no management route on their ports, so nothing is refused for that.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from dataclasses import replace

from labctl.inventory.profiles import LinkModel
from labctl.inventory.schema import Inventory, NicPort
from labctl.models.fabric import SimFabric
from labctl.nic.settings import (
    LinkSettingMismatch,
    LinkSettings,
    LinkSettingUnsupported,
    LinkSupport,
    PortRef,
)

__all__ = ["LinkEffect", "ModelLinkControl", "fabric_timing", "initial_settings"]


def initial_settings(model: LinkModel) -> LinkSettings:
    """Every setting a modeled port holds as it starts (all fields set)."""
    return LinkSettings(
        autoneg=model.autoneg,
        speed_mbps=model.speed_mbps,
        duplex="full",
        link_modes=model.link_modes,
        fec=model.fec,
        priv_flags=tuple(model.priv_flags.items()),
    )


LinkEffect = Callable[[NicPort, LinkSettings], None]
"""What a port's settings do to the lab's behaviour model, called with everything the port holds after each
apply (the simulated lab: its firmware link-up in the `SimFabric`, `fabric_timing`)."""


def fabric_timing(fabric: SimFabric) -> LinkEffect:
    """The effect of a port's settings on `fabric`: its next link-up takes the profile's link model's share
    of the firmware draw (where a link's timing is decided: the one-process lab's fabric, and the agents
    lab's fabric in the controller, which its agents' mirrors follow)."""
    model = fabric.profile.link

    def effect(nic: NicPort, now: LinkSettings) -> None:
        forced = now.link_modes is not None and now.link_modes != model.link_modes
        autoneg = bool(now.autoneg) if now.autoneg is not None else model.autoneg
        fec = now.fec or model.fec
        fabric.set_link_timing(nic, model.factor(autoneg, fec, forced), autoneg, fec)

    return effect


class ModelLinkControl:
    """`labctl.nic.settings.LinkControl` over modeled NIC ports: the settings each holds, what it supports
    (the profile's `link` model), and their `effect` on the lab's model (none on an agent of the agents
    lab: the controller's fabric decides link-up there, told by `labctl.agents.linkctl.AgentLinkControl`)."""

    def __init__(self, ports: Iterable[NicPort], model: LinkModel, effect: LinkEffect | None = None) -> None:
        self.model = model
        self.effect = effect
        self._ports: dict[PortRef, NicPort] = {PortRef(p.host, p.ifname): p for p in ports}
        start = initial_settings(self.model)
        self.held: dict[PortRef, LinkSettings] = dict.fromkeys(self._ports, start)
        """What each port holds now."""
        self.applied: list[tuple[PortRef, LinkSettings]] = []
        """Every apply, in order (what tests read)."""
        self.fail_on: dict[PortRef, str] = {}
        """Ports whose next apply fails with this reason (a fault a test injects, as a NIC may refuse)."""

    @classmethod
    def of_fabric(cls, fabric: SimFabric, inventory: Inventory) -> ModelLinkControl:
        """The simulated lab's: every port of the inventory, each setting's effect on `fabric`."""
        return cls(inventory.ports, fabric.profile.link, fabric_timing(fabric))

    def _port(self, port: PortRef) -> NicPort:
        found = self._ports.get(port)
        if found is None:
            raise LinkSettingUnsupported(port, LinkSettings(), "no such port in the lab")
        return found

    async def support(self, port: PortRef) -> LinkSupport:
        self._port(port)
        return LinkSupport(
            autoneg=True,
            link_modes=self.model.supported_link_modes,
            fec_modes=self.model.fec_modes,
            priv_flags=tuple(sorted(self.model.priv_flags)),
        )

    async def read(self, port: PortRef) -> LinkSettings:
        self._port(port)
        await asyncio.sleep(0)  # a read is a request to the NIC: never inside the caller's turn
        return self.held[port]

    async def apply(self, port: PortRef, settings: LinkSettings) -> LinkSettings:
        nic = self._port(port)
        why = (await self.support(port)).refusal(settings)
        if why is not None:
            raise LinkSettingUnsupported(port, settings, why)
        reason = self.fail_on.pop(port, None)
        if reason is not None:
            raise LinkSettingUnsupported(port, settings, reason)
        await asyncio.sleep(0)
        now = settings.over(self.held[port])
        if settings.link_modes is not None and settings.speed_mbps is None:
            now = replace(now, speed_mbps=_speed(settings.link_modes[0], now))
        self.held[port] = now
        self.applied.append((port, settings))
        if self.effect is not None:
            self.effect(nic, now)
        read = await self.read(port)
        differences = settings.differences(read)
        if differences:
            raise LinkSettingMismatch(port, differences)
        return read


def _speed(mode: str, now: LinkSettings) -> int | None:
    """The speed an ethtool link mode name says (`100000baseSR4/Full` → 100000), else as it was."""
    digits = mode.split("base", 1)[0]
    return int(digits) if digits.isdigit() else now.speed_mbps
