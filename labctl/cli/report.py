"""`labctl report`: a run's summary read back, or several runs pooled, each phase with a 95% CI."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from labctl.cli.common import (
    RUNS,
    ExperimentFilter,
    JsonOpt,
    LabFilter,
    ProfileFilter,
    SinceFilter,
    StatusFilter,
    err,
    filters,
    out,
)
from labctl.core.errors import InputError

if TYPE_CHECKING:
    from rich.table import Table


def _rate_label(key: str) -> str:
    """`samples_per_s_per_port` → `samples per port`, `pings_per_s` → `pings`."""
    return key.replace("_per_s_per_port", " per port").replace("_per_s", "").replace("_", " ")


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
    from labctl.analysis.phase_stats import summarize

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
    from labctl.cli.tables import clock_table, quality_lines, summary_table
    from labctl.probes.sampling import flat_probe_stats

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
    out.print(summary_table(summary, "link-up breakdown"))
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
    from labctl.cli.tables import quality_lines, summary_table

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
    out.print(summary_table(summary, title))
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


def register(app: typer.Typer) -> None:
    app.command()(report)
