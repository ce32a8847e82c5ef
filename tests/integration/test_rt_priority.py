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


_BACKGROUND = """
import os, resource, sys
from labctl.core.sched import background, foreground  # before giving up root: the checkout may be 0700
if sys.argv[1] == "unprivileged":
    resource.setrlimit(resource.RLIMIT_NICE, (0, 0))
    os.setgid(65534)
    os.setuid(65534)
background()
went = (os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, 0))
foreground(0, 0)
print(*went, os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, 0))
"""


@pytest.mark.parametrize("who", ["root", "unprivileged"])
def test_figure_workers_go_idle_only_where_they_can_come_back(who: str) -> None:
    """SCHED_IDLE while the run samples, ordinary when the run waits on the figures: where a process may not
    leave SCHED_IDLE (no privilege, RLIMIT_NICE 0) it would stay starved behind any busy process, so there
    it takes nice 10 instead (and keeps it: lowering nice needs the same privilege)."""
    import subprocess
    import sys

    require(os.geteuid() == 0, "switches users")
    done = subprocess.run(
        [sys.executable, "-c", _BACKGROUND, who], capture_output=True, text=True, timeout=60, cwd=REPO
    )
    assert done.returncode == 0, done.stderr
    policy, nice, policy_after, nice_after = map(int, done.stdout.split())
    if who == "root":
        assert (policy, policy_after, nice_after) == (os.SCHED_IDLE, os.SCHED_OTHER, 0)
    else:
        assert (policy, nice, policy_after, nice_after) == (os.SCHED_OTHER, 10, os.SCHED_OTHER, 10)
