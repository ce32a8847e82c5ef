"""From circuits between hosts to patches on a rail's switch.

A duplex link between NIC ports X and Y is two patches: X.tx → Y.rx and Y.tx → X.rx. The generators
work per rail and use every port of each GPU's NIC, so each phase gets the GPU's full bandwidth, as on
the Opus testbed: `pairs` links port i of one host to port i of the other; `ring` links port 1 of each
host to port 0 of the next (a NIC with 2k ports carries k parallel rings).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from labctl.core.errors import InputError
from labctl.inventory.mapping import Mapping, validate_mapping
from labctl.inventory.schema import Inventory, NicPort


@dataclass(frozen=True, slots=True)
class Link:
    """A duplex circuit between two NIC ports."""

    a: NicPort
    b: NicPort

    def patches(self) -> list[tuple[int, int]]:
        return [(self.a.tx, self.b.rx), (self.b.tx, self.a.rx)]

    def __str__(self) -> str:
        return f"{self.a.label}<->{self.b.label}"


def _rail_hosts(inventory: Inventory, rail: int, hosts: Sequence[str], where: str) -> list[list[NicPort]]:
    by_host = inventory.rail_ports(rail)
    out = []
    for host in hosts:
        if host not in inventory.model.hosts:
            raise InputError(f"{where}: unknown host {host!r} (known: {', '.join(inventory.hosts)})")
        if host not in by_host:
            raise InputError(f"{where}: host {host!r} has no NIC port on rail {rail}")
        out.append(by_host[host])
    if len(set(hosts)) != len(hosts):
        dup = next(h for h in hosts if list(hosts).count(h) > 1)
        raise InputError(f"{where}: host {dup!r} appears more than once")
    return out


def pairs_links(inventory: Inventory, rail: int, pairs: Sequence[Sequence[str]], where: str) -> list[Link]:
    """Pair hosts: port i of the first host ↔ port i of the second, for every port of the rail's NIC."""
    for i, pair in enumerate(pairs):
        if len(pair) != 2:
            raise InputError(f"{where}[{i}]: a pair needs exactly two hosts, got {list(pair)}")
    flat = [h for pair in pairs for h in pair]
    ports = _rail_hosts(inventory, rail, flat, where)
    links: list[Link] = []
    for i in range(0, len(ports), 2):
        a_ports, b_ports = ports[i], ports[i + 1]
        if len(a_ports) != len(b_ports):
            raise InputError(
                f"{where}[{i // 2}]: {flat[i]} has {len(a_ports)} ports on rail {rail} but {flat[i + 1]} "
                f"has {len(b_ports)}"
            )
        links.extend(Link(a, b) for a, b in zip(a_ports, b_ports, strict=True))
    return links


def ring_links(inventory: Inventory, rail: int, hosts: Sequence[str], where: str) -> list[Link]:
    """A ring over hosts: port 2k+1 of host i ↔ port 2k of host i+1 (mod n), for each port pair k."""
    if len(hosts) < 2:
        raise InputError(f"{where}: a ring needs at least two hosts")
    ports = _rail_hosts(inventory, rail, hosts, where)
    n_ports = {len(p) for p in ports}
    if len(n_ports) != 1 or next(iter(n_ports)) % 2:
        raise InputError(
            f"{where}: a ring needs the same even number of ports per host on rail {rail}, "
            f"got {[len(p) for p in ports]}"
        )
    links = []
    for k in range(0, next(iter(n_ports)), 2):
        for i in range(len(hosts)):
            links.append(Link(ports[i][k + 1], ports[(i + 1) % len(hosts)][k]))
    return links


def links_to_mapping(inventory: Inventory, switch: str, links: Iterable[Link], where: str) -> Mapping:
    patches = [patch for link in links for patch in link.patches()]
    try:
        return validate_mapping(patches, inventory.switches[switch].space, switch=switch)
    except InputError as e:
        raise InputError(f"{where}: {e}") from None


def peers_of(inventory: Inventory, rail: int, mapping: Mapping) -> dict[NicPort, NicPort | None]:
    """For each NIC port on the rail: the port whose light reaches its receiver under `mapping`."""
    rail_ports = [p for ports in inventory.rail_ports(rail).values() for p in ports]
    by_tx = {p.tx: p for p in rail_ports}
    source_of_egress = {egress: ingress for ingress, egress in mapping}
    out: dict[NicPort, NicPort | None] = {}
    for port in rail_ports:
        ingress = source_of_egress.get(port.rx)
        out[port] = by_tx.get(ingress) if ingress is not None else None
    return out


def rail_scope(inventory: Inventory, rail: int) -> set[int]:
    """Every switch port the rail's fibers land on: what a phase on this rail may re-patch."""
    return {p for ports in inventory.rail_ports(rail).values() for port in ports for p in (port.tx, port.rx)}
