"""`labctl run`: one experiment on a lab, with live progress and signal handling, and its summary printed.

`labctl report`, `compare` and `plot` read a run back (labctl/cli/report.py, compare.py, plot.py); the
tables all of them print are labctl/cli/tables.py."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape as markup_escape

from labctl.cli.common import (
    DEFAULT_INVENTORY,
    EXIT_ABORTED,
    RUNS,
    ExperimentArg,
    InventoryOpt,
    NoPlotsOpt,
    OutOpt,
    PlotFormatOpt,
    ProfileOpt,
    err,
    out,
    parse_plot_formats,
)

if TYPE_CHECKING:
    from labctl.run.lifecycle import RunInputs, RunOutcome
    from labctl.run.steps import Stage


class RichProgress:
    """Live progress on a terminal; one line per reconfiguration otherwise (CI logs, pipes)."""

    def __init__(self, first_lines: list[str] | None = None) -> None:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            SpinnerColumn,
            TextColumn,
            TimeElapsedColumn,
        )

        self.live = err.is_terminal
        self.bar = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=err,
            transient=False,
        )
        self.task: Any = None
        self.first_lines = first_lines or []
        """Said once the run has started, under its directory (which files it runs)."""
        self.run_dir: Path | None = None

    def started(self, run_dir: Path, steps: int) -> None:
        self.run_dir = run_dir
        # Printed once, here: a long run can be inspected (`labctl report`) while it goes.
        err.print(f"run directory: [bold]{run_dir}[/]")
        for line in self.first_lines:
            err.print(line, markup=False, highlight=False, soft_wrap=True)
        if self.live:
            self.bar.start()
            self.task = self.bar.add_task("starting", total=steps)

    def _describe(self, text: str) -> None:
        if self.live:
            self.bar.update(self.task, description=text)

    def reconfig_started(self, stage: Stage, expected: int) -> None:
        self._describe(f"{stage}: 0/{expected} ports back" if expected else str(stage))

    def port_recovered(self, stage: Stage, recovered: int, expected: int) -> None:
        self._describe(f"{stage}: {recovered}/{expected} ports back")

    def reconfig_done(self, stage: Stage, timed_out: list[str]) -> None:
        note = f"  [red]{len(timed_out)} ports timed out[/]" if timed_out else ""
        if self.live:
            if stage.kind == "step":
                self.bar.advance(self.task)
            if timed_out or stage.kind != "step":
                self.bar.console.print(f"{stage} done{note}")
        else:
            err.print(f"{stage} done{note}")

    def message(self, text: str) -> None:
        (self.bar.console if self.live else err).print(text)

    def stop(self) -> None:
        if self.live:
            self.bar.stop()


def _run_meta(run_dir: Path) -> dict[str, Any]:
    try:
        meta = json.loads((run_dir / "run.json").read_text())
    except (OSError, ValueError):
        return {}
    return meta if isinstance(meta, dict) else {}


class _Signals:
    """The signals `labctl run`'s loop received, and what each did (decision 0006, 0073)."""

    def __init__(self) -> None:
        self.hits = 0
        self.first: str | None = None


async def _run_with_signals(coro: Any, progress: RichProgress, signals: _Signals) -> Any:
    """Run the main coroutine; the first SIGINT/SIGTERM cancels it (the controller restores the baseline),
    a second one abandons the restore (the run then records what each switch holds, and how to restore it);
    later ones are said and ignored. Once the loop's handlers are gone again, labctl.cli.signals' take over:
    the run is on record by then."""
    import asyncio
    import signal

    from labctl.cli import signals as guard

    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(coro)

    def on_signal(name: str) -> None:
        signals.hits += 1
        signals.first = signals.first or name
        if not progress.run_dir:  # before the run's directory: its one line comes as it stops
            task.cancel()
            return
        if signals.hits == 1:
            progress.message(f"[yellow]{name}: stopping; restoring the baseline (send again to abandon)[/]")
        elif signals.hits == 2:
            progress.message(
                f"[red]{name}: abandoning the baseline restore; the run records what each switch holds[/]"
            )
        else:  # the controller ignores more: it is closing switches and writing the run directory
            progress.message(f"[red]{name}: finishing the run directory (SIGKILL stops at once)[/]")
            return
        task.cancel()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig.name)
    try:
        return await task
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        # What is left (the loop's close, the summary printed) is not the run's: one line, then exit 130.
        guard.guard(guard.Stage.NOTE, "{name}: the run is over and on record; exiting after its summary")


def switch_lines(state: dict[str, Any]) -> list[str]:
    """A line per switch not known to be on the run's baseline at its end: what it holds and how to put it
    back (run.json `switch_state`)."""
    lines = []
    for name, entry in state.items():
        if entry.get("on_baseline"):
            continue
        baseline = entry.get("baseline")
        held, wanted = entry.get("holds") or [], entry.get("baseline_patches") or []
        counts = f"{len(held)} patches on the run's ports, the baseline {len(wanted)}"
        if entry.get("on_baseline") is False and not entry.get("written"):
            what = (
                f"switch {name} is NOT on the baseline {baseline!r}: the run stopped before writing it, and "
                f"it holds what it held before: {counts} (run.json switch_state)"
            )
        elif entry.get("on_baseline") is False:
            what = (
                f"switch {name} is NOT on the baseline {baseline!r}: it holds {counts} (run.json "
                "switch_state)"
            )
        elif not entry.get("written"):
            what = (
                f"switch {name} was not written by this run ({entry.get('read')}): it may not be on the "
                f"baseline {baseline!r}"
            )
        else:
            what = f"what switch {name} holds is unknown ({entry.get('read')}): it may not be on {baseline!r}"
        if entry.get("in_process"):
            what += "; it was this process's simulated switch and ended with it"
        elif entry.get("restore"):
            what += f"; to restore it: {entry['restore']}"
        lines.append(what)
    return lines


def input_lines(experiment: Path, inventory: Path) -> list[str]:
    """The run's first lines: the experiment and inventory files it uses, and where the inventory is the
    built-in lab because this directory has none (labctl.core.shipped)."""
    from labctl.core.shipped import DEFAULT_INVENTORY, builtin_inventory

    lines = [f"experiment: {experiment.absolute()}"]
    # Not resolved: in a clone the built-in files are links to the repository's own.
    if inventory.absolute() == builtin_inventory().absolute():
        why = (
            f"no {DEFAULT_INVENTORY} in {Path.cwd()}"
            if not DEFAULT_INVENTORY.exists()
            else "given with --inventory"
        )
        lines.append(f"inventory: {inventory.absolute()} (the built-in simulated lab: {why})")
    else:
        lines.append(f"inventory: {inventory.absolute()}")
    return lines


@dataclass(frozen=True, slots=True)
class RunRequest:
    """What `labctl run` and `labctl tune` ask of one run, as their options parsed it."""

    experiment: Path
    inventory: Path
    profile: str | None = None
    out_dir: Path = RUNS
    seed: int | None = None
    plots: bool = True
    formats: tuple[str, ...] | None = None
    rt_priority: int | None = None
    inputs: RunInputs | None = None
    """The two files as the caller read them (else read once, here)."""


def execute(request: RunRequest) -> tuple[RunOutcome, bool]:
    """One experiment run with progress and signal handling, as `labctl run` and `labctl tune` do it: a
    signal before the run directory exists is one line and exit 130. Returns the outcome and whether a
    signal came during the run."""
    import asyncio

    from labctl.core import sched
    from labctl.run.lifecycle import RunInputs, run_experiment

    if request.rt_priority is not None:
        sched.permitted(request.rt_priority)  # refused before the files are read, as run_experiment alone did
    # once: run_experiment gets them, reads nothing again
    inputs = request.inputs or RunInputs.read(request.experiment, request.inventory)
    progress = RichProgress(input_lines(request.experiment, request.inventory))
    signals = _Signals()
    try:
        outcome = asyncio.run(
            _run_with_signals(
                run_experiment(
                    request.experiment,
                    request.inventory,
                    profile=request.profile,
                    out_dir=request.out_dir,
                    seed=request.seed,
                    progress=progress,
                    plots=request.plots,
                    plot_formats=request.formats,
                    rt_priority=request.rt_priority,
                    inputs=inputs,
                ),
                progress,
                signals,
            )
        )
    except asyncio.CancelledError:  # stopped before its run directory existed
        progress.stop()
        err.print(f"[red]aborted: {signals.first or 'signal'} before the run started; nothing was changed[/]")
        from labctl.cli import signals as guard

        guard.settle()
        raise typer.Exit(EXIT_ABORTED) from None
    finally:
        progress.stop()
    return outcome, bool(signals.hits)


def run(
    experiment: ExperimentArg,
    inventory: InventoryOpt = DEFAULT_INVENTORY,
    profile: ProfileOpt = None,
    out_dir: OutOpt = RUNS,
    seed: Annotated[
        int | None,
        typer.Option(
            min=0,
            max=2**63 - 1,
            help="Seed for the profile's modeled delays (recorded in run.json). It fixes the delays the "
            "model draws, not the measured times: those include real scheduling, so two runs with one seed "
            "differ by milliseconds.",
        ),
    ] = None,
    no_plots: NoPlotsOpt = False,
    plot_format: PlotFormatOpt = None,
    rt_priority: Annotated[
        int | None,
        typer.Option(
            "--rt-priority",
            min=1,
            max=99,
            help="Run the controller's event loop at SCHED_FIFO priority N while the experiment runs (root "
            "or CAP_SYS_NICE): its samplers' ticks then never wait for another process on their core. "
            "Figures and analysis keep ordinary scheduling. Recorded in run.json (`scheduling`).",
        ),
    ] = None,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="Check everything and print the mapping sequence with each reconfiguration's patch diff "
            "and moved ports; touch no switch, write nothing.",
        ),
    ] = False,
) -> None:
    """Run an experiment: sequence the OCS phases, time every affected port's recovery, write runs/<id>/.

    Writes run.json, events.jsonl, breakdown.csv/.parquet, summary.json, timeline and distributions as
    .png (--plot-format png,svg,pdf for more; matplotlib style: $LABCTL_MPLSTYLE, see `labctl plot
    --help`). Ctrl-C stops now: the baseline mapping is restored, the run is marked aborted and its
    analysis written; `labctl plot RUN` draws an aborted run's figures.
    """

    request = RunRequest(
        experiment,
        inventory,
        profile,
        out_dir,
        seed,
        plots=not no_plots,
        formats=parse_plot_formats(plot_format),
        rt_priority=rt_priority,
    )
    run_and_report(request, dry_run=dry_run)


def run_and_report(request: RunRequest, *, dry_run: bool = False) -> None:
    """`labctl run` once its options are parsed (and `labctl tune`'s, with the inputs it read): the run,
    then its tables and status line; exit 130 for a signal, 1 for a run that did not complete."""
    if dry_run:
        _dry_run(request)
        return
    outcome, signalled = execute(request)
    from labctl.cli.tables import clock_table, quality_lines, stall_lines, summary_table

    if outcome.summary.get("rows"):
        out.print(
            summary_table(
                outcome.summary,
                f"link-up breakdown ({outcome.summary.get('reconfigurations', 0)} "
                f"reconfigurations, {outcome.summary.get('rows', 0)} port rows)",
            )
        )
    from labctl.run.experiment import experiment_kinds

    kind_lines = experiment_kinds.get(outcome.kind).summary_lines(outcome.summary)
    if not outcome.summary.get("rows") and not kind_lines:  # failed before it measured anything
        out.print("no reconfiguration was measured")
    if outcome.summary.get("timed_out"):
        out.print(f"[red]{outcome.summary['timed_out']} port recoveries timed out[/]")
    meta = _run_meta(outcome.run_dir)
    for line in quality_lines(outcome.summary) + stall_lines(meta.get("probes") or {}):
        out.print(line, highlight=False)
    clocks = clock_table(meta)
    if clocks is not None:
        out.print(clocks)
    for caveat in outcome.summary.get("clock_caveats", []):
        out.print(f"[yellow]clock: {caveat}[/]", highlight=False)
    for line in kind_lines:  # what the experiment kind adds (a replay's step times and stall)
        out.print(line, highlight=False)
    # what the lab adds to the status line (an agents lab: replies it refused, decision 0072)
    notes = "; ".join(str(note) for note in meta.get("status_notes") or [])
    out.print(
        f"status: [bold]{outcome.status}[/]"
        + (f" ({outcome.error})" if outcome.error else "")
        + (f"; [red]{markup_escape(notes)}[/]" if notes else "")
    )
    for line in switch_lines(outcome.switch_state):
        out.print(f"[red]{line}[/]", highlight=False)
    if outcome.figures_interrupted:
        out.print(f"figures: not drawn (interrupted); `labctl plot {outcome.run_dir}` draws them")
    elif outcome.status == "aborted" and request.plots and outcome.summary.get("rows"):
        out.print(f"figures: not drawn for an aborted run; `labctl plot {outcome.run_dir}` draws them")
    from labctl.cli import signals as guard

    guard.settle()  # all is said: a signal from here to the exit is too late to change anything
    if outcome.status == "aborted" or signalled or guard.noted():
        raise typer.Exit(EXIT_ABORTED)
    if outcome.status != "completed":
        raise typer.Exit(1)


def _dry_run(request: RunRequest) -> None:
    """What the run would do, as its experiment kind describes its plan, and what the kind reads from the lab
    to check it (its `preview`: a tune run's ports' support); nothing is changed."""
    from labctl.run.experiment import experiment_kinds
    from labctl.run.lifecycle import RunInputs

    inputs = request.inputs or RunInputs.read(request.experiment, request.inventory)
    inventory, plan = inputs.inventory, inputs.plan
    profile = inventory.profile(request.profile)
    kind = experiment_kinds.get(plan.kind)
    for line in kind.describe(plan, inventory):
        out.print(line, markup=False, highlight=False)
    if kind.preview is None:
        return
    import asyncio

    lines, ok = asyncio.run(kind.preview(plan, inventory, profile))
    for line in lines:
        out.print(line, markup=False, highlight=False)
    if not ok:  # the run would stop at its first step, having changed nothing: as bad input does
        raise typer.Exit(2)


def register(app: typer.Typer) -> None:
    app.command()(run)
