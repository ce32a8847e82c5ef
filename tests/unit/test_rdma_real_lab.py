"""`probes.transport: rdma` on the real lab kind: its agents run verbs-rc instead of the UDP traffic probe
(and their allow-list takes it), every NIC port must name its RDMA device (one line naming the port where
one does not), and an agent asked to start verbs-rc on a host without an RDMA device says so in one line.
The modeled agents kind keeps refusing rdma (tests/integration/test_rdma_simulated.py)."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from labctl.agents.agent import Agent
from labctl.agents.broker import BrokerSettings
from labctl.agents.wire import Command
from labctl.core.errors import InputError
from labctl.inventory.schema import Inventory, load_inventory
from labctl.labs import real
from labctl.labs.base import LabContext
from labctl.probes.sampling import ProbeSettings
from labctl.rdma import compat
from tests.conftest import REPO

REHEARSAL = REPO / "experiments" / "inventories" / "rehearsal.yaml"


def _with_rdma(tmp_path: Path) -> Inventory:
    """The rehearsal inventory with `rdma:` on every NIC port."""
    text = re.sub(
        r"(address: [0-9./]+)\}", r"\1, rdma: {device: mlx5_0, port: 1, gid_index: 3}}", REHEARSAL.read_text()
    )
    path = tmp_path / "rdma.yaml"
    path.write_text(text)
    return load_inventory(path)


def test_transport_rdma_runs_verbs_rc_on_the_agents_and_their_allow_list_takes_it() -> None:
    assert real.probes_for(ProbeSettings(transport="rdma")) == (
        "carrier",
        "rx-power",
        "verbs-rc",
        "link-state",
    )
    assert real.probes_for(ProbeSettings()) == ("carrier", "rx-power", "traffic", "link-state")
    inv = load_inventory(REHEARSAL)
    agent = Agent(inv, "h1", BrokerSettings.from_inventory(inv))
    assert {"traffic", "verbs-rc"} <= set(agent.allowed_probes)


def test_a_port_without_rdma_keys_is_one_line_naming_it() -> None:
    inv = load_inventory(REHEARSAL)
    ctx = LabContext(inv, inv.profile(), random.Random(1), lambda _e: None, ProbeSettings(transport="rdma"))
    with pytest.raises(InputError) as info:
        real.build(ctx)
    message = str(info.value)
    assert "\n" not in message
    assert re.match(r"^.*rehearsal\.yaml:\d+: hosts\.h1\.nics\[0\]\.rdma: ", message), message
    assert "h1/ens1f0np0" in message and "gid_index" in message


def test_with_rdma_keys_the_lab_builds_for_transport_rdma(tmp_path: Path) -> None:
    inv = _with_rdma(tmp_path)
    ctx = LabContext(inv, inv.profile(), random.Random(1), lambda _e: None, ProbeSettings(transport="rdma"))
    lab = real.build(ctx)
    try:
        assert lab.probes  # one remote probe per host, running verbs-rc there
    finally:
        lab.close()


async def test_an_agent_without_an_rdma_device_refuses_to_start_verbs_rc_in_one_line(tmp_path: Path) -> None:
    try:
        compat.load()
    except compat.PyverbsMissing as e:
        pytest.skip(f"pyverbs: {e} (CI installs python3-pyverbs)")
    if compat.SYSFS_INFINIBAND.is_dir() and any(compat.SYSFS_INFINIBAND.iterdir()):
        pytest.skip("this host has an RDMA device")
    inv = _with_rdma(tmp_path)
    agent = Agent(inv, "h1", BrokerSettings.from_inventory(inv))
    args = {
        "probes": ["verbs-rc"],
        "settings": ProbeSettings(transport="rdma").model_dump(mode="json"),
        "profile": inv.profile().model_dump(mode="json"),
        "seed": 1,
    }
    with pytest.raises(compat.RdmaUnavailable) as info:
        await agent._cmd_start(Command(id=1, op="start", args=args), 0)
    assert "\n" not in str(info.value) and "no RDMA device" in str(info.value)
    assert not agent._probes  # nothing left running
