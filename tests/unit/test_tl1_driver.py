"""The Polatis TL1 fault file: it loads, and bad fields are one line. The driver against the TL1 emulator
over real sockets is tests/integration/test_tl1_driver.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from labctl.core.errors import InputError
from labctl.emulators.core import FaultPlan, load_faults


def test_fault_file_loads_and_bad_fields_are_one_line(tmp_path: Path) -> None:
    good = tmp_path / "faults.yaml"
    good.write_text("drop_after_commands: 3\ndeny_probability: 0.25\ngarbage_position: between\n")
    assert load_faults(good) == FaultPlan(
        drop_after_commands=3, deny_probability=0.25, garbage_position="between"
    )
    bad = tmp_path / "bad.yaml"
    bad.write_text("drop_after_commands: 3\ndeny_probability: 2\n")
    with pytest.raises(InputError, match=r"bad.yaml:2: deny_probability"):
        load_faults(bad)
