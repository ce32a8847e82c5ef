"""The figures' shared style: labctl's packaged matplotlib style with the user's on top of it, and the
colours, marks and text every figure draws a run's marks, lanes and phases in.

A figure is drawn in labctl's packaged matplotlib style (labctl/analysis/styles/labctl.mplstyle) with an
optional user style on top of it: the `style` argument (a style name or a .mplstyle path), else
$LABCTL_MPLSTYLE (`styled`).
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import matplotlib

from labctl.core.events import Kind

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.ticker import FuncFormatter, MaxNLocator

from labctl.core.errors import InputError

NO_LIGHT_DBM = -40.0
STYLE_ENV = "LABCTL_MPLSTYLE"
DEFAULT_STYLE = Path(__file__).parent / "styles" / "labctl.mplstyle"
LANES = (
    (Kind.LINK_FIRMWARE, "firmware link", "#9467bd"),
    (Kind.CARRIER, "carrier", "#2ca02c"),
    ("traffic", "traffic", "#8c564b"),
)
DOWN_ALPHA = 0.16
# (column, name, marker, colour, marker size, lane it sits on: 0 firmware, 1 carrier, 2 traffic)
# Mark and lane colours stay clear of the rails' (the style's cycle: blue, vermillion, ...).
MARKS = (
    ("t1_switch_done_ns", "t1 switch done", "|", "#000000", 11, 0),
    ("t2_rx_power_ns", "t2 Rx power ≥ threshold", "o", "#e6ab02", 5, 1),
    ("t3_firmware_up_ns", "t3 firmware up", "D", "#9467bd", 5, 0),
    ("t4_carrier_up_ns", "t4 carrier up", "s", "#2ca02c", 5, 1),
    ("t5_traffic_ns", "t5 traffic", ">", "#8c564b", 6, 2),
)
PHASE_COLOURS = {
    "switch": MARKS[0][3],
    "optical": MARKS[1][3],
    "firmware": MARKS[2][3],
    "carrier": MARKS[3][3],
    "transport": MARKS[4][3],
    "total": "#555555",
    "carrier_down": "#CC79A7",
    "traffic_lost": "#56B4E9",
}
"""A phase in the colour of the mark it ends at (the timeline's)."""


def resolve_style(style: str | os.PathLike[str] | None = None) -> list[str]:
    """The styles to apply, packaged default first: `style`, else $LABCTL_MPLSTYLE, on top of it. A style is
    a path to a .mplstyle file or a name matplotlib knows (`matplotlib.style.available`, or `labctl`).
    Raises InputError (one line) for anything else."""
    origin = "style"
    if style is None or str(style) == "":
        style, origin = os.environ.get(STYLE_ENV) or None, f"${STYLE_ENV}"
    styles = [str(DEFAULT_STYLE)]
    if style is None:
        return styles
    text = os.fspath(style)
    path = Path(text).expanduser()
    if path.is_file():
        styles.append(str(path))
    elif text in plt.style.available or text == "default":
        styles.append(text)
    elif text != "labctl":
        if path.exists():
            why = "is not a file"
        elif isinstance(style, os.PathLike) or os.sep in text or text.endswith(".mplstyle"):
            why = "no such file"
        else:
            why = (
                "neither a .mplstyle file nor a matplotlib style name "
                "(see matplotlib.style.available, e.g. ggplot, seaborn-v0_8-paper)"
            )
        raise InputError(f"matplotlib {origin} {text!r}: {why}")
    return styles


@contextmanager
def styled(style: str | os.PathLike[str] | None = None) -> Iterator[None]:
    """Draw inside labctl's style plus the user's (see resolve_style). A style file matplotlib cannot read,
    or with a key or value it rejects, is an InputError naming the file and the line."""
    styles = resolve_style(style)
    logged = _Collect()
    log = logging.getLogger("matplotlib")  # where matplotlib reports a bad key or value in a style file
    with ExitStack() as stack:
        log.addHandler(logged)
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    stack.enter_context(plt.style.context(styles))
                except (OSError, ValueError, KeyError) as e:
                    raise InputError(f"matplotlib style {styles[-1]!r}: {_one_line(e)}") from None
        finally:
            log.removeHandler(logged)
        problems = [r.getMessage() for r in logged.records]
        for w in caught:
            if issubclass(w.category, DeprecationWarning):
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
            else:
                problems.append(str(w.message))
        if problems:
            raise InputError(f"matplotlib style {styles[-1]!r}: {_first_line(problems[0])}")
        yield


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), text.strip())


def _one_line(what: object) -> str:
    lines = [line.strip() for line in str(what).splitlines() if line.strip()]
    return "; ".join(lines) if lines else type(what).__name__


def rail_colours(rails: Sequence[Any]) -> dict[Any, str]:
    cycle = [str(c) for c in plt.rcParams["axes.prop_cycle"].by_key().get("color", ["C0"])]
    return {rail: cycle[i % len(cycle)] for i, rail in enumerate(rails)}


def mark_style(marker: str, colour: str, size: float) -> dict[str, Any]:
    """A filled mark gets a thin black edge (it sits on a bar of its own colour); a line mark: one colour."""
    edge = ("black", 0.5) if marker != "|" else (colour, 1.6)
    return {"marker": marker, "ms": size, "color": colour, "mec": edge[0], "mew": edge[1]}


def time_ticks(ax: Any, lo: float, hi: float) -> None:
    """A window's ticks in the unit that reads best: ms up to a second, s beyond."""
    if max(abs(lo), abs(hi)) < 1.0:
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v * 1e3:.6g} ms" if v else "0"))
    else:
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.6g} s" if v else "0"))
    ax.xaxis.set_major_locator(MaxNLocator(5))


def format_ms(value: float) -> str:
    """A duration given in ms, in the unit that reads best (as the breakdown table prints it)."""
    if value >= 1000:
        return f"{value / 1000:.3f} s"
    if value >= 1:
        return f"{value:.3g} ms" if value < 100 else f"{value:.0f} ms"
    return f"{value * 1000:.3g} µs"
