"""A run's derived files from its `events.jsonl` alone: breakdown.csv/.parquet, summary.json, figures."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from labctl.analysis.breakdown import compute_breakdown
from labctl.analysis.breakdown_table import write_breakdown
from labctl.analysis.clock_uncertainty import clock_caveats, clock_uncertainties
from labctl.analysis.event_index import EventIndex
from labctl.analysis.figures import FIGURES
from labctl.analysis.phase_stats import summarize
from labctl.analysis.settings import by_setting
from labctl.analysis.store import read_run_json
from labctl.core.fileio import write_json_atomic

if TYPE_CHECKING:
    from labctl.analysis.figures_ahead import DrawnFigure


def _breakdown(run_dir: Path, threshold_dbm: float | None) -> tuple[EventIndex, dict[str, Any], Any]:
    """The run's events, clock offsets and breakdown frame, from its files."""
    index = EventIndex.from_file(run_dir / "events.jsonl")
    offsets = read_run_json(run_dir).get("clock_offsets") or {}
    return index, offsets, compute_breakdown(index, threshold_dbm, clock_uncertainties(offsets))


@dataclass(eq=False)
class Summarized:
    """A run's summary worked out ahead, from the events on record (summarize_ahead), for analyse to use
    if the whole run's breakdown and clock offsets are the same (the summary is a function of them)."""

    frame: Any
    offsets: dict[str, Any]
    summary: dict[str, Any]
    kept: bool = False
    """Set by analyse when it used this summary rather than work it out again."""


def summarize_ahead(run_dir: Path, threshold_dbm: float | None) -> Summarized:
    """The summary of the events on record so far (ask once the last reconfiguration is done)."""
    _, offsets, frame = _breakdown(run_dir, threshold_dbm)
    return Summarized(frame, offsets, _summary(frame, offsets))


def _summary(frame: Any, offsets: dict[str, Any]) -> dict[str, Any]:
    summary = summarize(frame)
    summary["clock_caveats"] = clock_caveats(frame, offsets)
    settings = by_setting(frame, frame.attrs.get("link_setting_reference"))
    if settings is not None:  # a tune run: each link setting's link-up, against the reference
        summary["by_link_setting"] = settings
    return summary


def analyse(
    run_dir: Path,
    threshold_dbm: float | None = None,
    *,
    plot_formats: Sequence[str] = ("png",),
    figures: Sequence[str] = FIGURES,
    drawn: Sequence[DrawnFigure] = (),
    summarized: Summarized | None = None,
) -> dict[str, Any]:
    """(Re)compute breakdown.csv/.parquet, summary.json and the plots (`figures` of plot_run's, in
    `plot_formats`; none if empty) of a run from its events.jsonl. `drawn`: see plot_run; `summarized`:
    a summary worked out ahead, used if the whole run gives the same breakdown."""
    index, offsets, frame = _breakdown(run_dir, threshold_dbm)
    if summarized is not None and summarized.offsets == offsets and summarized.frame.equals(frame):
        summarized.kept = True
        summary = summarized.summary
    else:
        summary = _summary(frame, offsets)
    write_breakdown(frame, run_dir)
    write_json_atomic(run_dir / "summary.json", summary)
    if plot_formats:
        draw(
            run_dir,
            threshold_dbm,
            plot_formats=plot_formats,
            figures=figures,
            computed=(index, frame),
            drawn=drawn,
        )
    return summary


def draw(
    run_dir: Path,
    threshold_dbm: float | None,
    *,
    plot_formats: Sequence[str],
    figures: Sequence[str] = FIGURES,
    computed: tuple[EventIndex, Any] | None = None,
    drawn: Sequence[DrawnFigure] = (),
) -> None:
    """Only the figures (no breakdown or summary file, no statistics): what a second process drawing the
    other figure does (labctl.analysis.pool). `computed`: the events and breakdown already at hand."""
    from labctl.analysis.plots import plot_run

    if computed is None:
        index, _, frame = _breakdown(run_dir, threshold_dbm)
    else:
        index, frame = computed
    plot_run(run_dir, frame=frame, index=index, formats=plot_formats, figures=figures, drawn=drawn)
    if "distributions" in figures:  # with them, a tune run's figures by link setting (decision 0080)
        from labctl.analysis.settings_plots import plot_settings, settings_of

        if settings_of(frame):
            from labctl.analysis.settings import reference_of
            from labctl.analysis.store import read_run_json

            reference = frame.attrs.get("link_setting_reference")
            if reference is None and (run_dir / "run.json").is_file():
                reference = reference_of(read_run_json(run_dir))
            plot_settings(frame, run_dir, reference=reference, formats=plot_formats)


def draw_ahead(
    run_dir: Path, threshold_dbm: float | None, figure: str, *, plot_formats: Sequence[str]
) -> DrawnFigure | None:
    """One of the run's figures from the events on record so far, rendered in memory, once what it shows
    is on record (see labctl.analysis.figures_ahead.draw_ahead); None before. `analyse` and `draw` (`drawn=`)
    write it at the end if the whole run's events give the same data, and draw it again otherwise."""
    from labctl.analysis.figures_ahead import draw_ahead as draw_figure_ahead

    index, _, frame = _breakdown(run_dir, threshold_dbm)
    return draw_figure_ahead(figure, index, frame, threshold_dbm=threshold_dbm, formats=plot_formats)


def time_sync_lines(meta: dict[str, Any]) -> list[str]:
    """What `labctl report` says of the clocks that stamped a run's marks (run.json `time_sync` and
    `clock_offsets`). Where one clock stamps every mark (a simulated or kernel lab, or agents that share the
    controller's kernel clock) no phase crosses clocks, so the controller's synchronization is one line of
    context, not a warning. Where agents' own clocks stamp marks, each host's discipline is listed, and a
    clock without one is said to be NOT synchronized."""
    from labctl.core.units import fmt_ns

    syncs = meta.get("time_sync")
    syncs = syncs if isinstance(syncs, dict) else {}
    offsets = meta.get("clock_offsets")
    offsets = offsets if isinstance(offsets, dict) else {}
    shared = sorted(
        h for h, rec in offsets.items() if isinstance(rec, dict) and rec.get("source") == "shared-clock"
    )
    own = sorted(h for h in offsets if h not in shared)
    if not own:
        sharing = f", which {', '.join(shared)} share{'s' if len(shared) == 1 else ''}" if shared else ""
        return [
            f"time sync: one clock stamps every mark (the controller's monotonic clock{sharing}): no phase "
            "crosses clocks, so none depends on clock synchronization"
        ]
    lines = []
    for host, sync in syncs.items():
        if not isinstance(sync, dict) or host in shared:
            continue
        state = "synchronized" if sync.get("synchronized") else "NOT synchronized"
        daemons = ", ".join(sync.get("daemons") or []) or "no time daemon"
        est_us = sync.get("est_error_us")
        est = fmt_ns(int(est_us) * 1000) if isinstance(est_us, int | float) else "unknown"
        lines.append(f"time sync {host}: {state} ({daemons}; est. error {est})")
    if shared:
        verb = "shares" if len(shared) == 1 else "share"
        lines.append(f"time sync: {', '.join(shared)} {verb} the controller's clock (no offset to bound)")
    return lines
