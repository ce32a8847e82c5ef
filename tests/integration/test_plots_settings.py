"""A tune run's figures by link setting (decision 0080), measured by their artists: one panel per setting
in the order measured, each titled with its setting (the reference said), every phase label giving n and
its unit, and no two texts overlapping."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import pytest

from labctl.analysis.plot_style import styled
from labctl.analysis.settings_plots import (
    plot_settings,
    settings_distributions_figure,
    settings_of,
    settings_timeline_figure,
)
from tests.unit.test_catalog import breakdown_frame
from tests.unit.test_settings_pooled import ORDER, tune_frame

REFERENCE = "autoneg=on,fec=rs"


def _texts(fig: Any) -> list[Any]:
    fig.canvas.draw()
    texts = [t for t in fig.findobj(plt.Text) if t.get_visible() and t.get_text().strip()]
    return [t for t in texts if t.get_window_extent().width > 0]


def _overlaps(fig: Any) -> list[tuple[str, str]]:
    boxes = [(t.get_text(), t.get_window_extent()) for t in _texts(fig)]
    return [(a, b) for (a, box_a), (b, box_b) in itertools.combinations(boxes, 2) if box_a.overlaps(box_b)]


@pytest.mark.parametrize("draw", [settings_distributions_figure, settings_timeline_figure])
def test_one_panel_per_setting_titled_with_it_and_no_text_overlaps(draw: Any) -> None:
    frame = tune_frame(1)
    with styled(None):
        fig = draw(frame, REFERENCE)
        try:
            titles = [ax.get_title(loc="left") for ax in fig.axes]
            assert len(fig.axes) == len(ORDER) == len(settings_of(frame))
            for title, label in zip(titles, ORDER, strict=True):
                assert title.startswith(label)
                assert ("(reference)" in title) == (label == REFERENCE)
            assert _overlaps(fig) == []
            panels = [ax.get_position() for ax in fig.axes]
            for a, b in itertools.pairwise(panels):  # side by side or one above the other, never on top
                assert not a.overlaps(b)
        finally:
            plt.close(fig)


def test_the_distributions_name_each_phase_with_n_and_unit() -> None:
    frame = tune_frame(2)
    with styled(None):
        fig = settings_distributions_figure(frame, REFERENCE)
        try:
            labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
            assert any(text.startswith("firmware (n=") and text.endswith(" ports)") for text in labels)
            assert any(text.startswith("total (n=") and "circuit ends" in text for text in labels)
            assert fig.axes[0].get_xscale() == "log"
        finally:
            plt.close(fig)


def test_the_timelines_share_one_time_axis_and_name_each_median(tmp_path: Path) -> None:
    frame = tune_frame(3)
    with styled(None):
        fig = settings_timeline_figure(frame, REFERENCE)
        try:
            assert len({ax.get_xlim() for ax in fig.axes}) == 1
            assert all("median total" in ax.get_xlabel() for ax in fig.axes)
            assert all(len(ax.collections) == 5 for ax in fig.axes)  # a bar per phase
        finally:
            plt.close(fig)
    paths = plot_settings(frame, tmp_path, reference=REFERENCE)
    assert [p.name for p in paths] == ["settings-distributions.png", "settings-timeline.png"]
    assert plot_settings(breakdown_frame(1), tmp_path / "none") == []
