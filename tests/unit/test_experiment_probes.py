"""Where a lab kind cannot run extra probes (agents run an allow-list), one line says so. Experiments that
name extra probes and run them are tests/integration/test_experiment_probes.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from labctl.core.errors import InputError
from tests.conftest import REPO


def test_a_lab_kind_whose_agents_run_an_allow_list_refuses_extra_probes_in_one_line(tmp_path: Path) -> None:
    import random

    from labctl.inventory.schema import load_inventory
    from labctl.labs import agents as agents_lab
    from labctl.labs.base import LabContext
    from labctl.probes.sampling import ProbeSettings

    inv = tmp_path / "agents.yaml"
    inv.write_text(
        (REPO / "inventory.yaml").read_text() + "kind: agents\nbroker: {url: mqtt://127.0.0.1:1}\n"
    )
    inventory = load_inventory(inv)
    ctx = LabContext(
        inventory,
        inventory.profile("fast"),
        random.Random(1),
        lambda e: None,
        ProbeSettings(extra=["rx-power"]),
    )
    with pytest.raises(
        InputError, match=r"^probes\.extra: rx-power: lab kind agents runs its agents' own probes"
    ):
        agents_lab.build(ctx)
