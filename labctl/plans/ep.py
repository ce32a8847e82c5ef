"""Expert-parallel divergent rings (Opus §4): a different ring order per rail over the scale-up domains.

An EP group of E GPUs spans m = E / G scale-up domains of G GPUs each; GPU k of every domain sits on
rail k, and each rail's OCS carries one ring over the m domains. Traffic between two domains first moves
over NVLink to a rail whose ring links them, so a pair of domains is one optical hop apart when some
rail's ring has them adjacent. G rings of m edges cover at most G·m of the m(m-1)/2 pairs, so all pairs
can be covered only when m - 1 ≤ 2G, i.e. E ≤ G(2G+1) (10,440 GPUs for NVL72 domains, G = 72).

The planner is greedy, as the paper's: each rail takes the candidate ring that covers the most pairs not
yet covered (ties: see below, then the earliest candidate). The candidates are Walecki's
Hamiltonian decomposition of K_m first (zig-zag paths through a hub, rotated; for odd m its (m-1)/2
rings cover every pair exactly once) and then the step-s rings i → i+s for s coprime to m. Walecki first
is what makes the greedy reach the bound: building each ring freely (walk to an unvisited domain over an
uncovered pair) leaves, near the end, uncovered pairs that form no Hamiltonian cycle. Rails past full
coverage add parallel links: among the pool and one walk over the least-linked pairs, the ring that
raises the most-linked pair least, then adds the fewest links in all. For odd m that keeps every pair
within one link of every other; for even m (Walecki's closing links repeat pairs) the spread can reach 4.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from labctl.core.errors import InputError

IntArray = npt.NDArray[np.int64]

MAX_RAILS = 1024
# A ring uses 2 ports per domain on its rail's OCS; labctl.inventory.mapping allows 4096 per side.
MAX_DOMAINS = 2048


def full_coverage_bound(rails: int) -> int:
    """The largest EP group (GPUs) whose domain pairs G rails of rings can all cover: G(2G+1)."""
    return rails * (2 * rails + 1)


@dataclass(frozen=True, eq=False)
class EpRingPlan:
    """One ring order per rail over the EP group's domains, and what it covers."""

    experts: int
    """E: GPUs in the EP group."""
    rails: int
    """G: rails, i.e. GPUs per scale-up domain."""
    rings: IntArray
    """(G, m): rail r's ring visits domains rings[r, 0], rings[r, 1], …, back to rings[r, 0]."""
    new_pairs: IntArray
    """(G,): domain pairs that rail r's ring covered first."""
    multiplicity: IntArray
    """(m, m), symmetric, zero diagonal: how many rails link each pair of domains."""

    @property
    def domains(self) -> int:
        return self.experts // self.rails

    @property
    def total_pairs(self) -> int:
        return self.domains * (self.domains - 1) // 2

    @property
    def covered_pairs(self) -> int:
        return int(self.new_pairs.sum())

    @property
    def complete(self) -> bool:
        return self.covered_pairs == self.total_pairs

    @property
    def rails_used(self) -> int:
        """Rails whose ring covers a pair no earlier rail covers (the rest add parallel links)."""
        return int(np.count_nonzero(self.new_pairs))

    @property
    def bound(self) -> int:
        return full_coverage_bound(self.rails)

    def pair_links(self) -> tuple[int, int]:
        """(fewest, most) rails linking one pair of domains, over all pairs."""
        if self.domains < 2:
            return 0, 0
        upper = self.multiplicity[np.triu_indices(self.domains, 1)]
        return int(upper.min()), int(upper.max())

    def ring_edges(self, rail: int) -> list[tuple[int, int]]:
        """The (domain, next domain) links of a rail's ring; none for one domain, one for two."""
        ring = [int(d) for d in self.rings[rail]]
        if len(ring) < 2:
            return []
        if len(ring) == 2:
            return [(ring[0], ring[1])]
        return [(ring[i], ring[(i + 1) % len(ring)]) for i in range(len(ring))]


def walecki_rings(m: int) -> IntArray:
    """Walecki's rings on m domains: (⌊(m-1)/2⌋ or m/2, m). For odd m they cover each pair exactly once;
    for even m they are the Hamiltonian paths of K_m's decomposition closed into rings (the closing link
    repeats a pair of another path)."""
    if m < 3:
        return np.arange(m, dtype=np.int64)[None, :]
    circle = m - 1 if m % 2 else m  # odd m: one domain is the hub, the others sit on a circle
    half = circle // 2
    zigzag = np.empty(circle, dtype=np.int64)  # 0, 1, -1, 2, -2, …, half (mod circle)
    zigzag[0] = 0
    steps = np.arange(1, circle, dtype=np.int64)
    zigzag[1:] = np.where(steps % 2 == 1, (steps + 1) // 2, -(steps // 2)) % circle
    rotations = (zigzag[None, :] + np.arange(half, dtype=np.int64)[:, None]) % circle
    if m % 2:
        hub = np.full((half, 1), m - 1, dtype=np.int64)
        return np.hstack([hub, rotations])
    return rotations


def step_rings(m: int) -> IntArray:
    """The rings i → i + s (mod m) for each step s in 1..m/2 coprime to m: (φ(m)/2-ish, m)."""
    if m < 3:
        return np.empty((0, m), dtype=np.int64)
    steps = np.array([s for s in range(1, m // 2 + 1) if math.gcd(s, m) == 1], dtype=np.int64)
    return (steps[:, None] * np.arange(m, dtype=np.int64)[None, :]) % m


def candidate_rings(m: int) -> IntArray:
    """Every ring the greedy may choose from, Walecki's first."""
    return np.vstack([walecki_rings(m), step_rings(m)])


def _least_linked_walk(links: IntArray) -> IntArray:
    """A ring from domain 0 that always steps to the unvisited domain it is least linked to (links is
    the upper-triangular count matrix)."""
    m = len(links)
    both = links + links.T
    order = np.empty(m, dtype=np.int64)
    visited = np.zeros(m, dtype=bool)
    here = 0
    for i in range(m):
        order[i] = here
        visited[here] = True
        if i + 1 < m:
            row = np.where(visited, np.iinfo(np.int64).max, both[here])
            here = int(np.argmin(row))
    return order


def plan_ep_rings(experts: int, rails: int) -> EpRingPlan:
    """Choose each rail's ring greedily; see the module docstring. Never raises for E above the bound: the
    plan then covers what G rails can (report `covered_pairs` of `total_pairs`)."""
    if not 1 <= rails <= MAX_RAILS:
        raise InputError(f"G = {rails} rails: expected 1..{MAX_RAILS}")
    if experts < rails or experts % rails:
        raise InputError(
            f"E = {experts} is not a positive multiple of G = {rails}: an EP group is whole scale-up "
            f"domains of G GPUs (e.g. E = {max(1, experts // rails) * rails})"
        )
    m = experts // rails
    if m > MAX_DOMAINS:
        raise InputError(
            f"E / G = {m} domains: at most {MAX_DOMAINS} (a ring takes 2 ports per domain on each rail's "
            f"OCS, and labctl's largest switch has 4096 per side)"
        )
    candidates = candidate_rings(m)
    if m >= 3:
        a, b = candidates, np.roll(candidates, -1, axis=1)
    else:  # one domain: no pair; two: one pair, however the "ring" turns
        a, b = candidates[:, :1], candidates[:, -1:]
    pair = np.minimum(a, b) * m + np.maximum(a, b)  # (K, ring links): flat index of each link's pair
    links = np.zeros(m * m, dtype=np.int64)
    if m < 2:
        pair = pair[:, :0]
    big = rails * max(1, pair.shape[1]) + 1  # exceeds any load, so new pairs always come first
    total = m * (m - 1) // 2
    rings = np.empty((rails, m), dtype=np.int64)
    new_pairs = np.zeros(rails, dtype=np.int64)
    covered = 0
    for rail in range(rails):
        pool, pool_pair = candidates, pair
        if m >= 4 and covered == total:  # spare rails: also the ring that walks the least-linked pairs
            walk = _least_linked_walk(links.reshape(m, m))
            w_pair = np.minimum(walk, np.roll(walk, -1)) * m + np.maximum(walk, np.roll(walk, -1))
            pool, pool_pair = np.vstack([candidates, walk]), np.vstack([pair, w_pair])
        seen = links[pool_pair]  # (K, ring links): how many rails already link each pair of each candidate
        new = np.count_nonzero(seen == 0, axis=1)
        # most new pairs, then the lowest most-linked pair, then the fewest links in all
        score = (new * big - seen.max(axis=1, initial=0)) * big - seen.sum(axis=1)
        best = int(np.argmax(score))  # first maximum: the earliest candidate among equals
        rings[rail] = pool[best]
        new_pairs[rail] = new[best]
        covered += int(new[best])
        links[pool_pair[best]] += 1  # a ring of m ≥ 3 domains never links one pair twice
    multiplicity = links.reshape(m, m)
    multiplicity = multiplicity + multiplicity.T
    return EpRingPlan(
        experts=experts, rails=rails, rings=rings, new_pairs=new_pairs, multiplicity=multiplicity
    )
