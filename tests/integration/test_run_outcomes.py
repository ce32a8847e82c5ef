"""Records that say what happened (issue 28): a probe that dies mid-run fails the run naming the probe and
its cause, the events up to the fault on disk. A run whose analysis fails is tests/integration/
test_controller.py's test_a_failed_analysis_fails_the_run_and_keeps_its_events."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from labctl.analysis.store import load_run
from labctl.probes import model
from labctl.run.lifecycle import run_experiment

REPO = Path(__file__).resolve().parents[2]


def test_a_probe_that_dies_fails_the_run_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_run = model.SimTrafficProbe._run

    async def dies_after_a_while(self: model.SimTrafficProbe) -> None:
        runs = asyncio.ensure_future(real_run(self))
        try:
            await asyncio.wait_for(asyncio.shield(runs), timeout=0.3)
        except TimeoutError:
            raise RuntimeError("sampler thread lost its socket") from None
        finally:
            runs.cancel()
            await asyncio.gather(runs, return_exceptions=True)

    monkeypatch.setattr(model.SimTrafficProbe, "_run", dies_after_a_while)
    outcome = asyncio.run(
        run_experiment(
            REPO / "experiments" / "reconfig-timeline.yaml",
            REPO / "inventory.yaml",
            profile="fast",
            out_dir=tmp_path,
            seed=3,
            plots=False,
        )
    )
    assert outcome.status == "failed"
    assert outcome.error is not None
    assert "probe model-traffic stopped: RuntimeError: sampler thread lost its socket" in outcome.error
    meta = json.loads((outcome.run_dir / "run.json").read_text())
    assert meta["status"] == "failed" and "model-traffic" in meta["error"]
    events = load_run(outcome.run_dir).events
    faults = events[events["kind"] == "run.fault"]
    assert any("model-traffic" in str(v) for v in faults["value"])
    assert (events["kind"] == "traffic.ok").any()  # what the probe said before it died is on disk
