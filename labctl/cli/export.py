"""`labctl export RUN --format perfetto|vcd`: a run's timeline for the viewers engineers already use."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from labctl.cli.common import out
from labctl.core.errors import InputError

FORMATS = {"perfetto": "trace.perfetto.json", "vcd": "timeline.vcd"}
"""Each format and its default file in the run directory."""


def export(
    run: Annotated[Path, typer.Argument(help="A run directory (or runs/ for the newest run).")],
    fmt: Annotated[
        str,
        typer.Option(
            "--format",
            help="perfetto: Chrome trace-event JSON for ui.perfetto.dev; vcd: each port's light, firmware "
            "link, carrier and traffic as 1-bit wires for a waveform viewer (GTKWave, Surfer).",
        ),
    ] = "perfetto",
    out_file: Annotated[
        Path | None,
        typer.Option(
            "--out", help="Where to write it (default: RUN/trace.perfetto.json or RUN/timeline.vcd)."
        ),
    ] = None,
) -> None:
    """Export a run's timeline for Perfetto (a track per port: recoveries, phases, marks) or as VCD waveforms.

    perfetto: open it at https://ui.perfetto.dev ("Open trace file") or in chrome://tracing; one track per
    host and NIC port, each switch's commands, Rx power and loop lag as counters; times in µs from the run's
    start, to the nanosecond. vcd: a scope per host and port, wires light/firmware/carrier/traffic, 1 ns
    timescale."""
    if fmt not in FORMATS:
        raise InputError(f"--format {fmt}: not one of {', '.join(FORMATS)}")
    from labctl.analysis.store import resolve_run_path

    run_dir = resolve_run_path(run)
    target = out_file or run_dir / FORMATS[fmt]
    if fmt == "vcd":
        from labctl.analysis.vcd import write_vcd

        n = write_vcd(run_dir, target)
        out.print(f"wrote {target}: {n} value changes (open it in GTKWave or Surfer)")
    else:
        from labctl.analysis.perfetto import write_perfetto

        n = write_perfetto(run_dir, target)
        out.print(f"wrote {target}: {n} trace events (open it at https://ui.perfetto.dev)")


def register(app: typer.Typer) -> None:
    app.command("export")(export)
