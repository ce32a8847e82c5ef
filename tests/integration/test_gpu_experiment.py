"""The GPU step inside a reconfiguration experiment (`gpu:` section) and `labctl bench gpu` without a GPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from labctl.core.events import read_events
from labctl.probes.gpu.errors import NoGpuError
from labctl.probes.gpu.sim import SimulatedGpu
from labctl.run.lifecycle import run_experiment
from labctl.run.steps import Stage
from tests.helpers.gpu_experiment import SHORT

GPU = """\
gpu:
  iterations: 200
  warmup: 5
  variants: [flip-atomic, rwlr-atomic]
"""


def _gpu_available() -> str | None:
    """None when this machine has a usable CUDA GPU, else why not."""
    from labctl.probes.gpu.runner import open_backend

    try:
        open_backend().close()
    except NoGpuError as e:
        return str(e)
    return None


@pytest.fixture
def gpu_experiment(tmp_path: Path) -> Path:
    path = tmp_path / "gpu.yaml"
    path.write_text(SHORT + GPU)
    return path


async def test_without_a_gpu_the_step_is_skipped_with_events_and_the_run_completes(
    gpu_experiment: Path, inventory_path: Path, tmp_path: Path
) -> None:
    reason = _gpu_available()
    if reason is None:
        pytest.skip("this machine has a CUDA GPU: the no-GPU path cannot be observed here")
    messages: list[str] = []

    class Progress:
        def started(self, run_dir: Path, steps: int) -> None: ...
        def reconfig_started(self, stage: Stage, expected: int) -> None: ...
        def port_recovered(self, stage: Stage, recovered: int, expected: int) -> None: ...
        def reconfig_done(self, stage: Stage, timed_out: list[str]) -> None: ...
        def message(self, text: str) -> None:
            messages.append(text)

    outcome = await run_experiment(
        gpu_experiment,
        inventory_path,
        profile="fast",
        out_dir=tmp_path / "runs",
        seed=3,
        progress=Progress(),
        plots=False,
    )
    assert outcome.status == "completed", outcome.error
    events = list(read_events(outcome.run_dir / "events.jsonl"))
    skips = [e for e in events if e.kind == "gpu.skip"]
    assert [e.meta["stage"] for e in skips] == ["before", "after"]
    assert all(e.value == reason for e in skips)
    # before the baseline set-up, after the last reconfiguration (the final baseline restore comes later)
    phases = [e.t_ns for e in events if e.kind == "phase" and e.meta["measured"]]
    assert skips[0].t_ns < phases[0] and skips[1].t_ns > phases[-1]
    assert sum("skipped: no CUDA GPU available" in m for m in messages) == 2
    assert not (outcome.run_dir / "gpu.csv").exists()
    assert outcome.summary["reconfigurations"] == 1


async def test_with_a_gpu_both_stages_land_in_the_run(
    gpu_experiment: Path, inventory_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import labctl.probes.gpu.step as step

    monkeypatch.setattr(step, "open_backend", lambda: SimulatedGpu(1))
    outcome = await run_experiment(
        gpu_experiment, inventory_path, profile="fast", out_dir=tmp_path / "runs", seed=3
    )
    assert outcome.status == "completed", outcome.error
    run_dir = outcome.run_dir
    events = list(read_events(run_dir / "events.jsonl"))
    pp = [e for e in events if e.kind == "gpu.pingpong"]
    assert [(e.meta["stage"], e.meta["variant"]) for e in pp] == [
        ("before", "flip-atomic"),
        ("before", "rwlr-atomic"),
        ("after", "flip-atomic"),
        ("after", "rwlr-atomic"),
    ]
    assert pp[0].reconfig is None and pp[-1].reconfig == 1
    table = pd.read_parquet(run_dir / "gpu.parquet")
    assert set(table["stage"]) == {"before", "after"}
    assert (run_dir / "gpu_pingpong.png").stat().st_size > 0
    assert (run_dir / "breakdown.csv").exists() and outcome.summary["reconfigurations"] == 1
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["experiment"]["gpu"]["iterations"] == 200


async def test_a_failing_gpu_benchmark_is_recorded_and_the_run_goes_on(
    gpu_experiment: Path, inventory_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import labctl.probes.gpu.step as step
    from labctl.probes.gpu.sim import SimModel

    gpus: list[SimulatedGpu] = []

    def broken() -> SimulatedGpu:
        gpus.append(SimulatedGpu(1, model=SimModel(unresponsive_peer=True)))
        return gpus[-1]

    monkeypatch.setattr(step, "open_backend", broken)
    outcome = await run_experiment(
        gpu_experiment, inventory_path, profile="fast", out_dir=tmp_path / "runs", seed=3, plots=False
    )
    assert outcome.status == "completed", outcome.error
    errors = [e for e in read_events(outcome.run_dir / "events.jsonl") if e.kind == "gpu.error"]
    assert len(errors) == 2 and "stopped answering" in str(errors[0].value)
    assert len(gpus) == 2 and all(g.closed for g in gpus)


def test_bench_gpu_without_a_gpu_is_one_line_and_exit_1(tmp_path: Path) -> None:
    reason = _gpu_available()
    if reason is None:
        pytest.skip("this machine has a CUDA GPU: `labctl bench gpu` would run")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "labctl.cli",
            "bench",
            "gpu",
            "--device",
            "0",
            "--out",
            str(tmp_path / "runs"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [reason]
    assert proc.stderr.startswith("no CUDA GPU available: ")
    assert not (tmp_path / "runs").exists()  # nothing is written without a GPU
