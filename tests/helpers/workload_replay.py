"""Shared by tests/integration/test_workload_replay.py and tests/unit/test_workload_replay.py."""

from __future__ import annotations

import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _experiment(tmp_path: Path, **fields: object) -> Path:
    body = {
        "name": "replay-test",
        "kind": "replay",
        "trace": "opus-testbed",
        "mode": "provisioning",
        "switching_ms": 25,
        "steps": 1,
        "hold_s": 0.05,
        **fields,
    }
    path = tmp_path / "replay.yaml"
    path.write_text(json.dumps(body))
    return path
