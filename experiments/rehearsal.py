#!/usr/bin/env python3
"""Bring a rehearsal of a real lab up on this machine, or down again (root, Linux).

    sudo -E python3 experiments/rehearsal.py up   [-i experiments/inventories/rehearsal.yaml]
    sudo -E python3 experiments/rehearsal.py down [-i ...]
    sudo -E python3 experiments/rehearsal.py status

`up` starts, each only through the labctl command line: the kernel fabric with a management link per
host (`labctl emulate fabric up`), mosquitto listening on 127.0.0.1 and on each host's management link,
the switch (`labctl emulate ocs <driver> --fabric`, its own process, at the inventory's address), and one
`labctl agent` per host inside that host's network namespace, reaching the broker over its management
link. It waits until each is ready and writes what it started to /run/labctl/rehearsal-<lab>.json; `down`
stops all of it and removes the fabric, whatever state `up` left. The inventory is of the real lab kind:
`labctl run EXPERIMENT -i INVENTORY` then runs against it exactly as against hardware.

Needs: root, iproute2, mosquitto, the switch password in the environment variable the inventory's
switch names (e.g. LABCTL_REHEARSAL_PASSWORD). Logs: /run/labctl/rehearsal-<lab>/.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

REPO = Path(__file__).resolve().parent.parent
DEFAULT_INVENTORY = REPO / "experiments" / "inventories" / "rehearsal.yaml"
STATE_DIR = Path("/run/labctl")
LABCTL = [sys.executable, "-m", "labctl.cli"]


class RehearsalError(Exception):
    """One line for the user; the script exits 1."""


def labctl(*args: str) -> subprocess.CompletedProcess[str]:
    out = subprocess.run([*LABCTL, *args], capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise RehearsalError(f"labctl {' '.join(args)}: {out.stderr.strip() or out.stdout.strip()}")
    return out


def inventory_facts(inventory: Path) -> dict[str, object]:
    """What the script needs from the inventory, read through labctl itself (one validation, one truth)."""
    code = (
        "import json, sys\n"
        "from labctl.labs import load\n"
        "inv = load(sys.argv[1])\n"
        "[(name, sw)] = inv.switches.items()\n"
        "print(json.dumps({'lab': inv.lab, 'switch': name, 'driver': sw.driver, 'address': sw.address,\n"
        "  'port': sw.port, 'user': sw.user, 'password_env': sw.password.env_name if sw.password else None,\n"
        "  'broker': inv.model.broker.url if inv.model.broker else None, 'hosts': inv.hosts}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code, str(inventory)], capture_output=True, text=True)
    if out.returncode != 0:
        raise RehearsalError(out.stderr.strip().splitlines()[-1] if out.stderr.strip() else "inventory")
    facts: dict[str, object] = json.loads(out.stdout)
    return facts


def wait_for_port(host: str, port: int, what: str, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise RehearsalError(f"{what} is not listening on {host}:{port} after {timeout_s:g} s")


def port_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def spawn(cmd: list[str], log: Path, env: dict[str, str] | None = None) -> int:
    """A process that outlives this script (its own session), output to `log`; returns its pid."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    return proc.pid


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_pid(pid: int, grace_s: float = 10.0) -> None:
    """SIGTERM (agents and the emulator close cleanly on it), then SIGKILL after `grace_s`."""
    if not alive(pid):
        return
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
    if alive(pid):
        os.killpg(pid, signal.SIGKILL)


def state_path(lab: str) -> Path:
    return STATE_DIR / f"rehearsal-{lab}.json"


def up(inventory: Path) -> None:
    if os.geteuid() != 0:
        raise RehearsalError("the rehearsal needs root (network namespaces, veth, tc)")
    if shutil.which("mosquitto") is None:
        raise RehearsalError("mosquitto is not installed (apt-get install mosquitto)")
    facts = inventory_facts(inventory)
    lab, state = str(facts["lab"]), state_path(str(facts["lab"]))
    if state.exists():
        raise RehearsalError(f"a rehearsal of {lab} is already up ({state}); run `down` first")
    password_env = facts["password_env"]
    if password_env is None or not os.environ.get(str(password_env)):
        raise RehearsalError(f"set {password_env or 'a password variable'} to the switch password")
    broker = urlsplit(str(facts["broker"]))
    broker_port = broker.port or 1883
    switch_host, switch_port = str(facts["address"]), int(facts["port"] or 3082)
    for host, port, what in (
        (broker.hostname or "", broker_port, "the broker"),
        (switch_host, switch_port, "the switch"),
    ):
        if not port_free(host, port):
            raise RehearsalError(f"{host}:{port} ({what}) is already in use")
    logs = STATE_DIR / f"rehearsal-{lab}"
    logs.mkdir(parents=True, exist_ok=True)
    started: dict[str, object] = {"inventory": str(inventory), "pids": {}, "logs": str(logs)}
    pids: dict[str, int] = started["pids"]  # type: ignore[assignment]
    state.write_text(json.dumps(started))  # from here on, `down` can undo whatever got started
    try:
        fabric = json.loads(labctl("emulate", "fabric", "up", "-i", str(inventory), "--json").stdout)
        listeners = [broker.hostname or "127.0.0.1"]
        listeners += [h["management"]["controller_ip"] for h in fabric["hosts"].values()]
        conf = logs / "mosquitto.conf"
        conf.write_text(
            "".join(f"listener {broker_port} {ip}\n" for ip in listeners)
            + "allow_anonymous true\npersistence false\nset_tcp_nodelay true\n"
        )
        pids["mosquitto"] = spawn(["mosquitto", "-c", str(conf)], logs / "mosquitto.log")
        state.write_text(json.dumps(started))
        wait_for_port(broker.hostname or "127.0.0.1", broker_port, "mosquitto")
        switch_cmd = [
            *LABCTL,
            "emulate",
            "ocs",
            str(facts["driver"]),
            "--fabric",
            "-i",
            str(inventory),
            "--host",
            switch_host,
            "--port",
            str(switch_port),
            "--user",
            str(facts["user"]),
            "--password-env",
            str(password_env),
        ]
        pids["switch"] = spawn(switch_cmd, logs / "switch.log")
        state.write_text(json.dumps(started))
        wait_for_port(switch_host, switch_port, "the switch emulator")
        for host, info in fabric["hosts"].items():
            url = f"mqtt://{info['management']['controller_ip']}:{broker_port}"
            cmd = [
                "ip",
                "netns",
                "exec",
                info["netns"],
                *LABCTL,
                "agent",
                "--host",
                host,
                "-i",
                str(inventory),
                "--broker",
                url,
            ]
            pids[f"agent:{host}"] = spawn(cmd, logs / f"agent-{host}.log")
            state.write_text(json.dumps(started))
        time.sleep(0.5)
        dead = [name for name, pid in pids.items() if not alive(pid)]
        if dead:
            raise RehearsalError(f"{', '.join(dead)} exited at once; see {logs}")
    except BaseException:
        down(inventory)
        raise
    print(
        f"rehearsal of {lab} up: fabric {fabric['prefix']}, broker {broker.hostname}:{broker_port}, "
        f"switch {switch_host}:{switch_port}, {len(fabric['hosts'])} agents; logs in {logs}"
    )


def down(inventory: Path) -> None:
    facts = inventory_facts(inventory)
    state = state_path(str(facts["lab"]))
    started = json.loads(state.read_text()) if state.exists() else {"pids": {}}
    # Agents first (they say offline), then the switch (it darkens the fabric), then the broker.
    order = sorted(
        started["pids"].items(), key=lambda kv: (not kv[0].startswith("agent:"), kv[0] != "switch")
    )
    for _name, pid in order:
        stop_pid(int(pid))
    labctl("emulate", "fabric", "down", "-i", str(inventory))
    state.unlink(missing_ok=True)
    print(f"rehearsal of {facts['lab']} down")


def status(inventory: Path) -> None:
    facts = inventory_facts(inventory)
    state = state_path(str(facts["lab"]))
    if not state.exists():
        print(f"no rehearsal of {facts['lab']} is up")
        return
    for name, pid in json.loads(state.read_text())["pids"].items():
        print(f"{name:<14} pid {pid:<8} {'running' if alive(int(pid)) else 'GONE'}")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("action", choices=("up", "down", "status"))
    parser.add_argument(
        "-i", "--inventory", type=Path, default=DEFAULT_INVENTORY, help="a real-kind inventory"
    )
    args = parser.parse_args()
    try:
        {"up": up, "down": down, "status": status}[args.action](args.inventory)
    except RehearsalError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
