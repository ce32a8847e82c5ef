"""The import contract (docs/architecture.md, "The layers"): import-linter's contracts in pyproject.toml
(`[tool.importlinter]`), which `lint-imports` checks in CI. Here, in-process: labctl keeps them, and the
same contracts over a small stand-in package with deliberate violations fail, naming each import and its
line, a lazy import inside a function and a `TYPE_CHECKING` import included."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
from importlinter import configuration
from importlinter.application.use_cases import lint_imports

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = REPO / "pyproject.toml"


def check(config: Path, capsys: pytest.CaptureFixture[str]) -> tuple[bool, str]:
    """import-linter's own check of the contracts in `config` (no cache): passed, and its report."""
    configuration.configure()
    passed = lint_imports(str(config), cache_dir=None, no_logo=True)
    return passed, capsys.readouterr().out


def test_labctl_keeps_its_contracts(capsys: pytest.CaptureFixture[str]) -> None:
    passed, report = check(PYPROJECT, capsys)
    assert passed, report


def _write(root: Path, module: str, text: str = "") -> None:
    """A module of the stand-in package, with every package above it."""
    *packages, name = module.split(".")
    folder = root
    for package in packages:
        folder = folder / package
        folder.mkdir(exist_ok=True)
        (folder / "__init__.py").touch()
    path = folder / name / "__init__.py" if text == "package" else folder / f"{name}.py"
    path.parent.mkdir(exist_ok=True)
    path.write_text("" if text == "package" else text)


@pytest.fixture
def stand_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, str]:
    """A package `fakelab` shaped like labctl (a module in every layer and part, each contract module, two
    drivers), with labctl's contracts rewritten for it; the package importable from tmp_path."""
    name = "fakelab"
    assert name not in sys.modules
    options: dict[str, Any] = tomllib.loads(PYPROJECT.read_text())["tool"]["importlinter"]
    text = PYPROJECT.read_text()
    start = text.index("\n[tool.importlinter]\n") + 1
    end = text.find("\n[tool.", start)  # the table after the contracts (theirs are [[tool.importlinter...]])
    (tmp_path / "contracts.toml").write_text(text[start : end if end >= 0 else None].replace("labctl", name))
    modules: set[str] = {"core.errors", "ocs.drivers.sim.switch", "ocs.drivers.polatis_tl1.switch"}
    for contract in options["contracts"]:
        for layer in contract.get("layers", []):
            modules |= {f"{part.strip()}.anything" for part in layer.replace("|", ":").split(":")}
        for source in contract.get("source_modules", []):
            modules.add(source.removeprefix("labctl."))
    for module in sorted(modules):
        _write(tmp_path, f"{name}.{module}")
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path, name


def test_the_contracts_pass_on_the_stand_in_as_built(
    stand_in: tuple[Path, str], capsys: pytest.CaptureFixture[str]
) -> None:
    root, _ = stand_in
    passed, report = check(root / "contracts.toml", capsys)
    assert passed, report


def test_the_contracts_fail_on_a_deliberate_violation(
    stand_in: tuple[Path, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """A driver that reaches for the run engine inside a function, one that reads a probe only for its
    types, and a model that reads a probe: each named, with its line."""
    root, name = stand_in
    _write(root, f"{name}.run.engine")
    _write(root, f"{name}.probes.rxpower")
    _write(
        root,
        f"{name}.ocs.drivers.polatis_tl1.switch",
        f"def connect() -> None:\n    import {name}.run.engine\n",
    )
    _write(
        root,
        f"{name}.ocs.drivers.sim.switch",
        f"from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from {name}.probes import rxpower\n",
    )
    _write(root, f"{name}.models.anything", f"import {name}.probes.rxpower\n")
    passed, report = check(root / "contracts.toml", capsys)
    assert not passed
    assert f"{name}.ocs.drivers.polatis_tl1.switch -> {name}.run.engine (l.2)" in report
    assert f"{name}.ocs.drivers.sim.switch -> {name}.probes.rxpower (l.4)" in report
    assert f"{name}.models.anything -> {name}.probes.rxpower (l.1)" in report
