"""experiments/rehearsal.py's own bookkeeping: which of its processes still run (a zombie does not), that it
signals only processes confirmed to be the ones it started, that it waits for every agent to be online and
names the one that is not, and that `down` and `status` need no secret.

The whole rehearsal, up and used as a lab, is tests/emulated/test_rehearsal.py.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from labctl.emulators.fabric import FabricLayout, managed_prefix
from labctl.inventory.schema import load_inventory
from labctl.linux import netns
from tests.conftest import REPO, require
from tests.emulated.conftest import _children

SCRIPT = REPO / "experiments" / "rehearsal.py"
INVENTORY = REPO / "experiments" / "inventories" / "rehearsal.yaml"


def _load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("rehearsal_script", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


rehearsal = _load_script()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _wait_state(pid: int, letter: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while (stat := rehearsal.proc_stat(pid)) is None or stat[0] != letter:
        assert time.monotonic() < deadline, f"pid {pid} never reached state {letter}: {stat}"
        time.sleep(0.01)


@pytest.fixture
def children() -> Iterator[list[Any]]:
    """Every Child a test spawns: killed and reaped afterwards, whatever the test did."""
    spawned: list[Any] = []
    try:
        yield spawned
    finally:
        for child in spawned:
            proc = child.proc
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, 9)
            proc.wait(timeout=10)


def _spawn(children: list[Any], name: str, cmd: list[str], log: Path) -> Any:
    child = rehearsal.spawn(name, cmd, log)
    children.append(child)
    return child


def _as_read_back(child: Any) -> Any:
    """The same process as `down` and `status` know it: from the state file, no Popen."""
    return rehearsal.Child(child.name, child.pid, child.start_ticks, child.log)


# -- which processes still run ------------------------------------------------------------------------------
def test_an_exited_child_counts_as_exited_even_as_a_zombie(tmp_path: Path, children: list[Any]) -> None:
    child = _spawn(
        children, "agent:h9", [sys.executable, "-c", "print('boom'); raise SystemExit(3)"], tmp_path / "a.log"
    )
    _wait_state(child.pid, "Z")
    os.kill(child.pid, 0)  # a zombie still answers signal 0: not a liveness test
    assert _as_read_back(child).state() == "exited"
    with pytest.raises(rehearsal.RehearsalError) as failed:
        rehearsal.check_running([child])  # the Popen the spawning `up` holds
    assert str(failed.value) == f"agent:h9 exited (exit status 3); see {tmp_path / 'a.log'}: boom"


def test_stop_signals_only_the_process_it_started(tmp_path: Path, children: list[Any]) -> None:
    child = _spawn(children, "switch", ["sleep", "60"], tmp_path / "s.log")
    read_back = _as_read_back(child)
    assert read_back.state() == "running"
    # The pid now belongs to another process (another start time), or nothing was recorded to tell: left alone.
    for ticks in (child.start_ticks + 1, None):
        impostor = rehearsal.Child("switch", child.pid, ticks, child.log)
        assert impostor.state() == "not ours"
        note = rehearsal.stop(impostor, grace_s=1.0)
        assert note is not None and "left alone" in note and f"pid {child.pid}" in note
        assert child.proc.poll() is None
    # Confirmed: stopped (here a zombie of this test until reaped, which `stop` must take as gone).
    assert rehearsal.stop(read_back, grace_s=5.0) is None
    _wait_state(child.pid, "Z")
    assert child.proc.wait(timeout=5) == -15  # SIGTERM


# -- agents online ------------------------------------------------------------------------------------------
@pytest.fixture(autouse=True)
def _broker_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rehearsal inventory's per-host broker identities (decision 0067): every secret set."""
    for name in ("CONTROLLER", "H1", "H2", "H3", "H4"):
        monkeypatch.setenv(f"LABCTL_REHEARSAL_MQTT_{name}", f"rehearsal-{name.lower()}-secret")


def _rehearsal_copy(tmp_path: Path, lab: str, broker_port: int, switch_port: int) -> Path:
    path = tmp_path / f"{lab}.yaml"
    path.write_text(
        INVENTORY.read_text()
        .replace("lab: opus-testbed-rehearsal", f"lab: {lab}")
        .replace("mqtt://127.0.0.1:11883", f"mqtt://127.0.0.1:{broker_port}")
        .replace("port: 13082", f"port: {switch_port}")
        .replace("port: 15025", f"port: {_free_port()}")  # its power meters
        .replace("port: 15026", f"port: {_free_port()}")
    )
    return path


def test_waiting_for_agents_names_the_silent_one_and_the_one_that_exited(
    tmp_path: Path, children: list[Any]
) -> None:
    """A real broker and a real agent for h1 (in this namespace: it only has to say online); h2's "agent"
    never connects, then exits with a message: each is named, with its log."""
    require(shutil.which("mosquitto") is not None, "needs mosquitto")
    port = _free_port()
    inventory = _rehearsal_copy(tmp_path, f"wait-agents-{os.getpid()}", port, _free_port())
    two_hosts = tmp_path / "two.yaml"  # h1 and h2 only (and no power meters: their channels tap h3, h4)
    lab = yaml.safe_load(inventory.read_text())
    lab["hosts"] = {h: spec for h, spec in lab["hosts"].items() if h in ("h1", "h2")}
    lab.pop("power_meters", None)
    two_hosts.write_text(yaml.safe_dump(lab, sort_keys=False))
    conf = tmp_path / "mosquitto.conf"
    conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n")
    broker = _spawn(children, "mosquitto", ["mosquitto", "-c", str(conf)], tmp_path / "mosquitto.log")
    rehearsal.wait_for_port("127.0.0.1", port, broker)
    agent_cmd = [*rehearsal.LABCTL, "agent", "--host", "h1", "-i", str(two_hosts)]
    h1 = _spawn(children, "agent:h1", agent_cmd, tmp_path / "agent-h1.log")
    # h1 online: waiting for it alone returns as soon as it says so (its status is retained from then on).
    started = time.monotonic()
    rehearsal.wait_agents_online(two_hosts, {"h1": h1}, [broker], 30.0)
    assert time.monotonic() - started < 25

    silent = _spawn(children, "agent:h2", ["sleep", "60"], tmp_path / "agent-h2.log")
    with pytest.raises(rehearsal.RehearsalError) as failed:
        rehearsal.wait_agents_online(two_hosts, {"h1": h1, "h2": silent}, [broker], 2.0)
    message = str(failed.value)
    assert message == f"agent:h2 is not online on the broker after 2 s; see {tmp_path / 'agent-h2.log'}"

    code = "import sys, time; time.sleep(1); sys.exit('agent h2: cannot reach the broker')"
    dying = _spawn(children, "agent:h2", [sys.executable, "-c", code], tmp_path / "agent-h2b.log")
    started = time.monotonic()
    with pytest.raises(rehearsal.RehearsalError) as failed:
        rehearsal.wait_agents_online(two_hosts, {"h1": h1, "h2": dying}, [broker], 30.0)
    assert time.monotonic() - started < 15  # at its exit, not at the timeout
    assert str(failed.value) == (
        f"agent:h2 exited (exit status 1); see {tmp_path / 'agent-h2b.log'}: agent h2: cannot reach the broker"
    )


# -- the script as the user runs it -------------------------------------------------------------------------
@pytest.fixture
def own_rehearsal_inventory(tmp_path: Path) -> Iterator[Path]:
    """A copy of the rehearsal inventory with its own lab name (its own fabric, state file, management
    block) and free ports, so it never meets a rehearsal already up on this machine; everything it may leave
    (fabric, state file) is removed afterwards."""
    require(os.geteuid() == 0, "the rehearsal needs root")
    require(
        shutil.which("ip") is not None and shutil.which("mosquitto") is not None, "needs iproute2, mosquitto"
    )
    in_use = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True, check=True).stdout
    for n in range(100):
        path = _rehearsal_copy(tmp_path, f"rehearsal-test-{os.getpid()}-{n}", _free_port(), _free_port())
        inv = load_inventory(path)
        block = FabricLayout.of(inv, managed_prefix(inv)).management_block
        if f" {str(block)[: -len('.0/24')]}." not in in_use:
            break
    prefix = managed_prefix(inv)
    state = rehearsal.state_path(inv.lab)
    try:
        yield path
    finally:
        state.unlink(missing_ok=True)
        leftover = netns.cleanup(prefix)
        shutil.rmtree(rehearsal.STATE_DIR / f"rehearsal-{inv.lab}", ignore_errors=True)
    assert not leftover, f"left namespaces behind: {leftover}"


def _script(action: str, inventory: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != "LABCTL_REHEARSAL_PASSWORD"} | env
    return subprocess.run(
        [sys.executable, str(SCRIPT), action, "-i", str(inventory)],
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_down_and_status_need_no_password_and_spare_a_reused_pid(
    own_rehearsal_inventory: Path, children: list[Any], tmp_path: Path
) -> None:
    inventory = own_rehearsal_inventory
    lab = load_inventory(inventory).lab
    fabric = subprocess.run(
        [*rehearsal.LABCTL, "emulate", "fabric", "up", "-i", str(inventory), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert fabric.returncode == 0, fabric.stderr
    prefix = json.loads(fabric.stdout)["prefix"]
    ours = _spawn(children, "agent:h1", ["sleep", "60"], tmp_path / "agent-h1.log")
    stranger = _spawn(children, "agent:h2", ["sleep", "60"], tmp_path / "agent-h2.log")
    state = rehearsal.state_path(lab)
    # As `up` writes it; agent:h2's pid has since gone to another process (another start time).
    state.write_text(
        json.dumps(
            {
                "inventory": str(inventory),
                "logs": str(tmp_path),
                "pids": {"agent:h1": ours.pid, "agent:h2": stranger.pid},
                "start_ticks": {"agent:h1": ours.start_ticks, "agent:h2": stranger.start_ticks + 7},
            }
        )
    )
    status = _script("status", inventory)  # no LABCTL_REHEARSAL_PASSWORD
    assert status.returncode == 0, status.stderr
    assert status.stdout.split("\n")[:2] == [
        f"agent:h1       pid {ours.pid:<8} running",
        f"agent:h2       pid {stranger.pid:<8} not ours",
    ]

    down = _script("down", inventory)
    assert down.returncode == 0, down.stderr
    assert down.stdout == f"rehearsal of {lab} down\n"
    assert f"agent:h2: pid {stranger.pid} is not the process the rehearsal started" in down.stderr
    assert ours.proc.wait(timeout=5) == -15
    assert stranger.proc.poll() is None
    assert netns.list_netns(prefix) == [] and not state.exists()
    assert _script("status", inventory).stdout == f"no rehearsal of {lab} is up\n"


def test_up_waits_for_every_agent_and_takes_all_down_when_one_is_not_online(
    own_rehearsal_inventory: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`up` in this process, its agents' online probe answering that h3 never came online: it fails naming
    agent:h3 and its log, and leaves nothing up (processes, namespaces, state file)."""
    inventory = own_rehearsal_inventory
    inv = load_inventory(inventory)
    monkeypatch.setenv("LABCTL_REHEARSAL_PASSWORD", "rehearsal-test")
    answer = {host: host != "h3" for host in inv.hosts}
    monkeypatch.setattr(rehearsal, "AGENTS_ONLINE", f"print({json.dumps(json.dumps(answer))})")
    kids_before = _children()
    with pytest.raises(rehearsal.RehearsalError) as failed:
        rehearsal.up(inventory, 5.0)
    log = rehearsal.STATE_DIR / f"rehearsal-{inv.lab}" / "agent-h3.log"
    assert str(failed.value).startswith(f"agent:h3 is not online on the broker after 5 s; see {log}")
    assert _children() == kids_before, "up left processes behind"
    assert netns.list_netns(managed_prefix(inv)) == []
    assert not rehearsal.state_path(inv.lab).exists()
