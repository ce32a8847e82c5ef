"""The headline and distributions figures as they render (issue 45): measured on the drawn figure (the
renderer's text extents, line and patch data, colours), never by eye. Inputs are synthesised events
(test_plots.synth): the switch done 3 ms after the command, the light back 1 ms later (a 1 ms bracket),
firmware link then carrier 100 µs apart (two mark lines a pixel apart), traffic after."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.colors import to_rgba
from matplotlib.transforms import Bbox

from labctl.analysis.distributions_plot import distributions_figure
from labctl.analysis.headline_labels import NEAR_PX
from labctl.analysis.headline_plot import headline_figure, median_port
from labctl.analysis.plot_style import NO_LIGHT_DBM
from tests.integration.test_plots import axis, by_gid, synth

MS = 1_000_000


@pytest.fixture
def headline() -> Iterator[tuple[Any, Any]]:
    """A headline of a run whose DOM sampler names the lit sample before the first dark one (0.6 ms)."""
    index, frame = synth(loss_prev_us=600)
    fig = headline_figure(index, frame, 1)
    fig.canvas.draw()
    try:
        yield fig, frame
    finally:
        plt.close(fig)


def _rx_axes(fig: Any) -> list[Any]:
    return [a for a in fig.axes if (a.get_gid() or "").startswith("headline-rx")]


def _labels(fig: Any) -> list[Any]:
    return [
        t
        for ax in _rx_axes(fig)
        for t in ax.texts
        if (t.get_gid() or "").startswith(("headline-label-", "headline-floor-label"))
    ]


def _mark_lines_px(ax: Any) -> dict[str, float]:
    return {
        line.get_gid().removeprefix("headline-mark-"): float(
            ax.transData.transform((line.get_xdata()[0], 0))[0]
        )
        for line in ax.get_lines()
        if (line.get_gid() or "").startswith("headline-mark-")
    }


def _overlap(a: Bbox, b: Bbox) -> float:
    w = min(a.x1, b.x1) - max(a.x0, b.x0)
    h = min(a.y1, b.y1) - max(a.y0, b.y0)
    return w * h if w > 0 and h > 0 else 0.0


def test_rx_power_breaks_over_the_bracket_the_light_went_out_in(headline: tuple[Any, Any]) -> None:
    """The first dark sample came 0.6 ms after the last lit one: the trace holds the light only to the lit
    sample, draws nothing over the bracket (shaded instead), then the floor from the dark sample; likewise
    over t2's bracket. So the firmware link going down inside the bracket does not precede the light."""
    fig, frame = headline
    rows = frame[frame["reconfig"] == 1].sort_values("rail", kind="stable").reset_index(drop=True)
    row = rows.iloc[median_port(rows)]
    t0 = int(row["t0_command_ns"])
    first = axis(fig, "headline-rx")
    dark = 1e-3  # synth: the dark sample 2 ms after the phase starts, the command 1 ms after it
    lit = dark - 0.6e-3
    (lost,) = [a for a in by_gid(fig, "headline-light-lost") if a.axes is first]
    verts = lost.get_paths()[0].vertices
    assert verts[:, 0].min() == pytest.approx(lit) and verts[:, 0].max() == pytest.approx(dark)
    assert verts[:, 1].min() == pytest.approx(NO_LIGHT_DBM) and verts[:, 1].max() == pytest.approx(-3.0)
    (back,) = [a for a in by_gid(fig, "headline-light-back") if a.axes is first]
    t2 = (float(row["t2_rx_power_ns"]) - t0) / 1e9
    res = float(row["t2_resolution_ns"]) / 1e9
    assert back.get_paths()[0].vertices[:, 0].min() == pytest.approx(t2 - res)
    (trace,) = [a for a in by_gid(fig, "headline-rx-trace") if a.axes is first]
    x, y = (np.asarray(v, dtype=float) for v in trace.get_data())
    # drawn as a 'post' step: each point's value holds to the next point; no finite segment in a bracket
    for a, b in ((lit, dark), (t2 - res, t2)):
        held = [(x0, x1) for x0, x1, y0 in zip(x, x[1:], y, strict=False) if np.isfinite(y0) and x1 > x0]
        assert not [(x0, x1) for x0, x1 in held if x0 < b - 1e-12 and x1 > a + 1e-12], (a, b)
    assert y[np.searchsorted(x, lit - 1e-9) - 1] == pytest.approx(-3.0)  # lit up to the last lit sample
    assert y[np.searchsorted(x, dark - 1e-9)] == pytest.approx(NO_LIGHT_DBM)  # dark from the first dark one
    # the firmware link went down (synth: at the dark sample) inside the bracket, never before it
    firmware_down = 1e-3
    assert lit <= firmware_down <= dark


@pytest.mark.parametrize("firmware_ms", [40, 6000])
def test_mark_labels_cross_no_mark_line_nor_one_another_and_stay_in_their_axes(firmware_ms: int) -> None:
    """The labels of t0–t5 and of the floor, measured as rendered: inside their window's axes, crossing no
    other mark's line (t1 is 1 ms right of t2's; t3 and t4 a pixel apart), none overlapping another."""
    index, frame = synth(firmware_ms=firmware_ms, loss_prev_us=600)
    fig = headline_figure(index, frame, 1)
    try:
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        labels = _labels(fig)
        assert {t.get_gid() for t in labels} >= {f"headline-label-t{k}" for k in range(6)}
        boxes = {t.get_gid(): t.get_window_extent(renderer) for t in labels}
        for t in labels:
            box, ax = boxes[t.get_gid()], t.axes
            inside = ax.get_window_extent(renderer)
            assert inside.x0 <= box.x0 and box.x1 <= inside.x1, t.get_gid()
            assert inside.y0 <= box.y0 and box.y1 <= inside.y1, t.get_gid()
            own = t.get_gid().removeprefix("headline-label-")
            crossed = [m for m, px in _mark_lines_px(ax).items() if m != own and box.x0 < px < box.x1]
            assert not crossed, f"{t.get_gid()} {t.get_text()!r} crosses {crossed}"
        for a, b in itertools.combinations(labels, 2):
            assert _overlap(boxes[a.get_gid()], boxes[b.get_gid()]) == 0, (a.get_text(), b.get_text())
    finally:
        plt.close(fig)


def test_marks_a_pixel_apart_both_show(headline: tuple[Any, Any]) -> None:
    """t3 and t4 (100 µs apart) would draw one line over the other: the later is dashed, so the earlier
    shows through; each keeps a row and a label of its own."""
    fig, _ = headline
    second = axis(fig, "headline-rx-2")
    px = _mark_lines_px(second)
    assert abs(px["t4"] - px["t3"]) < NEAR_PX
    t3, t4 = (
        next(a for a in second.get_lines() if a.get_gid() == f"headline-mark-{m}") for m in ("t3", "t4")
    )
    assert t3.get_linestyle() == "-" and t4.get_linestyle() != "-"
    labels = {t.get_gid(): t for t in _labels(fig)}
    renderer = fig.canvas.get_renderer()
    b3, b4 = (labels[f"headline-label-{m}"].get_window_extent(renderer) for m in ("t3", "t4"))
    assert b3.y0 > b4.y1  # t3 above t4, in pipeline order
    assert labels["headline-label-t3"].get_text().startswith("t3 ")
    assert labels["headline-label-t4"].get_text().startswith("t4 ")


def test_the_floor_is_labelled(headline: tuple[Any, Any]) -> None:
    fig, _ = headline
    (label,) = by_gid(fig, "headline-floor-label")
    assert "no light" in label.get_text() and "40 dBm" in label.get_text()
    assert label.xy[1] < NO_LIGHT_DBM  # under the floor line, where no trace is drawn
    assert label.axes.get_ylim()[0] < label.xy[1]
    assert {line.axes for line in by_gid(fig, "headline-floor")} == set(_rx_axes(fig))


def test_the_legend_swatches_are_the_plotted_artists_colours(headline: tuple[Any, Any]) -> None:
    fig, _ = headline
    (legend,) = fig.legends
    swatches = dict(zip((t.get_text() for t in legend.get_texts()), legend.legend_handles, strict=True))
    (bracket_label,) = [text for text in swatches if text.startswith("bracket")]
    swatch = swatches[bracket_label]
    (plotted,) = by_gid(fig, "headline-bracket-t2")
    assert to_rgba(swatch.get_color(), swatch.get_alpha()) == to_rgba(
        plotted.get_color(), plotted.get_alpha()
    )
    assert swatch.get_linewidth() == plotted.get_linewidth()
    for name in ("lost", "back"):
        (text,) = [t for t in swatches if t.startswith(f"light {name}")]
        span = by_gid(fig, f"headline-light-{name}")[0]
        assert tuple(swatches[text].get_facecolor()) == pytest.approx(tuple(span.get_facecolor()[0]))


def test_each_window_says_what_its_time_axis_is(headline: tuple[Any, Any]) -> None:
    """The x label names t0 and the unit its ticks read on each side of the break; no bare "(axis broken)"."""
    fig, _ = headline
    first, second = axis(fig, "headline-rx"), axis(fig, "headline-rx-2")
    assert "since the OCS command t0" in first.get_xlabel()
    assert "break" in second.get_xlabel()
    for ax in (first, second):
        unit = ax.get_xlabel().rsplit("(", 1)[1].rstrip(")")
        ticks = [t.get_text() for t in ax.get_xticklabels() if t.get_text() not in ("", "0")]
        assert ticks and all(t.endswith(f" {unit}") for t in ticks), (ax.get_xlabel(), ticks)


def _tick_boxes(ax: Any, renderer: Any) -> list[tuple[str, Bbox]]:
    lo, hi = ax.get_xlim()
    return [
        (t.get_text(), t.get_window_extent(renderer))
        for tick, t in zip(ax.get_xticks(), ax.get_xticklabels(), strict=True)
        if t.get_visible() and t.get_text() and lo <= tick <= hi
    ]


@pytest.mark.parametrize("figsize", [None, "6, 4"])
def test_the_distributions_log_axis_reads_at_its_size(figsize: str | None, tmp_path: Any) -> None:
    """The box plots' log duration axis: labelled in plain units (200 µs, 3 ms), enough labels to read a
    box against, none running into another, at the default size and at a small one; each phase's median
    printed under its name; the boxes drawn over the dots."""
    style = None
    if figsize is not None:
        style = tmp_path / "small.mplstyle"
        style.write_text(f"figure.figsize: {figsize}\n")
    _, frame = synth(firmware_ms=6000)
    fig = distributions_figure(frame, style=style)
    try:
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        for gid in ("box-recovery", "box-down"):
            ax = axis(fig, gid)
            ticks = _tick_boxes(ax, renderer)
            assert len(ticks) >= (3 if figsize is None else 2), ticks
            assert all(text.endswith((" µs", " ms", " s")) for text, _ in ticks), ticks
            for (a, box_a), (b, box_b) in itertools.pairwise(ticks):
                assert _overlap(box_a, box_b) == 0 and box_a.x1 < box_b.x0, (a, b)
            for label in ax.get_yticklabels():
                assert "\nmedian " in label.get_text()
            boxes = [line for line in ax.get_lines() if line.get_zorder() >= 3]
            dots = ax.collections
            assert boxes and dots and min(b.get_zorder() for b in boxes) > max(d.get_zorder() for d in dots)
    finally:
        plt.close(fig)
