"""Plots of a run: the headline, the timeline and the distributions figures of a run, drawn from its
events and breakdown and written into its directory (`plot_run`).

Each figure is one module: the headline (one port's recovery on a log time axis, Opus Fig. 9 style;
labctl.analysis.headline_plot), the timeline of one reconfiguration (every rail, in full and zoomed on
each cluster of marks, like Fig. 9c/9d; labctl.analysis.timeline_plot) and the distribution of each phase
over all reconfigurations (box plots and one empirical CDF per phase, the recovery phases in pipeline
order apart from the down side; labctl.analysis.distributions_plot). They share labctl's style
(labctl.analysis.plot_style) and are written to files by labctl.analysis.plot_files; the figures the run's
workers drew ahead are labctl.analysis.figures_ahead's.

Each figure is written as PNG by default, and as SVG (text kept as text) and PDF (TrueType fonts) on
request (`formats`), in labctl's packaged matplotlib style (labctl/analysis/styles/labctl.mplstyle) with
an optional user style on top of it: the `style` argument (a style name or a .mplstyle path), else
$LABCTL_MPLSTYLE.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from labctl.analysis.breakdown import compute_breakdown
from labctl.analysis.event_index import EventIndex
from labctl.analysis.figures import DEFAULT_FORMATS, FIGURES
from labctl.analysis.figures_ahead import DrawnFigure, drawn_figure, figure_data
from labctl.analysis.plot_files import write_files
from labctl.analysis.plot_style import resolve_style
from labctl.analysis.timeline_plot import plot_timeline


def plot_run(
    run_dir: Path,
    *,
    reconfig: int | None = None,
    frame: pd.DataFrame | None = None,
    index: EventIndex | None = None,
    out_dir: Path | None = None,
    style: str | os.PathLike[str] | None = None,
    threshold_dbm: float | None = None,
    formats: Sequence[str] = DEFAULT_FORMATS,
    figures: Sequence[str] = FIGURES,
    drawn: Sequence[DrawnFigure] = (),
) -> list[Path]:
    """Without `reconfig`: headline.<format> and timeline.<format> of the first reconfiguration after the
    baseline, and distributions.<format>, in each of `formats` (png by default; svg, pdf); `figures` picks
    which of them (labctl.analysis.pool draws them in two processes at once). With it:
    timeline-reconfig-N.<format> only, so each reconfiguration keeps its own. Written into `out_dir`
    (default: the run directory). `style`: a matplotlib style name or
    .mplstyle path applied over labctl's (default: $LABCTL_MPLSTYLE); a bad one is an InputError.
    `threshold_dbm`: the Rx-power threshold line (default: the run's, from its run.start event).
    `drawn`: figures draw_ahead rendered earlier (while the run went on): one's files are written if it
    shows the same data in the same style and formats as the figure due, else that figure is drawn again."""
    resolve_style(style)  # a bad style fails before the events are read
    index = index or EventIndex.from_file(run_dir / "events.jsonl")
    frame = frame if frame is not None else compute_breakdown(index, threshold_dbm)
    out_dir = out_dir or run_dir
    if frame.empty:
        return []
    options: dict[str, Any] = {"threshold_dbm": threshold_dbm, "style": style, "formats": formats}
    if reconfig is not None:
        return plot_timeline(index, frame, reconfig, out_dir / f"timeline-reconfig-{reconfig}", **options)
    paths: list[Path] = []
    for figure in (f for f in FIGURES if f in figures):
        due = drawn_figure(
            figure, figure_data(figure, index, frame, threshold_dbm), style, formats, render=False
        )
        ahead = next((d for d in drawn if d.shows(due)), None)
        if ahead is not None:
            ahead.kept = True
        else:
            ahead = drawn_figure(figure, due.data, style, formats)
        paths += write_files(out_dir / figure, ahead.files)
    return paths
