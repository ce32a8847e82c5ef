"""Parallelism → circuits: who owns each PP stage's circuits (`topo_id`), and the sub-mapping per stage.

`topo_id` has one decimal digit per PP stage: 0 = PP owns the stage's circuits, 1 = DP, 2 = CP (Opus §4.1).
A PP digit also has a partner (the stage its pairs reach): a Send/Recv between stages s and t sets both
digits to 0 with each other as partner; a stage whose partner is taken by another pair keeps digit 0 but
has no circuits (its ports go dark) until an operation claims it; so does a PP stage whose partner turns
to DP or CP. DP/CP digits connect the stage's DP/CP
rings. A stage's sub-mapping is the patches whose ingress (transmit fiber) is one of the stage's ports on
the rail, so a change of some stages touches only those stages' ports (the other stages, and any other
job on the switch, keep their circuits).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from labctl.core.errors import InputError
from labctl.inventory.mapping import Mapping, validate_mapping
from labctl.inventory.schema import Inventory
from labctl.inventory.topology import Link, links_to_mapping, pairs_links, ring_links
from labctl.workload.trace import JobSpec, Op

DIGIT = {"pp": 0, "dp": 1, "cp": 2}


@dataclass(frozen=True, slots=True)
class StageOwner:
    dim: str  # pp, dp or cp
    partner: int | None = None  # pp only: the stage its pairs reach (None: no circuits)

    @property
    def digit(self) -> int:
        return DIGIT[self.dim]


TopoState = tuple[StageOwner, ...]


def topo_id(state: TopoState) -> str:
    return "".join(str(owner.digit) for owner in state)


def after_op(state: TopoState, op: Op) -> TopoState:
    """The stage ownership `op` needs, from `state`: only the op's stages change (and, for a PP pair, any
    stage whose partner it takes)."""
    owners = list(state)
    if op.group == "pp":
        s, t = op.stages
        for u, owner in enumerate(owners):
            if u not in (s, t) and owner.dim == "pp" and owner.partner in (s, t):
                owners[u] = StageOwner("pp", None)
        owners[s], owners[t] = StageOwner("pp", t), StageOwner("pp", s)
    else:
        for s in op.stages:
            owners[s] = StageOwner(op.group)
        for u, owner in enumerate(owners):
            if owner.dim == "pp" and owner.partner in op.stages:
                owners[u] = StageOwner("pp", None)  # its partner left PP: its pairs have no far end
    return tuple(owners)


def initial_state(job: JobSpec, ops: Iterable[Op]) -> TopoState:
    """What the baseline sets up: every stage DP, then as the first rail operation needs it."""
    state: TopoState = tuple(StageOwner("dp") for _ in range(job.pp))
    first = next((op for op in ops if op.on_rail), None)
    return after_op(state, first) if first is not None else state


def changed_stages(before: TopoState, after: TopoState) -> tuple[int, ...]:
    return tuple(s for s, (a, b) in enumerate(zip(before, after, strict=True)) if a != b)


class JobCircuits:
    """The job's circuits on every rail of an inventory: per stage and owner, the stage's sub-mapping."""

    def __init__(self, job: JobSpec, inventory: Inventory, rails: Sequence[int] | None = None) -> None:
        self.job = job
        self.inventory = inventory
        self.rails = tuple(rails) if rails is not None else tuple(inventory.rails)
        missing = [h for h in job.hosts if h not in inventory.model.hosts]
        if missing:
            raise InputError(
                f"job: host {missing[0]!r} is not in the inventory (hosts: {', '.join(inventory.hosts)})"
            )
        per_stage = job.dp * job.cp
        self.stage_hosts = [list(job.hosts[s * per_stage : (s + 1) * per_stage]) for s in range(job.pp)]
        for rail in self.rails:
            if rail not in inventory.rails:
                raise InputError(f"rail {rail} is not in the inventory {inventory.rails}")
            on_rail = inventory.rail_ports(rail)
            absent = [h for h in job.hosts if h not in on_rail]
            if absent:
                raise InputError(f"job: host {absent[0]!r} has no NIC port on rail {rail}")
        self._cache: dict[tuple[int, int, StageOwner], Mapping] = {}
        # Every topology write asks for these again (a replay's control path): worked out once each.
        self._rail_cache: dict[tuple[int, TopoState], Mapping] = {}
        self._ports_cache: dict[tuple[int, int], frozenset[int]] = {}

    def switch(self, rail: int) -> str:
        return self.inventory.rail_switch(rail)

    def groups(self, stage: int, dim: str) -> list[list[str]]:
        """The stage's DP groups (cp index fixed) or CP groups (dp index fixed), as host lists. Within a
        stage, node index = cp + dp * cp_degree (cp fastest)."""
        hosts, dp, cp = self.stage_hosts[stage], self.job.dp, self.job.cp
        if dim == "dp":
            return [[hosts[c + d * cp] for d in range(dp)] for c in range(cp)]
        return [[hosts[c + d * cp] for c in range(cp)] for d in range(dp)]

    def _links(self, rail: int, stage: int, owner: StageOwner) -> list[Link]:
        where = f"stage {stage} ({owner.dim})"
        if owner.dim == "pp":
            if owner.partner is None:
                return []
            pairs = [
                list(p) for p in zip(self.stage_hosts[stage], self.stage_hosts[owner.partner], strict=True)
            ]
            return pairs_links(self.inventory, rail, pairs, where)
        links: list[Link] = []
        for group in self.groups(stage, owner.dim):
            if len(group) == 2:
                links += pairs_links(self.inventory, rail, [group], where)
            elif len(group) > 2:
                links += ring_links(self.inventory, rail, group, where)
        return links

    def stage_ports(self, rail: int, stage: int) -> frozenset[int]:
        """The switch ports of the stage's NIC ports on the rail (transmit and receive fibers)."""
        known = self._ports_cache.get((rail, stage))
        if known is None:
            on_rail = self.inventory.rail_ports(rail)
            known = self._ports_cache[(rail, stage)] = frozenset(
                p for h in self.stage_hosts[stage] for port in on_rail[h] for p in (port.tx, port.rx)
            )
        return known

    def sub_mapping(self, rail: int, stage: int, owner: StageOwner) -> Mapping:
        """The stage's patches under `owner`: those whose ingress is one of the stage's ports."""
        key = (rail, stage, owner)
        known = self._cache.get(key)
        if known is None:
            switch = self.switch(rail)
            links = self._links(rail, stage, owner)
            full = links_to_mapping(self.inventory, switch, links, f"rail {rail} stage {stage}")
            txs = {port.tx for h in self.stage_hosts[stage] for port in self.inventory.rail_ports(rail)[h]}
            known = self._cache[key] = frozenset(p for p in full if p[0] in txs)
        return known

    def rail_mapping(self, rail: int, state: TopoState) -> Mapping:
        """The rail's whole mapping under `state`, validated as a matching."""
        known = self._rail_cache.get((rail, state))
        if known is None:
            patches = [p for s, owner in enumerate(state) for p in self.sub_mapping(rail, s, owner)]
            switch = self.switch(rail)
            known = validate_mapping(patches, self.inventory.switches[switch].space, switch=switch)
            self._rail_cache[(rail, state)] = known
        return known

    def giant_ring(self, rail: int) -> Mapping:
        """The fallback: one static ring through every host of the job on the rail (rank order)."""
        switch = self.switch(rail)
        hosts = list(self.job.hosts)
        links = (
            pairs_links(self.inventory, rail, [hosts], "giant ring")
            if len(hosts) == 2
            else ring_links(self.inventory, rail, hosts, "giant ring")
        )
        return links_to_mapping(self.inventory, switch, links, f"rail {rail} giant ring")

    def rail_scope(self, rail: int) -> set[int]:
        return {p for s in range(self.job.pp) for p in self.stage_ports(rail, s)}

    def check_states(self, states: Iterable[TopoState]) -> None:
        """Every state the replay will ask for is a valid matching on every rail (before anything moves)."""
        for state in set(states):
            for rail in self.rails:
                self.rail_mapping(rail, state)
