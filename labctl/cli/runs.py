"""`labctl runs`: the run catalogue of a runs directory, listed and filtered (labctl.analysis.catalog).

`labctl report` and `labctl compare` take the same filter options (labctl/cli/common.py).
"""

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

if TYPE_CHECKING:
    pass


def _local(ns: int | None) -> str:
    if ns is None:
        return "—"
    import datetime as dt

    return dt.datetime.fromtimestamp(ns / 1e9).strftime("%Y-%m-%d %H:%M")


def runs(
    runs_dir: Annotated[Path, typer.Argument(metavar="RUNS_DIR", help="The runs directory.")] = RUNS,
    experiment: ExperimentFilter = None,
    lab: LabFilter = None,
    profile: ProfileFilter = None,
    since: SinceFilter = None,
    status: StatusFilter = None,
    as_json: JsonOpt = False,
    rebuild: Annotated[
        bool,
        typer.Option(
            "--rebuild",
            help="Index every run directory anew (RUNS_DIR/.catalog.parquet, a cache: it is otherwise "
            "refreshed for the runs whose files changed).",
        ),
    ] = False,
) -> None:
    """List and filter the runs of a runs directory (the run catalogue), oldest first.

    Each run's id, experiment, lab, profile, seed, labctl version, start, duration, status,
    reconfigurations and median total recovery; filtered by the options.

    A run recorded running whose process is gone is listed as crashed. `--json` prints every catalogue
    field (experiment and inventory hashes, per-phase n/min/median/p95/max). The catalogue is
    RUNS_DIR/.catalog.parquet, plain Parquet that DuckDB (or pandas) reads as it is."""
    from labctl.analysis.catalog import Catalog, public

    chosen = filters(experiment, lab, profile, since, status)
    catalog = Catalog(runs_dir)
    rows = catalog.rows(chosen, rebuild=rebuild)
    for note in catalog.skipped:
        err.print(f"note: skipped {note}", markup=False, highlight=False)
    if as_json:
        print(json.dumps([public(r) for r in rows], indent=2))
        return
    if not rows:
        out.print(f"no runs in {runs_dir}" + (" match" if chosen else ""), highlight=False)
        return
    print_table(rows)
    statuses: dict[str, int] = {}
    for row in rows:
        statuses[row["status"]] = statuses.get(row["status"], 0) + 1
    out.print(
        f"{len(rows)} runs: " + ", ".join(f"{n} {name}" for name, n in sorted(statuses.items())),
        highlight=False,
    )


SHARED = {"experiment": "experiment", "lab": "lab", "profile": "profile", "labctl_version": "labctl"}
"""Columns said once above the table when every listed run has the same value."""


def print_table(rows: list[dict[str, Any]]) -> None:
    """The runs as a table: one unit per time column, named in its header; a column whose value every run
    shares is said once above it instead."""
    from rich.table import Table

    from labctl.core.units import UnitColumn

    shared = {key: rows[0][key] for key in SHARED if len({r[key] for r in rows}) == 1}
    if shared:
        out.print(
            "all " + ", ".join(f"{SHARED[key]} {value or '—'}" for key, value in shared.items()),
            highlight=False,
        )
    took = [
        (r["finished_ns"] - r["started_ns"]) if r["finished_ns"] and r["started_ns"] else None for r in rows
    ]
    took_col = UnitColumn.of(took)
    total_col = UnitColumn.of(r["total_median_ns"] for r in rows)
    table = Table(box=None, pad_edge=False, header_style="bold")
    table.add_column("run", no_wrap=True)
    for key, header in SHARED.items():
        if key not in shared:
            table.add_column(header, no_wrap=True)
    table.add_column("seed", justify="right", no_wrap=True)
    table.add_column("started (local)", no_wrap=True)
    table.add_column(took_col.header("took"), justify="right", no_wrap=True)
    table.add_column("status", no_wrap=True)
    table.add_column("reconfigs", justify="right", no_wrap=True)
    table.add_column(total_col.header("total median"), justify="right", no_wrap=True)
    colour = {"crashed": "red", "failed": "red", "aborted": "yellow", "running": "cyan"}
    for row, duration in zip(rows, took, strict=True):
        style = colour.get(row["status"])
        table.add_row(
            row["run_id"],
            *(str(row[key] or "—") for key in SHARED if key not in shared),
            "—" if row["seed"] is None else str(row["seed"]),
            _local(row["started_ns"]),
            took_col.cell(duration),
            f"[{style}]{row['status']}[/]" if style else row["status"],
            "—" if row["reconfigurations"] is None else str(row["reconfigurations"]),
            total_col.cell(row["total_median_ns"]),
        )
    out.print(table, highlight=False)


def register(app: typer.Typer) -> None:
    app.command("runs")(runs)
