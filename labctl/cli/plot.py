"""`labctl plot`: (re)draw a run's figures from its events.jsonl."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from labctl.cli.common import err, out, parse_plot_formats
from labctl.core.errors import InputError


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
    from labctl.analysis.breakdown import compute_breakdown
    from labctl.analysis.event_index import EventIndex
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
    app.command()(plot)
