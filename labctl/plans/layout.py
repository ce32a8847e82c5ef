"""From per-OCS matchings to switch patches, each switch's validated as a matching (labctl.mapping).

A duplex circuit between ports X and Y is two patches, X.tx → Y.rx and Y.tx → X.rx (labctl.topology).
Two ways to place a plan:
- `abstract_*`: the plan's own switches, a port per accelerator numbered in order (accelerator a: ingress
  a + 1, egress N + a + 1 on an N×N switch `ocs<k>`; a ring's domain d: ports 2d + 1 and 2d + 2, egress
  2m + 2d + 1 and 2m + 2d + 2 on a 2m×2m switch `rail<r>`), for a lab cabled that way.
- `inventory_*`: onto an inventory's hosts and NIC ports. A static plan's accelerator is a GPU (the NIC
  ports that serve it) or a host, in inventory order, and its matching k uses each accelerator's k-th
  port; an EP plan's domain is a host and rail r's ring uses the host's ports on the inventory's r-th rail
  (labctl.topology.ring_links: port 2k+1 of one domain ↔ port 2k of the next).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Literal

from labctl.errors import InputError
from labctl.inventory import Inventory, NicPort
from labctl.mapping import Mapping, PortSpace, validate_mapping
from labctl.plans.ep import EpRingPlan
from labctl.plans.matchings import StaticPlan
from labctl.topology import Link, links_to_mapping, ring_links

Unit = Literal["gpu", "host"]


@dataclass(frozen=True)
class SwitchPlan:
    """What one switch carries: the patches (validated on its port space) and the ports the plan owns."""

    switch: str
    space: PortSpace
    mapping: Mapping
    scope: tuple[int, ...]
    """Every port of the plan's accelerators on this switch: `labctl ocs apply` unpatches those the
    mapping leaves out."""
    circuits: int
    """Duplex links (two patches each)."""
    sources: tuple[str, ...]
    """What the patches came from: the plan's matchings or rails placed on this switch."""


def _duplex(a_tx: int, a_rx: int, b_tx: int, b_rx: int) -> list[tuple[int, int]]:
    return [(a_tx, b_rx), (b_tx, a_rx)]


def abstract_static(plan: StaticPlan) -> list[SwitchPlan]:
    """Matching k on switch `ocs<k>` (N×N), accelerator a on ingress a + 1 and egress N + a + 1."""
    n = plan.graph.n
    space = PortSpace(n, n)
    scope = tuple(range(1, 2 * n + 1))
    out = []
    for k, matching in enumerate(plan.matchings):
        name = f"ocs{k}"
        patches = [
            p
            for u, v in matching.edges
            for p in _duplex(int(u) + 1, n + int(u) + 1, int(v) + 1, n + int(v) + 1)
        ]
        mapping = validate_mapping(patches, space, switch=name)
        out.append(SwitchPlan(name, space, mapping, scope, len(matching.edges), (matching.label,)))
    return out


def abstract_ep(plan: EpRingPlan) -> list[SwitchPlan]:
    """Rail r's ring on switch `rail<r>` (2m×2m), two ports per domain (a duplex ring needs two)."""
    m = plan.domains
    space = PortSpace(2 * m, 2 * m)
    scope = tuple(range(1, 4 * m + 1))

    def port(domain: int, k: int) -> tuple[int, int]:
        return 2 * domain + k + 1, 2 * m + 2 * domain + k + 1

    out = []
    for rail in range(plan.rails):
        ring = [int(d) for d in plan.rings[rail]]
        patches = []
        if m >= 2:
            for i in range(m):
                a, b = port(ring[i], 1), port(ring[(i + 1) % m], 0)
                patches.extend(_duplex(*a, *b))
        name = f"rail{rail}"
        mapping = validate_mapping(patches, space, switch=name)
        out.append(SwitchPlan(name, space, mapping, scope, len(patches) // 2, (f"rail {rail} ring",)))
    return out


def accelerators(inventory: Inventory, unit: Unit) -> list[tuple[str, list[NicPort]]]:
    """The inventory's accelerators in order, each with its NIC ports in inventory order."""
    groups: dict[str, list[NicPort]] = defaultdict(list)
    for p in inventory.ports:
        name = p.host if unit == "host" or p.gpu is None else f"{p.host}/gpu{p.gpu}"
        groups[name].append(p)
    return list(groups.items())


def _by_switch(
    inventory: Inventory, links: dict[str, list[Link]], sources: dict[str, list[str]], owned: set[NicPort]
) -> list[SwitchPlan]:
    out = []
    for switch in sorted(links):
        mapping = links_to_mapping(inventory, switch, links[switch], f"plan on {switch}")
        scope = tuple(sorted({q for p in owned if p.switch == switch for q in (p.tx, p.rx)}))
        space = inventory.switches[switch].space
        out.append(SwitchPlan(switch, space, mapping, scope, len(links[switch]), tuple(sources[switch])))
    return out


def inventory_static(plan: StaticPlan, inventory: Inventory, unit: Unit = "gpu") -> list[SwitchPlan]:
    """Accelerator a = the inventory's a-th GPU (or host); matching k on each accelerator's k-th port."""
    accs = accelerators(inventory, unit)
    n, need = plan.graph.n, plan.ports_needed
    where = f"{inventory.path or 'inventory'}"
    if n > len(accs):
        raise InputError(
            f"{where}: {plan.graph.name} needs {n} accelerators; the inventory has {len(accs)} "
            f"(one per {unit}; try --unit {'host' if unit == 'gpu' else 'gpu'})"
        )
    for name, ports in accs[:n]:
        if len(ports) < need:
            raise InputError(
                f"{where}: {plan.graph.name} needs {need} ports per accelerator (one per OCS matching); "
                f"{name} has {len(ports)}"
            )
    links: dict[str, list[Link]] = defaultdict(list)
    sources: dict[str, list[str]] = defaultdict(list)
    for k, matching in enumerate(plan.matchings):
        for u, v in matching.edges:
            a_ports, b_ports = accs[int(u)][1], accs[int(v)][1]
            a, b = a_ports[k], b_ports[k]
            if a.switch != b.switch:
                raise InputError(
                    f"{where}: matching {k} ({matching.label}) joins {a.label} on {a.switch} to {b.label} "
                    f"on {b.switch}; a circuit needs both ends on one switch"
                )
            links[a.switch].append(Link(a, b))
            if matching.label not in sources[a.switch]:
                sources[a.switch].append(matching.label)
    owned = {p for _, ports in accs[:n] for p in ports[:need]}
    return _by_switch(inventory, links, sources, owned)


def inventory_ep(plan: EpRingPlan, inventory: Inventory) -> list[SwitchPlan]:
    """Domain d = the inventory's d-th host; rail r's ring on the inventory's r-th rail."""
    where = f"{inventory.path or 'inventory'}"
    hosts, rails = inventory.hosts, inventory.rails
    if plan.domains > len(hosts):
        raise InputError(
            f"{where}: E / G = {plan.domains} domains, but the inventory has {len(hosts)} hosts "
            "(one per domain)"
        )
    if plan.rails > len(rails):
        raise InputError(f"{where}: G = {plan.rails} rails, but the inventory has {len(rails)}: {rails}")
    links: dict[str, list[Link]] = defaultdict(list)
    sources: dict[str, list[str]] = defaultdict(list)
    owned: set[NicPort] = set()
    for r in range(plan.rails):
        rail = rails[r]
        order = [hosts[int(d)] for d in plan.rings[r]]
        switch = inventory.rail_switch(rail)
        by_host = inventory.rail_ports(rail)
        owned.update(p for h in hosts[: plan.domains] for p in by_host.get(h, []))
        if plan.domains >= 2:
            links[switch].extend(ring_links(inventory, rail, order, f"{where}: rail {rail}"))
        else:
            links.setdefault(switch, [])
        sources[switch].append(f"rail {rail} ring")
    return _by_switch(inventory, links, sources, owned)
