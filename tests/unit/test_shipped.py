"""The built-in lab and experiments ship inside the package (labctl.core.shipped, issue 26): found by name
from any directory, the default inventory falls back to the built-in one, and `labctl init` writes a lab
directory that checks (tests/integration/test_install.py runs the commands)."""

from __future__ import annotations

from pathlib import Path

import pytest

from labctl.core.errors import InputError
from labctl.core.shipped import (
    DEFAULT_INVENTORY,
    builtin_experiments,
    builtin_inventory,
    resolve_experiment,
    resolve_inventory,
)

REPO = Path(__file__).resolve().parents[2]


def test_the_package_data_is_the_repository_files() -> None:
    # one copy of each file: labctl/data links to the repository's inventory.yaml and experiments/
    assert builtin_inventory().read_bytes() == (REPO / "inventory.yaml").read_bytes()
    shipped = builtin_experiments()
    assert set(shipped) == {p.stem for p in (REPO / "experiments").glob("*.yaml")}
    assert (
        shipped["reconfig-timeline"].read_bytes()
        == (REPO / "experiments/reconfig-timeline.yaml").read_bytes()
    )


def test_an_experiment_is_a_file_or_a_builtin_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert resolve_experiment("reconfig-timeline") == builtin_experiments()["reconfig-timeline"]
    assert resolve_experiment("reconfig-timeline.yaml") == builtin_experiments()["reconfig-timeline"]
    mine = tmp_path / "reconfig-timeline"
    mine.write_text("name: mine\n")
    assert resolve_experiment("reconfig-timeline") == Path("reconfig-timeline")  # a file here comes first
    with pytest.raises(InputError, match=r"^nosuch: experiment not found .*built-in: .*reconfig-timeline"):
        resolve_experiment("nosuch")
    with pytest.raises(InputError, match="experiment not found"):
        resolve_experiment("some/dir/reconfig-timeline")  # a path is a path, never a built-in name


def test_the_default_inventory_falls_back_to_the_builtin_lab(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert resolve_inventory(DEFAULT_INVENTORY) == builtin_inventory()
    assert resolve_inventory(Path("other.yaml")) == Path("other.yaml")  # named: as given, found or not
    (tmp_path / "inventory.yaml").write_text("lab: here\n")
    assert resolve_inventory(DEFAULT_INVENTORY) == DEFAULT_INVENTORY
