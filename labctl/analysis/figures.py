"""Which figures a run has and the formats they come in (imported by the figures' renderer and by the
processes that run it, without matplotlib)."""

from __future__ import annotations

FIGURES = ("headline", "timeline", "distributions")
"""The figures `labctl.analysis.plots.plot_run` draws of a run, in the order it writes them: the headline
(one port's recovery on a log time axis, Opus Figure 9 style), the timeline of the same reconfiguration
(every port, per rail), the distributions of every phase."""
WORKER_FIGURES: tuple[tuple[str, ...], ...] = (("headline", "timeline"), ("distributions",))
"""The figures each of a run's two figure workers draws (labctl.analysis.pool): the headline and the
timeline show the same reconfiguration and are on record at the same moment, so one worker draws both."""
DRAWN_WITH: dict[str, tuple[str, ...]] = {"timeline": ("headline",)}
"""Asked to draw a figure ahead, a worker draws these too: what they show is on record at the same time."""
ALL_FORMATS = ("png", "svg", "pdf")
DEFAULT_FORMATS = ("png",)
"""What a run draws on its way out: the PNG a user looks at first. SVG and PDF (for LaTeX: text stays text)
cost ~4x the PNG's time on a busy 2-core host, so they are drawn on request (`labctl plot --format`,
`labctl run --plot-format`, an experiment's `analysis.plot_formats`)."""
