"""Host graphs for workload-static circuits (the decode paper's appendix, Tables 2-3).

A graph's edges come in classes, one per generator: on the cube family (nodes = n-bit labels) the class
of mask g joins x to x XOR g, a perfect matching; on a circulant (nodes = Z_n) the class of offset s
joins i to i + s, a union of cycles; on a Hamming product each factor's complete graph is split into its
round-robin matchings. `labctl.plans.matchings` turns classes into one matching per OCS.

- Q_d, the hypercube: the d unit masks; degree d, diameter d.
- Q_d + g, a fold: one more mask; FQ_d = Q_d + 1…1 joins every node to its antipode (degree d+1,
  diameter ⌈d/2⌉).
- Q_n[a, b, …], a block fold: the n bits split into blocks of a, b, … bits (most significant first); the
  masks are every nonzero mask inside one block, so Q_n[a, b] = K_2^a □ K_2^b (Q5[3,2] = K8 □ K4: degree
  7 + 3 = 10, diameter 2).
- K_s1 □ K_s2 □ …, a Hamming product: the same for any factor sizes (576 = 8 · 8 · 9).
- C_n(S), a circulant: i ~ i ± s for s in S; the ring is C_n({1}).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from labctl.core.errors import InputError

IntArray = npt.NDArray[np.int64]

MAX_NODES = 4096  # one accelerator per port on each OCS: labctl's largest switch has 4096 per side
MAX_DEGREE = 256  # a port per OCS matching; accelerators have tens (the decode paper's RX00: 36)


@dataclass(frozen=True, eq=False)
class EdgeClass:
    """The edges of one generator."""

    label: str
    edges: IntArray
    """(k, 2), each row u < v."""
    is_matching: bool
    """No node is on two of its edges (a mask of the cube family, a half-turn offset, a round-robin
    colour): the class is one OCS's matching as it stands."""


@dataclass(frozen=True, eq=False)
class Graph:
    """An undirected simple graph on nodes 0..n-1, its edges grouped by generator."""

    name: str
    n: int
    classes: tuple[EdgeClass, ...]
    vertex_transitive: bool = True
    """Every node sees the same graph (Cayley graphs: all constructions here): one BFS gives the
    diameter."""

    @property
    def edges(self) -> IntArray:
        if not self.classes:
            return np.empty((0, 2), dtype=np.int64)
        return np.vstack([c.edges for c in self.classes])

    @property
    def n_edges(self) -> int:
        return sum(len(c.edges) for c in self.classes)


def _canonical(u: IntArray, v: IntArray) -> IntArray:
    return np.stack([np.minimum(u, v), np.maximum(u, v)], axis=1).astype(np.int64)


def _check_size(name: str, n: int, degree: int) -> None:
    if n > MAX_NODES:
        raise InputError(f"{name}: {n} accelerators; at most {MAX_NODES} (one port each per OCS side)")
    if degree > MAX_DEGREE:
        raise InputError(f"{name}: degree {degree}; at most {MAX_DEGREE} ports per accelerator")


def cayley_z2(bits: int, masks: Sequence[int], name: str) -> Graph:
    """Nodes are `bits`-bit labels; x ~ x XOR g for each mask g (one perfect matching per mask)."""
    if not 1 <= bits <= 12:
        raise InputError(f"{name}: {bits} bits; expected 1..12 (at most {MAX_NODES} accelerators)")
    n = 1 << bits
    seen: set[int] = set()
    for g in masks:
        if not 0 < g < n:
            raise InputError(f"{name}: mask {g:b} is not a nonzero {bits}-bit mask")
        if g in seen:
            raise InputError(f"{name}: mask {g:0{bits}b} is given twice (a fold must be a new generator)")
        seen.add(g)
    _check_size(name, n, len(masks))
    nodes = np.arange(n, dtype=np.int64)
    classes = []
    for g in masks:
        low = nodes[nodes < (nodes ^ g)]
        classes.append(EdgeClass(f"mask {g:0{bits}b}", _canonical(low, low ^ g), True))
    return Graph(name, n, tuple(classes))


def hypercube(dim: int, folds: Sequence[int] = ()) -> Graph:
    """Q_dim, plus one generator per fold mask (Q_dim + g)."""
    name = f"Q{dim}" + "".join(f"+{g:0{dim}b}" if 0 < g < (1 << dim) else f"+{g}" for g in folds)
    return cayley_z2(dim, [1 << i for i in range(dim)] + list(folds), name)


def folded_cube(dim: int) -> Graph:
    """FQ_dim = Q_dim + 1…1: every node also joined to its antipode."""
    if dim < 2:
        raise InputError(f"FQ{dim}: a folded cube needs dim ≥ 2 (on Q1 the antipode is the only neighbour)")
    graph = hypercube(dim, [(1 << dim) - 1])
    return Graph(f"FQ{dim}", graph.n, graph.classes)


def block_fold(blocks: Sequence[int]) -> Graph:
    """Q_n[a, b, …] with n = a + b + …: every nonzero mask inside one block of bits (the first block the
    most significant bits), i.e. K_2^a □ K_2^b □ …"""
    if not blocks or any(b < 1 for b in blocks):
        raise InputError(f"block fold {list(blocks)}: every block needs at least one bit")
    bits = sum(blocks)
    name = f"Q{bits}[{','.join(map(str, blocks))}] = " + "□".join(f"K{1 << b}" for b in blocks)
    if bits > 12:
        raise InputError(f"{name}: {bits} bits; at most 12 ({MAX_NODES} accelerators)")
    _check_size(name, 1 << bits, sum((1 << b) - 1 for b in blocks))
    masks: list[int] = []
    shift = bits
    for b in blocks:
        shift -= b
        masks.extend(m << shift for m in range(1, 1 << b))
    return cayley_z2(bits, masks, name)


def round_robin(s: int) -> list[list[tuple[int, int]]]:
    """A 1-factorization of K_s: s-1 perfect matchings for even s, s near-perfect ones for odd s (the
    circle method; for odd s a dummy vertex sits out one vertex per round)."""
    if s < 2:
        return []
    size = s if s % 2 == 0 else s + 1
    rounds = []
    for r in range(size - 1):
        pairs = [(r, size - 1)]
        for k in range(1, size // 2):
            pairs.append(((r + k) % (size - 1), (r - k) % (size - 1)))
        rounds.append([(min(a, b), max(a, b)) for a, b in pairs if a < s and b < s])
    return rounds


def hamming(sizes: Sequence[int]) -> Graph:
    """K_s1 □ K_s2 □ …: nodes are mixed-radix labels (first factor most significant), adjacent when they
    differ in exactly one coordinate. Degree Σ(s_i - 1), diameter the number of factors of size ≥ 2."""
    if not sizes or any(s < 1 for s in sizes):
        raise InputError(f"Hamming product {list(sizes)}: every factor needs at least one node")
    name = "□".join(f"K{s}" for s in sizes)
    n = int(np.prod(np.array(sizes, dtype=np.int64)))
    _check_size(name, n, sum(s - 1 for s in sizes))
    nodes = np.arange(n, dtype=np.int64)
    classes = []
    stride = n
    for axis, s in enumerate(sizes):
        stride //= s
        coordinate = (nodes // stride) % s
        for colour, pairs in enumerate(round_robin(s)):
            us, vs = [], []
            for a, b in pairs:
                base = nodes[coordinate == a]
                us.append(base)
                vs.append(base + (b - a) * stride)
            edges = _canonical(np.concatenate(us), np.concatenate(vs))
            classes.append(EdgeClass(f"K{s} axis {axis} round {colour}", edges, True))
    return Graph(name, n, tuple(classes))


def circulant(n: int, offsets: Sequence[int]) -> Graph:
    """C_n(S): i ~ i ± s (mod n) for each offset s in 1..n/2 (s = n/2 adds one link per node, the others
    two)."""
    name = f"C{n}({','.join(map(str, offsets))})"
    if n < 2:
        raise InputError(f"{name}: a circulant needs at least 2 accelerators")
    if not offsets:
        raise InputError(f"{name}: give at least one offset")
    for s in offsets:
        if not 1 <= s <= n // 2:
            raise InputError(f"{name}: offset {s} is not in 1..{n // 2} (n/2; larger ones repeat n - s)")
    if len(set(offsets)) != len(offsets):
        raise InputError(f"{name}: an offset is given twice")
    _check_size(name, n, sum(1 if 2 * s == n else 2 for s in offsets))
    nodes = np.arange(n, dtype=np.int64)
    classes = []
    for s in offsets:
        if 2 * s == n:
            low = nodes[: n // 2]
            classes.append(EdgeClass(f"offset {s}", _canonical(low, low + s), True))
        else:
            edges = _canonical(nodes, (nodes + s) % n)
            classes.append(EdgeClass(f"offset ±{s}", edges[np.lexsort((edges[:, 1], edges[:, 0]))], False))
    return Graph(name, n, tuple(classes))


def ring(n: int) -> Graph:
    """The ring C_n({1}) (n = 2: one link)."""
    graph = circulant(n, [1])
    return Graph(f"ring C{n}", n, graph.classes)


def port_cost(n: int, s: int) -> int:
    """OCS matchings the offset-s class of C_n needs on its own: 1 (a half turn), 2 (cycles of even
    length), 3 (odd cycles)."""
    if 2 * s == n:
        return 1
    return 2 if (n // np.gcd(n, s)) % 2 == 0 else 3


def budget_offsets(n: int, ports: int) -> list[int]:
    """Offsets for C_n under `ports` OCS matchings per accelerator, chosen greedily: each next offset is
    the one that brings the most nodes within two hops of node 0 (ties: the smaller offset), at its
    `port_cost`. Two-hop reach of S is the sumset B + B of B = {0, ±S}, so every candidate is scored at
    once with array shifts."""
    if n < 2:
        raise InputError(f"C{n}: a circulant needs at least 2 accelerators")
    if ports < 1:
        raise InputError(f"C{n}: a port budget of {ports}; need at least 1")
    index = np.arange(n, dtype=np.int64)
    ball = np.zeros(n, dtype=bool)  # B: within one hop of 0
    ball[0] = True
    two_hop = ball.copy()  # B + B
    chosen: list[int] = []
    left = ports
    candidates = np.arange(1, n // 2 + 1, dtype=np.int64)
    costs = np.array([port_cost(n, int(s)) for s in candidates], dtype=np.int64)
    while True:
        free = np.isin(candidates, chosen, invert=True) & (costs <= left)
        if not free.any():
            break
        options = candidates[free]
        plus = ball[(index[None, :] - options[:, None]) % n]  # B + s
        minus = ball[(index[None, :] + options[:, None]) % n]  # B - s
        reach = two_hop[None, :] | plus | minus
        rows = np.arange(len(options))
        reach[rows, (2 * options) % n] = True
        reach[rows, (-2 * options) % n] = True
        best = int(np.argmax(reach.sum(axis=1)))
        s = int(options[best])
        chosen.append(s)
        left -= port_cost(n, s)
        ball[s] = ball[(-s) % n] = True
        two_hop = reach[best]
    return sorted(chosen)
