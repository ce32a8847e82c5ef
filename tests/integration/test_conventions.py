"""tests/unit/test_conventions.py through real processes: `python -m labctl`, a completion request to the
installed script, and the services' JSON log lines from a real `labctl agent` (against the session's
mosquitto) and a real `labctl serve` running a queued run."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from labctl.testing.mosquitto import Mosquitto
from tests.helpers import scheduler as scheduler_helpers
from tests.helpers.agents import broker_section, write_lab

lab = scheduler_helpers.lab  # fixture

RFC3339_UTC = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z$")
SECRET = "s3cret-broker-password-xyzzy"
KEY = "s3cret-signing-key-plugh"


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "COLUMNS": "160", **extra}


@pytest.mark.parametrize("args", [["--help"], ["run", "--help"]])
def test_python_m_labctl(args: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "labctl", *args], capture_output=True, text=True, env=_env(), timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "Usage: python -m labctl" in done.stdout


def test_the_installed_script_completes_through_the_lazy_table() -> None:
    script = shutil.which("labctl")
    if script is None:
        pytest.skip("no labctl script on PATH")
    # Typer's --show-completion prints the script of the shell it finds among the process's ancestors: run
    # it from bash, as a user would, whatever started the test (a detached pytest has no shell above it).
    shown = subprocess.run(
        ["bash", "-c", f"{shlex.quote(script)} --show-completion bash; exit $?"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0 and "_LABCTL_COMPLETE=complete_bash" in shown.stdout
    env = _env(_LABCTL_COMPLETE="complete_bash", COMP_WORDS="labctl ru", COMP_CWORD="1")
    done = subprocess.run([script], capture_output=True, text=True, env=env, timeout=60)
    assert (done.returncode, done.stdout.split()) == (0, ["run", "runs"]), done.stderr


def _json_lines(text: str) -> list[dict[str, Any]]:
    """Every stderr line is a JSON object with the four fields."""
    lines = [json.loads(line) for line in text.splitlines() if line.strip()]
    for line in lines:
        assert {"ts", "level", "logger", "msg"} <= set(line), line
        assert RFC3339_UTC.match(line["ts"]), line
    return lines


def test_an_agent_logs_json_lines_and_no_secret(mosquitto: Mosquitto, tmp_path: Path) -> None:
    """`labctl agent --log-level debug`, its stderr a pipe (JSON by default): its start and its connection
    to the broker, as JSON lines, and never the broker's password or the signing key (from the environment,
    as the inventory's ${ENV} references)."""
    section = broker_section(mosquitto.url, "  password: ${LAB_PW}\n  auth_key: ${LAB_KEY}\n")
    inv, _ = write_lab(tmp_path, section)
    argv = [sys.executable, "-m", "labctl", "agent", "--host", "h1", "-i", str(inv), "--log-level", "debug"]
    stderr = tmp_path / "agent.log"
    with stderr.open("wb") as sink:
        proc = subprocess.Popen(argv, stderr=sink, env=_env(LAB_PW=SECRET, LAB_KEY=KEY))
        try:
            deadline = time.monotonic() + 30
            while "connected to broker" not in stderr.read_text():
                assert proc.poll() is None, stderr.read_text()
                assert time.monotonic() < deadline, stderr.read_text()
                time.sleep(0.05)
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 0, stderr.read_text()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    text = stderr.read_text()
    assert SECRET not in text and KEY not in text
    lines = _json_lines(text)
    start = next(line for line in lines if line["msg"].startswith("agent h1: 2 ports"))
    assert start["level"] == "info" and start["logger"] == "labctl.agents"
    assert (start["host"], start["ports"], start["signed"]) == ("h1", 2, True)
    connected = next(line for line in lines if "connected to broker" in line["msg"])
    assert connected["broker"] == f"127.0.0.1:{mosquitto.port}" and connected["host"] == "h1"
    assert lines[-1]["msg"] == "agent h1: stopped", lines


def test_serve_logs_each_run_started_and_finished(lab: dict[str, Path], tmp_path: Path) -> None:
    db, runs = tmp_path / "q.sqlite", tmp_path / "runs"
    labctl = [sys.executable, "-m", "labctl"]
    submit = [*labctl, "submit", str(lab["quick"]), "-i", str(lab["inventory"]), "--db", str(db)]
    subprocess.run(submit, check=True, capture_output=True, timeout=60)
    serve = [*labctl, "serve", "--db", str(db), "--out", str(runs), "--no-plots", "--poll", "0.05"]
    done = subprocess.run(
        [*serve, "--exit-when-idle"], capture_output=True, text=True, env=_env(), timeout=120
    )
    assert done.returncode == 0, done.stderr
    lines = _json_lines(done.stderr)
    started = [line for line in lines if line.get("run_id") == 1 and " started" in line["msg"]]
    finished = [line for line in lines if line.get("run_id") == 1 and " finished" in line["msg"]]
    assert len(started) == 1 and started[0]["logger"] == "labctl.scheduler", lines
    assert len(finished) == 1 and finished[0]["status"] == "completed", lines
    assert finished[0]["run_dir"] and Path(finished[0]["run_dir"]).is_dir()
    assert lines[0]["msg"].startswith("serving queue") and lines[-1]["msg"] == "serve stopped"
