"""Shared by tests/unit/test_hostile_input.py and tests/integration/test_hostile_input.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from labctl.inventory.schema import load_inventory
from labctl.run.experiment import build_plan, load_experiment

REPO = Path(__file__).resolve().parents[2]


def long_switch_name(length: int) -> str:
    """The serial-emulated lab (the emulator on a pty, the real dicon-serial driver) with its switch named by
    `length` characters, everywhere the inventory names it."""
    data = yaml.safe_load((REPO / "experiments" / "inventories" / "serial-emulated.yaml").read_text())
    ((old, config),) = data["switches"].items()
    name = "o" * length
    data["switches"] = {name: config}
    for host in data["hosts"].values():
        for nic in host["nics"]:
            assert nic["switch"] == old
            nic["switch"] = name
    return str(yaml.safe_dump(data, width=1 << 30))


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
            "link": {
                "autoneg": True,
                "speed_mbps": 100_000,
                "autoneg_off_factor": 0.5,
                "fec_factor": {"off": 0.9, "rs": 1.0},
                "forced_mode_factor": 1.0,
            },
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
        "clock_udp_port": 47003,
        "agent_grace_s": 5.0,
        "agent_return_s": 30.0,
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
    "voa": [{"switch": "ocs1", "ports": [5], "atten_db": [0.0, 5.0]}],
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


def numeric_leaves(data: Any, loc: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    if isinstance(data, dict):
        for key, value in data.items():
            yield from numeric_leaves(value, (*loc, key))
    elif isinstance(data, list):
        for i, value in enumerate(data):
            yield from numeric_leaves(value, (*loc, i))
    elif isinstance(data, int | float) and not isinstance(data, bool):
        yield loc


def _check(tmp_path: Path, inventory: dict[str, Any], experiment: dict[str, Any]) -> None:
    inv_path = tmp_path / "inventory.yaml"
    exp_path = tmp_path / "experiment.yaml"
    inv_path.write_text(yaml.safe_dump(inventory))
    exp_path.write_text(yaml.safe_dump(experiment))
    inv = load_inventory(inv_path)
    inv.profile()
    spec, src = load_experiment(exp_path)
    build_plan(spec, inv, src)
