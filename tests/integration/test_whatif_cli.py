"""Done when (issue 40): `labctl whatif` on a fast run and on a tune run (the fast run's breakdown rewritten
with a `link_setting` column by labctl's own writer): on-demand and provisioning stalls agree with the stall
model within 1 ms per switch; the 25 ms / 6 s / 3 s reference rows are printed; bad input is one line."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from labctl.analysis.breakdown_table import write_breakdown
from labctl.workload.stall import switch_points
from labctl.workload.trace import get_trace
from labctl.workload.whatif import model_stall_ns

LABCTL = str(Path(sys.executable).with_name("labctl"))
ENV = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"}
REFS = ["reference 25 ms", "reference 6 s", "reference 3 s"]


@pytest.fixture(scope="module")
def fast_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("whatif")
    done = subprocess.run(
        [LABCTL, "run", "reconfig-timeline", "--profile", "fast", "--seed", "5", "--no-plots"],
        cwd=root,
        capture_output=True,
        text=True,
        env=ENV,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    (run_dir,) = (root / "runs").iterdir()
    return run_dir


def _whatif(*args: str, cwd: Path | None = None, expect: int = 0) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [LABCTL, "whatif", *args], cwd=cwd, capture_output=True, text=True, env=ENV, timeout=120
    )
    assert "Traceback" not in done.stderr
    assert done.returncode == expect, done.stdout[-2000:] + done.stderr[-2000:]
    return done


def _check_against_model(data: dict, trace_name: str) -> None:
    windows = [p.window_ns for p in switch_points(get_trace(trace_name))]
    assert data["agreement"]["agrees"] and data["agreement"]["worst_ns_per_switch"] <= 1_000_000
    for row in data["rows"]:
        for mode in ("on-demand", "provisioning"):
            o = row["modes"][mode]
            drawn = [s["recovery_ns"] for s in o["per_switch"]]
            model = model_stall_ns(windows, drawn, mode)  # computed here, from the trace alone
            assert abs(o["engine_stall_ns"] - model) <= o["switches"] * 1_000_000 + o["engine_overhead_ns"]
            assert o["hidden"] == sum(s["hidden"] for s in o["per_switch"])
            if mode == "on-demand":
                assert o["hidden"] == 0


def test_whatif_on_a_fast_run(fast_run: Path) -> None:
    done = _whatif("--provisioning", cwd=fast_run.parents[1])  # no RUN: the newest in runs/
    text = done.stdout
    for label in ["measured", *REFS]:
        assert label in text
    assert "agrees" in text and "hidden by" in text
    assert (fast_run / "whatif.png").stat().st_size > 10_000
    data = json.loads(_whatif(str(fast_run), "--provisioning", "--json", "--no-plot").stdout)
    assert [r["label"] for r in data["rows"]] == ["measured", *REFS]
    assert data["link_up"] == "median" and data["clock"] == "virtual"
    measured = data["rows"][0]
    summary = json.loads((fast_run / "summary.json").read_text())
    assert measured["circuit_ends"] == summary["phases"]["total"]["n"]
    assert measured["link_up_median_ns"] == summary["phases"]["total"]["median"]
    _check_against_model(data, "opus-testbed")
    drawn = json.loads(_whatif(str(fast_run), "--provisioning", "--json", "--draw", "--seed", "2",
                               "--out", str(fast_run.parent / "w.png")).stdout)  # fmt: skip
    assert drawn["link_up"] == "draw" and drawn["seed"] == 2 and (fast_run.parent / "w.png").is_file()
    _check_against_model(drawn, "opus-testbed")


def test_whatif_on_a_tune_run_groups_by_link_setting(fast_run: Path, tmp_path: Path) -> None:
    tune = tmp_path / "runs" / "20990101-000000-tune-0001"
    shutil.copytree(fast_run, tune)
    frame = pd.read_parquet(tune / "breakdown.parquet")
    setting = ["autoneg=on" if r % 2 else "autoneg=off,fec=rs" for r in frame["reconfig"].fillna(0)]
    frame["link_setting"] = pd.array(setting, dtype="string")
    frame.loc[frame["reconfig"] == 0, "link_setting"] = ""
    write_breakdown(frame, tune)
    data = json.loads(_whatif(str(tune), "--provisioning", "--json", "--job", "opus-testbed-mini").stdout)
    assert [r["label"] for r in data["rows"]] == ["autoneg=on", "autoneg=off,fec=rs", *REFS]
    kept = frame[(frame["reconfig"] > 0) & (frame["peer"].fillna("") != "") & frame["total_ns"].notna()]
    for row in data["rows"][:2]:
        mine = kept[kept["link_setting"] == row["label"]]["total_ns"]
        assert row["circuit_ends"] == len(mine)
    assert data["trace"] == "opus-testbed-mini"
    _check_against_model(data, "opus-testbed-mini")
    text = _whatif(str(tune), "--job", "opus-testbed-mini", "--no-plot").stdout
    assert "autoneg=off,fec=rs" in text and "│ on-demand" in text and "│ provisioning" not in text


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--job", "nope"], "--job nope: no such built-in job"),
        (["--job", "config-1", "--trace", "t.yaml"], "give --job or --trace, not both"),
        (["--trace", "missing.yaml"], "--trace missing.yaml: no such file"),
        (["nowhere"], "nowhere: no such run directory"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    done = _whatif(*args, cwd=tmp_path, expect=2)
    assert done.stderr.strip().count("\n") == 0 and message in done.stderr
