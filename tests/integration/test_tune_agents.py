"""Tune on the agents lab (issue 40, decision 0079): four `labctl agent` processes through mosquitto, each
applying its own ports' link settings (`link` command) on its model of them, and the controller's model
drawing link-up from what they hold. A small sweep (auto-negotiation on/off, 2 reconfigurations each) on a
fast profile of fixed draws completes, the report ranks the settings, each setting's firmware median is the
link model's (the same the one-process lab draws), and every port's settings after equal those before."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from labctl.agents.broker import BrokerSettings
from labctl.agents.hub import AgentHub
from labctl.inventory.profiles import resolve_profile
from labctl.inventory.schema import load_inventory
from labctl.run.lifecycle import run_experiment
from tests.helpers.agents import broker_section, write_lab
from tests.mosquitto import Mosquitto

pytestmark = pytest.mark.xdist_group("agents")

HOSTS = ("h1", "h2", "h3", "h4")


def tune_experiment(tmp_path: Path, reconfigurations: int = 2, hold_s: float = 0.2) -> Path:
    path = tmp_path / "tune.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "kind": "tune",
                "name": "tune-agents",
                "rails": [0, 1],
                "phases": {
                    "dp": {"pairs": [["h1", "h2"], ["h3", "h4"]]},
                    "pp": {"pairs": [["h1", "h3"], ["h2", "h4"]]},
                },
                "baseline": "dp",
                "cycle": ["pp", "dp"],
                "sweep": {"autoneg": [True, False]},
                "reconfigurations": reconfigurations,
                "order": "as-written",
                "hold_s": hold_s,
                "recovery_timeout_s": 10,
            },
            sort_keys=False,
        )
    )
    return path


@pytest.fixture
def broker(mosquitto: Mosquitto) -> Mosquitto:
    if mosquitto.proc is None or mosquitto.proc.poll() is not None:
        mosquitto.start()
    return mosquitto


@pytest.fixture
def agent_procs(broker: Mosquitto) -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def spawn_agents(inv: Path, logs: Path, procs: list[subprocess.Popen[bytes]]) -> None:
    for host in HOSTS:
        argv = [sys.executable, "-m", "labctl.cli", "agent", "--host", host, "-i", str(inv)]
        with open(logs / f"agent-{host}.log", "ab") as log:
            procs.append(subprocess.Popen(argv, stderr=log))


async def read_agents(inv: Path) -> dict[str, dict[str, Any]]:
    """Every port's settings, asked of its agent now (a controller of its own, as `labctl lab restore`)."""
    inventory = load_inventory(inv)
    hub = AgentHub(inventory, BrokerSettings.from_inventory(inventory))
    await hub.start()
    try:
        out = {}
        for port in inventory.ports:
            await hub.wait_online(port.host)
            reply = await hub.request(port.host, "link", {"op": "read", "port": port.ifname})
            assert reply.data is not None
            out[f"{port.host}/{port.ifname}"] = reply.data["settings"]
        return out
    finally:
        await hub.stop()


def link_events(run_dir: Path) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for line in (run_dir / "events.jsonl").read_text().splitlines():
        event = json.loads(line)
        if event["kind"] == "link.settings":
            out.setdefault(event["source"], []).append(event)
    return out


@pytest.mark.slow
def test_a_tune_run_through_four_agents_ranks_the_settings_and_puts_every_port_back(
    broker: Mosquitto, tmp_path: Path, agent_procs: list[subprocess.Popen[bytes]]
) -> None:
    inv, _ = write_lab(tmp_path, broker_section(broker.url))
    spawn_agents(inv, tmp_path, agent_procs)
    outcome = asyncio.run(
        run_experiment(tune_experiment(tmp_path), inv, out_dir=tmp_path / "runs", seed=3, plots=False)
    )
    assert outcome.status == "completed", outcome.error
    section = outcome.summary["by_link_setting"]
    labels = {"autoneg=on", "autoneg=off"}
    assert set(section["settings"]) == labels and section["reference"] == "autoneg=on"
    assert [item["setting"] for item in section["ranking"]] == ["autoneg=off", "autoneg=on"]
    # The controller's model drew each setting's link-up from what the agents hold: the profile's fixed
    # firmware draw (50 ms) times the link model's factor, as the one-process lab draws it; the measured
    # phase starts at t2, a sampled mark up to its bracket after the light came.
    profile = load_inventory(inv).profile()
    low, _ = profile.firmware_up_ms
    slack = outcome.summary["resolution"]["t2"]["max"] + profile.range_ns("optical_settle_ms")[1]
    for label, entry in section["settings"].items():
        expected = low * 1e6 * profile.link.factor(label == "autoneg=on", "rs", False)
        assert abs(entry["firmware"]["median"] - expected) <= slack, (label, entry["firmware"])
        assert entry["reconfigurations"] == 2
    assert resolve_profile("fast").link == profile.link
    # every port's settings after the run are those before (the recorded read-backs), and its agent says so
    events = link_events(outcome.run_dir)
    assert len(events) == 8  # every port of the lab (4 hosts × 2), each moved by the cycle
    for source, seq in events.items():
        assert [e["meta"]["stage"] for e in seq] == ["before", "apply", "apply", "restore"], source
        assert seq[-1]["meta"]["read"] == seq[0]["meta"]["read"], source
        assert seq[1]["host"] == source.removeprefix("nic:").split("/")[0]
    saved = json.loads((outcome.run_dir / "link-settings-before.json").read_text())["ports"]
    assert asyncio.run(read_agents(inv)) == saved
    meta = json.loads((outcome.run_dir / "run.json").read_text())
    assert meta["link_settings"]["restored"] is True
