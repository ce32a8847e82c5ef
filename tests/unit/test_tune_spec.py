"""`kind: tune` (issue 40): the spec is validated as one line with file:line, the grid and its seeded
order are what the spec says, circuits whose ends could not agree are refused, and a lab kind without link
control (the kernel fabric's veths) is refused before anything is built."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import yaml

from labctl.core.errors import InputError
from labctl.inventory.schema import load_inventory
from labctl.nic.settings import LinkSettings
from labctl.run.experiment import compile_experiment
from labctl.run.steps import Reconfigure
from labctl.run.tune import ApplyLinkSettings, ReadLinkSettings, TuneSpec

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "experiments" / "tune-autoneg-fec.yaml"
INVENTORY = load_inventory(REPO / "inventory.yaml")


def _spec(**changes: object) -> dict[str, object]:
    data = yaml.safe_load(EXAMPLE.read_text())
    data.update(changes)
    return {k: v for k, v in data.items() if v is not None}


def _compile(tmp_path: Path, data: dict[str, object], name: str = "t.yaml"):  # type: ignore[no-untyped-def]
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return compile_experiment(path, INVENTORY)


def _applies(plan) -> list[ApplyLinkSettings]:  # type: ignore[no-untyped-def]
    return [s for s in plan.program if isinstance(s, ApplyLinkSettings)]


def test_the_example_compiles_to_read_baseline_then_each_setting_and_its_reconfigurations() -> None:
    plan = compile_experiment(EXAMPLE, INVENTORY)
    assert plan.kind == "tune" and isinstance(plan.spec, TuneSpec)
    assert isinstance(plan.program[0], ReadLinkSettings) and len(plan.program[0].ports) == 16
    applies = _applies(plan)
    assert sorted(a.settings.label for a in applies) == sorted(
        ["autoneg=on,fec=rs", "autoneg=on,fec=off", "autoneg=off,fec=rs", "autoneg=off,fec=off"]
    )
    assert plan.program[0].reference == "autoneg=on,fec=rs"  # the first the sweep writes
    # each setting's apply is followed by its 4 reconfigurations, which alternate and continue the cycle
    steps = list(plan.program)
    for apply in applies:
        after = steps[steps.index(apply) + 1 :]
        reconfigs = [s for s in after[:8] if isinstance(s, Reconfigure)]
        assert len(reconfigs) == 4 and all(r.step == apply.index for r in reconfigs)
    phases = [s.phase for s in steps if isinstance(s, Reconfigure) and not s.baseline]
    assert phases == ["pp", "dp"] * 8


def test_the_order_is_a_seeded_shuffle_and_as_written_keeps_the_file_order(tmp_path: Path) -> None:
    one = [a.settings.label for a in _applies(_compile(tmp_path, _spec(order_seed=5)))]
    again = [a.settings.label for a in _applies(_compile(tmp_path, _spec(order_seed=5)))]
    written = [a.settings.label for a in _applies(_compile(tmp_path, _spec(order="as-written")))]
    assert one == again and sorted(one) == sorted(written)
    assert written == ["autoneg=on,fec=rs", "autoneg=on,fec=off", "autoneg=off,fec=rs", "autoneg=off,fec=off"]
    orders = {
        tuple(a.settings.label for a in _applies(_compile(tmp_path, _spec(order_seed=s)))) for s in range(8)
    }
    assert len(orders) > 1  # the seed changes it


def test_a_fractional_grid_is_seeded_and_always_keeps_the_reference(tmp_path: Path) -> None:
    sweep = {
        "autoneg": [True, False],
        "fec": ["rs", "off", "auto"],
        "priv_flags": {"rx_cqe_compress": [True, False]},
    }
    full = _applies(_compile(tmp_path, _spec(sweep=sweep)))
    assert len(full) == 12
    for seed in range(6):
        data = _spec(
            sweep=sweep,
            grid={"fraction": 0.25, "seed": seed},
            reference="autoneg=off,fec=auto,rx_cqe_compress=off",
        )
        labels = {a.settings.label for a in _applies(_compile(tmp_path, data))}
        assert len(labels) == 3
        assert {"autoneg=on,fec=rs,rx_cqe_compress=on", "autoneg=off,fec=auto,rx_cqe_compress=off"} <= labels
        assert labels == {a.settings.label for a in _applies(_compile(tmp_path, data))}


def test_an_explicit_port_list_that_leaves_a_peer_out_is_refused_unless_allowed(tmp_path: Path) -> None:
    data = _spec(ports=["h1/ens1f0np0"])
    with pytest.raises(
        InputError, match=r"t\.yaml:\d+: ports: h1/ens1f0np0 gets auto-negotiation set but its peer"
    ):
        _compile(tmp_path, data)
    plan = _compile(tmp_path, _spec(ports=["h1/ens1f0np0"], allow_mismatched_ends=True))
    assert [p.label for p, _ in plan.program[0].ports] == ["h1/ens1f0np0"]
    # FEC alone on one end is not refused (only auto-negotiation is)
    _compile(tmp_path, _spec(ports=["h1/ens1f0np0"], sweep={"fec": ["rs", "off"]}))


def test_the_kernel_fabric_refuses_tune_in_one_line(tmp_path: Path) -> None:
    kernel = load_inventory(REPO / "experiments" / "inventories" / "emulated.yaml")
    assert kernel.kind == "kernel"
    with pytest.raises(
        InputError,
        match=r"tune-autoneg-fec\.yaml:\d+: kind: tune on lab kind kernel: veths accept no link modes",
    ):
        compile_experiment(EXAMPLE, kernel)


BAD = [
    ({"sweep": {}}, r"sweep: .*sweep nothing"),
    ({"sweep": {"fec": ["rs", "bogus"]}}, r"sweep\.fec\[1\]"),
    ({"sweep": {"autoneg": [True, True]}}, r"autoneg: a value is written twice"),
    ({"grid": {"fraction": 0}}, r"grid"),
    ({"grid": "half"}, r"grid"),
    ({"reconfigurations": 0}, r"reconfigurations"),
    ({"order": "sideways"}, r"order"),
    ({"ports": ["h9/eth0"]}, r"ports\[0\]: no port 'h9/eth0'"),
    ({"ports": ["nonsense"]}, r"ports\[0\]"),
    ({"reference": "autoneg=maybe"}, r"reference: 'autoneg=maybe' is not a setting of the sweep"),
    ({"cycle": ["pp", "xx"]}, r"cycle\[1\]: unknown phase 'xx'"),
    ({"sweeps": {"fec": ["rs"]}}, r"sweeps"),
    ({"sweep": {"priv_flags": {"rx_cqe_compress": []}}}, r"priv_flags"),
]


@pytest.mark.parametrize(("change", "message"), BAD)
def test_bad_specs_are_one_line_with_file_and_line(
    tmp_path: Path, change: dict[str, object], message: str
) -> None:
    with pytest.raises(InputError) as caught:
        _compile(tmp_path, _spec(**change))
    text = str(caught.value)
    assert "\n" not in text and text.startswith(str(tmp_path / "t.yaml"))
    assert pytest.importorskip("re").search(message, text), text


def test_fuzzed_specs_are_each_one_line_never_a_traceback(tmp_path: Path) -> None:
    rng = random.Random(40)
    base = _spec()
    junk: list[object] = [None, -1, 0, 1.5, "x", [], {}, [None], {"a": 1}, True, "on", [["x"]], 10**30]
    keys = [
        *base,
        "sweep.autoneg",
        "sweep.fec",
        "sweep.link_modes",
        "sweep.speed_mbps",
        "sweep.priv_flags",
        "grid.fraction",
    ]
    said: list[tuple[str, str]] = []
    for i in range(60):
        data = yaml.safe_load(yaml.safe_dump(base))
        for _ in range(rng.randint(1, 3)):
            key = rng.choice(keys)
            value = rng.choice(junk)
            if "." in key:
                outer, inner = key.split(".")
                if not isinstance(data.get(outer), dict):
                    data[outer] = {}
                data[outer][inner] = value
            else:
                data[key] = value
        try:
            _compile(tmp_path, data, f"f{i}.yaml")
        except InputError as e:
            said.append((str(e), str(tmp_path / f"f{i}.yaml")))
    assert said  # most mutations are refused
    for text, file in said:
        assert "\n" not in text and text.startswith(file), text


def test_labels_are_the_shared_types_labels() -> None:
    assert LinkSettings(autoneg=False, fec="rs").label == "autoneg=off,fec=rs"
