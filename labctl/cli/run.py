"""`labctl run` (one experiment on a lab), `labctl report` and `labctl plot` (read a run back)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape as markup_escape

from labctl.cli.common import (
    DEFAULT_INVENTORY,
    EXIT_ABORTED,
    RUNS,
    ExperimentArg,
    ExperimentFilter,
    InventoryOpt,
    JsonOpt,
    LabFilter,
    NoPlotsOpt,
    OutOpt,
    PlotFormatOpt,
    ProfileFilter,
    ProfileOpt,
    SinceFilter,
    StatusFilter,
    err,
    filters,
    out,
    parse_plot_formats,
)
from labctl.core.errors import InputError

if TYPE_CHECKING:
    from rich.table import Table

    from labctl.analysis.catalog import Filters
    from labctl.run.lifecycle import RunOutcome
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


def _rate_label(key: str) -> str:
    """`samples_per_s_per_port` → `samples per port`, `pings_per_s` → `pings`."""
    return key.replace("_per_s_per_port", " per port").replace("_per_s", "").replace("_", " ")


UNIT_LABELS = {"switch command": "sw cmd", "circuit end": "circ. end"}

STAT_COLUMNS = ("min", "median", "p95", "max")


def _summary_table(summary: dict[str, Any], title: str) -> Table:
    """One row per phase: its unit and n (flagged values are not in n), the spread, and the median with
    its 95% confidence interval (the caption says what the interval resampled). Each time column is in one
    unit, chosen for its values and named in its header; the CI is in the median's unit."""
    from rich.table import Table

    from labctl.core.units import UnitColumn

    phases = summary.get("phases", {})
    units = {stat: UnitColumn.of(s.get(stat) for s in phases.values()) for stat in STAT_COLUMNS}
    table = Table(title=title, title_justify="left", caption=ci_caption(summary), caption_justify="left")
    headers = (
        "phase",
        "unit",
        "n",
        units["min"].header("min"),
        units["median"].header("median"),
        units["median"].header("95% CI"),
        units["p95"].header("p95"),
        units["max"].header("max"),
        "flagged",
    )
    for col in headers:
        table.add_column(col, justify="left" if col in ("phase", "unit") else "right", no_wrap=True)
    for name, stats in phases.items():
        flagged = (stats.get("impossible") or 0) + (stats.get("unresolved") or 0)
        unit = stats.get("unit", "port row")
        table.add_row(
            name,
            UNIT_LABELS.get(unit, unit),
            str(stats.get("n", stats.get("count", 0))),
            units["min"].cell(stats["min"]),
            units["median"].cell(stats["median"]),
            units["median"].interval(stats.get("median_ci"), stats["median"]),
            units["p95"].cell(stats["p95"]),
            units["max"].cell(stats["max"]),
            f"[red]{flagged}[/]" if flagged else "0",
        )
    return table


def ci_caption(summary: dict[str, Any]) -> str | None:
    """What the table's 95% CI resampled and how many of it: reconfigurations, not port rows (decision
    0042). A summary written before that says only its own `ci` text."""
    counts = [
        stats["median_ci_clusters"]
        for stats in summary.get("phases", {}).values()
        if stats.get("n") and "median_ci_clusters" in stats
    ]
    if not counts:
        return f"95% CI: {summary['ci']}" if summary.get("ci") else None
    if max(counts) < 2:
        return "95% CI: none (one reconfiguration: how the next would differ cannot be estimated)"
    n = str(max(counts)) if min(counts) == max(counts) else f"{min(counts)}–{max(counts)}"
    pooled = " of the runs" if summary.get("runs") else ""  # aggregate(): each run's are its own
    return (
        f"95% CI: bootstrap resampling {n} reconfigurations{pooled} (a reconfiguration's ports move together)"
    )


def flat_probe_stats(probes: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """run.json `probes` as (name, stats) rows: an agent's entry (`agent:<host>`) holds its own probes."""
    rows = []
    for name, stats in probes.items():
        nested = {k: v for k, v in stats.items() if isinstance(v, dict)}
        if nested and all(isinstance(v, dict) for v in stats.values()):
            rows += [(f"{name}/{sub}", sub_stats) for sub, sub_stats in nested.items()]
        else:
            rows.append((name, stats))
    return rows


def _run_meta(run_dir: Path) -> dict[str, Any]:
    try:
        meta = json.loads((run_dir / "run.json").read_text())
    except (OSError, ValueError):
        return {}
    return meta if isinstance(meta, dict) else {}


def clock_table(meta: dict[str, Any]) -> Table | None:
    """Per agent host: which source set its clock offset (shared-clock, exchange, chrony/ptp4l), the offset
    removed from its stamps and the uncertainty that bounds every phase crossing from the controller's clock
    to it, its drift, and the exchange-based estimate beside it (decision 0040). None without agents. Each
    time column in one unit (its header names it)."""
    offsets = meta.get("clock_offsets") or {}
    if not offsets:
        return None
    from rich.table import Table

    from labctl.core.units import UnitColumn

    records = [rec for _, rec in sorted(offsets.items())]
    fields = {
        "offset": "offset_ns",
        "± uncertainty": "uncertainty_ns",
        "exchange ±": "exchange_uncertainty_ns",
        "fastest RTT": "rtt_min_ns",
    }
    units = {name: UnitColumn.of(rec.get(key) for rec in records) for name, key in fields.items()}
    table = Table(title="agent clocks (offset: agent − controller)", title_justify="left")
    for name in ("host", "source", *fields, "drift", "via"):
        header = units[name].header(name) if name in units else name
        table.add_column(header, justify="left" if name in ("host", "source", "via") else "right")
    for host, rec in sorted(offsets.items()):
        drift = rec.get("drift_ppb")
        cells = {
            # a shared clock's offset and uncertainty are 0, not unknown; the exchange's are blank without one
            name: units[name].cell(rec.get(key) or 0)
            if name in ("offset", "± uncertainty")
            else (units[name].cell(rec[key]) if rec.get(key) else "")
            for name, key in fields.items()
        }
        table.add_row(
            host,
            str(rec.get("source", "exchange")),
            *cells.values(),
            "" if drift is None else f"{drift / 1000:+.2f} ppm",
            str(rec.get("exchange_via", "")),  # udp: straight to the agent; broker: through MQTT
        )
    return table


def quality_lines(summary: dict[str, Any], probes: dict[str, Any] | None = None) -> list[str]:
    """What limits the numbers above: flagged rows (never silently in the statistics), each sampled
    mark's resolution, and the modules' DOM update interval where the poller measured one. Two durations
    said together share one unit, and each statistic says how many it is over."""
    from labctl.core.units import fmt_pair

    lines = []
    flagged = summary.get("flagged_rows") or 0
    if flagged:
        per_phase = ", ".join(
            f"{name}: {stats.get('impossible', 0)} impossible, {stats.get('unresolved', 0)} unresolved"
            for name, stats in summary.get("phases", {}).items()
            if stats.get("impossible") or stats.get("unresolved")
        )
        lines.append(
            f"[red]{flagged} port rows flagged: a phase ends before it starts ({per_phase}); left out of "
            "the statistics (breakdown.csv columns impossible/unresolved name them)[/]"
        )
    names = {"t2": "optical (t2)", "t3": "firmware (t3)", "t4": "carrier (t4)", "t5": "traffic (t5)"}
    marks = []
    for mark, r in summary.get("resolution", {}).items():
        if not r.get("max"):
            continue
        typical, worst, unit = fmt_pair(r["median"], r["max"])
        over = f" over {r['n']} port rows" if r.get("n") else ""
        marks.append(f"{names.get(mark, mark)} median {typical} {unit}, worst {worst} {unit}{over}")
    if marks:
        lines.append("mark resolution (previous sample to mark): " + "; ".join(marks))
    rx = [
        stats
        for name, stats in flat_probe_stats(probes or {})
        if name.rsplit("/", 1)[-1] == "rx-power" and stats.get("module_update_estimated")
    ]
    if rx:
        lanes = sum(r["module_update_estimated"] for r in rx)
        longest = max(r["module_update_ns_max"] for r in rx)
        median = rx[0]["module_update_ns_median"] if len(rx) == 1 else None
        median_text, longest_text, unit = fmt_pair(median, longest)
        where = f"median {median_text} {unit}, " if median is not None else ""
        lines.append(
            f"module DOM update interval: {where}longest {longest_text} {unit} over {lanes} lanes (where "
            "longer than the sampling period it widens the optical mark's resolution)"
        )
    lines += stall_lines(probes or {})
    return lines


STALL_MEANINGS = {
    "busy": "the loop's thread on a core: its own work, or the kernel's in its name",
    "runnable": "waiting for a core other processes or kernel threads held; --rt-priority outranks processes",
    "asleep": "neither running nor waiting for a core: a late timer, a blocking call or the machine",
}


def stall_lines(probes: dict[str, Any]) -> list[str]:
    """One line per sampler that gave up ticks after stalls of the loop: how many, the longest, and whose
    the stalls were (labctl.linux.schedstat), so a thinned sampler is never read as a quiet signal."""
    from labctl.core.units import fmt_ns

    lines = []
    for name, stats in flat_probe_stats(probes):
        skipped, stalls = stats.get("ticks_skipped") or 0, stats.get("stalls") or 0
        if not skipped or not stalls:
            continue
        causes = [
            f"{stats[f'stalls_{cause}']} {cause} ({meaning})"
            for cause, meaning in STALL_MEANINGS.items()
            if stats.get(f"stalls_{cause}")
        ]
        longest = stats.get("stall_longest_ns")
        lines.append(
            f"{name}: {skipped} ticks skipped in {stalls} stall{'s' if stalls != 1 else ''}"
            + (f", longest {fmt_ns(longest)}" if longest else "")
            + (f": {'; '.join(causes)}" if causes else "")
        )
    return lines


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


def execute(
    experiment: Path,
    inventory: Path,
    profile: str | None,
    out_dir: Path,
    seed: int | None,
    no_plots: bool,
    formats: tuple[str, ...] | None = None,
    rt_priority: int | None = None,
) -> tuple[RunOutcome, bool]:
    """One experiment run with progress and signal handling, as `labctl run` and `labctl tune` do it: a
    signal before the run directory exists is one line and exit 130. Returns the outcome and whether a
    signal came during the run."""
    import asyncio

    from labctl.run.lifecycle import run_experiment

    progress = RichProgress(input_lines(experiment, inventory))
    signals = _Signals()
    try:
        outcome = asyncio.run(
            _run_with_signals(
                run_experiment(
                    experiment,
                    inventory,
                    profile=profile,
                    out_dir=out_dir,
                    seed=seed,
                    progress=progress,
                    plots=not no_plots,
                    plot_formats=formats,
                    rt_priority=rt_priority,
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

    formats = parse_plot_formats(plot_format)

    if dry_run:
        _dry_run(experiment, inventory, profile)
        return
    outcome, signalled = execute(
        experiment, inventory, profile, out_dir, seed, no_plots, formats, rt_priority
    )
    if outcome.summary.get("rows"):
        out.print(
            _summary_table(
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
    elif outcome.status == "aborted" and not no_plots and outcome.summary.get("rows"):
        out.print(f"figures: not drawn for an aborted run; `labctl plot {outcome.run_dir}` draws them")
    from labctl.cli import signals as guard

    guard.settle()  # all is said: a signal from here to the exit is too late to change anything
    if outcome.status == "aborted" or signalled or guard.noted():
        raise typer.Exit(EXIT_ABORTED)
    if outcome.status != "completed":
        raise typer.Exit(1)


def _dry_run(experiment: Path, inventory_path: Path, profile: str | None) -> None:
    """What the run would do, as its experiment kind describes its plan; nothing is sent."""
    from labctl.labs import load
    from labctl.run.experiment import compile_experiment, experiment_kinds

    inventory = load(inventory_path)
    plan = compile_experiment(experiment, inventory)
    inventory.profile(profile)
    for line in experiment_kinds.get(plan.kind).describe(plan, inventory):
        out.print(line, markup=False, highlight=False)


def report(
    run_paths: Annotated[
        list[Path] | None,
        typer.Argument(
            metavar="RUN",
            help="A run directory, or runs/ for the newest run (the default). Several runs (same experiment, "
            "other seeds or days): one table pooled over all of them, with each run's median. With filters: "
            "a runs directory means every run in it that passes them (default: runs).",
            show_default=False,
        ),
    ] = None,
    experiment: ExperimentFilter = None,
    lab: LabFilter = None,
    profile: ProfileFilter = None,
    since: SinceFilter = None,
    status: StatusFilter = None,
    as_json: JsonOpt = False,
) -> None:
    """Summarize a run, or several pooled: each link-up phase over its own unit, with a 95% CI.

    Status, each phase's n, min, median with a 95% bootstrap CI, p95 and max, flagged rows, and what
    limits the marks' resolution. Several runs, or the runs the filters select from the catalogue (`labctl
    runs`): pooled, each run's median beside the pooled one.

    Reads each run's summary.json and breakdown.parquet (never events.jsonl, but for a run without a
    usable breakdown, which is said)."""
    from labctl.analysis.catalog import select_runs

    chosen = filters(experiment, lab, profile, since, status)
    if not run_paths and not chosen and not RUNS.is_dir():  # no argument: the newest run in runs/
        raise InputError(
            f"no {RUNS}/ here: give a run directory, or filters: --experiment, --lab, --profile, --since, "
            "--status (`labctl run reconfig-timeline` writes runs/)"
        )
    runs = select_runs(run_paths or ([] if chosen else [RUNS]), chosen)
    if not runs:
        where = ", ".join(map(str, run_paths)) if run_paths else str(RUNS)
        raise InputError(f"no run in {where} passes the filters (`labctl runs` lists them)")
    if len(runs) > 1:
        _report_many(runs, as_json)
    else:
        _report_one(runs[0], as_json)


def _run_summary(run_dir: Path, meta: dict[str, Any]) -> tuple[dict[str, Any], int | None, list[str]]:
    """A run's summary, its event count and what was wrong on disk: summary.json as written, else computed
    from breakdown.parquet, else (a run that ended before its analysis, a damaged file) from events.jsonl,
    each fallback named in a note."""
    from labctl.analysis.store import BREAKDOWN_PARQUET, EVENTS, SUMMARY, damage_notes

    notes = damage_notes(run_dir) if (run_dir / EVENTS).is_file() else []
    events = meta.get("events") if isinstance(meta.get("events"), int) else None
    summary_file = run_dir / SUMMARY
    if summary_file.is_file():
        try:
            summary = json.loads(summary_file.read_text(encoding="utf-8"))
            if not isinstance(summary, dict):
                raise ValueError(f"expected a JSON object, found {type(summary).__name__}")
            if "flagged_rows" in summary:
                return summary, events, notes
            notes.append(f"{SUMMARY} predates per-unit statistics and flags: recomputed")
        except (OSError, ValueError) as e:
            reason = str(e).splitlines()[0] if str(e) else type(e).__name__
            notes.append(f"{SUMMARY} is damaged ({reason}): recomputed from the breakdown")
    from labctl.analysis.breakdown import summarize

    parquet = run_dir / BREAKDOWN_PARQUET
    why = f"no {BREAKDOWN_PARQUET} (the run ended before its analysis)"
    if parquet.is_file():
        import pandas as pd

        try:
            frame = pd.read_parquet(parquet)
            if "impossible" in frame:
                return _with_settings(summarize(frame), frame, meta), events, notes
            why = f"{BREAKDOWN_PARQUET} predates the impossible/unresolved flags"
        except Exception as e:  # pyarrow's errors for a damaged file have no common base but Exception
            reason = str(e).splitlines()[0] if str(e) else type(e).__name__
            why = f"{BREAKDOWN_PARQUET} is damaged ({reason})"
    from labctl.analysis.store import load_run

    run = load_run(run_dir)  # reads events.jsonl: said in the note
    notes.append(f"{why}: the breakdown was computed from {EVENTS}")
    notes += [n for n in run.notes if n not in notes]
    return _with_settings(summarize(run.breakdown), run.breakdown, meta), len(run.events), notes


def _with_settings(summary: dict[str, Any], frame: Any, meta: dict[str, Any]) -> dict[str, Any]:
    """A recomputed summary with a tune run's `by_link_setting`, its reference taken from run.json (the
    run's record, else its experiment's spec), never from the order the settings were measured in."""
    from labctl.analysis.settings import by_setting, reference_of

    section = by_setting(frame, reference_of(meta) or frame.attrs.get("link_setting_reference"))
    if section is not None:
        summary["by_link_setting"] = section
    return summary


def _report_one(row: dict[str, Any], as_json: bool) -> None:
    from labctl.analysis.store import read_run_json

    run_dir = Path(row["path"])
    meta = read_run_json(run_dir)
    summary, events, notes = _run_summary(run_dir, meta)
    status = row["status"]
    if as_json:
        print(
            json.dumps(
                {
                    "run": str(run_dir),
                    "run_id": meta.get("run_id"),
                    "status": status,
                    "recorded_status": meta.get("status", "unknown"),
                    "error": meta.get("error"),
                    "events": events,
                    "notes": notes,
                    "summary": summary,
                },
                indent=2,
            )
        )
        return
    for note in notes:
        err.print(f"[yellow]note: {note}[/]", highlight=False)
    out.print(
        f"run {meta.get('run_id')}  status: [bold]{status}[/]"
        + (f"  ({meta['error']})" if meta.get("error") else "")
    )
    if status in ("running", "crashed"):
        gone = "that process is gone: the run crashed" if status == "crashed" else "the run is still going"
        out.print(
            f"[yellow]run.json still says running (pid {meta.get('pid')}); {gone}. The breakdown below is "
            "of the events on disk[/]"
        )
    out.print(
        f"{'?' if events is None else events} events, profile {(meta.get('profile') or {}).get('name')}, "
        f"seed {meta.get('seed')}"
    )
    for name, stats in flat_probe_stats(meta.get("probes", {})):  # what each sampler achieved
        rates = ", ".join(f"{_rate_label(k)} {v:,.0f}/s" for k, v in stats.items() if "_per_s" in k)
        dropped = f", [red]{stats['dropped']} dropped[/]" if stats.get("dropped") else ""
        if rates or dropped:
            out.print(f"probe {name}: {rates}{dropped}")
    out.print(_summary_table(summary, "link-up breakdown"))
    for line in quality_lines(summary, meta.get("probes")):
        out.print(line, highlight=False)
    from labctl.analysis.settings import recommendation_lines

    for line in recommendation_lines(summary.get("by_link_setting")):  # a tune run: ranked by setting
        out.print(line, markup=False, highlight=False)
    clocks = clock_table(meta)
    if clocks is not None:
        out.print(clocks)
    for caveat in summary.get("clock_caveats", []):
        out.print(f"[yellow]clock: {caveat}[/]", highlight=False)
    from labctl.analysis.summary import time_sync_lines

    for line in time_sync_lines(meta):  # one clock for every mark: said once; agents' own clocks: per host
        out.print(line, highlight=False)


LISTED_RUNS = 12
"""Up to this many pooled runs are named one per line, and their medians one column each."""


def _tally(runs: list[dict[str, Any]], key: str) -> str:
    counts: dict[str, int] = {}
    for run in runs:
        counts[str(run.get(key))] = counts.get(str(run.get(key)), 0) + 1
    return ", ".join(f"{value} ({n})" for value, n in sorted(counts.items()))


def _report_many(rows: list[dict[str, Any]], as_json: bool) -> None:
    import duckdb

    from labctl.analysis.compare import Pool, pooled_summary

    con = duckdb.connect()
    try:
        summary = pooled_summary(Pool(rows, con, "pooled"))
    finally:
        con.close()
    if as_json:
        print(json.dumps(summary, indent=2))
        return
    for note in summary["notes"]:
        err.print(f"[yellow]note: {note}[/]", highlight=False)
    runs = summary["runs"]
    if len(summary["experiments"]) > 1:
        err.print(
            f"[yellow]note: the runs are of different experiments: {', '.join(summary['experiments'])}[/]"
        )
    if len(runs) <= LISTED_RUNS:
        for run in runs:
            out.print(
                f"run {run['run_id']}  status: {run['status']}, seed {run['seed']}, profile {run['profile']}",
                highlight=False,
            )
    else:
        started = sorted(r["started"] for r in runs if r["started"])
        out.print(
            f"{len(runs)} runs: status {_tally(runs, 'status')}; profile {_tally(runs, 'profile')}; "
            f"lab {_tally(runs, 'lab')}; labctl {_tally(runs, 'labctl_version')}"
            + (f"; started {started[0]} to {started[-1]}" if started else ""),
            highlight=False,
        )
    title = (
        f"link-up breakdown pooled over {len(runs)} runs ({summary['run_reconfigurations']} "
        f"reconfigurations, {summary['rows']} port rows)"
    )
    out.print(_summary_table(summary, title))
    for line in quality_lines(summary):
        out.print(line, highlight=False)
    out.print(run_medians_table(summary))
    from labctl.analysis.settings import recommendation_lines

    for line in recommendation_lines(summary.get("by_link_setting")):  # tune runs: pooled per setting
        out.print(line, markup=False, highlight=False)


def run_medians_table(summary: dict[str, Any]) -> Table:
    """Each run's median of each phase beside the pooled median: how many runs have one, the median,
    smallest and largest of them, and (up to LISTED_RUNS runs) each one. One unit per column."""
    import statistics

    from rich.table import Table

    from labctl.core.units import UnitColumn

    phases = summary["phases"]
    runs = summary["runs"]
    present = {name: [m for m in stats["run_medians"] if m is not None] for name, stats in phases.items()}
    spread = {
        name: ((round(statistics.median(ms)), min(ms), max(ms)) if ms else (None, None, None))
        for name, ms in present.items()
    }
    pooled_col = UnitColumn.of(stats["median"] for stats in phases.values())
    cols = [UnitColumn.of(s[i] for s in spread.values()) for i in range(3)]
    each = len(runs) <= LISTED_RUNS
    per_run = (
        [UnitColumn.of(stats["run_medians"][i] for stats in phases.values()) for i in range(len(runs))]
        if each
        else []
    )
    table = Table(
        title=f"median of each run ({len(runs)} runs; each phase over its own unit, as above)",
        title_justify="left",
    )
    table.add_column("phase")
    for header in (
        "runs",
        pooled_col.header("pooled median"),
        cols[0].header("median of runs"),
        cols[1].header("lowest run"),
        cols[2].header("highest run"),
        *(col.header(f"#{i}") for i, col in enumerate(per_run, 1)),
    ):
        table.add_column(header, justify="right", no_wrap=True)
    for name, stats in phases.items():
        table.add_row(
            name,
            str(len(present[name])),
            pooled_col.cell(stats["median"]),
            *(col.cell(value) for col, value in zip(cols, spread[name], strict=True)),
            *(col.cell(stats["run_medians"][i]) for i, col in enumerate(per_run)),
        )
    return table


def _side(tokens: list[str]) -> tuple[list[str], Filters]:
    """A compare side's tokens: run or runs directories, and key=value filters (FILTER_KEYS) narrowing it."""
    from labctl.analysis.catalog import FILTER_KEYS, filters_from

    paths, given = [], {}
    for token in tokens:
        key, eq, value = token.partition("=")
        if eq and key in FILTER_KEYS and not Path(token).exists():
            given[key] = value
        elif eq and not Path(token).exists():
            raise InputError(f"{token}: not a run directory, nor a filter ({', '.join(FILTER_KEYS)}=VALUE)")
        else:
            paths.append(token)
    return paths, filters_from(**given)


def compare(
    runs: Annotated[
        list[str],
        typer.Argument(
            metavar="RUN... vs RUN...",
            help="Two sets of runs separated by the word vs, e.g. `labctl compare runs/a* vs runs/b*`. A "
            "side may hold filters as key=value (experiment, lab, profile, since, status), over the runs "
            "directories it names (default: runs): `labctl compare --experiment fig10 profile=fast vs "
            "profile=opus-testbed`.",
        ),
    ],
    experiment: ExperimentFilter = None,
    lab: LabFilter = None,
    profile: ProfileFilter = None,
    since: SinceFilter = None,
    status: StatusFilter = None,
    as_json: JsonOpt = False,
) -> None:
    """Compare two sets of runs phase by phase: medians, their difference, and 95% CIs.

    Each set's median with its 95% bootstrap CI, and the difference of medians (second set minus first)
    with its own CI: the table a reviewer asks for. The filter options apply to both sets; a warning says
    where the sets ran different profiles, labs or labctl versions."""
    from labctl.analysis.catalog import select_runs
    from labctl.analysis.compare import compare_runs, split_sets
    from labctl.core.units import UnitColumn

    a_tokens, b_tokens = split_sets(runs)
    shared = filters(experiment, lab, profile, since, status)
    sets = []
    for side, tokens in (("A", a_tokens), ("B", b_tokens)):
        paths, own = _side(tokens)
        chosen = shared.narrowed(own)
        picked = select_runs(paths, chosen)
        if not picked:
            raise InputError(f"set {side}: no run in {', '.join(paths) or RUNS} passes its filters")
        sets.append(picked)
    result = compare_runs(sets[0], sets[1])
    if as_json:
        print(json.dumps(result, indent=2))
        return
    from rich.table import Table

    for note in result["notes"]:
        err.print(f"[yellow]note: {note}[/]", highlight=False)
    for warning in result["warnings"]:
        out.print(f"[yellow]warning: {warning}[/]", highlight=False)
    phases = result["phases"]
    medians = UnitColumn.of(e[s]["median"] for e in phases.values() for s in ("a", "b"))
    diffs = UnitColumn.of(e.get("difference") for e in phases.values())
    table = Table(
        title=f"A: {len(result['a']['runs'])} runs  vs  B: {len(result['b']['runs'])} runs",
        title_justify="left",
    )
    for col in (
        "phase",
        "unit",
        "n A",
        medians.header("median A [95% CI]"),
        "n B",
        medians.header("median B [95% CI]"),
        diffs.header("B − A [95% CI]"),
        "B/A",
    ):
        table.add_column(col, justify="left" if col in ("phase", "unit") else "right", no_wrap=True)
    for name, entry in phases.items():
        diff = entry.get("difference")
        table.add_row(
            name,
            UNIT_LABELS.get(entry["unit"], entry["unit"]),
            str(entry["a"]["n"]),
            medians.with_interval(entry["a"]["median"], entry["a"].get("median_ci")),
            str(entry["b"]["n"]),
            medians.with_interval(entry["b"]["median"], entry["b"].get("median_ci")),
            diffs.with_interval(diff, entry.get("difference_ci")) if diff is not None else "—",
            f"{entry['ratio']:.3f}" if entry.get("ratio") else "—",
        )
    out.print(table)
    clusters = {
        f"{side.upper()} {entry[side]['median_ci_clusters']}"
        for entry in phases.values()
        for side in ("a", "b")
        if entry[side]["n"]
    }
    out.print(
        "intervals: "
        + result.get("ci", "95% percentile bootstrap of the median over each phase's units, pooled per set")
        + (f" (reconfigurations resampled: {', '.join(sorted(clusters))})" if clusters else ""),
        highlight=False,
    )
    settings = result.get("by_link_setting")
    if settings:
        _compare_settings(settings, medians)


def _compare_settings(settings: dict[str, Any], medians: Any) -> None:
    """`labctl compare` of tune runs: per link setting both sets measured, each set's median total link-up
    with its CI and B − A with its own; then each set's ranking and recommendation."""
    from rich.table import Table

    from labctl.analysis.settings import recommendation_lines
    from labctl.core.units import UnitColumn

    a, b = settings.get("a") or {"settings": {}}, settings.get("b") or {"settings": {}}
    rows = settings["differences"]
    if rows:
        values = UnitColumn.of(
            side["settings"][label][phase]["median"]
            for label in rows
            for side in (a, b)
            for phase in ("firmware", "total")
        )
        diffs = UnitColumn.of(d["median"] if d else None for entry in rows.values() for d in entry.values())
        table = Table(
            title="by link setting (each set pooled; 95% CI resampling run × reconfiguration, each set on "
            "its own)",
            title_justify="left",
        )
        for col in (
            "link setting",
            "phase",
            "n A",
            values.header("median A [95% CI]"),
            "n B",
            values.header("median B [95% CI]"),
            diffs.header("B − A [95% CI]"),
        ):
            table.add_column(
                col, justify="left" if col in ("link setting", "phase") else "right", no_wrap=True
            )
        for label, entry in rows.items():
            for phase, diff in entry.items():
                sa, sb = a["settings"][label][phase], b["settings"][label][phase]
                table.add_row(
                    label,
                    f"{phase} ({UNIT_LABELS.get(sa['unit'], sa['unit'])})",
                    str(sa["n"]),
                    values.with_interval(sa["median"], sa.get("median_ci")),
                    str(sb["n"]),
                    values.with_interval(sb["median"], sb.get("median_ci")),
                    diffs.with_interval(diff["median"], diff["ci"]) if diff else "— (one reconfiguration)",
                )
        out.print(table)
    for side, name in (("a", "A"), ("b", "B")):
        only = settings["only_in"][side]
        if only:
            out.print(f"set {name} only: {', '.join(only)}", markup=False, highlight=False)
        for line in recommendation_lines(settings.get(side)):
            out.print(
                f"set {name} {line}" if not line.startswith(" ") else line, markup=False, highlight=False
            )


def plot(
    run_path: Annotated[
        Path, typer.Argument(metavar="RUN", help="A run directory, or runs/ for the newest run.")
    ],
    reconfig: Annotated[
        int | None,
        typer.Option(
            min=0,
            help="Draw this reconfiguration (0: the baseline) as timeline-reconfig-N.<format> "
            "(default: the first after the baseline as timeline.*, plus distributions.*).",
        ),
    ] = None,
    out_dir: Annotated[
        Path | None, typer.Option("--out", help="Directory for the images (default: the run directory).")
    ] = None,
    style: Annotated[
        str | None,
        typer.Option(
            help="A matplotlib style name or .mplstyle file, applied over labctl's own (e.g. a file with "
            "`font.size: 7` and `figure.figsize: 7, 3` for a two-column paper). Default: $LABCTL_MPLSTYLE.",
        ),
    ] = None,
    fmt: Annotated[
        str,
        typer.Option(
            "--format",
            metavar="png,svg,pdf|all",
            help="The formats to draw: png, and svg/pdf that drop into LaTeX (text stays text, TrueType "
            "fonts).",
        ),
    ] = "png",
) -> None:
    """(Re)draw a run's figures (headline, timeline, distributions) from its events.jsonl.

    An aborted run's too, which draws none on its way out. PNG by default, `--format svg,pdf` (or all) for
    a paper."""
    from labctl.analysis.plots import plot_run
    from labctl.analysis.store import damage_notes, resolve_run_path

    formats = parse_plot_formats(fmt, "--format")
    assert formats is not None
    path = resolve_run_path(run_path)
    for note in damage_notes(path):
        err.print(f"[yellow]note: {note}[/]", highlight=False)
    if out_dir is not None:
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise InputError(f"{out_dir}: cannot create the output directory: {e.strerror}") from None
    from labctl.analysis.breakdown import EventIndex, compute_breakdown
    from labctl.analysis.settings import reference_of
    from labctl.analysis.settings_plots import plot_settings
    from labctl.analysis.store import read_run_json

    index = EventIndex.from_file(path / "events.jsonl")
    frame = compute_breakdown(index)
    paths = plot_run(
        path, reconfig=reconfig, frame=frame, index=index, out_dir=out_dir, style=style, formats=formats
    )
    if reconfig is None and not frame.empty:  # a tune run: its figures by link setting (decision 0080)
        reference = frame.attrs.get("link_setting_reference") or reference_of(read_run_json(path))
        paths += plot_settings(frame, out_dir or path, reference=reference, style=style, formats=formats)
    for p in paths:
        out.print(str(p))


def register(app: typer.Typer) -> None:
    for command in (run, report, compare, plot):
        app.command()(command)
