"""What each rail holds, and the one path by which a run changes it.

`RailWriter.write` is where a run sends a mapping to a switch (through `labctl.ocs.protocol.send_mapping`,
which verifies it): a timeline's reconfigurations and baseline restore (the engine), a replayed job's
topology writes and its giant-ring fallback (labctl.workload.orchestrator), the scheduler's restore of a
crashed run's baseline. It remembers what each rail holds after the switch acknowledged, and only then
tells the run (`on_change`), which re-targets its probes: until then the old circuit is still probed, so
the moment its traffic stops is measured too. tests/unit/test_one_apply_path.py holds every other module
of a run to it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from labctl.core.tasks import concurrently
from labctl.inventory.mapping import Mapping as Patches
from labctl.inventory.mapping import MappingDiff, apply_diff, diff_mapping
from labctl.inventory.schema import Inventory, NicPort
from labctl.inventory.topology import peers_of, rail_scope
from labctl.ocs.protocol import ApplyResult, OpticalSwitch, Timed, send_mapping

RailChange = Callable[[int, Patches, Patches], Awaitable[None]]
"""Told after a rail changed (rail, patches before, after), once the switch acknowledged."""


class RailWriter:
    """The rails' switches, what each rail holds, and the one way to change it."""

    def __init__(
        self,
        switches: Mapping[int, OpticalSwitch],
        current: Mapping[int, Patches] | None = None,
        on_change: RailChange | None = None,
    ) -> None:
        self.switches = dict(switches)
        self.current: dict[int, Patches] = {rail: frozenset() for rail in self.switches}
        self.current.update(current or {})
        self.on_change = on_change
        self.touched = False
        """A switch was told to change: a run that fails from here on must restore its baseline."""
        self.unsure = False
        """A write was cut short (failed, timed out, cancelled): its switch may hold part of it while
        `current` still says what it held before, so a restore must not be skipped as "nothing moved"."""

    async def write(
        self,
        rail: int,
        patches: Collection[tuple[int, int]],
        *,
        scope: Collection[int],
        context: dict[str, Any] | None = None,
        timeout_s: float | None = None,
    ) -> Timed[ApplyResult]:
        """Make every port of `scope` on `rail`'s switch as `patches` says (the rest of the switch is left
        alone), verified; then remember the rail's new patches and tell `on_change`."""
        return await self._send([RailWrite(rail, patches, scope)], context or {}, timeout_s)

    async def write_rails(
        self,
        writes: Sequence[RailWrite],
        *,
        context: dict[str, Any] | None = None,
        timeout_s: float | None = None,
    ) -> list[Timed[ApplyResult] | Exception]:
        """Several rails at once, each rail's outcome in order (its result, or the Exception its switch
        raised). Rails on one switch go as one command: their ports are disjoint, so the union of their
        patches within the union of their scopes is the same change, and both rails' t0 and t1 are then the
        switch's own (two commands would stamp the second rail a command's worth of work later, and leave
        it waiting behind the first one's acknowledgement: decision 0054)."""
        groups: dict[int, list[RailWrite]] = {}
        for w in writes:
            groups.setdefault(id(self.switches[w.rail]), []).append(w)
        outcomes = await concurrently(
            [self._send(group, dict(context or {}), timeout_s) for group in groups.values()]
        )
        by_rail: dict[int, Timed[ApplyResult] | Exception] = {}
        for group, outcome in zip(groups.values(), outcomes, strict=True):
            for w in group:
                by_rail[w.rail] = outcome
        return [by_rail[w.rail] for w in writes]

    async def _send(
        self, group: list[RailWrite], context: dict[str, Any], timeout_s: float | None
    ) -> Timed[ApplyResult]:
        """The one send of a run: rails of one switch as one verified command. Its events carry the
        caller's context plus `rail` (one rail) or `rails` (several); what each rail holds is remembered
        and `on_change` told, rail by rail, once the switch acknowledged."""
        befores = [self.current[w.rail] for w in group]
        self.touched = True
        if len(group) == 1:
            patches: Collection[tuple[int, int]] = group[0].patches
            scope: Collection[int] = group[0].scope
            context = {**context, "rail": group[0].rail}
        else:
            patches = frozenset(p for w in group for p in w.patches)
            scope = frozenset(port for w in group for port in w.scope)
            context = {**context, "rails": [w.rail for w in group]}
        try:
            result = await send_mapping(
                self.switches[group[0].rail], patches, scope=scope, context=context, timeout_s=timeout_s
            )
        except BaseException:
            self.unsure = True
            raise
        afters = []
        for w, before in zip(group, befores, strict=True):
            after = apply_diff(before, diff_mapping(before, frozenset(w.patches), w.scope))
            self.current[w.rail] = after
            afters.append(after)
        if self.on_change is not None:
            for w, before, after in zip(group, befores, afters, strict=True):
                await self.on_change(w.rail, before, after)
        return result


@dataclass(frozen=True, slots=True)
class RailWrite:
    """One rail's part of `RailWriter.write_rails`: its patches within its scope (its ports on its switch)."""

    rail: int
    patches: Collection[tuple[int, int]]
    scope: Collection[int]


def moved_ports(
    inventory: Inventory, rail: int, before: Patches, after: Patches
) -> list[tuple[NicPort, NicPort | None]]:
    """The ports of `rail` whose peer differs between two mappings, with the new peer (None: dark)."""
    peers_before, peers_after = peers_of(inventory, rail, before), peers_of(inventory, rail, after)
    return [
        (port, peers_after[port])
        for port in sorted(peers_after, key=lambda p: p.source)
        if peers_before.get(port) != peers_after[port]
    ]


@dataclass(frozen=True)
class PlannedReconfig:
    """One reconfiguration of a plan, as the engine will carry it out (what `run --dry-run` prints)."""

    n: int
    phase: str
    step: int | None
    changes: dict[str, MappingDiff]  # switch → patches removed and added (against the previous phase)
    moved: list[tuple[str, str | None, str | None]]  # port source, peer before, peer after


def planned_reconfigurations(
    rails: Collection[int],
    phases: Mapping[str, Mapping[int, Any]],
    order: list[tuple[int | None, str]],
    inventory: Inventory,
) -> list[PlannedReconfig]:
    """Each reconfiguration of `order` ((step, phase), the baseline first, against dark switches; at run
    time, against what they hold), with each switch's patch diff and the ports whose peer changes.
    `phases[name][rail]` has `.switch` and `.mapping` (labctl.run.experiment.RailPhase). Touches nothing."""
    current: dict[int, Patches] = {rail: frozenset() for rail in rails}
    out = []
    for n, (step, phase) in enumerate(order):
        changes: dict[str, MappingDiff] = {}
        moved: list[tuple[str, str | None, str | None]] = []
        for rail, rp in phases[phase].items():
            diff = diff_mapping(current[rail], rp.mapping, rail_scope(inventory, rail))
            old = changes.get(rp.switch, MappingDiff(frozenset(), frozenset()))
            changes[rp.switch] = MappingDiff(old.remove | diff.remove, old.add | diff.add)
            before = peers_of(inventory, rail, current[rail])
            for port, now in moved_ports(inventory, rail, current[rail], rp.mapping):
                was = before.get(port)
                moved.append((port.source, was.source if was else None, now.source if now else None))
            current[rail] = rp.mapping
        out.append(PlannedReconfig(n, phase, step, changes, moved))
    return out
