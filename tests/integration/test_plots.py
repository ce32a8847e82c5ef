"""The figures: which artists they draw (not their pixels), the files they write, and the style a user can
put on top of labctl's. Inputs are synthesised events (fast, any number of ports) and one short real run."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from matplotlib.colors import to_hex

from labctl.analysis.breakdown import compute_breakdown
from labctl.analysis.distributions_plot import distributions_figure
from labctl.analysis.event_index import EventIndex
from labctl.analysis.figures import ALL_FORMATS
from labctl.analysis.figures_ahead import draw_ahead
from labctl.analysis.plot_style import STYLE_ENV
from labctl.analysis.plots import plot_run
from labctl.analysis.timeline_plot import timeline_figure
from labctl.core.errors import InputError
from labctl.core.events import Event, Kind
from labctl.run.lifecycle import run_experiment

MS = 1_000_000
MARK_NAMES = ["t1", "t2", "t3", "t4", "t5"]


def synth_events(
    ports_per_rail: int = 4,
    rails: int = 2,
    reconfigs: int = 2,
    threshold: float = -10.0,
    recover: bool = True,
    firmware_ms: int = 40,
    loss_prev_us: int | None = None,
) -> list[Event]:
    """A run as the controller records it: run.start, then per reconfiguration a phase, the switch's command
    and completion per rail, and per port light lost and back, firmware, carrier and traffic down and up.
    Reconfiguration 0 is the baseline. With recover=False the last reconfiguration never comes back.
    `firmware_ms`: firmware link-up after the command (plus up to 20 ms of jitter), e.g. 6000 as on the
    Opus testbed. `loss_prev_us`: the Rx sample that first reads dark names the lit one before it
    (meta.prev_ns) this long before it, as the DOM poller does; by default the loss is stamped as it
    happened."""
    spacing = 200 if firmware_ms <= 100 else 2 * firmware_ms
    ports = [
        {
            "source": f"nic:h{i}/r{rail}p0",
            "host": f"h{i}",
            "port": f"r{rail}p0",
            "rail": rail,
            "peer": f"nic:h{i ^ 1}/r{rail}p0",  # a circuit end: transport and total count per circuit end
        }
        for rail in range(rails)
        for i in range(ports_per_rail)
    ]
    events = [
        Event(
            t_ns=0,
            source="controller",
            kind=Kind.RUN_START,
            value="synth",
            meta={"rx_power_threshold_dbm": threshold},
        )
    ]
    rng = np.random.default_rng(1)
    for r in range(reconfigs + 1):
        base = (1 + r) * spacing * MS
        events.append(
            Event(
                t_ns=base,
                source="controller",
                kind=Kind.PHASE,
                value="pp" if r % 2 else "dp",
                reconfig=r,
                meta={"measured": True, "ports": ports},
            )
        )
        last = recover or r < reconfigs
        for rail in range(rails):
            events.append(
                Event(
                    t_ns=base + MS, source="ocs:ocs1", kind=Kind.OCS_COMMAND, reconfig=r, meta={"rail": rail}
                )
            )
            events.append(
                Event(
                    t_ns=base + 4 * MS,
                    source="ocs:ocs1",
                    kind=Kind.OCS_COMPLETE,
                    reconfig=r,
                    meta={"rail": rail},
                )
            )
        for p in ports:
            s = p["source"]
            jitter = int(rng.integers(0, 20 * MS))

            def at(t: int, kind: str, value: Any, s: str = s, r: int = r, prev: int | None = None) -> Event:
                meta = {"prev_ns": prev} if prev is not None else {}
                return Event(t_ns=t, source=s, kind=kind, value=value, reconfig=r, meta=meta)

            events += [
                at(
                    base + 2 * MS,
                    Kind.RX_POWER,
                    None,
                    prev=None if loss_prev_us is None else base + 2 * MS - loss_prev_us * 1000,
                ),
                at(base + 2 * MS, Kind.LINK_FIRMWARE, 0),
                at(base + 2 * MS + MS // 5, Kind.CARRIER, 0),
                at(base + 3 * MS, Kind.TRAFFIC_LOST, None),
            ]
            if last:
                events += [
                    at(base + 5 * MS, Kind.RX_POWER, -3.0, prev=base + 4 * MS),  # sampled: a 1 ms bracket
                    at(base + firmware_ms * MS + jitter, Kind.LINK_FIRMWARE, 1),
                    at(base + firmware_ms * MS + jitter + MS // 10, Kind.CARRIER, 1),
                    at(base + (firmware_ms + 15) * MS + jitter, Kind.TRAFFIC_OK, 10_000),
                    at(base + (firmware_ms + 20) * MS + jitter, Kind.TRAFFIC_OK, 10_000),
                ]
    return sorted(events, key=lambda e: e.t_ns)


def synth(**kwargs: Any) -> tuple[EventIndex, pd.DataFrame]:
    index = EventIndex.from_events(synth_events(**kwargs))
    return index, compute_breakdown(index)


def by_gid(fig: Any, gid: str) -> list[Any]:
    return fig.findobj(lambda a: getattr(a, "get_gid", lambda: None)() == gid)


def axis(fig: Any, gid: str) -> Any:
    (ax,) = [a for a in fig.axes if a.get_gid() == gid]
    return ax


@pytest.fixture
def small() -> tuple[EventIndex, pd.DataFrame]:
    return synth()


def test_timeline_draws_the_threshold_the_run_used(tmp_path: Path) -> None:
    index, frame = synth(threshold=-13.5)
    fig = timeline_figure(index, frame, 1)
    try:
        lines = by_gid(fig, "rx-threshold")
        assert len(lines) == 3  # full view and the zoom's two windows
        for line in lines:
            assert list(line.get_ydata()) == [-13.5, -13.5]
            assert line.axes.get_gid() in ("rx-full", "rx-zoom", "rx-zoom-2")
    finally:
        plt.close(fig)
    fig = timeline_figure(index, frame, 1, threshold_dbm=-20)  # passed in: wins over run.start
    try:
        assert all(list(line.get_ydata()) == [-20, -20] for line in by_gid(fig, "rx-threshold"))
    finally:
        plt.close(fig)


def test_timeline_marks_t1_to_t5_per_port(small: tuple[EventIndex, pd.DataFrame]) -> None:
    index, frame = small
    rows = frame[frame["reconfig"] == 1]
    t0 = int(rows["t0_command_ns"].min())
    fig = timeline_figure(index, frame, 1)
    try:
        lanes = axis(fig, "lanes-full")
        for k, col in enumerate(
            ["t1_switch_done_ns", "t2_rx_power_ns", "t3_firmware_up_ns", "t4_carrier_up_ns", "t5_traffic_ns"],
            start=1,
        ):
            (mark,) = [a for a in by_gid(fig, f"mark-t{k}") if a.axes is lanes]
            assert mark.get_label().startswith(f"t{k} ")
            assert sorted(mark.get_xdata()) == pytest.approx(sorted((rows[col] - t0).to_numpy(float) / 1e9))
        # one row per port, its label on the centre of its three lanes
        ticks = lanes.get_yticks()
        labels = [t.get_text() for t in lanes.get_yticklabels()]
        assert len(labels) == len(rows) == 8 and labels[0] == "h0/r0p0"
        assert sorted(ticks) == list(range(8))
        # the zoom's rows are filled: every lane is drawn (pale while down) across the window, one band per
        # port and lane, in one collection per lane (gid lane-down-J)
        zoom = axis(fig, "lanes-zoom")
        down = [c for c in zoom.collections if (c.get_gid() or "").startswith("lane-down")]
        assert sorted(c.get_gid() for c in down) == ["lane-down-0", "lane-down-1", "lane-down-2"]
        assert [len(c.get_paths()) for c in down] == [8, 8, 8]
        up = {
            c.get_gid(): len(c.get_paths())
            for c in zoom.collections
            if (c.get_gid() or "").startswith("lane-up")
        }
        assert up == {"lane-up-0": 8, "lane-up-1": 8, "lane-up-2": 8}  # every port's lanes came back up
        # the legend below names the marks
        legend_texts = [t.get_text() for legend in fig.legends for t in legend.get_texts()]
        assert all(any(t.startswith(f"t{k} ") for t in legend_texts) for k in range(1, 6))
    finally:
        plt.close(fig)


def test_rx_traces_are_coloured_by_rail_with_a_legend(small: tuple[EventIndex, pd.DataFrame]) -> None:
    index, frame = small
    fig = timeline_figure(index, frame, 1)
    try:
        rx = axis(fig, "rx-full")
        texts = [t.get_text() for t in rx.get_legend().get_texts()]
        assert texts[:2] == ["rail 0 (4 ports)", "rail 1 (4 ports)"]
        assert any(t.startswith("threshold -10 dBm") for t in texts)
        colours = {
            rail: {to_hex(line.get_color()) for line in rx.get_lines() if line.get_gid() == f"rx-rail-{rail}"}
            for rail in (0, 1)
        }
        assert len(colours[0]) == len(colours[1]) == 1 and colours[0] != colours[1]
        assert len([line for line in rx.get_lines() if (line.get_gid() or "").startswith("rx-rail-")]) == 8
    finally:
        plt.close(fig)


def test_many_ports_are_summarised_per_rail_with_a_spread() -> None:
    index, frame = synth(ports_per_rail=20, rails=2)
    fig = timeline_figure(index, frame, 1)
    try:
        lanes = axis(fig, "lanes-full")
        assert [t.get_text() for t in lanes.get_yticklabels()] == ["rail 0\n20 ports", "rail 1\n20 ports"]
        for k in range(1, 6):
            (mark,) = [a for a in by_gid(fig, f"mark-t{k}") if a.axes is lanes]
            assert len(mark.get_xdata()) == 2 and "median" in mark.get_label()
            (spread,) = [a for a in by_gid(fig, f"mark-t{k}-spread") if a.axes is lanes]
            assert len(spread.get_segments()) == 2
        rows = frame[(frame["reconfig"] == 1) & (frame["rail"] == 0)]
        t0 = int(frame.loc[frame["reconfig"] == 1, "t0_command_ns"].min())
        (t3,) = [a for a in by_gid(fig, "mark-t3") if a.axes is lanes]
        assert t3.get_xdata()[0] == pytest.approx((float(rows["t3_firmware_up_ns"].median()) - t0) / 1e9)
    finally:
        plt.close(fig)


def test_distributions_have_a_cdf_per_phase_with_n(small: tuple[EventIndex, pd.DataFrame]) -> None:
    _, frame = small
    fig = distributions_figure(frame)
    try:
        measured = frame[frame["reconfig"] > 0]
        cdfs = {a.get_gid(): a for a in fig.axes if (a.get_gid() or "").startswith("cdf-")}
        assert set(cdfs) == {
            "cdf-switch",
            "cdf-optical",
            "cdf-firmware",
            "cdf-carrier",
            "cdf-transport",
            "cdf-total",
            "cdf-carrier_down",
            "cdf-traffic_lost",
        }
        n = int(measured["firmware_ns"].notna().sum())
        assert n == 16
        assert (
            cdfs["cdf-firmware"].get_title(loc="left")
            == "firmware (t2 → t3)\nn=16: 8 ports × 2 reconfigurations"
        )
        assert cdfs["cdf-switch"].get_title(loc="left").endswith("n=2 switch commands (2 reconfigurations)")
        assert cdfs["cdf-total"].get_title(loc="left").endswith("n=16: 8 circuit ends × 2 reconfigurations")
        assert cdfs["cdf-firmware"].get_xlabel() == "ms"  # the unit
        assert "excluded" not in fig.get_suptitle()
    finally:
        plt.close(fig)


def test_flagged_phases_are_left_out_and_counted(small: tuple[EventIndex, pd.DataFrame]) -> None:
    """`impossible` / `unresolved` name a row's phases that the statistics leave out: so does the figure."""
    _, frame = small
    empty = pd.array([""] * len(frame), dtype="string")
    frame = frame.assign(impossible=empty, unresolved=empty.copy())
    measured = frame.index[frame["reconfig"] > 0]
    frame.loc[measured[:3], "impossible"] = "firmware"
    frame.loc[measured[3], "impossible"] = pd.NA  # missing is not flagged
    frame.loc[measured[4], "unresolved"] = "carrier,transport"
    frame.loc[measured[5], "impossible"] = "yes"  # names no phase: the whole row is left out
    fig = distributions_figure(frame)
    try:

        def n(phase: str) -> str:
            return axis(fig, f"cdf-{phase}").get_title(loc="left").splitlines()[1]

        assert n("firmware") == "n=12 of 8 ports × 2 reconfigurations"
        assert n("carrier").startswith("n=14 of") and n("transport").startswith("n=14 of")
        assert n("total").startswith("n=15 of")
        # one per switch command: 2 reconfigurations, each one command carrying both rails of ocs1
        assert n("switch").startswith("n=2 switch commands")
        # 3 firmware + 8 phases of the "yes" row; carrier and transport of one row
        assert fig.get_suptitle().endswith("; left out: 11 impossible and 2 unresolved phase values")
    finally:
        plt.close(fig)
    fig = distributions_figure(frame.drop(columns=["impossible", "unresolved"]))
    try:
        assert "left out" not in fig.get_suptitle()
        assert axis(fig, "cdf-firmware").get_title(loc="left").endswith("n=16: 8 ports × 2 reconfigurations")
    finally:
        plt.close(fig)


def test_a_reconfiguration_nothing_recovered_from_still_plots(tmp_path: Path) -> None:
    index, frame = synth(recover=False)
    assert frame.loc[frame["reconfig"] == 2, "total_ns"].isna().all()
    paths = plot_run(tmp_path, reconfig=2, frame=frame, index=index, formats=("svg",))  # warnings: errors
    svg = next(p for p in paths if p.suffix == ".svg").read_text()
    assert "none recovered" in svg and "nan" not in svg.lower()
    empty = frame[frame["reconfig"] == 0]  # only the baseline: no phase to distribute
    fig = distributions_figure(empty)
    try:
        assert not [a for a in fig.axes if (a.get_gid() or "").startswith("cdf-")]
    finally:
        plt.close(fig)


def _written(tmp_path: Path, name: str, events: list[Event], **options: Any) -> dict[str, bytes]:
    """The files plot_run writes of these events (with `options`) into a directory of their own."""
    out = tmp_path / name
    out.mkdir()
    index = EventIndex.from_events(events)
    paths = plot_run(out, frame=compute_breakdown(index), index=index, out_dir=out, **options)
    return {p.name: p.read_bytes() for p in paths}


def _ahead(figure: str, events: list[Event], formats: tuple[str, ...] = ("png",)) -> Any:
    index = EventIndex.from_events(events)
    return draw_ahead(figure, index, compute_breakdown(index), formats=formats)


# Drawn by plot_run at the end of a run, in the default format: the files the figures drawn ahead must be
# (test_figures_drawn_ahead_...), and the default's names (test_plot_run_writes_...). Drawn once for both;
# the two tests share an xdist group so that one worker draws it.
AT_THE_END = pytest.mark.xdist_group("plots_at_the_end")


@pytest.fixture(scope="module")
def at_the_end(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], dict[str, bytes]]:
    """plot_run's paths' names, in order, and each file's bytes, for synth_events(reconfigs=3) with every
    option left at its default."""
    out = tmp_path_factory.mktemp("at-the-end")
    index = EventIndex.from_events(synth_events(reconfigs=3))
    paths = plot_run(out, frame=compute_breakdown(index), index=index)
    return [p.name for p in paths], {p.name: p.read_bytes() for p in paths}


@AT_THE_END
def test_figures_drawn_ahead_are_the_files_drawing_them_at_the_end_gives(
    tmp_path: Path, at_the_end: tuple[list[str], dict[str, bytes]]
) -> None:
    """A figure drawn while the run goes on is written as it is if the whole run shows the same; if not
    (an event that reached the file late, or drawn in other formats), it is drawn again: either way the
    files are those drawn at the end, byte for byte."""
    events = synth_events(reconfigs=3)
    _, reference = at_the_end  # the PNGs: SVG's bytes are not compared (only which files are written)
    pngs = ("headline.png", "timeline.png", "distributions.png")
    assert reference.keys() == set(pngs)
    # The timeline shows reconfiguration 1 up to reconfiguration 2's command: on record once that is.
    command2 = next(i for i, e in enumerate(events) if e.kind == Kind.OCS_COMMAND and e.reconfig == 2)
    assert _ahead("timeline", events[:command2]) is None, "not on record before the next command"
    assert _ahead("headline", events[:command2]) is None
    timeline = _ahead("timeline", events[: command2 + 1], ("png", "svg"))
    headline = _ahead("headline", events[: command2 + 1], ("png", "svg"))
    distributions = _ahead("distributions", events, ("png", "svg"))
    drawn = [headline, timeline, distributions]
    written = _written(tmp_path, "ahead", events, formats=("png", "svg"), drawn=drawn)
    assert written.keys() == {
        f"{name}.{fmt}" for name in ("headline", "timeline", "distributions") for fmt in ("png", "svg")
    }
    assert headline.kept and timeline.kept and distributions.kept
    for name in pngs:
        assert written[name] == reference[name], name
    # Drawn from a file that lacked one of reconfiguration 1's events, and one that lacked the last
    # reconfiguration: both are drawn again at the end.
    late = next(i for i, e in enumerate(events) if e.kind == Kind.TRAFFIC_OK and e.reconfig == 1)
    timeline = _ahead("timeline", events[:late] + events[late + 1 : command2 + 1])
    headline = _ahead("headline", events[:late] + events[late + 1 : command2 + 1])
    last = min(i for i, e in enumerate(events) if e.reconfig == 3)
    distributions = _ahead("distributions", events[:last])
    # And one drawn from the whole run but in another format (SVG where PNG is due): drawn again too. Offered
    # with the others (plot_run checks each it is offered): were it taken, timeline.svg would be written.
    svg = _ahead("timeline", events, ("svg",))
    again = _written(tmp_path, "again", events, drawn=[headline, svg, timeline, distributions])
    assert not headline.kept and not timeline.kept and not distributions.kept and not svg.kept
    assert again == reference


def test_a_run_of_one_reconfiguration_has_no_timeline_ahead() -> None:
    """Nothing follows its reconfiguration, so the end of the run is what bounds its timeline."""
    assert _ahead("timeline", synth_events(reconfigs=1)) is None
    assert _ahead("headline", synth_events(reconfigs=1)) is None
    assert _ahead("distributions", synth_events(reconfigs=1)) is not None


@AT_THE_END
def test_plot_run_writes_png_svg_and_pdf_with_real_fonts(
    small: tuple[EventIndex, pd.DataFrame], tmp_path: Path, at_the_end: tuple[list[str], dict[str, bytes]]
) -> None:
    index, frame = small
    assert at_the_end[0] == [
        "headline.png",
        "timeline.png",
        "distributions.png",
    ], "a run draws PNG unless asked for more"
    paths = plot_run(tmp_path, frame=frame, index=index, formats=ALL_FORMATS)
    names = [p.name for p in paths]
    assert names == [
        "headline.png",
        "headline.svg",
        "headline.pdf",
        "timeline.png",
        "timeline.svg",
        "timeline.pdf",
        "distributions.png",
        "distributions.svg",
        "distributions.pdf",
    ]
    for p in paths:
        assert p.stat().st_size > 0
    assert (tmp_path / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for name in ("headline.pdf", "timeline.pdf", "distributions.pdf"):
        pdf = (tmp_path / name).read_bytes()
        assert (
            pdf.startswith(b"%PDF") and b"/FontFile2" in pdf and b"/Type3" not in pdf
        )  # TrueType, not Type 3
    svg = (tmp_path / "timeline.svg").read_text()
    assert "<text" in svg and "Reconfiguration 1" in svg  # text as text


def test_a_style_goes_on_top_of_labctls(
    small: tuple[EventIndex, pd.DataFrame], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    index, frame = small
    monkeypatch.delenv(STYLE_ENV, raising=False)
    before = plt.rcParams["font.size"]
    style = tmp_path / "paper.mplstyle"
    style.write_text("font.size: 17\n")

    def label_size(**kwargs: Any) -> float:
        fig = timeline_figure(index, frame, 1, **kwargs)
        try:
            return float(axis(fig, "lanes-full").xaxis.label.get_size())
        finally:
            plt.close(fig)

    assert label_size() == 9  # labctl.mplstyle
    assert label_size(style=style) == 17
    assert label_size(style=str(style)) == 17
    monkeypatch.setenv(STYLE_ENV, str(style))
    assert label_size() == 17  # the environment is the fallback
    assert label_size(style="classic") == pytest.approx(12)  # a matplotlib style name, over the environment
    fig = distributions_figure(frame)
    try:
        assert axis(fig, "cdf-total").get_title(loc="left") and fig.axes[0].xaxis.label.get_size() == 17
    finally:
        plt.close(fig)
    assert plt.rcParams["font.size"] == before  # nothing leaks out of the figure


@pytest.mark.parametrize(
    ("style", "says"),
    [
        ("no-such-style", "neither a .mplstyle file nor a matplotlib style name"),
        ("missing/paper.mplstyle", "no such file"),
        ("bad.mplstyle", "Bad key"),
    ],
)
def test_a_bad_style_is_one_line_of_input_error(
    small: tuple[EventIndex, pd.DataFrame],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    style: str,
    says: str,
) -> None:
    index, frame = small
    monkeypatch.chdir(tmp_path)
    Path("bad.mplstyle").write_text("font.sise: 12\n")
    with pytest.raises(InputError) as err:
        plot_run(tmp_path, frame=frame, index=index, style=style)
    message = str(err.value)
    assert "\n" not in message and says in message and style in message
    assert not list(tmp_path.glob("*.png"))
    monkeypatch.setenv(STYLE_ENV, "no-such-style")
    with pytest.raises(InputError, match=r"\$LABCTL_MPLSTYLE 'no-such-style'"):
        plot_run(tmp_path, frame=frame, index=index)


SHORT = """\
name: plots
phases:
  dp: {pairs: [[h1, h2], [h3, h4]]}
  pp: {pairs: [[h1, h3], [h2, h4]]}
baseline: dp
cycle: [pp]
hold_s: 0.05
recovery_timeout_s: 5
analysis: {rx_power_threshold_dbm: -12}
"""


def test_a_real_run_plots_its_threshold_rails_and_marks(tmp_path: Path, inventory_path: Path) -> None:
    (tmp_path / "e.yaml").write_text(SHORT)
    outcome = asyncio.run(
        run_experiment(
            tmp_path / "e.yaml",
            inventory_path,
            profile="fast",
            out_dir=tmp_path / "runs",
            seed=3,
            plots=False,
        )
    )
    assert outcome.status == "completed", outcome.error
    index = EventIndex.from_file(outcome.run_dir / "events.jsonl")
    frame = compute_breakdown(index)
    fig = timeline_figure(index, frame, 1)
    try:
        assert all(list(line.get_ydata()) == [-12, -12] for line in by_gid(fig, "rx-threshold"))
        texts = [t.get_text() for t in axis(fig, "rx-full").get_legend().get_texts()]
        assert texts[:2] == ["rail 0 (8 ports)", "rail 1 (8 ports)"]
        lanes = axis(fig, "lanes-full")
        # 16 ports: one row per rail (MAX_PORT_ROWS), each mark a median per rail with its spread
        assert [t.get_text() for t in lanes.get_yticklabels()] == ["rail 0\n8 ports", "rail 1\n8 ports"]
        for k in range(1, 6):
            (mark,) = [a for a in by_gid(fig, f"mark-t{k}") if a.axes is lanes]
            assert len(mark.get_xdata()) == 2
    finally:
        plt.close(fig)
