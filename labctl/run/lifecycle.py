"""A whole `labctl run`: validate, build the lab, open the run directory, run the engine, close the record,
let the experiment kind record what its steps produced, analyse and draw.

Every input error surfaces before any I/O (no run directory is left behind by a bad file); whatever
happens after the directory exists, the events up to that moment stay on disk and run.json says how the
run ended.
"""

from __future__ import annotations

import asyncio
import logging
import random
import secrets
import shlex
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from labctl.analysis.catalog_record import write_record
from labctl.analysis.pool import FigureWorkers
from labctl.analysis.store import RunDir, new_run_id, versions
from labctl.core import sched
from labctl.core.clock import Timebase, now_ns
from labctl.core.events import Event, EventLog, Kind
from labctl.core.fileio import write_json_atomic
from labctl.core.registry import DEFAULT_EXPERIMENT_KIND
from labctl.core.shipped import builtin_inventory
from labctl.labs import build_lab, load
from labctl.labs.base import LabContext
from labctl.linux.timesync import clock_sync_state
from labctl.run.engine import NullProgress, RunEngine
from labctl.run.experiment import compile_experiment, experiment_kinds
from labctl.run.steps import ProgressSink, Stage

if TYPE_CHECKING:
    from labctl.inventory.schema import Inventory
    from labctl.run.experiment import Plan

log = logging.getLogger("labctl.run")
T = TypeVar("T")

TIMELINE_AHEAD_AFTER = 3
"""Reconfigurations done (the baseline's counted) after which the figure workers draw the timeline: it shows
the first after the baseline and nothing past the next one's command, on record once that one is done."""


@dataclass
class RunOutcome:
    run_dir: Path
    status: str
    error: str | None = None
    summary: dict[str, Any] = field(default_factory=dict)
    events: int = 0
    kind: str = DEFAULT_EXPERIMENT_KIND
    """The experiment kind that ran (its entry prints its own lines: `ExperimentKind.summary_lines`)."""
    switch_state: dict[str, dict[str, Any]] = field(default_factory=dict)
    """run.json `switch_state`: per switch, what it holds at the end against the baseline, and (where not
    on it) how to put it back (`restore`)."""
    figures_interrupted: bool = False
    """A signal came during the analysis of a finished run: its summary is written, its figures are not."""


@dataclass(frozen=True)
class RunInputs:
    """A run's two input files, each read once: the inventory loaded and the experiment compiled against it.
    `labctl run` reads them before its run and hands them down to `run_experiment`, which reads them itself
    for a caller that gives none (the scheduler's worker)."""

    inventory: Inventory
    plan: Plan

    @classmethod
    def read(cls, experiment: Path, inventory_path: Path) -> RunInputs:
        """The inventory, then the experiment against it: InputError (file:line) on the first bad one."""
        inventory = load(inventory_path)
        return cls(inventory, compile_experiment(experiment, inventory))


class _FiguresAhead:
    """The progress sink the engine reports to: the caller's, which also asks the figure workers to work
    out what the run's end needs once it is on record (`ask`: FigureWorkers.ahead): the timeline after
    TIMELINE_AHEAD_AFTER reconfigurations, the distributions and the summary after the last step's (their
    events fsynced: the engine reports a reconfiguration done after its flush)."""

    def __init__(self, inner: ProgressSink, ask: Callable[[str], None]) -> None:
        self.inner = inner
        self.ask = ask
        self.done = 0

    def started(self, run_dir: Path, steps: int) -> None:
        self.inner.started(run_dir, steps)

    def reconfig_started(self, stage: Stage, expected: int) -> None:
        self.inner.reconfig_started(stage, expected)

    def port_recovered(self, stage: Stage, recovered: int, expected: int) -> None:
        self.inner.port_recovered(stage, recovered, expected)

    def reconfig_done(self, stage: Stage, timed_out: list[str]) -> None:
        self.inner.reconfig_done(stage, timed_out)
        if stage.kind == "restore":
            return
        self.done += 1
        if self.done == TIMELINE_AHEAD_AFTER:
            self.ask("timeline")
        if stage.kind == "step" and stage.index == stage.of:
            self.ask("distributions")
            self.ask("summary")

    def message(self, text: str) -> None:
        self.inner.message(text)


def _git_describe() -> str | None:
    import subprocess

    try:
        out = subprocess.run(
            ["git", "describe", "--always", "--dirty"],
            capture_output=True,
            text=True,
            timeout=2,
            cwd=Path(__file__).parent,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def input_files(experiment: Path, inventory_path: Path) -> dict[str, Any]:
    """Which files a run ran, as absolute paths (run.json; `experiment_path`, `inventory_path` are as
    given), and whether the inventory is the built-in lab (a command's default where its directory has no
    inventory.yaml: labctl.core.shipped). Not resolved: in a clone the built-in files link to the
    repository's."""
    return {
        "experiment_file": str(experiment.absolute()),
        "inventory_file": str(inventory_path.absolute()),
        "inventory_builtin": inventory_path.absolute() == builtin_inventory().absolute(),
    }


def restore_file(run_dir: Path, switch: str) -> Path:
    """The mapping file (`labctl ocs apply`) that puts `switch` back on the run's baseline."""
    return run_dir / f"baseline-{switch}.yaml"


def _switch_state(engine: RunEngine, run_dir: Path, inventory_path: Path) -> dict[str, dict[str, Any]]:
    """The engine's `switch_state`, each switch not known to be on the baseline with its restore: a mapping
    file in the run directory (JSON, which is YAML) and the `labctl ocs apply` command that applies it."""
    state = engine.switch_state()
    for name, entry in state.items():
        if entry["on_baseline"]:
            continue
        path = restore_file(run_dir, name)
        try:
            write_json_atomic(path, {"patches": entry["baseline_patches"], "scope": entry["baseline_scope"]})
        except OSError as e:
            entry["restore"] = f"could not write {path.name}: {e.strerror}"
            continue
        entry["restore"] = (
            f"labctl ocs apply {shlex.quote(str(path))} --switch {shlex.quote(name)} "
            f"--inventory {shlex.quote(str(inventory_path))}"
        )
    return state


async def _to_the_end(aw: Awaitable[T]) -> T:
    """`aw` awaited to its end whatever cancels this task meanwhile (each is absorbed): for what must not be
    left half done (stopping worker processes)."""
    task = asyncio.ensure_future(aw)
    while True:
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.cancelled():
                raise
            _absorb_cancel()


def _absorb_cancel() -> None:
    """This task handled a cancellation itself: clear it, so later awaits are not cancelled."""
    task = asyncio.current_task()
    if task is not None:
        task.uncancel()


def _write_catalog_record(run_dir: Path) -> None:
    """The run's row of the catalogue (`labctl runs`), the last file its directory gets. It never fails the
    run: the catalogue indexes a run without one from its run.json (decision 0058)."""
    try:
        write_record(run_dir)
    except Exception:
        log.exception("could not write the run's catalogue record")


async def run_experiment(
    experiment: Path,
    inventory_path: Path,
    *,
    profile: str | None = None,
    out_dir: Path = Path("runs"),
    seed: int | None = None,
    progress: ProgressSink | None = None,
    plots: bool = True,
    plot_formats: Sequence[str] | None = None,
    rt_priority: int | None = None,
    inputs: RunInputs | None = None,
) -> RunOutcome:
    """Everything `labctl run` does: validate, run, analyse, plot. InputErrors surface before any I/O.
    `plot_formats`: what to draw the figures in (default: the experiment's `analysis.plot_formats`, png).
    An aborted run draws none: it stops now, and `labctl plot RUN` draws them on request. `rt_priority`:
    the event loop's thread at SCHED_FIFO while the experiment runs (labctl.core.sched; refused before
    anything is written where not permitted). `inputs`: the two files as the caller already read them
    (`RunInputs.read` of these paths); without them, they are read here."""
    progress = progress or NullProgress()
    if rt_priority is not None:
        sched.permitted(rt_priority)
    inputs = inputs or RunInputs.read(experiment, inventory_path)
    inventory, plan = inputs.inventory, inputs.plan
    kind = experiment_kinds.get(plan.kind)
    spec = plan.spec
    profile_obj = inventory.profile(profile)
    # A kind may fix part of the lab's timing (a replay's switching time, Figure 10's x-axis): the run
    # records the profile it ran on.
    profile_update = kind.profile_update(spec)
    if profile_update:
        profile_obj = profile_obj.model_copy(update=profile_update)
    profile_name = profile or inventory.model.profile
    seed = seed if seed is not None else secrets.randbits(32)
    # The lab is built before anything is written, so any input error leaves no run directory behind.
    # Whatever it emits before the event log exists (nothing today) is kept and recorded first.
    early: list[Event] = []
    sink: Callable[[Event], object] = early.append
    lab = build_lab(LabContext(inventory, profile_obj, random.Random(seed), lambda e: sink(e), spec.probes))
    timebase = Timebase.capture()
    run = RunDir.create(
        out_dir,
        new_run_id(spec.name),
        {
            "experiment": spec.model_dump(mode="json"),
            "experiment_path": str(experiment),
            "inventory": inventory.snapshot(),
            "inventory_path": str(inventory_path),
            **input_files(experiment, inventory_path),
            "profile": {"name": profile_name, **profile_obj.model_dump(mode="json")},
            "seed": seed,
            "timebase": {
                "clock": "CLOCK_MONOTONIC",
                "mono0_ns": timebase.mono0_ns,
                "wall0_ns": timebase.wall0_ns,
            },
            "clock_offsets": {},
            "time_sync": {"controller": clock_sync_state()},
            "versions": {**versions(), "git": _git_describe()},
            "started_wall_ns": timebase.wall0_ns,
        },
    )
    events = EventLog(run.events_path, timebase)
    events.emit(
        now_ns(),
        Kind.RUN_START,
        "controller",
        spec.name,
        meta={
            "run_id": run.meta["run_id"],
            "profile": profile_name,
            "seed": seed,
            "rx_power_threshold_dbm": spec.analysis.rx_power_threshold_dbm,
            # What carries the ping-pong that marks t5, and the QP attributes that shape its recovery.
            "transport": spec.probes.transport,
            **({"rdma": spec.probes.rdma.model_dump()} if spec.probes.transport == "rdma" else {}),
            # Where the breakdown takes t2 from (absent: the DOM), so every recomputation agrees.
            **({"t2_source": spec.analysis.t2_source} if spec.analysis.t2_source != "dom" else {}),
        },
    )
    for event in early:
        events.record(event)
    sink = events.record
    formats = tuple(plot_formats or spec.analysis.plot_formats) if plots else ()
    threshold = spec.analysis.rx_power_threshold_dbm
    # Figures are drawn by processes that import matplotlib while the experiment runs, each as soon as what
    # it shows is on record (labctl.analysis.pool), not after the run.
    workers = FigureWorkers()
    engine_progress = _FiguresAhead(progress, lambda what: workers.ahead(what, run.path, threshold, formats))
    engine = RunEngine(plan, inventory, lab, events, engine_progress)
    # From here on a signal (the CLI cancels this task) never leaves run.json `running`: before the engine
    # runs it aborts the run here; the engine absorbs its own (decision 0006); after it, the record is final
    # and what is left (analysis, figures, stopping the workers) finishes or is cut short, never half done.
    try:
        status: str = "aborted"
        error: str | None = "interrupted by signal before the experiment started"
        ran = False
        try:
            if formats:
                await workers.start()
            progress.started(run.path, len(plan.steps))
            ran = True
            status, error = "failed", "the run engine did not finish"
            with sched.realtime(rt_priority) as scheduling:
                if scheduling is not None:
                    run.update(scheduling=scheduling)
                status, error = await engine.run()
        except asyncio.CancelledError:
            if ran:  # the engine absorbs every cancellation: not reached
                raise
            _absorb_cancel()
            events.emit(now_ns(), Kind.RUN_ABORT, "controller", error)
        finally:
            if not ran:
                lab.close()
            events.emit(now_ns(), Kind.RUN_END, "controller", status, meta={"error": error})
            events.close()
            switch_state = _switch_state(engine, run.path, inventory_path)
            run.update(
                status=status,
                error=error,
                events=events.count,
                finished_wall_ns=Timebase.capture().wall0_ns,
                drops=dict(engine.drops),
                probes={p.name: p.stats() for p in lab.probes if hasattr(p, "stats")},
                loop_lag_ns=engine.loop_lag.stats(),
                switch_state=switch_state,
                **{**lab.meta, "time_sync": {**run.meta["time_sync"], **lab.meta.get("time_sync", {})}},
            )
        outcome = RunOutcome(
            run.path, status, error, events=events.count, kind=kind.name, switch_state=switch_state
        )
        # What the kind's steps produced (a replay's per-step CSVs), kept even for a run that failed midway.
        sections = kind.record(run.path, engine.results)
        if sections:
            run.update(**sections)
        try:
            summary = None
            if formats and status != "aborted":
                try:
                    summary = await workers.analyse(run.path, threshold, formats)
                except asyncio.CancelledError:  # stop drawing: the summary below, without figures
                    _absorb_cancel()
                    await _to_the_end(workers.close())
                    outcome.figures_interrupted = True
                    run.update(figures="not drawn: interrupted by a signal during the analysis")
            if summary is None:  # an aborted run stops now: no figures (`labctl plot RUN` draws them)
                from labctl.analysis.summary import analyse

                summary = analyse(run.path, threshold, plot_formats=())
            outcome.summary = summary
            if sections:
                outcome.summary.update(sections)
                write_json_atomic(run.path / "summary.json", outcome.summary)
        except Exception as e:  # the events are on disk: `labctl report` can recompute once this is fixed
            log.exception("analysis failed")
            cause = f"analysis failed: {type(e).__name__}: {e}"
            outcome.status, outcome.error = "failed", "; ".join(filter(None, [error, cause]))
            run.update(status=outcome.status, error=outcome.error)
            # The event log says so too: the run's last run.end is its outcome (the first one said how
            # the experiment ended, before its analysis).
            events.reopen()
            events.emit(now_ns(), Kind.RUN_FAULT, "controller", cause, meta={"stage": "analysis"})
            events.emit(now_ns(), Kind.RUN_END, "controller", "failed", meta={"error": outcome.error})
            events.close()
        _write_catalog_record(run.path)
        return outcome
    finally:
        # Always to its end, whatever more signals come: a worker left unreaped would outlive the loop.
        await _to_the_end(workers.close())
