"""A graph split into one matching per OCS, under a per-accelerator port budget.

Each accelerator has P ports, port k on OCS k; a duplex circuit joins port k of both ends, so the edges
one OCS carries must be a matching, and a plan needs as many OCSes (ports) as its edge colouring has
colours. Colouring, cheapest first:
- a class that is a matching already (a cube mask, a half-turn offset, a round-robin round) is one OCS:
  hypercube dimension i → OCS i, so Q_d takes exactly d;
- a class of paths and even cycles (a circulant offset whose cycles have even length) alternates along
  each cycle: two OCSes;
- the rest (odd cycles) are coloured together by Misra & Gries' algorithm with at most Δ + 1 colours (an
  odd-order regular graph needs Δ + 1 anyway: each matching misses a node);
- and if the classes' colourings add up past Δ + 1, the whole graph is coloured by Misra & Gries instead.
Every result is checked before it is returned: each matching is one, and together they are the graph's
edges, each once.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from labctl.core.errors import InputError, LabctlError
from labctl.plans.graphs import EdgeClass, Graph

IntArray = npt.NDArray[np.int64]


class PlanCheckError(LabctlError):
    """A plan failed its own check (a bug: every plan is verified before anything uses it)."""


@dataclass(frozen=True, eq=False)
class OcsMatching:
    """The circuits one OCS carries: each accelerator on at most one."""

    label: str
    edges: IntArray


@dataclass(frozen=True, eq=False)
class StaticPlan:
    """A graph and its per-OCS matchings; OCS k is the k-th matching (and port k of every accelerator)."""

    graph: Graph
    matchings: tuple[OcsMatching, ...]

    @property
    def ports_needed(self) -> int:
        return len(self.matchings)

    @property
    def methods(self) -> list[str]:
        """How the matchings were found, for reports: "generator", "alternating", "Misra-Gries"."""
        seen: list[str] = []
        for m in self.matchings:
            kind = m.label.split(":", 1)[0]
            if kind not in seen:
                seen.append(kind)
        return seen


def _two_colour(n: int, edges: IntArray) -> tuple[IntArray, IntArray] | None:
    """Split a graph of degree ≤ 2 into two matchings by alternating along each path and cycle; None if a
    cycle has odd length."""
    neighbours: list[list[int]] = [[] for _ in range(n)]
    for i, (u, v) in enumerate(edges):
        neighbours[int(u)].append(i)
        neighbours[int(v)].append(i)
    colour = np.full(len(edges), -1, dtype=np.int64)

    def walk(start: int) -> bool:
        node, c = start, 0
        while True:
            nxt = next((e for e in neighbours[node] if colour[e] < 0), None)
            if nxt is None:
                return True
            colour[nxt] = c
            u, v = (int(x) for x in edges[nxt])
            node = v if u == node else u
            if node == start:  # a closed cycle: its first and last edge meet at `start`
                first = next(e for e in neighbours[start] if e != nxt)
                return bool(colour[first] != colour[nxt])
            c ^= 1

    ends = [v for v in range(n) if len(neighbours[v]) == 1]
    for v in ends:  # paths first, from an end, so no path is entered in its middle
        if not walk(v):
            return None
    for v in range(n):
        if any(colour[e] < 0 for e in neighbours[v]) and not walk(v):
            return None
    return edges[colour == 0], edges[colour == 1]


def misra_gries(n: int, edges: IntArray) -> list[IntArray]:
    """Proper edge colouring with at most Δ + 1 colours (Misra & Gries 1992), as lists of edges."""
    if len(edges) == 0:
        return []
    delta = int(np.bincount(edges.ravel(), minlength=n).max())
    palette = range(delta + 1)
    at: list[dict[int, int]] = [{} for _ in range(n)]  # node → {colour: neighbour}
    colour_of: dict[tuple[int, int], int] = {}

    def key(a: int, b: int) -> tuple[int, int]:
        return (a, b) if a < b else (b, a)

    def free(x: int) -> int:
        return next(c for c in palette if c not in at[x])

    def is_free(x: int, c: int) -> bool:
        return c not in at[x]

    def paint(a: int, b: int, c: int) -> None:
        at[a][c] = b
        at[b][c] = a
        colour_of[key(a, b)] = c

    def erase(a: int, b: int) -> int:
        c = colour_of.pop(key(a, b))
        del at[a][c], at[b][c]
        return c

    for u0, v0 in edges:
        u, v = int(u0), int(v0)
        fan = [v]
        in_fan = {v}
        while True:  # a maximal fan of u starting at v
            last = fan[-1]
            nxt = next((w for c, w in at[u].items() if w not in in_fan and is_free(last, c)), None)
            if nxt is None:
                break
            fan.append(nxt)
            in_fan.add(nxt)
        c, d = free(u), free(fan[-1])
        # invert the cd path from u (it starts with a d-edge: c is free on u)
        path: list[tuple[int, int]] = []
        x, want = u, d
        while want in at[x]:
            y = at[x][want]
            path.append((x, y))
            x, want = y, (c if want == d else d)
        recoloured = [(a, b, erase(a, b)) for a, b in path]
        for a, b, old in recoloured:
            paint(a, b, c if old == d else d)
        # the first w in the fan with d free whose prefix is still a fan
        w_index = None
        for i, w in enumerate(fan):
            if i > 0 and not is_free(fan[i - 1], colour_of[key(u, w)]):
                break
            if is_free(w, d):
                w_index = i
                break
        if w_index is None:
            raise PlanCheckError(f"Misra-Gries found no fan vertex for edge ({u}, {v})")
        # rotate the prefix: (u, fan[i]) takes the colour of (u, fan[i+1])
        for i in range(w_index):
            shifted = erase(u, fan[i + 1])
            paint(u, fan[i], shifted)
        paint(u, fan[w_index], d)
    classes: list[list[tuple[int, int]]] = [[] for _ in palette]
    for (a, b), c in colour_of.items():
        classes[c].append((a, b))
    return [np.array(sorted(cl), dtype=np.int64).reshape(-1, 2) for cl in classes if cl]


def verify(graph: Graph, matchings: tuple[OcsMatching, ...]) -> None:
    """Raise PlanCheckError unless every matching is a matching and together they are the graph's edges,
    each exactly once."""
    n = graph.n
    for m in matchings:
        ends = m.edges.ravel()
        if len(ends) and (ends.min() < 0 or ends.max() >= n):
            raise PlanCheckError(f"{graph.name}: {m.label}: a node outside 0..{n - 1}")
        if len(np.unique(ends)) != len(ends):
            raise PlanCheckError(f"{graph.name}: {m.label}: an accelerator is on two of its circuits")
    want = graph.edges
    got = np.vstack([m.edges for m in matchings]) if matchings else np.empty((0, 2), dtype=np.int64)
    want_keys = np.sort(np.minimum(want[:, 0], want[:, 1]) * n + np.maximum(want[:, 0], want[:, 1]))
    got_keys = np.sort(np.minimum(got[:, 0], got[:, 1]) * n + np.maximum(got[:, 0], got[:, 1]))
    if len(np.unique(want_keys)) != len(want_keys):
        raise PlanCheckError(f"{graph.name}: an edge appears twice in the graph")
    if not np.array_equal(want_keys, got_keys):
        raise PlanCheckError(f"{graph.name}: the matchings are not exactly the graph's edges")


def decompose(graph: Graph) -> StaticPlan:
    """One matching per OCS (see the module docstring), verified."""
    matchings: list[OcsMatching] = []
    leftover: list[EdgeClass] = []
    for cls in graph.classes:
        if len(cls.edges) == 0:
            continue
        if cls.is_matching:
            matchings.append(OcsMatching(f"generator: {cls.label}", cls.edges))
            continue
        split = _two_colour(graph.n, cls.edges)
        if split is None:
            leftover.append(cls)
        else:
            for half, part in zip("ab", split, strict=True):
                matchings.append(OcsMatching(f"alternating: {cls.label} ({half})", part))
    if leftover:
        rest = np.vstack([c.edges for c in leftover])
        names = ", ".join(c.label for c in leftover)
        for i, part in enumerate(misra_gries(graph.n, rest)):
            matchings.append(OcsMatching(f"Misra-Gries: {names} (colour {i})", part))
    delta = int(np.bincount(graph.edges.ravel(), minlength=graph.n).max()) if graph.n_edges else 0
    if len(matchings) > delta + 1:
        # Per-class colourings can add up past Δ + 1 (K3 □ K3: 3 + 3 for degree 4); the whole graph
        # coloured at once never needs more.
        whole = misra_gries(graph.n, graph.edges)
        matchings = [
            OcsMatching(f"Misra-Gries: whole graph (colour {i})", part) for i, part in enumerate(whole)
        ]
    plan = StaticPlan(graph, tuple(matchings))
    verify(graph, plan.matchings)
    return plan


def check_budget(plan: StaticPlan, ports: int | None, *, per: str = "accelerator") -> None:
    """InputError when the plan needs more OCS ports per accelerator than it has."""
    if ports is not None and plan.ports_needed > ports:
        degree = int(np.bincount(plan.graph.edges.ravel(), minlength=plan.graph.n).max())
        raise InputError(
            f"{plan.graph.name} needs {plan.ports_needed} ports per {per} (degree {degree}, one OCS matching "
            f"per port) but the budget is {ports}"
        )
