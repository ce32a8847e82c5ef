"""Reading run directories back: a damaged or foreign directory is one clear line, never a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from labctl.clock import Timebase
from labctl.errors import InputError
from labctl.events import EventLog
from labctl.store import load_run


def make_run(root: Path, run_json: str = '{"status": "completed"}', events: bool = True) -> Path:
    run = root / "20261130-000000-t-abcd"
    run.mkdir(parents=True)
    (run / "run.json").write_text(run_json)
    if events:
        log = EventLog(run / "events.jsonl", Timebase.capture())
        log.emit(1, "run.start", "controller", "t")
        log.close()
    return run


def test_a_good_run_loads(tmp_path: Path) -> None:
    run = load_run(make_run(tmp_path))
    assert run.meta["status"] == "completed" and len(run.events) == 1 and run.breakdown.empty


@pytest.mark.parametrize(
    ("run_json", "events", "expected"),
    [
        ("[1, 2]", True, "run.json: expected a JSON object, found list"),
        ("{", True, "run.json: not valid JSON"),
        ('{"status": "completed"}', False, "no events.jsonl (not a labctl run directory"),
    ],
)
def test_a_damaged_run_is_one_input_error(tmp_path: Path, run_json: str, events: bool, expected: str) -> None:
    path = make_run(tmp_path, run_json, events)
    with pytest.raises(InputError, match=expected.replace("(", r"\(")):
        load_run(path)
    for command in ("report", "plot") if not events else ("report",):  # plot reads only the events
        proc = subprocess.run(
            [sys.executable, "-m", "labctl.cli", command, str(path)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1, (command, proc.stderr)


def test_a_folder_without_runs_says_so(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no run directory in it"):
        load_run(tmp_path)
