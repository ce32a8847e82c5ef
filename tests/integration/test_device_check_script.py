"""bench/device_check.py as a newcomer runs it: `--help` teaches, and a dry run on this machine (no RDMA
device, no module EEPROM on its interfaces, no GPU) says so in one line per part and exits 0."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

SCRIPT = REPO / "bench" / "device_check.py"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=REPO,
    )


def test_help_says_what_it_does_and_that_it_only_reads() -> None:
    proc = run("--help")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.startswith("usage:")
    for words in ("ibv_devices", "ethtool -m", "ib_send_lat", "local_ca_ack_delay", "forbid_writes",
                  "docs/measured/device-YYYY-MM-DD.md", "--dry-run", "--parts", "Exit codes"):  # fmt: skip
        assert words in out, words


def test_an_unknown_part_is_refused_in_one_line() -> None:
    proc = run("--parts", "rdma,disks")
    assert proc.returncode == 2 and "unknown part(s) disks" in proc.stderr


def test_dry_run_here_says_what_is_missing_and_exits_0(tmp_path: Path) -> None:
    proc = run("--dry-run", "--iterations", "200", "--gpu-out", str(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert "writes forbidden in this process" in lines[0]
    one_line = {
        "RDMA": [line for line in lines if line.startswith("RDMA: none present")],
        "modules": [line for line in lines if line.startswith("modules: none present (no module EEPROM on ")],
        "GPU": [line for line in lines if line.startswith("GPU: none present")],
    }
    assert all(len(found) == 1 for found in one_line.values()), proc.stdout
    assert "== report (dry run: not written)" in proc.stdout
    assert "## Transceiver modules" in proc.stdout and "No module:" in proc.stdout
    assert not list(tmp_path.iterdir())  # no GPU: no run directory


def test_the_report_is_written_where_asked(tmp_path: Path) -> None:
    report = tmp_path / "device.md"
    proc = run("--parts", "ports", "--report", str(report))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = report.read_text()
    assert text.startswith("# bench/device_check.py on ")
    assert "## RDMA\n\nNot run (--parts)." in text and "## Transceiver modules" in text
