"""labctl installed from its wheel works outside the clone (issue 26): the built-in lab and experiments
are in the wheel as files, `labctl run reconfig-timeline` runs from an empty directory, and `labctl init`
writes a lab that checks. The wheel is built without build isolation (no network) and installed with
--target; its dependencies are this environment's."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

from labctl.core.shipped import builtin_inventory

REPO = Path(__file__).resolve().parents[2]


def test_the_wheel_runs_the_builtin_experiment_from_an_empty_directory(tmp_path: Path) -> None:
    wheels, site, empty = tmp_path / "wheels", tmp_path / "site", tmp_path / "empty"
    empty.mkdir()
    pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]
    build = subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(REPO)],
        capture_output=True,
        text=True,
    )
    assert build.returncode == 0, build.stderr[-2000:]
    (wheel,) = wheels.glob("labctl_ocs-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        # files, not links: a wheel carries what labctl/data's links point at
        assert z.read("labctl/data/inventory.yaml") == (REPO / "inventory.yaml").read_bytes()
    assert "labctl/data/experiments/reconfig-timeline.yaml" in names
    assert "labctl/data/experiments/inventories/tl1-emulated.yaml" in names
    install = subprocess.run(
        [*pip, "install", "--no-deps", "--target", str(site), str(wheel)], capture_output=True, text=True
    )
    assert install.returncode == 0, install.stderr[-2000:]
    env = {**os.environ, "PYTHONPATH": str(site)}  # ahead of the editable install's finder

    def labctl(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "labctl.cli", *args], cwd=empty, env=env, capture_output=True, text=True
        )

    where = subprocess.run(
        [sys.executable, "-c", "import labctl; print(labctl.__file__)"],
        cwd=empty,
        env=env,
        capture_output=True,
        text=True,
    )
    assert where.stdout.startswith(str(site)), where.stdout  # the installed copy, not the clone
    run = labctl("run", "reconfig-timeline", "--profile", "fast", "--no-plots", "--out", "runs")
    assert run.returncode == 0, run.stderr[-2000:]
    assert "status: completed" in run.stdout
    (run_dir,) = (empty / "runs").iterdir()
    assert (run_dir / "breakdown.csv").exists() and (run_dir / "events.jsonl").exists()
    init = labctl("init", "lab")
    assert init.returncode == 0, init.stderr
    check = labctl("inventory", "check", "lab/inventory.yaml")
    assert check.returncode == 0, check.stderr


def _labctl(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "labctl.cli", *args], cwd=cwd, capture_output=True, text=True
    )


def test_init_writes_a_lab_directory_that_checks_and_overwrites_nothing(tmp_path: Path) -> None:
    done = _labctl("init", "lab", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lab = tmp_path / "lab"
    assert sorted(str(p.relative_to(lab)) for p in lab.rglob("*") if p.is_file()) == [
        "README.md",
        "experiments/reconfig-timeline.yaml",
        "experiments/replay-opus-testbed.yaml",
        "inventory.yaml",
    ]
    check = _labctl("inventory", "check", "lab/inventory.yaml", cwd=tmp_path)
    assert check.returncode == 0 and "ok" in check.stdout, check.stderr
    (lab / "inventory.yaml").write_text("lab: edited\n")
    again = _labctl("init", "lab", cwd=tmp_path)
    assert again.returncode == 2
    assert again.stderr.strip().splitlines() == [
        "error: lab/inventory.yaml: already exists (labctl init overwrites nothing without --force)"
    ]
    assert (lab / "inventory.yaml").read_text() == "lab: edited\n"
    forced = _labctl("init", "lab", "--force", cwd=tmp_path)
    assert (
        forced.returncode == 0 and (lab / "inventory.yaml").read_bytes() == builtin_inventory().read_bytes()
    )
