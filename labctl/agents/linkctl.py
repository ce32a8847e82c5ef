"""`AgentLinkControl`: the controller's `LinkControl` of a lab whose hosts run agents (issue 40, decision
0079). Each port's settings are read and applied by its own host's agent (`link` command), through that
agent's local LinkControl: ethtool netlink on a real host (labctl.nic.netlink, which refuses the ports that
carry the host's management path), the agent's model of its ports in the agents lab. The agent's answer
comes back as the same exceptions a local LinkControl raises (LinkSettingUnsupported, LinkSettingMismatch),
so a tune run reads the same wherever the ports are.

Where the lab's behaviour model lives in the controller (the agents lab: the `SimFabric` decides when each
link comes up, and the agents' mirrors follow it), `observe` hands it every port's settings as read back,
so the model draws link-up from what the agents hold: one place decides the timing, as in one process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from labctl.agents.hub import AgentHub
from labctl.agents.hub_streams import HostLink
from labctl.core.errors import HardwareError
from labctl.nic.settings import (
    LinkSettingMismatch,
    LinkSettings,
    LinkSettingUnsupported,
    LinkSupport,
    PortRef,
    settings_from_json,
    settings_to_json,
    support_from_json,
)

__all__ = ["AgentLinkControl"]

log = logging.getLogger(__name__)

Observer = Callable[[PortRef, LinkSettings], None]


class AgentLinkControl:
    """`labctl.nic.settings.LinkControl` over the agents' `link` command (one request per call)."""

    def __init__(self, hub: AgentHub, observe: Observer | None = None, timeout_s: float = 30.0) -> None:
        self.hub = hub
        self._ports = {PortRef(p.host, p.ifname) for p in hub.inventory.ports}
        self.observe = observe
        self.timeout_s = timeout_s
        """How long one request may take: an apply on a real NIC can hold its driver while the link
        retrains (seconds)."""

    async def _ask(self, port: PortRef, op: str, settings: LinkSettings | None = None) -> dict[str, Any]:
        asked = settings or LinkSettings()
        link = self.hub.links.get(port.host)
        if link is None or port not in self._ports:
            raise LinkSettingUnsupported(port, asked, "no such port in the lab")
        if link.lost_at_ns is not None and not link.online.is_set():
            await self._wait_return(port, link)
        await self.hub.wait_online(port.host, self.timeout_s)
        args: dict[str, Any] = {"op": op, "port": port.ifname}
        if settings is not None:
            args["settings"] = settings_to_json(settings)
        reply = await self.hub.request(port.host, "link", args, self.timeout_s, check=False)
        data = reply.data or {}
        if reply.ok:
            return data
        refusal = data.get("refusal")
        if refusal == "unsupported":
            raise LinkSettingUnsupported(port, asked, str(data.get("why") or reply.error))
        if refusal == "mismatch":
            raise LinkSettingMismatch(port, [str(d) for d in data.get("differences") or [reply.error]])
        raise HardwareError(f"{port.label}: agent {port.host}: link {op}: {reply.error}")

    async def _wait_return(self, port: PortRef, link: HostLink) -> None:
        """A host declared lost (its agent gone mid-run): wait up to the broker's `agent_return_s` for an
        agent to be online there again (the same process back, or a restarted one: on a real host the NIC
        still holds what was set, so its ports are put back through it), else fail naming the port."""
        wait_s = self.hub.broker.agent_return_s
        if wait_s > 0:
            log.warning(
                "agent %s is lost (%s): waiting up to %g s for it to return, to put %s's link settings back",
                port.host,
                link.lost_reason,
                wait_s,
                port.label,
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(link.online.wait(), wait_s)
        if not link.online.is_set():
            raise HardwareError(
                f"{port.label}: agent {port.host} is lost ({link.lost_reason}) and did not return within "
                f"{wait_s:g} s: its link settings can be neither read nor set until it is back"
            )
        log.warning("agent %s is back: %s's link settings go through it", port.host, port.label)

    async def support(self, port: PortRef) -> LinkSupport:
        return support_from_json(dict((await self._ask(port, "support"))["support"]))

    async def read(self, port: PortRef) -> LinkSettings:
        held = settings_from_json(dict((await self._ask(port, "read"))["settings"]))
        if self.observe is not None:
            self.observe(port, held)
        return held

    async def apply(self, port: PortRef, settings: LinkSettings) -> LinkSettings:
        held = settings_from_json(dict((await self._ask(port, "apply", settings))["settings"]))
        if self.observe is not None:
            self.observe(port, held)
        differences = settings.differences(held)  # the agent verified it; a reply that says otherwise is not
        if differences:
            raise LinkSettingMismatch(port, differences)
        return held
