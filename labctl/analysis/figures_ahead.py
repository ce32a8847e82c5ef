"""Figures drawn ahead: one of a run's figures rendered in memory with the data it shows (DrawnFigure), while
the run goes on (labctl.analysis.pool), for plot_run to write at the end if the figure due then shows the
same data in the same style and formats (else plot_run draws it again)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import matplotlib.pyplot as plt
import pandas as pd

from labctl.analysis.distributions_plot import distributions_data, render_distributions
from labctl.analysis.event_index import EventIndex
from labctl.analysis.figures import DEFAULT_FORMATS, FIGURES
from labctl.analysis.headline_plot import HeadlineData, headline_data, render_headline
from labctl.analysis.plot_files import render_files
from labctl.analysis.plot_style import resolve_style, styled
from labctl.analysis.timeline_plot import TimelineData, render_timeline, timeline_data, timeline_reconfig


@dataclass(eq=False)
class DrawnFigure:
    """One of a run's figures (FIGURES) rendered in memory with the data it shows (draw_ahead), for
    plot_run to write later if the figure due then shows the same. Each figure is a function of its data
    (timeline_data, distributions_data), the style and the format alone, so the files are the same."""

    figure: str
    data: TimelineData | HeadlineData | pd.DataFrame
    looks: tuple[tuple[str, ...], tuple[str, ...]]
    """The styles and the formats it was rendered in."""
    files: dict[str, bytes]
    """Per format, the file's bytes."""
    kept: bool = False
    """Set by plot_run when it wrote these files rather than draw the figure again."""

    def shows(self, other: DrawnFigure) -> bool:
        """Whether `other` would be drawn the same: the same figure, looks and data."""
        if (self.figure, self.looks) != (other.figure, other.looks):
            return False
        if isinstance(self.data, TimelineData):
            return isinstance(other.data, TimelineData) and self.data.same_as(other.data)
        if isinstance(self.data, HeadlineData):
            return isinstance(other.data, HeadlineData) and self.data.same_as(other.data)
        return isinstance(other.data, pd.DataFrame) and self.data.equals(other.data)


def draw_ahead(
    figure: str,
    index: EventIndex,
    frame: pd.DataFrame,
    *,
    threshold_dbm: float | None = None,
    style: str | os.PathLike[str] | None = None,
    formats: Sequence[str] = DEFAULT_FORMATS,
) -> DrawnFigure | None:
    """One of the run's figures as plot_run would write it from these events, in memory, once what it shows
    is on record; None before then (the headline and the timeline: once a later reconfiguration's command
    is, as they draw nothing past it; the distributions: any time, so ask once the last reconfiguration is
    done)."""
    if frame.empty or (figure in ("headline", "timeline") and not _timeline_on_record(frame)):
        return None
    return drawn_figure(figure, figure_data(figure, index, frame, threshold_dbm), style, formats)


def _timeline_on_record(frame: pd.DataFrame) -> bool:
    later = frame.loc[frame["reconfig"] > timeline_reconfig(frame), "t0_command_ns"]
    return bool(later.notna().any())


def figure_data(
    figure: str, index: EventIndex, frame: pd.DataFrame, threshold_dbm: float | None
) -> TimelineData | HeadlineData | pd.DataFrame:
    if figure == "headline":
        return headline_data(index, frame, timeline_reconfig(frame), threshold_dbm)
    if figure == "timeline":
        return timeline_data(index, frame, timeline_reconfig(frame), threshold_dbm)
    if figure == "distributions":
        return distributions_data(frame)
    raise ValueError(f"no figure {figure!r} (have: {', '.join(FIGURES)})")


def drawn_figure(
    figure: str,
    data: TimelineData | HeadlineData | pd.DataFrame,
    style: str | os.PathLike[str] | None,
    formats: Sequence[str],
    *,
    render: bool = True,
) -> DrawnFigure:
    """The figure of `data`, rendered in each format (with render=False: only what it would show)."""
    files: dict[str, bytes] = {}
    if render:
        with styled(style):
            if isinstance(data, TimelineData):
                fig = render_timeline(data)
            elif isinstance(data, HeadlineData):
                fig = render_headline(data)
            else:
                fig = render_distributions(data)
            try:
                files = render_files(fig, formats)
            finally:
                plt.close(fig)
    return DrawnFigure(figure, data, (tuple(resolve_style(style)), tuple(formats)), files)
