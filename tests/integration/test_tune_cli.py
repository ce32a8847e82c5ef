"""`labctl tune` on the command line: a bad spec is one line and exit 2; --dry-run lists each port's changes
in order (issue 40)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "experiments" / "tune-autoneg-fec.yaml"


def _spec(**changes: object) -> dict[str, object]:
    data = yaml.safe_load(EXAMPLE.read_text())
    data.update(changes)
    return data


def test_the_command_line_says_a_bad_spec_in_one_line_and_exits_2(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(_spec(sweep={"fec": ["sideways"]}), sort_keys=False))
    done = subprocess.run(
        [sys.executable, "-m", "labctl", "tune", str(path), "-i", str(REPO / "inventory.yaml"), "--dry-run"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "bad.yaml:" in done.stderr and "Traceback" not in done.stderr


def test_dry_run_lists_each_change_in_order() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "labctl",
            "tune",
            str(EXAMPLE),
            "-i",
            str(REPO / "inventory.yaml"),
            "--dry-run",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    settings = [line for line in lines if line.startswith("setting ")]
    assert len(settings) == 4
    assert "h1/ens1f0np0: autoneg (as found) → " in done.stdout
    assert lines[-1].startswith("at the end (and on abort or failure): every port set back as found")
