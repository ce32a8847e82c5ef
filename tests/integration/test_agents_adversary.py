"""A hostile agent host (decision 0072): h1's agent, holding only its own identity, runs its probes honestly
and forges replies to the controller for the other hosts (labctl.testing.adversary). Through mosquitto on
the configuration `labctl lab broker-config` writes (per-host users, ACLs, client id = user), the other
hosts' measurements come out as in an honest run of the same seed, and every forgery that reached the
controller is counted in run.json by the reason it was refused."""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiomqtt
import pandas as pd
import pytest

from labctl.agents.agent import Agent
from labctl.agents.broker import BrokerSettings
from labctl.agents.hub import AgentHub
from labctl.agents.hub_commands import REFUSALS, _Pending
from labctl.agents.wire import Signer, status_body, topic
from labctl.core.events import read_events
from labctl.inventory.schema import load_inventory
from labctl.run.lifecycle import run_experiment
from labctl.testing.adversary import AdversarialAgent
from labctl.testing.mosquitto import Mosquitto
from tests.integration import test_broker_identities as identities
from tests.integration.test_broker_identities import _spawn_agent

pytestmark = pytest.mark.xdist_group("agents")

# fixtures: mosquitto on the configuration `labctl lab broker-config` writes, the identities' secrets
closed_broker, secrets_env, agent_procs = (
    identities.closed_broker,
    identities.secrets_env,
    identities.agent_procs,
)
_mosquitto_installed = identities._mosquitto_installed

HONEST = ("h2", "h3", "h4")
TRANSITIONS = ("carrier", "link.firmware")  # one event per modeled change: as many in every run of a seed


def _facts(run_dir: Path) -> dict[str, Any]:
    """What an honest run of a seed fixes for each host, whatever the scheduling: its breakdown rows, its
    transition events, its stream accounting, its probes' and its agent's own records."""
    meta = json.loads((run_dir / "run.json").read_text())
    frame = pd.read_csv(run_dir / "breakdown.csv")
    events = read_events(run_dir / "events.jsonl")
    agents = meta["agents"]
    facts: dict[str, Any] = {}
    for host in HONEST:
        rows = frame[frame["host"] == host]
        stream = agents["streams"][host]
        facts[host] = {
            "rows": sorted(zip(rows["reconfig"], rows["port"], strict=True)),
            "marks_missing": int(
                rows[["t2_rx_power_ns", "t3_firmware_up_ns", "t4_carrier_up_ns", "t5_traffic_ns"]]
                .isna()
                .sum()
                .sum()
            ),
            "timed_out": int(rows["timed_out"].sum()),
            "transitions": Counter(e.kind for e in events if e.host == host and e.kind in TRANSITIONS),
            "kinds": sorted({e.kind for e in events if e.host == host}),
            "stream_clean": (
                stream["missing_events"],
                stream["duplicate_batches"],
                stream["missing_batches"],
            ),
            "probes": sorted(meta["probes"][f"agent:{host}"]),
            "agent_rejected": agents["agent_rejected"][host],
            "clock_via": meta["clock_offsets"][host]["exchange_via"],
        }
    return facts


async def _run(exp: Path, inv: Path, out: Path) -> tuple[Path, dict[str, Any]]:
    outcome = await run_experiment(exp, inv, out_dir=out, plots=False, seed=1)
    assert outcome.status == "completed", outcome.error
    return outcome.run_dir, json.loads((outcome.run_dir / "run.json").read_text())


@pytest.mark.slow
async def test_a_hostile_host_changes_nothing_of_the_other_hosts_and_every_forgery_is_counted(
    closed_broker: tuple[Mosquitto, Path],
    tmp_path: Path,
    agent_procs: list[subprocess.Popen[bytes]],
    labctl_adversarial_agent: Callable[..., Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, inv = closed_broker
    exp = inv.parent / "experiment.yaml"
    for host in HONEST:  # each with its own secret only
        agent_procs.append(_spawn_agent(inv, host, tmp_path / f"agent-{host}.log"))
    inventory = load_inventory(inv)

    # An honest run: h1's agent in this process, as honest as the others.
    honest_h1 = Agent(inventory, "h1", BrokerSettings.from_inventory(inventory, identity="h1"))
    task = asyncio.create_task(honest_h1.run(), name="test-agent:h1")
    try:
        await asyncio.wait_for(honest_h1.connected.wait(), 10)
        honest_dir, honest_meta = await _run(exp, inv, tmp_path / "honest")
    finally:
        honest_h1.stop()
        await asyncio.gather(task, return_exceptions=True)
    assert not any(honest_meta["agents"]["replies_refused"].values())

    # The same seed with h1 hostile; the worst case: it learns the ids of every other host's commands.
    sent: list[tuple[str, int, str]] = []
    send_command = AgentHub._send_command

    def recorded(hub: AgentHub, host: str, op: str, *args: Any, **kwargs: Any) -> tuple[int, _Pending]:
        cmd_id, pending = send_command(hub, host, op, *args, **kwargs)
        sent.append((host, cmd_id, op))
        return cmd_id, pending

    monkeypatch.setattr(AgentHub, "_send_command", recorded)
    adversary: AdversarialAgent = await labctl_adversarial_agent(
        inv, "h1", leaked_ids=lambda: [(i, op) for host, i, op in sent if host != "h1"]
    )
    hostile_dir, meta = await _run(exp, inv, tmp_path / "hostile")

    assert _facts(hostile_dir) == _facts(honest_dir)
    assert "forged_by" not in (hostile_dir / "run.json").read_text()  # no forged number recorded anywhere
    # Every forgery that reached the controller, counted by why it was refused; nothing else refused.
    attempts = adversary.attempts
    assert attempts["forged"] > 0 and attempts["unsolicited"] > 0 and attempts["replayed"] > 0
    refused = meta["agents"]["replies_refused"]
    assert refused == {reason: attempts[reason] for reason in REFUSALS}
    # What the ACL forbids never reached the controller: those would be h1's signatures on other hosts'
    # topics, counted `forged` beside the replies refused as such.
    assert sum(adversary.off_acl.values()) > 0
    rejected = meta["agents"]["rejected"]
    assert rejected["forged"] == attempts["forged"] + attempts["unsolicited"] + attempts["wrong_op"]
    assert (rejected["unauthorised"], rejected["replayed"]) == (attempts["off_topic"], attempts["replayed"])
    assert meta["agents"]["streams"]["h1"]["events"] > 0  # h1 itself ran honestly for its own ports


async def test_a_host_cannot_take_the_controllers_session(closed_broker: tuple[Mosquitto, Path]) -> None:
    """With `use_username_as_clientid` (labctl lab broker-config) a client's id is its user: h1 connecting
    under the controller's client id gets a session of its own, and the controller's stays up."""
    broker, inv = closed_broker
    inventory = load_inventory(inv)
    hub = AgentHub(inventory, BrokerSettings.from_inventory(inventory))
    await hub.start()
    try:
        assert hub.client_id is not None
        h1 = BrokerSettings.from_inventory(inventory, identity="h1")
        user, password = h1.credentials()
        assert user is not None and password is not None
        status = topic(inventory.lab, "h1", "status")
        signer = Signer(h1.key_for("h1"), "h1")
        async with aiomqtt.Client(
            "127.0.0.1",
            broker.port,
            username=user.reveal(),
            password=password.reveal(),
            identifier=hub.client_id,  # the controller's
        ) as intruder:
            # Through the controller's connection: its `online` reaches the controller only if that
            # connection was not taken over (a takeover would drop it, and a not retained message with it).
            await intruder.publish(status, signer.seal(status, status_body("online", "intruder")), qos=1)
            await hub.wait_online("h1", timeout_s=10)
        assert hub.reconnects == 0 and hub.connected.is_set()
    finally:
        await hub.stop()
