"""What a run directory says after things went wrong: a torn last event line, damaged derived files, an
aborted run's plot. Every complete event is used, and the damage is named in one line."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from labctl.analysis.figures import ALL_FORMATS
from labctl.analysis.plots import plot_run
from labctl.analysis.store import load_run
from labctl.run.lifecycle import run_experiment

LABCTL = [sys.executable, "-m", "labctl.cli"]


SHORT = """\
name: records
phases:
  dp: {pairs: [[h1, h2], [h3, h4]]}
  pp: {pairs: [[h1, h3], [h2, h4]]}
baseline: dp
cycle: [pp, dp]
hold_s: 0.05
recovery_timeout_s: 5
"""


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("finished")
    (root / "e.yaml").write_text(SHORT)
    inventory = Path(__file__).parents[2] / "inventory.yaml"
    outcome = asyncio.run(
        run_experiment(root / "e.yaml", inventory, profile="fast", out_dir=root / "runs", seed=7, plots=False)
    )
    assert outcome.status == "completed"
    return outcome.run_dir


@pytest.fixture
def run_copy(finished_run: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(finished_run, tmp_path / finished_run.name))


def labctl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*LABCTL, *args], capture_output=True, text=True, timeout=120, check=False)


def test_a_torn_last_line_is_named_and_every_complete_line_used(run_copy: Path) -> None:
    events = run_copy / "events.jsonl"
    whole = events.read_bytes()
    complete = whole.count(b"\n")
    events.write_bytes(whole[:-40])  # the run.end line, cut mid-write
    run = load_run(run_copy)
    assert len(run.events) == complete - 1
    assert run.notes == [
        "events.jsonl: the last line is torn (" + str(len(whole.rsplit(b"\n", 2)[-2]) - 39) + " bytes; "
        "the writer was killed): every complete line is used"
    ]
    report = labctl("report", str(run_copy))
    assert report.returncode == 0, report.stderr
    assert report.stderr.startswith("note: events.jsonl: the last line is torn") and "median" in report.stdout
    plot = labctl("plot", str(run_copy), "--out", str(run_copy / "p"))
    assert plot.returncode == 0, plot.stderr
    assert "the last line is torn" in plot.stderr and (run_copy / "p" / "timeline.png").is_file()


@pytest.mark.parametrize(
    "damage", ["", "phase,reconfig\n", "\x00\x00\x00"], ids=["empty", "wrong-columns", "nul"]
)
def test_a_damaged_breakdown_csv_is_recomputed_from_the_events(run_copy: Path, damage: str) -> None:
    good = load_run(run_copy).breakdown
    (run_copy / "breakdown.csv").write_text(damage)
    run = load_run(run_copy)
    assert len(run.notes) == 1 and run.notes[0].startswith("breakdown.csv is damaged (")
    assert run.notes[0].endswith("): recomputed from events.jsonl")
    assert len(run.breakdown) == len(good) > 0
    for column in ("source", "phase", "reconfig", "total_ns", "timed_out"):
        assert run.breakdown[column].astype(str).tolist() == good[column].astype(str).tolist(), column
    # `report` reads summary.json, else breakdown.parquet (never the CSV); with both gone it says so, and
    # takes the breakdown from the events
    (run_copy / "breakdown.parquet").write_text(damage)
    (run_copy / "summary.json").unlink()
    report = labctl("report", str(run_copy))
    assert report.returncode == 0 and "breakdown.parquet is damaged" in report.stderr, report.stderr
    assert "the breakdown was computed from events.jsonl" in report.stderr


def test_a_damaged_summary_is_recomputed(run_copy: Path) -> None:
    (run_copy / "summary.json").write_text('{"phases": ')
    run = load_run(run_copy)
    assert run.summary == {} and run.notes[0].startswith("summary.json is damaged (not valid JSON")
    report = labctl("report", str(run_copy), "--json")
    assert report.returncode == 0 and '"total"' in report.stdout


async def test_an_aborted_runs_plot_has_no_nan_and_a_sensible_zoom(
    tmp_path: Path, inventory_path: Path
) -> None:
    exp = tmp_path / "e.yaml"
    exp.write_text(SHORT.replace("recovery_timeout_s: 5", "recovery_timeout_s: 30"))
    task = asyncio.create_task(
        run_experiment(
            exp, inventory_path, profile="opus-testbed", out_dir=tmp_path / "runs", seed=8, plots=False
        )
    )
    runs = tmp_path / "runs"
    for _ in range(1000):  # stop while the first step's ports are still in firmware link-up (~6 s)
        await asyncio.sleep(0.02)
        events = next(runs.iterdir(), None) if runs.exists() else None
        if events is not None and b'"value":"pp"' in (events / "events.jsonl").read_bytes():
            break
    await asyncio.sleep(0.3)
    task.cancel()
    outcome = await task
    assert outcome.status == "aborted"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an All-NaN median warned here before
        paths = plot_run(outcome.run_dir, reconfig=1, formats=ALL_FORMATS)
    # One file per reconfiguration: drawing another never overwrites timeline.png.
    assert [p.name for p in paths] == [
        "timeline-reconfig-1.png",
        "timeline-reconfig-1.svg",
        "timeline-reconfig-1.pdf",
    ]
    svg = next(p for p in paths if p.suffix == ".svg").read_text()
    assert "nan" not in svg.lower().replace("nanosecond", "")
    assert "none recovered" in svg
    value, unit = svg.split("zoom: first ")[1].split("<")[0].split()[:2]
    zoom = float(value) * {"s": 1.0, "ms": 1e-3, "µs": 1e-6}[unit]
    assert zoom >= 0.05  # the window runs to the end of the run, not to the last mark that happened
