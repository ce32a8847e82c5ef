"""`labctl export RUN --format perfetto`: a run's timeline for the viewers engineers already use."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from labctl.cli.common import out
from labctl.core.errors import InputError

FORMATS = ("perfetto",)


def export(
    run: Annotated[Path, typer.Argument(help="A run directory (or runs/ for the newest run).")],
    format: Annotated[
        str, typer.Option("--format", help="perfetto: Chrome trace-event JSON for ui.perfetto.dev.")
    ] = "perfetto",
    out_file: Annotated[
        Path | None, typer.Option("--out", help="Where to write it (default: RUN/trace.perfetto.json).")
    ] = None,
) -> None:
    """Export a run's timeline: one track per host and NIC port (each reconfiguration's recovery with its
    phases and marks), each switch's commands, Rx power and loop lag as counters.

    Open the file at https://ui.perfetto.dev ("Open trace file") or in chrome://tracing; times are the run's
    monotonic clock in µs from its start, to the nanosecond."""
    if format not in FORMATS:
        raise InputError(f"--format {format}: not one of {', '.join(FORMATS)}")
    from labctl.analysis.perfetto import write_perfetto
    from labctl.analysis.store import resolve_run_path

    run_dir = resolve_run_path(run)
    target = out_file or run_dir / "trace.perfetto.json"
    n = write_perfetto(run_dir, target)
    out.print(f"wrote {target}: {n} trace events (open it at https://ui.perfetto.dev)")


def register(app: typer.Typer) -> None:
    app.command("export")(export)
