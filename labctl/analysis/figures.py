"""Which figures a run has and the formats they come in (imported by the figures' renderer and by the
processes that run it, without matplotlib)."""

from __future__ import annotations

FIGURES = ("timeline", "distributions")
"""The figures `labctl.analysis.plots.plot_run` draws of a run; labctl.analysis.pool draws one per worker."""
ALL_FORMATS = ("png", "svg", "pdf")
DEFAULT_FORMATS = ("png",)
"""What a run draws on its way out: the PNG a user looks at first. SVG and PDF (for LaTeX: text stays text)
cost ~4x the PNG's time on a busy 2-core host, so they are drawn on request (`labctl plot --format`,
`labctl run --plot-format`, an experiment's `analysis.plot_formats`)."""
