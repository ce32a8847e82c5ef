"""The hardware tier: these tests drive a real lab, named with `pytest tests/hardware --lab INVENTORY`.

Without `--lab` every test here is skipped (in CI too: CI has no lab). The lab must be ready (`labctl lab
check -i INVENTORY`), its agents running, the switch password in the environment. The tests change patches
only on the ports the inventory's NICs use, and put back what they found.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from labctl.inventory.schema import Inventory


@pytest.fixture(scope="session")
def lab_path(request: pytest.FixtureRequest) -> Path:
    value = request.config.getoption("--lab")
    if value is None:
        pytest.skip("needs a real lab: pytest tests/hardware --lab INVENTORY")
    return Path(value)


@pytest.fixture(scope="session")
def lab(lab_path: Path) -> Inventory:
    from labctl.labs import load

    return load(lab_path)
