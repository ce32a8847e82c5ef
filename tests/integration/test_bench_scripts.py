"""Every bench/ script still imports and explains itself: nothing else in CI runs them."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import REPO

SCRIPTS = sorted(p for p in (REPO / "bench").glob("*.py") if not p.name.startswith("_"))  # not the helpers


def test_there_are_bench_scripts() -> None:
    assert {p.name for p in SCRIPTS} >= {
        "events.py",
        "tl1.py",
        "carrier.py",
        "traffic.py",
        "dom.py",
        "mqtt.py",
        "device_check.py",
        "dashboard.py",
    }


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_bench_script_help(script) -> None:  # type: ignore[no-untyped-def]
    proc = subprocess.run(
        [sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage:"), proc.stdout[:200]
