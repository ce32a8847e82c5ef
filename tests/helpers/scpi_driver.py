"""What tests/unit/test_scpi_driver.py and tests/integration/test_scpi_driver.py share: the port space, a
switch model, and the check that no SCPI worker thread outlives a test."""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator

import pytest

from labctl.inventory.mapping import PortSpace
from labctl.inventory.profiles import Profile, resolve_profile
from labctl.models.switch import SwitchModel

SPACE = PortSpace(32, 32)

FAST = resolve_profile("fast")


def model_of(space: PortSpace = SPACE, switching_ms: float | None = None) -> SwitchModel:
    profile = (
        FAST
        if switching_ms is None
        else Profile(**{**FAST.model_dump(), "switching_ms": (switching_ms,) * 2})
    )
    return SwitchModel("ocs1", space, profile, random.Random(3))


@pytest.fixture(autouse=True)
def _no_leaked_threads() -> Iterator[None]:
    before = set(threading.enumerate())
    yield
    leaked = [t.name for t in threading.enumerate() if t not in before and t.name.startswith("scpi:")]
    assert not leaked, f"worker threads left running: {leaked}"
