"""Shared by tests/unit/test_power_meter.py and tests/integration/test_power_meter.py."""

from __future__ import annotations

from pathlib import Path

from labctl.probes.sampling import ProbeSettings

MS = 1_000_000

SETTINGS = ProbeSettings(report_interval_ms=50.0, rx_power_threshold_dbm=-10.0)

# 4 hosts x 1 port on an 8x8 sim switch (ingress 1-8, egress 9-16); a meter taps h1's and h2's fibers (one
# by NIC port, one by the switch egress port feeding h2) and an egress port no NIC listens on.
INVENTORY = """\
lab: pm-test
switches:
  ocs1: {{driver: sim, size: 8x8}}
profile: fast
hosts:
  h1:
    nics: [{{ifname: e0, rail: 0, switch: ocs1, tx: 1, rx: 9}}]
  h2:
    nics: [{{ifname: e0, rail: 0, switch: ocs1, tx: 2, rx: 10}}]
  h3:
    nics: [{{ifname: e0, rail: 0, switch: ocs1, tx: 3, rx: 11}}]
  h4:
    nics: [{{ifname: e0, rail: 0, switch: ocs1, tx: 4, rx: 12}}]
power_meters:
  pm1:
    emulate: true
    averaging_time_ms: {averaging}
    channels:
{channels}
"""

CHANNELS = """\
      1: {host: h1, nic: e0}
      2: {switch: ocs1, port: 10}
      3: {switch: ocs1, port: 16}
"""


def write_inventory(tmp_path: Path, channels: str = CHANNELS, averaging: float = 2.0) -> Path:
    path = tmp_path / "inventory.yaml"
    path.write_text(INVENTORY.format(channels=channels, averaging=averaging))
    return path
