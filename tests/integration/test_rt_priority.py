"""`labctl run --rt-priority N` for real (root): the loop runs at SCHED_FIFO while the experiment runs, the
run records it, the process is back to ordinary scheduling after, and a refusal comes before any run
directory exists."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from labctl.core.errors import HardwareError
from labctl.run.lifecycle import run_experiment
from tests.conftest import require

REPO = Path(__file__).resolve().parents[2]
EXPERIMENT = REPO / "experiments" / "reconfig-timeline.yaml"


async def test_the_run_is_realtime_while_it_runs_and_says_so(tmp_path: Path) -> None:
    require(os.geteuid() == 0, "SCHED_FIFO needs root")
    seen: list[int] = []

    class Watch:
        def __getattr__(self, name: str):  # every progress call: what policy the loop has then
            return lambda *args, **kwargs: seen.append(os.sched_getscheduler(0))

    outcome = await run_experiment(
        EXPERIMENT, REPO / "inventory.yaml", profile="fast", out_dir=tmp_path / "runs", seed=2, plots=False,
        rt_priority=5, progress=Watch(),  # type: ignore[arg-type]
    )  # fmt: skip
    assert outcome.status == "completed"
    assert os.SCHED_FIFO in seen  # during the experiment
    assert os.sched_getscheduler(0) == os.SCHED_OTHER  # and not after it
    run = json.loads((outcome.run_dir / "run.json").read_text())
    assert run["scheduling"] == {"policy": "SCHED_FIFO", "priority": 5}


async def test_a_refused_priority_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(pid: int, policy: int, param: os.sched_param) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "sched_setscheduler", refuse)
    with pytest.raises(HardwareError, match="SCHED_FIFO needs root"):
        await run_experiment(
            EXPERIMENT, REPO / "inventory.yaml", profile="fast", out_dir=tmp_path / "runs", rt_priority=5
        )
    assert not (tmp_path / "runs").exists()
