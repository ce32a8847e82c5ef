"""`labctl compare`: two sets of runs phase by phase, each median and their difference with 95% CIs."""

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
    from labctl.analysis.catalog_filters import Filters


def _side(tokens: list[str]) -> tuple[list[str], Filters]:
    """A compare side's tokens: run or runs directories, and key=value filters (FILTER_KEYS) narrowing it."""
    from labctl.analysis.catalog_filters import FILTER_KEYS, filters_from

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

    from labctl.cli.tables import UNIT_LABELS

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
    from labctl.cli.tables import UNIT_LABELS
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


def register(app: typer.Typer) -> None:
    app.command()(compare)
