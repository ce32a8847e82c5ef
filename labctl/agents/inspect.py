"""What an agent reports about its host's NIC ports for `labctl lab check`: read-only, one pass, blocking
(the agent runs it in a thread).

Per port: does the interface exist, its carrier and operstate, whether the inventory's address is
configured on it, and its transceiver: present, and the Rx power of every lane in mW (None: the lane's Rx
power is not monitored; 0.0: no light), or why not.
"""

from __future__ import annotations

import ipaddress
import socket
from pathlib import Path
from typing import Any

from labctl.core.errors import LabctlError
from labctl.core.version import __version__
from labctl.inventory.schema import NicPort
from labctl.linux.ethtool import read_module

SYS_NET = Path("/sys/class/net")


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:  # carrier reads EINVAL while the interface is administratively down
        return None


def _addresses(ifname: str) -> list[str]:
    from pyroute2 import IPRoute

    with IPRoute() as ipr:
        index = ipr.link_lookup(ifname=ifname)
        if not index:
            return []
        return [
            f"{msg.get_attr('IFA_ADDRESS')}/{msg['prefixlen']}"
            for msg in ipr.get_addr(family=socket.AF_INET, index=index[0])
        ]


def inspect_port(port: NicPort) -> dict[str, Any]:
    facts: dict[str, Any] = {"ifname": port.ifname}
    try:
        socket.if_nametoindex(port.ifname)
    except OSError:
        return {**facts, "exists": False}
    facts["exists"] = True
    carrier = _read(SYS_NET / port.ifname / "carrier")
    facts["carrier"] = None if carrier is None else carrier == "1"
    facts["operstate"] = _read(SYS_NET / port.ifname / "operstate")
    addresses = _addresses(port.ifname)
    facts["addresses"] = addresses
    if port.address is not None:
        wanted = ipaddress.IPv4Interface(port.address)
        facts["address_configured"] = any(ipaddress.IPv4Interface(a) == wanted for a in addresses)
    try:
        reading = read_module(port.ifname)
    except LabctlError as e:
        facts["module"] = {"present": False, "error": str(e)}
    else:
        facts["module"] = {
            "present": True,
            "identifier": reading.identifier_name,
            "identity": reading.identity.to_dict() if reading.identity is not None else None,
            # mW, not dBm: dBm is None both for "not monitored" and "no light"; here None is "not
            # monitored" and 0.0 is "no light", which the check must tell apart (the probe refuses the first)
            "rx_power_mw": [lane.rx_power_mw for lane in reading.lanes],
        }
    return facts


def inspect_host(ports: list[NicPort]) -> dict[str, Any]:
    return {"version": __version__, "ports": {port.source: inspect_port(port) for port in ports}}
