"""A plugin as its own package (issue 26): examples/labctl-loopback, a switch driver and a probe, built and
installed with pip beside labctl (--target, then on PYTHONPATH), with no edit to labctl: `labctl plugins`
lists both, `labctl inventory check` accepts `driver: loopback`, `labctl run` uses the driver and the probe
on a simulated lab, and the package's own tests pass labctl's contract suites through the pytest plugin,
run where they are as docs/extending.md says. Both of docs/extending.md's worked examples that run the
probe (an experiment's `probes: {extra: [polled-carrier]}`, and the `polled` lab kind) give a breakdown with
no flagged row (issue 45). Built offline (--no-build-isolation: setuptools comes with the [test] extra)."""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from labctl.analysis.store import load_run

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "labctl-loopback"
EXTENDING = REPO / "docs" / "extending.md"

POLL_FAST = "probes:\n  link_state_hz: 1000\n  report_interval_ms: 1\n"
"""The probe polls every port each millisecond, and a sampler writes a heartbeat as often as it samples:
a carrier probe that wrote levels (its old heartbeat) would put one between nearly every reconfiguration's
command and the old link's drop, a carrier-up before the new link's firmware (80 of 128 rows flagged
impossible on the simulated lab, all 128 on the polled lab)."""


def doc_block(first_line: str) -> str:
    """The code block of docs/extending.md whose first line is `first_line`, without it."""
    found: list[str] = re.findall(r"^```\w*\n(.*?)^```", EXTENDING.read_text(), flags=re.S | re.M)
    (block,) = [b for b in found if b.startswith(first_line + "\n")]
    return block.removeprefix(first_line + "\n")


def test_the_package_is_the_code_the_page_shows() -> None:
    """Each module of the package is docs/extending.md's file of the same part, as it is: what the page
    shows is what runs (its own test, tests/unit/test_extending_doc.py, runs the page's copy in-process)."""
    package = EXAMPLE / "src" / "labctl_loopback"
    shown = {
        "__init__.py": "labctl/ocs/drivers/loopback/__init__.py",
        "codec.py": "labctl/ocs/drivers/loopback/codec.py",
        "connection.py": "labctl/ocs/drivers/loopback/connection.py",
        "switch.py": "labctl/ocs/drivers/loopback/switch.py",
        "polled_carrier.py": "labctl/probes/polled_carrier.py",
    }
    assert {path.name for path in package.glob("*.py")} == set(shown)
    for module, path in shown.items():
        assert (package / module).read_text() == doc_block(f"# {path}"), f"{module} is not the page's {path}"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("plugin")
    pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]
    # built from a copy: setuptools leaves build/ and an egg-info beside the sources it builds
    source = root / "labctl-loopback"
    shutil.copytree(EXAMPLE, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    built = subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(root / "wheels"), str(source)],
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
    # docs/extending.md's `polled` lab kind, registered beside it as a plugin's entry point would be
    (target / "labctl_polled_lab.py").write_text(doc_block("# labctl/labs/polled.py"))
    info = target / "labctl_polled_lab-0.0.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: labctl-polled-lab\nVersion: 0.0.0\n")
    (info / "entry_points.txt").write_text("[labctl.lab_kinds]\npolled = labctl_polled_lab:KIND\n")
    return target


def _run(site: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(site), "COLUMNS": "200", "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True)


def _no_flagged_row(run_dir: Path) -> None:
    """The breakdown flags no row impossible, and none of the phases a carrier mark starts or ends
    unresolved (optical and firmware may be, where a starved Rx power sampler marked t2 late on a busy
    machine: not this probe's marks)."""
    rows = load_run(run_dir).breakdown
    assert (rows["reconfig"] > 0).sum() == 128  # 8 reconfigurations x 16 ports, after the baseline's
    impossible = rows[rows["impossible"] != ""]
    assert impossible.empty, impossible[["reconfig", "source", "impossible", "t4_resolution_ns"]].to_string()
    carrier = {"carrier", "transport", "carrier_down"}
    unresolved = rows[[bool(carrier & set(flags.split(","))) for flags in rows["unresolved"]]]
    assert unresolved.empty, unresolved[["reconfig", "source", "unresolved"]].to_string()


def _polled_changes(run_dir: Path) -> dict[str, list[dict[str, Any]]]:
    """Per port, the probe's carrier changes (the events bracketed by the poll before: `meta.prev_ns`)."""
    changes: dict[str, list[dict[str, Any]]] = {}
    for line in (run_dir / "events.jsonl").read_text().splitlines():
        event = json.loads(line)
        if event["kind"] == "carrier" and "prev_ns" in event["meta"]:
            changes.setdefault(event["source"], []).append(event)
    return changes


def _transitions_only(run_dir: Path) -> None:
    """Every polled carrier event after a port's first is a change: bracketed by an earlier poll, its value
    the other of the one before (no heartbeat)."""
    changes = _polled_changes(run_dir)
    assert len(changes) == 16  # every port of the lab
    for source, events in changes.items():
        assert all(0 < e["meta"]["prev_ns"] < e["t_ns"] for e in events), source
        values = [e["value"] for e in events]
        assert all(a != b for a, b in itertools.pairwise(values)), (source, values)


def test_labctl_lists_checks_and_runs_the_plugins(site: Path, tmp_path: Path) -> None:
    listed = _run(site, tmp_path, "-m", "labctl.cli", "plugins", "--json")
    assert listed.returncode == 0, listed.stdout + listed.stderr
    entries = {(e["group"], e["name"]): e for e in json.loads(listed.stdout)}
    for key in (("labctl.switch_drivers", "loopback"), ("labctl.probes", "polled-carrier")):
        assert entries[key]["package"] == "labctl-loopback" and entries[key]["version"] == "0.1.0"
        assert entries[key]["status"] == "ok"
    assert entries[("labctl.switch_drivers", "sim")]["package"] == "labctl-ocs"

    inventory = tmp_path / "inventory.yaml"
    text = (REPO / "inventory.yaml").read_text()
    assert "{driver: sim, size: 32x32}" in text
    inventory.write_text(text.replace("{driver: sim, size: 32x32}", "{driver: loopback, size: 32x32}"))
    checked = _run(site, tmp_path, "-m", "labctl.cli", "inventory", "check", str(inventory))
    assert checked.returncode == 0, checked.stderr

    experiment = tmp_path / "experiment.yaml"
    source = (REPO / "experiments" / "reconfig-timeline.yaml").read_text()
    assert "probes:\n" in source
    # docs/extending.md's `probes: {extra: [polled-carrier]}`, polling fast
    experiment.write_text(source.replace("probes:\n", POLL_FAST + "  extra: [polled-carrier]\n", 1))
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
    _transitions_only(run_dir)
    _no_flagged_row(run_dir)


def test_the_polled_lab_kind_runs_the_probe_with_no_flagged_row(site: Path, tmp_path: Path) -> None:
    """docs/extending.md's `kind: polled` lab, with the example package's probe as its `polled-carrier`."""
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text((REPO / "inventory.yaml").read_text() + "\nkind: polled\n")
    experiment = tmp_path / "experiment.yaml"
    source = (REPO / "experiments" / "reconfig-timeline.yaml").read_text()
    experiment.write_text(source.replace("probes:\n", POLL_FAST, 1))
    ran = _run(site, tmp_path, "-m", "labctl.cli", "run", str(experiment), "-i", str(inventory),
               "--profile", "fast", "--no-plots", "--out", "runs")  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-2000:]
    (run_dir,) = (tmp_path / "runs").iterdir()
    run = json.loads((run_dir / "run.json").read_text())
    assert run["status"] == "completed" and run["inventory"]["kind"] == "polled"
    assert run["probes"]["polled-carrier"]["samples"] > 0
    _transitions_only(run_dir)
    _no_flagged_row(run_dir)


def test_the_plugins_own_tests_pass_labctls_contract_suites_where_they_are(site: Path) -> None:
    """As docs/extending.md says (`cd examples/labctl-loopback && python -m pytest`), and from labctl's
    checkout, without pytest-xdist (`labctl-ocs[testing]` has none): pytest takes the package's own
    settings, never labctl's (whose addopts need xdist)."""
    commands = doc_block("pip install './examples/labctl-loopback[test]'").splitlines()
    (command,) = [c for c in commands if c.startswith("cd examples/labctl-loopback && python -m pytest")]
    summary = command.split("# ", 1)[1].split(" (")[0]  # what the page says it prints: "27 passed, 1 skipped"
    for cwd, where in ((EXAMPLE, []), (REPO, ["examples/labctl-loopback/tests"])):
        done = _run(site, cwd, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", *where)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
        assert f"rootdir: {EXAMPLE}\nconfigfile: pyproject.toml" in done.stdout, done.stdout[:1000]
        assert f" {summary} in " in done.stdout.splitlines()[-1], done.stdout[-1000:]
