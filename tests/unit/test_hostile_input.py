"""Hostile configuration files: YAML built to hang, exhaust memory or crash the parser, and numbers that
validate by type but cannot be run (infinite, NaN, astronomically large, negative). Every one must be one
line naming file and line, exit code 2, in bounded time and memory."""

from __future__ import annotations

import copy
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from labctl.core.errors import InputError
from labctl.core.yamlio import MAX_DEPTH, MAX_FILE_BYTES, MAX_NODES, load_yaml
from labctl.emulators.core import FaultPlan, load_faults
from labctl.inventory.profiles import Profile
from labctl.inventory.schema import InventoryModel, load_inventory
from labctl.probes.sampling import ProbeSettings
from labctl.run.experiment import ExperimentSpec, load_experiment
from tests.helpers.hostile_input import (
    FULL_EXPERIMENT,
    FULL_FAULTS,
    FULL_INVENTORY,
    HOSTILE,
    _check,
    numeric_leaves,
)


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_yaml_is_one_error_with_its_line(tmp_path: Path, name: str) -> None:
    text, line = HOSTILE[name]
    path = tmp_path / "hostile.yaml"
    path.write_text(text)
    with pytest.raises(InputError) as err:
        load_yaml(path, "inventory")
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"{path}:{line}: invalid YAML: "), message


def test_shape_limits_leave_real_files_alone(tmp_path: Path) -> None:
    # A 512-port lab with a merge key for defaults is well inside the limits.
    nic = "{ifname: eth0, rail: 0, switch: ocs1, tx: %d, rx: %d}"
    hosts = "".join(f"  h{i}:\n    <<: *host\n    nics: [{nic % (i + 1, 513 + i)}]\n" for i in range(512))
    text = (
        "defaults: &host {gpus: []}\nlab: big\nswitches: {ocs1: {driver: sim, size: 512x512}}\nhosts:\n"
        + hosts
    )
    path = tmp_path / "big.yaml"
    path.write_text(text)
    data = load_yaml(path, "inventory").data
    assert len(data["hosts"]) == 512 and data["hosts"]["h7"]["gpus"] == []
    assert MAX_NODES > 10 * 512 and MAX_DEPTH >= 16


def test_a_file_too_large_to_be_a_configuration_is_refused_before_it_is_read(tmp_path: Path) -> None:
    path = tmp_path / "huge.yaml"
    with path.open("w") as f:
        f.write("lab: x\nnotes: ")
        f.truncate(MAX_FILE_BYTES + 1)  # sparse: the size is what is checked, before any byte is read
    with pytest.raises(InputError) as err:
        load_yaml(path, "inventory")
    assert str(err.value) == f"{path}: 8.4 MB is too large to be the inventory (at most 8.4 MB)"


def test_many_unknown_keys_are_one_line_naming_the_first(tmp_path: Path) -> None:
    """50,000 unknown keys (a 1.2 MB file): one line, the first key's line, and how many more."""
    base = (Path(__file__).resolve().parents[2] / "inventory.yaml").read_text()
    path = tmp_path / "keys.yaml"
    path.write_text(base + "".join(f"unknown_key_{i:05d}: {i}\n" for i in range(50_000)))
    first = base.count("\n") + 1
    with pytest.raises(
        InputError, match=rf"^{path}:{first}: unknown_key_00000: unknown field \(and 49999 more"
    ):
        load_inventory(path)


def numeric_fields(model: type[BaseModel], seen: set[type[BaseModel]] | None = None) -> set[str]:
    """Names of every int/float field of a model and the models it contains."""
    seen = seen if seen is not None else set()
    if model in seen:
        return set()
    seen.add(model)
    names: set[str] = set()
    for name, field in model.model_fields.items():
        stack: list[Any] = [field.annotation]
        while stack:
            tp = stack.pop()
            if tp in (int, float):
                names.add(name)
            elif isinstance(tp, type) and issubclass(tp, BaseModel):
                names |= numeric_fields(tp, seen)
            else:
                stack.extend(typing.get_args(tp))
    return names


def test_the_full_files_set_every_numeric_field() -> None:
    from labctl.ocs.switches import switch_drivers

    models: list[type[BaseModel]] = [InventoryModel, ExperimentSpec, ProbeSettings, Profile, FaultPlan]
    models += [d.config for d in switch_drivers.all().values()]
    wanted = set().union(*(numeric_fields(m) for m in models))
    written = {
        loc[-1] if isinstance(loc[-1], str) else loc[-2]
        for doc in (FULL_INVENTORY, FULL_EXPERIMENT, FULL_FAULTS)
        for loc in numeric_leaves(doc)
    }
    # Channel numbers are mapping keys, not values the cases below can replace: test_channel_numbers_out_of_
    # range_are_one_line bounds them.
    written |= {"channels"}
    # The FEC factors are keyed by FEC name (profiles.mine.link.fec_factor.off): the leaves are set above.
    written |= {"fec_factor"}
    missing = wanted - written
    # A new numeric field must be added to the FULL_* files above, so the next test bounds it too.
    assert not missing, f"numeric fields no test sets: {sorted(missing)}"


def test_the_full_files_are_valid(tmp_path: Path) -> None:
    _check(tmp_path, FULL_INVENTORY, FULL_EXPERIMENT)
    path = tmp_path / "faults.yaml"
    path.write_text(yaml.safe_dump(FULL_FAULTS))
    load_faults(path)


@pytest.mark.parametrize(
    "text",
    ["repeat: 9223372036854775808", "repeat: 1000\ncycle: [" + ", ".join(["ab"] * 2000) + "]"],
    ids=["repeat-2**63", "repeat-x-cycle"],
)
def test_plans_are_bounded_before_they_are_built(tmp_path: Path, text: str) -> None:
    exp = {k: v for k, v in FULL_EXPERIMENT.items() if k not in ("repeat", "cycle")}
    path = tmp_path / "experiment.yaml"
    path.write_text(yaml.safe_dump(exp) + text + ("\ncycle: [ab]\n" if "cycle" not in text else "\n"))
    with pytest.raises(InputError, match="repeat"):
        load_experiment(path)


@pytest.mark.parametrize("channel", [0, 9, -1, 10**12, "x"])
def test_channel_numbers_out_of_range_are_one_line(tmp_path: Path, channel: Any) -> None:
    inventory = copy.deepcopy(FULL_INVENTORY)
    inventory["power_meters"]["pm1"]["channels"] = {channel: {"switch": "ocs1", "port": 5}}
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(inventory))
    with pytest.raises(InputError) as caught:
        load_inventory(path)
    text = str(caught.value)
    assert "\n" not in text and "inventory.yaml:" in text and "power_meters.pm1.channels" in text
