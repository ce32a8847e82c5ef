"""What a tune run recorded of each port's link settings (its `link.settings` events), and the check that
every port ended the run as it was read before it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def settings_events(run_dir: Path) -> dict[str, list[dict[str, Any]]]:
    """Per port source, its link.settings events in order: stage and what was read back."""
    out: dict[str, list[dict[str, Any]]] = {}
    for line in (run_dir / "events.jsonl").read_text().splitlines():
        event = json.loads(line)
        if event["kind"] == "link.settings":
            out.setdefault(event["source"], []).append(event)
    return out


def assert_restored_as_read_before(run_dir: Path) -> None:
    """Every port's last read-back (the restore's) equals its first (before anything changed)."""
    for source, events in settings_events(run_dir).items():
        assert events[0]["meta"]["stage"] == "before", source
        assert events[-1]["meta"]["stage"] == "restore", source
        assert events[-1]["meta"]["read"] == events[0]["meta"]["read"], source
