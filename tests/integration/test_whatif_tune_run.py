"""Done when (issue 40 part 2): `labctl whatif` on a real tune run, not a rewritten breakdown: the built-in
tune-autoneg-fec reduced to 2 reconfigurations per setting, run with --profile fast, then `labctl whatif
RUN --provisioning --json`: one measured row per link setting the run applied (its recovery the median of
that setting's circuit ends, as the run's own summary has it), each agreeing with the stall model within
1 ms per switch, and the 25 ms / 6 s / 3 s reference rows after them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from labctl.workload.stall import switch_points
from labctl.workload.trace import get_trace
from labctl.workload.whatif import model_stall_ns

REPO = Path(__file__).resolve().parents[2]
LABCTL = str(Path(sys.executable).with_name("labctl"))
ENV = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"}
REFS = ["reference 25 ms", "reference 6 s", "reference 3 s"]


def test_whatif_on_a_tune_run_gives_one_row_per_setting_each_on_the_stall_model(tmp_path: Path) -> None:
    spec = yaml.safe_load((REPO / "experiments" / "tune-autoneg-fec.yaml").read_text())
    spec["reconfigurations"] = 2
    experiment = tmp_path / "tune-small.yaml"
    experiment.write_text(yaml.safe_dump(spec, sort_keys=False))
    done = subprocess.run(
        [LABCTL, "tune", str(experiment), "--profile", "fast", "--seed", "3", "--no-plots", "--json",
         "-i", str(REPO / "inventory.yaml")],
        cwd=tmp_path, capture_output=True, text=True, env=ENV, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    outcome = json.loads(done.stdout)
    run_dir = Path(outcome["run"]) if Path(outcome["run"]).is_absolute() else tmp_path / outcome["run"]
    settings = outcome["by_link_setting"]["settings"]
    assert len(settings) == 4 and all(s["reconfigurations"] == 2 for s in settings.values())

    whatif = subprocess.run(
        [LABCTL, "whatif", str(run_dir), "--provisioning", "--json", "--no-plot"],
        capture_output=True, text=True, env=ENV, timeout=120,
    )  # fmt: skip
    assert whatif.returncode == 0 and "Traceback" not in whatif.stderr, whatif.stderr[-2000:]
    data = json.loads(whatif.stdout)
    labels = [row["label"] for row in data["rows"]]
    applied = json.loads((run_dir / "run.json").read_text())["link_settings"]["order"]
    assert labels == [*applied, *REFS]  # one measured row per setting, in the order applied
    assert data["trace"] == "opus-testbed" and data["link_up"] == "median"

    windows = [p.window_ns for p in switch_points(get_trace("opus-testbed"))]
    assert data["agreement"]["agrees"] and data["agreement"]["worst_ns_per_switch"] <= 1_000_000
    for row in data["rows"]:
        if row["label"] in settings:  # the same circuit ends and median as the run's summary per setting
            assert row["circuit_ends"] == settings[row["label"]]["total"]["n"]
            assert row["link_up_median_ns"] == settings[row["label"]]["total"]["median"]
        for mode in ("on-demand", "provisioning"):
            o = row["modes"][mode]
            recoveries = [s["recovery_ns"] for s in o["per_switch"]]
            model = model_stall_ns(windows, recoveries, mode)  # from the trace alone
            assert abs(o["engine_stall_ns"] - model) <= o["switches"] * 1_000_000 + o["engine_overhead_ns"]
    refs = {row["label"]: row["link_up_median_ns"] for row in data["rows"][-3:]}
    assert refs == {
        "reference 25 ms": 25_000_000,
        "reference 6 s": 6_000_000_000,
        "reference 3 s": 3_000_000_000,
    }
