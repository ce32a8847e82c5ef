"""`probes.transport: rdma`: labs without the RC transport refuse it in one line. The simulated lab's RDMA
recovery, a whole run, is tests/integration/test_rdma_simulated.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from labctl.controller import run_experiment
from labctl.errors import InputError
from tests.conftest import REPO
from tests.helpers.rdma_simulated import _experiment


async def test_a_lab_without_the_rc_transport_refuses_it_in_one_line(tmp_path: Path) -> None:
    inventory = (
        (REPO / "inventory.yaml").read_text().replace("lab: opus-testbed", "lab: opus-testbed\nkind: agents")
    )
    inventory += "\nbroker: {url: mqtt://127.0.0.1:1}\n"
    inv = tmp_path / "agents.yaml"
    inv.write_text(inventory)
    with pytest.raises(InputError, match=r"probes\.transport: 'rdma' is not available on lab kind agents"):
        await run_experiment(
            _experiment(tmp_path, "{timeout: 12}"),
            inv,
            profile="fast",
            out_dir=tmp_path / "runs",
            plots=False,
        )
