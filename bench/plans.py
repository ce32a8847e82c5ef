"""Workload-static circuit plans (issue 16): the EP divergent-ring planner and a 576-accelerator static plan.

    python bench/plans.py [--repeat 3]

- EP divergent rings (Opus §4) for E = 10,440 GPUs, G = 72 rails (NVL72 domains, m = 145, the bound
  G(2G+1)): labctl.plans.ep.plan_ep_rings (greedy over Walecki's decomposition and the step rings), then
  laid out as one 290x290 mapping per rail and each validated as a matching. Against the peer a reader
  would write first: a free greedy that builds each rail's ring by walking to the unvisited domain with
  an uncovered pair (fewest uncovered left first, Warnsdorff-style). Goal: ≤ 2 s, every pair covered.
- 576 accelerators (the decode paper's scale-up domain) under a 36-port budget: the Hamming product
  K8□K8□K9 and a circulant with offsets chosen for the budget; build (graph, per-OCS edge colouring and
  its check, switch mappings) timed apart from the diameter BFS.
Prints medians of --repeat runs.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import TypeVar

import numpy as np

from labctl.plans.ep import full_coverage_bound, plan_ep_rings
from labctl.plans.graphs import Graph, budget_offsets, circulant, hamming
from labctl.plans.layout import abstract_ep, abstract_static
from labctl.plans.matchings import check_budget, decompose
from labctl.plans.metrics import measure

T = TypeVar("T")


def timed(fn: Callable[[], T], repeat: int) -> tuple[float, T]:
    """Median seconds over `repeat` runs, and the last result."""
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    assert result is not None
    return statistics.median(times), result


def free_walk_rings(domains: int, rails: int) -> int:
    """The peer: each rail's ring walked greedily over uncovered pairs; returns pairs covered."""
    uncovered = np.ones((domains, domains), dtype=bool)
    np.fill_diagonal(uncovered, False)
    for _ in range(rails):
        here = int(np.argmax(uncovered.sum(axis=1)))
        start = here
        visited = np.zeros(domains, dtype=bool)
        visited[here] = True
        for _ in range(domains - 1):
            options = np.flatnonzero(uncovered[here] & ~visited)
            if len(options):
                nxt = int(options[np.argmin(uncovered[options].sum(axis=1))])
            else:
                nxt = int(np.flatnonzero(~visited)[0])
            uncovered[here, nxt] = uncovered[nxt, here] = False
            visited[nxt] = True
            here = nxt
        uncovered[here, start] = uncovered[start, here] = False
    return domains * (domains - 1) // 2 - int(uncovered.sum()) // 2


def bench_ep(repeat: int) -> None:
    experts, rails = 10_440, 72
    t_plan, plan = timed(lambda: plan_ep_rings(experts, rails), repeat)
    t_layout, switches = timed(lambda: abstract_ep(plan), repeat)
    t_peer, peer_covered = timed(lambda: free_walk_rings(plan.domains, rails), repeat)
    low, high = plan.pair_links()
    print(
        f"EP divergent rings, E = {experts:,}, G = {rails} (m = {plan.domains} domains, bound G(2G+1) = "
        f"{full_coverage_bound(rails):,}), {repeat} runs (median):"
    )
    print(f"  {'':34}{'seconds':>9}  {'pairs covered':>17}  rails used")
    print(
        f"  {'labctl plan_ep_rings':34}{t_plan:9.4f}  {plan.covered_pairs:>7,} / {plan.total_pairs:<7,}"
        f"  {plan.rails_used} (each pair on {low}..{high} rails)   (goal <= 2 s, all pairs)"
    )
    print(
        f"  {'  + 72 rail mappings, validated':34}{t_layout:9.4f}  "
        f"{len(switches)} x {switches[0].space}, {switches[0].circuits} circuits each"
    )
    print(
        f"  {'peer: free greedy walk per rail':34}{t_peer:9.4f}  {peer_covered:>7,} / {plan.total_pairs:<7,}"
        f"  {rails}"
    )


def bench_static(repeat: int, ports: int) -> None:
    n = 576
    offsets = budget_offsets(n, ports)
    builders: list[tuple[str, Callable[[], Graph]]] = [
        ("K8□K8□K9 (Hamming)", lambda: hamming([8, 8, 9])),
        (f"C576, {len(offsets)} offsets for {ports} ports", lambda: circulant(n, offsets)),
    ]
    print(f"{n}-accelerator static plans, budget {ports} ports per accelerator, {repeat} runs (median):")
    print(
        f"  {'plan':34}{'build s':>9}{'BFS s':>8}{'degree':>8}{'diam':>6}{'OCS':>5}  "
        f"{'one-hop pairs':>15}  matchings"
    )
    for label, build in builders:

        def full(build: Callable[[], Graph] = build) -> tuple[int, int]:
            plan = decompose(build())  # verified: each a matching, together the graph's edges once
            check_budget(plan, ports)
            switches = abstract_static(plan)  # each validated on its switch (labctl.mapping)
            return plan.ports_needed, len(switches)

        t_build, (needed, n_switches) = timed(full, repeat)
        graph = build()
        t_bfs, metrics = timed(lambda graph=graph: measure(graph, exhaustive=True), repeat)  # type: ignore[misc]
        print(
            f"  {label:34}{t_build:9.3f}{t_bfs:8.3f}{metrics.degree_max:8}{metrics.diameter!s:>6}{needed:5}  "
            f"{metrics.pairs_adjacent:>6,} / {metrics.pairs_total:<7,}  {n_switches} valid"
        )
    print(f"  circulant offsets: {offsets}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=3, help="runs per measurement (median)")
    parser.add_argument("--ports", type=int, default=36, help="port budget of the 576-accelerator plans")
    args = parser.parse_args()
    bench_ep(args.repeat)
    print()
    bench_static(args.repeat, args.ports)
    # --- Replay overhead (issue 16, trace replay; added by whoever lands the replay engine) ---------------
    # Per operation at 0 ms switching vs the trace's own timing (the paper's +6.13 % / +0.79 %) goes here,
    # as a third table after the two above.


if __name__ == "__main__":
    main()
