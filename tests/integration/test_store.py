"""A damaged or foreign run directory is one clear line through the CLI (a subprocess), never a traceback.
Reading run directories in-process is tests/unit/test_store.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from labctl.analysis.store import load_run
from labctl.core.errors import InputError
from tests.helpers.store import make_run


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
