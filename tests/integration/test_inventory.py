"""`labctl inventory check` as a subprocess: every mistake is one line naming file:line and the field, exit
code 2. Inventory validation in-process is tests/unit/test_inventory.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.inventory import GOOD, write


def inventory_check(path: Path) -> subprocess.CompletedProcess[str]:
    """`labctl inventory check PATH` as a real subprocess."""
    return subprocess.run(
        [sys.executable, "-m", "labctl.cli", "inventory", "check", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_cli_inventory_check_exit_code_2_and_one_line(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD.replace("switch: ocs1, tx: 2", "switch: ocs9, tx: 2"))
    proc = inventory_check(path)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ") and "hosts.b.nics[0].switch" in lines[0]
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"lab: x\n\xff\xfe\n", "bad.yaml:2: not a UTF-8 text file"),
        (None, "bad.yaml: is a directory, expected the inventory"),
        (b"\n" * 99 + b"lab: x\nprofile: nope\n", "bad.yaml:100: "),  # never rendered as an emoji code
    ],
)
def test_cli_unreadable_inventory_is_one_line(tmp_path: Path, content: bytes | None, expected: str) -> None:
    path = tmp_path / "bad.yaml"
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    proc = inventory_check(path)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and expected in proc.stderr, proc.stderr
