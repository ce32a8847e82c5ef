"""Numbers a paper can cite: marks with brackets, impossible and unresolved phases flagged and left out of
the statistics, each phase over its own unit with a CI of the median, several runs pooled and compared, and
a starved sampler caught."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from labctl.breakdown import EventIndex, compute_breakdown, median_ci, read_breakdown_csv, summarize
from labctl.compare import aggregate, compare, split_sets
from labctl.controller import run_experiment
from labctl.errors import InputError
from labctl.events import encode_event
from tests.conftest import REPO
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
    # Units: one switching time per rail command, not one per port.
    assert summary["phases"]["switch"]["unit"] == "rail command" and summary["phases"]["switch"]["n"] == 3
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


def _experiment(tmp_path: Path, rx_power_hz: float = 1000) -> Path:
    text = (REPO / "experiments" / "reconfig-timeline.yaml").read_text()
    text = text.replace("repeat: 2", "repeat: 1").replace("rx_power_hz: 1000", f"rx_power_hz: {rx_power_hz}")
    text = text.replace("hold_s: 0.5", "hold_s: 0.1")
    path = tmp_path / "exp.yaml"
    path.write_text(text)
    return path


async def test_a_starved_sampler_is_flagged_left_out_and_reported(tmp_path: Path) -> None:
    # An Rx-power sampler at 4 samples/s sees the light come back up to 250 ms late, long after the NIC
    # firmware (40-60 ms in the fast profile) reported link-up: firmware = t3 - t2 comes out negative.
    exp = _experiment(tmp_path, rx_power_hz=4)
    outcome = await run_experiment(
        exp, REPO / "inventory.yaml", profile="fast", out_dir=tmp_path / "runs", plots=False, seed=2
    )
    assert outcome.status == "completed", outcome.error
    summary = json.loads((outcome.run_dir / "summary.json").read_text())
    frame = read_breakdown_csv(outcome.run_dir / "breakdown.csv")
    measured = frame[frame["reconfig"] > 0]
    negative = measured[measured["firmware_ns"].fillna(0) < 0]
    assert len(negative) > 0, "the starved sampler should have put t2 after t3 somewhere"
    assert (negative["unresolved"].str.contains("firmware")).all()  # within a 250 ms bracket: unresolved
    assert summary["phases"]["firmware"]["unresolved"] == len(negative)
    assert summary["phases"]["firmware"]["n"] == measured["firmware_ns"].notna().sum() - len(negative)
    assert summary["phases"]["firmware"]["min"] >= 0
    assert summary["flagged_rows"] >= len(negative)
    # Each flagged row's optical bracket is wider than the negative gap: that is why it is unresolved.
    assert (negative["t2_resolution_ns"] > -negative["firmware_ns"]).all()
    command = [sys.executable, "-m", "labctl.cli", "report", str(outcome.run_dir)]
    proc = await asyncio.to_thread(subprocess.run, command, capture_output=True, text=True, check=True)
    report = proc.stdout
    assert f"{summary['flagged_rows']} port rows flagged" in report
    assert "left out of the statistics" in report and "mark resolution" in report


@pytest.fixture(scope="module")
def four_runs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    tmp = tmp_path_factory.mktemp("runs")
    exp = _experiment(tmp)

    async def go() -> list[Path]:
        out = []
        for seed in range(4):
            o = await run_experiment(
                exp, REPO / "inventory.yaml", profile="fast", out_dir=tmp / "r", plots=False, seed=seed
            )
            assert o.status == "completed", o.error
            out.append(o.run_dir)
        return out

    return asyncio.run(go())


def test_several_runs_pool_into_one_table_with_each_runs_median(four_runs: list[Path]) -> None:
    summary = aggregate(four_runs)
    assert len(summary["runs"]) == 4
    single = [json.loads((r / "summary.json").read_text()) for r in four_runs]
    for name in ("switch", "optical", "total"):
        assert summary["phases"][name]["n"] == sum(s["phases"][name]["n"] for s in single)
        medians = [s["phases"][name]["median"] for s in single]
        assert summary["phases"][name]["run_medians"] == pytest.approx(medians, abs=1)
    proc = subprocess.run(
        [sys.executable, "-m", "labctl.cli", "report", *map(str, four_runs)], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert "pooled over 4 runs" in proc.stdout and "median of each run" in proc.stdout
    # The interval resamples each run's reconfigurations (4 per run), not the port rows.
    optical = summary["phases"]["optical"]
    assert optical["median_ci_resampling"] == "run × reconfiguration" and optical["median_ci_clusters"] == 16
    assert single[0]["phases"]["optical"]["median_ci_clusters"] == 4
    assert "95% CI: bootstrap resampling 16 reconfigurations of the runs" in proc.stdout


def test_two_sets_of_runs_compare_phase_by_phase_with_intervals(four_runs: list[Path]) -> None:
    result = compare(four_runs[:2], four_runs[2:])
    optical = result["phases"]["optical"]
    assert optical["a"]["n"] > 0 and optical["b"]["n"] > 0
    lo, hi = optical["difference_ci"]
    assert lo <= optical["difference"] <= hi
    assert optical["a"]["median_ci_clusters"] == optical["b"]["median_ci_clusters"] == 8  # 2 runs × 4
    assert "resampling reconfigurations of each run" in result["ci"]
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "labctl.cli",
            "compare",
            *map(str, four_runs[:2]),
            "vs",
            *map(str, four_runs[2:]),
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert "B − A [95% CI]" in proc.stdout
    with pytest.raises(InputError, match="in both sets"):
        compare(four_runs[:2], four_runs[1:])


def test_compare_without_two_sets_is_one_line_exit_2(tmp_path: Path) -> None:
    with pytest.raises(InputError):
        split_sets(["a", "b"])
    proc = subprocess.run(
        [sys.executable, "-m", "labctl.cli", "compare", "a", "vs"], capture_output=True, text=True
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr


async def test_a_slow_module_refresh_is_measured_and_widens_the_optical_mark(tmp_path: Path) -> None:
    # Modules that refresh their DOM every 20 ms (profile key dom_update_ms): the poller reads each value
    # ~20 times, estimates the interval from how often it changes, and the optical mark's bracket grows.
    inventory = (
        (REPO / "inventory.yaml")
        .read_text()
        .replace(
            "profile: opus-testbed",
            "profile: slow-dom\nprofiles:\n  slow-dom: {extends: fast, dom_update_ms: [20, 20]}",
        )
    )
    inv = tmp_path / "inventory.yaml"
    inv.write_text(inventory)
    exp = _experiment(tmp_path)
    outcome = await run_experiment(exp, inv, out_dir=tmp_path / "runs", plots=False, seed=4)
    assert outcome.status == "completed", outcome.error
    rx = json.loads((outcome.run_dir / "run.json").read_text())["probes"]["rx-power"]
    assert rx["module_update_estimated"] == 16
    assert 15 * MS <= rx["module_update_ns_median"] <= 25 * MS
    frame = read_breakdown_csv(outcome.run_dir / "breakdown.csv")
    measured = frame[(frame["reconfig"] > 0) & frame["t2_rx_power_ns"].notna()]
    assert (measured["t2_resolution_ns"] >= 15 * MS).all()


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


async def test_a_run_recorded_before_the_flags_is_recomputed_not_printed_as_it_was(tmp_path: Path) -> None:
    outcome = await run_experiment(
        _experiment(tmp_path),
        REPO / "inventory.yaml",
        profile="fast",
        out_dir=tmp_path / "runs",
        plots=False,
        seed=1,
    )
    # As an older labctl wrote them: no flag columns, a summary counting port rows.
    csv = outcome.run_dir / "breakdown.csv"
    frame = read_breakdown_csv(csv)
    frame.drop(columns=["impossible", "unresolved"]).to_csv(csv, index=False)
    (outcome.run_dir / "summary.json").write_text(json.dumps({"unit": "ns", "phases": {}}))
    from labctl.store import load_run

    run = load_run(outcome.run_dir)
    assert "impossible" in run.breakdown and run.summary == {}
    assert any("predates" in note for note in run.notes)


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
