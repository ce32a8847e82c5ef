"""From per-OCS matchings to switch patches, each switch's validated as a matching (labctl.inventory.mapping).

A duplex circuit between ports X and Y is two patches, X.tx → Y.rx and Y.tx → X.rx
(labctl.inventory.topology).
Two ways to place a plan:
- `abstract_*`: the plan's own switches, a port per accelerator numbered in order (accelerator a: ingress
  a + 1, egress N + a + 1 on an N×N switch `ocs<k>`; a ring's domain d: ports 2d + 1 and 2d + 2, egress
  2m + 2d + 1 and 2m + 2d + 2 on a 2m×2m switch `rail<r>`), for a lab cabled that way.
- `inventory_*`: onto an inventory's hosts and NIC ports, within rails: a rail is one circuit domain, so
  no circuit joins two rails. A static plan's accelerator is a GPU (or a host) with its NIC ports on one
  rail; the plan's graph is laid on each rail it uses (`rail_share`: the fewest rails, split evenly, so
  `ring -n 8` on 4 hosts × 2 rails is one C4 per rail over all four hosts) and matching k uses each
  accelerator's k-th port on its rail. An EP plan's domain is a host and rail r's ring uses the host's
  ports on the inventory's r-th rail (labctl.inventory.topology.ring_links: port 2k+1 of one domain ↔ port
  2k of
  the next).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from labctl.core.errors import InputError
from labctl.inventory.mapping import Mapping, PortSpace, validate_mapping
from labctl.inventory.schema import Inventory, NicPort
from labctl.inventory.topology import Link, links_to_mapping, ring_links
from labctl.plans.ep import EpRingPlan
from labctl.plans.matchings import StaticPlan

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


@dataclass(frozen=True)
class Accelerator:
    """One accelerator on one rail: a GPU (or a host) and its NIC ports on that rail, in inventory order.
    A GPU whose NIC ports sit on two rails is one accelerator on each."""

    name: str
    """`h1/gpu0` (or `h1` for a host, or a port that serves no GPU)."""
    host: str
    rail: int
    ports: tuple[NicPort, ...]

    @property
    def where(self) -> str:
        return f"{self.name} on rail {self.rail}"


def rail_accelerators(inventory: Inventory, unit: Unit = "gpu") -> dict[int, list[Accelerator]]:
    """Rail → its accelerators in inventory order (hosts as listed, then by first NIC port), each with its
    ports on the rail. A rail is one circuit domain: its ports are the only ones its accelerators can be
    patched to."""
    groups: dict[tuple[int, str], list[NicPort]] = defaultdict(list)
    hosts: dict[tuple[int, str], str] = {}
    for p in inventory.ports:
        name = p.host if unit == "host" or p.gpu is None else f"{p.host}/gpu{p.gpu}"
        groups[(p.rail, name)].append(p)
        hosts[(p.rail, name)] = p.host
    out: dict[int, list[Accelerator]] = {rail: [] for rail in inventory.rails}
    for (rail, name), ports in groups.items():
        out[rail].append(Accelerator(name, hosts[(rail, name)], rail, tuple(ports)))
    return out


def _rail_sizes(by_rail: dict[int, list[Accelerator]]) -> str:
    return ", ".join(f"rail {r}: {len(accs)}" for r, accs in by_rail.items())


def rail_share(
    inventory: Inventory, total: int, unit: Unit = "gpu", *, split: bool = True, what: str = "the plan"
) -> tuple[tuple[int, ...], int]:
    """Where `total` accelerators go: (rails, accelerators per rail). A circuit never leaves its rail, so a
    plan is the same graph on each rail it uses, over that rail's first accelerators; it takes the fewest
    rails that hold `total` split evenly (rails in inventory order), so a plan that fits on one rail spans
    every host of that rail before it takes a second. `split=False` (a graph fixed by its structure, not
    sized by -n): one rail or nothing."""
    where = f"{inventory.path or 'inventory'}"
    by_rail = rail_accelerators(inventory, unit)
    rails = list(by_rail)
    capacity = sum(len(a) for a in by_rail.values())
    noun = "GPU" if unit == "gpu" else "host"
    if total > capacity:
        raise InputError(
            f"{where}: {what} needs {total} accelerators; the inventory has {capacity} "
            f"(one per {noun} on each rail; {_rail_sizes(by_rail)})"
        )
    for copies in range(1, (len(rails) if split else 1) + 1):
        if total % copies:
            continue
        per_rail = total // copies
        if copies > 1 and per_rail < 2:
            break
        fits = [r for r in rails if len(by_rail[r]) >= per_rail]
        if len(fits) >= copies:
            return tuple(fits[:copies]), per_rail
    largest = max(rails, key=lambda r: len(by_rail[r]))
    if not split:
        raise InputError(
            f"{where}: {what} needs {total} accelerators on one rail (a circuit never leaves its rail); "
            f"the largest, rail {largest}, has {len(by_rail[largest])} ({_rail_sizes(by_rail)})"
        )
    sizes = sorted((len(a) for a in by_rail.values()), reverse=True)
    usable = sorted({c * m for c in range(1, len(sizes) + 1) for m in range(2, sizes[c - 1] + 1)})
    raise InputError(
        f"{where}: {total} accelerators do not split evenly over rails that hold them (a circuit never "
        f"leaves its rail; {_rail_sizes(by_rail)}); counts that do: {', '.join(map(str, usable))}"
    )


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


def _link(a: NicPort, b: NicPort, where: str) -> Link:
    if a.rail != b.rail or a.switch != b.switch:
        raise InputError(
            f"{where}: {a.label} (rail {a.rail}, {a.switch}) and {b.label} (rail {b.rail}, {b.switch}) are "
            "in different circuit domains; a circuit stays on one rail"
        )
    return Link(a, b)


def inventory_static(
    plan: StaticPlan, inventory: Inventory, unit: Unit = "gpu", rails: Sequence[int] | None = None
) -> list[SwitchPlan]:
    """The plan's graph on each of `rails` (default: the first rail that holds it): accelerator a = the
    rail's a-th accelerator, matching k on each accelerator's k-th port on that rail. Every circuit joins
    two ports of one rail."""
    where = f"{inventory.path or 'inventory'}"
    n, need, name = plan.graph.n, plan.ports_needed, plan.graph.name
    by_rail = rail_accelerators(inventory, unit)
    if rails is None:
        rails, _ = rail_share(inventory, n, unit, split=False, what=name)
    links: dict[str, list[Link]] = defaultdict(list)
    sources: dict[str, list[str]] = defaultdict(list)
    owned: set[NicPort] = set()
    for rail in rails:
        if rail not in by_rail:
            raise InputError(f"{where}: {name}: no rail {rail} (rails: {list(by_rail)})")
        accs = by_rail[rail][:n]
        if len(accs) < n:
            raise InputError(
                f"{where}: {name} needs {n} accelerators on rail {rail}; it has {len(by_rail[rail])}"
            )
        for acc in accs:
            if len(acc.ports) < need:
                raise InputError(
                    f"{where}: {name} needs {need} ports per accelerator on its rail (one per OCS matching); "
                    f"{acc.where} has {len(acc.ports)} ({', '.join(p.ifname for p in acc.ports)})"
                )
        switch = inventory.rail_switch(rail)
        links.setdefault(switch, [])
        for k, matching in enumerate(plan.matchings):
            for u, v in matching.edges:
                links[switch].append(_link(accs[int(u)].ports[k], accs[int(v)].ports[k], f"{where}: {name}"))
            sources[switch].append(f"rail {rail}: {matching.label}")
        owned.update(p for acc in accs for p in acc.ports[:need])
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
