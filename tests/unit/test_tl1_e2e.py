"""A real TL1 switch with simulated NICs is refused. reconfig-timeline end to end against the TL1 emulator
is tests/integration/test_tl1_e2e.py."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from labctl.core.errors import InputError
from labctl.inventory.schema import load_inventory
from labctl.labs import build_lab, load
from labctl.labs.base import LabContext
from labctl.probes.sampling import ProbeSettings
from tests.helpers.tl1_e2e import TL1_INVENTORY


def test_real_tl1_switch_with_simulated_nics_is_refused(tmp_path: Path) -> None:
    inventory = tmp_path / "inv.yaml"
    inventory.write_text(
        TL1_INVENTORY.read_text().replace(
            "{driver: polatis-tl1, emulate: true, size: 32x32}",
            "{driver: polatis-tl1, address: 192.0.2.10, user: admin, size: 32x32}",
        )
    )
    inv = load_inventory(inventory)  # a valid switch: only the simulated lab refuses it, with its reason
    ctx = LabContext(inv, inv.profile("fast"), random.Random(1), lambda e: None, ProbeSettings())
    refusal = r"inv.yaml:\d+: switches.ocs1: a polatis-tl1 switch at an address cannot light the modeled NIC ports of a simulated lab"
    with pytest.raises(InputError, match=refusal):
        build_lab(ctx)
    with pytest.raises(InputError, match=refusal):  # and `labctl inventory check` says the same
        load(inventory)
