#!/usr/bin/env python3
"""Bring a rehearsal of a real lab up on this machine, or down again (root, Linux).

    sudo -E python3 experiments/rehearsal.py up   [-i experiments/inventories/rehearsal.yaml]
    sudo -E python3 experiments/rehearsal.py down [-i ...]
    sudo -E python3 experiments/rehearsal.py status

`up` starts, each only through the labctl command line: the kernel fabric with a management link per
host (`labctl emulate fabric up`), mosquitto listening on 127.0.0.1 and on each host's management link,
the switch (`labctl emulate ocs <driver> --fabric`, its own process, at the inventory's address), each
power meter of the inventory (`labctl emulate power-meter --meter NAME`, its own process at the meter's
address, its channels tapping the fabric's receive fibers: the light the switch's cross-connects carry, read
from the kernel), and one `labctl agent` per host inside that host's network namespace, reaching the broker
over its management link. It waits until each is ready (the broker, the switch and the meters listening,
every agent online on the broker), fails naming whichever exited or stayed silent and its log, and writes
what it started (pids and their start times) to /run/labctl/rehearsal-<lab>.json. `down` stops all of it,
signalling only processes confirmed to be the ones it started, and removes the fabric, whatever state `up`
left. The inventory is of the real lab kind: `labctl run EXPERIMENT -i INVENTORY` then runs against it
exactly as against hardware.

Needs: root, iproute2, mosquitto; for `up`, the switch password in the environment variable the
inventory's switch names (e.g. LABCTL_REHEARSAL_PASSWORD): `down` and `status` need no secret.
Logs: /run/labctl/rehearsal-<lab>/.
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any
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


# Read through labctl itself (one validation, one truth), without resolving secrets: `down` and `status`
# must work without the switch password in the environment (`up` checks that it is there).
FACTS = """
import json, sys
from labctl.inventory.schema import load_inventory
from labctl.labs import check
from labctl.agents.broker import CONTROLLER, secret_env
inv = load_inventory(sys.argv[1])
check(inv, secrets=False)
[(name, sw)] = inv.switches.items()
ids = inv.model.broker.identities if inv.model.broker else None
secrets = {n: secret_env(ids, n) for n in (CONTROLLER, *inv.hosts)} if ids else {}
print(json.dumps({'lab': inv.lab, 'switch': name, 'driver': sw.driver, 'address': sw.address,
  'secrets': secrets, 'port': sw.port, 'user': sw.user,
  'password_env': sw.password.env_name if sw.password else None,
  'broker': inv.model.broker.url if inv.model.broker else None, 'hosts': inv.hosts,
  'meters': {n: [m.address, m.port] for n, m in inv.model.power_meters.items()}}))
"""

# Each agent says `online` on its retained status topic once it is connected; the controller's own hub
# (what `labctl lab check` and runs use) tells which ones did. Prints {host: true|false} for the hosts
# named when all are online or the timeout is up; exits 1 with one line if the broker cannot be reached.
AGENTS_ONLINE = """
import asyncio, json, sys
from labctl.agents.broker import BrokerSettings
from labctl.agents.hub import AgentHub
from labctl.core.errors import LabctlError
from labctl.inventory.schema import load_inventory
inv, timeout_s, hosts = load_inventory(sys.argv[1]), float(sys.argv[2]), sys.argv[3:]

async def main():
    hub = AgentHub(inv, BrokerSettings.from_inventory(inv))
    try:
        await hub.start(timeout_s)
    except LabctlError as e:
        sys.exit(str(e))
    async def one(host):
        try:
            await hub.wait_online(host, timeout_s)
            return True
        except LabctlError:
            return False
    try:
        online = await asyncio.gather(*(one(h) for h in hosts))
    finally:
        await hub.stop()
    print(json.dumps(dict(zip(hosts, online))))

asyncio.run(main())
"""
AGENT_ONLINE_TIMEOUT_S = 30.0


def inventory_facts(inventory: Path) -> dict[str, object]:
    """What the script needs from the inventory (no secret is read)."""
    out = subprocess.run([sys.executable, "-c", FACTS, str(inventory)], capture_output=True, text=True)
    if out.returncode != 0:
        raise RehearsalError(out.stderr.strip().splitlines()[-1] if out.stderr.strip() else "inventory")
    facts: dict[str, object] = json.loads(out.stdout)
    return facts


def mosquitto_user() -> tuple[int, int] | None:
    """(uid, gid) of the user mosquitto drops root for, where it exists."""
    import pwd

    try:
        entry = pwd.getpwnam("mosquitto")
    except KeyError:
        return None
    return entry.pw_uid, entry.pw_gid


def port_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


# -- the processes the rehearsal starts --------------------------------------------------------------------
def proc_stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start time in clock ticks since boot) of a pid, or None if there is no such pid."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            # The command name (field 2) may hold spaces and parentheses: split after its last ')'.
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0], int(fields[19])  # fields 3 (state) and 22 (starttime) of proc(5)


@dataclass
class Child:
    """A process the rehearsal started: its pid and start time (the pid alone may be reused by an unrelated
    process once ours is gone), its log, and, in the `up` that spawned it, its Popen."""

    name: str
    pid: int
    start_ticks: int | None
    log: Path
    proc: subprocess.Popen[bytes] | None = None

    def state(self) -> str:
        """Whether it runs: `running`; `exited` (gone, or a zombie not yet reaped: it runs nothing); or
        `not ours` (the pid now belongs to another process, or no start time was recorded to tell)."""
        if self.proc is not None:  # our own child: poll() reaps it, and its pid cannot be reused before
            return "running" if self.proc.poll() is None else "exited"
        stat = proc_stat(self.pid)
        if stat is None or stat[0] in ("Z", "X"):
            return "exited"
        if self.start_ticks is None or stat[1] != self.start_ticks:
            return "not ours"
        return "running"

    def exit_note(self) -> str:
        code = self.proc.poll() if self.proc is not None else None
        return f" (exit status {code})" if code is not None else ""


def spawn(name: str, cmd: list[str], log: Path, env: dict[str, str] | None = None) -> Child:
    """A process that outlives this script (its own session: `down` signals its group), output to `log`."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    stat = proc_stat(proc.pid)  # the child exists from fork on, even before it execs
    return Child(name, proc.pid, stat[1] if stat is not None else None, log, proc)


def stop(child: Child, grace_s: float = 10.0) -> str | None:
    """SIGTERM to the child's process group (agents and the emulator close cleanly on it), SIGKILL after
    `grace_s`; only once it is confirmed to be the process we started. A note if it was left alone."""
    if child.state() == "not ours":
        why = "its start time differs" if child.start_ticks is not None else "no start time was recorded"
        return f"{child.name}: pid {child.pid} is not the process the rehearsal started ({why}); left alone"
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if child.state() != "running":
            break
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, sig)
        deadline = time.monotonic() + grace_s
        while child.state() == "running" and time.monotonic() < deadline:
            time.sleep(0.05)
    if child.proc is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.proc.wait(timeout=1.0)
    return None


def last_line(log: Path) -> str:
    try:
        lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    return f": {lines[-1].strip()}" if lines else ""


def check_running(children: list[Child]) -> None:
    """Fail at once, naming it and its log, if any child has exited."""
    for child in children:
        if child.state() != "running":
            raise RehearsalError(
                f"{child.name} exited{child.exit_note()}; see {child.log}{last_line(child.log)}"
            )


def wait_for_port(host: str, port: int, child: Child, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        check_running([child])
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise RehearsalError(
        f"{child.name} is not listening on {host}:{port} after {timeout_s:g} s; see {child.log}"
    )


def wait_agents_online(
    inventory: Path, agents: dict[str, Child], others: list[Child], timeout_s: float
) -> None:
    """Until every agent says online on the broker. An agent (or the broker, the switch) that exits
    meanwhile fails at once; one still silent at the timeout is named with its log."""
    probe = subprocess.Popen(
        [sys.executable, "-c", AGENTS_ONLINE, str(inventory), str(timeout_s), *agents],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        while probe.poll() is None:
            check_running([*agents.values(), *others])
            time.sleep(0.1)
        stdout, stderr = probe.communicate()
    finally:
        if probe.poll() is None:
            probe.kill()
            probe.communicate()
    if probe.returncode != 0:
        detail = stderr.strip().splitlines()[-1] if stderr.strip() else f"exit status {probe.returncode}"
        raise RehearsalError(f"cannot tell whether the agents are online: {detail}")
    online: dict[str, bool] = json.loads(stdout)
    silent = [agents[host] for host, ok in online.items() if not ok and host in agents]
    check_running([*agents.values(), *others])  # an exit explains a silence better than the timeout does
    if silent:
        raise RehearsalError(
            "; ".join(
                f"{c.name} is not online on the broker after {timeout_s:g} s; see {c.log}{last_line(c.log)}"
                for c in silent
            )
        )


# -- up, down, status -------------------------------------------------------------------------------------
def state_path(lab: str) -> Path:
    return STATE_DIR / f"rehearsal-{lab}.json"


def write_state(state: Path, inventory: Path, logs: Path, children: dict[str, Child]) -> None:
    """What `down` needs to undo it all; rewritten after each start, so a crash midway leaves it accurate."""
    started = {
        "inventory": str(inventory),
        "logs": str(logs),
        "pids": {name: c.pid for name, c in children.items()},
        "start_ticks": {name: c.start_ticks for name, c in children.items()},
    }
    state.write_text(json.dumps(started))


def read_state(state: Path) -> dict[str, Child]:
    started = json.loads(state.read_text())
    logs = Path(started.get("logs", STATE_DIR))
    ticks = started.get("start_ticks", {})  # absent in a state file of an older script: nothing confirmed
    return {
        name: Child(name, int(pid), ticks.get(name), logs / f"{name.replace(':', '-')}.log")
        for name, pid in started["pids"].items()
    }


def up(inventory: Path, agent_timeout_s: float = AGENT_ONLINE_TIMEOUT_S) -> None:
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
    # Per-host broker identities (decision 0067): a secret per agent and one for the controller.
    identity_env: dict[str, str] = dict(facts.get("secrets") or {})  # type: ignore[call-overload]
    missing = [env for env in identity_env.values() if not os.environ.get(env)]
    if missing:
        raise RehearsalError(
            f"set the broker secrets {', '.join(missing)} "
            f"(e.g. `export {missing[0]}=$(openssl rand -hex 16)` for each)"
        )
    broker = urlsplit(str(facts["broker"]))
    broker_port = broker.port or 1883
    switch_host, switch_port = str(facts["address"]), int(str(facts["port"] or 3082))
    meters: dict[str, Any] = json.loads(json.dumps(facts.get("meters") or {}))
    for host, port, what in (
        (broker.hostname or "", broker_port, "the broker"),
        (switch_host, switch_port, "the switch"),
        *((str(address), int(str(port)), f"power meter {name}") for name, (address, port) in meters.items()),
    ):
        if not port_free(host, port):
            raise RehearsalError(f"{host}:{port} ({what}) is already in use")
    logs = STATE_DIR / f"rehearsal-{lab}"
    logs.mkdir(parents=True, exist_ok=True)
    children: dict[str, Child] = {}
    write_state(state, inventory, logs, children)  # from here on, `down` can undo whatever got started

    def start(name: str, cmd: list[str], env: dict[str, str] | None = None) -> Child:
        child = children[name] = spawn(name, cmd, logs / f"{name.replace(':', '-')}.log", env)
        write_state(state, inventory, logs, children)
        return child

    try:
        fabric = json.loads(labctl("emulate", "fabric", "up", "-i", str(inventory), "--json").stdout)
        bare = [host for host, info in fabric["hosts"].items() if info["management"] is None]
        if bare:
            raise RehearsalError(
                f"fabric {fabric['prefix']} is up without management links for {', '.join(bare)}; "
                f"bring it down (`labctl emulate fabric down -i {inventory}`) and run `up` again"
            )
        listeners = [broker.hostname or "127.0.0.1"]
        listeners += [h["management"]["controller_ip"] for h in fabric["hosts"].values()]
        if identity_env:
            # Users, passwords and ACL from the inventory, as a lab's broker gets them.
            conf_dir = logs / "broker"
            listen = [arg for ip in listeners for arg in ("--listen", f"{ip}:{broker_port}")]
            labctl("lab", "broker-config", "-i", str(inventory), "--out", str(conf_dir), *listen)
            conf = conf_dir / "mosquitto.conf"
            conf.write_text(conf.read_text() + "persistence false\n")
            owner = mosquitto_user()
            for path in (conf_dir, conf_dir / "passwd", conf_dir / "acl"):
                if owner is not None:  # mosquitto reads them after dropping root for its own user
                    os.chown(path, *owner)
        else:
            conf = logs / "mosquitto.conf"
            conf.write_text(
                "".join(f"listener {broker_port} {ip}\n" for ip in listeners)
                + "allow_anonymous true\npersistence false\nset_tcp_nodelay true\n"
            )
        mosquitto = start("mosquitto", ["mosquitto", "-c", str(conf)])
        wait_for_port(broker.hostname or "127.0.0.1", broker_port, mosquitto)
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
        switch = start("switch", switch_cmd)
        wait_for_port(switch_host, switch_port, switch)
        others = [mosquitto, switch]
        for name, (address, port) in meters.items():
            meter_cmd = [*LABCTL, "emulate", "power-meter", "-i", str(inventory), "--meter", name]
            others.append(start(f"meter:{name}", meter_cmd))
            wait_for_port(str(address), int(str(port)), others[-1])
        agents = {}
        for host, info in fabric["hosts"].items():
            url = f"mqtt://{info['management']['controller_ip']}:{broker_port}"
            netns_exec = ["ip", "netns", "exec", info["netns"]]
            agent_cmd = [*netns_exec, *LABCTL, "agent", "--host", host, "-i", str(inventory), "--broker", url]
            # Each agent holds its own broker secret only, as on its own host.
            not_its_own = {env for name, env in identity_env.items() if name != host}
            env = {k: v for k, v in os.environ.items() if k not in not_its_own}
            agents[host] = start(f"agent:{host}", agent_cmd, env)
        wait_agents_online(inventory, agents, others, agent_timeout_s)
    except BaseException:
        take_down(inventory, facts, children)
        raise
    at = "".join(f", power meter {name} {address}:{port}" for name, (address, port) in meters.items())
    print(
        f"rehearsal of {lab} up: fabric {fabric['prefix']}, broker {broker.hostname}:{broker_port}, "
        f"switch {switch_host}:{switch_port}{at}, {len(agents)} agents online; logs in {logs}"
    )


def take_down(inventory: Path, facts: dict[str, object], children: dict[str, Child]) -> None:
    # Agents first (they say offline), then the switch (it darkens the fabric), then the meters and broker.
    order = sorted(children.values(), key=lambda c: (not c.name.startswith("agent:"), c.name != "switch"))
    for child in order:
        note = stop(child)
        if note is not None:
            print(f"warning: {note}", file=sys.stderr)
    labctl("emulate", "fabric", "down", "-i", str(inventory))
    state_path(str(facts["lab"])).unlink(missing_ok=True)


def down(inventory: Path) -> None:
    facts = inventory_facts(inventory)
    state = state_path(str(facts["lab"]))
    take_down(inventory, facts, read_state(state) if state.exists() else {})
    print(f"rehearsal of {facts['lab']} down")


def status(inventory: Path) -> None:
    facts = inventory_facts(inventory)
    state = state_path(str(facts["lab"]))
    if not state.exists():
        print(f"no rehearsal of {facts['lab']} is up")
        return
    for name, child in read_state(state).items():
        print(f"{name:<14} pid {child.pid:<8} {child.state()}")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("action", choices=("up", "down", "status"))
    parser.add_argument(
        "-i", "--inventory", type=Path, default=DEFAULT_INVENTORY, help="a real-kind inventory"
    )
    parser.add_argument(
        "--agent-timeout",
        type=float,
        default=AGENT_ONLINE_TIMEOUT_S,
        metavar="SECONDS",
        help="`up`: how long every agent has to come online on the broker",
    )
    args = parser.parse_args()
    try:
        if args.action == "up":
            up(args.inventory, args.agent_timeout)
        else:
            {"down": down, "status": status}[args.action](args.inventory)
    except RehearsalError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
