"""Numbers a paper can cite: marks with brackets, impossible and unresolved phases flagged and left out of
the statistics, each phase over its own unit with a CI of the median, several runs pooled and compared, and
a starved sampler caught."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from labctl.analysis.breakdown import compute_breakdown
from labctl.analysis.event_index import EventIndex
from labctl.analysis.phase_stats import median_ci, summarize
from labctl.core.events import encode_event
from tests.unit.test_breakdown import MS, A, B, Stream, recovery


def _row(fw_offset_ms: float, prev_ms: float, uncertainty: dict[str, int] | None = None) -> dict:
    """One port whose light is seen back at t0+27 ms (previous sample prev_ms before), firmware up at
    t0+27 ms+fw_offset_ms."""
    s = Stream()
    s.add(0, "run.start", "controller", "x", rx_power_threshold_dbm=-10.0)
    t0 = 1_000 * MS
    s.phase(1, t0 - 10, "pp", [(A, B)])
    s.switch(t0, t0 + 25 * MS)
    s.add(t0 + 1 * MS, "rx_power", A, None)
    t2 = t0 + 27 * MS
    s.add(t2, "rx_power", A, -2.5, prev_ns=t2 - round(prev_ms * MS))
    s.add(t2 + round(fw_offset_ms * MS), "link.firmware", A, 1)
    s.add(t2 + round(fw_offset_ms * MS) + 75_000, "carrier", A, 1)
    s.add(t2 + 200 * MS, "traffic.ok", A, 9_000, peer=B, prev_ns=t2 + 199 * MS)
    (row,) = compute_breakdown(s.events, clock_uncertainty_ns=uncertainty).to_dict("records")
    return row


def test_a_sampled_mark_carries_its_bracket() -> None:
    row = _row(fw_offset_ms=40, prev_ms=1)
    assert row["t2_resolution_ns"] == 1 * MS  # the previous sample did not see the light
    assert row["t3_resolution_ns"] == 0  # link.firmware: stamped as it happened
    assert row["t5_resolution_ns"] == 1 * MS
    assert row["impossible"] == row["unresolved"] == ""
    assert row["firmware_ns"] == 40 * MS


def test_firmware_before_light_beyond_the_bracket_is_impossible_within_it_unresolved() -> None:
    impossible = _row(fw_offset_ms=-20, prev_ms=1)
    assert impossible["firmware_ns"] == -20 * MS  # the measured difference is kept, and flagged
    assert impossible["impossible"] == "firmware" and impossible["unresolved"] == ""
    unresolved = _row(fw_offset_ms=-20, prev_ms=50)  # a sampler 50 ms behind: light came back in (t-50, t]
    assert unresolved["impossible"] == "" and unresolved["unresolved"] == "firmware"


def test_a_hosts_clock_uncertainty_is_recorded_per_row() -> None:
    row = _row(fw_offset_ms=40, prev_ms=1, uncertainty={"h1": 2 * MS})
    assert row["clock_uncertainty_ns"] == 2 * MS


def test_flagged_rows_are_left_out_of_the_summary_and_counted() -> None:
    s = Stream()
    s.add(0, "run.start", "controller", "x", rx_power_threshold_dbm=-10.0)
    for n in range(1, 4):
        t0 = n * 10_000 * MS
        s.phase(n, t0 - 10, "pp", [(A, B), (B, A)])
        s.switch(t0, t0 + 25 * MS)
        for src in (A, B):
            fw = t0 + 6_027 * MS if not (n == 2 and src == A) else t0 + 10 * MS  # one row: firmware first
            recovery(s, src, t0, rx_up=t0 + 27 * MS, fw=fw, carrier=fw + 75_000, traffic=fw + 150 * MS)
    frame = compute_breakdown(s.events)
    summary = summarize(frame)
    assert summary["flagged_rows"] == 1
    fw = summary["phases"]["firmware"]
    assert fw["n"] == 5 and fw["impossible"] + fw["unresolved"] == 1
    assert fw["min"] >= 0  # the flagged negative value is not a statistic
    # Units: one switching time per switch command, not one per port.
    assert summary["phases"]["switch"]["unit"] == "switch command" and summary["phases"]["switch"]["n"] == 3
    assert summary["phases"]["optical"]["n"] == 6
    lo, hi = summary["phases"]["total"]["median_ci"]
    assert lo <= summary["phases"]["total"]["median"] <= hi


def test_the_median_ci_is_a_bootstrap_interval_that_narrows_with_n() -> None:
    rng = np.random.default_rng(3)
    small, large = rng.normal(100, 10, 20).astype(np.int64), rng.normal(100, 10, 2000).astype(np.int64)
    lo_s, hi_s = median_ci(small)  # type: ignore[misc]
    lo_l, hi_l = median_ci(large)  # type: ignore[misc]
    assert lo_s <= np.median(small) <= hi_s and lo_l <= np.median(large) <= hi_l
    assert hi_l - lo_l < hi_s - lo_s
    assert median_ci(small) == median_ci(small)  # a fixed seed: the summary is reproducible
    assert median_ci(np.array([5])) is None


def test_a_carrier_seen_by_a_poll_has_the_previous_poll_as_its_bracket(tmp_path: Path) -> None:
    s = Stream()
    s.add(0, "run.start", "controller", "x", rx_power_threshold_dbm=-10.0)
    t0 = 1_000 * MS
    s.phase(1, t0 - 10, "pp", [(A, B)])
    s.switch(t0, t0 + 25 * MS)
    s.add(t0 + 1 * MS, "rx_power", A, None)
    s.add(t0 + 27 * MS, "rx_power", A, -2.5, prev_ns=t0 + 26 * MS)
    s.add(t0 + 60 * MS, "carrier", A, 1, via="poll", after_ns=t0 + 59_500_000)
    (row,) = compute_breakdown(s.events).to_dict("records")
    assert row["t4_resolution_ns"] == 500_000
    # The same through the file reader (the fast path the controller uses).
    log = tmp_path / "events.jsonl"
    log.write_bytes(b"".join(encode_event(e) + b"\n" for e in s.events))
    (row,) = compute_breakdown(EventIndex.from_file(log)).to_dict("records")
    assert row["t4_resolution_ns"] == 500_000


def test_a_host_clock_read_behind_within_its_uncertainty_flags_the_phase_instead_of_losing_the_mark() -> None:
    # The host's marks are stamped 1.5 ms early (its offset was estimated with 2 ms uncertainty): the light
    # seen back at t0 - 0.5 ms is still found, and optical comes out negative within the uncertainty.
    s = Stream()
    s.add(0, "run.start", "controller", "x", rx_power_threshold_dbm=-10.0)
    t0 = 1_000 * MS
    s.phase(1, t0 - 10 * MS, "pp", [(A, B)])
    s.switch(t0, t0 + 1 * MS)
    s.add(t0 - 1_200_000, "rx_power", A, None, prev_ns=t0 - 2_200_000)
    s.add(t0 - 500_000, "rx_power", A, -2.5, prev_ns=t0 - 1_200_000)
    s.add(t0 + 40 * MS, "link.firmware", A, 1)
    (row,) = compute_breakdown(s.events, clock_uncertainty_ns={"h1": 2 * MS}).to_dict("records")
    assert row["optical_ns"] == -500_000
    assert row["unresolved"] == "optical" and row["impossible"] == ""
    # Without the uncertainty those samples are outside the window: no optical mark at all.
    (row,) = compute_breakdown(s.events).to_dict("records")
    assert pd.isna(row["t2_rx_power_ns"])
