"""Workload-static circuit plans (labctl.plans) and `labctl plan`: graph metrics against brute force, every
plan's per-OCS matchings, the EP divergent rings up to the G(2G+1) bound, and the command line."""

from __future__ import annotations

import json
import math
import sys
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from labctl.core.errors import InputError
from labctl.inventory.mapping import Mapping, PortSpace, validate_mapping
from labctl.inventory.schema import Inventory, load_inventory
from labctl.inventory.topology import peers_of
from labctl.plans.ep import full_coverage_bound, plan_ep_rings, walecki_rings
from labctl.plans.graphs import (
    Graph,
    block_fold,
    budget_offsets,
    circulant,
    folded_cube,
    hamming,
    hypercube,
    port_cost,
    ring,
    round_robin,
)
from labctl.plans.layout import (
    SwitchPlan,
    abstract_ep,
    abstract_static,
    inventory_ep,
    inventory_static,
    rail_accelerators,
    rail_share,
)
from labctl.plans.matchings import StaticPlan, check_budget, decompose, misra_gries
from labctl.plans.metrics import measure
from tests.conftest import REPO

# --- independent references -------------------------------------------------------------------------------


def brute_diameter(n: int, edges: list[tuple[int, int]]) -> int | None:
    """Plain BFS from every node: the reference the vectorized metrics are checked against."""
    adj: list[set[int]] = [set() for _ in range(n)]
    for u, v in edges:
        adj[u].add(v)
        adj[v].add(u)
    worst = 0
    for s in range(n):
        dist = {s: 0}
        queue = deque([s])
        while queue:
            x = queue.popleft()
            for y in adj[x]:
                if y not in dist:
                    dist[y] = dist[x] + 1
                    queue.append(y)
        if len(dist) < n:
            return None
        worst = max(worst, max(dist.values()))
    return worst


def brute_circulant_edges(n: int, offsets: list[int]) -> set[tuple[int, int]]:
    return {(min(i, (i + s) % n), max(i, (i + s) % n)) for i in range(n) for s in offsets}


def assert_valid_plan(plan: StaticPlan) -> None:
    """Each OCS's circuits are a matching; together they are the graph's edges, each once; and the switch
    mappings they become are valid matchings on their switches, each circuit both ways."""
    graph_edges = sorted(map(tuple, plan.graph.edges.tolist()))
    got: list[tuple[int, int]] = []
    for m in plan.matchings:
        nodes = m.edges.ravel().tolist()
        assert len(nodes) == len(set(nodes)), m.label
        got.extend(map(tuple, m.edges.tolist()))
    assert sorted(got) == graph_edges
    assert len(set(graph_edges)) == len(graph_edges)
    n = plan.graph.n
    for k, sp in enumerate(abstract_static(plan)):
        assert sp.switch == f"ocs{k}" and sp.space == PortSpace(n, n)
        validate_mapping(sp.mapping, sp.space, switch=sp.switch)
        pairs = {(i - 1, e - n - 1) for i, e in sp.mapping}
        assert pairs == {p for u, v in plan.matchings[k].edges.tolist() for p in ((u, v), (v, u))}


# --- graphs and metrics -------------------------------------------------------------------------------


def test_q5_3_2_is_k8_box_k4_with_degree_10_and_diameter_2() -> None:
    graph = block_fold([3, 2])
    metrics = measure(graph)
    assert graph.n == 32 and "K8□K4" in graph.name
    assert (metrics.degree_min, metrics.degree_max, metrics.diameter) == (10, 10, 2)
    assert measure(graph, exhaustive=True).diameter == 2
    # the same edge set as the Hamming product K8 □ K4 (mixed radix: high 3 bits, low 2 bits)
    assert sorted(map(tuple, graph.edges.tolist())) == sorted(map(tuple, hamming([8, 4]).edges.tolist()))
    plan = decompose(graph)
    assert plan.ports_needed == 10 and plan.methods == ["generator"]
    assert_valid_plan(plan)


@pytest.mark.parametrize("dim", range(1, 9))
def test_hypercube_has_degree_d_and_diameter_d_and_one_ocs_per_dimension(dim: int) -> None:
    graph = hypercube(dim)
    metrics = measure(graph)
    assert (metrics.degree_min, metrics.degree_max, metrics.diameter) == (dim, dim, dim)
    plan = decompose(graph)
    assert plan.ports_needed == dim
    for i, m in enumerate(plan.matchings):  # dimension i → OCS i: every circuit flips bit i
        assert set((m.edges[:, 0] ^ m.edges[:, 1]).tolist()) == {1 << i}
    assert_valid_plan(plan)


@pytest.mark.parametrize("dim", range(2, 10))
def test_folded_cube_has_degree_d_plus_1_and_diameter_half_d(dim: int) -> None:
    metrics = measure(folded_cube(dim))
    assert (metrics.degree_min, metrics.degree_max) == (dim + 1, dim + 1)
    assert metrics.diameter == math.ceil(dim / 2)


def test_the_decode_papers_table_4_topologies() -> None:
    """(degree, diameter) as Table 4 lists them: Q3 (3,3), FQ3 (4,2), Q4 (4,4), Q4+1100 (5,3),
    Q4+1111 (5,2); and Table 6's folds: Q6[3,3] degree 14, Q4[2,2] degree 6, Q4[3,1] degree 8."""
    cases = {
        "Q3": (hypercube(3), 3, 3),
        "FQ3": (folded_cube(3), 4, 2),
        "Q4": (hypercube(4), 4, 4),
        "Q4+1100": (hypercube(4, [0b1100]), 5, 3),
        "Q4+1111": (hypercube(4, [0b1111]), 5, 2),
        "Q6[3,3]": (block_fold([3, 3]), 14, 2),
        "Q4[2,2]": (block_fold([2, 2]), 6, 2),
        "Q4[3,1]": (block_fold([3, 1]), 8, 2),
    }
    for name, (graph, degree, diam) in cases.items():
        metrics = measure(graph)
        assert (metrics.degree_max, metrics.diameter) == (degree, diam), name


@settings(max_examples=150, deadline=None, derandomize=True)
@given(st.integers(2, 40), st.data())
def test_circulant_metrics_match_brute_force(n: int, data: st.DataObject) -> None:
    offsets = data.draw(st.lists(st.integers(1, n // 2), min_size=1, max_size=4, unique=True))
    graph = circulant(n, offsets)
    reference = brute_circulant_edges(n, offsets)
    assert set(map(tuple, graph.edges.tolist())) == reference and graph.n_edges == len(reference)
    metrics = measure(graph)
    degrees = [sum(1 for e in reference if v in e) for v in range(n)]
    assert (metrics.degree_min, metrics.degree_max) == (min(degrees), max(degrees))
    assert metrics.diameter == brute_diameter(n, sorted(reference))
    assert measure(graph, exhaustive=True).diameter == metrics.diameter  # the one-BFS shortcut holds
    assert metrics.pairs_adjacent == len(reference) and metrics.pairs_total == n * (n - 1) // 2


def test_a_disconnected_circulant_has_no_diameter() -> None:
    assert measure(circulant(12, [3])).diameter is None  # gcd 3: three separate 4-cycles


def test_ring_hamming_and_round_robin() -> None:
    assert measure(ring(9)).diameter == 4 and decompose(ring(9)).ports_needed == 3  # odd: Δ + 1
    assert decompose(ring(10)).ports_needed == 2
    for s in range(1, 12):
        rounds = round_robin(s)
        assert len(rounds) == (s - 1 if s % 2 == 0 else s) or s == 1
        flat = [p for r in rounds for p in r]
        assert sorted(flat) == [(a, b) for a in range(s) for b in range(a + 1, s)]
        for r in rounds:
            nodes = [x for p in r for x in p]
            assert len(nodes) == len(set(nodes))
    metrics = measure(hamming([8, 8, 9]))
    assert (metrics.nodes, metrics.degree_max, metrics.diameter) == (576, 22, 3)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: block_fold([0, 2]), "at least one bit"),
        (lambda: block_fold([7, 6]), "at most 12"),
        (lambda: hypercube(4, [0b10000]), "not a nonzero 4-bit mask"),
        (lambda: hypercube(3, [0b001]), "given twice"),
        (lambda: folded_cube(1), "dim ≥ 2"),
        (lambda: circulant(10, [6]), "not in 1..5"),
        (lambda: circulant(10, []), "at least one offset"),
        (lambda: hamming([64, 65]), "at most 4096"),
    ],
)
def test_bad_parameters_are_one_line_input_errors(build: object, message: str) -> None:
    with pytest.raises(InputError, match=message) as info:
        build()  # type: ignore[operator]
    assert "\n" not in str(info.value)


# --- per-OCS matchings -------------------------------------------------------------------------------------


@st.composite
def small_graphs(draw: st.DrawFn) -> Graph:
    kind = draw(st.sampled_from(["cube", "folded", "fold", "hamming", "circulant", "ring", "cube+"]))
    if kind == "cube":
        return hypercube(draw(st.integers(1, 7)))
    if kind == "folded":
        return folded_cube(draw(st.integers(2, 7)))
    if kind == "fold":
        return block_fold(draw(st.lists(st.integers(1, 3), min_size=1, max_size=3)))
    if kind == "hamming":
        return hamming(draw(st.lists(st.integers(1, 7), min_size=1, max_size=3)))
    if kind == "ring":
        return ring(draw(st.integers(2, 40)))
    if kind == "cube+":
        dim = draw(st.integers(2, 6))
        folds = draw(st.lists(st.integers(1, (1 << dim) - 1), max_size=3, unique=True))
        return hypercube(dim, [g for g in folds if g & (g - 1)])  # unit masks are already there
    n = draw(st.integers(2, 48))
    return circulant(n, draw(st.lists(st.integers(1, n // 2), min_size=1, max_size=5, unique=True)))


@settings(max_examples=200, deadline=None, derandomize=True)
@given(small_graphs())
def test_every_plan_is_a_valid_matching_per_ocs(graph: Graph) -> None:
    plan = decompose(graph)
    assert_valid_plan(plan)
    degree = measure(graph).degree_max
    assert degree <= plan.ports_needed <= degree + 1  # Vizing: no plan needs more than Δ + 1 OCSes


@settings(max_examples=150, deadline=None, derandomize=True)
@given(st.integers(2, 24), st.floats(0.05, 1.0), st.randoms(use_true_random=False))
def test_misra_gries_colours_any_graph_with_at_most_delta_plus_one(n: int, p: float, rnd: object) -> None:
    edges = np.array(
        [(u, v) for u in range(n) for v in range(u + 1, n) if rnd.random() < p],  # type: ignore[attr-defined]
        dtype=np.int64,
    ).reshape(-1, 2)
    colours = misra_gries(n, edges)
    if len(edges) == 0:
        assert colours == []
        return
    delta = int(np.bincount(edges.ravel(), minlength=n).max())
    assert len(colours) <= delta + 1
    flat = sorted(map(tuple, np.vstack(colours).tolist()))
    assert flat == sorted(map(tuple, edges.tolist()))
    for c in colours:
        assert len(np.unique(c.ravel())) == c.size


def test_port_budget() -> None:
    plan = decompose(block_fold([3, 2]))
    check_budget(plan, 10)
    check_budget(plan, None)
    with pytest.raises(InputError, match=r"needs 10 ports per accelerator .* budget is 9"):
        check_budget(plan, 9)
    for n, ports in ((576, 36), (64, 7), (15, 4), (12, 5), (2, 1)):
        offsets = budget_offsets(n, ports)
        assert sum(port_cost(n, s) for s in offsets) <= ports
        budget_plan = decompose(circulant(n, offsets))
        check_budget(budget_plan, ports)
        assert_valid_plan(budget_plan)
    big = measure(circulant(576, budget_offsets(576, 36)))
    assert big.degree_max == 36 and big.diameter is not None and big.diameter <= 3


# --- EP divergent rings ---------------------------------------------------------------------------------------


def assert_rings_are_consistent(plan_rails: int, experts: int) -> None:
    plan = plan_ep_rings(experts, plan_rails)
    m = plan.domains
    covered: set[tuple[int, int]] = set()
    links = np.zeros((m, m), dtype=np.int64)
    for r in range(plan_rails):
        assert sorted(plan.rings[r].tolist()) == list(range(m))  # a ring visits every domain once
        new = {(min(a, b), max(a, b)) for a, b in plan.ring_edges(r)} - covered
        assert plan.new_pairs[r] == len(new)
        covered |= new
        for a, b in plan.ring_edges(r):
            links[a, b] += 1
            links[b, a] += 1
    assert plan.covered_pairs == len(covered)
    assert np.array_equal(plan.multiplicity, links)


@pytest.mark.parametrize("rails", range(1, 13))
def test_ep_rings_cover_every_pair_for_every_group_up_to_the_bound(rails: int) -> None:
    for domains in range(1, 2 * rails + 2):
        plan = plan_ep_rings(rails * domains, rails)
        assert plan.complete, (rails, domains, plan.covered_pairs, plan.total_pairs)
        assert plan.rails_used == (domains - 1) // 2 if domains % 2 else domains // 2
    assert_rings_are_consistent(rails, full_coverage_bound(rails))


def test_ep_rings_cover_every_pair_at_the_bound_for_g_up_to_72() -> None:
    for rails in range(13, 73):
        plan = plan_ep_rings(full_coverage_bound(rails), rails)
        assert plan.complete and plan.rails_used == rails and plan.pair_links() == (1, 1), rails


def test_nvl72_ep_group_of_10440_gpus() -> None:
    plan = plan_ep_rings(10_440, 72)
    assert (plan.domains, plan.covered_pairs, plan.total_pairs, plan.rails_used) == (145, 10_440, 10_440, 72)
    assert_rings_are_consistent(72, 10_440)
    switches = abstract_ep(plan)
    assert len(switches) == 72 and all(sp.circuits == 145 for sp in switches)
    for sp in switches:
        validate_mapping(sp.mapping, sp.space, switch=sp.switch)


def test_ep_rings_above_the_bound_cover_what_g_rings_can() -> None:
    plan = plan_ep_rings(72 * 147, 72)  # m = 147 > 2G + 1
    assert not plan.complete
    assert plan.covered_pairs == 72 * 147 < plan.total_pairs  # G edge-disjoint rings: the most possible
    small = plan_ep_rings(2 * 7, 2)  # G = 2, m = 7 > 5
    assert (small.covered_pairs, small.total_pairs) == (14, 21)


def test_spare_rails_spread_parallel_links_evenly() -> None:
    plan = plan_ep_rings(72 * 9, 72)  # 9 domains: 4 rails cover all, 68 add parallel links
    assert plan.complete and plan.rails_used == 4
    low, high = plan.pair_links()
    assert high - low <= 1 and low == 72 * 9 // 36


def test_spare_rails_keep_every_pair_within_one_link_for_odd_domain_counts() -> None:
    for rails in range(1, 21):
        for domains in range(3, 2 * rails + 2, 2):
            low, high = plan_ep_rings(rails * domains, rails).pair_links()
            assert high - low <= 1, (rails, domains, low, high)


def test_walecki_rings_decompose_odd_complete_graphs() -> None:
    for m in (3, 5, 7, 145):
        pairs = [
            (min(a, b), max(a, b))
            for r in walecki_rings(m).tolist()
            for a, b in zip(r, r[1:] + r[:1], strict=True)
        ]
        assert sorted(pairs) == [(a, b) for a in range(m) for b in range(a + 1, m)]


@pytest.mark.parametrize(
    ("experts", "rails", "message"),
    [(100, 7, "not a positive multiple"), (5, 10, "not a positive multiple"), (8, 0, "expected 1..")],
)
def test_ep_bad_sizes_are_input_errors(experts: int, rails: int, message: str) -> None:
    with pytest.raises(InputError, match=message):
        plan_ep_rings(experts, rails)


# --- onto an inventory --------------------------------------------------------------------------------------


def test_ep_rings_on_the_opus_testbed_inventory_realise_each_rails_ring(inventory_path: Path) -> None:
    inventory = load_inventory(inventory_path)
    plan = plan_ep_rings(8, 2)  # 4 hosts = domains, 2 rails
    assert plan.complete
    (switch,) = inventory_ep(plan, inventory)
    validate_mapping(switch.mapping, inventory.switches["ocs1"].space, switch="ocs1")
    hosts = inventory.hosts
    for r, rail in enumerate(inventory.rails):
        peers = peers_of(inventory, rail, switch.mapping)
        neighbours: dict[str, set[str]] = {p.host: set() for p in peers}
        for port, peer in peers.items():
            assert peer is not None
            neighbours[port.host].add(peer.host)
        for a, b in plan.ring_edges(r):
            assert hosts[b] in neighbours[hosts[a]] and hosts[a] in neighbours[hosts[b]]


def circuits_by_rail(inventory: Inventory, mapping: Mapping) -> dict[int, set[tuple[str, str]]]:
    """Rail → the accelerator pairs (GPU names) its circuits join; fails on a patch that leaves its rail or
    joins two different port indices."""
    ports = {(p.switch, p.tx): p for p in inventory.ports}
    by_rx = {(p.switch, p.rx): p for p in inventory.ports}
    index = {
        p: k for accs in rail_accelerators(inventory).values() for a in accs for k, p in enumerate(a.ports)
    }
    out: dict[int, set[tuple[str, str]]] = {}
    for ingress, egress in mapping:
        a, b = ports[("ocs1", ingress)], by_rx[("ocs1", egress)]
        assert a.rail == b.rail, f"{a.label} (rail {a.rail}) → {b.label} (rail {b.rail}) leaves its rail"
        assert index[a] == index[b]  # matching k joins port k at both ends
        names = sorted((f"{a.host}/gpu{a.gpu}", f"{b.host}/gpu{b.gpu}"))
        out.setdefault(a.rail, set()).add((names[0], names[1]))
    return out


def ring_pairs(names: list[str]) -> set[tuple[str, str]]:
    return {(min(a, b), max(a, b)) for a, b in zip(names, names[1:] + names[:1], strict=True) if a != b}


def test_a_ring_of_8_on_the_testbed_is_one_ring_per_rail_over_all_four_hosts(inventory_path: Path) -> None:
    """Issue 24: `ring -n 8 -i inventory.yaml` joined h1/gpu0's rail-0 port to h1/gpu1's rail-1 port
    (one C8 over the GPUs in host order); now each rail carries a C4 over every host's GPU on that rail."""
    inventory = load_inventory(inventory_path)
    rails, per_rail = rail_share(inventory, 8)
    assert (rails, per_rail) == ((0, 1), 4)
    plan = decompose(ring(per_rail))
    (switch,) = inventory_static(plan, inventory, "gpu", rails)
    validate_mapping(switch.mapping, inventory.switches["ocs1"].space, switch="ocs1")
    assert len(switch.mapping) == 16 and switch.circuits == 8
    assert circuits_by_rail(inventory, switch.mapping) == {
        0: ring_pairs(["h1/gpu0", "h2/gpu0", "h3/gpu0", "h4/gpu0"]),
        1: ring_pairs(["h1/gpu1", "h2/gpu1", "h3/gpu1", "h4/gpu1"]),
    }
    for rail in (0, 1):  # every port of every host on the rail hears a peer on the same rail
        peers = peers_of(inventory, rail, switch.mapping)
        assert all(peer is not None and peer.rail == rail for peer in peers.values())
        assert {p.host for p in peers} == {"h1", "h2", "h3", "h4"}


def test_a_plan_that_fits_one_rail_spans_every_host_of_that_rail(inventory_path: Path) -> None:
    """`ring -n 4` used h1 and h2 only (their two GPUs each, across rails); now it is rail 0's four GPUs."""
    inventory = load_inventory(inventory_path)
    assert rail_share(inventory, 4) == ((0,), 4)
    (switch,) = inventory_static(decompose(ring(4)), inventory)  # default: the first rail that holds it
    assert circuits_by_rail(inventory, switch.mapping) == {
        0: ring_pairs(["h1/gpu0", "h2/gpu0", "h3/gpu0", "h4/gpu0"])
    }
    assert set(switch.scope) == {q for p in inventory.ports if p.rail == 0 for q in (p.tx, p.rx)}


REFUSED = {
    3: "ports per accelerator on its rail",
    5: "do not split evenly",
    6: "ports per accelerator on its rail",
    7: "do not split evenly",
    9: "the inventory has 8",
    12: "the inventory has 8",
}


@pytest.mark.parametrize("total", range(2, 13))
def test_any_count_is_laid_within_rails_over_the_first_hosts_or_refused_in_one_line(
    inventory_path: Path, total: int
) -> None:
    inventory = load_inventory(inventory_path)

    def lay() -> tuple[tuple[int, ...], int, list[SwitchPlan]]:
        rails, per_rail = rail_share(inventory, total, what=f"-n {total}")
        return rails, per_rail, list(inventory_static(decompose(ring(per_rail)), inventory, "gpu", rails))

    if total in REFUSED or total > 8:
        with pytest.raises(InputError, match=REFUSED.get(total, "the inventory has 8")) as info:
            lay()
        assert "\n" not in str(info.value) and str(info.value).startswith(str(inventory_path))
        return
    rails, per_rail, switch_plans = lay()
    assert per_rail * len(rails) == total
    (switch,) = switch_plans
    got = circuits_by_rail(inventory, switch.mapping)
    assert sorted(got) == list(rails)
    for rail in rails:
        hosts = [f"h{i + 1}/gpu{rail}" for i in range(per_rail)]
        assert got[rail] == ring_pairs(hosts)  # every host asked for, in inventory order


def test_rail_share_takes_the_fewest_rails_and_says_why_it_cannot(inventory_path: Path) -> None:
    inventory = load_inventory(inventory_path)
    assert rail_share(inventory, 2) == ((0,), 2)
    assert rail_share(inventory, 6) == ((0, 1), 3)
    assert rail_share(inventory, 8, "host") == ((0, 1), 4)
    with pytest.raises(InputError, match=r"needs 16 accelerators; the inventory has 8 \(one per GPU on each"):
        rail_share(inventory, 16)
    with pytest.raises(
        InputError, match=r"5 accelerators do not split evenly .* counts that do: 2, 3, 4, 6, 8$"
    ):
        rail_share(inventory, 5)
    with pytest.raises(InputError, match=r"Q3 needs 8 accelerators on one rail .* rail 0, has 4"):
        rail_share(inventory, 8, split=False, what="Q3")
    with pytest.raises(InputError, match=r"Q3 needs 8 accelerators on one rail"):
        inventory_static(decompose(hypercube(3)), inventory)
    with pytest.raises(
        InputError, match=r"needs 3 ports per accelerator on its rail .* h1/gpu0 on rail 0 has 2"
    ):
        inventory_static(decompose(ring(3)), inventory)
    with pytest.raises(InputError, match=r"needs 8 accelerators on rail 1; it has 4"):
        inventory_static(decompose(ring(8)), inventory, "gpu", [1])


def test_a_gpu_with_ports_on_two_rails_is_an_accelerator_on_each(tmp_path: Path) -> None:
    """One NIC port per rail per GPU (the other common cabling): each rail still gets its own ring, and the
    GPU's rail-0 port is never patched to a rail-1 port."""
    lines = ["lab: two-rail-ports", "switches:", "  ocs1: {driver: sim, size: 16x16}", "hosts:"]
    for h in range(4):
        lines += [f"  h{h + 1}:", "    gpus: [{index: 0, model: L40}]", "    nics:"]
        for rail in (0, 1):
            for k in (0, 1):
                tx = 1 + 8 * rail + 2 * h + k
                lines.append(
                    f"      - {{ifname: r{rail}p{k}, rail: {rail}, gpu: 0, switch: ocs1, tx: {tx}, "
                    f"rx: {tx + 16}, gbps: 100}}"
                )
    path = tmp_path / "inventory.yaml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    inventory = load_inventory(path)
    by_rail = rail_accelerators(inventory)
    assert [a.name for a in by_rail[0]] == [a.name for a in by_rail[1]] == [f"h{h}/gpu0" for h in range(1, 5)]
    assert all(p.rail == a.rail for accs in by_rail.values() for a in accs for p in a.ports)
    rails, per_rail = rail_share(inventory, 8)
    (switch,) = inventory_static(decompose(ring(per_rail)), inventory, "gpu", rails)
    by_tx = {p.tx: p for p in inventory.ports}
    by_rx = {p.rx: p for p in inventory.ports}
    assert len(switch.mapping) == 16
    for ingress, egress in switch.mapping:
        assert by_tx[ingress].rail == by_rx[egress].rail
        assert by_tx[ingress].ifname[-1] == by_rx[egress].ifname[-1]  # port k ↔ port k


# --- the command line ------------------------------------------------------------------------------------------


def invoke(*args: str) -> dict[str, object]:
    from labctl.cli import app

    result = CliRunner().invoke(app, ["plan", *args, "--json"])
    assert result.exit_code == 0, (result.output, result.exception)
    data: dict[str, object] = json.loads(result.stdout)
    return data


def test_cli_fold_reports_degree_diameter_and_matchings() -> None:
    data = invoke("fold", "--dims", "3,2")
    assert data["degree"] == {"min": 10, "max": 10} and data["diameter"] == 2
    assert data["ports_needed"] == 10 and len(data["switches"]) == 10  # type: ignore[arg-type]
    assert data["pairs"] == {"adjacent": 160, "total": 496, "coverage": 160 / 496}


def test_cli_text_output_and_help() -> None:
    from labctl.cli import app

    runner = CliRunner()
    text = runner.invoke(app, ["plan", "fold", "--dims", "3,2"], env={"COLUMNS": "200"}).output
    assert "Q5[3,2] = K8□K4: 32 accelerators, degree 10, diameter 2" in text
    assert "OCS matchings: 10" in text
    helptext = runner.invoke(app, ["plan", "--help"], env={"COLUMNS": "200"}).output
    for command in ("hypercube", "folded-cube", "fold", "hamming", "circulant", "ring", "ep-rings"):
        assert command in helptext
    assert "G(2G+1)" in runner.invoke(app, ["plan", "ep-rings", "--help"], env={"COLUMNS": "200"}).output
    fold_help = runner.invoke(app, ["plan", "fold", "--help"], env={"COLUMNS": "200"}).output
    assert "Q_n[a,b,…] = K_2^a □ K_2^b" in fold_help  # rich would read [a,b,…] as markup


def test_cli_other_plans() -> None:
    cube = invoke("hypercube", "--dim", "5")
    assert (cube["diameter"], cube["ports_needed"]) == (5, 5)
    assert invoke("hypercube", "--dim", "4", "--fold", "1111")["diameter"] == 2
    assert invoke("folded-cube", "--dim", "6")["diameter"] == 3
    circ = invoke("circulant", "-n", "16", "--offsets", "1,4")
    assert (circ["diameter"], circ["ports_needed"]) == (3, 4)
    budget = invoke("circulant", "-n", "64", "--ports", "7")
    assert budget["ports_needed"] <= 7  # type: ignore[operator]
    assert invoke("hamming", "--sizes", "4,4")["diameter"] == 2
    assert invoke("ring", "-n", "8")["diameter"] == 4


def test_cli_ep_rings() -> None:
    data = invoke("ep-rings", "-E", "10440", "-G", "72")
    assert data["pairs"] == {"covered": 10440, "total": 10440, "complete": True}
    assert data["rails_used"] == 72 and len(data["switches"]) == 72  # type: ignore[arg-type]
    on_lab = invoke("ep-rings", "-i", str(REPO / "inventory.yaml"))
    assert (on_lab["experts"], on_lab["rails"], on_lab["domains"]) == (8, 2, 4)


@pytest.mark.parametrize(
    ("nodes", "rails"),
    [(8, {0: ["h1", "h2", "h3", "h4"], 1: ["h1", "h2", "h3", "h4"]}), (4, {0: ["h1", "h2", "h3", "h4"]})],
)
def test_cli_ring_on_the_inventory_stays_within_rails_and_uses_every_host(
    inventory_path: Path, nodes: int, rails: dict[int, list[str]]
) -> None:
    """Issue 24's done-when: `labctl plan ring -n 8 -i inventory.yaml` is one ring per rail over all four
    hosts (it was one C8 patching h1's rail-0 port to its own rail-1 port, `1→41` for -n 4)."""
    inventory = load_inventory(inventory_path)
    data = invoke("ring", "-n", str(nodes), "-i", str(inventory_path))
    switches: list[dict[str, Any]] = data["switches"]  # type: ignore[assignment]
    (switch,) = switches
    by_tx = {p.tx: p for p in inventory.ports}
    by_rx = {p.rx: p for p in inventory.ports}
    hosts: dict[int, set[str]] = {}
    for ingress, egress in switch["patches"]:
        a, b = by_tx[ingress], by_rx[egress]
        assert a.rail == b.rail, (
            f"{ingress}→{egress}: {a.label} on rail {a.rail} to {b.label} on rail {b.rail}"
        )
        assert a.host != b.host
        hosts.setdefault(a.rail, set()).update((a.host, b.host))
    assert {r: sorted(h) for r, h in hosts.items()} == rails
    assert data["accelerators"] == nodes and len(switch["patches"]) == 2 * nodes


def test_cli_out_writes_files_labctl_ocs_apply_reads(tmp_path: Path, inventory_path: Path) -> None:
    from labctl.cli.ocs import load_mapping_file

    inventory = load_inventory(inventory_path)
    target = tmp_path / "ring.yaml"
    data = invoke("ring", "-n", "8", "-i", str(inventory_path), "--out", str(target))
    assert data["files"] == [{"switch": "ocs1", "file": str(target)}]
    patches, scope = load_mapping_file(target)
    mapping = validate_mapping(patches, inventory.switches["ocs1"].space, switch="ocs1")
    assert len(mapping) == 16 and scope is not None and set(scope) >= {p for pair in mapping for p in pair}
    several = invoke("fold", "--dims", "1,1", "--out", str(tmp_path / "fold.yaml"))
    files = [Path(f["file"]) for f in several["files"]]  # type: ignore[attr-defined]
    assert [f.name for f in files] == ["fold.ocs0.yaml", "fold.ocs1.yaml"]
    for f in files:
        patches, _ = load_mapping_file(f)
        validate_mapping(patches, PortSpace(4, 4))


def run_main(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str
) -> tuple[int, str]:
    from labctl import cli

    monkeypatch.setattr(sys, "argv", ["labctl", "plan", *args])
    with pytest.raises(SystemExit) as info:
        cli.main()
    code = info.value.code
    return int(code) if isinstance(code, int) else -1, capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("fold", "--dims", "3,x"), "comma-separated integers"),
        (("fold", "--dims", "3,2", "--ports", "8"), "budget is 8"),
        (("hypercube", "--dim", "13"), "--dim"),
        (
            ("hypercube", "--dim", "3", "-i", str(REPO / "inventory.yaml")),
            "Q3 needs 8 accelerators on one rail",
        ),
        (
            ("hypercube", "--dim", "2", "--fold", "11", "-i", str(REPO / "inventory.yaml")),
            "h1/gpu0 on rail 0 has 2",
        ),
        (("ring", "-n", "6", "-i", str(REPO / "inventory.yaml")), "ring C3 needs 3 ports per accelerator"),
        (("ring", "-n", "5", "-i", str(REPO / "inventory.yaml")), "do not split evenly"),
        (("ring", "-n", "16", "-i", str(REPO / "inventory.yaml")), "the inventory has 8"),
        (
            ("circulant", "-n", "8", "--offsets", "3", "-i", str(REPO / "inventory.yaml")),
            "4 on each of rails 0, 1",
        ),
        (("ep-rings", "-E", "100", "-G", "7"), "not a positive multiple"),
        (("ep-rings", "-E", "10584", "-G", "72"), "above G(2G+1) = 10440"),
        (("ep-rings",), "give -E GPUS and -G RAILS"),
        (("circulant", "-n", "16"), "give --offsets"),
    ],
)
def test_cli_bad_input_is_one_line_and_exit_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], args: tuple[str, ...], needle: str
) -> None:
    code, stderr = run_main(monkeypatch, capsys, *args)
    assert code == 2, stderr
    assert stderr.count("\n") == 1 and needle in stderr and "Traceback" not in stderr, stderr


def test_cli_partial_accepts_a_plan_above_the_bound(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from labctl import cli

    monkeypatch.setattr(sys, "argv", ["labctl", "plan", "ep-rings", "-E", "14", "-G", "2", "--partial"])
    cli.main()  # no SystemExit: exit code 0
    assert "14 of 21" in capsys.readouterr().out
