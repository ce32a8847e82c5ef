"""Experiment files (YAML) and the plan they compile to against an inventory.

An experiment names phases (circuits per rail), a baseline, a cycle of phases, and how many times to run
the cycle. Unknown fields are errors. `build_plan` resolves every phase on every rail into a validated
mapping per switch before anything is sent, so a bad experiment fails in full before the lab moves.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from labctl.core.errors import InputError
from labctl.core.registry import DEFAULT_EXPERIMENT_KIND, Registry
from labctl.core.yamlio import SourcedYaml, format_loc, load_yaml, pydantic_error_line
from labctl.inventory.mapping import Mapping
from labctl.inventory.profiles import Profile
from labctl.inventory.schema import Inventory
from labctl.inventory.topology import Link, links_to_mapping, pairs_links, ring_links
from labctl.probes.sampling import ProbeSettings
from labctl.run.rails import PlannedReconfig, planned_reconfigurations
from labctl.run.steps import Reconfigure, Step, check_program, timeline_program

__all__ = [  # the public surface (docs/architecture.md, "Public surface"); the rest is internal
    "AnalysisSettings",
    "ExperimentKind",
    "ExperimentSpec",
    "GpuSettings",
    "PhaseSpec",
    "Plan",
    "RailPhase",
    "RunSpec",
    "SpecBase",
    "VoaSweep",
    "build_plan",
    "compile_experiment",
    "describe_reconfigurations",
    "experiment_kind",
    "experiment_kinds",
    "load_experiment",
    "no_lines",
    "no_profile_update",
    "record_nothing",
]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class PhaseSpec(_Model):
    """Circuits of one phase on every rail of the experiment: exactly one of `pairs` or `ring`."""

    pairs: list[list[str]] | None = Field(
        default=None,
        description="pairs of hosts, e.g. [[h1, h2], [h3, h4]]: port i of the first host ↔ port i of the "
        "second, for each of their ports on the rail",
    )
    ring: list[str] | None = Field(
        default=None,
        description="hosts in ring order: port 2k+1 of each host ↔ port 2k of the next (the last wraps to "
        "the first), for each port pair k on the rail",
    )

    @model_validator(mode="after")
    def _one_kind(self) -> PhaseSpec:
        if (self.pairs is None) == (self.ring is None):
            raise ValueError("a phase needs exactly one of 'pairs' or 'ring'")
        return self


PlotFormat = Literal["png", "svg", "pdf"]  # labctl.analysis.figures.ALL_FORMATS


class AnalysisSettings(_Model):
    rx_power_threshold_dbm: float = Field(
        default=-10.0,
        ge=-60,
        le=30,
        description="Rx power at or above this counts as light back (t2); the Rx-power probes always report "
        "its crossings",
    )
    plot_formats: list[PlotFormat] = Field(
        default=["png"],
        min_length=1,
        max_length=3,
        description="the formats a run draws its timeline and distributions in on its way out (png; svg "
        "and pdf for LaTeX cost ~4x as long: also `labctl plot RUN --format svg,pdf` afterwards)",
    )
    t2_source: Literal["dom", "power-meter", "auto"] = Field(
        default="dom",
        description="where t2 (light back) comes from: each port's transceiver DOM, a power meter channel "
        "tapping its receive fiber (inventory power_meters:), or auto (the meter where one taps it)",
    )


class GpuSettings(_Model):
    """GPU microbenchmarks run as a step of the experiment, before the baseline set-up and after the last
    reconfiguration (labctl.probes.gpu.step; decision 0014). Needs the `[gpu]` extra and a CUDA GPU on the
    controller's machine; without one the step is skipped and recorded as a `gpu.skip` event."""

    device: int = Field(default=0, ge=0, le=1023, description="CUDA device on the controller's machine")
    peer_device: int | None = Field(
        default=None,
        ge=0,
        le=1023,
        description="second GPU for inter-GPU ping-pong; default: first with peer access",
    )
    inter_gpu: bool = Field(
        default=True, description="also ping-pong between `device` and its peer, when there is one"
    )
    stages: list[Literal["before", "after"]] = Field(
        default=["before", "after"],
        min_length=1,
        description="when the benchmarks run: before the baseline set-up, after the last reconfiguration",
    )
    iterations: int = Field(default=10_000, ge=10, le=10_000_000, description="timed round trips per variant")
    warmup: int = Field(default=2_000, ge=0, le=10_000_000, description="untimed round trips first")
    variants: list[Literal["flip-volatile", "flip-atomic", "rwlr-volatile", "rwlr-atomic"]] = Field(
        default=["flip-volatile", "flip-atomic", "rwlr-volatile", "rwlr-atomic"],
        min_length=1,
        description="the ping-pong variants: flip (one flag word both sides poll and write) or rwlr (remote "
        "write, local read), with volatile or atomic (acquire/release) flag accesses",
    )
    pointer_chase: bool = Field(
        default=True, description="also time pointer chasing (shared memory, L1, L2, HBM latency)"
    )


class VoaSweep(_Model):
    """An attenuation sweep on a switch's variable optical attenuators (decision 0064): repetition r of the
    cycle runs with `ports` attenuated by `atten_db[r]` (cycling when there are more repetitions than
    levels); the run ends with them at 0 dB. The driver must have attenuators (sim, polatis-netconf)."""

    switch: str = Field(description="the inventory switch whose attenuators are set")
    ports: list[Annotated[int, Field(ge=1, le=65535)]] = Field(
        min_length=1, description="egress ports of that switch (a NIC's rx port): attenuators sit on egress"
    )
    atten_db: list[Annotated[float, Field(ge=0, le=40)]] = Field(
        min_length=1,
        max_length=10_000,
        description="the attenuation per repetition of the cycle, dB below the light the patch brings",
    )


_NAME_OK = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
MAX_RECONFIGURATIONS = 1_000_000  # repeat x cycle: a week of back-to-back 0.5 s reconfigurations


class SpecBase(_Model):
    """The fields every experiment kind shares (a timeline's phases, a replay's trace come on top):
    `kind` names its entry in the experiment-kind registry (labctl.core.registry.EXPERIMENT_KINDS)."""

    name: str = Field(
        min_length=1,
        max_length=80,
        description="the experiment's name, part of each run directory's name: letters, digits, '.', '_' "
        "and '-', starting with a letter or digit",
    )

    @field_validator("name")
    @classmethod
    def _name_is_a_directory_name(cls, name: str) -> str:
        # It becomes part of the run directory's name: no path separators, no leading dot.
        if not _NAME_OK.match(name):
            raise ValueError("use letters, digits, '.', '_' and '-', starting with a letter or digit")
        return name

    description: str = Field(default="", description="what the experiment measures, in a line")
    rails: list[Annotated[int, Field(ge=0, le=1023)]] | None = Field(
        default=None, description="default: every rail of the inventory"
    )
    recovery_timeout_s: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="per reconfiguration: a port not back by then is recorded as timed out",
    )
    hold_s: float = Field(
        default=0.5, ge=0, le=3600, description="traffic keeps flowing this long after each full recovery"
    )
    probes: ProbeSettings = Field(default=ProbeSettings(), description="probe rates and reporting")
    analysis: AnalysisSettings = Field(
        default=AnalysisSettings(), description="how the run's events are analysed and plotted"
    )
    gpu: GpuSettings | None = Field(
        default=None, description="GPU microbenchmarks before the baseline and after the last reconfiguration"
    )


class ExperimentSpec(SpecBase):
    """A timeline experiment: a baseline, then a cycle of phases repeated (the main job)."""

    kind: Literal["timeline"] = Field(
        default="timeline", exclude=True, description="the experiment kind (timeline when left out)"
    )
    phases: dict[str, PhaseSpec] = Field(min_length=1, description="circuit phases by name")
    baseline: str = Field(description="the phase set up first (and restored at the end)")
    cycle: list[str] = Field(
        min_length=1, description="the phases reconfigured to, in order, after the baseline"
    )
    repeat: int = Field(default=1, ge=1, le=MAX_RECONFIGURATIONS, description="how many times the cycle runs")
    voa: list[VoaSweep] = Field(
        default=[],
        max_length=64,
        description="attenuation sweeps: each repetition of the cycle first sets these attenuators to its "
        "level (e.g. [{switch: ocs1, ports: [33], atten_db: [0, 5, 10]}])",
    )

    @model_validator(mode="after")
    def _probes_know_the_threshold(self) -> ExperimentSpec:
        """The Rx-power probe reports every crossing of the analysis threshold (so the optical mark is the
        first sample at or above it); the threshold is written once, under `analysis:`."""
        threshold = self.analysis.rx_power_threshold_dbm
        if self.probes.rx_power_threshold_dbm not in (None, threshold):
            raise ValueError(
                "probes.rx_power_threshold_dbm: set analysis.rx_power_threshold_dbm instead (probes use it)"
            )
        probes = self.probes.model_copy(update={"rx_power_threshold_dbm": threshold})
        object.__setattr__(self, "probes", probes)
        return self

    @model_validator(mode="after")
    def _bounded_plan(self) -> ExperimentSpec:
        n = self.repeat * len(self.cycle)
        if n > MAX_RECONFIGURATIONS:
            raise ValueError(
                f"repeat x cycle is {n} reconfigurations; at most {MAX_RECONFIGURATIONS} fit one run "
                "(split it into scheduled runs)"
            )
        return self


@dataclass(frozen=True)
class RailPhase:
    """One phase on one rail: its links and the mapping for the rail's switch."""

    rail: int
    switch: str
    links: tuple[Link, ...]
    mapping: Mapping


class RunSpec(Protocol):
    """What the controller reads of any experiment kind (a timeline ExperimentSpec, a replay's spec)."""

    @property
    def name(self) -> str: ...
    @property
    def recovery_timeout_s(self) -> float: ...
    @property
    def hold_s(self) -> float: ...
    @property
    def probes(self) -> ProbeSettings: ...
    @property
    def analysis(self) -> AnalysisSettings: ...
    @property
    def gpu(self) -> GpuSettings | None: ...

    def model_dump(self, *, mode: str = ...) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Plan:
    """An experiment compiled against an inventory: everything the controller needs, validated.

    `program` is the checked sequence of typed steps the controller executes (labctl.run.steps); a
    timeline experiment's is the fixed order it always had (GPU before, baseline, hold, per step
    reconfigure + hold, GPU after)."""

    spec: RunSpec
    path: Path | None
    rails: tuple[int, ...]
    phases: dict[str, dict[int, RailPhase]]
    program: tuple[Step, ...] = ()
    kind: str = DEFAULT_EXPERIMENT_KIND
    """The experiment kind it was compiled from (its registry entry records and reports the run)."""

    def __post_init__(self) -> None:
        check_program(self.program, self.phases)

    def planned(self, inventory: Inventory) -> list[PlannedReconfig]:
        """The baseline set-up (against dark switches: at run time, against what they hold) and every
        reconfiguration after it, with each switch's patch diff and the ports whose peer changes."""
        order: list[tuple[int | None, str]] = [(None, self.baseline), *self.steps]
        return planned_reconfigurations(self.rails, self.phases, order, inventory)

    @property
    def baseline(self) -> str:
        """The phase the plan sets up first and restores at the end."""
        return next(s.phase for s in self.program if isinstance(s, Reconfigure) and s.baseline)

    @property
    def steps(self) -> list[tuple[int, str]]:
        """(step index, phase name) for every reconfiguration after the baseline."""
        return [(s.step, s.phase) for s in self.program if isinstance(s, Reconfigure) and s.step is not None]

    @property
    def hosts(self) -> set[str]:
        return {
            port.host
            for by_rail in self.phases.values()
            for rp in by_rail.values()
            for link in rp.links
            for port in (link.a, link.b)
        }


def load_experiment(path: Path | str, src: SourcedYaml | None = None) -> tuple[ExperimentSpec, SourcedYaml]:
    """A timeline experiment, validated; `src`: the file as already read (`compile_experiment` reads once)."""
    path = Path(path)
    src = src if src is not None else load_yaml(path, "experiment")
    try:
        spec = ExperimentSpec.model_validate(src.data)
    except ValidationError as e:
        raise InputError(pydantic_error_line(src, e)) from None
    for field, names in (("baseline", [spec.baseline]), ("cycle", spec.cycle)):
        for i, name in enumerate(names):
            if name not in spec.phases:
                loc = (field,) if field == "baseline" else (field, i)
                raise InputError(
                    f"{src.where(loc)}: {format_loc(loc)}: unknown phase {name!r} "
                    f"(defined: {', '.join(spec.phases)})"
                )
    return spec, src


def build_plan(spec: ExperimentSpec, inventory: Inventory, src: SourcedYaml | None = None) -> Plan:
    """Resolve every phase on every rail to links and a validated mapping."""

    def where(*loc: Any) -> str:
        return f"{src.where(loc)}: {format_loc(loc)}" if src is not None else format_loc(loc)

    rails = tuple(spec.rails) if spec.rails is not None else tuple(inventory.rails)
    for i, rail in enumerate(rails):
        if rail not in inventory.rails:
            raise InputError(f"{where('rails', i)}: rail {rail} is not in the inventory {inventory.rails}")
    phases: dict[str, dict[int, RailPhase]] = {}
    for name, phase in spec.phases.items():
        by_rail = {}
        for rail in rails:
            switch = inventory.rail_switch(rail)
            if phase.pairs is not None:
                links = pairs_links(inventory, rail, phase.pairs, where("phases", name, "pairs"))
            else:
                assert phase.ring is not None
                links = ring_links(inventory, rail, phase.ring, where("phases", name, "ring"))
            mapping = links_to_mapping(inventory, switch, links, where("phases", name))
            by_rail[rail] = RailPhase(rail, switch, tuple(links), mapping)
        phases[name] = by_rail
    sweeps = []
    for i, sweep in enumerate(spec.voa):
        if sweep.switch not in inventory.switches:
            raise InputError(
                f"{where('voa', i, 'switch')}: unknown switch {sweep.switch!r} "
                f"(known: {', '.join(inventory.switches)})"
            )
        space = inventory.switches[sweep.switch].space
        for j, port in enumerate(sweep.ports):
            if not space.is_egress(port):
                raise InputError(
                    f"{where('voa', i, 'ports', j)}: port {port} is not an egress port of {sweep.switch} "
                    f"({space}: egress {space.egress.start}..{space.egress.stop - 1}); attenuators sit on "
                    "egress ports"
                )
        sweeps.append((sweep.switch, tuple(sorted(set(sweep.ports))), tuple(sweep.atten_db)))
    steps = [(rep, name) for rep in range(spec.repeat) for name in spec.cycle]
    program = timeline_program(spec.baseline, steps, spec.hold_s, gpu=spec.gpu is not None, sweeps=sweeps)
    return Plan(spec=spec, path=src.path if src else None, rails=rails, phases=phases, program=program)


def describe_reconfigurations(plan: Plan, inventory: Inventory) -> list[str]:
    """Any kind's `labctl run --dry-run`: every reconfiguration of its plan, each switch's patch diff and
    the ports whose peer changes (the baseline against dark switches; at run time, against what they
    hold)."""
    planned = plan.planned(inventory)
    spec = plan.spec
    header = (
        f"{spec.name} on {inventory.lab} ({inventory.kind}): {len(planned)} reconfigurations "
        f"(baseline {plan.baseline}, then {len(plan.steps)} more), rails {list(plan.rails)}, "
        f"recovery timeout {spec.recovery_timeout_s:g} s, hold {spec.hold_s:g} s; nothing is sent"
    )
    return [header, *_reconfiguration_lines(planned)]


def _reconfiguration_lines(planned: list[PlannedReconfig]) -> list[str]:
    lines: list[str] = []
    for r in planned:
        label = (
            "baseline (diff against dark switches; at run time, against what they hold)"
            if r.n == 0
            else f"step {r.step}"
        )
        lines += ["", f"reconfig {r.n} → {r.phase}  {label}: {len(r.moved)} ports get a new peer"]
        for switch, diff in r.changes.items():
            removed = " ".join(f"{i}→{e}" for i, e in sorted(diff.remove)) or "—"
            added = " ".join(f"{i}→{e}" for i, e in sorted(diff.add)) or "—"
            lines += [f"  {switch}: remove {removed}", f"  {' ' * len(switch)}  add    {added}"]
        lines += [f"    {source}: {was or '(dark)'} → {now or '(dark)'}" for source, was, now in r.moved]
    return lines


def no_profile_update(spec: Any) -> dict[str, Any]:
    """A kind that leaves the lab's delay profile as the inventory and `--profile` say."""
    return {}


def record_nothing(run_dir: Path, results: Sequence[Any]) -> dict[str, Any]:
    """A kind whose steps produce nothing beyond the event log."""
    return {}


def no_lines(summary: dict[str, Any]) -> list[str]:
    return []


@dataclass(frozen=True)
class ExperimentKind:
    """An experiment kind's registry entry (labctl.core.registry.EXPERIMENT_KINDS): how a file of that kind
    compiles against an inventory to the plan of typed steps the run engine executes, and what the kind
    adds around a run. A new kind is its spec (on `SpecBase`), this entry and a line in the registry; the
    engine, `labctl run` and its `--dry-run` do not change."""

    name: str
    description: str
    compile: Callable[[Path, Inventory], Plan]
    describe: Callable[[Plan, Inventory], list[str]] = describe_reconfigurations
    """What `labctl run --dry-run` prints of a compiled plan (plain text lines; nothing is sent)."""
    profile_update: Callable[[Any], dict[str, Any]] = no_profile_update
    """What the kind's spec changes in the lab's delay profile for this run (recorded in run.json)."""
    record: Callable[[Path, Sequence[Any]], dict[str, Any]] = record_nothing
    """Writes what the steps produced (the engine's `results`) into the run directory; returns sections
    added to run.json and summary.json."""
    summary_lines: Callable[[dict[str, Any]], list[str]] = no_lines
    """What `labctl run` prints after the breakdown table for a run of this kind (rich markup)."""
    compile_read: Callable[[Path, SourcedYaml, Inventory], Plan] | None = None
    """`compile` for a file `compile_experiment` has already read (its YAML, with file:line), so that one
    run reads its experiment file once. A kind without it is compiled by `compile`, which reads it again."""
    preview: Callable[[Plan, Inventory, Profile], Coroutine[Any, Any, tuple[list[str], bool]]] | None = None
    """What `--dry-run` reads from the lab after `describe` (reads only: a tune run's ports' support for its
    settings), and whether the run could go ahead; a kind without it reads nothing."""


def _describe_timeline(plan: Plan, inventory: Inventory) -> list[str]:
    spec = plan.spec
    assert isinstance(spec, ExperimentSpec)
    planned = plan.planned(inventory)
    header = (
        f"{spec.name} on {inventory.lab} ({inventory.kind}): {len(planned)} reconfigurations "
        f"(baseline {spec.baseline}, then {spec.repeat} x {' → '.join(spec.cycle)}), "
        f"rails {list(plan.rails)}, recovery timeout {spec.recovery_timeout_s:g} s, hold {spec.hold_s:g} s; "
        "nothing is sent"
    )
    return [header, *_reconfiguration_lines(planned)]


def _compile_timeline(path: Path, inventory: Inventory) -> Plan:
    return _compile_timeline_read(path, load_yaml(path, "experiment"), inventory)


def _compile_timeline_read(path: Path, src: SourcedYaml, inventory: Inventory) -> Plan:
    spec, src = load_experiment(path, src)
    return build_plan(spec, inventory, src)


KIND = ExperimentKind(
    "timeline",
    "a baseline, then a cycle of circuit phases, each reconfiguration's link-up measured (the main job)",
    _compile_timeline,
    _describe_timeline,
    compile_read=_compile_timeline_read,
)
experiment_kinds: Registry[ExperimentKind] = Registry(
    "experiment kind", "labctl.experiment_kinds", ExperimentKind
)


def experiment_kind(path: Path | str) -> ExperimentKind:
    """The kind an experiment file names (`kind:`; default: timeline), from the registry."""
    return kind_named(load_yaml(Path(path), "experiment"))


def kind_named(src: SourcedYaml) -> ExperimentKind:
    """The kind a read experiment file names (`kind:`; default: timeline), from the registry."""
    name = src.data.get("kind", DEFAULT_EXPERIMENT_KIND) if isinstance(src.data, dict) else None
    if name is None:
        name = DEFAULT_EXPERIMENT_KIND  # not a mapping: the kind's own loader says what is wrong
    if not isinstance(name, str) or name not in experiment_kinds:
        raise InputError(
            f"{src.where(('kind',))}: kind: {name!r} is not an experiment kind "
            f"(known: {', '.join(experiment_kinds.names())})"
        )
    return experiment_kinds.get(name)


def compile_experiment(path: Path | str, inventory: Inventory) -> Plan:
    """Any experiment kind, compiled to a plan of typed steps against the inventory. The file is read once
    where its kind has `compile_read`."""
    path = Path(path)
    src = load_yaml(path, "experiment")
    kind = kind_named(src)
    plan = kind.compile_read(path, src, inventory) if kind.compile_read else kind.compile(path, inventory)
    return replace(plan, kind=kind.name)
