"""The rehearsal of a real lab on one machine, started only through the shipped script and the CLI.

The kernel fabric with a management network, the switch emulator as its own process moving the fabric's
light, mosquitto, one `labctl agent` per host inside its namespace, and `labctl run` on the real lab
kind: the breakdown must hold every mark this fabric can produce, causal row by row, and an agent killed
mid-run must end the run with who and when, every event before it on disk.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest

from labctl.events import read_events
from tests.conftest import REPO, require

pytestmark = [pytest.mark.emulated, pytest.mark.slow]

INVENTORY = REPO / "experiments" / "inventories" / "rehearsal.yaml"
EXPERIMENT = REPO / "experiments" / "reconfig-timeline.yaml"
SCRIPT = REPO / "experiments" / "rehearsal.py"
LABCTL = [sys.executable, "-m", "labctl.cli"]
STATE = Path("/run/labctl/rehearsal-opus-testbed-rehearsal.json")


def _namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


@pytest.fixture(scope="module")
def rehearsal() -> Iterator[dict[str, str]]:
    require(os.geteuid() == 0, "the rehearsal needs root")
    require(
        shutil.which("ip") is not None and shutil.which("mosquitto") is not None, "needs iproute2, mosquitto"
    )
    env = {**os.environ, "LABCTL_REHEARSAL_PASSWORD": secrets.token_urlsafe(12)}
    before = _namespaces()
    up = subprocess.run(
        [sys.executable, str(SCRIPT), "up"], env=env, capture_output=True, text=True, timeout=120
    )
    try:
        assert up.returncode == 0, up.stderr
        yield env
    finally:
        down = subprocess.run(
            [sys.executable, str(SCRIPT), "down"], env=env, capture_output=True, text=True, timeout=120
        )
        assert down.returncode == 0, down.stderr
        assert _namespaces() <= before, "the rehearsal left namespaces behind"
        assert not STATE.exists()


def _run(env: dict[str, str], experiment: Path, out: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*LABCTL, "run", str(experiment), "-i", str(INVENTORY), "--out", str(out), "--no-plots"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_the_main_experiment_runs_on_the_real_lab_kind(rehearsal: dict[str, str], tmp_path: Path) -> None:
    run = _run(rehearsal, EXPERIMENT, tmp_path)
    _, stderr = run.communicate(timeout=300)
    assert run.returncode == 0, stderr
    [run_dir] = list(tmp_path.iterdir())
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["status"] == "completed" and meta["inventory"]["kind"] == "real"
    rows = pd.read_csv(run_dir / "breakdown.csv")
    rows = rows[rows.reconfig > 0]
    assert len(rows) == 8 * 16 and not rows.timed_out.any()
    # Every mark this lab can produce: the command and acknowledgement (TL1), carrier and traffic (the
    # agents' real probes). Veths carry no transceiver (no t2) and the firmware is the fabric's model,
    # invisible to the hosts (no t3): those stay empty, never 0.
    for mark in ("t0_command_ns", "t1_switch_done_ns", "t4_carrier_up_ns", "t5_traffic_ns"):
        assert rows[mark].notna().all(), mark
    assert rows.t2_rx_power_ns.isna().all() and rows.t3_firmware_up_ns.isna().all()
    # Causal row by row, on the controller's clock; agent marks carry their clock offset's uncertainty.
    slack = max(int(est["uncertainty_ns"]) for est in meta["clock_offsets"].values())
    assert set(meta["clock_offsets"]) == {"h1", "h2", "h3", "h4"}
    assert (rows.t1_switch_done_ns >= rows.t0_command_ns).all()
    assert (rows.t4_carrier_up_ns + slack >= rows.t1_switch_done_ns).all()
    assert (rows.t5_traffic_ns >= rows.t4_carrier_up_ns - slack).all()
    streams = meta["agents"]["streams"]
    assert all(s["missing_events"] == 0 and s["events"] > 0 for s in streams.values()), streams
    events = list(read_events(run_dir / "events.jsonl"))
    # No module on a veth: each agent said so, port by port, and went on.
    assert {e.source for e in events if e.kind == "sampler.error"} == {
        f"nic:{p}" for p in rows.host.str.cat(rows.port, "/")
    }


def test_an_agent_killed_mid_run_gives_a_clear_outcome(rehearsal: dict[str, str], tmp_path: Path) -> None:
    experiment = tmp_path / "long.yaml"
    experiment.write_text(EXPERIMENT.read_text().replace("repeat: 2", "repeat: 20"))
    out = tmp_path / "runs"
    run = _run(rehearsal, experiment, out)
    try:
        events_file = None
        for _ in range(600):  # until the run is into its reconfigurations
            found = list(out.glob("*/events.jsonl"))
            if found and found[0].read_bytes().count(b'"kind":"phase"') >= 3:
                events_file = found[0]
                break
            time.sleep(0.05)
        assert events_file is not None, "the run never got going"
        pid = json.loads(STATE.read_text())["pids"]["agent:h3"]
        killed_wall_ns = time.time_ns()
        os.kill(pid, signal.SIGKILL)
        _, stderr = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    assert run.returncode == 1, stderr
    meta = json.loads((events_file.parent / "run.json").read_text())
    assert meta["status"] == "failed" and meta["error"].startswith("agent h3 went offline at "), meta["error"]
    lost = meta["agents"]["lost"]
    assert list(lost) == ["h3"] and killed_wall_ns <= lost["h3"]["wall_ns"] <= killed_wall_ns + 5 * 10**9
    events = list(read_events(events_file))
    [gone] = [e for e in events if e.kind == "agent.lost"]
    assert any(e.host == "h3" and e.kind == "carrier" and e.t_ns < gone.t_ns for e in events)
    assert any(e.kind == "ocs.command" and e.t_ns > gone.t_ns for e in events), "the baseline was restored"
