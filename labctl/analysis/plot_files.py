"""Figures to files: a drawn figure rendered in memory in each format (what savefig writes), and the files
written beside their name, each atomically.

Each figure is written as PNG by default, and as SVG (text kept as text) and PDF (TrueType fonts) on
request (`formats`).
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
from matplotlib.layout_engine import ConstrainedLayoutEngine

from labctl.analysis.figures import DEFAULT_FORMATS
from labctl.analysis.plot_style import styled
from labctl.core.fileio import atomic_path

RASTER_FORMATS = frozenset({"png"})
"""Formats savefig rasterises at savefig.dpi (with Agg): their layout is worked out once (_render)."""


def save_figure(fig: Any, out: Path, formats: Sequence[str] = DEFAULT_FORMATS) -> list[Path]:
    return write_files(out, render_files(fig, formats))


def draw_and_save(
    draw: Callable[[], Any], out: Path, style: str | os.PathLike[str] | None, formats: Sequence[str]
) -> list[Path]:
    """Draw a figure under `style`, write it to `out` in each format, close it; returns the paths."""
    with styled(style):
        fig = draw()
        try:
            return save_figure(fig, out, formats)
        finally:
            plt.close(fig)


def render_files(fig: Any, formats: Sequence[str]) -> dict[str, bytes]:
    """The figure as each format's file holds it (what savefig writes), in memory."""
    return {fmt: _render(fig, fmt) for fmt in formats}


def write_files(out: Path, files: dict[str, bytes]) -> list[Path]:
    """Write render_files' output beside `out` (`out.FORMAT`, each atomically); returns the paths."""
    paths = []
    for fmt, blob in files.items():
        path = out.with_suffix("." + fmt)
        with atomic_path(path) as tmp:
            tmp.write_bytes(blob)
        paths.append(path)
    return paths


def _render(fig: Any, fmt: str) -> bytes:
    buf = io.BytesIO()
    engine = fig.get_layout_engine()
    if fmt not in RASTER_FORMATS or not isinstance(engine, ConstrainedLayoutEngine) or _rc_layout():
        fig.savefig(buf, format=fmt)
        return buf.getvalue()
    # savefig lays a figure out inside a draw of its own, rendering nothing, before the draw it writes: a
    # quarter of a PNG's time. Laid out here instead, at the dpi it is saved at (text is measured in
    # pixels), then saved without the engine, it is the same file.
    dpi = plt.rcParams["savefig.dpi"]
    figure_dpi = fig.dpi
    fig.set_dpi(figure_dpi if dpi == "figure" else float(dpi))
    try:
        engine.execute(fig)
    finally:
        fig.set_dpi(figure_dpi)
    fig.set_layout_engine(None)
    try:
        fig.savefig(buf, format=fmt)
    finally:
        fig.set_layout_engine(engine)  # a vector format lays it out again, at its own dpi
    return buf.getvalue()


def _rc_layout() -> bool:
    """Whether a style asks every figure for a layout engine (then a figure cannot be left without one)."""
    return bool(plt.rcParams["figure.autolayout"] or plt.rcParams["figure.constrained_layout.use"])
