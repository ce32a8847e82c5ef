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
from tests.helpers.tune import settings_events
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
    events = settings_events(outcome.run_dir)
    assert len(events) == 8  # every port of the lab (4 hosts × 2), each moved by the cycle
    for source, seq in events.items():
        assert [e["meta"]["stage"] for e in seq] == ["before", "apply", "apply", "restore"], source
        assert seq[-1]["meta"]["read"] == seq[0]["meta"]["read"], source
        assert seq[1]["host"] == source.removeprefix("nic:").split("/")[0]
    saved = json.loads((outcome.run_dir / "link-settings-before.json").read_text())["ports"]
    assert asyncio.run(read_agents(inv)) == saved
    meta = json.loads((outcome.run_dir / "run.json").read_text())
    assert meta["link_settings"]["restored"] is True


@pytest.mark.slow
async def test_serve_restores_the_ports_of_a_tune_run_killed_mid_sweep(
    broker: Mosquitto,
    tmp_path: Path,
    agent_procs: list[subprocess.Popen[bytes]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`labctl submit` a tune run on the agents lab (the agents hold their ports' settings: they outlive the
    run's process); SIGKILL its process once a setting other than the ports' own is applied; `serve`'s
    recovery puts every port of its link-settings-before.json back through the agents, and says so."""
    import os
    import signal

    from labctl.scheduler import crash_recovery
    from labctl.scheduler.service import Scheduler
    from tests.helpers.serve_processes import labctl_argv

    # no retry: nothing runs on the agents after the recovery
    monkeypatch.setattr(crash_recovery, "MAX_ATTEMPTS", 1)
    inv, _ = write_lab(tmp_path, broker_section(broker.url))
    spawn_agents(inv, tmp_path, agent_procs)
    exp = tune_experiment(tmp_path, reconfigurations=30, hold_s=0.3)
    data = yaml.safe_load(exp.read_text())
    data["sweep"] = {"autoneg": [False, True]}  # the first setting changes every port
    exp.write_text(yaml.safe_dump(data, sort_keys=False))
    db = tmp_path / "q.sqlite"
    submit = await asyncio.create_subprocess_exec(
        *labctl_argv("submit", str(exp), "-i", str(inv), "--db", str(db)), stderr=asyncio.subprocess.PIPE
    )
    _, err = await submit.communicate()
    assert submit.returncode == 0, err
    sched = Scheduler(db, out_dir=tmp_path / "runs", poll_s=0.05, plots=False)
    [row] = sched.store.runs()
    serving = asyncio.create_task(sched.serve(exit_when_idle=False))
    try:
        applied: list[dict[str, Any]] = []
        for _ in range(1200):
            row = sched.store.run(row.id)
            if row.run_dir and (Path(row.run_dir) / "events.jsonl").exists():
                applied = [
                    e
                    for seq in settings_events(Path(row.run_dir)).values()
                    for e in seq
                    if e["meta"]["stage"] == "apply"
                ]
                if applied:
                    break
            await asyncio.sleep(0.05)
        assert applied and applied[0]["meta"]["read"]["autoneg"] is False, "an agent holds autoneg off"
        assert row.pid is not None and row.run_dir is not None
        os.kill(row.pid, signal.SIGKILL)  # the run dies hard: its own restore never runs
        for _ in range(1200):
            if sched.store.run(row.id).state == "interrupted":
                break
            await asyncio.sleep(0.05)
        row = sched.store.run(row.id)
        assert row.state == "interrupted"
        recovery = json.loads(row.recovery or "{}")
        assert recovery["ok"] is True, recovery
        lines = recovery["link_settings"]["ports"]
        assert len(lines) == 8 and all("autoneg=on" in line for line in lines), lines
        meta = json.loads((Path(row.run_dir) / "run.json").read_text())
        assert meta["recovery"]["link_settings"]["ok"] is True
    finally:
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)
    # asked of the agents themselves: every port holds what it held before the run
    saved = json.loads((Path(row.run_dir) / "link-settings-before.json").read_text())["ports"]
    assert await read_agents(inv) == saved


@pytest.mark.slow
def test_lab_restore_puts_a_runs_ports_back_through_the_agents_one_line_each(
    broker: Mosquitto, tmp_path: Path, agent_procs: list[subprocess.Popen[bytes]]
) -> None:
    """`labctl lab restore RUN`: the ports of RUN/link-settings-before.json set back by their agents, one
    line per port; a port that cannot be is named with what it holds, exit 1."""
    from labctl.nic.settings import LinkSettings, settings_to_json
    from tests.helpers.serve_processes import labctl_argv

    inv, _ = write_lab(tmp_path, broker_section(broker.url))
    spawn_agents(inv, tmp_path, agent_procs)

    async def set_off() -> None:
        inventory = load_inventory(inv)
        hub = AgentHub(inventory, BrokerSettings.from_inventory(inventory))
        await hub.start()
        try:
            for host in ("h1", "h3"):
                await hub.wait_online(host)
                off = settings_to_json(LinkSettings(autoneg=False))
                await hub.request(host, "link", {"op": "apply", "port": "p0", "settings": off})
        finally:
            await hub.stop()

    asyncio.run(set_off())
    run = tmp_path / "run"
    run.mkdir()
    before = asyncio.run(read_agents(inv))
    assert before["h1/p0"]["autoneg"] is False and before["h3/p0"]["autoneg"] is False
    saved = {label: {**s, "autoneg": True} for label, s in before.items() if label in ("h1/p0", "h3/p0")}
    (run / "link-settings-before.json").write_text(json.dumps({"ports": saved}))
    (run / "run.json").write_text(json.dumps({"inventory_file": str(inv), "status": "running"}))
    done = subprocess.run(labctl_argv("lab", "restore", str(run)), capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[:2] == [
        f"h1/p0: {LinkSettings(autoneg=True).over(_held(before['h1/p0'])).label} (as before the run)",
        f"h3/p0: {LinkSettings(autoneg=True).over(_held(before['h3/p0'])).label} (as before the run)",
    ]
    assert asyncio.run(read_agents(inv))["h1/p0"]["autoneg"] is True
    # a setting h3's port does not take: named, with what it holds; the other port is still restored
    saved["h3/p0"] = {**saved["h3/p0"], "fec": "llrs"}
    (run / "link-settings-before.json").write_text(json.dumps({"ports": saved}))
    done = subprocess.run(labctl_argv("lab", "restore", str(run)), capture_output=True, text=True)
    assert done.returncode == 1
    lines = done.stdout.splitlines()
    assert lines[0].startswith("h1/p0: autoneg=on,")
    assert lines[1].startswith("NOT restored: h3/p0 holds autoneg=on,") and "fec=llrs" in lines[1], lines
    assert lines[-1] == "1 port(s) not restored"


def _held(data: dict[str, Any]) -> Any:
    from labctl.nic.settings import settings_from_json

    return settings_from_json(data)


@pytest.mark.slow
async def test_an_agent_restarted_mid_sweep_gets_its_ports_put_back_when_it_returns(
    broker: Mosquitto, tmp_path: Path, agent_procs: list[subprocess.Popen[bytes]]
) -> None:
    """h2's agent is killed once a setting other than the ports' own is applied and started again at once
    (systemd would): the run fails naming the restart, and its restore waits for h2 to be back
    (`broker.agent_return_s`) and puts h2's ports back through the new process, as every other port."""
    inv, _ = write_lab(tmp_path, broker_section(broker.url, "  agent_return_s: 60\n"))
    spawn_agents(inv, tmp_path, agent_procs)
    exp = tune_experiment(tmp_path, reconfigurations=30, hold_s=0.3)
    data = yaml.safe_load(exp.read_text())
    data["sweep"] = {"autoneg": [False, True]}  # the first setting changes every port
    exp.write_text(yaml.safe_dump(data, sort_keys=False))
    run = asyncio.create_task(run_experiment(exp, inv, out_dir=tmp_path / "runs", seed=3, plots=False))
    runs = tmp_path / "runs"
    for _ in range(1200):
        dirs = list(runs.glob("*/events.jsonl")) if runs.exists() else []
        applied = (
            [
                e
                for seq in settings_events(dirs[0].parent).values()
                for e in seq
                if e["meta"]["stage"] == "apply"
            ]
            if dirs
            else []
        )
        if any(e["host"] == "h2" for e in applied) or run.done():
            break
        await asyncio.sleep(0.05)
    assert not run.done(), "the sweep ended before h2's ports were set"

    def restart_h2() -> None:
        h2 = agent_procs[HOSTS.index("h2")]
        h2.kill()
        h2.wait()
        with open(tmp_path / "agent-h2.log", "ab") as log:
            argv = [sys.executable, "-m", "labctl.cli", "agent", "--host", "h2", "-i", str(inv)]
            agent_procs.append(subprocess.Popen(argv, stderr=log))

    await asyncio.to_thread(restart_h2)
    outcome = await asyncio.wait_for(run, 120)
    assert (
        outcome.status == "failed" and "h2" in (outcome.error or "") and "restarted" in (outcome.error or "")
    )
    assert "NOT restored" not in (outcome.error or ""), outcome.error
    events = settings_events(outcome.run_dir)
    for source, seq in events.items():
        stages = [e["meta"]["stage"] for e in seq]
        assert stages[0] == "before" and stages[-1] == "restore", (source, stages)
        assert seq[-1]["meta"]["read"] == seq[0]["meta"]["read"], source
    assert {e["host"] for seq in events.values() for e in seq if e["meta"]["stage"] == "restore"} == set(
        HOSTS
    )
    meta = json.loads((outcome.run_dir / "run.json").read_text())
    assert meta["link_settings"]["restored"] is True
    saved = json.loads((outcome.run_dir / "link-settings-before.json").read_text())["ports"]
    assert await read_agents(inv) == saved
