"""What a plan's graph gives the collectives: degree (ports used), diameter (phases), one-hop pairs.

Breadth-first search runs from a block of sources at once over a CSR adjacency (numpy only): each level
ORs every node's neighbours' reach rows with one `reduceat`, so all-pairs on 4096 nodes is a few array
passes per level. A vertex-transitive graph (every Cayley graph here) needs one source.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from labctl.plans.graphs import Graph

IntArray = npt.NDArray[np.int64]
BLOCK_BOOLS = 1 << 22  # reach rows × adjacency entries per BFS block: a few MiB at any size


@dataclass(frozen=True, slots=True)
class GraphMetrics:
    nodes: int
    edges: int
    degree_min: int
    degree_max: int
    diameter: int | None
    """None when the graph is disconnected."""
    pairs_adjacent: int
    pairs_total: int

    @property
    def coverage(self) -> float:
        """Fraction of node pairs one hop apart."""
        return self.pairs_adjacent / self.pairs_total if self.pairs_total else 1.0


def degrees(n: int, edges: IntArray) -> IntArray:
    return np.bincount(edges.ravel(), minlength=n).astype(np.int64)


def _csr(n: int, edges: IntArray) -> tuple[IntArray, IntArray]:
    both = np.concatenate([edges, edges[:, ::-1]])
    order = np.argsort(both[:, 0], kind="stable")
    neighbours = both[order, 1]
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(both[:, 0], minlength=n), out=indptr[1:])
    return indptr, neighbours


def eccentricities(n: int, edges: IntArray, sources: IntArray) -> IntArray:
    """Hops from each source to its farthest node; -1 for a source that does not reach every node."""
    indptr, neighbours = _csr(n, edges)
    has_neighbours = indptr[1:] > indptr[:-1]
    starts = indptr[:-1][has_neighbours]
    out = np.empty(len(sources), dtype=np.int64)
    block = max(1, BLOCK_BOOLS // max(1, len(neighbours)))
    for first in range(0, len(sources), block):
        src = sources[first : first + block]
        reach = np.zeros((len(src), n), dtype=bool)
        reach[np.arange(len(src)), src] = True
        ecc = np.zeros(len(src), dtype=np.int64)
        done = reach.all(axis=1)
        level = 0
        while not done.all():
            level += 1
            grown = reach.copy()
            if len(neighbours):
                grown[:, has_neighbours] |= np.logical_or.reduceat(reach[:, neighbours], starts, axis=1)
            new = grown.sum(axis=1) > reach.sum(axis=1)
            ecc[new & ~done] = level
            stuck = ~new & ~done
            ecc[stuck] = -1
            reach = grown
            done = done | stuck | grown.all(axis=1)
        out[first : first + block] = ecc
    return out


def diameter(n: int, edges: IntArray, *, vertex_transitive: bool = False) -> int | None:
    """The largest shortest-path distance, or None when the graph is disconnected."""
    if n <= 1:
        return 0
    sources = np.zeros(1, dtype=np.int64) if vertex_transitive else np.arange(n, dtype=np.int64)
    ecc = eccentricities(n, edges, sources)
    return None if (ecc < 0).any() else int(ecc.max())


def measure(graph: Graph, *, exhaustive: bool = False) -> GraphMetrics:
    """Degree, diameter (BFS from node 0 on a vertex-transitive graph unless `exhaustive`), pairs."""
    edges = graph.edges
    deg = degrees(graph.n, edges)
    return GraphMetrics(
        nodes=graph.n,
        edges=len(edges),
        degree_min=int(deg.min()) if graph.n else 0,
        degree_max=int(deg.max()) if graph.n else 0,
        diameter=diameter(graph.n, edges, vertex_transitive=graph.vertex_transitive and not exhaustive),
        pairs_adjacent=len(np.unique(edges[:, 0] * graph.n + edges[:, 1])),
        pairs_total=graph.n * (graph.n - 1) // 2,
    )
