"""When `labctl run` asks its figure workers to work its files out ahead (labctl.run.lifecycle): the
timeline once the reconfiguration after the one it shows is done, the distributions and the summary once
the last step is; every report still reaches the caller's progress sink."""

from __future__ import annotations

from pathlib import Path

from labctl.run.engine import NullProgress
from labctl.run.lifecycle import _FiguresAhead
from labctl.run.steps import Stage


class _Seen(NullProgress):
    def __init__(self) -> None:
        self.seen: list[str] = []

    def started(self, run_dir: Path, steps: int) -> None:
        self.seen.append(f"started {steps}")

    def reconfig_started(self, stage: Stage, expected: int) -> None:
        self.seen.append(f"start {stage}")

    def port_recovered(self, stage: Stage, recovered: int, expected: int) -> None:
        self.seen.append(f"port {recovered}/{expected}")

    def reconfig_done(self, stage: Stage, timed_out: list[str]) -> None:
        self.seen.append(f"done {stage}")

    def message(self, text: str) -> None:
        self.seen.append(text)


def _run(stages: list[Stage]) -> tuple[list[str], list[str]]:
    inner, asked = _Seen(), []
    sink = _FiguresAhead(inner, asked.append)
    sink.started(Path("run"), len(stages))
    for stage in stages:
        sink.reconfig_started(stage, 2)
        sink.port_recovered(stage, 1, 2)
        sink.reconfig_done(stage, [])
        asked.append(f"after {stage}")
    sink.message("bye")
    return inner.seen, asked


def test_the_timeline_after_the_next_reconfiguration_the_distributions_after_the_last() -> None:
    steps = [Stage("step", phase, i, 4) for i, phase in enumerate(["pp", "dp", "pp", "dp"], start=1)]
    seen, asked = _run([Stage("baseline", "dp"), *steps])
    assert asked == [
        "after baseline → dp",
        "after reconfig 1/4 → pp",
        "timeline",
        "after reconfig 2/4 → dp",
        "after reconfig 3/4 → pp",
        "distributions",
        "summary",
        "after reconfig 4/4 → dp",
    ]
    assert seen[0] == "started 5" and seen[-1] == "bye" and len(seen) == 2 + 3 * 5


def test_one_step_asks_for_no_timeline_and_a_restore_for_nothing() -> None:
    stages = [Stage("baseline", "dp"), Stage("step", "pp", 1, 1), Stage("restore", "dp")]
    _, asked = _run(stages)
    assert [a for a in asked if not a.startswith("after")] == ["distributions", "summary"]
    # An aborted run's restore is not a reconfiguration of the experiment's: it does not count.
    stages = [Stage("baseline", "dp"), Stage("step", "pp", 1, 8), Stage("restore", "dp")]
    _, asked = _run(stages)
    assert [a for a in asked if not a.startswith("after")] == []
