"""What every `labctl` command shares: the consoles, the options defined once, number formatting."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import typer
from rich.console import Console

from labctl.core.errors import InputError
from labctl.core.units import fmt_ns

if TYPE_CHECKING:
    from labctl.analysis.catalog_filters import Filters

__all__ = ["fmt_ns"]  # re-exported: every command formats durations the same way

out = Console(soft_wrap=True, emoji=False)
if not out.is_terminal:  # a pipe or a CI log has no width to fit: rich's default 80 would truncate tables
    out.width = max(out.width, 140)
err = Console(stderr=True, soft_wrap=True, emoji=False)

EXIT_ABORTED = 130
DEFAULT_INVENTORY = Path("inventory.yaml")  # this directory's, else the built-in simulated Opus testbed
RUNS = Path("runs")


def resolve_inventory(path: Path) -> Path:
    """The default inventory where this directory has none is the built-in lab (labctl.core.shipped)."""
    from labctl.core.shipped import resolve_inventory as resolve

    return resolve(path)


def resolve_experiment(path: Path) -> Path:
    """An experiment file, or a built-in experiment by name (`reconfig-timeline`)."""
    from labctl.core.shipped import resolve_experiment as resolve

    return resolve(path)


# The logging options of the long-running services (`agent`, `serve`); labctl.core.logs sets it up (imported
# when a service starts: `labctl --help` does not import the logging package).
LogLevel = Literal["debug", "info", "warning", "error"]
LogFormat = Literal["json", "text"]
LogLevelOpt = Annotated[
    LogLevel, typer.Option("--log-level", help="Log labctl's records from this level up, to stderr.")
]
LogFormatOpt = Annotated[
    LogFormat | None,
    typer.Option(
        "--log-format",
        show_default=False,
        help="json: one object per line (ts, level, logger, msg and the record's fields), for journald or a "
        "log shipper; text: for a person. Default: json when stderr is not a terminal, text when it is.",
    ),
]


def start_logging(level: LogLevel, fmt: LogFormat | None) -> None:
    """Set up a service's logging (labctl.core.logs) from its --log-level and --log-format."""
    from labctl.core.logs import setup_logging

    setup_logging(level, fmt)


InventoryOpt = Annotated[
    Path,
    typer.Option(
        "--inventory",
        "-i",
        help="Lab inventory: its kind, switches (driver, address), hosts, NIC ports, fibers. Default: "
        "./inventory.yaml, else the built-in simulated Opus testbed.",
        callback=resolve_inventory,
    ),
]
ExperimentArg = Annotated[
    Path,
    typer.Argument(
        help="Experiment file, or a built-in experiment by name (reconfig-timeline, replay-opus-testbed, "
        "fig10, gpu-pingpong...).",
        callback=resolve_experiment,
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the result as JSON (for scripts).")]
# the dashboard's (`serve --http`, `labctl dashboard`: labctl/cli/dashboard.py)
HttpOpt = Annotated[
    str | None,
    typer.Option(
        "--http",
        metavar="[ADDR:]PORT",
        help="Serve the dashboard (queue, live run, history) at this address: PORT alone listens on "
        "127.0.0.1; port 0 picks a free one (the address is printed). Any address other than loopback "
        "needs --token-file.",
        show_default=False,
    ),
]
TokenFileOpt = Annotated[
    Path | None,
    typer.Option(
        "--token-file",
        help="The token that cancel, resubmit and submit need (header X-Labctl-Token). A file that does not "
        "exist gets a new token, written owner-only and printed once. Without it the pages are read-only, "
        "and only a loopback address may be served.",
        show_default=False,
    ),
]
OutOpt = Annotated[Path, typer.Option("--out", help="Where run directories are created.")]
NoPlotsOpt = Annotated[
    bool,
    typer.Option("--no-plots", help="Skip the timeline and distributions figures (analysis still runs)."),
]
PlotFormatOpt = Annotated[
    str | None,
    typer.Option(
        "--plot-format",
        metavar="png,svg,pdf|all",
        help="The formats to draw the figures in (default: the experiment's analysis.plot_formats, png). "
        "SVG and PDF take ~4x the PNG's time; `labctl plot RUN --format svg,pdf` draws them later.",
    ),
]


def parse_plot_formats(text: str | None, option: str = "--plot-format") -> tuple[str, ...] | None:
    """`png,svg` (or `all`) as a tuple of formats, None for None; an unknown one is an InputError."""
    if text is None:
        return None
    from typing import get_args

    from labctl.run.experiment import PlotFormat

    known: tuple[str, ...] = get_args(PlotFormat)
    names = [n.strip().lower() for n in text.split(",") if n.strip()]
    if names == ["all"]:
        return known
    if not names or any(n not in known for n in names):
        raise InputError(f"{option} {text!r}: use a comma-separated list of {', '.join(known)}, or all")
    return tuple(dict.fromkeys(names))


ProfileOpt = Annotated[
    str | None,
    typer.Option(
        help="Delay profile of the lab's behaviour models: opus-testbed (the default, ~1 min a run), "
        "opus-testbed-autoneg-off, fast (seconds), or one from the inventory's `profiles:`."
    ),
]


def fmt_range_ns(low: float | int, high: float | int, like: float | int | None = None) -> str:
    """A range in the unit `fmt_ns` picks for `like` (default: high): 20.6–21.8 ms."""
    ref = abs(float(like if like is not None else high))
    for scale, unit, digits in ((1e9, "s", 3), (1e6, "ms", 1), (1e3, "µs", 0)):
        if ref >= scale:
            return f"{low / scale:.{digits}f}–{high / scale:.{digits}f} {unit}"
    return f"{low:.0f}–{high:.0f} ns"


def bounded(low: float, high: float) -> Callable[[float | None], float | None]:
    """A range check that names nan and inf for what they are (click's range check calls nan too large)."""

    def check(value: float | None) -> float | None:
        if value is not None and not math.isfinite(value):
            raise typer.BadParameter(f"{value} is not a finite number")
        if value is not None and not low <= value <= high:
            raise typer.BadParameter(f"{value:g} is not in {low:g}..{high:g}")
        return value

    return check


# The run catalogue's filters: `labctl runs`, `report` and `compare` take them alike.
ExperimentFilter = Annotated[
    str | None,
    typer.Option("--experiment", help="Only runs of this experiment (its name; a shell glob: 'fig1*')."),
]
LabFilter = Annotated[
    str | None, typer.Option("--lab", help="Only runs on this lab (the inventory's `lab`).")
]
ProfileFilter = Annotated[str | None, typer.Option("--profile", help="Only runs with this delay profile.")]
SinceFilter = Annotated[
    str | None,
    typer.Option(
        "--since",
        metavar="DATE",
        help="Only runs started at or after DATE: 2026-12-01, 2026-12-01T14:00 (local time unless it names "
        "its offset or Z), today, yesterday, monday (the latest Monday), or an age: 36h, 7d, 2w.",
    ),
]
StatusFilter = Annotated[
    str | None,
    typer.Option(
        "--status",
        metavar="STATUS,...",
        help="Only runs with these statuses: completed, failed, aborted, running, crashed (recorded running, "
        "its process gone).",
    ),
]


def filters(
    experiment: str | None, lab: str | None, profile: str | None, since: str | None, status: str | None
) -> Filters:
    """The options as catalogue filters (a bad date or status: one line, exit code 2)."""
    from labctl.analysis.catalog_filters import filters_from

    return filters_from(experiment=experiment, lab=lab, profile=profile, since=since, status=status)
