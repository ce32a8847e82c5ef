"""Records that say what happened (issue 28): a probe that dies mid-run fails the run naming the probe and
its cause, the events up to the fault on disk; a run whose analysis fails ends failed with the reason."""

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


def test_a_run_whose_analysis_fails_ends_failed_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The experiment completed, then its analysis raised: run.json and the outcome say failed with the
    cause, the events stay, and the log's last run.end says failed (after a run.fault naming the stage)."""
    from labctl.analysis import summary

    def broken(*_: object, **__: object) -> dict[str, object]:
        raise ValueError("breakdown column missing")

    monkeypatch.setattr(summary, "analyse", broken)
    outcome = asyncio.run(
        run_experiment(
            REPO / "experiments" / "reconfig-timeline.yaml",
            REPO / "inventory.yaml",
            profile="fast",
            out_dir=tmp_path,
            seed=4,
            plots=False,
        )
    )
    assert outcome.status == "failed"
    assert outcome.error == "analysis failed: ValueError: breakdown column missing"
    meta = json.loads((outcome.run_dir / "run.json").read_text())
    assert (meta["status"], meta["error"]) == ("failed", outcome.error)
    events = load_run(outcome.run_dir).events
    ends = events[events["kind"] == "run.end"]
    assert list(ends["value"]) == ["completed", "failed"] and events.iloc[-1]["kind"] == "run.end"
    assert list(events["seq"]) == list(range(len(events)))  # one log, seq continuing
    assert (events["kind"] == "traffic.ok").any()
