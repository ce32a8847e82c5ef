"""An experiment chooses probes beyond its lab kind's own (issue 24): `probes.extra` names registered
probes, built on the lab's ports and model like its own and run for the whole run; a probe registered by a
test runs when an experiment names it. Where a lab kind cannot run them (agents run an allow-list), one
line says so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from labctl.core.errors import InputError
from labctl.core.registry import PROBES
from labctl.probes.base import ProbeContext, ProbeKind, probe_kinds
from labctl.probes.sampling import Probe, QueueProbe, run_ticks
from labctl.run.lifecycle import run_experiment
from tests.conftest import REPO


class TickCounter(QueueProbe):
    """A probe of this test's own: it counts its ticks over the lab's ports, and reports nothing."""

    name = "tick-counter"
    counters = ("ticks",)

    def __init__(self, ports: int) -> None:
        super().__init__()
        self.ports = ports
        self.ticks = 0

    async def _run(self) -> None:
        def tick(t: int) -> None:
            self.ticks += 1

        await run_ticks(10_000_000, tick)


def _build(ctx: ProbeContext) -> Probe:
    return TickCounter(len(ctx.ports))


COUNTER = ProbeKind("tick-counter", (), "counts its ticks (a test's probe)", _build)


def _experiment(tmp_path: Path, extra: str) -> Path:
    """The main experiment, one step, with `probes.extra` naming `extra`."""
    text = (REPO / "experiments/reconfig-timeline.yaml").read_text()
    text = text.replace("repeat: 2 ", "repeat: 1 ").replace("probes:\n", f"probes:\n  extra: [{extra}]\n", 1)
    path = tmp_path / "experiment.yaml"
    path.write_text(text)
    return path


@pytest.fixture
def registered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(probe_kinds, "table", {**PROBES, "tick-counter": f"{__name__}:COUNTER"})
    monkeypatch.setattr(probe_kinds, "_loaded", dict(probe_kinds._loaded))  # forgotten afterwards


async def test_a_probe_registered_by_a_test_runs_when_the_experiment_names_it(
    tmp_path: Path, registered: None
) -> None:
    experiment = _experiment(tmp_path, "tick-counter")
    assert "extra: [tick-counter]" in experiment.read_text()
    outcome = await run_experiment(
        experiment, REPO / "inventory.yaml", profile="fast", out_dir=tmp_path / "runs", plots=False, seed=1
    )
    assert outcome.status == "completed", outcome.error
    probes = json.loads((outcome.run_dir / "run.json").read_text())["probes"]
    assert probes["tick-counter"]["ticks"] > 10, probes["tick-counter"]
    assert {"model-link", "rx-power", "model-traffic"} <= set(probes), "beside the lab's own"


async def test_an_unknown_extra_probe_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"unknown probe 'tick-counter' \(known: "):
        await run_experiment(
            _experiment(tmp_path, "tick-counter"),
            REPO / "inventory.yaml",
            profile="fast",
            out_dir=tmp_path / "runs",
            plots=False,
        )
