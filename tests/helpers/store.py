"""Shared by tests/unit/test_store.py and tests/integration/test_store.py."""

from __future__ import annotations

from pathlib import Path

from labctl.core.clock import Timebase
from labctl.core.events import EventLog


def make_run(root: Path, run_json: str = '{"status": "completed"}', events: bool = True) -> Path:
    run = root / "20261130-000000-t-abcd"
    run.mkdir(parents=True)
    (run / "run.json").write_text(run_json)
    if events:
        log = EventLog(run / "events.jsonl", Timebase.capture())
        log.emit(1, "run.start", "controller", "t")
        log.close()
    return run
