"""A plugin as its own package (issue 26): examples/labctl-loopback, a switch driver and a probe, built and
installed with pip beside labctl (--target, then on PYTHONPATH), with no edit to labctl: `labctl plugins`
lists both, `labctl inventory check` accepts `driver: loopback`, `labctl run` uses the driver and the probe
on a simulated lab, and the package's own tests pass labctl's contract suites through the pytest plugin.
Built offline (--no-build-isolation: setuptools comes with the [test] extra)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "labctl-loopback"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("plugin")
    pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]
    built = subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(root / "wheels"), str(EXAMPLE)],
        capture_output=True,
        text=True,
    )
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = (root / "wheels").glob("labctl_loopback-*.whl")
    target = root / "site"
    done = subprocess.run(
        [*pip, "install", "--no-deps", "--target", str(target), str(wheel)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return target


def _run(site: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(site), "COLUMNS": "200"}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True)


def test_labctl_lists_checks_and_runs_the_plugins(site: Path, tmp_path: Path) -> None:
    listed = _run(site, tmp_path, "-m", "labctl.cli", "plugins", "--json")
    assert listed.returncode == 0, listed.stdout + listed.stderr
    entries = {(e["group"], e["name"]): e for e in json.loads(listed.stdout)}
    for key in (("labctl.switch_drivers", "loopback"), ("labctl.probes", "polled-carrier")):
        assert entries[key]["package"] == "labctl-loopback" and entries[key]["version"] == "0.1.0"
        assert entries[key]["status"] == "ok"
    assert entries[("labctl.switch_drivers", "sim")]["package"] == "labctl"

    inventory = tmp_path / "inventory.yaml"
    text = (REPO / "inventory.yaml").read_text()
    assert "{driver: sim, size: 32x32}" in text
    inventory.write_text(text.replace("{driver: sim, size: 32x32}", "{driver: loopback, size: 32x32}"))
    checked = _run(site, tmp_path, "-m", "labctl.cli", "inventory", "check", str(inventory))
    assert checked.returncode == 0, checked.stderr

    experiment = tmp_path / "experiment.yaml"
    source = (REPO / "experiments" / "reconfig-timeline.yaml").read_text()
    assert "probes:\n" in source
    experiment.write_text(source.replace("probes:\n", "probes:\n  extra: [polled-carrier]\n", 1))
    ran = _run(site, tmp_path, "-m", "labctl.cli", "run", str(experiment), "-i", str(inventory),
               "--profile", "fast", "--no-plots", "--out", "runs")  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-2000:]
    (run_dir,) = (tmp_path / "runs").iterdir()
    run = json.loads((run_dir / "run.json").read_text())
    assert run["status"] == "completed"
    assert run["probes"]["polled-carrier"]["samples"] > 0
    assert run["inventory"]["switches"]["ocs1"]["driver"] == "loopback"
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    assert sum(e["kind"] == "ocs.command" for e in events) == 9  # the baseline and 8 reconfigurations
    # the plugin probe's own events: each port's carrier as its poll saw it
    assert {e["source"] for e in events if e["kind"] == "carrier"} >= {"nic:h1/ens1f0np0", "nic:h4/ens2f1np1"}


def test_the_plugins_own_tests_pass_labctls_contract_suites(site: Path, tmp_path: Path) -> None:
    tests = tmp_path / "tests"
    shutil.copytree(EXAMPLE / "tests", tests)  # outside labctl's tree: none of its conftest applies
    done = _run(
        site, tmp_path, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:benchmark", str(tests)
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and "failed" not in done.stdout
