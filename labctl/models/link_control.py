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

__all__ = ["ModelLinkControl", "initial_settings"]


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


class ModelLinkControl:
    """`labctl.nic.settings.LinkControl` over a `SimFabric`'s NIC ports."""

    def __init__(self, fabric: SimFabric, inventory: Inventory) -> None:
        self.fabric = fabric
        self.model = fabric.profile.link
        self._ports: dict[PortRef, NicPort] = {PortRef(p.host, p.ifname): p for p in inventory.ports}
        start = initial_settings(self.model)
        self.held: dict[PortRef, LinkSettings] = dict.fromkeys(self._ports, start)
        """What each port holds now."""
        self.applied: list[tuple[PortRef, LinkSettings]] = []
        """Every apply, in order (what tests read)."""
        self.fail_on: dict[PortRef, str] = {}
        """Ports whose next apply fails with this reason (a fault a test injects, as a NIC may refuse)."""

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
        forced = now.link_modes is not None and now.link_modes != self.model.link_modes
        autoneg = bool(now.autoneg)
        fec = now.fec or self.model.fec
        self.fabric.set_link_timing(nic, self.model.factor(autoneg, fec, forced), autoneg, fec)
        read = await self.read(port)
        differences = settings.differences(read)
        if differences:
            raise LinkSettingMismatch(port, differences)
        return read


def _speed(mode: str, now: LinkSettings) -> int | None:
    """The speed an ethtool link mode name says (`100000baseSR4/Full` → 100000), else as it was."""
    digits = mode.split("base", 1)[0]
    return int(digits) if digits.isdigit() else now.speed_mbps
