"""Hostile configuration files: YAML built to hang, exhaust memory or crash the parser, and numbers that
validate by type but cannot be run (infinite, NaN, astronomically large, negative). Every one must be one
line naming file and line, exit code 2, in bounded time and memory."""

from __future__ import annotations

import copy
import math
import resource
import subprocess
import sys
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from labctl.emulators.core import FaultPlan, load_faults
from labctl.errors import InputError
from labctl.experiment import ExperimentSpec, build_plan, load_experiment
from labctl.inventory import InventoryModel, load_inventory
from labctl.profiles import Profile
from labctl.sampling import ProbeSettings
from labctl.yamlio import MAX_DEPTH, MAX_NODES, load_yaml


def alias_bomb(levels: int = 9, width: int = 9) -> str:
    text = "a0: &a0 [" + ", ".join(["lol"] * width) + "]\n"
    for i in range(1, levels):
        text += f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]\n"
    return text + f"lab: *a{levels - 1}\n"


# name -> (file text, the line the error must name)
HOSTILE: dict[str, tuple[str, int]] = {
    "alias-bomb": (alias_bomb(), 6),
    "alias-bomb-in-mapping": (
        "a: &a {k0: x, k1: x, k2: x, k3: x, k4: x, k5: x, k6: x, k7: x, k8: x, k9: x}\n"
        + "".join(
            f"b{i}: &b{i} [" + ", ".join([f"*{'a' if i == 0 else f'b{i - 1}'}"] * 10) + "]\n"
            for i in range(8)
        ),
        5,
    ),
    "recursive-alias": ("lab: &a [*a]\n", 1),
    "recursive-alias-in-mapping": ("lab: tiny\nhosts: &h {a: {nics: *h}}\n", 2),
    "list-as-key": ("lab: tiny\n? [a, b]\n: 1\n", 2),
    "set-as-key": ("lab: tiny\n? !!set {a, b}\n: 1\n", 2),
    "mapping-as-flow-key": ("lab: tiny\n{a: 1}: 2\n", 2),
    "deep-flow-nesting": ("lab: " + "[" * 1000 + "]" * 1000 + "\n", 1),
    "deep-block-nesting": (
        "lab:\n" + "".join(" " * i + f"k{i}:\n" for i in range(1, 200)) + " " * 200 + "x\n",
        65,  # where the 65th level opens
    ),
    "huge-integer": ("lab: tiny\nrepeat: " + "9" * 5000 + "\n", 2),
    "huge-hex-integer": ("lab: tiny\nrepeat: 0x" + "f" * 5000 + "\n", 2),
    "nul-byte": ("lab: tiny\nhosts: a\x00b\n", 2),
    "escape-byte": ("lab: tiny\n\x1b[31mhosts: {}\n", 2),
}


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


# ---- numbers: every numeric field, set to values no lab can run -------------------------------------------

FULL_INVENTORY: dict[str, Any] = {
    "lab": "full",
    "profile": "mine",
    "profiles": {
        "mine": {
            "switching_ms": [20.0, 30.0],
            "light_loss_ms": [0.5, 2.0],
            "optical_settle_ms": [0.5, 3.0],
            "firmware_up_ms": [100.0, 200.0],
            "carrier_after_firmware_us": [70.0, 80.0],
            "transport_after_carrier_ms": [1.0, 2.0],
            "carrier_down_after_loss_ms": [0.2, 1.0],
            "rx_power_dbm": -2.5,
            "rx_noise_db": 0.05,
            "rtt_us": [8.0, 14.0],
            "dom_update_ms": [0.0, 0.0],
        }
    },
    "switches": {
        "ocs1": {"driver": "sim", "size": "4x4", "timeout_s": 10.0, "owned_ports": [1, 2, 5, "6-8"]},
        "ocs2": {
            "driver": "polatis-tl1",
            "address": "127.0.0.1",
            "user": "admin",
            "port": 3082,
            "size": "4x4",
            "timeout_s": 10.0,
            "pipeline_depth": 8,
        },
        "ocs3": {
            "driver": "dicon-serial",
            "url": "/dev/ttyUSB0",
            "size": "4x4",
            "timeout_s": 10.0,
            "baudrate": 115200,
            "reply_timeout_s": 1.0,
            "settle_timeout_s": 2.0,
        },
    },
    "power_meters": {
        "pm1": {
            "address": "127.0.0.1",
            "port": 5025,
            "averaging_time_ms": 1.0,
            "wavelength_nm": 1310.0,
            "poll_hz": 500.0,
            "timeout_s": 2.0,
            "channels": {1: {"switch": "ocs1", "port": 5}, 2: {"host": "b", "nic": "eth0"}},
        }
    },
    "broker": {
        "url": "mqtt://127.0.0.1:1883",
        "clock_sync_interval_s": 10.0,
        "clock_samples": 16,
        "agent_grace_s": 5.0,
        "feed_lead_ms": 50.0,
        "mirror_lag_ms": 50.0,
    },
    "hosts": {
        "a": {
            "gpus": [{"index": 0}],
            "nics": [
                {
                    "ifname": "eth0",
                    "rail": 0,
                    "gpu": 0,
                    "switch": "ocs1",
                    "tx": 1,
                    "rx": 5,
                    "gbps": 100,
                    "rdma": {"device": "mlx5_0", "port": 1, "gid_index": 3},
                }
            ],
        },
        "b": {"nics": [{"ifname": "eth0", "rail": 0, "switch": "ocs1", "tx": 2, "rx": 6}]},
    },
}

FULL_EXPERIMENT: dict[str, Any] = {
    "name": "full",
    "rails": [0],
    "phases": {"ab": {"pairs": [["a", "b"]]}},
    "baseline": "ab",
    "cycle": ["ab"],
    "repeat": 2,
    "recovery_timeout_s": 30.0,
    "hold_s": 0.5,
    "probes": {
        "rx_power_hz": 1000.0,
        "traffic_interval_us": 1000,
        "traffic_timeout_us": 2000,
        "report_interval_ms": 100.0,
        "rx_power_deadband_db": 0.5,
        "link_state_hz": 100.0,
        "switch_power_hz": 0.0,
        "rdma": {"timeout": 14, "retry_cnt": 7, "rnr_retry": 7, "min_rnr_timer": 12},
    },
    "analysis": {"rx_power_threshold_dbm": -10.0},
    "gpu": {"device": 0, "peer_device": 1, "iterations": 10_000, "warmup": 2_000},
}

FULL_FAULTS: dict[str, Any] = {
    "drop_after_commands": 5,
    "drop_mid_reply_after_commands": 5,
    "delay_ms": 1.0,
    "deny_probability": 0.1,
    "garbage_every": 3,
    "lose_state_after_commands": 9,
    "seed": 1,
}

UNRUNNABLE: list[Any] = [math.inf, -math.inf, math.nan, 1e300, -1e300, 2**63, -(2**63), 10**30]


def numeric_leaves(data: Any, loc: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    if isinstance(data, dict):
        for key, value in data.items():
            yield from numeric_leaves(value, (*loc, key))
    elif isinstance(data, list):
        for i, value in enumerate(data):
            yield from numeric_leaves(value, (*loc, i))
    elif isinstance(data, int | float) and not isinstance(data, bool):
        yield loc


def replaced(data: Any, loc: tuple[Any, ...], value: Any) -> Any:
    out = copy.deepcopy(data)
    node = out
    for part in loc[:-1]:
        node = node[part]
    node[loc[-1]] = value
    return out


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
    from labctl.switches import switch_drivers

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
    missing = wanted - written
    # A new numeric field must be added to the FULL_* files above, so the next test bounds it too.
    assert not missing, f"numeric fields no test sets: {sorted(missing)}"


def _check(tmp_path: Path, inventory: dict[str, Any], experiment: dict[str, Any]) -> None:
    inv_path = tmp_path / "inventory.yaml"
    exp_path = tmp_path / "experiment.yaml"
    inv_path.write_text(yaml.safe_dump(inventory))
    exp_path.write_text(yaml.safe_dump(experiment))
    inv = load_inventory(inv_path)
    inv.profile()
    spec, src = load_experiment(exp_path)
    build_plan(spec, inv, src)


def test_the_full_files_are_valid(tmp_path: Path) -> None:
    _check(tmp_path, FULL_INVENTORY, FULL_EXPERIMENT)
    path = tmp_path / "faults.yaml"
    path.write_text(yaml.safe_dump(FULL_FAULTS))
    load_faults(path)


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
