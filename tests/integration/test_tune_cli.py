"""`labctl tune` on the command line: a bad spec is one line and exit 2; --dry-run lists each port's changes
in order, then reads each port's support for the settings from the lab and names what it would refuse."""

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


def _dry_run(experiment: Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`labctl tune EXPERIMENT --dry-run` on the built-in simulated lab."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "labctl",
            "tune",
            str(experiment),
            "-i",
            str(REPO / "inventory.yaml"),
            "--dry-run",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=cwd,
    )


def test_the_command_line_says_a_bad_spec_in_one_line_and_exits_2(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(_spec(sweep={"fec": ["sideways"]}), sort_keys=False))
    done = _dry_run(path)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "bad.yaml:" in done.stderr and "Traceback" not in done.stderr


def test_dry_run_lists_each_change_in_order() -> None:
    done = _dry_run(EXAMPLE)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    settings = [line for line in lines if line.startswith("setting ")]
    assert len(settings) == 4
    assert "h1/ens1f0np0: autoneg (as found) → " in done.stdout
    assert "at the end (and on abort or failure): every port set back as found" in lines
    assert lines[-1] == (
        "support read from the lab: all 16 swept ports support the 4 settings (nothing was set)"
    ), done.stdout


def test_dry_run_names_each_port_and_setting_the_lab_would_refuse(tmp_path: Path) -> None:
    """A setting the NICs do not support is found before the run: each port and setting the lab's support
    refuses (the simulated NIC has no LL-RS FEC), exit 2, and no run directory."""
    path = tmp_path / "llrs.yaml"
    path.write_text(yaml.safe_dump(_spec(sweep={"autoneg": ["on"], "fec": ["rs", "llrs"]}), sort_keys=False))
    done = _dry_run(path, cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    refusals = [line.strip() for line in done.stdout.splitlines() if "cannot set" in line]
    assert len(refusals) == 16, done.stdout  # every swept port, the one setting
    assert refusals[0] == (
        "h1/ens1f0np0: cannot set autoneg=on,fec=llrs: FEC 'llrs' not supported (supported: off, rs, baser, auto)"
    )
    assert "1 refusal" not in done.stdout and "16 refusal(s)" in done.stdout
    assert not (tmp_path / "runs").exists()
