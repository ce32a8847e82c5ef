"""The figures a reviewer reads (issue 27): the headline (one port, Opus Figure 9 style), every rail visible
in the timeline and a zoom that shows every mark, the distributions in pipeline order with the down side
apart. Checked on their artists, never their pixels; inputs are synthesised events (test_plots)."""

from __future__ import annotations

from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.colors import to_hex

from labctl.analysis.distributions_plot import distributions_figure
from labctl.analysis.headline_plot import headline_figure, median_port
from labctl.analysis.plot_style import MARKS
from labctl.analysis.timeline_plot import timeline_figure
from tests.integration.test_plots import axis, by_gid, synth

PIPELINE = ["switch", "optical", "firmware", "carrier", "transport", "total"]
MARK_COLUMNS = [m[0] for m in MARKS]


def _one(fig: Any, gid: str) -> Any:
    (artist,) = by_gid(fig, gid)
    return artist


def test_the_headline_is_one_port_with_its_marks_on_a_broken_time_axis() -> None:
    """Seconds of firmware after milliseconds of switching and light: two linear windows, the marks t0–t2
    in the first and t3–t5 in the second, each on a line of its own, labelled with its time, top to bottom
    in pipeline order."""
    index, frame = synth(firmware_ms=6000)
    rows = frame[frame["reconfig"] == 1].sort_values("rail", kind="stable").reset_index(drop=True)
    row = rows.iloc[median_port(rows)]
    t0 = int(row["t0_command_ns"])
    fig = headline_figure(index, frame, 1)
    try:
        first, second = axis(fig, "headline-rx"), axis(fig, "headline-rx-2")
        assert first.get_xscale() == second.get_xscale() == "linear"
        assert first.get_xlim()[0] < 0 < first.get_xlim()[1] < 0.1 and second.get_xlim()[0] > 5.0
        title = fig.get_suptitle()
        assert f"port {row['host']}/{row['port']}" in title and "median of 8 ports" in title
        # the marks: t0 at the command, then t1..t5 at the port's own times, in the window that holds them
        lines = [_one(fig, f"headline-mark-t{k}") for k in range(6)]
        assert [line.axes for line in lines] == [first] * 3 + [second] * 3
        expected = [0.0, *((float(row[c]) - t0) / 1e9 for c in MARK_COLUMNS)]
        assert [line.get_xdata()[0] for line in lines] == pytest.approx(expected)
        labels = [_one(fig, f"headline-label-t{k}") for k in range(6)]
        assert [label.get_text().split()[0] for label in labels] == [f"t{k}" for k in range(6)]
        assert "6." in labels[3].get_text() and " s" in labels[3].get_text()  # t3 in seconds
        assert "(+" in labels[4].get_text()  # carrier: after firmware
        ys = [label.xy[1] for label in labels]
        assert ys == sorted(ys, reverse=True) and len(set(ys)) == 6  # pipeline order, top to bottom
        # each mark's spread over the ports (p5–p95) where they differ; the Rx power of the port and of all
        spread = _one(fig, "headline-spread-t3").get_xdata()
        t3 = (rows["t3_firmware_up_ns"].to_numpy(float) - t0) / 1e9
        assert list(spread) == pytest.approx(list(np.percentile(t3, [5, 95])))
        assert {a.axes for a in by_gid(fig, "headline-rx-trace")} == {first, second}
        assert {a.axes for a in by_gid(fig, "headline-rx-spread")} == {first, second}
        assert {line.axes for line in by_gid(fig, "rx-threshold")} == {first, second}
        states = axis(fig, "headline-states")
        assert [t.get_text() for t in states.get_yticklabels()] == [
            "OCS switching",
            "firmware link",
            "carrier",
            "traffic",
        ]
    finally:
        plt.close(fig)


def test_a_sampled_mark_shows_its_bracket() -> None:
    index, frame = synth(firmware_ms=6000)
    rows = frame[frame["reconfig"] == 1].sort_values("rail", kind="stable").reset_index(drop=True)
    row = rows.iloc[median_port(rows)]
    fig = headline_figure(index, frame, 1)
    try:
        for k in (2, 3, 4, 5):
            res = row[f"t{k}_resolution_ns"]
            brackets = by_gid(fig, f"headline-bracket-t{k}")
            if res and res > 0:
                (bracket,) = brackets
                x = bracket.get_xdata()
                assert x[1] - x[0] == pytest.approx(float(res) / 1e9)
                assert "bracket" in _one(fig, f"headline-label-t{k}").get_text()
            else:  # stamped as it happened: nothing to bracket
                assert brackets == []
        assert any(row[f"t{k}_resolution_ns"] for k in (2, 3, 4, 5)), "the synthetic run samples t2"
    finally:
        plt.close(fig)


def test_the_headline_of_a_fast_lab_and_of_one_that_did_not_recover() -> None:
    index, frame = synth()  # firmware in 40 ms: still ms then tens of ms, two windows
    fig = headline_figure(index, frame, 1)
    try:
        assert len([a for a in fig.axes if (a.get_gid() or "").startswith("headline-rx")]) == 2
    finally:
        plt.close(fig)
    index, frame = synth(recover=False)
    fig = headline_figure(index, frame, 2)
    try:  # the switch done, then nothing: the window runs on to the end of the run
        assert by_gid(fig, "headline-mark-t1") and not by_gid(fig, "headline-mark-t3")
        assert "none recovered" in fig.get_suptitle() and "port h" in fig.get_suptitle()
    finally:
        plt.close(fig)


def test_every_rail_shows_in_the_timeline_in_its_own_colour() -> None:
    """Rail 0's traces coincide with rail 1's: drawn wider, solid and under them, so both show; the OCS lane's
    bar of each rail is in the rail's colour, as its label and its traces."""
    index, frame = synth(ports_per_rail=4, firmware_ms=6000)
    fig = timeline_figure(index, frame, 1)
    try:
        for gid in ("rx-full", "rx-zoom", "rx-zoom-2"):
            rx = axis(fig, gid)
            lines = {
                rail: [line for line in rx.get_lines() if line.get_gid() == f"rx-rail-{rail}"]
                for rail in (0, 1)
            }
            assert len(lines[0]) == len(lines[1]) == 4
            zero, one = lines[0][0], lines[1][0]
            assert zero.get_linewidth() > one.get_linewidth() and zero.get_zorder() < one.get_zorder()
            assert zero.get_linestyle() != one.get_linestyle()
        ocs = axis(fig, "ocs-full")
        labels = {t.get_text(): to_hex(t.get_color()) for t in ocs.get_yticklabels()}
        rx = axis(fig, "rx-full")
        for rail in (0, 1):
            (bar,) = [p for p in ocs.patches if p.get_gid() == f"ocs-rail-{rail}"]
            trace = next(line for line in rx.get_lines() if line.get_gid() == f"rx-rail-{rail}")
            assert to_hex(bar.get_facecolor()) == labels[f"rail {rail}"] == to_hex(trace.get_color())
        assert labels["rail 0"] != labels["rail 1"]
    finally:
        plt.close(fig)


@pytest.mark.parametrize("ports_per_rail", [4, 20])
def test_the_zoom_shows_every_mark(ports_per_rail: int) -> None:
    """Opus-testbed-like delays (firmware ~6 s): the zoom is two windows, and every mark (each port's, or
    each rail's median and spread) lies in one of them."""
    index, frame = synth(ports_per_rail=ports_per_rail, firmware_ms=6000)
    fig = timeline_figure(index, frame, 1)
    try:
        zooms = [axis(fig, "lanes-zoom"), axis(fig, "lanes-zoom-2")]
        assert zooms[0].get_xlim()[1] < 0.1 < 5.0 < zooms[1].get_xlim()[0]
        assert axis(fig, "ocs-zoom").get_title().startswith("zoom: first")
        for k in range(1, 6):
            shown = 0
            for zoom in zooms:
                lo, hi = zoom.get_xlim()
                for mark in (a for a in by_gid(fig, f"mark-t{k}") if a.axes is zoom):
                    shown += int(np.sum((mark.get_xdata() >= lo) & (mark.get_xdata() <= hi)))
            assert shown == (8 if ports_per_rail == 4 else 2), f"t{k}"
    finally:
        plt.close(fig)


def test_a_timeline_of_many_ports_has_one_row_per_rail() -> None:
    index, frame = synth(ports_per_rail=8)
    fig = timeline_figure(index, frame, 1)
    try:
        lanes = axis(fig, "lanes-full")
        assert [t.get_text() for t in lanes.get_yticklabels()] == ["rail 0\n8 ports", "rail 1\n8 ports"]
    finally:
        plt.close(fig)


def _top_to_bottom(ax: Any) -> list[str]:
    ticks = sorted(
        zip(ax.get_yticks(), (t.get_text() for t in ax.get_yticklabels()), strict=True), reverse=True
    )
    return [text.split(" (")[0] for _, text in ticks]


def test_distributions_run_in_pipeline_order_with_the_down_side_apart() -> None:
    _, frame = synth(firmware_ms=6000)
    fig = distributions_figure(frame)
    try:
        assert _top_to_bottom(axis(fig, "box-recovery")) == PIPELINE
        assert _top_to_bottom(axis(fig, "box-down")) == ["carrier_down", "traffic_lost"]
        cdfs = [a for a in fig.axes if (a.get_gid() or "").startswith("cdf-")]
        fig.canvas.draw()  # positions after the layout
        # reading order: left to right, then down
        order = sorted(cdfs, key=lambda a: (-round(a.get_position().y0, 3), a.get_position().x0))
        assert [a.get_gid().removeprefix("cdf-") for a in order] == [
            *PIPELINE,
            "carrier_down",
            "traffic_lost",
        ]
        for cdf in cdfs:  # unit on the axis, n with its unit in the title
            assert cdf.get_xlabel().split(",")[0] in ("s", "ms", "µs")
            assert "\nn=" in cdf.get_title(loc="left")
    finally:
        plt.close(fig)
