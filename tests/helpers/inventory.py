"""Shared by tests/unit/test_inventory.py and tests/integration/test_inventory.py."""

from __future__ import annotations

from pathlib import Path

GOOD = """\
lab: tiny
switches:
  ocs1: {driver: sim, size: 4x4}
hosts:
  a:
    nics:
      - {ifname: eth0, rail: 0, switch: ocs1, tx: 1, rx: 5}
  b:
    nics:
      - {ifname: eth0, rail: 0, switch: ocs1, tx: 2, rx: 6}
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "inventory.yaml"
    path.write_text(text)
    return path
