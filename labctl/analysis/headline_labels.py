"""Placing the headline's labels: each mark's label beside its line and the floor's label under its line,
where it stays inside its axes, crosses no mark line and overlaps no other label, marker, bracket or
spread (measured in pixels after the figure's layout)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any, Protocol

from matplotlib.lines import Line2D
from matplotlib.transforms import Bbox

from labctl.analysis.plot_style import NO_LIGHT_DBM


class LabelledMark(Protocol):
    """A mark as its label is placed: its name (its artists' gids end in it) and the forms its label may
    take (one line, then wrapped)."""

    @property
    def name(self) -> str: ...

    @property
    def texts(self) -> tuple[str, ...]: ...


LABEL_PAD_PT = 3.0
"""Points between a label and the mark line it stands beside."""
NEAR_PX = 3.0
"""Mark lines closer than this (pixels) would hide one another: the later is drawn dashed over the other."""
FLOOR_TEXT = f"floor {NO_LIGHT_DBM:g} dBm: no light".replace("-", "−")


def place_headline_labels(fig: Any, rx_axes: Sequence[Any], marks: Sequence[LabelledMark]) -> None:
    """Place each mark's label (top to bottom in pipeline order) and the floor's label where it stays inside
    its axes, crosses no mark line and overlaps no other label, marker, bracket or spread: the label's text
    measured (renderer extents, after the figure's layout) beside its own line, on the side with room,
    then wrapped, then beside the next line over (a mark too close to its neighbour is labelled beside the
    pair, on its own row); failing all, the candidate with the least overlap. Mark lines closer than
    NEAR_PX are drawn dashed over one another so both show."""
    engine = fig.get_layout_engine()
    if engine is not None:
        engine.execute(fig)  # labels stay out of the layout (in_layout False): it holds after they move
    renderer = fig.canvas.get_renderer()
    placed: list[Any] = []  # Bboxes of the labels placed so far
    for ax in rx_axes:
        lines = [a for a in ax.get_lines() if str(a.get_gid()).startswith("headline-mark-")]
        px = {str(a.get_gid()).removeprefix("headline-mark-"): _px(ax, a.get_xdata()[0]) for a in lines}
        order = sorted(lines, key=lambda a: px[str(a.get_gid()).removeprefix("headline-mark-")])
        for before, after in itertools.pairwise(order):
            if abs(_px(ax, after.get_xdata()[0]) - _px(ax, before.get_xdata()[0])) < NEAR_PX:
                after.set_linestyle((0, (3, 2)))
                states_line = next(
                    (a for a in fig.findobj(Line2D) if a.get_gid() == f"{after.get_gid()}-states"), None
                )
                if states_line is not None:
                    states_line.set_linestyle((0, (3, 2)))
        obstacles = {  # a label may stand beside its own marker (a tall '|' for t0, t1), not on others'
            str(a.get_gid()): _padded(a.get_window_extent(renderer), 0.5 * a.get_linewidth() * fig.dpi / 72)
            for a in ax.get_lines()
            if str(a.get_gid()).startswith(("headline-bracket-", "headline-spread-", "headline-marker-"))
        }
        lines_px = sorted(px.values())
        for mark in marks:
            label = next((t for t in ax.texts if t.get_gid() == f"headline-label-{mark.name}"), None)
            if label is None:
                continue
            own = px[mark.name]
            right = [own, *(p for p in lines_px if p > own)]
            left = [own, *sorted((p for p in lines_px if p < own), reverse=True)]
            room_right = (right[1] if len(right) > 1 else ax.bbox.x1) - own
            room_left = own - (left[1] if len(left) > 1 else ax.bbox.x0)
            sides = ("right", "left") if room_right >= room_left else ("left", "right")
            candidates = [
                (anchors[rank], side, text)
                for rank in range(len(lines_px))
                for text in mark.texts
                for side, anchors in ((s, right if s == "right" else left) for s in sides)
                if rank < len(anchors)
            ]
            others = [box for gid, box in obstacles.items() if gid != f"headline-marker-{mark.name}"]
            placed.append(_place(label, ax, candidates, renderer, lines_px, [*others, *placed]))
    floor: tuple[float, Any, Any] | None = None
    for ax in reversed(list(rx_axes)):  # under the floor line: right end of the last window first
        lines_px = sorted(
            _px(ax, a.get_xdata()[0]) for a in ax.get_lines() if str(a.get_gid()).startswith("headline-mark-")
        )
        label = ax.annotate(
            FLOOR_TEXT,
            (0, NO_LIGHT_DBM - 2),
            xytext=(LABEL_PAD_PT, 0),
            textcoords="offset points",
            ha="left",
            va="center",
            fontsize="x-small",
            color="0.3",
            gid="headline-floor-label",
            annotation_clip=False,
        )
        label.set_in_layout(False)
        ends = [ax.bbox.x1 - 1, ax.bbox.x0 + 1]
        candidates = [
            (ends[0], "left", FLOOR_TEXT),
            *((p, "right", FLOOR_TEXT) for p in reversed(lines_px)),
            *((p, "left", FLOOR_TEXT) for p in lines_px),
            (ends[1], "right", FLOOR_TEXT),
        ]
        box = _place(label, ax, candidates, renderer, lines_px, placed)
        cost = _cost(box, ax.bbox, lines_px, placed)
        if floor is None or cost < floor[0]:
            if floor is not None:
                floor[1].remove()
            floor = (cost, label, box)
        else:
            label.remove()
        if cost == 0:
            break


def _px(ax: Any, x: float) -> float:
    return float(ax.transData.transform((x, 0))[0])


def _padded(box: Any, pad: float) -> Any:
    return Bbox.from_extents(box.x0 - pad, box.y0 - pad, box.x1 + pad, box.y1 + pad)


def _overlap(a: Any, b: Any) -> float:
    w = min(a.x1, b.x1) - max(a.x0, b.x0)
    h = min(a.y1, b.y1) - max(a.y0, b.y0)
    return w * h if w > 0 and h > 0 else 0.0


def _cost(box: Any, inside: Any, lines_px: Sequence[float], taken: Sequence[Any]) -> float:
    """How badly a label's box sits: its area outside the axes, each mark line it crosses, its overlaps."""
    outside = box.width * box.height - _overlap(box, inside)
    crossed = sum(box.x0 < p < box.x1 for p in lines_px)
    return float(10 * outside + 100 * box.height * crossed + sum(_overlap(box, t) for t in taken))


def _place(
    label: Any,
    ax: Any,
    candidates: Sequence[tuple[float, str, str]],
    renderer: Any,
    lines_px: Sequence[float],
    taken: Sequence[Any],
) -> Any:
    """Put `label` at the first candidate (anchor in pixels, side of it, text) that costs nothing, else at
    the cheapest; returns its box (padded by its background)."""
    best: tuple[float, int] | None = None
    for i, candidate in enumerate(candidates):
        cost = _cost(_try(label, ax, candidate, renderer), ax.bbox, lines_px, taken)
        if best is None or cost < best[0]:
            best = (cost, i)
        if cost == 0:
            break
    assert best is not None
    return _try(label, ax, candidates[best[1]], renderer)


def _try(label: Any, ax: Any, candidate: tuple[float, str, str], renderer: Any) -> Any:
    anchor, side, text = candidate
    label.set_text(text)
    x = float(ax.transData.inverted().transform((anchor, 0))[0])
    label.xy = (x, label.xy[1])
    label.xyann = (LABEL_PAD_PT if side == "right" else -LABEL_PAD_PT, 0)
    label.set_horizontalalignment("left" if side == "right" else "right")
    return _padded(label.get_window_extent(renderer), 2.0)
