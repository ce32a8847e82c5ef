"""Against a real lab (`--lab INVENTORY`): a short link-settings sweep on the lab's own NICs. `labctl tune
--dry-run` lists each change, reads each port's support (reads only) and changes nothing; the sweep (auto-negotiation on/off, 2 reconfigurations
each) completes and every port ends as it was read before it (its recorded read-backs); `labctl whatif`
prices the measured link-up per setting beside the 25 ms / 6 s / 3 s reference rows.

Only ports the inventory's NICs use are touched, and the run refuses a port that carries a host's
management route before anything changes. FEC stays as found: not every NIC accepts RS-FEC off."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from labctl.run.lifecycle import run_experiment
from tests.helpers.tune import assert_restored_as_read_before, settings_events

pytestmark = pytest.mark.hardware

REPO = Path(__file__).resolve().parents[2]
LABCTL = [sys.executable, "-m", "labctl.cli"]


def _short_sweep(tmp_path: Path) -> Path:
    spec = yaml.safe_load((REPO / "experiments" / "tune-autoneg-fec.yaml").read_text())
    spec.update(name="hardware-tune", sweep={"autoneg": ["on", "off"]}, reconfigurations=2)
    path = tmp_path / "tune.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_a_dry_run_lists_the_changes_and_changes_nothing(lab_path: Path, tmp_path: Path) -> None:
    done = subprocess.run(
        [*LABCTL, "tune", str(_short_sweep(tmp_path)), "-i", str(lab_path), "--dry-run"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    # It reads each port's support from the NICs (reads only): all supported, or exit 2 naming each refusal.
    assert done.returncode in (0, 2), done.stdout + done.stderr
    assert "autoneg" in done.stdout
    if done.returncode == 0:
        assert "support read from the lab: all " in done.stdout, done.stdout
    else:
        assert "cannot set autoneg=" in done.stdout, done.stdout
    assert not (tmp_path / "runs").exists()


def test_a_sweep_puts_every_port_back_and_whatif_prices_it(lab_path: Path, tmp_path: Path) -> None:
    run = run_experiment(_short_sweep(tmp_path), lab_path, out_dir=tmp_path / "runs", plots=False)
    outcome = asyncio.run(run)
    error = outcome.error or ""
    if outcome.status == "failed" and "cannot set" in error and error.endswith("nothing was changed"):
        # refused before the sweep, from the NICs' own answer (veths in a rehearsal have no link modes)
        assert not any(
            e["meta"]["stage"] == "apply" for seq in settings_events(outcome.run_dir).values() for e in seq
        )
        pytest.skip(f"this lab's NICs take no link settings: {error}")
    assert outcome.status == "completed", outcome.error
    assert settings_events(outcome.run_dir), "the run recorded no port's link settings"
    assert_restored_as_read_before(outcome.run_dir)
    meta = json.loads((outcome.run_dir / "run.json").read_text())
    assert meta["link_settings"]["restored"] is True
    section = outcome.summary["by_link_setting"]
    assert set(section["settings"]) == {"autoneg=on", "autoneg=off"}
    whatif = subprocess.run(
        [*LABCTL, "whatif", str(outcome.run_dir), "--provisioning", "--json", "--no-plot"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert whatif.returncode == 0, whatif.stdout + whatif.stderr
    labels = [row["label"] for row in json.loads(whatif.stdout)["rows"]]
    assert labels[-3:] == ["reference 25 ms", "reference 6 s", "reference 3 s"], labels
