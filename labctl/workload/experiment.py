"""`kind: replay` experiments: replay a trace on a lab, compiled to a plan of typed steps.

    name: replay-opus-testbed
    kind: replay
    trace: opus-testbed          # a built-in trace, or a trace file (relative to this file)
    mode: provisioning           # or on-demand
    switching_ms: 25             # every switch takes exactly this long (overrides the profile's range)
    ready: switch                # an op may start once the orchestrators acknowledged (switch), or once
                                 # every moved port carries traffic again (link: firmware link-up counts)
    steps: 2                     # steps to replay (default: the trace's)

The plan: the baseline (the circuits the trace's first rail operation needs, set on every rail and waited
for like any baseline), a hold, and one replay segment (`ReplaySegment`, this kind's own step type), with
the `gpu:` microbenchmarks before and after when the file asks for them. Per step the run records step
time, stall, each switch's exposed part and the G1/G2 waits (events `workload.*`, replay_steps.csv and
replay_ops.csv).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from rich.markup import escape

from labctl.core.clock import now_ns
from labctl.core.errors import InputError, LabctlError
from labctl.core.events import Kind
from labctl.core.units import fmt_ns
from labctl.core.yamlio import SourcedYaml, load_yaml, pydantic_error_line
from labctl.inventory.schema import Inventory
from labctl.inventory.topology import Link, pairs_links, ring_links
from labctl.models.switch import SwitchModel
from labctl.run.experiment import ExperimentKind, GpuSettings, Plan, RailPhase, SpecBase
from labctl.run.steps import GpuBench, Hold, Reconfigure, RunContext, Step, StepBase, check_program
from labctl.workload.circuits import JobCircuits, TopoState, initial_state, topo_id
from labctl.workload.orchestrator import JobOrchestrator
from labctl.workload.replay import LinksUp, ReplayEngine, ReplayResult
from labctl.workload.stall import switch_points
from labctl.workload.trace import Trace, get_trace


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class ReplayFaults(_Model):
    """Persistent switch failure, injected into the lab's switch models (simulated lab)."""

    refuse_changes: int = Field(ge=1, le=1_000_000, description="refuse this many of the next changes")
    after_writes: int = Field(
        default=1, ge=0, le=1_000_000, description="starting after this many topo writes"
    )


class SweepSettings(_Model):
    """Figure 10: the same replay at each switching delay, on demand and with provisioning."""

    switching_ms: list[Annotated[float, Field(ge=0, le=3_600_000)]] = Field(
        min_length=1, max_length=100, description="the switching delays to replay at, ms"
    )
    modes: list[Literal["provisioning", "on-demand"]] = Field(
        default=["on-demand", "provisioning"], min_length=1, description="the modes each delay is replayed in"
    )


class ReplaySpec(SpecBase):
    """A trace replay (the Figure 10 sweep is one with `sweep:`): the job's collectives and its topology
    writes, on the lab's rails."""

    kind: Literal["replay"] = Field(description="the experiment kind")
    trace: str = Field(
        min_length=1,
        max_length=4096,
        description="a built-in trace by name, or a trace file (relative to the experiment file first)",
    )
    mode: Literal["provisioning", "on-demand"] = Field(
        default="provisioning",
        description="provisioning: a topology change is asked for as soon as the phase before it ends "
        "(hidden by up to its idle window); on-demand: when the operation that needs it arrives",
    )
    switching_ms: float | None = Field(
        default=None,
        ge=0,
        le=3_600_000,
        description="every switch takes exactly this long, ms (overrides the profile's switching_ms range)",
    )
    ready: Literal["switch", "link"] = Field(
        default="switch",
        description="when an operation may start: switch, once the orchestrators acknowledged its circuits; "
        "link, once every moved port carries traffic again (the NIC firmware link-up counts)",
    )
    steps: int | None = Field(
        default=None, ge=1, le=100_000, description="steps to replay (default: the trace's)"
    )
    learn_steps: int = Field(
        default=0, ge=0, le=100_000, description="steps replayed on demand first (O1's table)"
    )
    time_scale: float = Field(default=1.0, gt=0, le=1000, description="multiply every trace time by this")
    retries: int = Field(
        default=2,
        ge=0,
        le=100,
        description="a failed topology change is retried this many times before the job falls back to the "
        "giant ring",
    )
    switch_timeout_s: float = Field(
        default=10.0, gt=0, le=3600, description="deadline for one topology change on the switches"
    )
    faults: ReplayFaults | None = Field(default=None, description="switch failures to inject (simulated lab)")
    sweep: SweepSettings | None = Field(default=None, description="run with `labctl replay sweep`")
    gpu: GpuSettings | None = Field(
        default=None, description="GPU microbenchmarks before the baseline and after the replay"
    )

    def profile_update(self) -> dict[str, Any]:
        """What this replay changes in the lab's delay profile."""
        if self.switching_ms is None:
            return {}
        return {"switching_ms": (self.switching_ms, self.switching_ms)}


@dataclass
class CompiledReplay:
    spec: ReplaySpec
    trace: Trace
    circuits: JobCircuits
    initial: TopoState

    async def run(self, host: RunContext) -> ReplayResult:
        models: list[SwitchModel] = []
        if self.spec.faults is not None:
            found = [getattr(sw, "model", None) for sw in host.lab.switches.values()]
            models = [m for m in found if isinstance(m, SwitchModel)]
            if len(models) != len(found):
                raise LabctlError(
                    "replay faults: this lab's switches are not behaviour models (simulated lab)"
                )
        faults = self.spec.faults
        injected: dict[int, int] = {}  # id(model) → the refusals it had before this replay added its own

        def on_write(n: int) -> None:
            if faults is not None and n == faults.after_writes:
                for model in models:
                    injected[id(model)] = model.refusals
                    model.refusals += faults.refuse_changes

        orch = JobOrchestrator(
            self.circuits,
            host.rails,
            self.initial,
            host.events.record,
            retries=self.spec.retries,
            switch_timeout_s=self.spec.switch_timeout_s,
            on_write=on_write,
        )
        links: LinksUp | None = host.links_up if self.spec.ready == "link" else None
        engine = ReplayEngine(
            self.trace,
            orch,
            host.events.record,
            mode=self.spec.mode,
            learn_steps=self.spec.learn_steps,
            links_up=links,
        )
        t0 = now_ns()
        host.events.emit(
            t0,
            Kind.WORKLOAD_REPLAY,
            "replay",
            self.trace.name,
            meta={
                "mode": self.spec.mode,
                "steps": len(self.trace.steps),
                "ready": self.spec.ready,
                "topo_id": topo_id(self.initial),
            },
        )
        fixed = self.spec.switching_ms
        result = ReplayResult(self.spec.mode, switch_ns=None if fixed is None else round(fixed * 1e6))
        host.results.append(result)  # kept, as far as it got, if the replay fails
        try:
            return await engine.run(result)
        finally:
            # The fault was this replay's: what is left of it must not refuse the baseline's restore.
            for model in models:
                if id(model) in injected:
                    model.refusals = min(model.refusals, injected[id(model)])


@dataclass(frozen=True, slots=True)
class ReplaySegment(StepBase):
    """Replay a trace's steps against the lab (labctl.workload.replay), from the baseline's circuits: its
    topology writes go through the run's rails (re-targeting the probes like any reconfiguration); its
    events carry no reconfiguration number (they are not link-up breakdown rows)."""

    needs_baseline: ClassVar[bool] = True
    replay: CompiledReplay

    async def execute(self, run: RunContext) -> None:
        run.events.reconfig = None
        run.progress.message(f"replaying {self.replay.trace.name} ({self.replay.spec.mode})")
        finished = False
        try:
            await self.replay.run(run)  # its result is in run.results, even a partial one
            finished = True
        finally:
            if not finished:
                run.unclean()
            await run.events.flush_durably()


def load_replay(path: Path | str, src: SourcedYaml | None = None) -> tuple[ReplaySpec, SourcedYaml, Trace]:
    """A replay experiment and its trace; `src`: the file as already read (`compile_experiment`'s)."""
    path = Path(path)
    src = src if src is not None else load_yaml(path, "experiment")
    try:
        spec = ReplaySpec.model_validate(src.data)
    except ValidationError as e:
        raise InputError(pydantic_error_line(src, e)) from None
    try:
        trace = get_trace(spec.trace, path.parent)
    except InputError as e:
        raise InputError(f"{src.where(('trace',))}: trace: {e}") from None
    if spec.time_scale != 1.0:
        try:
            trace = trace.scaled(spec.time_scale)
        except InputError as e:
            raise InputError(f"{src.where(('time_scale',))}: time_scale: {e}") from None
    if spec.steps is not None:
        trace = trace.with_steps(spec.steps)
    return spec, src, trace


def _links(circuits: JobCircuits, rail: int, state: TopoState) -> tuple[Link, ...]:
    """The links of a state on a rail (for the plan's host list and a person reading it)."""
    inv, out = circuits.inventory, []
    for s, owner in enumerate(state):
        if owner.dim == "pp":
            if owner.partner is not None and s < owner.partner:
                pairs = [
                    list(p)
                    for p in zip(circuits.stage_hosts[s], circuits.stage_hosts[owner.partner], strict=True)
                ]
                out += pairs_links(inv, rail, pairs, f"stage {s}")
        else:
            for group in circuits.groups(s, owner.dim):
                if len(group) == 2:
                    out += pairs_links(inv, rail, [group], f"stage {s}")
                elif len(group) > 2:
                    out += ring_links(inv, rail, group, f"stage {s}")
    return tuple(out)


def build_replay_plan(
    spec: ReplaySpec, trace: Trace, inventory: Inventory, src: SourcedYaml | None, path: Path | None
) -> Plan:
    """Resolve the job on the inventory, check every state the replay asks for, compile the program."""
    if spec.sweep is not None:
        at = src.where(("sweep",)) if src is not None else "sweep"
        raise InputError(
            f"{at}: sweep: a sweep of replays runs with `labctl replay sweep {path or '<file>'}`"
        )
    where = src.where(("trace",)) if src is not None else "trace"
    try:
        circuits = JobCircuits(trace.job, inventory, spec.rails)
        initial = initial_state(trace.job, (op for _, op in trace.rail_ops()))
        circuits.check_states([initial, *(p.after for p in switch_points(trace))])
        for rail in circuits.rails:
            circuits.giant_ring(rail)
    except InputError as e:
        raise InputError(f"{where}: {e}") from None
    phase = f"topo-{topo_id(initial)}"
    phases = {
        phase: {
            rail: RailPhase(
                rail,
                circuits.switch(rail),
                _links(circuits, rail, initial),
                circuits.rail_mapping(rail, initial),
            )
            for rail in circuits.rails
        }
    }
    replay = CompiledReplay(spec, trace, circuits, initial)
    gpu = spec.gpu is not None
    program: tuple[Step, ...] = (
        *([GpuBench("before")] if gpu else []),
        Reconfigure(phase, None, baseline=True),
        Hold(spec.hold_s),
        ReplaySegment(replay),
        *([GpuBench("after")] if gpu else []),
    )
    check_program(program, phases)
    return Plan(spec=spec, path=path, rails=circuits.rails, phases=phases, program=program)


def load_replay_plan(path: Path, inventory: Inventory) -> Plan:
    return _compile_read(path, load_yaml(path, "experiment"), inventory)


def _compile_read(path: Path, src: SourcedYaml, inventory: Inventory) -> Plan:
    spec, src, trace = load_replay(path, src)
    return build_replay_plan(spec, trace, inventory, src, path)


def _segment(plan: Plan) -> CompiledReplay:
    return next(s.replay for s in plan.program if isinstance(s, ReplaySegment))


def describe_replay(plan: Plan, inventory: Inventory) -> list[str]:
    """`labctl run --dry-run` of a replay: the baseline's topo_id and every switch the trace asks for, with
    its window and stages."""
    replay = _segment(plan)
    spec, trace = replay.spec, replay.trace
    points = switch_points(trace)
    lines = [
        f"{spec.name} on {inventory.lab}: replay {trace.name} ({len(trace.steps)} steps, {spec.mode}, ready: "
        f"{spec.ready}) on rails {list(plan.rails)}; baseline {plan.baseline}; {len(points)} topo writes; "
        "nothing is sent"
    ]
    for p in points:
        lines.append(
            f"  step {p.step} {p.op.label:>12}: topo_id {p.topo_id} (stages {list(p.stages)}), window "
            f"{fmt_ns(p.window_ns)}"
        )
    return lines


def _profile_update(spec: Any) -> dict[str, Any]:
    assert isinstance(spec, ReplaySpec)
    return spec.profile_update()


def record_replay(run_dir: Path, results: Sequence[Any]) -> dict[str, Any]:
    """The last replay's per-step and per-operation CSVs in the run directory; its summary for run.json
    and summary.json (`replay`)."""
    replays = [r for r in results if isinstance(r, ReplayResult)]
    if not replays:
        return {}
    result = replays[-1]
    result.write_csv(run_dir)
    return {"replay": result.summary()}


LATE_WARN_NS = 1_000_000


def replay_lines(summary: dict[str, Any]) -> list[str]:
    """What `labctl run` prints after a replay: step time against native, stall, waits, a fallback."""
    rep = summary.get("replay")
    if not rep:
        return []
    native, step = rep.get("native_ns") or 0, rep.get("step_ns") or 0
    n = rep["steps"]
    lines = [
        f"replay ({rep['mode']}), means over {n} step{'s' if n != 1 else ''} of "
        f"{rep['switches_per_step']:g} switches: step {fmt_ns(step)} vs native {fmt_ns(native)}"
        + (f" ({step / native:.3f}x)" if native else "")
        + f", stall {fmt_ns(rep['stall_ns'])} (model {fmt_ns(rep['model_stall_ns'])}); "
        f"lock waits in all: G1 {fmt_ns(rep['g1_wait_ns'])}, G2 {fmt_ns(rep['g2_wait_ns'])}"
    ]
    if rep.get("ideal_stall_ns") is not None and rep.get("overhead_per_switch_ns") is not None:
        # The model above takes the switch times the job saw; this one, the configured time alone.
        lines.append(
            f"  against switches of exactly the configured time and no control path: stall "
            f"{fmt_ns(rep['ideal_stall_ns'])}, so {fmt_ns(rep['overhead_per_switch_ns'])} of overhead "
            "a switch"
        )
    late, lag = rep.get("late_ns_max") or 0, rep.get("control_lag_ns_max") or 0
    if max(late, lag) > LATE_WARN_NS:
        # The replay's own lateness lands in the step times as if the switch had exposed it.
        lines.append(
            f"[yellow]replay ran late: woke up to {fmt_ns(late)} late, asked for circuits up to "
            f"{fmt_ns(lag)} after their boundary; stall and step times include it[/]"
        )
    fallback = rep.get("fallback")
    if fallback:
        failed = fallback.get("giant_ring_failed")
        status = fallback.get("status")
        head = f"[red]giant-ring fallback at topo_id {escape(str(fallback['at_topo_id']))}: "
        head += escape(str(fallback["error"]))
        if status in ("interrupted", "in progress"):
            tail = "; fallback interrupted: the rails may be part on the giant ring"
        elif failed:
            tail = f"; the giant ring failed too: {escape('; '.join(failed))}"
        else:
            tail = "; the job ran on the giant ring"
        lines.append(head + tail + "[/]")
    return lines


KIND = ExperimentKind(
    "replay",
    "a training job's trace replayed on the rails: its collectives, its topology writes, the stall each "
    "switch costs (decisions 0030-0037); with `sweep:`, the Figure 10 sweep (`labctl replay sweep`)",
    load_replay_plan,
    describe_replay,
    profile_update=_profile_update,
    record=record_replay,
    summary_lines=replay_lines,
    compile_read=_compile_read,
)
