"""What a run touches (its OCS ports and hosts), and which due runs may start now."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar


# -- what a run touches ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Resources:
    """OCS ports (switch, port) and hosts a run holds exclusively while it runs."""

    ports: frozenset[tuple[str, int]]
    hosts: frozenset[str]

    def overlaps(self, other: Resources) -> bool:
        return bool(self.ports & other.ports) or bool(self.hosts & other.hosts)

    def to_json(self) -> dict[str, Any]:
        return {"ports": sorted([list(p) for p in self.ports]), "hosts": sorted(self.hosts)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Resources:
        return cls(frozenset((str(s), int(p)) for s, p in data["ports"]), frozenset(data["hosts"]))

    @classmethod
    def union(cls, items: Iterable[Resources]) -> Resources:
        ports: set[tuple[str, int]] = set()
        hosts: set[str] = set()
        for r in items:
            ports |= r.ports
            hosts |= r.hosts
        return cls(frozenset(ports), frozenset(hosts))


@dataclass(frozen=True)
class Declaration:
    """What an experiment on an inventory will touch, and the baseline to restore if its run dies."""

    name: str
    resources: Resources
    baseline: dict[str, dict[str, list[Any]]]  # switch → {"mapping": [[in, out]...], "scope": [...]}


def declare(experiment: Path, inventory_path: Path) -> Declaration:
    """Validate the experiment against the inventory (InputError on bad input) and derive its resources."""
    from labctl.inventory.topology import rail_scope
    from labctl.labs import load
    from labctl.run.experiment import compile_experiment

    inventory = load(inventory_path)
    plan = compile_experiment(experiment, inventory)  # any kind: a timeline, a replay
    ports: set[tuple[str, int]] = set()
    mappings: dict[str, set[tuple[int, int]]] = {}
    scopes: dict[str, set[int]] = {}
    for rail, rp in plan.phases[plan.baseline].items():
        scope = rail_scope(inventory, rail)
        ports |= {(rp.switch, p) for p in scope}
        mappings.setdefault(rp.switch, set()).update(rp.mapping)
        scopes.setdefault(rp.switch, set()).update(scope)
    return Declaration(
        name=plan.spec.name,
        resources=Resources(frozenset(ports), frozenset(plan.hosts)),
        baseline={
            sw: {"mapping": [[a, b] for a, b in sorted(mappings[sw])], "scope": sorted(scopes[sw])}
            for sw in mappings
        },
    )


# -- which runs start ------------------------------------------------------------------------------------
class Holder(Protocol):
    """A queued or running run (`store.RunRow`), as far as `pick` looks at it."""

    @property
    def resources(self) -> Resources: ...


H = TypeVar("H", bound=Holder)


def pick(due: list[H], running: list[H]) -> list[H]:
    """Which due runs to start now. `due` is in start order (priority, due time, submission).

    Conservative backfill: walking down the order, a run starts if its resources are free of every running
    run and of every run ahead of it that is still waiting; a waiting run reserves its resources against
    everything behind it. So a lower-priority run only ever uses resources no higher-priority run wants.
    """
    claimed = Resources.union(r.resources for r in running)
    start: list[H] = []
    for row in due:
        if not row.resources.overlaps(claimed):
            start.append(row)
        claimed = Resources.union([claimed, row.resources])
    return start
