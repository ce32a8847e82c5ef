"""Numbers a paper can cite, from real simulated runs: a starved sampler and a slow module refresh caught,
several runs pooled and compared (also through the CLI), an old run recomputed. The statistics on
constructed events are tests/unit/test_paper_numbers.py."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from labctl.analysis.breakdown_table import read_breakdown_csv
from labctl.analysis.compare import aggregate, compare, split_sets
from labctl.core.errors import InputError
from labctl.run.lifecycle import run_experiment
from tests.conftest import REPO
from tests.unit.test_breakdown import MS


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
    # What is kept is never negative. (Whether any row is kept depends on where the 250 ms ticks fall against
    # each reconfiguration's 40-60 ms firmware window: none, some runs on a busy machine.)
    kept = summary["phases"]["firmware"]
    assert kept["min"] >= 0 if kept["n"] else kept["min"] is None
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
    from labctl.analysis.store import load_run

    run = load_run(outcome.run_dir)
    assert "impossible" in run.breakdown and run.summary == {}
    assert any("predates" in note for note in run.notes)
