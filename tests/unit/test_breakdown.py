"""The link-up breakdown computed from hand-built event streams, including missing marks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from labctl.analysis.breakdown import compute_breakdown
from labctl.analysis.breakdown_table import COLUMNS, read_breakdown_csv, write_breakdown
from labctl.analysis.event_index import EventIndex
from labctl.analysis.phase_stats import summarize
from labctl.core.clock import Timebase
from labctl.core.events import Event, EventLog

MS = 1_000_000
A, B = "nic:h1/eth0", "nic:h2/eth0"


class Stream:
    """Builds an event stream the way the controller and probes would write it."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.reconfig: int | None = None

    def add(self, t: int, kind: str, source: str, value: Any = None, **meta: Any) -> None:
        self.events.append(
            Event(
                seq=len(self.events),
                t_ns=t,
                kind=kind,
                source=source,
                value=value,
                reconfig=self.reconfig,
                meta=meta,
            )
        )

    def phase(
        self, n: int, t: int, name: str, ports: list[tuple[str, str | None]], measured: bool = True
    ) -> None:
        self.reconfig = n
        self.add(
            t,
            "phase",
            "controller",
            name,
            step=0,
            measured=measured,
            ports=[
                {
                    "source": s,
                    "host": s.split(":")[1].split("/")[0],
                    "port": s.split("/")[1],
                    "rail": 0,
                    "peer": p,
                }
                for s, p in ports
            ],
        )

    def switch(self, t0: int, t1: int, rail: int = 0) -> None:
        self.add(t0, "ocs.command", "ocs:ocs1", 2, rail=rail)
        self.add(t1, "ocs.complete", "ocs:ocs1", t1 - t0, rail=rail)


def recovery(
    s: Stream,
    src: str,
    t0: int,
    *,
    rx_up: int | None,
    fw: int | None,
    carrier: int | None,
    traffic: int | None,
) -> None:
    """Old circuit still lit and passing traffic just after t0, then the usual sequence."""
    s.add(t0 + 100_000, "rx_power", src, -2.0)  # still the old circuit: must not count as t2
    s.add(t0 + 200_000, "traffic.ok", src, 9_000)  # likewise for t5
    s.add(t0 + 1 * MS, "rx_power", src, None)
    s.add(t0 + 1 * MS, "link.firmware", src, 0)
    s.add(t0 + 1 * MS, "traffic.lost", src)
    s.add(t0 + 2 * MS, "carrier", src, 0)
    if rx_up is not None:
        s.add(rx_up - 500_000, "rx_power", src, -25.0)  # still below threshold while settling
        s.add(rx_up, "rx_power", src, -2.5)
    if fw is not None:
        s.add(fw, "link.firmware", src, 1)
    if carrier is not None:
        s.add(carrier, "carrier", src, 1)
    if traffic is not None:
        s.add(traffic - 1 * MS, "traffic.lost", src)
        s.add(traffic, "traffic.ok", src, 10_000)


def test_full_marks_and_phase_durations() -> None:
    s = Stream()
    s.add(0, "run.start", "controller", "x", rx_power_threshold_dbm=-10.0)
    t0 = 1_000 * MS
    s.phase(1, t0 - 10, "pp", [(A, B)])
    s.switch(t0, t0 + 25 * MS)
    recovery(
        s,
        A,
        t0,
        rx_up=t0 + 27 * MS,
        fw=t0 + 6_027 * MS,
        carrier=t0 + 6_027 * MS + 75_000,
        traffic=t0 + 6_177 * MS,
    )
    (row,) = compute_breakdown(s.events).to_dict("records")
    assert row["t0_command_ns"] == t0
    assert row["t1_switch_done_ns"] == t0 + 25 * MS
    assert row["t2_rx_power_ns"] == t0 + 27 * MS
    assert row["switch_ns"] == 25 * MS
    assert row["optical_ns"] == 27 * MS
    assert row["firmware_ns"] == 6_000 * MS
    assert row["carrier_ns"] == 75_000
    assert row["transport_ns"] == 150 * MS - 75_000
    assert row["total_ns"] == 6_177 * MS
    assert row["carrier_down_ns"] == 2 * MS
    assert row["traffic_lost_ns"] == 1 * MS
    assert row["timed_out"] is False or row["timed_out"] == False  # noqa: E712 (numpy bool)
    assert (row["host"], row["port"], row["peer"], row["phase"]) == ("h1", "eth0", B, "pp")


def test_missing_marks_are_empty_never_zero(tmp_path: Path) -> None:
    s = Stream()
    t0 = 10 * MS
    s.phase(1, t0, "pp", [(A, B), (B, A)])
    s.switch(t0, t0 + 25 * MS)
    # A: firmware not observable → t3 empty, carrier phase measured from t2.
    recovery(s, A, t0, rx_up=t0 + 30 * MS, fw=None, carrier=t0 + 3_000 * MS, traffic=t0 + 3_100 * MS)
    # B: light came back but the link never did (timed out).
    recovery(s, B, t0, rx_up=t0 + 30 * MS, fw=None, carrier=None, traffic=None)
    s.add(t0 + 30_000 * MS, "run.timeout", "controller", 1, pending=[B])
    frame = compute_breakdown(s.events)
    a, b = frame.to_dict("records")
    assert pd.isna(a["t3_firmware_up_ns"]) and pd.isna(a["firmware_ns"])
    assert a["carrier_ns"] == a["t4_carrier_up_ns"] - a["t2_rx_power_ns"]
    assert not a["timed_out"]
    for col in (
        "t3_firmware_up_ns",
        "t4_carrier_up_ns",
        "t5_traffic_ns",
        "carrier_ns",
        "transport_ns",
        "total_ns",
    ):
        assert pd.isna(b[col]), col
    assert b["timed_out"]
    write_breakdown(frame, tmp_path)
    lines = (tmp_path / "breakdown.csv").read_text().splitlines()
    assert lines[0].split(",") == COLUMNS
    b_cells = dict(zip(COLUMNS, lines[2].split(","), strict=True))
    assert b_cells["t5_traffic_ns"] == "" and b_cells["total_ns"] == "" and b_cells["firmware_ns"] == ""
    back = read_breakdown_csv(tmp_path / "breakdown.csv")
    assert back["total_ns"].isna().tolist() == [False, True]
    assert back["total_ns"].dtype == "Int64"


def test_dark_gap_between_samples_uses_first_light_after_ack() -> None:
    s = Stream()
    t0 = 5 * MS
    s.phase(1, t0, "pp", [(A, B)])
    s.switch(t0, t0 + 25 * MS)
    # Rx power sampled too slowly to ever see the dark gap: only lit samples.
    s.add(t0 + 10 * MS, "rx_power", A, -2.0)  # before the ack: the old circuit
    s.add(t0 + 40 * MS, "rx_power", A, -2.1)
    (row,) = compute_breakdown(s.events).to_dict("records")
    assert row["t2_rx_power_ns"] == t0 + 40 * MS


def test_traffic_without_carrier_events_counts_after_loss() -> None:
    s = Stream()
    t0 = 5 * MS
    s.phase(1, t0, "pp", [(A, B)])
    s.switch(t0, t0 + 25 * MS)
    s.add(t0 + 100_000, "traffic.ok", A, 9_000)
    s.add(t0 + 2 * MS, "traffic.lost", A)
    s.add(t0 + 300 * MS, "traffic.ok", A, 9_000)
    (row,) = compute_breakdown(s.events).to_dict("records")
    assert pd.isna(row["t4_carrier_up_ns"])
    assert row["t5_traffic_ns"] == t0 + 300 * MS
    assert pd.isna(row["transport_ns"])  # needs t4
    assert row["total_ns"] == 300 * MS


def test_marks_never_leak_into_the_next_reconfiguration() -> None:
    s = Stream()
    s.phase(1, 0, "pp", [(A, B)])
    s.switch(10, 25 * MS)
    s.phase(2, 100 * MS, "dp", [(A, None)], measured=True)
    s.switch(100 * MS + 10, 125 * MS)
    s.add(200 * MS, "carrier", A, 1)  # belongs to reconfiguration 2's window
    frame = compute_breakdown(s.events)
    first = frame[frame["reconfig"] == 1].iloc[0]
    second = frame[frame["reconfig"] == 2].iloc[0]
    assert pd.isna(first["t4_carrier_up_ns"])
    assert second["t4_carrier_up_ns"] == 200 * MS
    assert second["peer"] == ""


def test_unmeasured_phases_and_ports_without_command() -> None:
    s = Stream()
    s.phase(1, 0, "restore", [(A, B)], measured=False)
    s.switch(10, 20)
    s.phase(2, 100, "pp", [(A, B)])  # no ocs.command for this rail: marks empty, row kept
    frame = compute_breakdown(s.events)
    assert list(frame["reconfig"]) == [2]
    assert frame["t0_command_ns"].isna().all()


def test_threshold_from_run_start_or_argument() -> None:
    s = Stream()
    s.add(0, "run.start", "controller", "x", rx_power_threshold_dbm=-30.0)
    t0 = 5 * MS
    s.phase(1, t0, "pp", [(A, B)])
    s.switch(t0, t0 + 25 * MS)
    s.add(t0 + 1 * MS, "rx_power", A, None)
    s.add(t0 + 26 * MS, "rx_power", A, -25.0)  # above -30, below -10
    s.add(t0 + 28 * MS, "rx_power", A, -2.0)
    assert compute_breakdown(s.events).iloc[0]["t2_rx_power_ns"] == t0 + 26 * MS
    assert compute_breakdown(s.events, threshold_dbm=-10.0).iloc[0]["t2_rx_power_ns"] == t0 + 28 * MS


def test_file_path_matches_in_memory_and_summary_excludes_setup(tmp_path: Path) -> None:
    s = Stream()
    for n in range(3):
        t0 = n * 10_000 * MS
        s.phase(n, t0, "dp" if n % 2 == 0 else "pp", [(A, B)])
        s.switch(t0, t0 + (20 + n) * MS)
        recovery(
            s,
            A,
            t0,
            rx_up=t0 + 30 * MS,
            fw=t0 + 6_000 * MS,
            carrier=t0 + 6_000 * MS + 70_000,
            traffic=t0 + 6_100 * MS,
        )
    log = EventLog(tmp_path / "events.jsonl", Timebase(0, 0))
    for e in s.events:
        log.record(e)
    log.close()
    from_file = compute_breakdown(EventIndex.from_file(tmp_path / "events.jsonl"))
    in_memory = compute_breakdown(s.events)
    pd.testing.assert_frame_equal(from_file, in_memory)
    summary = summarize(in_memory)
    assert summary["reconfigurations"] == 2
    assert summary["phases"]["switch"]["count"] == 2
    assert summary["phases"]["switch"]["min"] == 21 * MS
    assert summary["phases"]["switch"]["max"] == 22 * MS
    assert summary["phases"]["switch"]["median"] == 21_500_000
    assert summary["phases"]["carrier"]["median"] == 70_000


def test_empty_stream_gives_empty_frame_with_columns() -> None:
    frame = compute_breakdown([])
    assert list(frame.columns) == COLUMNS
    assert frame.empty
    assert summarize(frame)["rows"] == 0


@pytest.mark.parametrize("value", [None, -40.0])
def test_no_light_counts_as_dark(value: float | None) -> None:
    s = Stream()
    s.phase(1, 0, "pp", [(A, B)])
    s.switch(0, 25 * MS)
    s.add(1 * MS, "rx_power", A, value)
    s.add(30 * MS, "rx_power", A, -3.0)
    assert compute_breakdown(s.events).iloc[0]["t2_rx_power_ns"] == 30 * MS


def test_traffic_to_the_old_peer_never_counts_as_recovery() -> None:
    """Under load a probe can see a spurious loss and then the old circuit again before the switch moves
    the light; t5 must be traffic that reached the *new* peer."""
    s = Stream()
    t0 = 5 * MS
    s.phase(1, t0, "pp", [(A, B)])
    s.switch(t0, t0 + 25 * MS)
    s.add(t0 + 1 * MS, "traffic.lost", A, peer="nic:h9/old")
    s.add(t0 + 3 * MS, "traffic.ok", A, 9_000, peer="nic:h9/old")
    s.add(t0 + 200 * MS, "traffic.ok", A, 9_000, peer=B)
    (row,) = compute_breakdown(s.events).to_dict("records")
    assert row["t5_traffic_ns"] == t0 + 200 * MS


@pytest.mark.parametrize("prev_ms", [None, 195])
def test_a_first_ping_that_got_through_is_bracketed_from_carrier_up(prev_ms: int | None) -> None:
    """A traffic mark is the first ping of the new circuit that got through; the one before it (`prev_ns`)
    did not, and that is its bracket. Where no ping of the circuit came before it (a re-target reached the
    prober after the link was up), nothing says when traffic came back after carrier: the bracket is
    (t4, t5], never 0 as for a mark stamped as it happened."""
    s = Stream()
    t0 = 5 * MS
    s.phase(1, t0, "pp", [(A, B)])
    s.switch(t0, t0 + 25 * MS)
    s.add(t0 + 100 * MS, "carrier", A, 1)
    meta = {"peer": B} if prev_ms is None else {"peer": B, "prev_ns": t0 + prev_ms * MS}
    s.add(t0 + 200 * MS, "traffic.ok", A, 9_000, **meta)
    (row,) = compute_breakdown(s.events).to_dict("records")
    assert row["t5_traffic_ns"] == t0 + 200 * MS
    assert row["t5_resolution_ns"] == (100 * MS if prev_ms is None else 5 * MS)


def test_a_clock_offset_wider_than_a_phase_it_crosses_is_said() -> None:
    from labctl.analysis.clock_uncertainty import clock_caveats

    frame = pd.DataFrame(
        {
            "reconfig": [1, 1, 1, 1],
            "host": ["h1", "h1", "h2", "h2"],
            "optical_ns": [2_000_000, 3_000_000, 2_000_000, 3_000_000],
            "total_ns": [150_000_000] * 4,
            "carrier_down_ns": [pd.NA] * 4,
            "traffic_lost_ns": [pd.NA] * 4,
        }
    )
    offsets = {
        "h1": {"uncertainty_ns": 10_000, "history": [{"uncertainty_ns": 10_000}]},  # ±10 µs: fine
        "h2": {"uncertainty_ns": 400_000, "history": [{"uncertainty_ns": 5_000_000}]},  # the widest estimate
    }
    assert clock_caveats(frame, offsets) == [
        "h2: clock offset uncertainty ±5.000 ms exceeds its optical phase (median 2.500 ms over 2 port rows): "
        "not resolved there"
    ]
