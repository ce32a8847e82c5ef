"""What tests/unit/test_agents.py and tests/integration/test_agents.py share: the lab they write and a hub
that is handed messages (no broker)."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from labctl.agents.broker import BrokerSettings
from labctl.agents.hub import AgentHub
from labctl.agents.hub_streams import HostLink
from labctl.agents.wire import Signer, topic
from labctl.inventory.schema import load_inventory

# Zero-width ranges: every draw of the profile is the same, so two runs of the same experiment must give
# the same breakdown up to sampling and transport effects, which is what the comparison measures.
INVENTORY = """
lab: {lab}
switches:
  ocs1: {{driver: sim, size: 16x16}}
profile: fixed
profiles:
  fixed:
    extends: fast
    switching_ms: [2.5, 2.5]
    light_loss_ms: [0.2, 0.2]
    optical_settle_ms: [0.4, 0.4]
    firmware_up_ms: [50, 50]
    carrier_after_firmware_us: [75, 75]
    transport_after_carrier_ms: [15, 15]
    carrier_down_after_loss_ms: [0.2, 0.2]
    rtt_us: [10, 10]
hosts:
  h1: {{nics: [{{ifname: p0, rail: 0, switch: ocs1, tx: 1, rx: 17}}, {{ifname: p1, rail: 1, switch: ocs1, tx: 2, rx: 18}}]}}
  h2: {{nics: [{{ifname: p0, rail: 0, switch: ocs1, tx: 3, rx: 19}}, {{ifname: p1, rail: 1, switch: ocs1, tx: 4, rx: 20}}]}}
  h3: {{nics: [{{ifname: p0, rail: 0, switch: ocs1, tx: 5, rx: 21}}, {{ifname: p1, rail: 1, switch: ocs1, tx: 6, rx: 22}}]}}
  h4: {{nics: [{{ifname: p0, rail: 0, switch: ocs1, tx: 7, rx: 23}}, {{ifname: p1, rail: 1, switch: ocs1, tx: 8, rx: 24}}]}}
{broker}
"""

EXPERIMENT = """
name: agents-compare
rails: [0, 1]
phases:
  dp: {{pairs: [[h1, h2], [h3, h4]]}}
  pp: {{pairs: [[h1, h3], [h2, h4]]}}
baseline: dp
cycle: [pp, dp]
repeat: {repeat}
hold_s: 0.2
recovery_timeout_s: 10
"""


def write_lab(tmp_path: Path, broker_yaml: str = "", repeat: int = 1) -> tuple[Path, Path]:
    """The lab is named after the test directory: retained messages of one test never reach another."""
    inv = tmp_path / f"inventory{'-mqtt' if broker_yaml else ''}.yaml"
    lab = "t-" + "".join(c if c.isalnum() else "-" for c in tmp_path.name)[-40:]
    inv.write_text(INVENTORY.format(broker=broker_yaml, lab=lab))
    exp = tmp_path / "experiment.yaml"
    exp.write_text(EXPERIMENT.format(repeat=repeat))
    return inv, exp


MIRROR_LAG_MS = 250
"""How far the test labs' agent mirrors run behind the model (default 50 ms; decision 0046). A world update
that reaches an agent later than the feed's lead plus this makes its samplers wait for it (decision 0086:
they read no instant past what the feed has confirmed) rather than read a stale copy; run.json records the
waits as `held_for_feed`. On CI's four workers over two cores, updates took longer than 100 ms now and then
(agents runs in 3 loaded suite runs on 2026-12-06), up to ~700 ms in one; the lag only delays what the
agents observe, never their stamps (model times)."""


def broker_section(url: str, extra: str = "") -> str:
    return (
        f"kind: agents\nbroker:\n  url: {url}\n  clock_sync_interval_s: 0.5\n"
        f"  mirror_lag_ms: {MIRROR_LAG_MS}\n{extra}"
    )


# -- agent loss, status by status (no broker: the hub's decisions on the messages it is given) ----------------
GRACE_S = 0.3


@pytest.fixture
def lost() -> list[str]:
    """The reasons the hub gave the run for its lost agents (what `Lab.fault` would get)."""
    return []


@pytest.fixture
async def hub(tmp_path: Path, lost: list[str]) -> AsyncIterator[AgentHub]:
    inv_path, _ = write_lab(tmp_path, broker_section("mqtt://127.0.0.1:1"))
    inventory = load_inventory(inv_path)
    settings = dataclasses.replace(BrokerSettings.from_inventory(inventory), agent_grace_s=GRACE_S)
    hub = AgentHub(inventory, settings)  # never started: messages are handed to it as if they had come
    hub.on_lost = lost.append
    try:
        yield hub
    finally:
        await hub.stop()


def _status(hub: AgentHub, host: str, body: str, t_ns: int) -> None:
    name = topic(hub.lab, host, "status")
    signer = Signer(hub.broker.key_for(host), host)  # as the host's agent signs it
    hub._on_message(name, signer.seal(name, body.encode()), t_ns)


def _loss(link: HostLink) -> tuple[int | None, str | None]:
    """When (the controller's clock) and why the hub declared the agent lost."""
    return link.lost_at_ns, link.lost_reason


def _running(hub: AgentHub, host: str, incarnation: str) -> HostLink:
    """The agent `incarnation` is online and runs this run's probes (as after its start reply)."""
    _status(hub, host, f"online {incarnation}", 1)
    link = hub.links[host]
    link.started, link.incarnation = True, incarnation
    return link
