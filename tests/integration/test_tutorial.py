"""The tutorial (docs/tutorial/) end to end, as a reader types it: every command of its shell blocks, page
after page, in one bash, in a home directory of its own.

The pages' `sh` blocks are run in order as one script (`set -euo pipefail`), so a command that fails, or a
page that no longer leads to the next one, fails the test, which names the page and line it stopped at.
What differs from a reader's machine: the install (`python3 -m pip install ...`) is left out, as labctl is
installed in the environment the suite runs in, and `labctl` is this interpreter's; HOME is a temporary
directory (the tutorial's `~/labctl-tutorial` and the queue's default file land there); the broker's port
1883 becomes a free one, so that a mosquitto already on this machine is left alone. The background jobs the
tutorial starts (mosquitto, four agents) are killed when the script ends, however it ends.

Runs: a first run, two in the own lab, one through the agents, two from the queue, all on the fast profile
(about 1.5 min on two idle cores).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from labctl.testing.support import require

REPO = Path(__file__).resolve().parents[2]
TUTORIAL = REPO / "docs" / "tutorial"
PAGES = ("first-run.md", "own-lab.md", "agents.md", "campaign.md")
FENCE = re.compile(r"^\s*```(\w*)\s*$")
NOT_RUN = ("python3 -m pip install",)  # labctl is installed in the environment the suite runs in
BROKER_PORT = "1883"

# Four agent processes sample at 1 kHz beside the controller: kept off the workers that run the agents
# tests' timing comparisons at the same time, as those tests keep off each other.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("agents"), pytest.mark.timeout(600)]


def shell_commands(page: Path) -> list[tuple[int, str]]:
    """(line, command) of each command in the page's `sh` blocks, a trailing `\\` joining lines."""
    lines = page.read_text(encoding="utf-8").splitlines()
    commands: list[tuple[int, str]] = []
    language: str | None = None
    pending: tuple[int, str] | None = None
    for n, line in enumerate(lines, start=1):
        fence = FENCE.match(line)
        if fence is not None:
            language = (fence.group(1) or "text") if language is None else None
            continue
        if language != "sh" or not line.strip():
            continue
        # a trailing backslash continues the command on the next line
        pending = (n, line.strip()) if pending is None else (pending[0], pending[1][:-1] + line.strip())
        if not pending[1].endswith("\\"):
            commands.append(pending)
            pending = None
    assert language is None, f"{page.name}: a code block is not closed"
    return commands


def tutorial_script(port: int) -> str:
    """The tutorial's commands as one bash script, each preceded by a marker naming its page and line."""
    script = ["set -euo pipefail", "trap 'kill $(jobs -p) 2>/dev/null || true; wait' EXIT"]
    for name in PAGES:
        for line, command in shell_commands(TUTORIAL / name):
            if command.startswith(NOT_RUN):
                continue
            script += [f"echo '@@ tutorial/{name}:{line}' >&2", command.replace(BROKER_PORT, str(port))]
    return "\n".join(script) + "\n"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_every_tutorial_page_has_commands_and_the_broker_port_is_the_one_replaced() -> None:
    for name in PAGES:
        assert shell_commands(TUTORIAL / name), f"docs/tutorial/{name} shows no command"
    agents = " ".join(command for _, command in shell_commands(TUTORIAL / "agents.md"))
    assert agents.count(BROKER_PORT) == 2, "the broker's port, in mosquitto.conf and in the inventory"


def test_the_tutorial_runs_end_to_end(tmp_path: Path) -> None:
    require(shutil.which("mosquitto") is not None, "mosquitto is not installed (apt-get install mosquitto)")
    home = tmp_path / "home"
    home.mkdir()
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("XDG_", "LABCTL_QUEUE_DB", "LABCTL_MPLSTYLE"))
    }
    env.update(
        HOME=str(home),
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        MPLCONFIGDIR=str(tmp_path / "matplotlib"),
        COLUMNS="200",
        NO_COLOR="1",
        TERM="dumb",
    )
    script = tmp_path / "tutorial.sh"
    script.write_text(tutorial_script(free_port()), encoding="utf-8")
    done = subprocess.run(
        ["bash", str(script)], cwd=home, env=env, capture_output=True, text=True, timeout=540
    )
    markers = re.findall(r"^@@ (\S+)$", done.stderr, flags=re.MULTILINE)
    assert done.returncode == 0, (
        f"the tutorial stopped at {markers[-1] if markers else 'its start'} (exit {done.returncode}):\n"
        f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
    assert "Traceback" not in done.stderr, done.stderr[-3000:]

    first = home / "labctl-tutorial" / "runs"
    mylab = home / "labctl-tutorial" / "mylab" / "runs"
    statuses = {
        where: [json.loads(meta.read_text())["status"] for meta in sorted(where.glob("*/run.json"))]
        for where in (first, mylab)
    }
    # step 1: one run; steps 2-4 in the lab: two, one through the agents, two from the queue
    assert statuses == {first: ["completed"], mylab: ["completed"] * 5}, statuses
    assert "agent clocks (offset" in done.stdout, "the agents run printed no clock table"
    assert "quick-nic" in done.stdout and "nightly" in done.stdout, "the queue and history show the runs"
