"""Experiment kinds in a registry (issue 24): a file's `kind:` picks its entry, which compiles it to the plan
of typed steps the controller executes; a new kind is a spec, an entry and a registry line, and nothing
outside the registry and the kind's own modules branches on a kind's name."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from labctl.core.errors import InputError
from labctl.core.registry import EXPERIMENT_KINDS
from labctl.inventory.schema import Inventory, load_inventory
from labctl.run.experiment import (
    ExperimentKind,
    Plan,
    build_plan,
    compile_experiment,
    experiment_kinds,
    load_experiment,
)
from labctl.run.steps import Hold, Reconfigure
from tests.helpers.architecture import parsed

REPO = Path(__file__).resolve().parents[2]
LABCTL = REPO / "labctl"
# Each kind's own modules: where its name may be written (its spec's `kind` literal, its CLI).
OWNERS = {
    "timeline": ("labctl/run/experiment.py", "labctl/core/registry.py"),
    "replay": ("labctl/workload/", "labctl/cli/replay.py", "labctl/core/registry.py"),
    "tune": ("labctl/run/tune.py", "labctl/cli/tune.py", "labctl/core/registry.py"),
}
# The same word meaning something else: the timeline figure (its name and file name).
OTHER_MEANINGS = {
    ("labctl/analysis/figures_ahead.py", "timeline"),
    ("labctl/analysis/figures.py", "timeline"),
    ("labctl/run/lifecycle.py", "timeline"),  # asking the figure workers for the timeline figure ahead
    ("labctl/cli/__init__.py", "replay"),  # the `labctl replay` command group, in the lazy command table
    ("labctl/cli/__init__.py", "tune"),  # the `labctl tune` command, in the lazy command table
}


def test_every_kind_loads_and_names_itself() -> None:
    assert set(experiment_kinds.names()) == set(EXPERIMENT_KINDS) == set(OWNERS)
    for name in experiment_kinds:
        assert experiment_kinds.get(name).name == name


def test_the_file_names_its_kind_and_timeline_is_the_default() -> None:
    inventory = load_inventory(REPO / "inventory.yaml")
    timeline = compile_experiment(REPO / "experiments/reconfig-timeline.yaml", inventory)
    assert any(isinstance(s, Reconfigure) and s.baseline for s in timeline.program)
    replay = compile_experiment(REPO / "experiments/replay-opus-testbed.yaml", inventory)
    assert type(replay.spec).__name__ == "ReplaySpec" and replay.program


def test_an_unknown_kind_is_one_line_naming_the_known_ones(tmp_path: Path) -> None:
    path = tmp_path / "x.yaml"
    path.write_text("name: x\nkind: sweep-the-floor\n")
    with pytest.raises(
        InputError, match=r"x\.yaml:2.*kind: 'sweep-the-floor'.*known: replay, timeline, tune"
    ):
        compile_experiment(path, load_inventory(REPO / "inventory.yaml"))


def _just_the_baseline(path: Path, inventory: Inventory) -> Plan:
    """A kind made up by this test: a timeline file's baseline and one hold, nothing else."""
    spec, src = load_experiment(path.with_name("base.yaml"))
    plan = build_plan(spec, inventory, src)
    steps = (*(s for s in plan.program if isinstance(s, Reconfigure) and s.baseline), Hold(0.1))
    return Plan(plan.spec, plan.path, plan.rails, plan.phases, steps)


JUST_THE_BASELINE = ExperimentKind("just-the-baseline", "a test's own kind", _just_the_baseline)


def test_a_new_kind_is_an_entry_and_a_registry_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        experiment_kinds,
        "table",
        {**EXPERIMENT_KINDS, "just-the-baseline": f"{__name__}:JUST_THE_BASELINE"},
    )
    monkeypatch.setattr(experiment_kinds, "_loaded", dict(experiment_kinds._loaded))  # forgotten afterwards
    (tmp_path / "base.yaml").write_text((REPO / "experiments/reconfig-timeline.yaml").read_text())
    (tmp_path / "mine.yaml").write_text("kind: just-the-baseline\n")
    plan = compile_experiment(tmp_path / "mine.yaml", load_inventory(REPO / "inventory.yaml"))
    assert [type(s).__name__ for s in plan.program] == ["Reconfigure", "Hold"]


def test_no_module_outside_a_kind_and_the_registry_writes_its_name() -> None:
    found = []
    for path in sorted(LABCTL.rglob("*.py")):
        module = path.relative_to(REPO).as_posix()
        # each file parsed once (shared with tests/unit/test_architecture.py) and walked once, not per name
        constants = [
            (node.lineno, node.value)
            for node in ast.walk(parsed(path))
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
        ]
        for name, owners in OWNERS.items():
            if module.startswith(owners) or (module, name) in OTHER_MEANINGS:
                continue
            found += [f"{module}:{lineno}: {name!r}" for lineno, value in constants if value == name]
    assert found == [], "branch on an experiment kind only in its registry entry:\n" + "\n".join(found)
