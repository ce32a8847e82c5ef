"""Hostile configuration files through the CLI as a subprocess (one line, exit code 2, bounded time and
memory), and every numeric field of the full files set to a value that validates by type but cannot be run
(640 cases). The rest is tests/unit/test_hostile_input.py."""

from __future__ import annotations

import copy
import math
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from labctl.core.errors import InputError
from labctl.emulators.core import load_faults
from tests.helpers.hostile_input import (
    FULL_EXPERIMENT,
    FULL_FAULTS,
    FULL_INVENTORY,
    HOSTILE,
    _check,
    long_switch_name,
    numeric_leaves,
)

REPO = Path(__file__).resolve().parents[2]


def _limited(limit_bytes: int) -> Any:
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))

    return apply


@pytest.mark.parametrize(
    "name", ["alias-bomb", "recursive-alias", "deep-flow-nesting", "huge-integer", "nul-byte"]
)
@pytest.mark.parametrize("command", [["inventory", "check"], ["run", "--dry-run", "--inventory"]])
def test_cli_refuses_hostile_yaml_in_one_line_under_a_memory_limit(
    tmp_path: Path, name: str, command: list[str], experiment_path: Path
) -> None:
    text, line = HOSTILE[name]
    path = tmp_path / "hostile.yaml"
    path.write_text(text)
    argv = [*command, str(path)]
    if command[0] == "run":
        argv = ["run", str(experiment_path), "--dry-run", "--inventory", str(path)]
    proc = subprocess.run(
        [sys.executable, "-m", "labctl.cli", *argv],
        capture_output=True,
        text=True,
        timeout=60,  # today's code took > 20 s and 2.8 GB on the alias bomb
        preexec_fn=_limited(1 << 30),
        cwd=tmp_path,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.count("\n") == 1, proc.stderr[-2000:]
    assert proc.stderr.startswith(f"error: {path}:{line}: "), proc.stderr


UNRUNNABLE: list[Any] = [math.inf, -math.inf, math.nan, 1e300, -1e300, 2**63, -(2**63), 10**30]


def replaced(data: Any, loc: tuple[Any, ...], value: Any) -> Any:
    out = copy.deepcopy(data)
    node = out
    for part in loc[:-1]:
        node = node[part]
    node[loc[-1]] = value
    return out


CASES = [
    pytest.param(doc, loc, value, id=f"{doc}:{'.'.join(map(str, loc))}={value!r}")
    for doc, data in (("inventory", FULL_INVENTORY), ("experiment", FULL_EXPERIMENT), ("faults", FULL_FAULTS))
    for loc in numeric_leaves(data)
    for value in UNRUNNABLE
]


@pytest.mark.parametrize(("doc", "loc", "value"), CASES)
def test_every_number_is_bounded(tmp_path: Path, doc: str, loc: tuple[Any, ...], value: Any) -> None:
    def load() -> None:
        if doc == "faults":
            path = tmp_path / "faults.yaml"
            path.write_text(yaml.safe_dump(replaced(FULL_FAULTS, loc, value)))
            load_faults(path)
        elif doc == "inventory":
            _check(tmp_path, replaced(FULL_INVENTORY, loc, value), FULL_EXPERIMENT)
        else:
            _check(tmp_path, FULL_INVENTORY, replaced(FULL_EXPERIMENT, loc, value))

    with pytest.raises(InputError) as err:
        load()
    message = str(err.value)
    assert "\n" not in message
    assert f"{doc}.yaml:" in message or "faults.yaml:" in message, message


def test_cli_refuses_infinite_timeout_before_any_run(tmp_path: Path, inventory_path: Path) -> None:
    exp = dict(FULL_EXPERIMENT, recovery_timeout_s=math.inf)
    exp.pop("gpu")
    exp["phases"] = {"dp": {"pairs": [["h1", "h2"], ["h3", "h4"]]}}
    exp.update(baseline="dp", cycle=["dp"], rails=[0])
    path = tmp_path / "experiment.yaml"
    path.write_text(yaml.safe_dump(exp))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "labctl.cli",
            "run",
            str(path),
            "--inventory",
            str(inventory_path),
            "--out",
            "runs",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "recovery_timeout_s" in proc.stderr and "experiment.yaml:" in proc.stderr
    assert not (tmp_path / "runs").exists()  # refused before any run directory


def test_cli_refuses_a_negative_seed(tmp_path: Path, experiment_path: Path, inventory_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "labctl.cli",
            "run",
            str(experiment_path),
            "-i",
            str(inventory_path),
            "--seed",
            "-1",
            "--dry-run",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert proc.returncode == 2, proc.stderr
    assert "seed" in proc.stderr


def _long_switch_name(tmp_path: Path, length: int) -> Path:
    path = tmp_path / "serial-long-name.yaml"
    path.write_text(long_switch_name(length))
    return path


@pytest.mark.parametrize("command", ["inventory check", "run --dry-run", "run"])
def test_cli_refuses_a_long_switch_name_before_any_run(tmp_path: Path, command: str) -> None:
    """A 100,000-character switch name on the serial-emulated lab: refused while the inventory is
    validated, in one line that shows the name's start and its length, before a run directory, an
    emulator or a driver exists (issue 45: `labctl run` went on for seconds with it)."""
    path = _long_switch_name(tmp_path, 100_000)
    experiment = REPO / "experiments" / "reconfig-timeline.yaml"
    argv = {
        "inventory check": ["inventory", "check", str(path)],
        "run --dry-run": ["run", str(experiment), "-i", str(path), "--profile", "fast", "--dry-run"],
        "run": ["run", str(experiment), "-i", str(path), "--profile", "fast", "--out", "runs"],
    }[command]
    proc = subprocess.run(
        [sys.executable, "-m", "labctl.cli", *argv], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.count("\n") == 1 and len(proc.stderr) < 300, proc.stderr[-2000:]
    line = path.read_text().splitlines().index("switches:") + 1
    assert proc.stderr == (
        f"error: {path}:{line}: switches: switch name '{'o' * 32}'... is 100000 characters long (at most 64)\n"
    )
    assert not (tmp_path / "runs").exists()


def test_a_switch_name_of_the_longest_length_is_accepted(tmp_path: Path) -> None:
    from labctl.inventory.schema import MAX_SWITCH_NAME, load_inventory

    inventory = load_inventory(_long_switch_name(tmp_path, MAX_SWITCH_NAME))
    assert list(inventory.switches) == ["o" * MAX_SWITCH_NAME]
    with pytest.raises(InputError, match=f"is {MAX_SWITCH_NAME + 1} characters long"):
        load_inventory(_long_switch_name(tmp_path, MAX_SWITCH_NAME + 1))
