"""Experiment files and mapping generators: unknown fields are errors; pairs and rings use both NIC ports."""

from __future__ import annotations

from pathlib import Path

import pytest

from labctl.core.errors import InputError
from labctl.inventory.mapping import validate_mapping
from labctl.inventory.schema import load_inventory
from labctl.inventory.topology import peers_of, ring_links
from labctl.run.experiment import build_plan, load_experiment

BASE = """\
name: t
phases:
  dp: {pairs: [[h1, h2], [h3, h4]]}
  pp: {pairs: [[h1, h3], [h2, h4]]}
baseline: dp
cycle: [pp, dp]
"""


def plan_of(tmp_path: Path, text: str, inventory_path: Path):  # type: ignore[no-untyped-def]
    path = tmp_path / "exp.yaml"
    path.write_text(text)
    spec, src = load_experiment(path)
    return build_plan(spec, load_inventory(inventory_path), src)


def test_reconfig_timeline_experiment(experiment_path: Path, inventory_path: Path) -> None:
    spec, src = load_experiment(experiment_path)
    plan = build_plan(spec, load_inventory(inventory_path), src)
    assert len(plan.steps) == 8  # 4 switches per step, 2 steps
    assert plan.rails == (0, 1)
    inv = load_inventory(inventory_path)
    for phase in ("dp", "pp"):
        for rail, rp in plan.phases[phase].items():
            assert len(rp.mapping) == 8  # 4 links x 2 patches on each rail
            peers = peers_of(inv, rail, rp.mapping)
            assert all(peer is not None for peer in peers.values())  # every port used: full bandwidth
            assert all(peers[peer] == port for port, peer in peers.items() if peer)  # duplex
    dp = peers_of(inv, 0, plan.phases["dp"][0].mapping)
    by_label = {p.label: q.label for p, q in dp.items() if q}
    assert by_label["h1/ens1f0np0"] == "h2/ens1f0np0" and by_label["h1/ens1f1np1"] == "h2/ens1f1np1"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (BASE + "colour: red\n", "exp.yaml:7: colour: unknown field"),
        (BASE.replace("cycle: [pp, dp]", "cycle: [pp, xx]"), "exp.yaml:6: cycle[1]: unknown phase 'xx'"),
        (BASE.replace("baseline: dp", "baseline: zz"), "exp.yaml:5: baseline: unknown phase 'zz'"),
        (BASE.replace("[h3, h4]]}", "[h3, h9]]}", 1), "exp.yaml:3: phases.dp.pairs: unknown host 'h9'"),
        (BASE.replace("[[h1, h3], [h2, h4]]", "[[h1, h3], [h1, h4]]"), "host 'h1' appears more than once"),
        (
            BASE.replace("{pairs: [[h1, h2], [h3, h4]]}", "{pairs: [[h1, h2]], ring: [h1, h2]}"),
            "exactly one of 'pairs' or 'ring'",
        ),
        (BASE + "rails: [0, 5]\n", "rails[1]: rail 5 is not in the inventory"),
        (BASE + "repeat: 0\n", "repeat: Input should be greater than or equal to 1"),
        (BASE.replace("[[h1, h2], [h3, h4]]", "[[h1, h2, h3]]"), "a pair needs exactly two hosts"),
        (BASE.replace("name: t", 'name: "../../etc"'), "exp.yaml:1: name: use letters, digits"),
        (BASE.replace("name: t", "name: .hidden"), "name: use letters, digits"),
    ],
)
def test_bad_experiment_is_one_line(tmp_path: Path, inventory_path: Path, text: str, expected: str) -> None:
    with pytest.raises(InputError) as info:
        plan_of(tmp_path, text, inventory_path)
    assert expected in str(info.value)
    assert "\n" not in str(info.value)


def test_ring_uses_port1_to_next_hosts_port0(tmp_path: Path, inventory_path: Path) -> None:
    inv = load_inventory(inventory_path)
    links = ring_links(inv, 1, ["h1", "h2", "h3", "h4"], "ring")
    assert [(link.a.label, link.b.label) for link in links] == [
        ("h1/ens2f1np1", "h2/ens2f0np0"),
        ("h2/ens2f1np1", "h3/ens2f0np0"),
        ("h3/ens2f1np1", "h4/ens2f0np0"),
        ("h4/ens2f1np1", "h1/ens2f0np0"),
    ]
    validate_mapping([p for link in links for p in link.patches()], inv.switches["ocs1"].space)
    plan = plan_of(
        tmp_path, BASE.replace("{pairs: [[h1, h3], [h2, h4]]}", "{ring: [h1, h2, h3, h4]}"), inventory_path
    )
    assert len(plan.phases["pp"][0].mapping) == 8
    with pytest.raises(InputError, match="a ring needs at least two hosts"):
        ring_links(inv, 0, ["h1"], "ring")
