"""A run's derived files from its `events.jsonl` alone: breakdown.csv/.parquet, summary.json, figures."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from labctl.analysis.breakdown import (
    EventIndex,
    clock_caveats,
    clock_uncertainties,
    compute_breakdown,
    summarize,
    write_breakdown,
)
from labctl.analysis.figures import FIGURES
from labctl.analysis.store import read_run_json
from labctl.core.fileio import write_json_atomic


def analyse(
    run_dir: Path,
    threshold_dbm: float | None = None,
    *,
    plot_formats: Sequence[str] = ("png",),
    figures: Sequence[str] | None = None,
    write: bool = True,
) -> dict[str, Any]:
    """(Re)compute breakdown.csv/.parquet, summary.json and the plots (in `plot_formats`; none if empty) of
    a run from its events.jsonl. `figures`: which of plot_run's (default: all); `write=False` writes no
    breakdown or summary file (a second process drawing the other figure: labctl.analysis.pool)."""
    index = EventIndex.from_file(run_dir / "events.jsonl")
    offsets = read_run_json(run_dir).get("clock_offsets") or {}
    frame = compute_breakdown(index, threshold_dbm, clock_uncertainties(offsets))
    summary = summarize(frame)
    summary["clock_caveats"] = clock_caveats(frame, offsets)
    if write:
        write_breakdown(frame, run_dir)
        write_json_atomic(run_dir / "summary.json", summary)
    if plot_formats:
        from labctl.analysis.plots import plot_run

        plot_run(run_dir, frame=frame, index=index, formats=plot_formats, figures=figures or FIGURES)
    return summary
